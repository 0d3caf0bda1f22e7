"""What the parts the node wires see of each other: the overlay's door to the federation, and
the brain's view of the peer (peer.brain.BrainHost)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from overlay.node import OverlayError
from peer.errors import Conflict, FedstreamError
from peer.federation import Federation
from peer.federation.mirror import MIRROR_PREFIX
from peer.move import SIBLING
from peer.protocol.link import Raw

if TYPE_CHECKING:
    from overlay.link import Link
    from overlay.membership import Event, MemberInfo
    from peer.federation.router import Router
    from peer.move import Mover
    from peer.node.replication import PlaneRoom
    from peer.observe import Observer
    from peer.replication.bursts import BurstState, ClaimBurst, PlanBurst
    from peer.replication.fragment_failover import FragmentHandOver


class ReplicatedFragmentsPort(Protocol):
    """The replicated fragments this peer runs (peer.replication.ReplicatedFragments)."""

    def runs(self, name: str) -> bool: ...

    def handover_candidates(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]: ...

    async def hand_over(self, name: str, target: str) -> FragmentHandOver: ...


class MoveFragment(Protocol):
    """Moves a fragment, with its state, to another peer (peer.node.Peer.move_fragment)."""

    def __call__(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Awaitable[Mapping[str, object]]: ...


class FederationDoor:
    """The overlay's way in to the federation (implements overlay.node.PeerHandler).

    The federation needs the overlay (its links, its DHT, its members), so the overlay is made
    first, with this door as its handler and member listener, and the door opens once the
    federation is made, before the overlay starts: no request or member event finds it
    closed. One that did would get the overlay's retriable refusal, or be dropped."""

    def __init__(self) -> None:
        self._fed: Federation | None = None

    def open(self, fed: Federation) -> None:
        if self._fed is not None:
            raise RuntimeError("the federation's door is open already")
        self._fed = fed

    def _router(self) -> Router:
        if self._fed is None:
            raise OverlayError("this peer is starting; retry")
        return self._fed.router

    async def handle_link(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        return await self._router().handle_link(link, frame)

    def stream_link(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return self._router().stream_link(link, frame)

    async def on_member(self, event: Event) -> None:
        if self._fed is not None:
            await self._fed.on_member(event)


class BrainPort:
    """What the brain uses of the peer (peer.brain.BrainHost)."""

    def __init__(
        self,
        fed: Federation,
        *,
        data_dir: Path,
        mover: Mover,
        observer: Observer | None,
        move: MoveFragment,
        replicated: ReplicatedFragmentsPort | None = None,
    ) -> None:
        self._fed = fed
        self._data_dir = data_dir
        self._mover = mover
        self._observer = observer
        self._move = move  # the peer's move, which the observer counts
        self._replicated = replicated  # the replicated fragments (with a control plane)

    @property
    def node_id(self) -> bytes:
        return self._fed.node_id

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    def live_members(self) -> Sequence[MemberInfo]:
        return self._fed.overlay.live_members()

    async def send_offer(self, node_id: bytes, frame: dict[str, object]) -> object:
        observer = self._observer
        try:
            reply = await self._fed.router.call(node_id, Raw("offer", dict(frame)))
        except FedstreamError:
            if observer is not None:
                observer.offered("sent", "failed")
            raise
        if observer is not None:
            observer.offered("sent", "accepted" if reply.get("accepted") else "refused")
        return reply

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        return self._mover.movable()

    def moving(self) -> bool:
        """A move into or out of this peer is under way."""
        return self._mover.busy

    def handover_fragments(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        if self._replicated is None:
            return []
        return self._replicated.handover_candidates()

    async def engine_busy_seconds(self) -> Mapping[str, float]:
        return await self._fed.site.engine_busy_seconds()

    def input_backlog(self) -> int:
        return self._fed.site.input_backlog()

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]:
        replicated = self._replicated
        if replicated is not None and replicated.runs(name):
            if contract != SIBLING:  # a partner is never handed a replicated fragment
                raise Conflict(f"fragment {name} is replicated: it moves to a peer of ours only")
            return dict(await replicated.hand_over(name, target.hex()))
        return await self._move(name, target, contract=contract, load=load, price=price)


class ElasticPort:
    """What an elastic participant's burst leader and a launched peer's drain use of the peer
    (peer.elastic.leader.BurstControl, peer.elastic.drain.DrainPort)."""

    def __init__(self, fed: Federation, brain: BrainPort, room: PlaneRoom) -> None:
        self._fed = fed
        self._brain = brain
        self._room = room

    # the control plane
    async def read_burst(self, participant: str) -> BurstState | None:
        return await self._room.plane.client.read_burst(participant)

    async def submit(self, command: ClaimBurst | PlanBurst) -> Mapping[str, Any]:
        return await self._room.plane.client.submit(command)

    # the participant's peers
    def participant_figures(self, own: Mapping[str, float]) -> dict[str, Mapping[str, object]]:
        """Node id hex -> gossiped figures of the live engine peers of this participant, this
        peer's own (``own``) included."""
        me, participant = self._fed.node_id, self._fed.overlay.identity.participant
        out: dict[str, Mapping[str, object]] = {me.hex(): dict(own)}
        for member in self._fed.overlay.live_members():
            if member.participant == participant and member.engine and member.node_id != me:
                out[member.node_id.hex()] = dict(member.load)
        return out

    def is_live(self, node: str) -> bool:
        try:
            node_id = bytes.fromhex(node)
        except ValueError:
            return False
        return node_id == self._fed.node_id or self._fed.overlay.is_live(node_id)

    def siblings(self) -> list[bytes]:
        me, participant = self._fed.node_id, self._fed.overlay.identity.participant
        found = []
        for member in self._fed.overlay.live_members():
            if member.participant != participant or not member.engine or member.node_id == me:
                continue
            if member.load.get("drain"):
                continue
            util = member.load.get("util")
            found.append((util if isinstance(util, int | float) else 0.0, member.node_id))
        return [node for _, node in sorted(found)]

    # what this peer holds
    def led_streams(self) -> list[tuple[str, tuple[str, ...]]]:
        return self._room.plane.replicas.led()

    async def hand_over_stream(self, name: str, to: str) -> object:
        return await self._room.plane.replicas.hand_over(name, to)

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        return self._brain.movable_fragments()

    def moving(self) -> bool:
        return self._brain.moving()

    def handover_fragments(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        return self._brain.handover_fragments()

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]:
        return await self._brain.move_fragment(
            name, target, contract=contract, load=load, price=price
        )

    def unmovable(self) -> list[str]:
        """What keeps this peer from leaving: fragments that can neither move nor be handed
        over, and streams hosted here without another copy."""
        from peer.move.candidates import why_not

        site, hosted = self._fed.site, self._fed.hosting.hosted
        handed = {name for name, _, _ in self._brain.handover_fragments()}
        out = []
        for name in site.catalog.query_names():
            why = None if name in handed else why_not(site, hosted, name)
            if why is not None:
                out.append(why)
        replicas = self._room.plane.replicas
        for stream in sorted(hosted):
            if stream.startswith(MIRROR_PREFIX):
                continue  # a copy of a stream held elsewhere
            if not replicas.is_replicated(stream):
                out.append(f"stream {stream} is hosted here without replicas")
        return out
