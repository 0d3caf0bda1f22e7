"""The voter side of the control plane: a Raft member that hears every peer's heartbeat.

Theory of operation
-------------------
A voter runs one :class:`peer.replication.raft.ControlMachine` (pysyncobj) whose messages travel
over the peer links as :class:`~peer.replication.link_messages.RaftFrame` requests, one queue and
one sender task per destination so that each voter sees another's frames in order. It serves:

* ``control_heartbeat`` from every peer: it notes, on its own monotonic clock, when it last
  heard the peer and the log ends it reported; the answer is the state of the streams the
  peer replicates, the voters, and the leader;
* ``control_submit``: a command for the Raft log (pysyncobj forwards it to the leader);
* ``control_join``: the admission of a new voter (the asking peer): a forced one always, a
  volunteer while a seat is open (:class:`peer.replication.control.VoterSeats`), one at a time;
* ``control_read``: one stream's state, as this voter has applied it;
* ``raft``: a frame of the Raft library, accepted only from a current voter.

The voter that leads runs the failover rounds (:func:`peer.replication.control.choose_primary`): a
primary not heard for ``failover_after_s`` is replaced by the live in-sync replica with the longest
log. One silent for ``suspect_after_s`` is probed first (``gone``): if its host refuses
connections to its port, its process is gone, and it is replaced in the next round
(:func:`peer.replication.control.to_probe`). A new leader seeds every peer's last-heard time
with the moment it took office, so nobody is declared dead for silence that happened before it
could hear them. No wall clock is read.

The leader also keeps the seats (:mod:`peer.replication.control.seats`): a voter not heard for
the seats' grace (30 s) is removed through Raft's membership change, one at a time, and the
seat it leaves is taken by the next volunteer. Every answer names the seats (3, or 5 once five
peers are live), so that peers know whether to volunteer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from peer.errors import InvalidInput, Unavailable
from peer.protocol.link import Frame
from peer.replication.control import (
    Applied,
    Command,
    Elect,
    VoterSeats,
    failover_decisions,
    to_probe,
)
from peer.replication.link_messages import (
    ControlHeartbeat,
    ControlJoin,
    ControlRead,
    ControlSubmit,
    RaftFrame,
    state_to_wire,
)
from peer.replication.raft import ControlMachine, burst_to_wire, command_from_wire
from peer.timing import MONOTONIC, Clock, OwnedTasks, every, wait_until

log = logging.getLogger(__name__)

FAILOVER_AFTER_S = 3.0  # outlasts a stall (a 2 s SIGSTOP); a gone process goes sooner
SUSPECT_AFTER_S = 0.5  # a primary this silent is probed: is its process gone?
ROUND_S = 0.1
RAFT_QUEUE = 2048
SUBMIT_TIMEOUT_S = 5.0

Call = Callable[[str, RaftFrame], Coroutine[Any, Any, Frame]]
Gone = Callable[[str], Awaitable[bool]]
"""Whether the process of a peer (hex node id) is gone: its host refuses connections to its
port (:meth:`overlay.node.Overlay.refuses_connections`). False when unsure."""


class Voter:
    """This peer's seat in the control plane."""

    def __init__(
        self,
        node: str,
        voters: Iterable[str],
        call: Call,
        *,
        journal_dir: Path | None,
        seats: VoterSeats,
        on_voters: Callable[[tuple[str, ...]], None],
        failover_after_s: float = FAILOVER_AFTER_S,
        gone: Gone | None = None,
        suspect_after_s: float = SUSPECT_AFTER_S,
        clock: Clock = MONOTONIC,
    ) -> None:
        """``gone``: asked about a primary silent for ``suspect_after_s``; one whose process
        is gone fails over at once instead of after ``failover_after_s`` (None: never asked)."""
        self.node = node
        self.clock = clock
        self.call = call
        self.failover_after_s = failover_after_s
        self.gone = gone
        self.suspect_after_s = suspect_after_s
        self._probed: dict[str, float] = {}  # node -> its last-heard time when last probed
        self.loop = asyncio.get_running_loop()
        self.last_heard: dict[str, float] = {}
        self.log_ends: dict[str, dict[str, int]] = {}  # stream -> node -> log end
        self._queues: dict[str, asyncio.Queue[bytes]] = {}
        self._tasks = OwnedTasks("control voter")  # raft senders, elections; run() awaits them
        self._leading_since: float | None = None
        self._electing: dict[str, int] = {}  # stream -> epoch an Elect was submitted in
        self.seats = seats
        self.on_voters = on_voters  # the group changed (the caller saves it)
        self._voters: tuple[str, ...] = ()
        self._admitting = asyncio.Lock()  # one admission at a time (rule 4 of seats)
        self._removing: str | None = None  # the voter whose removal is in flight
        self.machine = ControlMachine(node, tuple(voters), self._send, journal_dir=journal_dir)

    # ----------------------------------------------------------------------- raft frames
    def _send(self, node: str, data: bytes) -> bool:
        """Called on pysyncobj's thread: queue the frame for the asyncio sender of ``node``."""
        if self.loop.is_closed():
            return False
        self.loop.call_soon_threadsafe(self._enqueue, node, data)
        return True

    def _enqueue(self, node: str, data: bytes) -> None:
        queue = self._queues.get(node)
        if queue is None:
            queue = self._queues[node] = asyncio.Queue(RAFT_QUEUE)
            self._tasks.spawn(self._sender(node, queue), name=f"raft sender {node[:12]}")
        if queue.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()  # Raft resends what is lost; the newest matters most
        queue.put_nowait(data)

    async def _sender(self, node: str, queue: asyncio.Queue[bytes]) -> None:
        while True:
            data = await queue.get()
            try:
                await self.call(node, RaftFrame(self.node, data))
            except Exception as exc:  # unreachable voter: Raft copes with loss
                log.debug("raft frame to %s lost: %s", node[:12], exc)

    async def on_raft(self, message: RaftFrame, _sender: str) -> Frame:
        if message.sender not in self.machine.voters():
            raise InvalidInput("raft: the sender is not a voter of this control plane")
        self.machine.deliver(message.sender, message.data)
        return {}

    # ----------------------------------------------------------------------- requests
    async def on_heartbeat(self, message: ControlHeartbeat, _sender: str) -> Frame:
        now = self.clock()
        self.last_heard[message.node] = now
        self.seats.heard(message.node)
        for stream, end in message.log_ends.items():
            self.log_ends.setdefault(stream, {})[message.node] = end
        states = [state_to_wire(s) for s in self.machine.snapshot() if message.node in s.replicas]
        return {"streams": states, **self.describe()}

    async def on_read(self, message: ControlRead, _sender: str) -> Frame:
        state = self.machine.stream(message.stream) if message.stream else None
        reply = {"stream": None if state is None else state_to_wire(state), **self.describe()}
        if message.burst is not None:
            burst = self.machine.burst(message.burst)
            reply["burst"] = None if burst is None else burst_to_wire(burst)
        return reply

    async def on_join(self, message: ControlJoin, _sender: str) -> Frame:
        async with self._admitting:
            voters = self.machine.voters()
            declined = self.seats.admit(voters, message.node, forced=not message.volunteer)
            if declined is not None:
                return {"ok": False, "reason": declined, **self.describe()}
            if message.node not in voters:
                log.warning("admitting %s as a voter of the control plane", message.node[:12])
                await self._admit(message.node)
        return {"ok": True, "reason": "", **self.describe()}

    async def _admit(self, node: str) -> None:
        """Add ``node`` to the voters and return once the change is in this voter's log.

        Not once it commits: Raft counts a new member in the majority from the moment its
        change is appended, so a group of one that admits a second cannot commit the change
        until the newcomer runs its member, which it starts once told it is admitted."""
        future = self.machine.add_voter(node)
        try:
            await wait_until(
                lambda: future.done() or node in self.machine.voters(),
                "the voter's admission",
                SUBMIT_TIMEOUT_S,
                every_s=0.02,
                clock=self.clock,
            )
        except TimeoutError:
            raise Unavailable("control plane: adding a voter timed out (no leader?)") from None
        if node not in self.machine.voters():
            future.result()  # (raises why it failed: Unavailable)

    async def on_submit(self, message: ControlSubmit, _sender: str) -> Frame:
        try:
            decoded = command_from_wire(message.command)
        except ValueError as exc:
            raise InvalidInput(f"control_submit: {exc}") from None
        applied = await self.submit(decoded)
        return {"ok": applied.ok, "reason": applied.reason, **self.describe()}

    async def submit(self, command: Command) -> Applied:
        applied: Applied = await self._wait(self.machine.submit(command), "submitting a command")
        return applied

    async def _wait(self, future: Future[Any], what: str) -> Any:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), SUBMIT_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(f"control plane: {what} timed out (no leader?)") from None

    def describe(self) -> dict[str, Any]:
        return {
            "voters": list(self.machine.voters()),
            "leader": self.machine.leader(),
            "seats": self.seats.seats(),
        }

    # ----------------------------------------------------------------------- failover
    async def run(self) -> None:
        try:
            await every(ROUND_S, self._round, clock=self.clock, what="control voter round")
        finally:
            await self._tasks.aclose()
            await asyncio.to_thread(self.machine.close)

    async def _round(self) -> None:
        voters = self.machine.voters()
        if voters != self._voters:
            self._voters = voters
            self.on_voters(voters)
        if not self.machine.is_leader():
            self._leading_since = None
            return
        now = self.clock()
        if self._leading_since is None:
            self._leading_since = now  # count silence only from taking office
            # ... but a primary this voter already missed (the old leader's peer, often) is
            # asked about at once: a refused connection needs no silence to be believed
            silent = {n for n, t in self.last_heard.items() if now - t >= self.suspect_after_s}
            self.last_heard = dict.fromkeys(self.last_heard, now)
            self.seats.took_office(voters)
            if self.gone is not None:
                for node in silent & {state.primary for state in self.machine.snapshot()}:
                    self._ask(node, now)
        self._failover_round(now)
        self._seats_round(voters)

    def _failover_round(self, now: float) -> None:
        streams = self.machine.snapshot()
        for state in streams:
            for node in state.replicas:  # a node never heard: silent from now on
                self.last_heard.setdefault(node, now)
        # every stream is decided on (an anchored one follows its anchor, even while the
        # anchor's own election is in flight); those with an election in flight are skipped
        decisions = failover_decisions(
            streams, self.last_heard, now, self.failover_after_s, self.log_ends
        )
        for command in decisions:
            if self._electing.get(command.name) == command.epoch:
                continue
            log.warning("electing %s primary of %s", command.primary[:12], command.name)
            self._electing[command.name] = command.epoch
            self._tasks.spawn(self._elect(command), name=f"elect {command.name}")
        if self.gone is not None:
            for node in to_probe(streams, self.last_heard, now, self.suspect_after_s, self._probed):
                self._ask(node, self.last_heard[node])

    def _ask(self, node: str, heard: float) -> None:
        """Probe ``node``, last heard at ``heard``, once in this silence."""
        self._probed[node] = heard
        self._tasks.spawn(self._probe(node, heard), name=f"probe {node[:12]}")

    async def _probe(self, node: str, heard: float) -> None:
        """Ask whether ``node``'s process is gone; if it is, and it was not heard meanwhile,
        drop its last-heard time and fail its streams over at once."""
        assert self.gone is not None
        if not await self.gone(node) or self.last_heard.get(node) != heard:
            return
        log.warning(
            "%s refuses connections, silent for %.2f s: its process is gone; failing over now",
            node[:12],
            self.clock() - heard,
        )
        self.last_heard[node] = self._probed[node] = float("-inf")  # (probed: not again)
        if self.machine.is_leader():
            self._failover_round(self.clock())  # now, not at the next round

    async def _elect(self, command: Elect) -> None:
        applied = None
        try:
            applied = await self.submit(command)
        except Unavailable as exc:  # no leader just now
            log.info("electing a primary of %s: %s", command.name, exc)
        finally:
            if applied is None or not applied.ok:
                self._electing.pop(command.name, None)  # try again next round

    def _seats_round(self, voters: tuple[str, ...]) -> None:
        """Remove a voter that died for good (one change at a time); its seat is then open."""
        if self._removing is not None:
            return
        dead = self.seats.to_remove(voters, self.node)
        if dead is None:
            return
        log.warning("voter %s silent for %.0f s: removing it", dead[:12], self.seats.grace_s)
        self._removing = dead
        self._tasks.spawn(self._remove(dead), name=f"remove voter {dead[:12]}")

    async def _remove(self, dead: str) -> None:
        try:
            await self._wait(self.machine.remove_voter(dead), "removing a voter")
        except Exception as exc:  # tried again next round
            log.info("removing a voter failed (tried again): %s", exc)
        finally:
            self._removing = None
