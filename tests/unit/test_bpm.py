"""contracts.bpm: the bounded-price mechanism's cost, offer and acceptance decisions."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contracts.bpm import (
    DEFAULT_CONFIG,
    Box,
    BpmConfig,
    BpmError,
    ContractView,
    Offer,
    PeerState,
    accept,
    choose_offer,
    cost,
    marginal_cost,
    max_offer_load,
    offer_order,
    remember_outcome,
    unit_shed_cost,
    unit_take_cost,
)

KINDS = ("filter", "map", "aggregate", "join")
CFG = DEFAULT_CONFIG
CAP = CFG.cost_cap_util


# --------------------------------------------------------------------------- strategies


@st.composite
def boxes(draw: st.DrawFn, max_size: int = 12) -> tuple[Box, ...]:
    loads = draw(st.lists(st.floats(0.001, 0.2), min_size=0, max_size=max_size))
    return tuple(Box(f"b{i}", draw(st.sampled_from(KINDS)), load) for i, load in enumerate(loads))


@st.composite
def states(draw: st.DrawFn) -> PeerState:
    bs = draw(boxes())
    other = draw(st.floats(0.0, 1.2))  # load that is not movable (input backlog, pinned boxes)
    return PeerState(math.fsum(b.load for b in bs) + other, bs)


kind_sets = st.one_of(st.none(), st.frozensets(st.sampled_from(KINDS), min_size=1))
prices = st.floats(1.5, 5000.0)


@st.composite
def contract_lists(draw: st.DrawFn) -> list[ContractView]:
    n = draw(st.integers(1, 6))
    return [ContractView(f"p{i}", draw(prices), draw(kind_sets)) for i in range(n)]


@st.composite
def offers(draw: st.DrawFn) -> Offer:
    bs = draw(boxes(max_size=8).filter(bool))
    return Offer("me", draw(prices), bs, math.inf)


def taken_load(bs: tuple[Box, ...]) -> float:
    return math.fsum(b.load for b in bs)


# --------------------------------------------------------------------------- cost


def test_cost_is_u_over_one_minus_u_below_the_cap() -> None:
    assert cost(0.0) == 0.0
    assert cost(0.5) == pytest.approx(1.0)
    assert cost(0.9) == pytest.approx(9.0)
    assert marginal_cost(0.9) == pytest.approx(100.0)


def test_cost_is_finite_and_continuous_at_and_above_saturation() -> None:
    assert cost(CAP) == pytest.approx(cost(CAP - 1e-12), rel=1e-6)
    assert cost(CAP + 1e-12) == pytest.approx(cost(CAP), rel=1e-6)
    assert marginal_cost(CAP + 1e-12) == pytest.approx(marginal_cost(CAP), rel=1e-6)
    for u in (1.0, 1.5, 3.0, 100.0):
        assert math.isfinite(cost(u)) and math.isfinite(marginal_cost(u))
    # Over capacity, the marginal cost is beyond any sensible price.
    assert marginal_cost(1.0) > 1e4


@given(st.floats(-0.5, 3.0), st.floats(1e-4, 1.0))
def test_cost_is_increasing_and_convex(u: float, d: float) -> None:
    assert cost(u + d) > cost(u)
    assert marginal_cost(u + d) > marginal_cost(u)
    # The slope of a chord lies between the marginal costs at its ends.
    chord = (cost(u + d) - cost(u)) / d
    assert marginal_cost(u) * (1 - 1e-9) <= chord <= marginal_cost(u + d) * (1 + 1e-9)


@given(st.floats(0.0, 2.0), st.floats(1e-3, 0.5), st.floats(1e-3, 0.5))
def test_unit_costs_are_monotone(load: float, a: float, b: float) -> None:
    small, large = sorted((a, b))
    assume(large - small > 1e-6)
    low, high = PeerState(load), PeerState(load + 0.05)
    # Taking more costs more per unit; shedding more saves less per unit (D is convex).
    assert unit_take_cost(low, large) >= unit_take_cost(low, small)
    assert unit_shed_cost(low, large) <= unit_shed_cost(low, small)
    # A busier peer pays more per unit for either.
    assert unit_take_cost(high, small) > unit_take_cost(low, small)
    assert unit_shed_cost(high, small) > unit_shed_cost(low, small)


def test_unit_costs_scale_with_capacity() -> None:
    # A peer twice as large at the same utilisation pays half as much per unit of load.
    one, two = PeerState(0.5, capacity=1.0), PeerState(1.0, capacity=2.0)
    assert unit_take_cost(two, 0.2) == pytest.approx(unit_take_cost(one, 0.1) / 2)
    assert unit_shed_cost(two, 0.0) == pytest.approx(marginal_cost(0.5) / 2)


def test_max_offer_load() -> None:
    # An idle partner takes L while 1 / (1 - L) < price * (1 - accept_margin).
    assert max_offer_load(1.0, capacity=1.0) == 0.0
    q = 20 * (1 - CFG.accept_margin)
    limit = max_offer_load(20, capacity=1.0)
    assert limit == pytest.approx(1 - 1 / q)
    assert (
        unit_take_cost(PeerState(0.0), 0.99 * limit)
        < q
        < unit_take_cost(PeerState(0.0), 1.01 * limit)
    )
    # Beyond cost_cap_util the bound is cut there.
    assert max_offer_load(400, capacity=1.0) == CAP


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs",
    [
        {"period_s": 0},
        {"offer_timeout_s": -1},
        {"offer_margin": 1.0},
        {"accept_margin": -0.1},
        {"max_offer_boxes": 0},
        {"cost_cap_util": 1.0},
    ],
)
def test_config_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(BpmError):
        BpmConfig(**kwargs)  # type: ignore[arg-type]


def test_data_refuses_nonsense() -> None:
    with pytest.raises(BpmError, match="b1"):
        Box("b1", "filter", -0.1)
    with pytest.raises(BpmError, match="acme"):
        ContractView("acme", 0.0)
    with pytest.raises(BpmError):
        PeerState(math.nan)
    with pytest.raises(BpmError):
        PeerState(0.5, capacity=0)


# --------------------------------------------------------------------------- choose_offer


def hot(load: float = 1.2, n: int = 24, kind: str = "filter") -> PeerState:
    bs = tuple(Box(f"b{i}", kind, load / n) for i in range(n))
    return PeerState(load, bs)


def test_an_overloaded_peer_offers_to_the_cheapest_partner() -> None:
    contracts = [ContractView("b", 120.0), ContractView("a", 100.0), ContractView("c", 300.0)]
    offer = choose_offer(hot(), contracts)
    assert offer is not None
    assert (offer.partner, offer.price) == ("a", 100.0)
    assert offer.unit_cost > 100.0 * (1 + CFG.offer_margin)
    assert 0 < len(offer.boxes) <= CFG.max_offer_boxes


def test_a_peer_under_every_price_makes_no_offer() -> None:
    assert choose_offer(hot(load=0.5), [ContractView("a", 100.0)]) is None
    assert choose_offer(PeerState(1.5), [ContractView("a", 100.0)]) is None  # nothing movable
    assert choose_offer(hot(), []) is None


def test_one_offer_in_flight() -> None:
    assert choose_offer(hot(), [ContractView("a", 100.0)], in_flight=True) is None


def test_refused_partners_go_last_and_take_turns() -> None:
    contracts = [ContractView("a", 100.0), ContractView("b", 110.0), ContractView("c", 120.0)]
    order = [c.partner for c in offer_order(contracts, ("a",))]
    assert order == ["b", "c", "a"]
    assert [c.partner for c in offer_order(contracts, ("c", "a"))] == ["b", "c", "a"]
    assert [c.partner for c in offer_order(contracts, {"a", "b"})] == ["c", "a", "b"]
    offer = choose_offer(hot(), contracts, refused_or_failed=("a",))
    assert offer is not None and offer.partner == "b"


def test_a_partner_that_refused_is_offered_the_smallest_boxes() -> None:
    bs = tuple(Box(f"b{i}", "filter", 0.01 * (i + 1)) for i in range(10))
    state = PeerState(1.3, bs)
    fresh = choose_offer(state, [ContractView("a", 100.0)])
    again = choose_offer(state, [ContractView("a", 100.0)], refused_or_failed=("a",))
    assert fresh is not None and again is not None
    assert fresh.boxes[0].load == 0.1  # largest first
    assert again.boxes[0].load == 0.01  # smallest first


def test_remember_outcome() -> None:
    memory = remember_outcome((), "a", accepted=False)
    memory = remember_outcome(memory, "b", accepted=False)
    assert memory == ("a", "b")
    assert remember_outcome(memory, "a", accepted=False) == ("b", "a")
    assert remember_outcome(memory, "a", accepted=True) == ("b",)
    assert remember_outcome(memory, "z", accepted=True) == memory


def test_only_covered_kinds_are_offered() -> None:
    state = PeerState(1.3, (Box("j", "join", 0.3), Box("f", "filter", 0.05)))
    offer = choose_offer(state, [ContractView("a", 100.0, frozenset({"filter"}))])
    assert offer is not None and [b.name for b in offer.boxes] == ["f"]
    assert choose_offer(state, [ContractView("a", 100.0, frozenset({"map"}))]) is None


def test_an_offer_no_partner_could_take_is_not_made() -> None:
    # At a price of 1 per unit, even an idle partner's cost of the first unit exceeds the price.
    assert choose_offer(hot(load=1.5), [ContractView("a", 1.0)]) is None


@settings(max_examples=300)
@given(states(), contract_lists(), st.lists(st.sampled_from([f"p{i}" for i in range(6)])))
def test_offer_properties(
    state: PeerState, contracts: list[ContractView], refused: list[str]
) -> None:
    memory = tuple(dict.fromkeys(refused))
    offer = choose_offer(state, contracts, refused_or_failed=memory)
    if offer is None:
        # Nothing at all was worth offering: no single covered box on any contract.
        for c in contracts:
            limit = max_offer_load(c.price, capacity=state.capacity)
            for b in state.boxes:
                if c.covers(b.kind) and 0 < b.load < limit:
                    assert unit_shed_cost(state, b.load, CAP) <= c.price * (1 + CFG.offer_margin)
        return
    chosen = next(c for c in contracts if c.partner == offer.partner)
    assert offer.price == chosen.price
    # Only boxes the peer has, of kinds the contract covers, each once, within the bound.
    assert set(offer.boxes) <= set(state.boxes)
    assert len({b.name for b in offer.boxes}) == len(offer.boxes) <= CFG.max_offer_boxes
    assert all(chosen.covers(b.kind) for b in offer.boxes)
    # Worth it: shedding the set saves more per unit than the price plus margin.
    assert unit_shed_cost(state, offer.load, CAP) > offer.price * (1 + CFG.offer_margin)
    assert offer.load < max_offer_load(offer.price, capacity=state.capacity)
    # Cheapest first, refused last: every contract ordered before the chosen one has no offer.
    for c in offer_order(contracts, memory):
        if c.partner == offer.partner:
            break
        assert choose_offer(state, [c], refused_or_failed=memory) is None


@given(states(), contract_lists(), st.floats(0.001, 1.0))
def test_more_load_never_stops_an_offer(
    state: PeerState, contracts: list[ContractView], extra: float
) -> None:
    busier = PeerState(state.load + extra, state.boxes)
    if choose_offer(state, contracts) is not None:
        assert choose_offer(busier, contracts) is not None


@given(states(), contract_lists(), st.floats(1.01, 3.0))
def test_a_lower_price_never_stops_an_offer(
    state: PeerState, contracts: list[ContractView], factor: float
) -> None:
    if choose_offer(state, contracts) is not None:
        cheaper = [ContractView(c.partner, c.price / factor, c.kinds) for c in contracts]
        # A lower price also lowers what an idle partner could take: compare within reach.
        assume(all(max_offer_load(c.price, capacity=1.0) > 0.25 for c in cheaper))
        assert choose_offer(state, cheaper) is not None


# --------------------------------------------------------------------------- accept


def test_an_idle_partner_takes_the_whole_offer() -> None:
    offer = choose_offer(hot(), [ContractView("a", 100.0)])
    assert offer is not None
    assert accept(PeerState(0.2), offer, ContractView("me", 100.0)) == offer.boxes


def test_a_partner_near_the_price_takes_what_fits() -> None:
    bs = (Box("big", "filter", 0.2), Box("small", "filter", 0.01))
    offer = Offer("b", 100.0, bs, math.inf)
    assert accept(PeerState(0.85), offer, ContractView("a", 100.0)) == (bs[1],)
    assert accept(PeerState(0.95), offer, ContractView("a", 100.0)) == ()


def test_accept_refuses_underpaid_offers_and_while_busy() -> None:
    offer = Offer("b", 90.0, (Box("x", "filter", 0.01),), math.inf)
    assert accept(PeerState(0.1), offer, ContractView("a", 100.0)) == ()
    fair = Offer("b", 100.0, offer.boxes, math.inf)
    assert accept(PeerState(0.1), fair, ContractView("a", 100.0), busy=True) == ()
    assert accept(PeerState(0.1), fair, ContractView("a", 100.0)) == offer.boxes


def test_accept_skips_uncovered_kinds_and_repeated_boxes() -> None:
    x = Box("x", "filter", 0.01)
    offer = Offer("b", 100.0, (Box("j", "join", 0.01), x, x), math.inf)
    assert accept(PeerState(0.1), offer, ContractView("a", 100.0, frozenset({"filter"}))) == (x,)


@settings(max_examples=300)
@given(st.floats(0.0, 1.5), offers(), kind_sets)
def test_accept_never_takes_load_that_costs_more_than_the_price(
    load: float, offer: Offer, kinds: frozenset[str] | None
) -> None:
    state = PeerState(load)
    contract = ContractView("me", offer.price, kinds)
    taken = accept(state, offer, contract)
    assert set(taken) <= set(offer.boxes)
    assert all(contract.covers(b.kind) for b in taken)
    if taken:
        unit = unit_take_cost(state, taken_load(taken), CAP)
        assert unit < offer.price * (1 - CFG.accept_margin) < offer.price
        # So the payment covers the partner's extra cost.
        assert cost(load + taken_load(taken)) - cost(load) < offer.price * taken_load(taken)


@given(st.floats(0.0, 1.2), st.floats(0.001, 0.5), offers())
def test_a_less_busy_partner_takes_something_whenever_a_busier_one_does(
    load: float, less: float, offer: Offer
) -> None:
    contract = ContractView("me", offer.price)
    if accept(PeerState(load + less), offer, contract):
        assert accept(PeerState(load), offer, contract)


@given(st.floats(0.0, 1.2), offers(), st.floats(1.0, 3.0))
def test_a_better_price_never_stops_acceptance(load: float, offer: Offer, factor: float) -> None:
    contract = ContractView("me", offer.price)
    richer = Offer(offer.partner, offer.price * factor, offer.boxes, offer.unit_cost)
    if accept(PeerState(load), offer, contract):
        assert accept(PeerState(load), richer, contract)


# --------------------------------------------------------------------------- moves


@settings(max_examples=300)
@given(states(), st.floats(0.0, 1.2), contract_lists())
def test_every_move_lowers_the_federations_cost(
    offerer: PeerState, taker_load: float, contracts: list[ContractView]
) -> None:
    offer = choose_offer(offerer, contracts)
    assume(offer is not None)
    assert offer is not None
    taken = accept(PeerState(taker_load), offer, ContractView("me", offer.price))
    assume(taken)
    moved = taken_load(taken)
    before = cost(offerer.utilisation) + cost(taker_load)
    after = cost(offerer.utilisation - moved) + cost(taker_load + moved)
    assert after < before
    # Both sides gain at the contract price: the offerer saves more than it pays.
    assert cost(offerer.utilisation) - cost(offerer.utilisation - moved) > offer.price * moved


# --------------------------------------------------------------------------- simulation


def test_the_simulation_uses_this_code_and_settles(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import bpm_sim
    finally:
        sys.path.pop(0)
    # The simulation decides with the library's functions, not copies of them.
    decides = bpm_sim.run.__globals__
    assert decides["choose_offer"] is choose_offer and decides["accept"] is accept
    spec = bpm_sim.RunSpec(
        scenario=bpm_sim.SCENARIOS["moderate"],
        nodes=120,
        contracts=8,
        width=0.25,
        seed=0,
        base_price=marginal_cost(0.95),
        box_load=(0.005, 0.05),
        max_rounds=100,
        config=BpmConfig(),
    )
    result = bpm_sim.run(spec)
    assert result["converged"]
    assert result["final_excess"] < 0.2 * result["initial_excess"]
    assert result["moves"] > 0
    series = [s["excess"] for s in result["series"]]
    assert series[-1] <= series[0]
