"""The bounded-price mechanism: when a peer offers boxes to a partner, and what the partner takes.

Theory of operation
-------------------
Medusa's participants move load only along pairwise contracts that fix a price per unit of
load. Each peer prices its own load with a convex cost of its utilisation ``u`` (load over
capacity), ``D(u) = u / (1 - u)``: the queueing delay of an M/M/1 server. Running a set of boxes
with load ``L`` costs a peer ``D(u) - D(u - L)`` (what it saves by moving them away) or
``D(u + L) - D(u)`` (what it adds by taking them on); divided by ``L`` that is the *unit cost*
of the set, the average marginal cost per unit of load. Both sides then compare unit costs with
the contract's price:

- the offerer moves a set when its unit cost of keeping it exceeds ``price * (1 + offer_margin)``:
  the saving is worth more than the payment;
- the partner takes boxes while its unit cost of taking them stays below
  ``price * (1 - accept_margin)``: the payment is worth more than the extra cost.

So a price ``p`` stands for a utilisation: a peer sheds load above the level where its marginal
cost reaches ``p`` and takes load below it. Every move goes from a peer whose unit cost is above
``p`` to one whose unit cost is below it, so the sum of all peers' costs strictly falls with
each move, and the federation cannot cycle. A contract priced in a range is viewed at its
upper bound (``ContractView.price``): the offerer moves only load that is worth moving at any
price the contract allows, and the partner decides at the best price the contract offers it.

Above ``cost_cap_util`` (0.99 by default) ``D`` goes on as its second-order Taylor polynomial:
finite at and above saturation (a peer at 150 % still has a cost to compare), continuous,
convex, with a marginal cost that keeps rising. Over capacity, the marginal cost is at least
``1 / (1 - cost_cap_util)**2`` (10,000), far above any sensible price.

Decisions (pure functions, no I/O; the brain calls them each ``period_s``):

- ``choose_offer``: at most one offer in flight per peer. Contracts are tried cheapest first;
  partners that refused or failed go last, the longest-ago refusal first. The first contract for
  which a set exists gets the offer. The set is chosen greedily by load, at most
  ``max_offer_boxes`` boxes of kinds the contract covers: a box joins while the set stays worth
  shedding and stays below what an idle partner could take at that price. A partner that has
  not refused is offered the largest boxes first (few boxes move much load); one that refused
  had no room for those, so it is offered the smallest first.
- ``accept``: the partner takes a *subset*: the offered boxes in the offer's order, each kept if
  the taken set stays below the price. An over-large offer is cut down rather than refused
  whole. Shedding part of a set is still worth it to the offerer, because the cost is convex:
  the boxes left behind are the ones at the cheap end of the interval.
- ``remember_outcome``: the refusal memory that ``choose_offer`` reads.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CONFIG",
    "Box",
    "BpmConfig",
    "BpmError",
    "ContractView",
    "Offer",
    "PeerState",
    "accept",
    "choose_offer",
    "cost",
    "marginal_cost",
    "max_offer_load",
    "offer_order",
    "remember_outcome",
    "unit_shed_cost",
    "unit_take_cost",
]


class BpmError(ValueError):
    """A configuration, box, contract view or peer state that the mechanism cannot work with."""


@dataclass(frozen=True, slots=True)
class BpmConfig:
    """How a peer runs the mechanism. Margins are fractions of the contract price."""

    period_s: float = 5.0  # how often the brain measures load and considers an offer
    offer_timeout_s: float = 10.0  # an unanswered offer counts as failed after this
    offer_margin: float = 0.05  # offer when unit cost > price * (1 + offer_margin)
    accept_margin: float = 0.05  # take while unit cost < price * (1 - accept_margin)
    max_offer_boxes: int = 8  # bound on the size of one offer
    cost_cap_util: float = 0.99  # D(u) = u / (1 - u) up to here, its Taylor polynomial above

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and self.offer_timeout_s > 0):
            raise BpmError("period_s and offer_timeout_s must be positive")
        if not (0 <= self.offer_margin < 1 and 0 <= self.accept_margin < 1):
            raise BpmError("offer_margin and accept_margin must be fractions in [0, 1)")
        if self.max_offer_boxes < 1:
            raise BpmError("max_offer_boxes must be at least 1")
        if not 0 < self.cost_cap_util < 1:
            raise BpmError("cost_cap_util must lie in (0, 1)")


DEFAULT_CONFIG = BpmConfig()
_LOAD = operator.attrgetter("load")


@dataclass(frozen=True, slots=True)
class Box:
    """A movable unit of work (a fragment): its load is in the same unit as capacity."""

    name: str
    kind: str
    load: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load) and self.load >= 0):
            raise BpmError(f"box {self.name!r}: load must be finite and >= 0, not {self.load}")


@dataclass(frozen=True, slots=True)
class ContractView:
    """One peer's view of one contract: the partner, the price per unit load and what it covers.

    ``kinds`` is the set of box kinds the contract lets move to the holder of the other side;
    ``None`` covers every kind.
    """

    partner: str
    price: float
    kinds: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.price) and self.price > 0):
            raise BpmError(f"contract with {self.partner!r}: price must be finite and > 0")

    def covers(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclass(frozen=True, slots=True)
class PeerState:
    """A peer's measured load, its capacity and the boxes it could move."""

    load: float
    boxes: tuple[Box, ...] = ()
    capacity: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load) and self.load >= 0):
            raise BpmError(f"load must be finite and >= 0, not {self.load}")
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise BpmError(f"capacity must be finite and > 0, not {self.capacity}")

    @property
    def utilisation(self) -> float:
        return self.load / self.capacity


@dataclass(frozen=True, slots=True)
class Offer:
    """Boxes offered to ``partner`` at ``price`` per unit load; ``unit_cost`` is the offerer's."""

    partner: str
    price: float
    boxes: tuple[Box, ...]
    unit_cost: float

    @property
    def load(self) -> float:
        return math.fsum(b.load for b in self.boxes)


# --------------------------------------------------------------------------- cost


def cost(u: float, cap_util: float = DEFAULT_CONFIG.cost_cap_util) -> float:
    """D(u) = u / (1 - u), continued above ``cap_util`` by its second-order Taylor polynomial."""
    if u <= cap_util:
        return u / (1.0 - u)
    r, d = 1.0 - cap_util, u - cap_util
    return cap_util / r + d / r**2 + d * d / r**3


def marginal_cost(u: float, cap_util: float = DEFAULT_CONFIG.cost_cap_util) -> float:
    """D'(u): the cost of one more unit of utilisation at ``u``."""
    if u <= cap_util:
        return 1.0 / (1.0 - u) ** 2
    r = 1.0 - cap_util
    return 1.0 / r**2 + 2.0 * (u - cap_util) / r**3


def unit_shed_cost(
    state: PeerState, amount: float, cap_util: float = DEFAULT_CONFIG.cost_cap_util
) -> float:
    """(D(u) - D(u - amount/capacity)) / amount: what each unit of ``amount`` costs to keep."""
    c = state.capacity
    u = state.load / c
    if amount <= 0:
        return marginal_cost(u, cap_util) / c
    return (cost(u, cap_util) - cost(u - amount / c, cap_util)) / amount


def unit_take_cost(
    state: PeerState, amount: float, cap_util: float = DEFAULT_CONFIG.cost_cap_util
) -> float:
    """(D(u + amount/capacity) - D(u)) / amount: what each unit of ``amount`` costs to take."""
    c = state.capacity
    u = state.load / c
    if amount <= 0:
        return marginal_cost(u, cap_util) / c
    return (cost(u + amount / c, cap_util) - cost(u, cap_util)) / amount


def max_offer_load(price: float, *, capacity: float, config: BpmConfig = DEFAULT_CONFIG) -> float:
    """The most load an idle partner of this capacity could take at ``price``; 0 if none.

    An idle partner takes ``L`` while ``D(L/c) / L < price * (1 - accept_margin)``, that is while
    ``L < c * (1 - 1 / (c * q))`` with ``q`` the discounted price. The bound is cut at
    ``cost_cap_util`` (so it errs on the small side for very high prices).
    """
    cq = capacity * price * (1.0 - config.accept_margin)
    if cq <= 1.0:
        return 0.0
    return capacity * min(1.0 - 1.0 / cq, config.cost_cap_util)


# --------------------------------------------------------------------------- decisions


def offer_order(
    contracts: Iterable[ContractView], refused_or_failed: Collection[str] = ()
) -> list[ContractView]:
    """Cheapest contract first; partners that refused or failed go last.

    Given as a sequence (oldest first, as ``remember_outcome`` keeps it), the partners that
    refused are tried in that order, so that they take turns; given as a set, cheapest first.
    """
    if isinstance(refused_or_failed, Sequence):
        rank = {p: i + 1 for i, p in enumerate(refused_or_failed)}
    else:
        rank = dict.fromkeys(refused_or_failed, 1)
    return sorted(contracts, key=lambda c: (rank.get(c.partner, 0), c.price, c.partner))


def _offer_for(
    state: PeerState,
    contract: ContractView,
    candidates: Sequence[Box],
    config: BpmConfig,
    *,
    ascending: bool,
) -> Offer | None:
    threshold = contract.price * (1.0 + config.offer_margin)
    limit = max_offer_load(contract.price, capacity=state.capacity, config=config)
    chosen: list[Box] = []
    total = 0.0
    unit = 0.0
    for box in candidates:
        if len(chosen) == config.max_offer_boxes:
            break
        if not contract.covers(box.kind):
            continue
        new_total = total + box.load
        # A larger set has a lower unit cost (D is convex): with the smallest boxes first, the
        # first box that does not fit means that none of the later ones does.
        if new_total >= limit:
            if ascending:
                break
            continue
        new_unit = unit_shed_cost(state, new_total, config.cost_cap_util)
        if new_unit <= threshold:
            if ascending:
                break
            continue
        chosen.append(box)
        total, unit = new_total, new_unit
    if not chosen:
        return None
    return Offer(contract.partner, contract.price, tuple(chosen), unit)


def choose_offer(
    state: PeerState,
    contracts: Iterable[ContractView],
    *,
    config: BpmConfig = DEFAULT_CONFIG,
    refused_or_failed: Collection[str] = (),
    in_flight: bool = False,
) -> Offer | None:
    """The one offer this peer should make now, or None.

    None while an offer or move is ``in_flight``, when no contract's price is below the peer's
    marginal cost (plus margin), or when no covered box makes a set worth shedding.
    """
    if in_flight or not state.boxes:
        return None
    # D is convex, so no set's unit cost exceeds the marginal cost at the current load: the
    # contracts priced at or above it are out before any box is looked at, and a peer under
    # every price (the common case) is done at once.
    top = marginal_cost(state.utilisation, config.cost_cap_util) / state.capacity
    worth = [c for c in contracts if top > c.price * (1.0 + config.offer_margin)]
    if not worth:
        return None
    # Equal loads keep the state's order (a stable sort), which keeps offers deterministic.
    largest_first = sorted([b for b in state.boxes if b.load > 0], key=_LOAD, reverse=True)
    smallest_first = largest_first[::-1]
    for contract in offer_order(worth, refused_or_failed):
        # A partner that refused had no room for what it was offered: offer it small boxes.
        if contract.partner in refused_or_failed:
            offer = _offer_for(state, contract, smallest_first, config, ascending=True)
        else:
            offer = _offer_for(state, contract, largest_first, config, ascending=False)
        if offer is not None:
            return offer
    return None


def accept(
    state: PeerState,
    offer: Offer,
    contract: ContractView,
    *,
    config: BpmConfig = DEFAULT_CONFIG,
    busy: bool = False,
) -> tuple[Box, ...]:
    """The boxes of ``offer`` this peer takes (possibly none), given its view of the contract.

    Nothing while this peer has a move in flight (``busy``) or when the offer pays less than the
    contract's price. Otherwise the offered boxes are taken in the offer's order, skipping those
    the contract does not cover, repeated names, and any box that would lift the unit cost of the
    taken set to ``offer.price * (1 - accept_margin)`` or above.
    """
    if busy or offer.price < contract.price:
        return ()
    threshold = offer.price * (1.0 - config.accept_margin)
    taken: list[Box] = []
    seen: set[str] = set()
    total = 0.0
    for box in offer.boxes:
        if box.name in seen or box.load <= 0 or not contract.covers(box.kind):
            continue
        seen.add(box.name)
        new_total = total + box.load
        if unit_take_cost(state, new_total, config.cost_cap_util) < threshold:
            taken.append(box)
            total = new_total
    return tuple(taken)


def remember_outcome(
    refused_or_failed: Sequence[str], partner: str, *, accepted: bool
) -> tuple[str, ...]:
    """The refusal memory after an offer to ``partner``, oldest refusal first.

    A partner that took something is forgotten. One that refused (or failed) moves to the end:
    it goes last, and the partners that refused take turns. Forgetting old refusals as time
    passes is up to the caller.
    """
    rest = tuple(p for p in refused_or_failed if p != partner)
    return rest if accepted else (*rest, partner)
