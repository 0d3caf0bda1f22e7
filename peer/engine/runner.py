"""The peer's Spark engine: one session; a streaming query per stateful query, and the lane.

py4j calls block, so every call into Spark runs on one dedicated thread (``_executor``),
never on the event loop. A query with a stateful box, and a peer's first per-tuple query and
first windowed aggregate, runs as its own Structured Streaming query (the later per-tuple
queries and small windowed aggregates share the lane, ``peer.engine.lane``). Such a query's
sources are the spools of its input streams and whose ``foreachBatch`` sink appends each
result micro-batch to the spools of its result streams, tagged (query incarnation, batch id):
when Spark re-runs a batch after a crash, the spool recognises the tag and keeps nothing twice.
Offsets, state and the batch ids live in the query's checkpoint directory, so a peer restarted
on the same data directory resumes each query where its checkpoint says.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from peer.engine.compile import (
    CompiledQuery,
    compile_query,
    needs_arrival_order,
    split_outputs,
)
from peer.engine.executors import ExecutorWatch
from peer.engine.lane import READER as LANE_READER
from peer.engine.lane import Lane, MemberCut, error_line, lane_kind
from peer.engine.lane_source import register_lane_source
from peer.engine.seams import EngineSeams
from peer.errors import EngineError, Unavailable
from peer.fetch.protocol import FetchEndpoint
from peer.model.plan import CheckedQuery
from peer.model.schema import Schema, spark_ddl
from peer.model.tentative import STABLE
from peer.storage import spool_format as fmt
from peer.storage.spool import SpoolSet
from peer.timing import MONOTONIC

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
T = TypeVar("T")
# The lane's entry in busy_seconds: object names start with a letter, digit or underscore.
LANE_BUSY = "(lane)"
HOLD_TIMEOUT_S = 60.0  # a lane batch that runs longer than this fails a member's move out


def query_key(name: str, incarnation: str) -> str:
    """A file-system and Spark-safe name for one incarnation of a query."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    tail = "".join(c if c.isalnum() else "_" for c in name)[-40:]
    return f"{tail}-{digest}-{incarnation}"


@dataclass
class RunningQuery:
    name: str
    incarnation: str
    compiled: CompiledQuery
    handle: StreamingQuery
    readers: list[tuple[str, str]]  # (stream, reader id)
    checked: CheckedQuery
    rows_by_stream: dict[str, int] = field(default_factory=dict)  # rows_out by result stream
    batches: int = 0
    rows_out: int = 0
    last_batch_s: float = 0.0


class Engine:
    """Runs queries on a local (or remote) Spark session on behalf of one peer."""

    def __init__(
        self,
        spools: SpoolSet,
        checkpoint_root: Path,
        *,
        master: str = "local[*]",
        conf: dict[str, str] | None = None,
        trigger_s: float = 0.0,
        max_rows_per_batch: int = 200_000,
        fuse_stateless: bool = True,
        lane_after: int = 1,
        max_backlog: int = 0,
        fetch: FetchEndpoint | None = None,
        lane_preaggregate: bool | None = None,
        clock: Callable[[], float] = MONOTONIC,
        seams: EngineSeams | None = None,
    ) -> None:
        self.spools = spools
        # Where results go besides the local spools, bound by the parts that take them
        # (replicated fragments, tentative forks, the metrics): peer.engine.seams.
        self.seams = seams or EngineSeams()
        self.clock = clock  # batch durations (read on Spark's threads: a plain reading)
        # A cluster's executors come and go (peer.engine.executors); a local master's are here.
        self.executors = None if master.startswith("local") else ExecutorWatch()
        # Input without a shared disk: with the peer's fetch server, Spark's executors fetch
        # spool files from it (peer.fetch) instead of opening them; None: they open them.
        self.fetch = fetch
        # Backpressure: a query reads no new input while a reader of one of its result
        # spools is more than this many batches behind (0: off).
        self.max_backlog = max_backlog
        self.checkpoint_root = checkpoint_root
        self.master = master
        self.conf = dict(conf or {})
        self.trigger_s = trigger_s
        self.max_rows_per_batch = max_rows_per_batch
        self.spark: SparkSession | None = None
        self.running: dict[str, RunningQuery] = {}
        # Set once a query of the peer's own has started (the warm-up yields to it).
        self.serving = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="spark"
        )
        self._owns_session = False
        self.fuse_stateless = fuse_stateless
        # Per-tuple queries that get their own streaming query before the lane is used: one
        # query alone runs at plain Spark's speed on its own, and the lane's per-batch cost
        # (temp view, SQL, envelope) pays off only once it saves a second streaming query.
        self.lane_after = lane_after
        lane_root = checkpoint_root / "lane"
        self.lane = Lane(
            spools,
            lane_root,
            # one Spark name per peer: peers in one process (tests) may share a session
            name=query_key(str(lane_root), "lane"),
            trigger_s=trigger_s,
            max_rows=max_rows_per_batch,
            # Windowed lane members aggregate in the executors on a cluster, where that spares
            # the driver their rows; on a local master the executors are this process, and
            # the extra shuffle stage per member cost more than the rows it spared
            # (docs/benchmarks.md, "What the lane's driver collects"). None: decide so.
            preaggregate=(
                not master.startswith("local") if lane_preaggregate is None else lane_preaggregate
            ),
            fetch=fetch,
            clock=clock,
        )

    async def _call(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine's Spark thread (the one every Spark call here uses)."""
        return await self._call(fn)

    @property
    def owns_session(self) -> bool:
        """Whether this engine started its Spark session (rather than adopting one)."""
        return self._owns_session

    async def start(self, spark: SparkSession | None = None) -> None:
        """Start the session (6-16 s on a small machine), or adopt one already started."""
        if spark is not None:
            self.spark = spark  # adopted: whoever started it stops it
            await self._call(lambda: register_lane_source(spark))
            return
        self._owns_session = True

        def build() -> SparkSession:
            from peer.engine.session import build_session
            from peer.engine.source import register_sources

            session = build_session(
                self.master,
                conf=self.conf,
                warehouse_dir=str(self.checkpoint_root.parent / "warehouse"),
                ship_dir=self.checkpoint_root.parent / "executor-code",
            )
            register_sources(session)
            register_lane_source(session)
            return session

        self.spark = await self._call(build)

    def _source(
        self,
        key: str,
        readers: list[tuple[str, str]],
        *,
        with_seq: bool,
        hold_back: list[Path] | None = None,
        heartbeat: bool = False,
        elsewhere: dict[str, Path] | None = None,
        ignore_hold: bool = False,
        name_offsets: bool = False,
    ) -> Callable[[str, Schema], DataFrame]:
        """The sources of one streaming query; ``elsewhere`` reads some streams from other
        directories (a tentative fork's copies of its missing inputs), unregistered;
        ``ignore_hold``: read each spool to its log end (a standby over follower copies);
        ``name_offsets``: offsets name their stream (a query with a standby)."""
        from peer.engine.source import read_stream

        assert self.spark is not None
        spark = self.spark

        def make(stream: str, schema: Schema) -> DataFrame:
            reader = f"{key}-{len(readers)}"
            directory = (elsewhere or {}).get(stream)
            if directory is None:
                spool = self.spools.get(stream)
                spool.register_reader(reader)
                spool.pause_reader(reader, False)
                readers.append((stream, reader))
                directory = spool.directory
            else:
                readers.append(("", reader))  # keeps the numbering; nothing to release
            return read_stream(
                spark,
                directory,
                spark_ddl(schema),
                reader,
                with_seq=with_seq,
                max_rows=self.max_rows_per_batch,
                hold_back=hold_back,
                max_backlog=self.max_backlog,
                heartbeat=heartbeat,
                fetch=self.fetch,
                ignore_hold=ignore_hold,
                name_offsets=name_offsets,
            )

        return make

    def checkpoint_dir(self, name: str, incarnation: str) -> Path:
        return self.checkpoint_root / query_key(name, incarnation)

    def placement_for(self, checked: CheckedQuery) -> str:
        """Where a query that never ran goes: ``lane`` or ``own`` (its own streaming query)."""
        kind = lane_kind(checked) if self.fuse_stateless else None
        if kind is None:
            return "own"
        alone = sum(1 for q in self.running.values() if lane_kind(q.checked) == kind)
        return "lane" if alone >= self.lane_after else "own"

    async def run_query(
        self,
        checked: CheckedQuery,
        incarnation: str,
        *,
        resume: bool = False,
        placement: str | None = None,
        standby: bool = False,
    ) -> str:
        """Start ``checked`` (resuming from its checkpoint when there is one) and say where it
        runs. A query resumed after a restart must keep its first ``placement``: that is
        where its checkpoint and its progress are. ``standby``: as a warm standby
        (peer.replication.standby), in its own streaming query, reading its inputs (follower
        copies) to their log ends, each per-tuple result keeping ``__seq`` (its input tuple)."""
        name = checked.query.name
        if name in self.lane.members:
            return "lane"
        if name in self.running:
            return "own"
        placement = "own" if standby else placement or self.placement_for(checked)
        if placement == "lane":
            spark = self.spark
            assert spark is not None
            try:
                await self._call(lambda: self.lane.add(spark, checked, incarnation, resume=resume))
            except Unavailable:  # the lane is held for a move: a retry will do
                raise
            except Exception as exc:
                raise EngineError(
                    f"query {name}: Spark refused to start it: {error_line(exc)}", query=name
                ) from exc
            log.info("query %s runs in the stateless lane", name)
            self.serving.set()
            return "lane"
        key = query_key(name, incarnation)
        checkpoint = self.checkpoint_dir(name, incarnation)
        origin = f"query:{name}:{incarnation}"

        def start() -> RunningQuery:
            return self.start_streaming(
                checked, incarnation, key, checkpoint, origin, standby=standby
            )

        try:
            self.running[name] = await self._call(start)
        except Exception as exc:
            if isinstance(exc, EngineError):
                raise
            raise EngineError(
                f"query {name}: Spark refused to start it: {error_line(exc)}", query=name
            ) from exc
        log.info("query %s started (checkpoint %s)", name, checkpoint)
        self.serving.set()
        return "own"

    def start_streaming(
        self,
        checked: CheckedQuery,
        incarnation: str,
        key: str,
        checkpoint: Path,
        origin: str,
        *,
        status: str = STABLE,
        elsewhere: dict[str, Path] | None = None,
        standby: bool = False,
    ) -> RunningQuery:
        """Start ``checked`` as its own streaming query (on the Spark thread): its sources,
        and the sink that appends each micro-batch's results to its result spools tagged
        (``origin``, batch id), with ``status`` (tentative for a fork, peer.engine.forks,
        which reads its missing inputs from ``elsewhere``)."""
        name = checked.query.name
        readers: list[tuple[str, str]] = []
        hold_back = [self.spools.get(s).directory for s in checked.outputs]
        source = self._source(
            key,
            readers,
            with_seq=needs_arrival_order(checked) or standby,
            hold_back=hold_back,
            heartbeat=checked.query.availability_bound_s is not None,
            elsewhere=elsewhere,
            ignore_hold=standby,
            name_offsets=bool(checked.query.standby),
        )
        compiled = compile_query(checked, source, lineage=standby)
        running: RunningQuery | None = None
        tentative = status != STABLE

        def sink(df: DataFrame, batch_id: int) -> None:
            started = self.clock()
            log.debug("query %s (%s): batch %d starts", name, status, batch_id)
            before_emit = None
            if not tentative:  # the checkpoint as it starts
                before_emit = self.seams.on_batch(name, batch_id, checkpoint)
            table = df.toArrow()
            if before_emit is not None:
                before_emit(table.num_rows)
            parts = split_outputs(compiled, table)
            for stream, part in parts.items():
                if tentative:
                    spool = self.spools.get(stream)
                    at = spool.append(part, origin=origin, seq=batch_id, status=status)
                    if at is not None:
                        self.seams.wrote_tentative(name, stream, at, part.num_rows)
                else:
                    self.seams.emit(self.spools, stream, part, origin, batch_id)
            if running is not None:
                running.batches += 1
                running.rows_out += table.num_rows
                for stream, part in parts.items():
                    running.rows_by_stream[stream] = (
                        running.rows_by_stream.get(stream, 0) + part.num_rows
                    )
                running.last_batch_s = self.clock() - started
            # push to result: the seconds since the newest input batch it had taken was
            # appended here, after a micro-batch put result rows in its output spools
            if self.seams.measures_results and table.num_rows:
                age = self._input_age_s([r for r in readers if r[0]])
                if age is not None:
                    self.seams.result(name, age)

        writer = (
            compiled.frame.writeStream.queryName(key)
            .option("checkpointLocation", str(checkpoint))
            .outputMode("append")
            .trigger(processingTime=f"{self.trigger_s} seconds")
            .foreachBatch(sink)
        )
        handle = writer.start()
        # every result stream counted from zero: one that got nothing yet has a rate of 0
        written = {stream: 0 for stream, _ in compiled.outputs}
        running = RunningQuery(name, incarnation, compiled, handle, readers, checked, written)
        return running

    async def stop_query(self, name: str, *, forks: bool = True) -> None:
        """Stop the query (and, unless ``forks`` is false, a tentative fork running in its
        stead, whose results are taken back: peer.engine.forks)."""
        if forks:
            await self.seams.stop_fork(name)
        if name in self.lane.members:
            await self._call(lambda: self.lane.remove(name))
            return
        running = self.running.pop(name, None)
        if running is None:
            return
        for stream, reader in running.readers:  # no backpressure from a stopped query
            with contextlib.suppress(KeyError):
                self.spools.get(stream).pause_reader(reader)

        def stop() -> None:
            # A stop during a batch sometimes logs an InterruptedException from the stream
            # thread; it is harmless (the batch is re-run from the checkpoint on restart).
            with contextlib.suppress(Exception):
                running.handle.stop()

        await self._call(stop)
        log.info("query %s stopped", name)

    async def hold_member(self, name: str) -> MemberCut:
        """Hold the lane at a batch boundary for moving member ``name`` out, and say where it
        stands (``Lane.hold``); :meth:`release_member` ends the hold."""
        return await asyncio.to_thread(self.lane.hold, name, HOLD_TIMEOUT_S)

    async def release_member(self, name: str, *, moved: bool) -> None:
        """The lane goes on, with member ``name`` or (``moved``) without it: then no longer
        over the streams only it read (the move drops its replica inputs here)."""
        spark = self.spark

        def release() -> None:
            self.lane.release(name, drop=moved)
            if moved and spark is not None:
                try:
                    self.lane.narrow(spark)
                except Exception as exc:  # it failed: the restarts of failed queries retry
                    log.error("the lane did not restart without %s: %s", name, error_line(exc))

        await self._call(release)

    @property
    def lane_reader(self) -> str:
        """The reader id the lane reads its input spools under (one for all its members)."""
        return LANE_READER

    def lane_seed(self, name: str, incarnation: str) -> Path:
        """Where a lane member arriving by a move leaves its windows (``Lane.add`` loads it)."""
        return self.lane.seed_path(name, incarnation)

    async def drop_query(self, name: str, incarnation: str) -> None:
        """Stop the query and remove its checkpoint and its spool reader registrations (found
        by their ids, ``<query key>-<n>``, so those of a query stopped earlier go too)."""
        await self.stop_query(name)
        await self.drop_leftovers(name, incarnation)

    async def drop_leftovers(self, name: str, incarnation: str) -> None:
        """Remove the checkpoint and the spool reader registrations of a run of ``name`` that
        no longer runs (another run of the same name may: a promoted standby's)."""
        key = query_key(name, incarnation)

        def release() -> None:
            for stream in self.spools.streams():
                spool = self.spools.get(stream)
                for reader in spool.readers():
                    if reader.startswith(f"{key}-"):
                        spool.unregister_reader(reader)
            shutil.rmtree(self.checkpoint_dir(name, incarnation), ignore_errors=True)

        await asyncio.to_thread(release)

    async def describe(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """What each query is doing. Asking a streaming query blocks on the JVM, so the
        questions run on the Spark thread, over a snapshot taken here (the loop owns
        ``running``)."""
        running = {n: self.running[n] for n in names if n in self.running}
        in_lane = {n: info for n in names if (info := self.lane.describe(n)) is not None}

        def ask() -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {n: {"active": False} for n in names}
            for name, info in in_lane.items():
                out[name] = {**info, "active": self.lane.active()}
            for name, query in running.items():
                info = {
                    "active": query.handle.isActive,
                    "batches": query.batches,
                    "rows_out": query.rows_out,
                    "last_batch_s": round(query.last_batch_s, 4),
                }
                exc = query.handle.exception()
                if exc is not None:
                    info["error"] = error_line(exc)
                out[name] = info
            return out

        return await self._call(ask)

    async def busy_seconds(self) -> dict[str, float]:
        """Seconds each query has spent running micro-batches, cumulative while this engine
        runs (the brain's load per fragment, peer.load). A query with its own streaming query
        has its own batches; the lane's batches are shared equally among the members it has
        when they are counted (the lane runs them all in one statement, and Spark reports the
        statement's time, not each member's). A lane without members counts under
        :data:`LANE_BUSY` (no query can have that name): time no fragment used.

        Spark keeps the last ``spark.sql.streaming.numRecentProgressUpdates`` (100) progress
        reports per query; each trigger's ``triggerExecution`` time is added once, the newest
        report counted being remembered by its trigger start time and batch id. The time is
        used rather than the batch id alone because an idle trigger reports the id of the
        batch still to come. Between two calls more than 100 triggers go partly uncounted."""
        # name -> what has a streaming query ``handle``; snapshot on the loop, which owns it
        handles: dict[str, Any] = dict(self.running)
        # Kept on the engine across calls, created on first use: query name -> ((trigger
        # start, batch id) of the newest report counted, seconds so far).
        busy: dict[str, tuple[tuple[str, int], float]] = self.__dict__.setdefault("_busy", {})
        rows: list[int] = self.__dict__.setdefault("_rows_read", [0])  # see rows_read()
        spent: list[float] = self.__dict__.setdefault("_busy_total", [0.0])  # see busy_total()
        # the lane's seconds counted so far ("" key), and each member's share of them
        shares: dict[str, float] = self.__dict__.setdefault("_lane_shares", {"": 0.0})

        def ask() -> dict[str, float]:
            if self.lane.handle is not None:  # the lane is the Spark thread's
                handles[LANE_BUSY] = self.lane
            for name in list(busy):
                if name not in handles:
                    del busy[name]
            out: dict[str, float] = {}
            for name, query in handles.items():
                newest, total = busy.get(name, (("", -1), 0.0))
                try:
                    progress = query.handle.recentProgress
                except Exception as exc:  # a query that died: no new batches to count
                    log.debug("query %s: no progress: %s", name, error_line(exc))
                    progress = []
                for report in progress:
                    stamp, batch = report.get("timestamp"), report.get("batchId")
                    ms = (report.get("durationMs") or {}).get("triggerExecution")
                    if not (isinstance(stamp, str) and isinstance(batch, int)):
                        continue
                    if (stamp, batch) <= newest or not isinstance(ms, int | float) or ms < 0:
                        continue
                    newest, total = (stamp, batch), total + ms / 1000.0
                    spent[0] += ms / 1000.0
                    read = report.get("numInputRows")
                    if isinstance(read, int) and not isinstance(read, bool) and read > 0:
                        rows[0] += read
                busy[name] = (newest, total)
                out[name] = total
            if LANE_BUSY in out:
                self._share_lane(out, shares)
            return out

        return await self._call(ask)

    def _share_lane(self, out: dict[str, float], shares: dict[str, float]) -> None:
        """Replace the lane's entry in ``out`` by its members' equal shares (cumulative per
        member: what the lane spent since the last count, split among today's members)."""
        total = out[LANE_BUSY]
        new = total - shares[""] if total >= shares[""] else total
        shares[""] = total
        members = self.lane.member_names()
        for name in list(shares):
            if name and name not in members:
                del shares[name]
        if not members:
            return
        for name in members:
            shares[name] = shares.get(name, 0.0) + new / len(members)
            out[name] = shares[name]
        del out[LANE_BUSY]

    def input_readers(self) -> list[tuple[str, str]]:
        """(stream, reader) of every input this engine's queries and lane read."""
        readers = [r for running in list(self.running.values()) for r in running.readers]
        readers.extend((stream, LANE_READER) for stream in list(self.lane.streams))
        return readers

    def busy_total(self) -> float:
        """Seconds the micro-batches counted by :meth:`busy_seconds` took, all queries and
        the lane together, cumulative while this engine runs (an elastic participant's useful
        time, peer.elastic.figures)."""
        return float(self.__dict__.get("_busy_total", [0.0])[0])

    def rows_read(self) -> int:
        """Input rows the micro-batches counted by :meth:`busy_seconds` have read, all queries
        and the lane together, cumulative while this engine runs (an elastic participant's
        processed rate, peer.elastic.figures)."""
        return int(self.__dict__.get("_rows_read", [0])[0])

    def _input_age_s(self, readers: list[tuple[str, str]]) -> float | None:
        """Seconds since the newest input batch a query has taken (planned into a micro-batch)
        was appended to its spool here; None before it has taken any."""
        newest: int | None = None
        for stream, reader in readers:
            try:
                spool = self.spools.get(stream)
                taken = fmt.taken_offset(fmt.reader_path(spool.directory, reader))
                if taken < 0:
                    continue
                stamp = spool.append_time_ns(taken)
            except (KeyError, ValueError, fmt.TrimmedError):
                continue  # dropped or trimmed meanwhile: nothing to measure from
            newest = stamp if newest is None else max(newest, stamp)
        return None if newest is None else max(0.0, (time.time_ns() - newest) / 1e9)

    def counters(self) -> dict[str, dict[str, float]]:
        """Each query's micro-batches and result rows so far, and its last batch's seconds:
        counters kept on this side of py4j, so reading them asks nothing of the JVM."""
        out: dict[str, dict[str, float]] = {}
        for name, query in list(self.running.items()):
            out[name] = {
                "batches": query.batches,
                "rows_out": query.rows_out,
                "last_batch_s": query.last_batch_s,
            }
        for name in self.lane.member_names():
            info = self.lane.describe(name)
            if info is not None:
                out[name] = {k: float(info[k]) for k in ("batches", "rows_out", "last_batch_s")}
        return out

    def stream_rows(self) -> dict[str, int]:
        """Result rows each stream got from the queries running here so far (counted as
        :meth:`counters` are; a query that stops or leaves takes its rows with it)."""
        out = self.lane.stream_rows()
        for query in list(self.running.values()):
            for stream, rows in list(query.rows_by_stream.items()):
                out[stream] = out.get(stream, 0) + rows
        return out

    async def progress(self, newest: dict[str, tuple[str, int]]) -> dict[str, list[dict[str, Any]]]:
        """Spark's progress reports (as JSON maps) of each query with its own streaming
        query, those newer than ``newest[query]`` (trigger start, batch id) only: the caller
        keeps that mark, as :meth:`busy_seconds` keeps its own."""
        running = dict(self.running)  # snapshot on the loop, which owns the dict

        def ask() -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for name, query in running.items():
                mark = newest.get(name, ("", -1))
                try:
                    progress = query.handle.recentProgress
                except Exception as exc:  # a query that died reports nothing new
                    log.debug("query %s: no progress: %s", name, error_line(exc))
                    continue
                fresh = []
                for report in progress:
                    stamp, batch = report.get("timestamp"), report.get("batchId")
                    if isinstance(stamp, str) and isinstance(batch, int) and (stamp, batch) > mark:
                        fresh.append(json.loads(report.json))
                out[name] = fresh
            return out

        return await self._call(ask)

    def runs(self, name: str, incarnation: str) -> bool:
        """Whether this engine runs ``incarnation`` of query ``name`` (in the lane or in its
        own streaming query; a warm standby's run is another incarnation)."""
        running = self.running.get(name)
        if running is not None:
            return running.incarnation == incarnation
        member = self.lane.members.get(name)
        return member is not None and member.origin == f"query:{name}:{incarnation}"

    async def restart_query(self, name: str) -> str:
        """Start a failed query again from its checkpoint: the lane, for a member of it (all
        its members with it); else its own streaming query, stopped first. Says which."""
        if name in self.lane.members:
            spark = self.spark
            assert spark is not None
            await self._call(lambda: self.lane.restart(spark))
            return "lane"
        running = self.running[name]
        await self.stop_query(name, forks=False)
        return await self.run_query(
            running.checked, running.incarnation, resume=True, placement="own"
        )

    async def failed(self) -> dict[str, str]:
        """Queries whose streaming query died, with the reason."""
        running = list(self.running.items())  # snapshot on the loop, which owns the dict
        lane_members = self.lane.member_names()

        def check() -> dict[str, str]:
            if self.executors is not None and self.spark is not None:
                from peer.engine.shipping import executor_count

                self.executors.observe(executor_count(self.spark))
            out = {}
            lane_failure = self.lane.failure()
            if lane_failure is not None:
                out.update({name: f"lane: {lane_failure}" for name in lane_members})
            for name, query in running:
                if not query.handle.isActive:
                    exc = query.handle.exception()
                    out[name] = error_line(exc) if exc is not None else "stopped"
            return out

        return await self._call(check)

    async def close(self) -> None:
        for name in list(self.running):
            await self.stop_query(name)
        await self._call(self.lane.stop)
        spark = self.spark
        self.spark = None
        if spark is not None and self._owns_session:
            with contextlib.suppress(Exception):
                await self._call(spark.stop)
        self._executor.shutdown(wait=False, cancel_futures=True)
