"""How many peers a participant needs (peer.elastic.sizing, pure): DS2's useful-time rule in
one step, and the dead band's properties under Hypothesis: a decision is final under a
constant load, the size stays within MIN:MAX, and it never falls as the load rises."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.elastic import PeerRates, SizingPolicy, decide_size, true_rate


def busy(*pairs: tuple[float, float]) -> list[PeerRates]:
    return [PeerRates(f"p{i}", processed, useful) for i, (processed, useful) in enumerate(pairs)]


def test_one_decision_reaches_the_size_the_true_rate_asks_for() -> None:
    # one peer, busy 40 % of the window at 20,000 tuples/s: 50,000 per busy second
    peers = busy((20_000, 0.4))
    assert true_rate(peers) == pytest.approx(50_000)
    policy = SizingPolicy(1, 8)
    decision = decide_size(1, peers, arriving=100_000, backlog=0, policy=policy)
    assert decision is not None
    # 100,000 / (50,000 x 0.7) = 2.86: three peers at once, not one more per round
    assert (decision.size, decision.needed, decision.change) == (3, 3, 2)
    assert "needs 3 peers at 70% utilisation" in decision.reason


def test_true_rate_weights_peers_by_their_busy_time() -> None:
    # 30,000/s at 0.6 busy and 10,000/s at 0.1: 40,000 tuples in 0.7 busy seconds
    assert true_rate(busy((30_000, 0.6), (10_000, 0.1))) == pytest.approx(40_000 / 0.7)
    assert true_rate(busy((0, 0.0), (0, 0.0))) is None
    assert decide_size(2, busy((0, 0.0)), 1_000, 0, SizingPolicy(1, 3)) is None


def test_a_backlog_counts_as_load_to_work_off_within_drain_s() -> None:
    policy = SizingPolicy(1, 10, drain_s=60)
    peers = busy((10_000, 0.5))  # 20,000 per busy second
    without = decide_size(1, peers, 10_000, 0, policy)
    with_backlog = decide_size(1, peers, 10_000, 1_200_000, policy)  # +20,000/s for 60 s
    assert without is not None and with_backlog is not None
    assert (without.size, with_backlog.size) == (1, 3)
    assert with_backlog.offered == pytest.approx(30_000)


def test_the_dead_band_keeps_a_size_that_is_neither_too_small_nor_wasteful() -> None:
    policy = SizingPolicy(1, 10, target=0.7, shrink_at=0.5)
    peers = busy((10_000, 1.0))  # 10,000 per busy second
    # 25,000/s: needed(0.7) = 4, needed(0.5) = 5: at 4 or 5 peers nothing changes
    for current in (4, 5):
        decision = decide_size(current, peers, 25_000, 0, policy)
        assert decision is not None and decision.size == current
    # at 6 peers even needed(0.5) = 5 is fewer: shrink to needed(0.7) = 4
    decision = decide_size(6, peers, 25_000, 0, policy)
    assert decision is not None and (decision.size, decision.change) == (4, -2)


def test_the_size_is_held_at_min_and_max_and_says_so() -> None:
    policy = SizingPolicy(2, 3)
    peers = busy((1_000, 1.0))
    high = decide_size(2, peers, 1_000_000, 0, policy)
    low = decide_size(3, peers, 10, 0, policy)
    assert high is not None and (high.size, high.needed) == (3, 1429)
    assert "held at MAX (3)" in high.reason
    assert low is not None and low.size == 2 and "held at MIN (2)" in low.reason


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: SizingPolicy(3, 2), "MIN <= MAX"),
        (lambda: SizingPolicy(0, 2), "1 <= MIN"),
        (lambda: SizingPolicy(1, 2, target=0.5, shrink_at=0.6), "shrink_at < target"),
        (lambda: SizingPolicy(1, 2, drain_s=math.nan), "drain_s"),
        (lambda: PeerRates("p", -1.0, 0.5), "processed"),
        (lambda: PeerRates("p", 10.0, -0.5), "useful"),
        (lambda: PeerRates("p", 10.0, math.nan), "useful"),
        (lambda: decide_size(0, busy((1, 1)), 1, 0, SizingPolicy(1, 2)), "at least one peer"),
        (lambda: decide_size(1, busy((1, 1)), -5, 0, SizingPolicy(1, 2)), "arriving"),
        (lambda: decide_size(1, busy((1, 1)), 5, math.inf, SizingPolicy(1, 2)), "backlog"),
    ],
)
def test_bad_figures_name_what_is_wrong(make: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()  # type: ignore[operator]


def policy(lo: int, span: int, target: float, gap: float) -> SizingPolicy:
    return SizingPolicy(lo, lo + span, target=target, shrink_at=target - gap)


policies = st.builds(
    policy,
    st.integers(1, 5),
    st.integers(0, 10),
    st.floats(0.3, 1.0),
    st.floats(0.05, 0.25),
)
peer_rates = st.builds(PeerRates, st.just("p"), st.floats(1, 1e6), st.floats(0.01, 1.0))
rates = st.lists(peer_rates, min_size=1, max_size=6)
loads = st.floats(0, 1e7)


@settings(max_examples=300, deadline=None)
@given(policies, rates, loads, st.floats(0, 1e8), st.integers(1, 20))
def test_a_decision_is_final_under_a_constant_load(
    policy: SizingPolicy, peers: list[PeerRates], arriving: float, backlog: float, current: int
) -> None:
    first = decide_size(current, peers, arriving, backlog, policy)
    assert first is not None
    again = decide_size(first.size, peers, arriving, backlog, policy)
    assert again is not None and again.size == first.size


@settings(max_examples=300, deadline=None)
@given(policies, rates, loads, st.integers(1, 20))
def test_the_size_stays_within_min_and_max(
    policy: SizingPolicy, peers: list[PeerRates], arriving: float, current: int
) -> None:
    decision = decide_size(current, peers, arriving, 0, policy)
    assert decision is not None and policy.minimum <= decision.size <= policy.maximum


@settings(max_examples=300, deadline=None)
@given(policies, rates, loads, loads, st.integers(1, 20))
def test_the_size_never_falls_as_the_load_rises(
    policy: SizingPolicy, peers: list[PeerRates], a: float, b: float, current: int
) -> None:
    low, high = sorted((a, b))
    smaller = decide_size(current, peers, low, 0, policy)
    larger = decide_size(current, peers, high, 0, policy)
    assert smaller is not None and larger is not None and smaller.size <= larger.size


def test_an_idle_participant_shrinks_to_min_and_an_unmeasured_load_decides_nothing() -> None:
    idle = decide_size(3, [], 0, 0, SizingPolicy(1, 3))
    assert idle is not None and idle.size == 1
    held = decide_size(3, [], 0, 0, SizingPolicy(2, 3))
    assert held is not None and held.size == 2 and "held at MIN (2)" in held.reason
    assert decide_size(1, [], 0, 0, SizingPolicy(1, 3)).size == 1  # type: ignore[union-attr]
    assert decide_size(2, [], 500, 0, SizingPolicy(1, 3)) is None


def test_a_trickle_does_not_grow_on_extrapolated_rates_and_its_busy_time_shrinks_it() -> None:
    policy = SizingPolicy(1, 3)
    # three peers, each busy 30 % on 10 tuples/s (micro-batches' fixed cost): the true rate
    # says 33 per busy second, so 30/s "needs" ceil(30 / 23.3) = 2 peers, while 0.9 peers'
    # worth of busy time fits ceil(0.9 / 0.7) = 2 and, busy 45 % then, ceil(0.9 / 0.5) = 2 < 3
    peers = busy((10, 0.3), (10, 0.3), (10, 0.3))
    decision = decide_size(3, peers, 30, 0, policy)
    assert decision is not None and decision.size == 2
    # one peer 87 % busy on a trickle it keeps up with is not overloaded: it stays one
    alone = decide_size(1, busy((15, 0.87)), 15, 0, policy)
    assert alone is not None and alone.size == 1
    # the same peer with its backlog growing is: it grows on its true rate
    behind = decide_size(1, busy((15, 0.87)), 30, 0, policy)
    assert behind is not None and behind.size == 3


def test_busy_time_shrinks_a_participant_whose_rates_look_low() -> None:
    # two peers, 15 % busy each, keeping up: work 0.3 fits one peer at 70 %
    decision = decide_size(2, busy((5, 0.15), (5, 0.15)), 10, 0, SizingPolicy(1, 3))
    assert decision is not None and decision.size == 1 and "busy time fits 1" in decision.reason
