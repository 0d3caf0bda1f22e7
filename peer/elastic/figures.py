"""An elastic participant's load, from what its peers gossip (pure).

Each engine peer gossips ``tps`` (the rows its engine's micro-batches read per second since
its last gossip round), ``busy`` (the share of that time its micro-batches ran, at most 1:
DS2's useful time, which the peer's CPU use is not: an idle Spark polling its sources uses CPU
and does no work) and ``lag`` (the rows waiting in its queries' inputs); a drained peer says
``drain``, a launched one ``launched`` (:meth:`peer.node.Peer._load_figures`).
:func:`participant_load` turns one round of them into DS2's inputs
(:mod:`peer.elastic.sizing`): each peer's processed rate and useful share, and the
participant's backlog. What arrives is not seen directly: :class:`Arrivals` takes it as what
was processed plus the backlog's growth between two rounds (never below zero).

Gossip is input from other peers: a missing, negative or non-finite figure leaves the peer
out of the rates (it still counts as a peer of the participant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from peer.elastic.sizing import PeerRates

__all__ = ["Arrivals", "ParticipantLoad", "participant_load"]


def _figure(load: Mapping[str, object], key: str) -> float | None:
    value = load.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if math.isfinite(value) and value >= 0:
        return float(value)
    return None


@dataclass(frozen=True)
class ParticipantLoad:
    """One round of the participant's figures."""

    peers: tuple[PeerRates, ...]  # the peers with usable figures
    serving: int  # live peers not draining (with or without figures)
    launched_live: int  # of them, launched ones
    processed: float  # rows/s, all peers
    backlog: float  # rows waiting, all peers


def participant_load(figures: Mapping[str, Mapping[str, object]]) -> ParticipantLoad:
    """``figures``: node id -> what that live peer of the participant gossips."""
    peers: list[PeerRates] = []
    serving = launched = 0
    processed = backlog = 0.0
    for node in sorted(figures):
        load = figures[node]
        if _figure(load, "drain"):
            continue
        serving += 1
        if _figure(load, "launched"):
            launched += 1
        tps, busy, lag = _figure(load, "tps"), _figure(load, "busy"), _figure(load, "lag")
        if lag is not None:
            backlog += lag
        if tps is None or busy is None:
            continue
        processed += tps
        peers.append(PeerRates(node, tps, min(1.0, busy)))
    return ParticipantLoad(tuple(peers), serving, launched, processed, backlog)


class Arrivals:
    """Rows/s arriving at the participant's queries: processed plus the backlog's growth."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None  # (when, backlog)

    def update(self, now: float, load: ParticipantLoad) -> float:
        last, self._last = self._last, (now, load.backlog)
        if last is None or now <= last[0]:
            return load.processed
        growth = (load.backlog - last[1]) / (now - last[0])
        return max(0.0, load.processed + growth)
