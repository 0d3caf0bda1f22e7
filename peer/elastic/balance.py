"""Balancing inside a participant, without prices (pure): when a peer hands load to another.

Theory of operation
-------------------
Between participants load moves under contracts at a price (``peer.brain``). Between the
peers of one participant nothing needs pricing: they serve one owner, so a peer simply hands
load to a less loaded sibling, as Aurora* slides boxes between the nodes of one domain and
Stormy's nodes compare their load with their neighbours' and hand over part of their range.

Each peer decides for itself, every round, from its participant's utilisations (each peer's
busy cores over its capacity, as the peers gossip them): :func:`plan_handover`.

- **When.** This peer's utilisation has stayed above the least loaded live sibling's by at
  least ``margin`` (0.2) in each of the last ``rounds`` (2) rounds: one busy round is noise.
- **To whom.** The least loaded sibling of the latest round (ties: the least node id, so two
  peers deciding at once pick the same one).
- **How much.** Fragments (lane members included) whose costs, in cores, fit into half the
  gap: moving ``x`` cores from this peer (capacity ``c``) to the target (capacity ``t``)
  leaves this peer at ``u - x/c`` and the target at ``v + x/t``; they may at most meet, so
  ``x <= (u - v) / (1/c + 1/t)``. Then the target never ends hotter than this peer was left,
  and the two cannot hand the same load back and forth. The largest fragments that fit are
  taken first (fewest moves). A peer whose every fragment is too big to fit moves nothing:
  moving its one big fragment would only swap which peer is hot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Handover", "plan_handover"]


@dataclass(frozen=True)
class Handover:
    """Move ``fragments`` (their costs: ``cores``) from ``source`` to ``target``."""

    source: str
    target: str
    fragments: tuple[str, ...]
    cores: float
    reason: str


def plan_handover(
    me: str,
    rounds_seen: Sequence[Mapping[str, float]],
    capacity: Mapping[str, float],
    costs: Mapping[str, float],
    *,
    margin: float = 0.2,
    rounds: int = 2,
) -> Handover | None:
    """What this peer (``me``) hands over now, if anything.

    ``rounds_seen``: the utilisations of the participant's live peers, one mapping per round,
    oldest first; ``capacity``: each peer's cores; ``costs``: the cores each movable fragment
    of this peer uses."""
    if not (math.isfinite(margin) and margin > 0) or rounds < 1:
        raise ValueError("margin must be a number > 0 and rounds at least 1")
    recent = list(rounds_seen)[-rounds:]
    if len(recent) < rounds:
        return None
    for seen in recent:
        others = {n: u for n, u in seen.items() if n != me}
        if me not in seen or not others or seen[me] - min(others.values()) < margin:
            return None
    latest = recent[-1]
    mine = latest[me]
    target = min((u, n) for n, u in latest.items() if n != me)[1]
    gap = mine - latest[target]
    mine_c, theirs_c = capacity.get(me, 0.0), capacity.get(target, 0.0)
    if mine_c <= 0 or theirs_c <= 0:
        return None
    room = gap / (1 / mine_c + 1 / theirs_c)
    chosen: list[str] = []
    total = 0.0
    for fragment, cost in sorted(costs.items(), key=lambda item: (-item[1], item[0])):
        if cost > 0 and total + cost <= room:
            chosen.append(fragment)
            total += cost
    if not chosen:
        return None
    reason = (
        f"{me} at {mine:.0%} vs {target} at {latest[target]:.0%} for {rounds} rounds "
        f"(margin {margin:.0%}); moving {total:.2f} of {room:.2f} cores that fit"
    )
    return Handover(me, target, tuple(chosen), total, reason)
