"""An elastic participant's load, from what its peers gossip (pure).

Each engine peer gossips ``tps`` (the rows its engine's micro-batches read per second since
its last gossip round), ``busy`` (the share of that time its micro-batches ran, at most 1),
``lag`` (the rows waiting in its queries' inputs) and, from its brain, ``util`` (the CPU of
its process tree over its ``--capacity``); a drained peer says ``drain``, a launched one
``launched`` (:meth:`peer.node.Peer._load_figures`). :func:`participant_load` turns one round
of them into DS2's inputs (:mod:`peer.elastic.sizing`): each peer's processed rate and useful
time, and the participant's backlog.

A peer's useful time is in units of its capacity: ``busy * max(1, util)``. The busy share
alone is wall time: a peer whose micro-batches ran all the time while it used three times the
cores it offers (nothing keeps a peer to its ``--capacity`` on a shared host) did three
capacities' worth of work, and counting it as one would make its true rate three times what a
peer of that capacity does, so the participant would grow in several steps instead of one.
CPU alone is not useful time either (an idle Spark polling its sources uses CPU and does no
work), so it only scales the busy share, and only above the capacity.

What arrives is not seen directly: :class:`Arrivals` takes it as what was processed plus the
backlog's growth between two rounds (never below zero).

Gossip is input from other peers: a missing, negative or non-finite figure leaves the peer
out of the rates (it still counts as a peer of the participant); such a ``util`` leaves its
busy share as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from peer.elastic.sizing import PeerRates

__all__ = ["Arrivals", "ParticipantLoad", "participant_load", "useful_time"]


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


def useful_time(busy: float, util: float | None) -> float:
    """A peer's useful time, in capacities: its busy share, scaled by its utilisation where
    that exceeds its capacity (``util`` None: a peer without a brain, its busy share)."""
    return busy * max(1.0, util or 0.0)


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
        peers.append(PeerRates(node, tps, useful_time(min(1.0, busy), _figure(load, "util"))))
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
