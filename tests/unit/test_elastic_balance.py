"""Balancing inside a participant (peer.elastic.balance, pure): a peer hot for two rounds
hands the fragments that fit into half the gap to its least loaded sibling; under Hypothesis
a hand-over never leaves the target hotter than the source, never raises the hotter of the
two, and never moves more than fits."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.elastic import plan_handover

CAP = {"a": 2.0, "b": 2.0, "c": 2.0}


def test_a_peer_hot_for_two_rounds_hands_what_fits_to_the_least_loaded() -> None:
    seen = [{"a": 0.9, "b": 0.5, "c": 0.3}, {"a": 0.9, "b": 0.6, "c": 0.2}]
    costs = {"f1": 0.5, "f2": 0.3, "f3": 0.2}
    handover = plan_handover("a", seen, CAP, costs)
    # gap 0.7 at 2 cores each: 0.7 / (1/2 + 1/2) = 0.7 cores fit; largest first: f1, then f3
    assert handover is not None
    assert (handover.source, handover.target, handover.fragments) == ("a", "c", ("f1", "f3"))
    assert handover.cores == pytest.approx(0.7)
    assert "a at 90% vs c at 20% for 2 rounds" in handover.reason


def test_one_hot_round_or_a_small_gap_moves_nothing() -> None:
    costs = {"f1": 0.2}
    assert plan_handover("a", [{"a": 0.9, "b": 0.2}], CAP, costs) is None  # one round only
    calm_then_hot = [{"a": 0.5, "b": 0.4}, {"a": 0.9, "b": 0.2}]
    assert plan_handover("a", calm_then_hot, CAP, costs) is None
    close = [{"a": 0.6, "b": 0.45}, {"a": 0.6, "b": 0.45}]  # 0.15 < margin 0.2
    assert plan_handover("a", close, CAP, costs) is None
    alone = [{"a": 0.99}, {"a": 0.99}]  # no sibling
    assert plan_handover("a", alone, CAP, costs) is None


def test_a_peer_whose_one_fragment_is_the_whole_load_keeps_it() -> None:
    # moving f1 (1.6 of 2 cores) would only make the other peer the hot one
    seen = [{"a": 0.9, "b": 0.1}, {"a": 0.9, "b": 0.1}]
    assert plan_handover("a", seen, CAP, {"f1": 1.6}) is None


def test_capacities_scale_what_fits_and_ties_pick_the_least_node() -> None:
    seen = [{"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 0.0, "c": 0.0}]
    # a has 1 core, b and c 3: x/1 + x/3 <= 1.0 -> x <= 0.75
    capacity = {"a": 1.0, "b": 3.0, "c": 3.0}
    handover = plan_handover("a", seen, capacity, {"f1": 0.7, "f2": 0.1})
    assert handover is not None and handover.target == "b" and handover.fragments == ("f1",)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="margin"):
        plan_handover("a", [], CAP, {}, margin=0)
    with pytest.raises(ValueError, match="rounds"):
        plan_handover("a", [], CAP, {}, rounds=0)


utilisation = st.floats(0, 1.5)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(utilisation, utilisation, utilisation), min_size=2, max_size=4),
    st.dictionaries(st.sampled_from(list("fghijk")), st.floats(0.01, 2.0), max_size=6),
    st.tuples(st.floats(0.5, 8), st.floats(0.5, 8), st.floats(0.5, 8)),
)
def test_a_handover_never_swaps_who_is_hot_nor_raises_the_hotter(
    rounds: list[tuple[float, float, float]],
    costs: dict[str, float],
    cores: tuple[float, float, float],
) -> None:
    seen = [dict(zip("abc", r, strict=True)) for r in rounds]
    capacity = dict(zip("abc", cores, strict=True))
    handover = plan_handover("a", seen, capacity, costs)
    if handover is None:
        return
    latest = seen[-1]
    mine, theirs = latest["a"], latest[handover.target]
    assert all(r["a"] - min(u for n, u in r.items() if n != "a") >= 0.2 for r in seen[-2:])
    assert handover.cores == pytest.approx(sum(costs[f] for f in handover.fragments))
    after_mine = mine - handover.cores / capacity["a"]
    after_theirs = theirs + handover.cores / capacity[handover.target]
    assert after_theirs <= after_mine + 1e-9  # they may meet, not swap
    assert max(after_mine, after_theirs) <= max(mine, theirs) + 1e-9
    assert math.isclose(theirs, min(u for n, u in latest.items() if n != "a"))
