"""Query fragments that fail over: run on the primary of their input, checkpoint to replicas.

Theory of operation
-------------------
With a control plane, a fragment whose inputs are replicated streams led by its site (the
coordinator places a fragment on the primary of its first input) is *replicated*:

* Its result streams and a checkpoint stream ``~ckpt.<fragment>`` are replicated streams with
  the replicas of its input stream A, *anchored* to A: the control plane moves their primary
  wherever A's goes (:func:`peer.replication.control.failover_decisions`), so the fragment, what it
  reads and what it writes fail over together.
* Before each micro-batch runs (Spark's ``foreachBatch`` callback, before the batch's plan
  executes) the fragment's whole checkpoint directory, as it stands then (the batch's planned
  offsets, the state it starts from), goes into the checkpoint stream as one record together
  with the fragment's definition, incarnation and status; only once that record is
  acknowledged does the batch's output go to its result streams, tagged (``query:<fragment>:
  <incarnation>``, batch id) as always. So every batch whose results were acknowledged has its
  planned offsets on every in-sync replica.
* When this peer becomes primary of all of a fragment's streams it unpacks the newest record's
  checkpoint and starts the fragment from it. Spark re-runs the batch the record was taken
  before with the same offsets, from the same state: its output is the same and the result
  streams drop it as a replay of (origin, batch id); later batches are new. A peer that stops
  leading any of them stops the fragment and forgets it (its streams stay, as replicas).
* A status change (STOPPED, RUNNING) writes a record too, so a replica takes the fragment over
  in the status it had; DELETED drops the streams from the control plane and from every
  replica.
* A fragment with a warm standby here (:mod:`peer.replication.standby`) is not started from
  its record: the standby is promoted, and its results go through it (held, then filtered).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import pyarrow as pa

from peer.engine.seams import EngineSeams
from peer.errors import FedstreamError, InvalidInput, Unavailable
from peer.model.plan import CheckedQuery
from peer.model.query import parse_query, query_to_dict
from peer.protocol.link import FragmentStatus, HostStream
from peer.replication.appenders import Appenders
from peer.replication.checkpoint_record import CKPT_SCHEMA, FragmentRecord
from peer.replication.control import DropStream, StreamState, can_fail_over
from peer.replication.names import CKPT_PREFIX, checkpoint_stream
from peer.replication.plane import ControlPlane
from peer.replication.ports import Links, Records
from peer.replication.standby import Standbys
from peer.site import LocalSite
from peer.storage.bundle import bundle, listing, unbundle
from peer.storage.spool_format import offset_path, read_file
from peer.timing import MONOTONIC, Clock, every

if TYPE_CHECKING:
    from peer.replication.driver import StreamReplica

__all__ = [
    "CKPT_PREFIX",
    "FragmentHandOver",
    "FragmentRecord",
    "ReplicatedFragments",
    "checkpoint_stream",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

EMIT_PATIENCE_S = 120.0  # how long a result append retries a retriable refusal while primary
EMIT_RETRY_S = 0.1
RESTART_AFTER_S = 5.0  # a failed fragment is restarted at most this often
RECONCILE_S = 1.0  # fragments are reconciled this often, and at once on a change of role


class FragmentHandOver(TypedDict):
    """What :meth:`ReplicatedFragments.hand_over` did: the fragment, the peer it went to,
    and the epoch in which that peer leads each of its inputs."""

    fragment: str
    to: str
    epochs: dict[str, int]


@dataclass
class _Standing:
    """A replicated fragment running (or set up) on this peer. ``checkpoint`` is that of
    the newest record written: a record never carries an older checkpoint than the one
    before it (records are written under ``lock``)."""

    definition: dict[str, Any]
    incarnation: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    checkpoint: bytes = b""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def record(self, name: str, status: str, batch: int) -> FragmentRecord:
        return FragmentRecord(
            name, self.definition, self.incarnation, status, batch, self.checkpoint,
            self.inputs, self.outputs,
        )  # fmt: skip


class ReplicatedFragments:
    """The replicated fragments of this peer: placed, checkpointed, taken over, released
    (implements peer.engine.seams.ResultSink: the engine's results go through it)."""

    def __init__(
        self,
        site: LocalSite,
        plane: ControlPlane,
        records: Records,
        router: Links,
        *,
        min_insync: int,
        logs: Appenders,
        standbys: Standbys,
        seams: EngineSeams | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        """``logs``: the replicated streams' appenders; ``standbys``: the warm standbys this
        peer runs; ``seams``: the engine's (None: this peer has no engine), whose results
        this takes from now on; ``clock``: for retry deadlines, restart spacing and take-over
        times."""
        self.site = site
        self.clock = clock
        self.logs = logs
        self.standbys = standbys
        self.plane = plane
        self.records = records
        self.router = router
        self.min_insync = min_insync
        self.me = router.node_id.hex()
        self.standing: dict[str, _Standing] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._restarted: dict[str, float] = {}  # fragment -> when it was last restarted
        self._refused: dict[str, int] = {}  # checkpoint stream -> offset of a refused record
        if seams is not None:
            seams.send_results_to(self)

    # ----------------------------------------------------------------------- placing
    async def anchor_of(self, checked: CheckedQuery) -> StreamState | None:
        """The state of the stream a fragment's streams anchor to, if the fragment can be
        replicated here: a control plane runs, this peer has an engine, every input is a
        replicated stream this peer leads, and the anchor has a replica besides this peer.
        None otherwise (it runs unreplicated, and may share the engine's lane)."""
        client = self.plane.client
        if not client.active or self.site.engine is None or not checked.inputs:
            return None
        states = [await client.state_of(s, fresh=True) for s in checked.inputs]
        if any(s is None or s.primary != self.me for s in states):
            return None
        first = states[0]
        assert first is not None
        root = first.anchor or first.name
        anchor = first if root == first.name else await client.state_of(root, fresh=True)
        if anchor is None or not can_fail_over(anchor):
            return None  # nowhere to fail over to (a lone peer): it runs as before
        return anchor

    async def install(self, checked: CheckedQuery) -> dict[str, Any] | None:
        """Install a fragment as replicated (its streams anchored to its input), or return
        None if it cannot be (then it is installed as before)."""
        anchor = await self.anchor_of(checked)
        if anchor is None or anchor.primary != self.me:
            return None
        name = checked.query.name
        nodes = [self.me, *(n for n in anchor.replicas if n != self.me)]
        made = [(s, checked.stream_schemas[s], name) for s in checked.outputs]
        made.append((checkpoint_stream(name), CKPT_SCHEMA, name))
        for stream, schema, derived in made:
            await self.records.publish_stream(stream, schema, derived)
            await self.plane.replicas.create(
                stream, [bytes.fromhex(n) for n in nodes], len(nodes), self.min_insync,
                anchor=anchor.name,
            )  # fmt: skip
            await asyncio.gather(
                *(self.router.ask(bytes.fromhex(n), HostStream(stream, schema)) for n in nodes)
            )
        reply = await self.site.add_query(checked)
        entry = self.site.catalog.query(name)
        await asyncio.to_thread(self.site.catalog.set_placement, name, "own")
        standing = _Standing(
            query_to_dict(checked.query), entry.incarnation, checked.inputs, checked.outputs
        )
        self.standing[name] = standing
        await self._write(name, standing, "SETUP", -1)
        log.info("fragment %s is replicated with %s (anchored to %s)", name, nodes, anchor.name)
        return {**reply, "replicated": True, "replicas": nodes}

    # ----------------------------------------------------------------------- moves
    def runs(self, name: str) -> bool:
        """A replicated fragment ``name`` runs (or is set up) on this peer."""
        return name in self.standing

    def handover_candidates(self) -> list[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        """(fragment, its box types, the peers it may be handed to) for each replicated
        fragment running in the engine here: the in-sync replicas of all its inputs but this
        peer; a fragment with an anchored input (it moves with its anchor) has none. Reads
        only memory (the brain asks every round, on the event loop)."""
        engine = self.site.engine
        out = []
        for name, standing in sorted(self.standing.items()):
            states = [self.plane.client.states.get(s) for s in standing.inputs]
            if engine is None or name not in engine.running or not states:
                continue
            if any(s is None or s.anchor is not None or s.primary != self.me for s in states):
                continue
            common = set.intersection(*(set(s.in_sync) for s in states if s is not None))
            targets = frozenset(bytes.fromhex(n) for n in common - {self.me})
            if targets:
                types = tuple(sorted({str(b["type"]) for b in standing.definition["boxes"]}))
                out.append((name, types, targets))
        return out

    async def hand_over(self, name: str, target: str) -> FragmentHandOver:
        """Move replicated fragment ``name``, running here, to ``target`` (node hex): hand the
        primary role of each of its inputs, the anchor first, to ``target``, an in-sync
        replica of each (peer.replication.streams.ReplicatedStreams.hand_over). Its result and
        checkpoint streams follow the anchor, this peer then releases the fragment and
        ``target`` promotes its standby there or takes it over from the newest record, as in
        a failover, but with nothing lost to a dead peer. InvalidInput if the fragment is not
        a replicated one running here or ``target`` is not in every input's ISR (nothing is
        handed over then); Unavailable as ReplicatedStreams.hand_over says."""
        standing = self.standing.get(name)
        if standing is None:
            raise InvalidInput(f"no replicated fragment {name} runs on this peer")
        states = [self.plane.client.states.get(s) for s in standing.inputs]
        for stream, state in zip(standing.inputs, states, strict=True):
            if state is None or target not in state.in_sync or target == self.me:
                members = (
                    "" if state is None else ", ".join(n for n in state.in_sync if n != self.me)
                )
                raise InvalidInput(
                    f"fragment {name} can move only to an in-sync replica of its input "
                    f"{stream} ({members or 'none'}), not {target}"
                )
            if state.anchor is not None:
                raise InvalidInput(
                    f"fragment {name}: its input {stream} follows {state.anchor}'s primary "
                    f"and moves with it"
                )
        epochs: dict[str, int] = {}
        for stream in standing.inputs:  # the first is the anchor of its result streams
            state = await self.plane.replicas.hand_over(stream, target)
            epochs[stream] = state.epoch
        log.info("fragment %s: its inputs handed over to %s: %s", name, target[:12], epochs)
        self._wake.set()
        return {"fragment": name, "to": target, "epochs": epochs}

    # ----------------------------------------------------------------------- status
    async def after_status(self, name: str, status: str) -> None:
        """A status change of a fragment here: record it, or (DELETED) drop its streams."""
        standing = self.standing.get(name)
        if standing is None:
            if status == "DELETED":
                await self.forget(name)
            return
        if status == "DELETED":
            del self.standing[name]
            self.standbys.released(name)
            await self.drop(name, standing)
            return
        engine = self.site.engine
        assert engine is not None
        directory = engine.checkpoint_dir(name, standing.incarnation)
        # Stopped, its checkpoint is final and at least as new as the last record's; running
        # (or set up), the batches write their own, so the last one is repeated.
        taken = await asyncio.to_thread(bundle, directory) if status == "STOPPED" else None
        await self._write(name, standing, status, -1, taken)

    async def drop(self, name: str, standing: _Standing) -> None:
        """Drop a deleted fragment's streams from the control plane, here and on its replicas."""
        streams = [*standing.outputs, checkpoint_stream(name)]
        holders: set[str] = set()
        for stream in streams:
            state = self.plane.client.states.get(stream)
            if state is not None:
                holders.update(state.replicas)
            with contextlib.suppress(FedstreamError):
                await self.plane.client.submit(DropStream(stream))
        with contextlib.suppress(FedstreamError):  # (the outputs' go with the query's)
            await self.records.publish(f"stream:{checkpoint_stream(name)}", {"deleted": True})
        await self._drop_here(streams)
        for node in sorted(holders - {self.me}):
            try:
                await self.router.ask(bytes.fromhex(node), FragmentStatus(name, "DELETED"))
            except FedstreamError as exc:
                log.warning("replica %s did not drop fragment %s: %s", node[:12], name, exc)

    async def forget(self, name: str) -> None:
        """A deleted fragment's replicated streams held here as a replica: dropped (and its
        standby here stopped)."""
        await self.standbys.stop(name)
        stream = checkpoint_stream(name)
        if stream not in self.site.spools:
            return
        record = await asyncio.to_thread(self._newest, stream)
        outputs = list(record.outputs) if record is not None else []
        await self._drop_here([*outputs, stream])

    async def _drop_here(self, streams: list[str]) -> None:
        for stream in streams:
            await self.plane.replicas.forget(stream)
        await self.site.drop_streams([s for s in streams if s in self.site.spools])

    # ----------------------------------------------------------------------- Spark's thread
    def on_batch(self, name: str, batch_id: int, checkpoint: Path) -> Callable[[int], None] | None:
        """Before a micro-batch of ``name`` runs: its checkpoint as it stands (the batch's
        planned offsets, the state it starts from), sent to the replicas before the batch's
        results, if it has any. A batch without results needs no record: the newest record
        is at or after every batch whose results were acknowledged, which is what keeps a
        re-run from re-planning one of them differently."""
        standing = self.standing.get(name)
        if standing is None:
            return None
        # Spark writes each checkpoint file once (new offsets, new state versions), so the
        # files there now, read later, are the checkpoint as the batch starts: only a batch
        # with results pays for packing them.
        files = listing(checkpoint)

        def before_emit(rows: int) -> None:
            if rows:
                taken = bundle(checkpoint, files)
                self._wait(self._write(name, standing, "RUNNING", batch_id, taken))

        return before_emit

    def emit(self, stream: str, table: pa.Table, origin: str, seq: int) -> None:
        """A result part: to the stream's replicas if it is replicated, else the spool; a
        standby's, through the standby (held, or filtered once promoted)."""
        if table.num_rows == 0:
            return
        if self.standbys.holds(origin):
            passed = self._wait(self.standbys.accept(stream, table, origin, seq))
            if passed is None or passed.num_rows == 0:
                return
            table = passed
        if stream not in self.logs:
            self.site.spools.get(stream).append(table, origin=origin, seq=seq)
            return
        body = self.site.spools.get(stream).encode(table, origin=origin, seq=seq)
        self._wait(self._append(stream, body, table.num_rows, origin, seq))

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the peer's loop from Spark's thread, and wait for it."""
        loop = self._loop
        if loop is None:
            work.close()
            raise Unavailable("replicated fragments are not running")
        return asyncio.run_coroutine_threadsafe(work, loop).result(EMIT_PATIENCE_S + 30)

    async def _write(
        self, name: str, standing: _Standing, status: str, batch: int, taken: bytes | None = None
    ) -> None:
        """Append a record to the fragment's checkpoint stream (``taken``: a new checkpoint)."""
        stream = checkpoint_stream(name)
        spool = self.site.spools.get(stream)
        async with standing.lock:
            if taken is not None:
                standing.checkpoint = taken
            table = standing.record(name, status, batch).to_table()
            body = await asyncio.to_thread(spool.encode, table)
            await self._append(stream, body, 1, None, None)

    async def _append(
        self, stream: str, body: bytes, rows: int, origin: str | None, seq: int | None
    ) -> None:
        """Append through the stream's replica, retrying retriable refusals while this peer
        leads it (a follower catching up, an ISR change under way)."""
        deadline = self.clock() + EMIT_PATIENCE_S
        while True:
            appender = self.logs.appender(stream)
            if appender is None:
                raise Unavailable(f"stream {stream} is not replicated here", stream=stream)
            try:
                await appender(body, rows, origin, seq)
                return
            except FedstreamError as exc:
                if not (exc.retriable and self._leads(stream)) or self.clock() > deadline:
                    raise
            await self.clock.sleep(EMIT_RETRY_S)

    # ----------------------------------------------------------------------- taking over
    def _replica(self, stream: str) -> StreamReplica | None:
        return self.plane.replicas.streams.get(stream)

    def _leads(self, stream: str) -> bool:
        replica = self._replica(stream)
        return replica is not None and replica.primary is not None

    def _led_elsewhere(self, stream: str) -> bool:
        state = self.plane.client.states.get(stream)
        return state is not None and state.primary != self.me

    def _newest(self, stream: str) -> FragmentRecord | None:
        spool = self.site.spools.get(stream)
        end = spool.log_end
        if end < 0:
            return None
        try:
            return FragmentRecord.from_table(read_file(offset_path(spool.directory, end)))
        except (OSError, ValueError) as exc:
            log.error("checkpoint stream %s: newest record unreadable: %s", stream, exc)
            return None

    def on_role(self, _stream: str, _primary: bool) -> None:
        self._wake.set()

    async def start(self) -> None:
        """Take back, before the peer says it is ready, the fragments whose streams this peer
        leads again after a restart (as the site resumes its unreplicated queries)."""
        self._loop = asyncio.get_running_loop()
        await self.reconcile()

    async def run(self) -> None:
        """Take over or release fragments whenever this peer's roles change."""
        self._loop = asyncio.get_running_loop()
        await every(
            RECONCILE_S,
            self.reconcile,
            clock=self.clock,
            wake=self._wake,
            what="replicated fragments",
        )

    async def reconcile(self) -> None:
        await self._restart_failed()
        for stream in list(self.site.spools.streams()):
            if not stream.startswith(CKPT_PREFIX) or self._replica(stream) is None:
                continue
            name = stream[len(CKPT_PREFIX) :]
            standing = self.standing.get(name)
            if standing is not None:
                streams = (*standing.inputs, *standing.outputs, stream)
                if any(self._led_elsewhere(s) for s in streams):
                    await self.release(name)
                continue
            end = self.site.spools.get(stream).log_end
            if not self._leads(stream) or self._refused.get(stream) == end:
                continue  # (a record refused once is not tried again until a newer one)
            record = await asyncio.to_thread(self._newest, stream)
            if record is None or record.fragment != name:
                self._refused[stream] = end
                continue
            leads_all = all(self._leads(s) for s in (*record.inputs, *record.outputs))
            if not leads_all:
                continue
            if self.standbys.can_promote(name) and await self.promote(record):
                continue
            if not await self.take_over(record):
                self._refused[stream] = end
        await self.standbys.reconcile()

    async def _restart_failed(self) -> None:
        """A replicated fragment whose streaming query died here (a refused append, a disk
        fault: the site's maintenance notes it) is released; the next round takes it over
        again from its newest record if this peer still leads its streams (at most every
        RESTART_AFTER_S)."""
        now = self.clock()
        for name, reason in list(self.site.query_errors.items()):
            if name in self.standing and now - self._restarted.get(name, 0.0) > RESTART_AFTER_S:
                self._restarted[name] = now
                log.error(
                    "fragment %s failed (%s); restarting it from its checkpoint", name, reason
                )
                await self.release(name)

    async def take_over(self, record: FragmentRecord) -> bool:
        """Run a fragment here from the newest record of its checkpoint stream; False if
        the record cannot be run (said in the log)."""
        engine = self.site.engine
        if engine is None:
            log.error("fragment %s cannot run here: this peer has no engine", record.fragment)
            return False
        name = record.fragment
        began = self.clock()
        try:
            query = parse_query(record.definition)
            if query.name != name:
                raise ValueError(f"it holds query {query.name}")
            await self.site.release_query(name)  # what ran here before (a restart) is stale
            directory = engine.checkpoint_dir(name, record.incarnation)
            if record.checkpoint:
                await asyncio.to_thread(unbundle, record.checkpoint, directory)
            else:  # it never ran
                await asyncio.to_thread(shutil.rmtree, directory, True)
        except (FedstreamError, ValueError, OSError) as exc:
            log.error("fragment %s not taken over: its checkpoint record: %s", name, exc)
            return False
        self.standing[name] = _Standing(
            record.definition, record.incarnation, record.inputs, record.outputs,
            record.checkpoint,
        )  # fmt: skip
        try:
            await self.site.restore_query(query, record.incarnation, record.status)
        except FedstreamError as exc:
            log.error("fragment %s not taken over: %s", name, exc)
            self.standing.pop(name, None)
            return False
        log.warning(
            "fragment %s taken over here at batch %d (%s) in %.2f s",
            name,
            record.batch,
            record.status,
            self.clock() - began,
        )
        return True

    async def promote(self, record: FragmentRecord) -> bool:
        """Run a fragment here by promoting its warm standby: entered in the catalog as its
        run, its held results published, its checkpoint the fragment's from now on. False if
        it was not promoted (the caller takes the fragment over from its record)."""
        name = record.fragment
        incarnation = self.standbys.incarnation_of(name)
        engine = self.site.engine
        if incarnation is None or engine is None:
            return False
        try:  # first what can fail here alone: nothing is published yet
            await self.site.adopt_query(parse_query(record.definition), incarnation)
        except (FedstreamError, ValueError, OSError) as exc:
            log.error("fragment %s: its standby cannot take it over here: %s", name, exc)
            await self.standbys.stop(name)
            return False
        try:
            promoted = await self.standbys.promote(name, self._publish)
        except FedstreamError as exc:  # an append refused: this peer no longer leads
            log.error("fragment %s: its promoted standby's results were refused: %s", name, exc)
            await self.release(name)
            return True  # (the next round takes it over if this peer still leads)
        if promoted is None:
            return False
        standing = _Standing(record.definition, incarnation, record.inputs, record.outputs)
        self.standing[name] = standing
        directory = engine.checkpoint_dir(name, incarnation)
        try:
            taken = await asyncio.to_thread(bundle, directory)
            await self._write(name, standing, "RUNNING", -1, taken)
        except (FedstreamError, OSError) as exc:
            log.error("fragment %s: no checkpoint record after its promotion: %s", name, exc)
        return True

    async def _publish(self, stream: str, table: pa.Table, origin: str, seq: int) -> None:
        body = await asyncio.to_thread(
            self.site.spools.get(stream).encode, table, origin=origin, seq=seq
        )
        await self._append(stream, body, table.num_rows, origin, seq)

    async def release(self, name: str) -> None:
        """Another peer leads this fragment's streams now: stop it here and forget it."""
        self.standing.pop(name, None)
        self.standbys.released(name)
        await self.site.release_query(name)
        log.warning("fragment %s released: it runs on its streams' new primary", name)
