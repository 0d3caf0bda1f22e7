"""Elastic participants (issue 28): load shared among a participant's own peers, and a
participant that grows and shrinks with its load.

The pure decisions come first: :mod:`peer.elastic.balance` (when a peer hands load to a less
loaded sibling, and how much) and :mod:`peer.elastic.sizing` (how many peers the participant
needs, DS2's useful-time rule with a dead band). The burst leader, the provisioner and the
drain that act on them build on these."""

from peer.elastic.balance import Handover, plan_handover
from peer.elastic.sizing import PeerRates, SizeDecision, SizingPolicy, decide_size, true_rate

__all__ = [
    "Handover",
    "PeerRates",
    "SizeDecision",
    "SizingPolicy",
    "decide_size",
    "plan_handover",
    "true_rate",
]
