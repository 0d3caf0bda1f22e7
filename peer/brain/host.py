"""The brain's one seam to the peer it runs on: :class:`BrainHost`.

The brain measures the peer, offers its fragments to partners' peers and moves the ones they
take. It reaches the peer through these members only: it holds no federation, overlay or
engine of its own, so it can be driven by a fake in tests and the peer's objects never need
to know it. The peer gives the brain an object with these members (a structural match: no
base class to inherit); all of them are called on the peer's event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contracts.bpm import PeerState
from overlay.membership import MemberInfo

__all__ = ["BrainHost", "SiblingMove", "Siblings"]


@dataclass(frozen=True)
class SiblingMove:
    """Move ``fragments`` to ``target``, a peer of this peer's own participant, under
    ``contract`` (the move protocol's word for "no contract needed"), because ``reason``."""

    target: bytes
    fragments: tuple[str, ...]
    contract: str
    reason: str


class Siblings(Protocol):
    """Balancing inside the peer's participant (peer.elastic), asked once a round."""

    def plan(
        self,
        state: PeerState,
        members: Sequence[MemberInfo],
        only_to: Mapping[str, frozenset[bytes]],
    ) -> SiblingMove | None:
        """What to hand to a sibling now, given this round's measurement and the live
        members (their gossiped load figures), if anything; a fragment in ``only_to`` may go
        to those peers only."""
        ...

    def moved(self) -> None:
        """Fragments moved (or failed to): the rounds seen before no longer describe the
        peers."""
        ...


class BrainHost(Protocol):
    """What the brain uses of its peer."""

    @property
    def node_id(self) -> bytes:
        """This peer's overlay node id (an offer never goes to it)."""
        ...

    @property
    def data_dir(self) -> Path:
        """The peer's data directory; the ledger lives in ``data_dir / "ledger.jsonl"``."""
        ...

    def live_members(self) -> Sequence[MemberInfo]:
        """The overlay members gossip holds alive now, this peer among them or not (empty
        when the peer is in no overlay). An offer goes to one of a partner participant's
        members with ``engine`` set, the one whose gossiped ``load["util"]`` is lowest."""
        ...

    async def send_offer(self, node_id: bytes, frame: dict[str, object]) -> object:
        """Send an offer request ``frame`` (built by :func:`peer.brain.offers.offer_frame`;
        its ``"op"`` is ``"offer"``) over the peer link to peer ``node_id``, and return that
        peer's reply as it came: the brain checks it, and the other side's brain answers it
        with :meth:`peer.brain.Brain.handle_offer`. Raises a ``FedstreamError`` when the offer
        does not get an answer: ``Unavailable`` when the peer cannot be reached, the peer's
        own error (translated from the wire) when it answered with one. The brain bounds the
        wait (``BpmConfig.offer_timeout_s``) and cancels the call when it is over."""
        ...

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        """``(fragment name, its box types)`` for each fragment running here that may move."""
        ...

    def handover_fragments(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        """``(fragment name, its box types, the peers it may go to)`` for each replicated
        fragment running here: it moves only by handing its inputs' primary over to one of
        their other in-sync replicas (``move_fragment`` does that for it), and only to a
        peer of this participant, never to a partner."""
        ...

    async def engine_busy_seconds(self) -> Mapping[str, float]:
        """For each fragment running here, the seconds it has spent in micro-batches since it
        started (cumulative; a query that restarts starts again from zero): a member of the
        shared lane an equal share of the lane's; a lane without members under a key no
        fragment has (it takes part in the split of CPU, never in an offer). Empty when the
        peer runs no engine. May raise: the round is then skipped."""
        ...

    def input_backlog(self) -> int:
        """The batches waiting in the inputs of this peer's own streaming queries."""
        ...

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]:
        """Move fragment ``name``, with its state, to peer ``target``, under ``contract`` at
        ``price`` per core for ``load`` cores (peer.move), and return the move's report once
        it runs there; the brain ledgers its ``"pause_s"`` (seconds the fragment did not
        run), when present. Raises a ``FedstreamError`` saying why when it did not move
        (anything else raised counts as a failed move too, logged as a bug)."""
        ...
