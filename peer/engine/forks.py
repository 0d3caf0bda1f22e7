"""Delay, Process and Correct in the engine: tentative forks of a query that misses an input.

Theory of operation
-------------------
A query with an availability bound runs as its own Spark streaming query, the *stable* one,
whose watermark waits for every input (``peer.engine.compile``). Its driver
(:class:`Availability`) watches the query's inputs with :class:`peer.model.availability.
MissingInputs`. When an input is missing for the bound (less the time a fork takes to start):

1. **Fork.** The stable query is stopped (its readers paused: they hold their input for it)
   and its checkpoint, quiescent now, is copied into a fork checkpoint: the fork starts from
   the stable query's state at its last batch. Each missing input is replaced by a copy of
   its spool after what the stable query committed, followed by one *heartbeat* file: one
   row whose order fields lie far in the future. Its watermark then runs ahead of every
   other input's, so the global watermark (the lowest) follows the inputs that are there,
   and the compiled query drops the heartbeat right after the watermark. The fork reads the
   present inputs from their spools under readers of its own, and appends its results as
   *tentative* batches (``peer.model.tentative``), tagged by a fork-unique origin.
2. **Correct.** When every missing input has returned (it progressed again), the fork is
   stopped and dropped, each result stream gets an *undo* naming its first tentative offset
   of the fork (if it wrote any), and the stable query starts again from its own checkpoint.
   It reads the late tuples with the rest and writes the stable results, which equal those
   of a run without the failure: the stable entries of a log are never taken back.

A query whose input is itself tentative (a chain: its upstream fragment forked) forks at
once and reads that input through a copy that counts its live tentative entries
(``peer.engine.tentative_inputs``); an undo upstream corrects it, and it forks again if its
input is still tentative. A fork that Spark fails is corrected and forked again at the next
look; a stable query that Spark refuses to start again is retried every few seconds.

A crash while tentative loses the fork: the stable query resumes from its checkpoint on the
restart, and the first look at a query's result logs (:meth:`Availability.recover`) writes
the undo a fork left owing. Only queries with their own streaming query and local result
streams fork: a stateless query never waits (it has no watermark), and a replicated fragment's
results go through its replicas (not built: such a fragment keeps waiting).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from peer.engine.runner import Engine, RunningQuery, query_key
from peer.engine.tentative_inputs import InputLog, feed_copy, start_copy
from peer.errors import EngineError
from peer.model.availability import MissingInputs
from peer.model.plan import CheckedQuery
from peer.model.schema import Schema, to_arrow_schema
from peer.model.tentative import TENTATIVE, UndoMark
from peer.model.windows import AggregateSpec, JoinSpec
from peer.storage import spool_format as fmt
from peer.storage.spool_format import META_HEARTBEAT
from peer.timing import MONOTONIC, WALL

if TYPE_CHECKING:
    from peer.storage.spool import SpoolSet

log = logging.getLogger(__name__)

# What starting a fork takes to its first result before one was measured (then the last
# measured time is used): detection comes this much before the bound (or at 0 s).
FORK_LEAD_S = 2.0
RESUME_RETRY_S = 5.0
# Order values of a heartbeat: far ahead of any real tuple, small enough for microseconds.
_AHEAD = {
    "int": 2**31 - 1,
    "long": 10**11,
    "double": 1e11,
    "timestamp": 250_000_000_000_000_000,  # µs: about the year 9892
}
_ZERO: dict[str, Any] = {"int": 0, "long": 0, "double": 0.0, "bool": False, "string": ""}


def order_fields(checked: CheckedQuery) -> set[str]:
    """The fields a query's watermarks are on (aggregate and join order fields)."""
    found: set[str] = set()
    for box in checked.boxes:
        if isinstance(box.spec, AggregateSpec) and box.spec.order_on is not None:
            found.add(box.spec.order_on)
        elif isinstance(box.spec, JoinSpec):
            found |= {box.spec.left_order_on, box.spec.right_order_on}
    return found


def heartbeat_table(schema: Schema, ahead: set[str]) -> pa.Table:
    """One heartbeat row of ``schema``: order fields (and timestamps) far ahead, the others
    NULL where allowed, else zero."""
    columns: dict[str, list[Any]] = {}
    for f in schema.fields:
        if (f.name in ahead and f.type in _AHEAD) or f.type == "timestamp":
            columns[f.name] = [_AHEAD[f.type]]
        else:
            columns[f.name] = [None if f.nullable else _ZERO[f.type]]
    arrow = to_arrow_schema(schema)
    meta = {fmt.META_ROWS: b"1", fmt.META_APPEND_NS: str(time.time_ns()).encode()}
    meta[META_HEARTBEAT] = b"1"
    return pa.table(columns, schema=arrow).replace_schema_metadata(meta)


def missing_copy(spools: SpoolSet, stream: str, after: int, dest: Path, row: pa.Table) -> None:
    """A spool directory holding ``stream``'s files after ``after`` and a heartbeat."""
    spool = spools.get(stream)
    through = spool.latest
    fmt.copy_spool(spool.directory, dest, after, through, [], {}, fsync=False)
    fmt.atomic_write(fmt.offset_path(dest, through + 1), fmt.file_bytes(row), fsync=False)


@dataclass
class Fork:
    running: RunningQuery
    checkpoint: Path
    inputs_dir: Path
    missing: frozenset[str]
    since: float  # wall-clock time it started
    # inputs that are tentative themselves: stream -> (copy directory, last offset copied,
    # undos in its log when the fork started)
    feeds: dict[str, tuple[Path, int, int]] = field(default_factory=dict)


@dataclass
class FragmentState:
    """What status shows of a query with an availability bound."""

    tentative_since: float | None = None  # wall clock
    missing: tuple[str, ...] = ()
    tentative_tuples: int = 0
    corrections: int = 0  # undo entries written
    corrected_tuples: int = 0  # tentative tuples taken back
    forks: int = 0
    first_result_s: float | None = None  # from the fork's start to its first result
    fork_started: float | None = None  # wall clock

    def to_dict(self) -> dict[str, Any]:
        return {
            "tentative": self.tentative_since is not None,
            "tentative_since": self.tentative_since,
            "missing_inputs": list(self.missing),
            "tentative_tuples": self.tentative_tuples,
            "corrections": self.corrections,
            "corrected_tuples": self.corrected_tuples,
            "forks": self.forks,
            "fork_first_result_s": self.first_result_s,
        }


@dataclass
class _Marks:
    lock: threading.Lock = field(default_factory=threading.Lock)
    undo: dict[tuple[str, str], UndoMark] = field(default_factory=dict)  # (query, stream)
    rows: dict[str, int] = field(default_factory=dict)  # tentative rows of the current fork


class Availability:
    """Forks and corrects this peer's queries that have an availability bound (implements
    peer.engine.seams.Forks: the engine's seams are bound to it where the peer is wired)."""

    def __init__(
        self,
        engine: Engine,
        spools: SpoolSet,
        *,
        lead_s: float = FORK_LEAD_S,
        clock: Callable[[], float] = MONOTONIC,
        wall: Callable[[], float] = WALL,
        on_tentative: Callable[[str, int], None] | None = None,
        on_correction: Callable[[str, int], None] | None = None,
    ) -> None:
        self.clock = clock  # how long an input has been missing, when to try a resume again
        self.wall = wall  # when a fork started (reported, and compared with batch times)
        self.engine = engine
        self.spools = spools
        self.lead_s = lead_s
        self.forks: dict[str, Fork] = {}
        self.states: dict[str, FragmentState] = {}
        self._detectors: dict[str, MissingInputs] = {}
        self._logs: dict[str, InputLog] = {}  # the input logs looked at, by stream
        self._owed: dict[str, float] = {}  # stable queries to start again: not before then
        self._recovered: set[str] = set()
        self._marks = _Marks()
        # Told of tentative rows written and tuples taken back (metrics): (query, rows).
        self.on_tentative = on_tentative
        self.on_correction = on_correction
        self._lock = asyncio.Lock()  # one fork, correction or release at a time

    async def stop_fork(self, name: str) -> None:
        """The query stops (a status change, a move): its fork goes, its results back."""
        fork = self.forks.get(name)
        if fork is not None:
            async with self._lock:
                await self._drop_fork(name)
                await self._undo(name, fork.running.checked.outputs)
                self.states.setdefault(name, FragmentState()).tentative_since = None

    def _lead(self, name: str) -> float:
        """How long before the bound to fork: what the last fork took to its first result
        (measured here; FORK_LEAD_S before any), but never more than the bound."""
        state = self.states.get(name)
        measured = None if state is None else state.first_result_s
        return self.lead_s if measured is None else max(self.lead_s, measured)

    def wrote(self, name: str, stream: str, offset: int, rows: int) -> None:
        """A fork's batch is in ``stream`` at ``offset`` (on Spark's callback thread)."""
        log.debug("query %s: fork wrote %d rows at %s:%d", name, rows, stream, offset)
        with self._marks.lock:
            mark = self._marks.undo.setdefault((name, stream), UndoMark())
            mark.wrote(offset, TENTATIVE)
            self._marks.rows[name] = self._marks.rows.get(name, 0) + rows
        state = self.states.get(name)
        if state is not None:
            state.tentative_tuples += rows
            if state.first_result_s is None and state.fork_started is not None:
                state.first_result_s = round(self.wall() - state.fork_started, 3)
        if self.on_tentative is not None:
            self.on_tentative(name, rows)

    async def tick(
        self,
        queries: Collection[tuple[CheckedQuery, str]],
        reachable: Callable[[str], bool] = lambda _stream: True,
    ) -> None:
        """Look at every running query with a bound (``(checked, incarnation)``): fork those
        missing an input, correct those whose inputs are back (``reachable``: whether a
        stream's upstream is, as the federation sees it; alone, always)."""
        now = self.clock()
        for checked, incarnation in queries:
            name = checked.query.name
            bound = checked.query.availability_bound_s
            if bound is None:
                continue
            if name in self._owed and name not in self.engine.running:
                await self._resume(checked, incarnation)  # a restart that failed: again
            if not (name in self.engine.running or name in self.forks):
                continue
            if name not in self._recovered:
                self._recovered.add(name)
                await self.recover(checked)
            detector = self._detectors.get(name)
            if detector is None or detector.bound_s != bound:
                detector = MissingInputs(checked.inputs, bound)
                self._detectors[name] = detector
            detector.set_lead(self._lead(name))
            logs: dict[str, InputLog] = {}
            for stream in checked.inputs:
                if stream not in self.spools:
                    continue
                logs[stream] = input_log = self._logs.setdefault(stream, InputLog())
                await asyncio.to_thread(input_log.scan, self.spools.get(stream))
                up = reachable(stream)
                detector.observe(stream, input_log.stable_end, now, reachable=up)
            missing = detector.missing(now)
            # an input whose upstream writes tentative results makes this query tentative
            # at once (the upstream has waited its bound already)
            fed = frozenset(s for s, log_ in logs.items() if log_.open_from is not None)
            state = self.states.setdefault(name, FragmentState())
            state.missing = tuple(sorted(missing | fed))
            try:
                async with self._lock:
                    fork = self.forks.get(name)
                    if fork is None:
                        if (missing or fed) and name in self.engine.running:
                            await self.fork(checked, incarnation, missing - fed, fed)
                    elif (
                        not (missing or fed)
                        or not await self._feed(fork, logs)
                        or not await self._alive(fork)
                    ):
                        await self.correct(checked, incarnation)
            except EngineError as exc:
                log.error("query %s: %s", name, exc.message)

    async def _alive(self, fork: Fork) -> bool:
        """Whether the fork's streaming query still runs (Spark may fail it, e.g. when its
        Python source runner cannot reach the JVM on a starved machine): a dead fork is
        corrected, and forked again at the next look if the input is still missing."""
        handle = fork.running.handle

        def ask() -> str | None:
            if handle.isActive:
                return None
            exc = handle.exception()
            return "stopped" if exc is None else str(exc).strip().splitlines()[0][:300]

        reason = await self.engine.call(ask)
        if reason is not None:
            log.error("query %s: its tentative fork failed: %s", fork.running.name, reason)
        return reason is None

    async def _feed(self, fork: Fork, logs: dict[str, InputLog]) -> bool:
        """Extend the copies of the fork's tentative inputs; False when one of them has
        taken its tentative entries back since the fork started (correct and fork again)."""
        for stream, (dest, copied, undos) in list(fork.feeds.items()):
            if logs[stream].undos != undos:
                return False
            spool = self.spools.get(stream)
            last, undone = await asyncio.to_thread(feed_copy, spool, dest, copied, first=False)
            if undone:
                return False
            fork.feeds[stream] = (dest, last, undos)
        return True

    async def fork(
        self,
        checked: CheckedQuery,
        incarnation: str,
        missing: Collection[str],
        fed: Collection[str] = (),
    ) -> None:
        """Stop the stable query and start a fork from its checkpoint that reads a
        heartbeat for each ``missing`` input and the tentative entries of each ``fed`` one."""
        name = checked.query.name
        engine = self.engine
        stable = engine.running.get(name)
        if stable is None:
            return
        committed = {s: self.spools.get(s).committed(r) for s, r in stable.readers if s}
        state = self.states.setdefault(name, FragmentState())
        state.fork_started, state.first_result_s = self.wall(), None
        await engine.stop_query(name, forks=False)
        log.info("query %s: stable stopped for a fork", name)
        token = uuid.uuid4().hex[:8]
        key = f"{query_key(name, incarnation)}-t{token}"
        checkpoint = engine.checkpoint_root / key
        inputs_dir = engine.checkpoint_root / f"{key}.inputs"
        origin = f"tentative:{name}:{incarnation}:{token}"
        row_fields = order_fields(checked)

        def start() -> RunningQuery:
            source = engine.checkpoint_dir(name, incarnation)
            if source.exists():
                shutil.copytree(source, checkpoint)
            elsewhere: dict[str, Path] = {}
            for stream in missing:
                dest = inputs_dir / fmt.stream_dirname(stream)
                schema = checked.stream_schemas[stream]
                row = heartbeat_table(schema, row_fields)
                missing_copy(self.spools, stream, committed.get(stream, -1), dest, row)
                elsewhere[stream] = dest
            for stream in fed:
                dest = inputs_dir / fmt.stream_dirname(stream)
                spool, after = self.spools.get(stream), committed.get(stream, -1)
                start_copy(spool, dest, after)
                feeds[stream] = (dest, feed_copy(spool, dest, after, first=True)[0], undos[stream])
                elsewhere[stream] = dest
            return engine.start_streaming(
                checked, incarnation, key, checkpoint, origin, status=TENTATIVE, elsewhere=elsewhere
            )

        feeds: dict[str, tuple[Path, int, int]] = {}
        undos = {s: self._logs[s].undos if s in self._logs else 0 for s in fed}
        with self._marks.lock:
            self._marks.rows[name] = 0
        try:
            running = await engine.call(start)
        except Exception as exc:
            log.exception("query %s: the tentative fork did not start", name)
            shutil.rmtree(checkpoint, ignore_errors=True)
            shutil.rmtree(inputs_dir, ignore_errors=True)
            await self._resume(checked, incarnation)
            raise EngineError(f"query {name}: no tentative fork ({exc})", query=name) from exc
        self.forks[name] = Fork(
            running, checkpoint, inputs_dir, frozenset(missing), self.wall(), feeds
        )
        state.tentative_since, state.forks = state.fork_started, state.forks + 1
        log.warning(
            "query %s: input %s missing beyond its availability bound, %s tentative; "
            "tentative results",
            name,
            ", ".join(sorted(missing)) or "none",
            ", ".join(sorted(fed)) or "none",
        )

    async def _drop_fork(self, name: str) -> None:
        fork = self.forks.pop(name, None)
        if fork is None:
            return
        engine = self.engine

        def stop() -> None:
            try:
                fork.running.handle.stop()
            except Exception as exc:  # a stop during a batch may log and raise: harmless
                log.debug("query %s: stopping the fork: %s", name, exc)

        await engine.call(stop)

        def release() -> None:
            for stream, reader in fork.running.readers:
                if stream and stream in self.spools:
                    self.spools.get(stream).unregister_reader(reader)
            shutil.rmtree(fork.checkpoint, ignore_errors=True)
            shutil.rmtree(fork.inputs_dir, ignore_errors=True)

        await asyncio.to_thread(release)

    async def correct(
        self, checked: CheckedQuery, incarnation: str, *, restart: bool = True
    ) -> None:
        """Stop the fork, take its results back, and let the stable query go on."""
        name = checked.query.name
        await self._drop_fork(name)
        await self._undo(name, checked.outputs)
        state = self.states.setdefault(name, FragmentState())
        state.tentative_since = None
        if restart:
            await self._resume(checked, incarnation)
            log.warning("query %s: inputs back; tentative results taken back", name)

    async def _resume(self, checked: CheckedQuery, incarnation: str) -> None:
        """Start the stable query again from its checkpoint; if Spark refuses, it is owed
        and tried again at the next looks, at most every RESUME_RETRY_S."""
        name = checked.query.name
        if self.clock() < self._owed.get(name, 0.0):
            return
        try:
            await self.engine.run_query(checked, incarnation, resume=True, placement="own")
        except EngineError as exc:
            self._owed[name] = self.clock() + RESUME_RETRY_S
            log.error("query %s: the stable query did not start again: %s", name, exc.message)
            return
        self._owed.pop(name, None)

    async def _undo(self, name: str, outputs: Collection[str]) -> None:
        with self._marks.lock:
            firsts = {s: self._marks.undo.setdefault((name, s), UndoMark()).take() for s in outputs}
            rows = self._marks.rows.pop(name, 0)
        state = self.states.setdefault(name, FragmentState())
        for stream, first in firsts.items():
            if first is None or stream not in self.spools:
                continue
            spool = self.spools.get(stream)
            empty = spool.schema.empty_table()
            await asyncio.to_thread(spool.append, empty, undo=first)
            state.corrections += 1
        if any(first is not None for first in firsts.values()):
            state.corrected_tuples += rows
            if self.on_correction is not None:
                self.on_correction(name, rows)

    async def recover(self, checked: CheckedQuery) -> None:
        """After a restart: write the undo a fork that died with the peer left owing."""
        name = checked.query.name

        def scan() -> dict[str, int | None]:
            owed: dict[str, int | None] = {}
            for stream in checked.outputs:
                if stream not in self.spools:
                    continue
                spool = self.spools.get(stream)
                entries = []
                for offset in range(spool.earliest, spool.latest + 1):
                    try:
                        info = fmt.file_info(
                            fmt.file_metadata(fmt.offset_path(spool.directory, offset))
                        )
                    except (OSError, ValueError, pa.ArrowException):
                        continue  # trimmed meanwhile
                    entries.append((offset, info.status, info.undo))
                owed[stream] = UndoMark.recovered(entries).first
            return owed

        owed = await asyncio.to_thread(scan)
        with self._marks.lock:
            for stream, first in owed.items():
                if first is not None:
                    self._marks.undo.setdefault((name, stream), UndoMark()).wrote(first, TENTATIVE)
        if name not in self.forks and any(first is not None for first in owed.values()):
            await self._undo(name, checked.outputs)

    def describe(self, name: str) -> dict[str, Any] | None:
        state = self.states.get(name)
        return None if state is None else state.to_dict()

    async def close(self) -> None:
        for name in list(self.forks):
            await self._drop_fork(name)
