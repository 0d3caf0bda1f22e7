"""The lane: a peer's per-tuple queries and small windowed aggregates in one Spark streaming
query.

Theory of operation
-------------------
Each Spark streaming query runs its own micro-batch loop on the driver (planning, offset and
commit logs: ~0.3 s of driver time per batch, shared/notes/spark.md), so a peer that ran one
streaming query per hosted query would fall behind as soon as it hosted a dozen. Queries made
only of filter, map and union boxes need no state, so they can share one loop: the lane.
Windowed aggregates fed by such boxes share it too: the statement cuts their tuples into
windows and aggregates them per (window, group) in the executors, and each member merges
those partial aggregates into its own windows and watermark on the driver
(``peer.engine.lanepartial``, ``peer.engine.lanewin``). So what the driver collects grows
with the windows and groups of a batch, not with its input rows; the per-tuple members'
rows are collected as before, since they are those members' output, which the peer appends
to its result spools. With ``preaggregate=False`` (the engine's choice on a local master,
where the executors share the driver's process and the shuffle stage a member's GROUP BY
adds cost more than the copy it spares: scripts/bench_lane_collect.py) the lane collects the
windowed members' rows and computes the same partials on the driver with Arrow.

The lane's streaming plan is just ``fedlane source -> foreachBatch``. The source reads the
spools of every stream some member query reads (one wide row per tuple, tagged with its
stream). The sink registers the micro-batch as a temp view (cached when several members read
it) and runs one SQL statement that holds every member's boxes, translated once when the
member joined (``peer.engine.lanesql``), and collects it in a single Spark job. So a
micro-batch costs one job and two py4j calls whatever the number of members.

Adding a member whose streams the lane already reads changes nothing in Spark: the sink reads
the member set at every batch, and the new member sees the tuples from the lane's current
position on: it takes the batches Spark plans after it joined (``first_batch``), never a
re-run of an older one. A member that needs a new stream restarts the lane on the same
checkpoint with a wider source. That is safe because the lane holds no Spark state (the
windowed members' state is saved per batch id, and a re-run batch starts from the state of
the batch before it). A batch re-run
after a restart or a crash has the same offsets and the same batch id, and every member's
output is appended tagged (member incarnation, lane batch id), so the spool keeps it once.
A member that is stopped misses the tuples that arrive while it is stopped, as a consumer
detached from a live stream would (a windowed member also drops its open windows); a
restarted peer resumes the lane, with all its members, from its checkpoint.

A member moves to another peer (``peer.move``) without stopping Spark: :meth:`Lane.hold`
waits for the batch under way to end and keeps the next one from starting, then says where
the member stands (:class:`MemberCut`: for each input, the spool offset through which it has
taken every tuple, read from the offset log of the last batch it took, and its windows).
:meth:`Lane.release` lets the lane go on, with the member (the move failed: it lost nothing)
or without it. On the new peer the member joins that lane with its windows (a *seed* file
under ``arrived/``, kept while it runs there, so a crash before its first saved batch keeps
them), and the lane starts its inputs where the move put their reader offsets.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.engine.compile import OUT
from peer.engine.lane_source import SOURCE_NAME, shapes
from peer.engine.lanesql import (
    VIEW,
    MemberSql,
    lane_statement,
    member_sql,
    window_member_sql,
    window_partial_sql,
)
from peer.engine.lanewin import WindowState, narrow_schema, prefix_query, window_box
from peer.errors import Unavailable
from peer.model.plan import AggregateSpec, CheckedQuery, FilterSpec, MapSpec, UnionSpec
from peer.model.schema import Schema
from peer.storage.spool import SpoolSet
from peer.timing import MONOTONIC

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from peer.fetch.protocol import FetchEndpoint

log = logging.getLogger(__name__)

READER = "lane"
MEMBER = "__member"
ARRIVED = "arrived"  # seeds: the windows of members that moved here (see the module docstring)


@dataclass(frozen=True)
class MemberCut:
    """A member held at a batch boundary (:meth:`Lane.hold`): for each of its inputs, the
    spool offset through which it has taken every tuple, and its windows' state (None: a
    per-tuple member)."""

    positions: dict[str, int]
    window: dict[str, Any] | None
    reader: str = READER  # the lane's reader id in each input spool


def seed_name(name: str, incarnation: str) -> str:
    return f"{name}.{incarnation}.msgpack"


def error_line(exc: BaseException) -> str:
    """The first line of a (Spark) error: enough to say why, short enough for a status."""
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__


def is_stateless(checked: CheckedQuery) -> bool:
    return all(isinstance(b.spec, FilterSpec | MapSpec | UnionSpec) for b in checked.boxes)


def lane_kind(checked: CheckedQuery) -> str | None:
    """What the lane runs ``checked`` as: "stateless" (per-tuple boxes), "window" (per-tuple
    boxes then a windowed aggregate with its own watermark, ``peer.engine.lanewin``), or
    None: it needs its own streaming query."""
    if is_stateless(checked):
        return "stateless"
    return "window" if window_box(checked) is not None else None


@dataclass
class LaneMember:
    checked: CheckedQuery
    origin: str
    first_batch: int  # lane batches before this one were planned before the member joined
    rows_out: int = 0
    rows_by_stream: dict[str, int] = field(default_factory=dict)  # rows_out by result stream
    # A windowed aggregate: its per-tuple part, and its open windows and watermark.
    prefix: CheckedQuery | None = None
    window: WindowState | None = None
    seed: dict[str, Any] | None = None  # the windows it arrived with (a move), until saved

    @classmethod
    def make(cls, checked: CheckedQuery, origin: str, first_batch: int) -> LaneMember:
        member = cls(checked, origin, first_batch, rows_by_stream=dict.fromkeys(checked.outputs, 0))
        box = window_box(checked)
        if box is not None:
            assert isinstance(box.spec, AggregateSpec)
            member.prefix = prefix_query(checked, box)
            member.window = WindowState(box.spec, narrow_schema(box), box.output_schemas[0])
        return member

    def sql(self, j: int, layout: dict[str, tuple[int, int]], *, preaggregate: bool) -> MemberSql:
        if self.window is None or self.prefix is None:
            return member_sql(self.checked, j, layout)
        if preaggregate:
            return window_partial_sql(self.prefix, self.window.partials, j, layout)
        return window_member_sql(self.prefix, self.window.narrow, self.window.order_on, j, layout)

    @property
    def outputs(self) -> list[tuple[str, Schema]]:
        return [(s, self.checked.stream_schemas[s]) for s in self.checked.outputs]

    def wrote(self, stream: str, rows: int) -> None:
        self.rows_out += rows
        self.rows_by_stream[stream] = self.rows_by_stream.get(stream, 0) + rows


class Lane:
    """Owned by the engine; every method runs on the engine's Spark thread."""

    def __init__(
        self,
        spools: SpoolSet,
        root: Path,
        *,
        name: str,
        trigger_s: float,
        max_rows: int,
        preaggregate: bool = True,
        fetch: FetchEndpoint | None = None,
        clock: Callable[[], float] = MONOTONIC,
    ) -> None:
        self.spools = spools
        # The peer's fetch server: the executors fetch the lane's input from it (None: they
        # open the spool files, on the peer's host).
        self.fetch = fetch
        self.clock = clock  # the phases of a batch (read on Spark's thread)
        # Windowed members: aggregate per (window, group) in the executors and collect the
        # partials (True), or collect their rows and aggregate on the driver (False: the path
        # before, kept for the benchmark that compares the two).
        self.preaggregate = preaggregate
        self.root = root
        self.name = name  # the streaming query's name in the Spark session
        self.trigger_s = trigger_s
        self.max_rows = max_rows
        self.members: dict[str, LaneMember] = {}
        self.streams: list[str] = []
        self.handle: StreamingQuery | None = None
        self.batches = 0
        self.last_batch_s = 0.0
        # The SQL of the current member set over the current streams (key, statement, slots).
        self._statement_key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._statement_sql: tuple[str, list[list[str]]] = ("", [])
        self.layout: dict[str, tuple[int, int]] = {}  # stream -> (index, shape) in the source
        self.phase_s: dict[str, float] = {}  # the last batch: building, collecting, appending
        # What the driver collected: the last batch's Arrow bytes and rows, and the totals.
        self.collected_bytes = 0
        self.collected_rows = 0
        self.collected_bytes_total = 0
        self.collected_rows_total = 0
        self._lock = threading.Lock()  # members are read by the sink on a py4j thread
        # Windowed members' states: loaded from the files at the first batch with such
        # members, then kept in memory; ``_windows_batch`` is the batch they reflect.
        self._windows_loaded = False
        self._windows_batch = -1
        self._state_paths: list[Path] = []  # the state files on disk, oldest first
        # Held while a batch runs in the sink, and by ``hold`` while a member moves out.
        self._gate = threading.Lock()
        self._batch_ran = threading.Condition(self._gate)  # notified as each batch ends
        self._held: str | None = None  # the member held for a move: no batch includes it
        self._holding = False  # whether ``hold`` has the gate (a stop takes it back)
        self._done_batch = -1  # the last batch whose sink ended (or was committed at start)
        self._replaying = False  # (re)started with a planned, uncommitted batch not run yet

    def add(
        self, spark: SparkSession, checked: CheckedQuery, incarnation: str, *, resume: bool = False
    ) -> None:
        """Add a member. A new one takes the batches planned from now on; one resumed after a
        restart takes every batch, since a re-run batch may hold its unsaved output."""
        name = checked.query.name
        first = 0 if resume else self._planned() + 1
        member = LaneMember.make(checked, f"query:{name}:{incarnation}", first)
        seed = self.seed_path(name, incarnation)
        if member.window is not None and seed.is_file():  # it moved here with its windows
            import msgpack

            member.seed = msgpack.unpackb(seed.read_bytes(), strict_map_key=False)
            member.window.load(member.seed)
        with self._lock:
            self.members[name] = member
        needed = self._needed()
        if self.handle is None or not set(needed) <= set(self.streams):
            try:
                self._restart(spark, needed)
            except Exception:
                self.remove(name)  # Spark refused: the lane goes on without it
                raise

    def remove(self, name: str) -> bool:
        """Stop member ``name`` (a stopped windowed member drops its windows, its seed too)."""
        with self._lock:
            member = self.members.pop(name, None)
        if member is not None:
            self._forget_seed(member)
        if member is not None and not self.members:
            self.stop(release=True)
        return member is not None

    def _forget_seed(self, member: LaneMember) -> None:
        incarnation = member.origin.rsplit(":", 1)[-1]
        name = member.checked.query.name
        (self.root / ARRIVED / seed_name(name, incarnation)).unlink(missing_ok=True)

    def seed_path(self, name: str, incarnation: str) -> Path:
        """Where a member arriving with its windows finds them (``peer.move`` writes it)."""
        return self.root / ARRIVED / seed_name(name, incarnation)

    def stop(self, *, release: bool = False) -> None:
        if self._holding:
            # A held sink would keep Spark's stop waiting: let the batch waiting at the gate
            # go, to fail (``_sink``), uncommitted: a restart runs it again, the held member
            # with it unless it moved away.
            self._holding = False
            self._gate.release()
        if self.handle is not None:
            try:
                self.handle.stop()
            except Exception as exc:  # a stop during a batch may log an interrupt: harmless
                log.debug("lane stop: %s", exc)
            self.handle = None
        if release:  # nobody reads through the lane: stop holding its streams' spools back
            for stream in self.streams:
                if stream in self.spools.streams():
                    self.spools.get(stream).unregister_reader(READER)
            self.streams = []

    def _planned(self) -> int:
        """The last batch id Spark planned (it writes offsets/N before running batch N)."""
        return self._logged("offsets")

    def _logged(self, log_name: str) -> int:
        """The newest batch id in the checkpoint's ``offsets`` or ``commits`` log (-1: none)."""
        directory = self.root / "checkpoint" / log_name
        ids = (
            [int(p.name) for p in directory.iterdir() if p.name.isdigit()]
            if directory.is_dir()
            else []
        )
        return max(ids, default=-1)

    # ------------------------------------------------------------------ moving a member out
    def hold(self, name: str, timeout_s: float) -> MemberCut:
        """Wait (at most ``timeout_s``) for the batch under way to end, keep the next from
        starting until :meth:`release`, and say where member ``name`` stands. Any thread.
        TimeoutError if the batch did not end; KeyError if no such member (nothing held).

        After a (re)start, a batch Spark had planned and not committed runs again first: its
        outputs may be in the result spools already, under this incarnation, so the member
        stands after it only once it ran (the hold waits for it)."""
        deadline = time.monotonic() + timeout_s  # one budget for both waits
        if not self._gate.acquire(timeout=timeout_s):
            raise TimeoutError(f"the lane's batch did not end within {timeout_s:.0f} s")
        # the batch to run again is at the gate: let it in (wait releases the gate meanwhile)
        replayed = self._batch_ran.wait_for(
            lambda: not self._replaying or self._done_batch >= self._planned(),
            max(0.0, deadline - time.monotonic()),
        )
        if not replayed:
            self._gate.release()
            raise TimeoutError(
                f"the lane's batch to run again did not end within {timeout_s:.0f} s"
            )
        try:
            with self._lock:
                member = self.members[name]
            if member.window is not None and not self._windows_loaded:
                self._load_windows(self._done_batch + 1)  # as the next batch would find them
            cut = max(self._done_batch, member.first_batch - 1)
            positions = self._positions(cut, list(member.checked.inputs))
            window = member.window.to_state() if member.window is not None else None
        except BaseException:
            self._gate.release()
            raise
        self._held, self._holding = name, True
        return MemberCut(positions, window)

    def release(self, name: str, *, drop: bool) -> None:
        """End :meth:`hold`: the lane goes on with member ``name`` (``drop``: without it, it
        moved away). On the engine's Spark thread (dropping the last member stops the lane)."""
        if drop:
            with self._lock:
                member = self.members.pop(name, None)
            if member is not None:
                self._forget_seed(member)
        if self._held == name:
            self._held = None
            if self._holding:
                self._holding = False
                self._gate.release()
        if drop and not self.members:
            self.stop(release=True)

    def _positions(self, batch_id: int, streams: list[str]) -> dict[str, int]:
        """Each stream's offset at the end of lane batch ``batch_id`` (its offset log), or,
        for a stream that batch did not read, where the lane would start it: its reader's
        committed offset."""
        named: dict[str, Any] = {}
        path = self.root / "checkpoint" / "offsets" / str(batch_id)
        if batch_id >= 0 and path.is_file():
            # Spark's offset log: a version line, the batch's metadata, then one offset per
            # source (the lane has one: {"o": {stream: N}})
            lines = path.read_text().splitlines()
            named = json.loads(lines[-1]).get("o", {}) if len(lines) >= 3 else {}
        return {
            s: int(named[s]) if s in named else self.spools.get(s).committed(READER)
            for s in streams
        }

    def _needed(self) -> list[str]:
        with self._lock:
            return sorted({s for m in self.members.values() for s in m.checked.inputs})

    def narrow(self, spark: SparkSession) -> None:
        """Stop reading the streams no member reads any more (a restart over the others)."""
        needed = self._needed()
        if self.handle is not None and needed and set(self.streams) - set(needed):
            self._restart(spark, needed)

    def restart(self, spark: SparkSession) -> None:
        """Start the lane again over the same streams (after it failed): from its checkpoint,
        every member with it."""
        self._restart(spark, list(self.streams))

    def _restart(self, spark: SparkSession, streams: list[str]) -> None:
        if self._held is not None:  # (its batches wait at the gate until the move ends)
            raise Unavailable(
                f"the lane is held while {self._held} moves out; start the query again in a moment"
            )
        self.stop()
        for stream in set(self.streams) - set(streams):
            self.spools.get(stream).unregister_reader(READER)
        self.streams = streams
        spec: dict[str, list[dict[str, Any]]] = {"streams": []}
        for stream in streams:
            spool = self.spools.get(stream)
            spool.register_reader(READER)
            schema = self._schema_of(stream)
            spec["streams"].append(
                {
                    "name": stream,
                    # absolute: a fetch capability names the spool as the server resolves it
                    "dir": os.path.abspath(spool.directory),
                    "reader": READER,
                    "fields": [[f.name, f.type] for f in schema.fields],
                }
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self._done_batch = self._logged("commits")
        self._replaying = self._planned() > self._done_batch
        # A batch that failed may have changed the windows in memory before it failed:
        # they are read again from the state files at the first batch
        self._windows_loaded = False
        spec_path = self.root / "spec.json"
        spec_path.write_text(json.dumps(spec))
        self.layout = {
            stream: (i, shape)
            for i, (stream, shape) in enumerate(zip(streams, shapes(spec), strict=True))
        }
        frame = (
            spark.readStream.format(SOURCE_NAME)
            .options(**({} if self.fetch is None else self.fetch.to_options()))
            .option("spec", str(spec_path))
            .option("maxRowsPerBatch", str(self.max_rows))
            .load()
        )
        self.handle = (
            frame.writeStream.queryName(self.name)
            .option("checkpointLocation", str(self.root / "checkpoint"))
            .trigger(processingTime=f"{self.trigger_s} seconds")
            .foreachBatch(self._sink)
            .start()
        )
        log.info(
            "lane (re)started over %d stream(s) for %d query(ies)", len(streams), len(self.members)
        )

    def _schema_of(self, stream: str) -> Schema:
        with self._lock:
            for member in self.members.values():
                if stream in member.checked.stream_schemas:
                    return member.checked.stream_schemas[stream]
        raise KeyError(stream)

    def _sink(self, df: DataFrame, batch_id: int) -> None:
        with self._gate:  # (``hold`` keeps the batch from starting while a member moves out)
            if self._held is not None:  # the lane stopped while holding: no batch past the cut
                raise RuntimeError(f"the lane stopped while {self._held} was held for a move")
            self._run_batch(df, batch_id)
            self._done_batch, self._replaying = batch_id, False
            self._batch_ran.notify_all()

    def _run_batch(self, df: DataFrame, batch_id: int) -> None:
        started = self.clock()
        layout = self.layout
        with self._lock:
            members = [
                m
                for m in self.members.values()
                if set(m.checked.inputs) <= set(layout) and batch_id >= m.first_batch
            ]
        if not members:
            return
        windows = [m for m in members if m.window is not None]
        if windows and (not self._windows_loaded or batch_id <= self._windows_batch):
            self._load_windows(batch_id)  # a fresh start, or Spark runs a batch again
        # Several members scan the batch: cache it, and fill the cache before the statement
        # runs (a cache is filled lazily, so the statement's branches would each read the
        # source again: 16 members made a batch 16 source reads, ~4 s). One member scans it
        # once anyway, and caching would cost a second pass.
        cached = df
        if len(members) > 1:
            cached = df.persist()
            cached.count()
        try:
            statement, slots = self._statement(members, layout)
            cached.createOrReplaceTempView(VIEW)
            planned = self.clock()
            table = cached.sparkSession.sql(statement).toArrow()
        finally:
            if cached is not df:
                cached.unpersist()
        collected = self.clock()
        self.collected_bytes, self.collected_rows = table.nbytes, table.num_rows
        self.collected_bytes_total += table.nbytes
        self.collected_rows_total += table.num_rows
        for j, member in enumerate(members):
            if member.window is not None:
                window = member.window
                part = _member_output(table, j, 0, slots[j][0])
                if part is None:
                    closed = None
                elif self.preaggregate:
                    closed = window.take_partials(part)
                else:
                    closed = window.take(part)
                if closed is not None:
                    out = member.checked.outputs[0]
                    self.spools.get(out).append(closed, origin=member.origin, seq=batch_id)
                    member.wrote(out, closed.num_rows)
                continue
            for k, (stream, _) in enumerate(member.outputs):
                part = _member_output(table, j, k, slots[j][k])
                if part is not None:
                    self.spools.get(stream).append(part, origin=member.origin, seq=batch_id)
                    member.wrote(stream, part.num_rows)
        if windows:
            self._save_windows(batch_id, windows)
        self.batches += 1
        done = self.clock()
        self.last_batch_s = done - started
        self.phase_s = {
            "plan": planned - started,
            "collect": collected - planned,
            "append": done - collected,
        }

    def _statement(
        self, members: list[LaneMember], layout: dict[str, tuple[int, int]]
    ) -> tuple[str, list[list[str]]]:
        """The SQL of these members over these streams, translated once and then reused."""
        key = (tuple(m.origin for m in members), tuple(layout))
        if key != self._statement_key:
            pre = self.preaggregate
            translated = [m.sql(j, layout, preaggregate=pre) for j, m in enumerate(members)]
            self._statement_key, self._statement_sql = key, lane_statement(translated)
        return self._statement_sql

    # ------------------------------------------------------------------ windowed members' state
    def _state_dir(self) -> Path:
        return self.root / "windows"

    def _state_files(self) -> list[tuple[int, Path]]:
        """Read from the directory once, at load; then kept by ``_save_windows``."""
        directory = self._state_dir()
        if not directory.is_dir():
            return []
        found = [(int(p.stem), p) for p in directory.glob("*.msgpack") if p.stem.isdigit()]
        return sorted(found)

    def _load_windows(self, batch_id: int) -> None:
        """Every windowed member's state as it was after the newest batch before
        ``batch_id`` (none: empty windows)."""
        import msgpack

        files = self._state_files()
        self._state_paths = [path for _, path in files]
        earlier = [path for n, path in files if n < batch_id]
        states: dict[str, Any] = {}
        if earlier:
            states = msgpack.unpackb(earlier[-1].read_bytes(), strict_map_key=False)
        with self._lock:
            members = list(self.members.values())
        for member in members:
            if member.window is None:
                continue
            member.window.reset()
            if member.origin in states:
                member.window.load(states[member.origin])
            elif member.seed is not None:  # it arrived after that batch, with these windows
                member.window.load(member.seed)
        self._windows_loaded = True
        self._windows_batch = batch_id - 1
        log.info("lane: windowed state of batch %d restored", batch_id - 1)

    def _save_windows(self, batch_id: int, members: list[LaneMember]) -> None:
        """Write the windowed members' states after ``batch_id`` (fsynced, renamed into
        place); keep the previous file, which a re-run of this batch starts from."""
        import os

        import msgpack

        states = {m.origin: m.window.to_state() for m in members if m.window is not None}
        directory = self._state_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{batch_id:020d}.msgpack"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(states, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._windows_batch = batch_id
        if path not in self._state_paths:  # (a re-run batch writes its file again)
            self._state_paths.append(path)
        while len(self._state_paths) > 2:
            self._state_paths.pop(0).unlink(missing_ok=True)

    def member_names(self) -> list[str]:
        with self._lock:
            return list(self.members)

    def stream_rows(self) -> dict[str, int]:
        """Rows each stream got from the members so far (no JVM call): safe on any thread."""
        out: dict[str, int] = {}
        with self._lock:
            for member in self.members.values():
                for stream, rows in list(member.rows_by_stream.items()):
                    out[stream] = out.get(stream, 0) + rows
        return out

    def describe(self, name: str) -> dict[str, Any] | None:
        """Counters only (no JVM call): safe on any thread."""
        with self._lock:
            member = self.members.get(name)
        if member is None:
            return None
        return {
            "lane": True,
            "batches": self.batches,
            "rows_out": member.rows_out,
            **(member.window.describe() if member.window is not None else {}),
            "last_batch_s": round(self.last_batch_s, 4),
            "phase_s": {k: round(v, 4) for k, v in self.phase_s.items()},
            # the whole lane's last batch: what the driver collected (Arrow bytes, rows)
            "collected_bytes": self.collected_bytes,
            "collected_rows": self.collected_rows,
        }

    def active(self) -> bool:
        """Asks the JVM: call on the Spark thread."""
        return self.handle is not None and bool(self.handle.isActive)

    def failure(self) -> str | None:
        if self.handle is None:  # a (re)start that Spark refused leaves members without it
            return "not running" if self.members and self._held is None else None
        if self.handle.isActive:
            return None
        exc = self.handle.exception()
        return error_line(exc) if exc is not None else "stopped"


def _member_output(table: pa.Table, member: int, output: int, slot: str) -> pa.Table | None:
    """One output of one member: the fields of its struct column in its rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return None
    mask = pc.and_(pc.equal(table.column(MEMBER), member), pc.equal(table.column(OUT), output))
    rows = table.filter(mask)
    if not rows.num_rows:
        return None
    struct = rows.column(slot).combine_chunks()
    fields = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    return pa.Table.from_arrays([struct.field(i) for i in range(len(fields))], names=fields)
