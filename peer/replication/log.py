"""The room's face for a stream's log, and the replicated log a replica keeps.

:class:`StreamLog` is what the rest of the peer may use of a stream's log: append a batch,
read batches by offset, trim what every reader has committed, listen for new offsets, and the
backlog of its slowest reader. :class:`~peer.storage.spool.Spool` implements it (structurally;
tests/unit/test_replica_state.py checks it), whether the stream is replicated or not.

:class:`ReplicatedLog` is a replica's log: a spool (the bytes, at the primary's offsets) and
its fence (:class:`~peer.replication.fence.ReplicaState`: the highest epoch seen and the epoch
history), held side by side, not mixed into one class. The replication cores
(:mod:`peer.replication.core`) ask for durable changes as effects; :meth:`ReplicatedLog.perform`
carries them out in order, each durable before the next, on the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import pyarrow as pa

from peer.replication.core import (
    Effect,
    History,
    SaveEpoch,
    SaveHistory,
    SeedLog,
    Truncate,
    WriteEntry,
)
from peer.replication.fence import ReplicaState
from peer.storage.spool import Spool

__all__ = ["ReplicatedLog", "StreamLog"]


class StreamLog(Protocol):
    """One stream's durable log, read by offset (what :class:`~peer.storage.spool.Spool` is)."""

    @property
    def latest(self) -> int: ...

    def append(
        self,
        table: pa.Table,
        *,
        origin: str | None = None,
        seq: int | None = None,
        status: str = ...,
        undo: int | None = None,
    ) -> int | None: ...

    def read(
        self, start: int, end: int, *, skip_trimmed: bool = False
    ) -> Iterator[tuple[int, pa.Table]]: ...

    def trim(
        self, retain: int = 0, *, max_age_s: float | None = None, keep_after: int | None = None
    ) -> int: ...

    def add_listener(self, callback: Callable[[int], None]) -> None: ...

    def backlog(self) -> int: ...


class ReplicatedLog:
    """A replica's log: its spool and its fence, composed (see the module docstring)."""

    def __init__(self, spool: Spool, fence: ReplicaState) -> None:
        self.spool = spool
        self.fence = fence

    @property
    def log_end(self) -> int:
        """The last offset this replica holds, acknowledged or not."""
        return self.spool.log_end

    @property
    def epoch(self) -> int:
        """The fence: appends of a lower epoch are refused."""
        return self.fence.epoch

    @property
    def history(self) -> History:
        return self.fence.history

    def perform(self, effects: tuple[Effect, ...]) -> None:
        """Carry out the cores' effects in order, each durable before the next (blocking:
        call it off the event loop)."""
        for effect in effects:
            if isinstance(effect, WriteEntry):
                self.spool.append_file(effect.offset, effect.body)
            elif isinstance(effect, Truncate):
                self.spool.truncate_after(effect.after)
            elif isinstance(effect, SaveEpoch):
                self.fence.save_epoch(effect.epoch)
            elif isinstance(effect, SaveHistory):
                self.fence.save_history(effect.history)
            elif isinstance(effect, SeedLog):
                self.spool.seed(effect.through, dict(effect.seqs))
