"""This peer's replicated streams: which it replicates, its role in each, and their requests.

Theory of operation
-------------------
:class:`ReplicatedStreams` keeps one :class:`~peer.replication.driver.StreamReplica` per replicated
stream this peer holds a copy of. The control plane's states reach it through the
:class:`~peer.replication.heartbeats.ControlClient` (heartbeat answers, reads); a state naming this
peer among a stream's replicas makes it create the stream's spool (schema from the DHT
catalog) and take the role the state gives it. ``replica`` exchanges from other peers are
served only for a stream the control plane says this peer replicates, from a peer that is
one of its replicas; anything else is refused and changes nothing.

The site hands pushes of a replicated stream here (through the ``Appenders`` registry that
both are given when they are made). After a restart,
streams whose spool carries a replica state are refused (retriably) until the control plane's
state has said what this peer is for them, so a returning old primary cannot take pushes on
its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from peer.errors import FedstreamError, InvalidInput, Unavailable
from peer.protocol.link import Frame
from peer.replication.appenders import Appenders
from peer.replication.control import (
    CreateStream,
    Elect,
    ExpandIsr,
    SetReplicas,
    ShrinkIsr,
    StreamState,
    copies_text,
    repaired_replicas,
)
from peer.replication.driver import TICK_S, StreamReplica
from peer.replication.fence import ReplicaState
from peer.replication.heartbeats import ControlClient
from peer.replication.link_messages import ReplicaExchange
from peer.replication.log import ReplicatedLog
from peer.replication.ports import Links, Records
from peer.site import Appender, LocalSite
from peer.timing import MONOTONIC, Clock, OwnedTasks, every

log = logging.getLogger(__name__)

OnRole = Callable[[str, bool], None]  # (stream, primary here?)
IsLive = Callable[[str], bool]  # node (hex) -> alive in the overlay's view?
# (stream, r, any_peer) -> the r live peers closest to it that run an engine, then (any_peer)
# the others
Responsible = Callable[[str, int, bool], list[str]]
REPAIR_CHECK_S = 1.0
HAND_OVER_S = 10.0  # the core calls a hand-over off after 5 s; an election takes less


class ReplicatedStreams:
    """Implements peer.replication.driver.ReplicaOwner."""

    def __init__(
        self,
        site: LocalSite,
        router: Links,
        control: ControlClient,
        records: Records,
        on_role: OnRole,
        *,
        logs: Appenders,
        is_live: IsLive | None = None,
        responsible: Responsible | None = None,
        repair_after_s: float = 30.0,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.site = site
        self.router = router
        self.control = control
        self.records = records
        self.me = router.node_id.hex()
        self._on_role = on_role
        self.streams: dict[str, StreamReplica] = {}
        self._creating: dict[str, asyncio.Lock] = {}
        self._forgotten: set[str] = set()  # dropped here (see forget)
        self.clock = clock
        self._tasks = OwnedTasks("replicated streams")  # awaited when run() ends
        self._repair_at = 0.0
        self.logs = logs  # the site appends pushes of our streams through these
        # replica-set repair (peer.replication.control.repair): the overlay's view, if any
        self.is_live = is_live
        self.responsible = responsible
        self.repair_after_s = repair_after_s
        self._silent_since: dict[str, float] = {}
        self._repairs: dict[str, int] = {}  # stream -> the version a repair was proposed at
        control.listen(self.on_state)
        router.register(ReplicaExchange.OP, self.on_exchange)

    # ----------------------------------------------------------------------- ReplicaOwner
    def on_role(self, stream: str, primary: bool) -> None:
        self._on_role(stream, primary)

    def propose(self, command: ShrinkIsr | ExpandIsr | SetReplicas | Elect) -> None:
        self.spawn(self._propose(command))

    async def _propose(self, command: ShrinkIsr | ExpandIsr | SetReplicas | Elect) -> None:
        try:
            reply = await self.control.submit(command)
            if not reply.get("ok"):
                log.info("control plane declined %s: %s", command, reply.get("reason"))
            await self.refresh(command.name)
        except FedstreamError as exc:
            log.info("proposal %s not submitted: %s", command, exc)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coroutine)

    # ----------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Streams that were replicated before a restart wait for the control plane."""
        for name in self.site.spools.streams():
            directory = self.site.spools.get(name).directory
            if ReplicaState.exists(directory):
                self.logs.register(name, self._not_ready(name), self._limit(name))

    def awaiting_role(self) -> list[str]:
        """The streams replicated here before a restart whose role this peer has not learnt."""
        return sorted(n for n in self.logs if n not in self.streams)

    def _not_ready(self, name: str) -> Appender:
        async def refuse(
            _body: bytes, _rows: int, _producer: str | None, _seq: int | None
        ) -> Frame:
            raise Unavailable(
                f"stream {name} is replicated; this peer has not yet heard its role", stream=name
            )

        return refuse

    def epoch_of(self, name: str) -> int | None:
        """The epoch in which this peer leads ``name`` (None: it does not)."""
        replica = self.streams.get(name)
        primary = None if replica is None else replica.primary
        return None if primary is None else primary.epoch

    def is_replicated(self, name: str) -> bool:
        return name in self.streams or name in self.logs

    async def run(self) -> None:
        """Tick the replicas (and check for repairs) until cancelled; then end this peer's
        replica tasks and close the replicas."""
        self._repair_at = self.clock() + REPAIR_CHECK_S
        try:
            await every(TICK_S, self._tick, clock=self.clock, what="replica tick")
        finally:
            await self._tasks.aclose()
            for replica in list(self.streams.values()):
                await replica.close()

    async def _tick(self) -> None:
        now = self.clock()
        for replica in list(self.streams.values()):
            replica.tick(now)
        if now >= self._repair_at:
            self._repair_at = now + REPAIR_CHECK_S
            self.repair(now)

    def repair(self, now: float) -> None:
        """As the primary of a stream, replace a replica silent for ``repair_after_s`` by
        the closest live peer that is not one yet (peer.replication.control.repair)."""
        is_live, responsible = self.is_live, self.responsible
        if is_live is None or responsible is None:
            return
        members = {
            n for replica in self.streams.values() if replica.known for n in replica.known.replicas
        }
        self._silent_since = {  # members only: a node no stream names is forgotten
            n: self._silent_since.get(n, now) for n in members - {self.me} if not is_live(n)
        }
        dead = {n for n, since in self._silent_since.items() if now - since >= self.repair_after_s}
        for name, replica in list(self.streams.items()):
            state = replica.known
            if replica.primary is None or state is None or state.primary != self.me:
                continue
            anchor = None if state.anchor is None else self.control.states.get(state.anchor)
            if state.anchor is not None and anchor is None:
                continue
            candidates: list[str] = []
            replacing = bool(dead & set(state.replicas))
            if anchor is None and (replacing or state.missing > 0):
                # A dead replica is replaced by any live peer if no engine peer is left (the
                # copies the stream had are kept); a short stream grows on engine peers only.
                candidates = responsible(name, state.asked + len(dead), replacing)
            wanted = repaired_replicas(state, dead, candidates, anchor)
            if wanted is None or self._repairs.get(name) == state.version:
                continue
            self._repairs[name] = state.version
            log.warning("stream %s: replicas %s replace %s", name, wanted, state.replicas)
            self.propose(SetReplicas(name, state.version, wanted))

    # ----------------------------------------------------------------------- states
    def on_state(self, state: StreamState) -> None:
        if state.name in self._forgotten:
            return  # dropped here: a late answer of a voter that has not applied the drop
        if self.me in state.replicas:
            self.spawn(self._learn(state))
        elif state.name in self.streams:
            self.spawn(self._let_go(state))

    async def _let_go(self, state: StreamState) -> None:
        """The stream's replica set no longer holds this peer (it was away for good and was
        replaced): drop its copy. Asked again later, it starts over, seeded by the primary."""
        replica = self.streams.get(state.name)
        if replica is None or (replica.known is not None and replica.known.version > state.version):
            return  # (a late state from before this peer was added)
        self.streams.pop(state.name, None)
        log.warning("this peer no longer replicates %s: dropping its copy", state.name)
        self.logs.remove(state.name)
        await replica.close()
        await self.site.drop_streams([state.name])

    async def _learn(self, state: StreamState) -> None:
        if state.name in self._forgotten:  # dropped while this was on its way
            return
        replica = await self.ensure(state.name)
        await replica.learn(state)

    async def refresh(self, name: str) -> StreamState | None:
        """Read the stream's state from the control plane and act on it before returning
        (a stream of a name dropped here before is a new one: asked for by its creator)."""
        self._forgotten.discard(name)
        state = await self.control.read(name)
        if state is not None and self.me in state.replicas:
            await self._learn(state)
        return state

    async def ensure(self, name: str) -> StreamReplica:
        """The stream's replica here, made (spool included) if it is new."""
        replica = self.streams.get(name)
        if replica is not None:
            return replica
        lock = self._creating.setdefault(name, asyncio.Lock())
        async with lock:
            replica = self.streams.get(name)
            if replica is not None:
                return replica
            if name not in self.site.spools:
                schema = await self.records.stream_schema(name)
                await self.site.add_stream(name, schema, None)
            spool = self.site.spools.get(name)
            state = await asyncio.to_thread(
                ReplicaState.load, spool.directory, log_end=spool.log_end, fsync=spool.fsync
            )
            if spool.visible_bound is None:  # (a reopened spool keeps its watermark's bound)
                spool.hold(-1)  # nothing is acknowledged until this peer's role says so
            replica = StreamReplica(self, name, ReplicatedLog(spool, state), clock=self.clock)
            self.streams[name] = replica
            self.logs.register(name, replica.push, self._limit(name))
            return replica

    async def create(
        self,
        name: str,
        nodes: list[bytes],
        replicas: int,
        min_insync: int,
        *,
        anchor: str | None = None,
    ) -> Frame:
        """Ask the control plane for a new replicated stream on ``nodes`` (the first leads;
        ``anchor``: the stream whose primary it follows)."""
        chosen = tuple(n.hex() for n in nodes[:replicas])
        if not chosen:
            raise Unavailable(f"stream {name}: no live peer can hold it")
        wanted = replicas if len(chosen) < replicas else None  # more come as peers join
        command = CreateStream(
            name, chosen, min(min_insync, replicas), anchor=anchor, wanted=wanted
        )
        reply = await self.control.submit(command)
        if not reply.get("ok") and "exists" not in str(reply.get("reason")):
            raise Unavailable(f"stream {name} not created: {reply.get('reason')}", stream=name)
        state = await self.control.read(name)
        if state is None:
            raise Unavailable(f"stream {name}: the control plane lost it", stream=name)
        return {"epoch": state.epoch, "primary": state.primary, "replicas": list(state.replicas)}

    async def forget(self, name: str) -> None:
        """Stop replicating a dropped stream here (its spool is the caller's to drop); the
        control plane's states of it are ignored until the name is created again."""
        self._forgotten.add(name)
        replica = self.streams.pop(name, None)
        self.logs.remove(name)
        self.control.states.pop(name, None)
        if replica is not None:
            await replica.close()

    def led(self) -> list[tuple[str, tuple[str, ...]]]:
        """The streams led here, each with its other in-sync replicas (those it can be handed
        over to)."""
        out = []
        for name, replica in sorted(self.streams.items()):
            known = replica.known
            if replica.primary is not None and known is not None and known.primary == self.me:
                out.append((name, tuple(n for n in known.in_sync if n != self.me)))
        return out

    # ----------------------------------------------------------------------- requests
    async def hand_over(self, name: str, to: str, *, timeout_s: float = HAND_OVER_S) -> StreamState:
        """Hand the primary role of ``name``, led here, to ``to``, one of its in-sync
        replicas, and return the stream's state once ``to`` leads it (docs/replication.md,
        "Handing the primary over on purpose"). InvalidInput if ``to`` is not in the ISR;
        Unavailable if this peer does not lead the stream, or if the hand-over is called off
        or not done within ``timeout_s`` (the stream takes pushes again here then)."""
        replica = self.streams.get(name)
        if replica is None:
            raise Unavailable(f"this peer does not replicate stream {name}", stream=name)
        try:
            await replica.hand_over(to)
        except ValueError as exc:
            raise InvalidInput(f"hand-over of {name}: {exc}") from None
        log.info("stream %s: handing the primary role over to %s", name, to)
        deadline = self.clock() + timeout_s
        while True:
            state = replica.known
            if state is not None and state.primary == to:
                return state
            if replica.primary is not None and replica.handing_to() is None:
                raise Unavailable(
                    f"stream {name}: the hand-over to {to} was called off", stream=name
                )
            if replica.primary is None and state is not None and state.primary != self.me:
                raise Unavailable(
                    f"stream {name}: {state.primary} leads it now, not {to}", stream=name
                )
            if self.clock() >= deadline:
                raise Unavailable(
                    f"stream {name}: the hand-over to {to} took over {timeout_s} s", stream=name
                )
            await asyncio.sleep(TICK_S)

    async def on_exchange(self, message: ReplicaExchange, _sender: str) -> Frame:
        state = self.control.states.get(message.stream)
        if state is None or message.sender not in state.replicas:
            state = await self.control.state_of(message.stream, fresh=True)
        if state is None or self.me not in state.replicas:
            raise InvalidInput(f"replica: this peer does not replicate {message.stream}")
        if message.sender not in state.replicas:
            raise InvalidInput(f"replica: the sender is not a replica of {message.stream}")
        replica = await self.ensure(message.stream)
        if replica.known is None or replica.known.version < state.version:
            await replica.learn(state)
        return await replica.on_exchange(message.messages)

    def _limit(self, name: str) -> Callable[[], int | None]:
        return functools.partial(self.trim_limit, name)

    def trim_limit(self, name: str) -> int | None:
        """On a primary, the last offset every replica holds: a follower catches up from
        the primary's spool, so nothing it lacks is trimmed (a replica away for good pins
        the stream until its replica set changes). None elsewhere."""
        replica = self.streams.get(name)
        primary = None if replica is None else replica.primary
        if primary is None:
            return None
        return min(primary.end_of_member(n) for n in primary.replicas)

    def log_ends(self) -> dict[str, int]:
        return {name: replica.spool.log_end for name, replica in self.streams.items()}

    def describe(self) -> dict[str, Any]:
        return {
            name: {
                **replica.describe(),
                **({} if replica.known is None else self.copies(name, replica.known)),
            }
            for name, replica in sorted(self.streams.items())
        }

    def copies(self, name: str, state: StreamState) -> dict[str, Any]:
        """The stream's copies, asked for and held, in words (``peer status``, ``lookup``)."""
        responsible = self.responsible
        live = state.asked if responsible is None else len(responsible(name, state.asked, False))
        return {"asked": state.asked, "copies": copies_text(state, live)}
