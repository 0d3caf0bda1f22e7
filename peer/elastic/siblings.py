"""Balancing inside a participant on a live peer: the brain's :class:`peer.brain.host.Siblings`.

Each brain round (after it measures, before it makes any offer under a contract) the brain asks
:meth:`SiblingBalancer.plan`. The balancer takes the utilisation of this peer and of each live
engine peer of the same participant (what they gossip: ``util`` and ``cap``, the last
measurement's utilisation and capacity), keeps the last ``rounds`` of them, and lets
:func:`peer.elastic.balance.plan_handover` decide. What it decides moves with the move
protocol as between participants, under the contract :data:`peer.move.SIBLING` (none: the
target checks that the sender is of its own participant), at no price, each move ledgered with
its reason. A replicated fragment (it runs where its inputs' primary is) may go only to one of
its inputs' other in-sync replicas: the brain moves it by handing that primary over
(``only_to``). After a move the rounds seen are forgotten: the next decision waits for
``rounds`` rounds measured after it.

Gossip is input from other peers: a figure that is missing, not a number, negative or
infinite leaves that peer out of the round.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from contracts.bpm import PeerState
from overlay.membership import MemberInfo
from peer.brain.host import SiblingMove
from peer.elastic.balance import plan_handover
from peer.move import SIBLING

__all__ = ["SiblingBalancer"]


def _figure(load: dict[str, float], key: str) -> float | None:
    value = load.get(key)
    if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


class SiblingBalancer:
    """Implements peer.brain.host.Siblings for the peer ``node_id`` of ``participant``."""

    def __init__(
        self, node_id: bytes, participant: str, *, margin: float = 0.2, rounds: int = 2
    ) -> None:
        if not (math.isfinite(margin) and margin > 0) or rounds < 1:
            raise ValueError("margin must be a number > 0 and rounds at least 1")
        self.node_id = node_id
        self.participant = participant
        self.margin = margin
        self.rounds = rounds
        self.seen: deque[dict[str, float]] = deque(maxlen=rounds)
        self.capacity: dict[str, float] = {}

    def plan(
        self,
        state: PeerState,
        members: Sequence[MemberInfo],
        only_to: Mapping[str, frozenset[bytes]] | None = None,
    ) -> SiblingMove | None:
        me = self.node_id.hex()
        utils = {me: state.utilisation}
        self.capacity[me] = state.capacity
        for member in members:
            if (
                member.participant != self.participant
                or not member.engine
                or member.node_id == self.node_id
            ):
                continue
            util, cap = _figure(member.load, "util"), _figure(member.load, "cap")
            if util is None or cap is None or cap == 0:
                continue
            utils[member.node_id.hex()] = util
            self.capacity[member.node_id.hex()] = cap
        self.seen.append(utils)
        costs = {box.name: box.load for box in state.boxes}
        handover = plan_handover(
            me, list(self.seen), self.capacity, costs, margin=self.margin, rounds=self.rounds
        )
        limits = only_to or {}
        if handover is not None and any(f in limits for f in handover.fragments):
            # a replicated fragment goes only to an in-sync replica of its inputs: choose
            # again among those the target may take (the target depends on the loads only)
            target = bytes.fromhex(handover.target)
            allowed = {f: c for f, c in costs.items() if f not in limits or target in limits[f]}
            handover = plan_handover(
                me, list(self.seen), self.capacity, allowed, margin=self.margin,
                rounds=self.rounds,
            )  # fmt: skip
        if handover is None:
            return None
        return SiblingMove(
            bytes.fromhex(handover.target), handover.fragments, SIBLING, handover.reason
        )

    def moved(self) -> None:
        self.seen.clear()
