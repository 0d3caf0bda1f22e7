"""An elastic participant's load from its peers' gossip (peer.elastic.figures, pure): useful
time in units of a peer's capacity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.elastic.figures import participant_load, useful_time
from peer.elastic.sizing import SizingPolicy, decide_size


def test_a_peer_using_three_capacities_counts_three_capacities_of_useful_time() -> None:
    # busy all the time at 6,000 rows/s on 1.5 cores when it offers 0.5: a peer of that
    # capacity does 2,000 rows per busy second, not 6,000
    load = participant_load({"a": {"tps": 6_000, "busy": 1.0, "lag": 0, "util": 3.0}})
    (peer,) = load.peers
    assert peer.useful == pytest.approx(3.0)
    # 12,000 rows/s arriving: at 70 % a peer does 1,400 of them, so the participant needs
    # ceil(12,000 / 1,400) = 9 peers (held at MAX); counted as busy 1.0 it would be 3
    decision = decide_size(1, load.peers, 12_000, 0, SizingPolicy(1, 9))
    assert decision is not None and decision.size == 9
    wall_only = participant_load({"a": {"tps": 6_000, "busy": 1.0, "lag": 0}})
    decision = decide_size(1, wall_only.peers, 12_000, 0, SizingPolicy(1, 9))
    assert decision is not None and decision.size == 3


def test_cpu_below_the_capacity_or_while_idle_does_not_count_as_work() -> None:
    # an idle Spark polling its sources: 40 % of its capacity in CPU, busy 5 %
    assert useful_time(0.05, 0.4) == pytest.approx(0.05)
    # a peer whose batches run all the time on fewer cores than it offers: its busy share
    assert useful_time(1.0, 0.6) == pytest.approx(1.0)
    # no brain, no util: the busy share
    assert useful_time(0.3, None) == pytest.approx(0.3)


@pytest.mark.parametrize("util", ["lots", -1.0, math.inf, math.nan, True])
def test_a_hostile_util_is_left_out_and_the_busy_share_stands(util: object) -> None:
    load = participant_load({"a": {"tps": 100.0, "busy": 0.5, "lag": 0, "util": util}})
    assert [p.useful for p in load.peers] == [0.5]


@given(busy=st.floats(0, 1), low=st.floats(0, 64), high=st.floats(0, 64))
def test_useful_time_never_falls_as_cpu_rises_and_is_the_busy_share_up_to_the_capacity(
    busy: float, low: float, high: float
) -> None:
    low, high = min(low, high), max(low, high)
    assert busy <= useful_time(busy, low) <= useful_time(busy, high)
    if high <= 1:
        assert useful_time(busy, high) == busy
