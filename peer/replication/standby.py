"""Warm standbys of replicated fragments: process pairs on the replicated log.

Theory of operation
-------------------
A replicated fragment (:mod:`peer.replication.fragment_failover`) runs on the primary of its
input stream A; its result streams and its checkpoint stream are anchored to A, so every
in-sync replica of A holds A, the results and the checkpoint records. Without a standby, the
peer that takes A over after a failure unpacks the newest checkpoint record and starts the
fragment cold: seconds before its first result. A fragment whose query asks for a standby
(``"standby": true``) also runs, on one in-sync replica of A (the stream's ``standby`` in the
control plane), as the same query over that peer's copy of A:

* **Who.** A peer with an engine, in A's ISR and not its primary, proposes itself as A's
  standby (``SetStandby``) when A has none; the control plane keeps one. A failover elects the
  standby first (:func:`peer.replication.control.choose_primary`), and any change that takes
  the standby out of the ISR, or makes it primary, clears it, so the next ISR member proposes
  itself: after a failover a new standby starts on the next in-sync replica.
* **Start.** The standby unpacks the fragment's newest checkpoint record into a checkpoint of
  its own (incarnation ``standby-…``) and starts the query from it, reading its copy of A to
  the log's end (a follower's spool is held at -1, and its unacknowledged tail is the log the
  standby's peer will have if it is promoted). It runs from the same state and the same
  offsets as the primary's batch, so it makes the same results (for input that is not late:
  Spark drops a tuple older than its batch's watermark, and two runs with other batch
  boundaries have other watermarks when a late tuple comes). A peer restarted after a crash
  starts its standby again the same way, from the newest record.
* **Hold.** Its results are held back in memory, each named by
  :mod:`peer.replication.result_identity` (for an aggregate: the window and the group), and
  trimmed as the primary's result streams advance: a result stream's newest entry is tagged
  (origin, batch id); the checkpoint record the primary wrote before that batch holds Spark's
  offset log of the batch, whose watermark closed every window ending at or before it (Spark
  evicts a window once its end is at or below the batch's watermark). Held results so covered
  are in the result stream: dropped.
* **Promotion.** When the standby's peer becomes primary of A and of all the fragment's
  streams, :class:`~peer.replication.fragment_failover.ReplicatedFragments` asks
  :meth:`Standbys.promote` instead of starting the fragment from a record: the standby reads
  what the result streams hold (its own copies, which are now the streams), publishes the
  held results that are not covered, batch by batch, tagged with its own origin and batch
  ids, and goes on running: every later batch passes the same filter (a standby that lagged
  makes results the primary published). Its checkpoint then becomes the fragment's: the next
  batches write checkpoint records as the primary's did.
* **Restarts.** A change of A's epoch that does not promote this peer may truncate its copy
  of A (another member became primary): the standby is restarted from the newest record.

A standby runs for fragments with at most one stateful box (a VALUES-windowed aggregate or a
windowed join), each result stream reached on one route (:func:`refusal` says why not,
once, in the log). A join's results are named by both input tuples, which the engine carries
as lineage columns; a fragment with several inputs needs the standby seat of every input (the
anchor's first), so that a failover elects one peer for all of them; its source offsets name
their stream, so that the offset log says where each input of a batch ended.

A double failure during a promotion (the standby's peer dies after publishing its held
results and before its first checkpoint record) leaves the next peer to take over from the old
primary's record, whose origin differs from the standby's: those results may then come twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import shutil
import uuid
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from peer.errors import FedstreamError
from peer.model.plan import BSortSpec, CheckedQuery
from peer.model.query import parse_query
from peer.model.windows import AggregateSpec, JoinSpec
from peer.replication.checkpoint_record import FragmentRecord
from peer.replication.control import SetStandby, StreamState
from peer.replication.names import CKPT_PREFIX, checkpoint_stream
from peer.replication.plane import ControlPlane
from peer.replication.result_identity import (
    FromInput,
    FromWindow,
    Frontier,
    IdentityError,
    IdentityRule,
    Published,
    ResultId,
    Unnamed,
    identity_rule,
)
from peer.site import LocalSite
from peer.storage.bundle import member, unbundle
from peer.storage.spool_format import (
    SEQ_COLUMN,
    SEQ_SHIFT,
    file_info,
    file_metadata,
    is_lineage,
    offset_path,
    read_file,
)
from peer.timing import MONOTONIC, Clock

log = logging.getLogger(__name__)

INCARNATION_PREFIX = "standby-"
MAX_HELD_ROWS = 1_000_000  # a standby holding more stops (its primary publishes nothing)
RECORD_SCAN = 256  # checkpoint records searched back for the one behind a result batch

Publish = Callable[[str, pa.Table, str, int], Awaitable[None]]


@dataclass(frozen=True)
class HeldBatch:
    """Results of one batch of a standby, for one result stream, each with its identity."""

    seq: int  # the standby's batch id
    stream: str
    table: pa.Table
    ids: list[ResultId]


class StandbyRun:
    """One standby's run and what it holds (mutated only through its methods, under
    ``lock`` by the caller)."""

    def __init__(
        self,
        name: str,
        anchor: str,
        epochs: tuple[int, ...],
        incarnation: str,
        checked: CheckedQuery,
        rule: IdentityRule,
        boxes: dict[str, str],
    ) -> None:
        self.name = name
        self.anchor = anchor
        self.epochs = epochs  # its inputs' epochs when it started
        self.incarnation = incarnation
        self.checked = checked
        self.rule = rule
        self.boxes = boxes  # aggregate box -> its order type (the watermark's unit)
        self.held: list[HeldBatch] = []
        self.frontiers: dict[str, tuple[int, Frontier]] = {}  # by the stream's log end
        self.batches = 0
        self.last_batch: float | None = None
        self.promoted: Published | None = None
        self.lock = asyncio.Lock()

    @property
    def origin(self) -> str:
        return f"query:{self.name}:{self.incarnation}"

    @property
    def held_rows(self) -> int:
        return sum(batch.table.num_rows for batch in self.held)

    @property
    def per_tuple(self) -> bool:
        """Whether some result is named by input tuples (then a frontier needs input ends)."""
        return any(
            isinstance(source, FromInput)
            for stream in self.checked.outputs
            for path in self.rule.paths(stream)
            for source in path.sources
        )

    def take(
        self, stream: str, seq: int, table: pa.Table, names: list[ResultId], now: float
    ) -> pa.Table | None:
        """A result part of batch ``seq``: held (None) until promoted, then what of it the
        result streams do not hold."""
        self.batches += 1
        self.last_batch = now
        if self.promoted is None:
            self.held.append(HeldBatch(seq, stream, table, names))
            return None
        keep = [not self.rule.covered(n, self.promoted) for n in names]
        return table.filter(pa.array(keep, pa.bool_()))

    def trim(self, published: Published) -> None:
        """Drop the held results the result streams hold."""
        kept = []
        for batch in self.held:
            keep = [not self.rule.covered(n, published) for n in batch.ids]
            if all(keep):
                kept.append(batch)
            elif any(keep):
                ids = [n for n, k in zip(batch.ids, keep, strict=True) if k]
                table = batch.table.filter(pa.array(keep, pa.bool_()))
                kept.append(HeldBatch(batch.seq, batch.stream, table, ids))
        self.held = kept

    def promote(self, published: Published) -> list[HeldBatch]:
        """Promoted: the held results to publish (those ``published`` does not cover, each
        identity once, in the standby's order, per batch); later batches pass the filter."""
        seen: set[ResultId] = set()
        out = []
        for batch in self.held:
            keep = []
            for identity in batch.ids:
                keep.append(identity not in seen and not self.rule.covered(identity, published))
                seen.add(identity)
            ids = [n for n, k in zip(batch.ids, keep, strict=True) if k]
            if ids:
                table = batch.table.filter(pa.array(keep, pa.bool_()))
                out.append(HeldBatch(batch.seq, batch.stream, table, ids))
        self.held = []
        self.promoted = published
        return out

    def known_frontier(self, stream: str, end: int) -> Frontier | None:
        known = self.frontiers.get(stream)
        return known[1] if known is not None and known[0] == end else None

    def remember(self, stream: str, end: int, frontier: Frontier) -> None:
        self.frontiers[stream] = (end, frontier)


@dataclass(frozen=True)
class Promoted:
    """What a promoted standby hands the replicated fragments: the fragment as it now runs."""

    incarnation: str
    published: int  # held results published at promotion
    took_s: float


def refusal(checked: CheckedQuery, rule: IdentityRule | Unnamed) -> str | None:
    """Why ``checked`` cannot have a standby yet (None: it can)."""
    if isinstance(rule, Unnamed):
        return rule.message
    stateful = [
        b for b in checked.boxes if isinstance(b.spec, AggregateSpec | JoinSpec | BSortSpec)
    ]
    if len(stateful) > 1 or any(isinstance(b.spec, BSortSpec) for b in stateful):
        return "a standby runs so far for fragments with one aggregate or one join"
    for box in stateful:
        if isinstance(box.spec, AggregateSpec) and box.spec.window_by != "VALUES":
            return "a standby runs so far for VALUES windows only"
    for stream in checked.outputs:
        paths = rule.paths(stream)
        if len(paths) != 1 or not paths[0].marked:
            return f"result stream {stream} is reached on more than one route"
        for source in paths[0].sources:
            if isinstance(source, FromWindow) and source.visible is None:
                return f"result stream {stream} does not carry its aggregate's window and group"
    return None


@dataclass(frozen=True)
class BatchMarks:
    """What Spark's offset log says of one batch: its event-time watermark (ms) and, per
    source, the last spool offset the batch reads (and the stream, for a query with a standby,
    whose offsets name it)."""

    watermark_ms: int
    ends: tuple[tuple[str | None, int], ...]  # (the stream a source reads if named, offset)

    def input_ends(self, inputs: tuple[str, ...]) -> dict[str, int]:
        """Per input stream, the last offset every source of it had read (an unnamed source
        is the one input's, if the fragment has one)."""
        found: dict[str, int] = {}
        for stream, end in self.ends:
            if stream is None and len(inputs) == 1:
                stream = inputs[0]
            if stream is not None:
                found[stream] = min(end, found.get(stream, end))
        return found


def batch_marks(checkpoint: bytes, batch: int) -> BatchMarks | None:
    """The offset log entry of ``batch`` in a checkpoint bundle; None if the bundle has no
    such batch. ValueError names what is malformed (a record from a replica is untrusted)."""
    raw = member(checkpoint, f"offsets/{batch}")
    if raw is None:
        return None
    lines = raw.decode("utf-8", "replace").splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise ValueError(f"offset log entry {batch} is not Spark's (v1, metadata, offsets)")
    try:
        metadata = json.loads(lines[1])
        mark = metadata["batchWatermarkMs"]
        sources = [json.loads(line) for line in lines[2:] if line.strip()]
        ends = tuple((source.get("stream"), source["offset"]) for source in sources)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"offset log entry {batch}: {type(exc).__name__} {exc}") from None
    for value in (mark, *(end for _, end in ends)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"offset log entry {batch}: {value!r:.40} is not an int")
    if any(stream is not None and not isinstance(stream, str) for stream, _ in ends):
        raise ValueError(f"offset log entry {batch}: a source's stream is not a string")
    return BatchMarks(mark, ends)


def named(rule: IdentityRule, stream: str, table: pa.Table) -> tuple[pa.Table, list[ResultId]]:
    """A standby's result part without its hidden lineage columns, and each row's identity (a
    per-tuple result by the input tuples its ``__seq`` or ``__lineage<k>_seq`` name, an
    aggregate's by its own columns)."""
    hidden = [c for c in table.column_names if c == SEQ_COLUMN or is_lineage(c)]
    rows = table.to_pylist()
    if hidden:
        for row in rows:
            for column in hidden:
                seq = row.pop(column)
                k = 0 if column == SEQ_COLUMN else int(column[len("__lineage") : -len("_seq")])
                if isinstance(seq, int):
                    row[f"__lineage{k}_offset"] = seq >> SEQ_SHIFT
                    row[f"__lineage{k}_row"] = seq & ((1 << SEQ_SHIFT) - 1)
        table = table.drop_columns(hidden)
    return table, [rule.name(stream, row) for row in rows]


def window_mark(watermark_ms: int, order_type: str) -> Hashable:
    """A watermark in the unit of an aggregate's window bounds (its order field's type)."""
    if order_type == "timestamp":
        return dt.datetime.fromtimestamp(watermark_ms / 1000, tz=dt.UTC)
    return watermark_ms / 1000


class Standbys:
    """The warm standbys this peer runs (see the module docstring)."""

    def __init__(self, site: LocalSite, plane: ControlPlane, *, clock: Clock = MONOTONIC) -> None:
        self.site = site
        self.plane = plane
        self.clock = clock
        self.me = plane.me
        self.running: dict[str, StandbyRun] = {}
        self.promotions = 0
        self._by_origin: dict[str, StandbyRun] = {}
        self._refused: dict[str, tuple[int, str]] = {}  # fragment -> (record offset, why)

    # ----------------------------------------------------------------------- results
    def holds(self, origin: str | None) -> bool:
        return origin is not None and origin in self._by_origin

    async def accept(self, stream: str, table: pa.Table, origin: str, seq: int) -> pa.Table | None:
        """A result part of a standby's batch: held (None), or after promotion, what of it
        the result stream does not hold yet."""
        standby = self._by_origin.get(origin)
        if standby is None:
            return table
        table, names = named(standby.rule, stream, table)
        async with standby.lock:
            passed = standby.take(stream, seq, table, names, self.clock())
            if passed is None and standby.held_rows > MAX_HELD_ROWS:
                log.error(
                    "standby of %s holds over %d results: its primary publishes none; stopping it",
                    standby.name,
                    MAX_HELD_ROWS,
                )
                asyncio.get_running_loop().create_task(self.stop(standby.name))
            return passed

    # ----------------------------------------------------------------------- keeping them
    async def reconcile(self) -> None:
        """Start the standbys this peer should run, stop those it should not, trim the held."""
        client = self.plane.client
        if not client.active or self.site.engine is None:
            return
        wanted: set[str] = set()
        for stream in list(self.plane.replicas.streams):
            if not stream.startswith(CKPT_PREFIX):
                continue
            name = stream[len(CKPT_PREFIX) :]
            state = client.states.get(stream)
            anchor = client.states.get(state.anchor) if state and state.anchor else None
            if state is None or anchor is None:
                continue
            if anchor.primary == self.me:
                if name in self.running:  # elected: kept until promoted, or refused
                    wanted.add(name)
                continue  # (the replicated fragments run it here, or take it over)
            if self.me not in anchor.in_sync:
                continue
            record = await asyncio.to_thread(self._newest, stream)
            if record is None or record.definition.get("standby") is not True:
                continue
            if record.status not in ("SETUP", "RUNNING"):
                continue
            # Every input must name this peer its standby, so that a failover elects it for
            # all of them (the fragment runs only where it leads every input): the anchor
            # first, then (once it is this peer's) the others.
            if anchor.standby is None:
                await self._volunteer(anchor)
                continue
            if anchor.standby != self.me:
                continue
            named_ = [client.states.get(i) for i in record.inputs if i != anchor.name]
            others = [i for i in named_ if i is not None]
            if len(others) < len(named_) or any(
                self.me not in i.in_sync or i.primary == self.me for i in others
            ):
                continue
            free = [i for i in others if i.standby is None]
            for state_ in free:
                await self._volunteer(state_)
            if free or any(i.standby != self.me for i in others):
                continue
            states = [anchor, *others]
            wanted.add(name)
            epochs = tuple(i.epoch for i in states)
            running = self.running.get(name)
            if running is not None and running.epochs != epochs:
                log.info("standby of %s restarts: its inputs are in epochs %s", name, epochs)
                await self.stop(name)
                running = None
            if running is None:
                await self._start(name, stream, record, anchor, epochs)
        for name, reason in list(self.site.query_errors.items()):
            standby = self.running.get(name)
            if standby is not None and standby.promoted is None:
                log.error("standby of %s failed (%s); starting it again", name, reason)
                self.site.query_errors.pop(name, None)
                await self.stop(name)
        for name in [n for n in self.running if n not in wanted]:
            standby = self.running[name]
            if standby.promoted is None:
                await self.stop(name)
        for standby in list(self.running.values()):
            if standby.promoted is None:
                await self._trim(standby)

    async def _volunteer(self, anchor: StreamState) -> None:
        with contextlib.suppress(FedstreamError):
            await self.plane.client.submit(SetStandby(anchor.name, anchor.epoch, self.me))
            log.info("this peer volunteers as the standby of %s's fragments", anchor.name)

    def _newest(self, stream: str) -> FragmentRecord | None:
        spool = self.site.spools.get(stream) if stream in self.site.spools else None
        if spool is None or spool.log_end < 0:
            return None
        try:
            return FragmentRecord.from_table(read_file(offset_path(spool.directory, spool.log_end)))
        except (OSError, ValueError):
            return None

    async def _start(
        self,
        name: str,
        stream: str,
        record: FragmentRecord,
        anchor: StreamState,
        epochs: tuple[int, ...],
    ) -> None:
        engine = self.site.engine
        assert engine is not None
        end = self.site.spools.get(stream).log_end
        refused = self._refused.get(name)
        if refused is not None and refused[0] == end:
            return
        rule: IdentityRule | Unnamed | None = None
        try:
            query = parse_query(record.definition)
            checked = self.site.checked(query)
            rule = identity_rule(checked)
            why = refusal(checked, rule)
        except (FedstreamError, ValueError) as exc:
            why = str(exc)
        if why is not None or not isinstance(rule, IdentityRule):
            self._refused[name] = (end, why or "")
            log.warning("fragment %s runs without a standby: %s", name, why)
            return
        boxes = {
            b.box.name: b.spec.order_type
            for b in checked.boxes
            if isinstance(b.spec, AggregateSpec)
        }
        incarnation = f"{INCARNATION_PREFIX}{uuid.uuid4().hex[:12]}"
        directory = engine.checkpoint_dir(name, incarnation)
        began = self.clock()
        try:
            if record.checkpoint:
                await asyncio.to_thread(unbundle, record.checkpoint, directory)
            else:
                await asyncio.to_thread(shutil.rmtree, directory, True)
        except (ValueError, OSError) as exc:
            self._refused[name] = (end, str(exc))
            log.error("standby of %s not started: its checkpoint record: %s", name, exc)
            return
        standby = StandbyRun(name, anchor.name, epochs, incarnation, checked, rule, boxes)
        self.running[name] = standby
        self._by_origin[standby.origin] = standby
        try:
            await engine.run_query(checked, incarnation, standby=True)
        except FedstreamError as exc:
            self._forget(standby)
            self._refused[name] = (end, str(exc))
            log.error("standby of %s not started: %s", name, exc)
            return
        log.warning(
            "standby of %s started here from batch %d in %.2f s",
            name,
            record.batch,
            self.clock() - began,
        )

    def _forget(self, standby: StandbyRun) -> None:
        self.running.pop(standby.name, None)
        self._by_origin.pop(standby.origin, None)

    async def stop(self, name: str) -> None:
        """Stop the standby of ``name`` here and drop what it held."""
        standby = self.running.get(name)
        if standby is None:
            return
        self._forget(standby)
        engine = self.site.engine
        if engine is not None:
            await engine.drop_query(name, standby.incarnation)
        log.info("standby of %s stopped", name)

    # ----------------------------------------------------------------------- trimming
    async def _trim(self, standby: StandbyRun) -> None:
        try:
            published = await asyncio.to_thread(self.published, standby)
        except (OSError, ValueError, IdentityError) as exc:
            log.warning("standby of %s: what its results hold is unreadable: %s", standby.name, exc)
            return
        async with standby.lock:
            standby.trim(published)

    def published(self, standby: StandbyRun, *, strict: bool = False) -> Published:
        """What the fragment's result streams hold here, as frontiers (on a thread).
        ``strict``: ValueError if a stream's newest results are the fragment's but no record
        says what they cover (else that stream has no frontier: nothing held is dropped)."""
        frontiers: dict[str, Frontier] = {}
        for stream in standby.checked.outputs:
            spool = self.site.spools.get(stream) if stream in self.site.spools else None
            if spool is None or spool.log_end < 0:
                continue
            end = spool.log_end
            known = standby.known_frontier(stream, end)
            if known is not None:
                frontiers[stream] = known
                continue
            tag = file_info(file_metadata(offset_path(spool.directory, end))).tag
            if tag is None:
                continue
            origin, seq = tag
            prefix = f"query:{standby.name}:"
            if not origin.startswith(prefix):
                continue
            marks = self._marks(standby, origin[len(prefix) :], seq)
            if marks is None:
                missing = (
                    f"no checkpoint record holds batch {seq} of {origin}, behind the newest "
                    f"results in {stream}"
                )
                if strict:
                    raise ValueError(missing)
                log.info("standby of %s: %s (yet)", standby.name, missing)
                continue
            mark = marks.watermark_ms
            windows = {box: window_mark(mark, kind) for box, kind in standby.boxes.items()}
            inputs = standby.checked.inputs
            ends = marks.input_ends(inputs)
            lacking = [i for i in inputs if i not in ends]
            if lacking and strict and standby.per_tuple:
                raise ValueError(f"the offset log of batch {seq} of {origin} names no {lacking}")
            offsets = {i: end + 1 for i, end in ends.items() if i in inputs}
            frontiers[stream] = Frontier.of(offsets, windows)
            standby.remember(stream, end, frontiers[stream])
        return Published.of(frontiers)

    def _marks(self, standby: StandbyRun, incarnation: str, batch: int) -> BatchMarks | None:
        """Spark's offset log entry of ``batch`` of the run ``incarnation``, from the newest
        checkpoint record of that run holding it (the record taken before the batch, or any
        later one: Spark keeps the entries of its last batches; a promoted standby's first
        record follows the held batches it published)."""
        stream = checkpoint_stream(standby.name)
        spool = self.site.spools.get(stream)
        for offset in range(spool.log_end, max(-1, spool.log_end - RECORD_SCAN), -1):
            try:
                record = FragmentRecord.from_table(read_file(offset_path(spool.directory, offset)))
            except FileNotFoundError:
                break  # trimmed
            if record.incarnation != incarnation or not record.checkpoint:
                continue
            marks = batch_marks(record.checkpoint, batch)
            if marks is not None:
                return marks
            if record.batch != -1 and record.batch < batch:
                break  # older records hold older batches only
        return None

    # ----------------------------------------------------------------------- promotion
    def incarnation_of(self, name: str) -> str | None:
        """The incarnation of the standby of ``name`` here, if one runs, not yet promoted."""
        standby = self.running.get(name)
        return None if standby is None or standby.promoted is not None else standby.incarnation

    def can_promote(self, name: str) -> bool:
        standby = self.running.get(name)
        return standby is not None and standby.promoted is None

    async def promote(self, name: str, publish: Publish) -> Promoted | None:
        """This peer leads the fragment's streams now: publish the held results the result
        streams lack and let the standby's later batches through (filtered). None if there is
        no standby here to promote (the caller takes the fragment over from its record)."""
        standby = self.running.get(name)
        if standby is None or standby.promoted is not None:
            return None
        began = self.clock()
        try:
            published = await asyncio.to_thread(self.published, standby, strict=True)
        except (OSError, ValueError, IdentityError) as exc:
            log.error("standby of %s not promoted (taken over from a record): %s", name, exc)
            await self.stop(name)
            return None
        count = 0
        async with standby.lock:  # (its batches wait: they pass the filter once it is set)
            for part in standby.promote(published):
                await publish(part.stream, part.table, standby.origin, part.seq)
                count += part.table.num_rows
        self.promotions += 1
        took = self.clock() - began
        log.warning(
            "standby of %s promoted here: %d held results published in %.2f s", name, count, took
        )
        return Promoted(standby.incarnation, count, took)

    def released(self, name: str) -> None:
        """The fragment a standby here was promoted to run stopped running here (released,
        deleted): forget it (the caller stopped its query)."""
        standby = self.running.get(name)
        if standby is not None and standby.promoted is not None:
            self._forget(standby)

    # ----------------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        """Each standby here: its anchor, epoch, batches, held results, lag; and promotions."""
        now = self.clock()
        out: dict[str, Any] = {}
        engine = self.site.engine
        for name, standby in sorted(self.running.items()):
            spool = (
                self.site.spools.get(standby.anchor) if standby.anchor in self.site.spools else None
            )
            behind = None
            query = None if engine is None else engine.running.get(name)
            if spool is not None and query is not None:
                taken = [r for s, r in query.readers if s == standby.anchor]
                with contextlib.suppress(KeyError, ValueError, OSError):
                    behind = max(0, spool.log_end - max(spool.committed(r) for r in taken))
            out[name] = {
                "anchor": standby.anchor,
                "epochs": list(standby.epochs),
                "batches": standby.batches,
                "held": standby.held_rows,
                "since_batch_s": None if standby.last_batch is None else now - standby.last_batch,
                "behind_batches": behind,
                "promoted": standby.promoted is not None,
            }
        return {"standbys": out, "promotions": self.promotions}
