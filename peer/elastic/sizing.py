"""How many peers a participant needs for its load (pure): DS2's useful-time rule.

Theory of operation
-------------------
DS2 (Kalavri et al., OSDI 2018) sizes a dataflow from *true* rates: what an operator
processes per second of *useful* time (the time it actually spends processing, not waiting
for input or blocked on output). A peer whose engine was busy 40 % of a window in which it
processed 20,000 tuples/s has a true rate of 50,000 tuples per busy second: that, not 20,000,
is what it could do flat out. Observed rates say nothing about a peer's capacity while it is
idle or backlogged; true rates do, so one decision reaches the right size instead of adding
one peer at a time.

For a participant, each peer reports over the last window how many tuples its fragments
processed per second (``processed``) and its useful time per second of the window
(``useful``: the busy share, in units of the peer's capacity, so more than 1 for a peer that
used more cores than it offers; :mod:`peer.elastic.figures`). Their true
rate per peer is ``sum(processed) / sum(useful)`` (tuples per busy second, weighted by how busy
each peer was). The offered load is what arrives at the participant's inputs per second, plus
the backlog to be worked off within ``drain_s``. A peer should run at ``target`` utilisation
(0.7: headroom for bursts and for moves), so the participant needs

    needed(u) = ceil(offered / (true_rate * u))

peers. A true rate holds while the work grows with the tuples; at a trickle it does not: a
micro-batch of a few tuples still costs its fixed time, so a peer busy 30 % of the time on 10
tuples/s seems to manage only 33 per busy second, and ``needed`` would ask for more peers than
one that is mostly idle. The rule therefore also counts the busy time itself: ``work`` is the
sum of the peers' busy shares (peers' worth of busy time, which moving fragments between
peers keeps), and the participant is *overloaded* when more is offered than was processed
(by more than ``slack``: its backlog grows) or its peers are busy ``saturated`` (0.95, or
``target`` if higher) of the time on average. The
decision (:func:`decide_size`) has a dead band against flapping:

- grow to ``needed(target)`` when that is above the current size and the participant is
  overloaded (a participant keeping up below ``target`` does not grow on extrapolated rates);
- shrink when even ``needed(shrink_at)`` is below the current size, to ``needed(target)``;
  and, when the participant is not overloaded, when ``ceil(work / shrink_at)`` is below it, to
  ``ceil(work / target)``; to the smaller of the two when both hold (``shrink_at`` is lower
  than ``target``, 0.5: the peers left run at or under ``target``, and at the new size neither
  rule fires again under the same load);
- otherwise keep the size; always clamp to ``[minimum, maximum]``.

A participant with nothing offered and nothing processed (no true rate, and none needed)
needs one peer: it shrinks to MIN. With something offered but nothing processed in the window
there is no rate to size by, and nothing is decided.

So under a constant load a decision is final (deciding again at the size it chose changes
nothing), the size never leaves ``[minimum, maximum]``, and it never falls as the load rises
(tests/unit/test_elastic_sizing.py checks the three with Hypothesis).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PeerRates", "SizeDecision", "SizingPolicy", "decide_size", "true_rate"]


@dataclass(frozen=True)
class PeerRates:
    """One peer's figures over the last window: ``processed`` tuples per second of wall time,
    and ``useful``, its useful time per second of the window, in units of its capacity (the
    share of the window its engine spent processing, more than 1 for a peer that used more
    than its capacity: :func:`peer.elastic.figures.useful_time`)."""

    node: str
    processed: float
    useful: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.processed) and self.processed >= 0):
            raise ValueError(f"peer {self.node}: processed must be a number >= 0")
        if not (math.isfinite(self.useful) and self.useful >= 0):
            raise ValueError(f"peer {self.node}: useful must be a number >= 0")


@dataclass(frozen=True)
class SizingPolicy:
    """``peer join --elastic MIN:MAX``, and the utilisations of the dead band."""

    minimum: int
    maximum: int
    target: float = 0.7  # grow so that peers run at this utilisation
    shrink_at: float = 0.5  # shrink only when peers would stay under this at the smaller size
    drain_s: float = 60.0  # a backlog counts as load to be worked off within this time
    slack: float = 0.1  # offered above processed by more than this share: overloaded
    saturated: float = 0.95  # peers busy this share of the time on average: overloaded

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(
                f"elastic MIN:MAX must satisfy 1 <= MIN <= MAX, not {self.minimum}:{self.maximum}"
            )
        if not 0 < self.shrink_at < self.target <= 1:
            raise ValueError("elastic utilisations must satisfy 0 < shrink_at < target <= 1")
        if not (math.isfinite(self.drain_s) and self.drain_s > 0):
            raise ValueError("elastic drain_s must be a number > 0")
        if not (math.isfinite(self.slack) and self.slack >= 0):
            raise ValueError("elastic slack must be a number >= 0")
        if not 0 < self.saturated <= 1:
            raise ValueError("elastic saturated must be above 0 and at most 1")


@dataclass(frozen=True)
class SizeDecision:
    """The size to be, and the figures behind it (for the ledger, status and metrics)."""

    current: int
    size: int
    offered: float  # tuples/s to be processed, backlog included
    true_rate: float  # tuples per busy second of one peer
    needed: int  # needed(target), before clamping
    reason: str

    @property
    def change(self) -> int:
        return self.size - self.current


def true_rate(peers: Iterable[PeerRates]) -> float | None:
    """Tuples one peer processes per second of useful time, over ``peers``; None if none
    was busy."""
    processed = useful = 0.0
    for peer in peers:
        processed += peer.processed
        useful += peer.useful
    if useful <= 0 or processed <= 0:
        return None
    return processed / useful


def _needed(offered: float, rate: float, utilisation: float) -> int:
    return max(1, math.ceil(offered / (rate * utilisation) - 1e-9))


def _busy_peers(work: float, utilisation: float) -> int:
    return max(1, math.ceil(work / utilisation - 1e-9))


def decide_size(
    current: int,
    peers: Iterable[PeerRates],
    arriving: float,
    backlog: float,
    policy: SizingPolicy,
) -> SizeDecision | None:
    """The participant's size for the load: ``arriving`` tuples/s at its inputs and
    ``backlog`` tuples waiting; ``peers``: the current peers' figures. None without a true
    rate (nothing was processed in the window) while something is offered."""
    if current < 1:
        raise ValueError(f"a participant has at least one peer, not {current}")
    if not (math.isfinite(arriving) and arriving >= 0 and math.isfinite(backlog) and backlog >= 0):
        raise ValueError("arriving and backlog must be numbers >= 0")
    peers = list(peers)
    rate = true_rate(peers)
    offered = arriving + backlog / policy.drain_s
    if rate is None and offered > 0:
        return None
    processed = math.fsum(p.processed for p in peers)
    work = math.fsum(p.useful for p in peers)
    overloaded = offered > processed * (1 + policy.slack) or (
        bool(peers) and work / len(peers) >= max(policy.saturated, policy.target)
    )
    # nothing processed and nothing offered: one peer is enough (clamped to MIN)
    grow_to = 1 if rate is None else _needed(offered, rate, policy.target)
    by_rate = 1 if rate is None else _needed(offered, rate, policy.shrink_at)
    size, reason = current, "within the dead band"
    if grow_to > current and overloaded:
        size, reason = grow_to, f"needs {grow_to} peers at {policy.target:.0%} utilisation"
    else:
        shrink: list[tuple[int, str]] = []
        if by_rate < current:
            shrink.append(
                (grow_to, f"{grow_to} peers stay under {policy.shrink_at:.0%} utilisation")
            )
        if not overloaded and _busy_peers(work, policy.shrink_at) < current:
            fewer = _busy_peers(work, policy.target)
            shrink.append((fewer, f"{work:.2f} peers' worth of busy time fits {fewer}"))
        if shrink:
            size, reason = min(shrink)
    clamped = min(policy.maximum, max(policy.minimum, size))
    if clamped != size:
        bound = "MAX" if clamped < size else "MIN"
        reason = f"{reason}; held at {bound} ({clamped})"
    return SizeDecision(current, clamped, offered, rate or 0.0, grow_to, reason)
