"""pysyncobj's clocks for the control plane, checked once (docs/replication.md: failover under
3 s). :class:`RaftTimings` is handed to :class:`~peer.replication.raft.machine.ControlMachine`
when it is made; its :meth:`~RaftTimings.conf` is the ``SyncObjConf`` pysyncobj takes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObjConf

__all__ = ["DEFAULT_TIMINGS", "RaftTimings"]


@dataclass(frozen=True)
class RaftTimings:
    """pysyncobj's clocks, in seconds. The defaults elect a new leader within about one
    second of the old one going silent (docs/replication.md: failover under 3 s)."""

    raft_min_timeout: float = 0.4  # election timeout, drawn in [min, max]
    raft_max_timeout: float = 0.9
    append_entries_period: float = 0.05  # leader heartbeat
    leader_fallback_timeout: float = 1.5  # a leader unheard by a majority steps down
    tick_period: float = 0.05  # the tick thread's longest wait
    probe_period: float = 0.25  # the transport's hello to a member it sent nothing to
    silence_timeout: float = 1.0  # a member unheard this long is disconnected
    submit_timeout: float = 5.0  # a submitted command's future fails after this
    close_timeout: float = 5.0  # close() waits this long for the tick thread
    compaction_entries: int = 5000  # compact the log after this many entries...
    compaction_period: float = 300.0  # ...or this long

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RaftTimings.{field.name} must be a number > 0, not {value!r}")
        rules = [
            (self.raft_min_timeout > 3 * self.append_entries_period, "raft_min_timeout > 3 x"),
            (self.raft_max_timeout > self.raft_min_timeout, "raft_max_timeout > raft_min_timeout"),
            (self.leader_fallback_timeout > self.append_entries_period, "leader_fallback >"),
            (self.silence_timeout >= self.raft_max_timeout, "silence_timeout >= raft_max"),
            (self.probe_period < self.silence_timeout, "probe_period < silence_timeout"),
            (self.compaction_entries >= 2, "compaction_entries >= 2"),
        ]
        for ok, rule in rules:
            if not ok:
                raise ValueError(f"RaftTimings: {rule} does not hold in {self}")

    def conf(self, **more: Any) -> Any:
        """The pysyncobj ``SyncObjConf`` of these timings (plus ``more``)."""
        return SyncObjConf(
            raftMinTimeout=self.raft_min_timeout,
            raftMaxTimeout=self.raft_max_timeout,
            appendEntriesPeriod=self.append_entries_period,
            leaderFallbackTimeout=self.leader_fallback_timeout,
            autoTickPeriod=self.tick_period,
            connectionRetryTime=self.probe_period,
            connectionTimeout=self.silence_timeout,
            logCompactionMinEntries=self.compaction_entries,
            logCompactionMinTime=self.compaction_period,
            **more,
        )


DEFAULT_TIMINGS = RaftTimings()
