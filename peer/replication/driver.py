"""The replica driver: replicated streams on this peer, as the control plane names them.

Theory of operation
-------------------
For each stream this peer replicates, a :class:`StreamReplica` holds the sans-IO core of its
role (:class:`peer.replication.Primary` while the control plane names this peer primary, else
a :class:`peer.replication.Follower`) and performs its effects on the stream's spool and its
durable fence and epoch history (:class:`peer.replication.fence.ReplicaState`), each
fsynced before the message that came with it is sent (docs/replication.md).

* Pushes (the site hands a replicated stream's batches here): the primary encodes the batch as
  its spool file, its core places it at the next offset; a writer task writes queued entries in
  offset order and then sends their appends; the push is answered once the core says the
  offset is acknowledged *and* it is on this disk. Readers of the spool (Spark, subscribers,
  mirrors) see nothing above that point (``Spool.hold``), so an unacknowledged tail that a
  failover cuts was never read.
* Followers are fed by one outbox per follower: up to two :class:`ReplicaExchange` in
  flight, each carrying everything queued meanwhile, in order; the follower's answers go back
  to the core (which takes them in any order).
  A tick resends what a follower lacks and proposes ISR changes to the control plane.
* A follower's exchanges are served under the stream's lock, effects performed in order.
* A planned hand-over (:meth:`StreamReplica.hand_over`, Stormy's master hand-over): the core
  stops taking pushes (refused retriably), replicates until the target holds the whole log, and
  then names it; the replica proposes ``Elect(stream, epoch, target)`` to the control plane
  (again every ``PROPOSE_RETRY_S`` until an epoch deposes it), and steps down as in a failover.
* The control plane's states arrive through
  :meth:`~peer.replication.streams.ReplicatedStreams.on_state` (a heartbeat answer): a new epoch
  makes this peer take office, step down, or fence older primaries.

Refusals are retriable (:class:`~peer.errors.Unavailable`, with ``primary`` when known), so a
client or forwarding peer retries with the same (producer, seq) and the batch is kept once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from peer.errors import FedstreamError, Unavailable
from peer.protocol.link import Frame
from peer.replication.control import Elect, ExpandIsr, ShrinkIsr, StreamState
from peer.replication.core import (
    Appended,
    AppendReply,
    Duplicate,
    Effect,
    EpochEnd,
    EpochEndReply,
    Follower,
    Primary,
    Probe,
    Progress,
    PushRefusal,
    ReplicaAppend,
    Seed,
    Ship,
    begin_epoch,
)
from peer.replication.link_messages import (
    ReplicaExchange,
    ReplicationMessage,
    messages_from_wire,
    messages_to_wire,
)
from peer.replication.log import ReplicatedLog
from peer.replication.ports import Links
from peer.timing import MONOTONIC, Clock, OwnedTasks

log = logging.getLogger(__name__)

TICK_S = 0.05
SEED = -1  # in an outbox: the seed of a follower lacking entries trimmed here (see _ship)
ACK_TIMEOUT_S = 10.0
EXCHANGE_TIMEOUT_S = 5.0
MAX_EXCHANGE = 256
IN_FLIGHT = 2  # exchanges in flight per follower
REPLICA_LAG_S = 1.0
RESEND_S = 0.2
PROPOSE_RETRY_S = 0.5


class ReplicaOwner(Protocol):
    """What a stream's replica needs of the peer's replica driver."""

    me: str
    router: Links

    def on_role(self, stream: str, primary: bool) -> None: ...

    def propose(self, command: ShrinkIsr | ExpandIsr | Elect) -> None: ...

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class _Outbox:
    """The messages for one follower of one stream, up to ``IN_FLIGHT`` exchanges at a time
    (each carries everything queued meanwhile, in order; the follower serves them in arrival
    order under the stream's lock). Entries to catch up on are queued by offset and read from
    the spool (off the event loop) when they are sent.

    Its pump and its exchanges are tasks of the replica's :class:`OwnedTasks` (``owner``),
    which awaits them when the replica closes; :meth:`close` cancels just this outbox's."""

    def __init__(
        self, replica: StreamReplica, node: str, owner: OwnedTasks, *, clock: Clock = MONOTONIC
    ) -> None:
        self.replica = replica
        self.node = node
        self.clock = clock
        self.queue: list[ReplicationMessage | int] = []  # int: the log's entry at that offset
        self.queued: set[int] = set()  # offsets of the entries in the queue
        self.ready = asyncio.Event()
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.owner = owner
        self.tasks: list[asyncio.Task[None]] = []
        self._spawn(self.run())

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.owner.spawn(coroutine, name=f"outbox {self.replica.name}->{self.node[:12]}")
        if task is not None:
            self.tasks = [t for t in self.tasks if not t.done()]
            self.tasks.append(task)

    def put(self, item: ReplicationMessage | int) -> None:
        offset = item.offset if isinstance(item, ReplicaAppend) else item
        if isinstance(offset, int):
            if offset in self.queued:
                return
            self.queued.add(offset)
        self.queue.append(item)
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queue:
                await self.slots.acquire()
                if not self.queue:  # a failed exchange cleared it meanwhile
                    self.slots.release()
                    break
                batch, self.queue = self.queue[:MAX_EXCHANGE], self.queue[MAX_EXCHANGE:]
                self.queued.difference_update(
                    m.offset if isinstance(m, ReplicaAppend) else m
                    for m in batch
                    if isinstance(m, ReplicaAppend | int)
                )
                try:
                    messages = await self.replica.materialize(batch)
                except Exception as exc:  # e.g. an entry trimmed meanwhile: seeded next
                    await self._failed(exc)
                    break
                self._spawn(self._send(messages))

    async def _send(self, messages: tuple[ReplicationMessage, ...]) -> None:
        replica = self.replica
        try:
            exchange = ReplicaExchange(replica.name, replica.me, messages)
            reply = await asyncio.wait_for(
                replica.router.call(bytes.fromhex(self.node), exchange), EXCHANGE_TIMEOUT_S
            )
            answers = messages_from_wire(replica.name, reply.get("messages"))
        except Exception as exc:  # this follower's pump must outlive any one batch
            await self._failed(exc)
            return
        self.slots.release()
        replica.on_answers(self.node, answers)

    async def _failed(self, exc: Exception) -> None:
        """An exchange failed: drop the queue (the tick resends what the follower still
        lacks) and hold this slot a moment before the next one."""
        level = (
            logging.DEBUG
            if isinstance(exc, FedstreamError | TimeoutError | OSError)
            else logging.WARNING
        )
        log.log(level, "replica exchange %s -> %s: %r", self.replica.name, self.node[:12], exc)
        self.queue.clear()
        self.queued.clear()
        try:
            await self.clock.sleep(RESEND_S)
        finally:
            self.slots.release()

    def close(self) -> None:
        """Cancel the pump and the exchanges in flight (the replica awaits them)."""
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()


class StreamReplica:
    """One replicated stream on this peer."""

    def __init__(
        self, owner: ReplicaOwner, name: str, log: ReplicatedLog, *, clock: Clock = MONOTONIC
    ) -> None:
        self.owner = owner
        self.clock = clock
        self.tasks = OwnedTasks(f"replica of {name}")  # the writer, the outboxes' pumps
        self.name = name
        self.log = log
        self.spool = log.spool
        self.disk = log.fence
        self.me = owner.me
        self.router = owner.router
        self.lock = asyncio.Lock()
        self.primary: Primary | None = None
        self.follower: Follower = self._follower()
        self.outboxes: dict[str, _Outbox] = {}
        self.written = log.log_end
        self.visible = log.spool.latest
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.writes: list[Appended] = []
        self.writing = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.tasks.spawn(self._writer(), name=f"writer {name}")
        self.known: StreamState | None = None
        self._elected: tuple[int, str, float] | None = None  # (epoch, target, proposed at)

    def _follower(self) -> Follower:
        return Follower(
            self.name,
            self.me,
            epoch=self.disk.epoch,
            log_end=self.spool.log_end,
            history=self.disk.history,
        )

    # ----------------------------------------------------------------------- effects
    async def perform(self, effects: tuple[Effect, ...]) -> None:
        if effects:
            await asyncio.to_thread(self.log.perform, effects)

    # ----------------------------------------------------------------------- roles
    async def learn(self, state: StreamState) -> None:
        """The control plane's state of this stream reached this peer."""
        async with self.lock:
            self.known = state
            primary = self.primary
            if primary is not None and state.epoch > primary.epoch:
                await self.step_down()
            if state.primary != self.me:
                await self.perform(self.follower.on_new_epoch(state.epoch))
                self._close_outboxes()
                return
            if self.primary is None:
                await self.take_office(state)
            else:
                self.after(
                    self.primary.on_isr(
                        state.epoch,
                        state.version,
                        state.in_sync,
                        replicas=state.replicas,
                        min_insync=state.required_insync,
                    )
                )

    async def take_office(self, state: StreamState) -> None:
        if state.epoch < self.disk.epoch:
            return  # a stale state: a newer epoch has been seen here
        log_end = self.spool.log_end
        history, effects = begin_epoch(self.disk.history, state.epoch, log_end)
        await self.perform(effects)
        self.primary = Primary(
            self.name,
            self.me,
            epoch=state.epoch,
            version=state.version,
            replicas=state.replicas,
            in_sync=state.in_sync,
            min_insync=state.required_insync,
            log_end=log_end,
            history=history,
            now=self.clock(),
            seqs=self.spool.seqs(),
            replica_lag_s=REPLICA_LAG_S,
            resend_s=RESEND_S,
            propose_retry_s=PROPOSE_RETRY_S,
        )
        self.written = log_end
        log.info("primary of %s in epoch %d (log end %d)", self.name, state.epoch, log_end)
        self.owner.on_role(self.name, True)
        self.after(self.primary.tick(self.clock()))

    async def step_down(self) -> None:
        """No longer primary: refuse what waits, finish the writes under way, follow."""
        if self.primary is None:
            return
        self.primary = None
        self.owner.on_role(self.name, False)
        self.writes.clear()
        await self.idle.wait()
        self._fail_waiters(self.not_primary())
        self._close_outboxes()
        self.follower = self._follower()

    def _fail_waiters(self, error: Exception) -> None:
        for _, future in self.waiters:
            if not future.done():
                future.set_exception(error)
        self.waiters.clear()

    def _close_outboxes(self) -> None:
        for outbox in self.outboxes.values():
            outbox.close()
        self.outboxes.clear()

    def not_primary(self) -> Unavailable:
        known = self.known.primary if self.known is not None else None
        details: dict[str, Any] = {"stream": self.name, "not_primary": True}
        if known is not None and known != self.me:
            details["primary"] = known
        return Unavailable(f"this peer is not the primary of stream {self.name}", **details)

    # ----------------------------------------------------------------------- pushes
    async def push(self, body: bytes, rows: int, producer: str | None, seq: int | None) -> Frame:
        """Append a batch (``body``: its spool file, ``Spool.encode``; ``rows`` in it) once
        this peer's core, as primary, places it; answer once it is acknowledged."""
        primary = self.primary
        if primary is None:
            raise self.not_primary()
        outcome = primary.append(body, origin=producer, seq=seq, now=self.clock())
        if isinstance(outcome, Appended):
            target, duplicate = outcome.offset, False
            self.writes.append(outcome)
            self.writing.set()
        elif isinstance(outcome, Duplicate):
            target, duplicate = outcome.covered_through, True
        elif outcome.reason is PushRefusal.NOT_PRIMARY:
            raise self.not_primary()
        elif outcome.reason is PushRefusal.HANDING_OVER:
            raise Unavailable(
                f"stream {self.name}: its primary is being handed over ({outcome.detail}); retry",
                stream=self.name,
                reason=outcome.reason.value,
            )
        else:
            raise Unavailable(
                f"stream {self.name}: too few in-sync replicas to acknowledge a push "
                f"({outcome.detail}); retry",
                stream=self.name,
                reason=outcome.reason.value,
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)  # a refusal after the push gave up waiting
        self.waiters.append((target, future))
        self._acknowledge()
        try:
            await asyncio.wait_for(asyncio.shield(future), ACK_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(
                f"stream {self.name}: the replicas did not acknowledge offset {target} within "
                f"{ACK_TIMEOUT_S:.0f} s; retry",
                stream=self.name,
            ) from None
        return {
            "stream": self.name,
            "count": rows,
            "offset": None if duplicate else target,
            "duplicate": duplicate,
        }

    async def _writer(self) -> None:
        while True:
            await self.writing.wait()
            self.writing.clear()
            while self.writes:
                batch, self.writes = self.writes, []
                self.idle.clear()
                # The followers get the entries while this peer writes them (an entry is
                # acknowledged only once it is on this disk too: ``written`` bounds it).
                for outcome in batch:
                    for outgoing in outcome.messages:
                        self._outbox(outgoing.to).put(outgoing.message)
                try:
                    effects = tuple(e for outcome in batch for e in outcome.effects)
                    await self.perform(effects)
                except Exception as exc:
                    log.error("stream %s: a replicated write failed: %s", self.name, exc)
                    self.idle.set()
                    self.written = self.spool.log_end
                    self._fail_waiters(exc)
                    async with self.lock:
                        await self.step_down()
                    break
                self.idle.set()
                if self.primary is None:
                    break
                self.written = max(self.written, batch[-1].offset)
                self._acknowledge()

    def _acknowledge(self) -> None:
        primary = self.primary
        if primary is None:
            return
        visible = min(primary.acknowledged, self.written)
        if visible > self.visible:
            self.visible = visible
            # never lowered: a follower's readers may have been shown more already (a local
            # fragment's mirror tells it what its old primary acknowledged; see LocalSite)
            if visible > self.spool.latest:
                self.spool.hold(visible)
        if not self.waiters:
            return
        kept = []
        for target, future in self.waiters:
            if target <= visible:
                if not future.done():
                    future.set_result(None)
            else:
                kept.append((target, future))
        self.waiters = kept

    # ----------------------------------------------------------------------- followers
    def _outbox(self, node: str) -> _Outbox:
        outbox = self.outboxes.get(node)
        if outbox is None:
            outbox = self.outboxes[node] = _Outbox(self, node, self.tasks, clock=self.clock)
        return outbox

    def on_answers(self, node: str, answers: tuple[ReplicationMessage, ...]) -> None:
        primary = self.primary
        if primary is None:
            return
        now = self.clock()
        for answer in answers:
            if isinstance(answer, AppendReply):
                self.after(primary.on_reply(answer, now))
            elif isinstance(answer, EpochEnd):
                reply = primary.on_epoch_end(answer)
                if reply is not None:
                    self._outbox(node).put(reply)
                if primary.deposed:
                    self._schedule_step_down()
            if self.primary is None:
                return

    def tick(self, now: float) -> None:
        if self.primary is not None:
            self.after(self.primary.tick(now))

    def after(self, progress: Progress) -> None:
        primary = self.primary
        if primary is None:
            return
        for ship in progress.ships:
            self._ship(ship)
        for outgoing in progress.messages:
            self._outbox(outgoing.to).put(outgoing.message)
        for proposal in progress.proposals:
            command = ShrinkIsr if proposal.action == "shrink" else ExpandIsr
            self.owner.propose(command(self.name, proposal.epoch, proposal.version, proposal.node))
        if progress.hand_to is not None:
            self._elect(primary.epoch, progress.hand_to)
        self._acknowledge()
        if progress.deposed:
            self._schedule_step_down()

    def _elect(self, epoch: int, to: str) -> None:
        """A hand-over is ready: propose electing ``to``, again after ``PROPOSE_RETRY_S``."""
        now = self.clock()
        last = self._elected
        if last is not None and last[:2] == (epoch, to) and now - last[2] < PROPOSE_RETRY_S:
            return
        self._elected = (epoch, to, now)
        log.info("stream %s: handed over in epoch %d; electing %s", self.name, epoch, to)
        self.owner.propose(Elect(self.name, epoch, to))

    async def hand_over(self, to: str) -> None:
        """Begin handing this stream's primary role to ``to``, an ISR member (ValueError if
        it is not one, Unavailable if this peer does not lead the stream)."""
        async with self.lock:
            primary = self.primary
            if primary is None:
                raise self.not_primary()
            self.after(primary.hand_over(to, self.clock()))

    def handing_to(self) -> str | None:
        """The member this peer is handing the stream to (None: no hand-over under way)."""
        return None if self.primary is None else self.primary.handing_to

    def _ship(self, ship: Ship) -> None:
        """Queue the entries a follower lacks (those on this disk); read when sent. Entries
        trimmed here already go as a seed: the follower starts its log after them."""
        outbox = self._outbox(ship.to)
        first = ship.first
        if first < self.spool.earliest:
            outbox.put(SEED)
            first = self.spool.earliest
        for offset in range(first, min(ship.last, self.written) + 1):
            outbox.put(offset)

    async def materialize(
        self, items: list[ReplicationMessage | int]
    ) -> tuple[ReplicationMessage, ...]:
        """The messages of an outbox's batch: queued entries read from the spool in a
        thread, then made appends of this primary's epoch (ValueError once it is not)."""
        offsets = [item for item in items if isinstance(item, int) and item != SEED]
        entries = {}
        if offsets:  # (new entries travel as appends already: no thread hop for them)
            entries = await asyncio.to_thread(
                lambda: {o: self.spool.read_entry(o) for o in offsets}
            )
        primary = self.primary
        if any(isinstance(item, int) for item in items) and primary is None:
            raise ValueError(f"stream {self.name}: no longer primary")
        out: list[ReplicationMessage] = []
        for item in items:
            if item == SEED:
                assert primary is not None
                through, seqs = self.spool.trimmed_state()
                history = tuple(e for e in primary.history if e.start <= through)
                out.append(Seed(self.name, primary.epoch, through, tuple(seqs.items()), history))
            elif isinstance(item, int):
                assert primary is not None
                body, tag = entries[item]
                origin, seq = tag if tag is not None else (None, None)
                out.append(primary.entry_message(item, body, origin, seq))
            else:
                out.append(item)
        return tuple(out)

    def _schedule_step_down(self) -> None:
        async def down() -> None:
            async with self.lock:
                await self.step_down()

        self.owner.spawn(down())

    # ----------------------------------------------------------------------- follower side
    async def on_exchange(self, messages: tuple[ReplicationMessage, ...]) -> Frame:
        out: list[ReplicationMessage] = []
        pending: list[Effect] = []  # performed together (one thread hop), before any reply
        async with self.lock:
            for message in messages:
                if isinstance(message, ReplicaAppend | Probe | Seed):
                    if self.primary is not None:
                        refusal = self.primary.fence(message)
                        if refusal is not None:
                            out.append(refusal)
                            continue
                        await self.perform(tuple(pending))
                        pending.clear()
                        await self.step_down()
                    if isinstance(message, Seed):
                        reply, effects = self.follower.seed(message)
                    else:
                        reply, effects = self.follower.receive(message)
                    pending.extend(effects)
                    out.append(reply)
                elif isinstance(message, EpochEndReply) and self.primary is None:
                    answer, effects = self.follower.on_epoch_end(message)
                    pending.extend(effects)
                    if answer is not None:
                        out.append(answer)
            await self.perform(tuple(pending))
        return messages_to_wire(out)

    def describe(self) -> dict[str, Any]:
        state = self.known
        primary = self.primary
        lag = None
        if primary is not None:
            lag = {n: primary.log_end - primary.end_of_member(n) for n in primary.replicas}
        return {
            "epoch": self.disk.epoch,  # the fence: the newest epoch this replica has seen
            "primary": None if state is None else state.primary,
            "role": "primary" if primary is not None else "follower",
            "log_end": self.spool.log_end,
            "acknowledged": self.visible,
            "replicas": [] if state is None else list(state.replicas),
            "in_sync": [] if state is None else list(state.in_sync),
            "under_replicated": state is not None and state.under_replicated,
            "lag": lag,
        }

    async def close(self) -> None:
        """Stop the writer and the outboxes, and return once their tasks have ended."""
        self._close_outboxes()
        await self.tasks.aclose()
