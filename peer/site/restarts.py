"""When a failed query is started again (pure): exponential delay, as Flink's restart strategy.

A Spark streaming query dies on errors that a second try usually does not meet: a Python
worker that did not connect back in time on a saturated host, an executor lost mid-batch, a
file briefly missing. Such a query resumes exactly from its checkpoint (its batches are
replayed, and its result spool drops what it had already appended), so the peer starts it
again instead of leaving it failed until someone does:

- the first restart comes ``backoff.first_s`` after the failure is seen, each further one
  twice as late, at most ``backoff.max_s``;
- a query that has run ``healthy_s`` since its last restart without failing again starts
  over at the first delay;
- after ``max_attempts`` restarts that each failed again, the peer stops trying and the
  query stays failed (its error in ``peer status``) until it is started by hand.

A query of the shared lane fails with the lane: the lane is restarted once for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from peer.timing import Backoff

__all__ = ["RestartPolicy", "Restarts"]


@dataclass(frozen=True)
class RestartPolicy:
    backoff: Backoff = field(default_factory=lambda: Backoff(first_s=1.0, max_s=60.0))
    max_attempts: int = 8
    healthy_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, not {self.max_attempts}")
        if not (math.isfinite(self.healthy_s) and self.healthy_s > 0):
            raise ValueError(f"healthy_s must be a positive number, not {self.healthy_s}")


@dataclass(frozen=True)
class _Record:
    attempts: int = 0  # restarts since the query last ran healthy_s without failing
    due_at: float | None = None  # when the pending restart is due (None: none pending)
    restarted_at: float | None = None


@dataclass
class Restarts:
    """Which failed queries to start again, and when (fed each maintenance round)."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    _records: dict[str, _Record] = field(default_factory=dict)

    def due(self, failed: Iterable[str], now: float) -> list[str]:
        """The queries of ``failed`` (failed as seen at ``now``) to restart now; the caller
        restarts them and says so with :meth:`restarted`. A query not failing any more whose
        last restart is ``healthy_s`` old is forgotten."""
        failing = set(failed)
        for name, record in list(self._records.items()):
            if name in failing:
                continue
            since = record.restarted_at
            if since is None or now - since >= self.policy.healthy_s:
                del self._records[name]
            else:
                self._records[name] = replace(record, due_at=None)
        out = []
        for name in sorted(failing):
            record = self._records.get(name, _Record())
            if record.attempts >= self.policy.max_attempts:
                continue  # given up: it stays failed
            if record.due_at is None:
                due_at = now + self.policy.backoff.delay_s(record.attempts + 1)
                record = self._records[name] = replace(record, due_at=due_at)
            if record.due_at is not None and now >= record.due_at:
                out.append(name)
        return out

    def restarted(self, name: str, now: float) -> None:
        record = self._records.get(name, _Record())
        self._records[name] = _Record(record.attempts + 1, None, now)

    def attempts(self, name: str) -> int:
        """Restarts of ``name`` since it last ran ``healthy_s`` without failing."""
        record = self._records.get(name)
        return 0 if record is None else record.attempts

    def gave_up(self, name: str) -> bool:
        """Whether the peer stopped restarting ``name`` (it failed after every attempt)."""
        record = self._records.get(name)
        return record is not None and record.attempts >= self.policy.max_attempts

    def forget(self, name: str) -> None:
        """``name`` was started, stopped or deleted by hand: its count starts over."""
        self._records.pop(name, None)
