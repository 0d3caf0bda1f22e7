"""What the parts the node wires see of each other: the overlay's door to the federation, and
the brain's view of the peer (peer.brain.BrainHost)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from overlay.node import OverlayError
from peer.errors import Conflict, FedstreamError
from peer.federation import Federation
from peer.move import SIBLING
from peer.protocol.link import Raw

if TYPE_CHECKING:
    from overlay.link import Link
    from overlay.membership import Event, MemberInfo
    from peer.federation.router import Router
    from peer.move import Mover
    from peer.observe import Observer
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
