"""Where the engine's results go: the seams it calls from Spark's callback thread.

Theory of operation
-------------------
A stable query's micro-batch runs in the engine's ``foreachBatch`` sink, on Spark's callback
thread. Three other parts of the peer take part in it, each made after the engine (they need
it, or the overlay the engine does not): the replicated fragments of the replication room
(a checkpoint record before a batch's results leave, and its result parts appended through
the streams' replicas), the tentative forks (:mod:`peer.engine.forks`: a fork's batch
written, a query's fork stopped with it) and the observer's metrics (push-to-result time).

So the composition root makes one :class:`EngineSeams`, gives it to the engine when it makes
it, and binds each seam once to the part that serves it when that part is made. Until then a
seam does what a lone peer does: results go to the local spools, nothing is forked or
measured. A seam bound twice is a wiring mistake and raises; nothing else assigns to the
engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

    from peer.storage.spool import SpoolSet

BeforeEmit = Callable[[int], None]  # called with a batch's result rows before they leave
ResultAge = Callable[[str, float], None]  # (query, seconds from the newest input to a result)
T = TypeVar("T")


class ResultSink(Protocol):
    """Where a stable query's results go (peer.replication.fragment_failover)."""

    def on_batch(self, query: str, batch_id: int, checkpoint: Path) -> BeforeEmit | None:
        """A micro-batch of ``query`` starts (its checkpoint as it is then)."""
        ...

    def emit(self, stream: str, table: pa.Table, origin: str, seq: int) -> None:
        """A result part of ``stream``, tagged (``origin``, ``seq``)."""
        ...


class Forks(Protocol):
    """The tentative forks of queries with an availability bound (peer.engine.forks)."""

    def wrote(self, query: str, stream: str, offset: int, rows: int) -> None:
        """A fork of ``query`` wrote ``rows`` result rows at ``stream``:``offset``."""
        ...

    async def stop_fork(self, query: str) -> None:
        """``query`` stops: its fork, if it has one, goes and its results are taken back."""
        ...


class SeamBound(RuntimeError):
    """A seam was bound a second time (two parts claim the same results)."""


class EngineSeams:
    """The engine's seams, each bound once; unbound, a lone peer's behaviour."""

    def __init__(self) -> None:
        self._sink: ResultSink | None = None
        self._forks: Forks | None = None
        self._on_result: ResultAge | None = None

    # ----------------------------------------------------------------------- binding
    def send_results_to(self, sink: ResultSink) -> None:
        self._sink = _once(self._sink, sink, "result sink")

    def fork_with(self, forks: Forks) -> None:
        self._forks = _once(self._forks, forks, "tentative forks")

    def report_results_to(self, on_result: ResultAge) -> None:
        self._on_result = _once(self._on_result, on_result, "result metrics")

    # ----------------------------------------------------------------------- the engine's calls
    def on_batch(self, query: str, batch_id: int, checkpoint: Path) -> BeforeEmit | None:
        return None if self._sink is None else self._sink.on_batch(query, batch_id, checkpoint)

    def emit(self, spools: SpoolSet, stream: str, table: pa.Table, origin: str, seq: int) -> None:
        if self._sink is None:
            spools.get(stream).append(table, origin=origin, seq=seq)
        else:
            self._sink.emit(stream, table, origin, seq)

    def wrote_tentative(self, query: str, stream: str, offset: int, rows: int) -> None:
        if self._forks is not None:
            self._forks.wrote(query, stream, offset, rows)

    async def stop_fork(self, query: str) -> None:
        if self._forks is not None:
            await self._forks.stop_fork(query)

    def result(self, query: str, age_s: float) -> None:
        if self._on_result is not None:
            self._on_result(query, age_s)

    @property
    def measures_results(self) -> bool:
        """Whether anyone takes :meth:`result` (the input age is worth computing)."""
        return self._on_result is not None


def _once(bound: T | None, new: T, what: str) -> T:
    if bound is not None:
        raise SeamBound(f"the engine's {what} is bound already")
    return new
