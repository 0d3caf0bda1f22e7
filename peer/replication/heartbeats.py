"""Every peer's side of the control plane: heartbeats to the voters, and what it learns back.

Theory of operation
-------------------
The control plane (docs/replication.md) decides each replicated stream's epoch, primary and
in-sync set; voters run it (:mod:`peer.replication.voter`). Every peer, voter or not:

* sends each voter a :class:`~peer.replication.link_messages.ControlHeartbeat` every ``heartbeat_s``
  with the log end of every stream it replicates. The voters' answers carry the state of
  those streams and the current voters; a state newer (by version) than the one known here is
  handed to the listeners (the replica driver), so a new epoch reaches its replicas within a
  heartbeat of its commit;
* submits commands (a stream's creation, a primary's ISR proposals) to a voter, the leader
  when it is known, and waits for the outcome;
* reads a stream's state for forwarding (who is primary now), from what it learnt or from a
  voter.

The voters are found by asking live members of the overlay (on start, and again every second
until some are known: :mod:`peer.replication.plane`); every answer of a voter repeats the list
and the seats the voters want (:mod:`peer.replication.control.seats`), so both stay current as
voters are added and replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from peer.errors import FedstreamError, Unavailable
from peer.protocol.link import Frame
from peer.replication.control import BurstState, Command, StreamState
from peer.replication.link_messages import (
    ControlHeartbeat,
    ControlJoin,
    ControlRead,
    ControlSubmit,
    ReplicaRequest,
    state_from_wire,
)
from peer.replication.ports import Links
from peer.replication.raft import burst_from_wire, command_to_wire
from peer.timing import MONOTONIC, Clock, every

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
HEARTBEAT_TIMEOUT_S = 1.0
SUBMIT_TIMEOUT_S = 8.0
PLAIN_S = 5.0  # how long "not replicated" is believed without asking again

Listener = Callable[[StreamState], None]


class ControlClient:
    """What this peer knows of the control plane, and how it talks to it."""

    def __init__(
        self,
        router: Links,
        log_ends: Callable[[], Mapping[str, int]],
        *,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.router = router
        self.clock = clock
        self.node = router.node_id.hex()
        self.log_ends = log_ends
        self.heartbeat_s = heartbeat_s
        self.voters: tuple[str, ...] = ()
        self.leader: str | None = None
        self.seats: int | None = None  # how many voters the voters want (control.seats)
        self.states: dict[str, StreamState] = {}
        self._listeners: list[Listener] = []
        # streams a voter said are not replicated, until (on the clock): host lookups of plain
        # streams (query results) then cost no round trip each
        self._plain: dict[str, float] = {}

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    @property
    def active(self) -> bool:
        """Whether this federation has a control plane this peer knows of."""
        return bool(self.voters)

    def set_voters(self, voters: Iterable[str], leader: str | None = None) -> None:
        found = tuple(v for v in voters if isinstance(v, str) and len(v) == 40)
        if found:
            self.voters = found
        self.leader = leader

    def learn(self, state: StreamState) -> None:
        known = self.states.get(state.name)
        if known is not None and (known.epoch, known.version) >= (state.epoch, state.version):
            return
        self.states[state.name] = state
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.exception("control-plane listener failed on %s", state.name)

    def _absorb(self, reply: Frame) -> None:
        voters = reply.get("voters")
        if isinstance(voters, list):
            leader = reply.get("leader")
            self.set_voters(voters, leader if isinstance(leader, str) else None)
        seats = reply.get("seats")
        if isinstance(seats, int) and not isinstance(seats, bool) and seats > 0:
            self.seats = seats
        for raw in reply.get("streams") or ():
            try:
                self.learn(state_from_wire(raw))
            except FedstreamError as exc:
                log.warning("a voter sent a bad stream state: %s", exc)

    # ----------------------------------------------------------------------- heartbeats
    async def run(self) -> None:
        """Beat now, then every ``heartbeat_s``, until cancelled."""
        await every(
            self.heartbeat_s, self._beat_all, clock=self.clock, first_s=0, what="control heartbeat"
        )

    async def _beat_all(self) -> None:
        if self.voters:
            message = ControlHeartbeat(self.node, dict(self.log_ends()))
            await asyncio.gather(
                *(self._beat(voter, message) for voter in self.voters),
                return_exceptions=True,
            )

    async def _beat(self, voter: str, message: ControlHeartbeat) -> None:
        try:
            reply = await asyncio.wait_for(
                self.router.ask(bytes.fromhex(voter), message), HEARTBEAT_TIMEOUT_S
            )
        except (FedstreamError, TimeoutError) as exc:
            log.debug("heartbeat to voter %s failed: %s", voter[:12], exc)
            return
        self._absorb(reply)

    async def discover(self, members: Iterable[bytes]) -> bool:
        """Find the voters by asking ``members`` until one knows them."""
        for member in members:
            with contextlib.suppress(FedstreamError, TimeoutError):
                reply = await asyncio.wait_for(
                    self.router.ask(member, ControlRead("")), HEARTBEAT_TIMEOUT_S
                )
                self._absorb(reply)
                if self.voters:
                    return True
        return False

    # ----------------------------------------------------------------------- requests
    def _candidates(self) -> list[str]:
        first = [self.leader] if self.leader in self.voters else []
        return [*first, *(v for v in self.voters if v != self.leader)]

    async def _ask_voters(
        self, message: ReplicaRequest, timeout_s: float, what: str, *, to: list[str] | None = None
    ) -> tuple[str, Frame]:
        """``message``'s answer, and who gave it: the first voter that gives one (the leader
        first), or the first of ``to``."""
        errors = []
        for voter in self._candidates() if to is None else to:
            try:
                reply = await asyncio.wait_for(
                    self.router.ask(bytes.fromhex(voter), message), timeout_s
                )
            except (FedstreamError, TimeoutError) as exc:
                errors.append(f"{voter[:12]}: {exc}")
                continue
            self._absorb(reply)
            return voter, reply
        detail = f" ({'; '.join(errors)})" if errors else ""
        raise Unavailable(f"{what}: the control plane is unreachable{detail}")

    async def submit(self, command: Command | ControlJoin) -> Frame:
        """Submit a command (or this peer's admission as a voter) to the control plane."""
        message = (
            command if isinstance(command, ControlJoin) else ControlSubmit(command_to_wire(command))
        )
        return (await self._ask_voters(message, SUBMIT_TIMEOUT_S, "submit"))[1]

    async def read(self, stream: str) -> StreamState | None:
        """The stream's state from a voter (and learnt here); None if it is not replicated."""
        message = ControlRead(stream)
        voter, reply = await self._ask_voters(message, HEARTBEAT_TIMEOUT_S, stream)
        leader = reply.get("leader")
        if isinstance(leader, str) and leader != voter and leader in self.voters:
            # a follower applies what the leader committed a little later: a stream created
            # (or failed over) a moment ago may not be there yet, so the leader is asked too
            with contextlib.suppress(Unavailable):
                voter, reply = await self._ask_voters(
                    message, HEARTBEAT_TIMEOUT_S, stream, to=[leader]
                )
        raw = reply.get("stream")
        if raw is None:
            self._plain[stream] = self.clock() + PLAIN_S
            return None
        self.learn(state_from_wire(raw))
        return self.states.get(stream)

    async def read_burst(self, participant: str) -> BurstState | None:
        """``participant``'s burst state, from the control plane's leader if it answers
        (a follower may not have applied the newest claim yet); None if it has none."""
        _voter, reply = await self._ask_voters(
            ControlRead("", burst=participant), HEARTBEAT_TIMEOUT_S, f"burst {participant}"
        )
        raw = reply.get("burst")
        return None if raw is None else burst_from_wire(raw)

    async def state_of(self, stream: str, *, fresh: bool = False) -> StreamState | None:
        if not fresh:
            if stream in self.states:
                return self.states[stream]
            if self._plain.get(stream, 0.0) > self.clock():
                return None
        if not self.voters:
            return None
        return await self.read(stream)

    def describe(self) -> dict[str, Any]:
        seats = {} if self.seats is None else {"seats": self.seats}
        return {"voters": list(self.voters), "leader": self.leader, **seats}
