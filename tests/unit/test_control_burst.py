"""An elastic participant's burst leader and plan in the control plane: ClaimBurst and
PlanBurst applied to the replicated state, their wire form, and snapshots."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.errors import InvalidInput
from peer.replication.control import (
    BurstState,
    ClaimBurst,
    ControlState,
    CreateStream,
    PlanBurst,
)
from peer.replication.raft import (
    burst_from_wire,
    burst_to_wire,
    command_from_wire,
    command_to_wire,
    state_from_streams,
)


def claimed(node: str = "a", maximum: int = 3) -> ControlState:
    state = ControlState()
    assert state.apply(ClaimBurst("acme", node, 0, 1, maximum)).ok
    return state


def burst(state: ControlState) -> BurstState:
    found = state.burst("acme")
    assert found is not None
    return found


def test_the_first_claim_makes_term_one_and_a_second_claim_on_the_same_term_loses() -> None:
    state = claimed("a")
    applied = state.apply(ClaimBurst("acme", "b", 0, 1, 3))
    assert not applied.ok and "term 0" in applied.reason and "term 1" in applied.reason
    assert (burst(state).leader, burst(state).term) == ("a", 1)


def test_a_claim_on_the_current_term_takes_over_and_keeps_the_plan() -> None:
    state = claimed("a")
    assert state.apply(PlanBurst("acme", 1, 1, ("acme-e1",))).ok
    assert state.apply(ClaimBurst("acme", "b", 1, 1, 3)).ok
    now = burst(state)
    assert (now.leader, now.term, now.launched) == ("b", 2, ("acme-e1",))


def test_a_deposed_leaders_plan_is_a_no_op() -> None:
    state = claimed("a")
    assert state.apply(ClaimBurst("acme", "b", 1, 1, 3)).ok  # b took over in term 2
    before = burst(state)
    applied = state.apply(PlanBurst("acme", 1, before.version, ("acme-e1", "acme-e2")))
    assert not applied.ok and "term 1" in applied.reason
    assert burst(state) == before


def test_a_plan_decided_on_a_stale_version_is_a_no_op() -> None:
    state = claimed("a")
    assert state.apply(PlanBurst("acme", 1, 1, ("acme-e1",))).ok
    applied = state.apply(PlanBurst("acme", 1, 1, ("acme-e1", "acme-e2")))
    assert not applied.ok and "version 1" in applied.reason
    assert burst(state).launched == ("acme-e1",)


def test_a_plan_never_exceeds_max_minus_the_peer_started_by_hand() -> None:
    state = claimed("a", maximum=3)
    applied = state.apply(PlanBurst("acme", 1, 1, ("e1", "e2", "e3")))
    assert not applied.ok and "maximum 3" in applied.reason
    assert burst(state).launched == ()
    assert state.apply(PlanBurst("acme", 1, 1, ("e1", "e2"))).ok


def test_a_plan_for_a_participant_without_a_leader_is_a_no_op() -> None:
    state = ControlState()
    assert not state.apply(PlanBurst("acme", 1, 1, ())).ok
    assert state.burst("acme") is None


def test_bursts_and_streams_do_not_interfere() -> None:
    state = claimed("a")
    assert state.apply(CreateStream("acme", ("a", "b"), 1)).ok  # a stream named as the participant
    assert burst(state).leader == "a" and state.stream("acme") is not None


@pytest.mark.parametrize(
    "make",
    [
        lambda: ClaimBurst("", "a", 0, 1, 3),
        lambda: ClaimBurst("acme", "a", -1, 1, 3),
        lambda: ClaimBurst("acme", "a", 0, 0, 3),
        lambda: ClaimBurst("acme", "a", 0, 3, 2),
        lambda: PlanBurst("acme", 0, 1, ()),
        lambda: PlanBurst("acme", 1, 1, ("x", "x")),
        lambda: PlanBurst("acme", 1, 1, ("",)),
        lambda: PlanBurst("acme", 1, 1, ["x"]),  # type: ignore[arg-type]
    ],
)
def test_malformed_commands_are_refused_at_construction(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_commands_round_trip_through_the_log_bytes() -> None:
    for command in (ClaimBurst("acme", "a" * 40, 4, 1, 5), PlanBurst("acme", 2, 7, ("x", "y"))):
        assert command_from_wire(command_to_wire(command)) == command


@pytest.mark.parametrize(
    "body",
    [
        {"type": "claim_burst", "participant": "acme", "node": "a", "term": 0, "minimum": 1},
        {"type": "claim_burst", "participant": 1, "node": "a", "term": 0, "minimum": 1,
         "maximum": 2},
        {"type": "plan_burst", "participant": "acme", "term": 1, "version": 1,
         "launched": "x"},
        {"type": "plan_burst", "participant": "acme", "term": 1, "version": 1,
         "launched": ["x"], "evil": 1},
        {"type": "claim_burst", "participant": "acme", "node": "a", "term": 0, "minimum": 2,
         "maximum": 1},
    ],
)  # fmt: skip
def test_hostile_burst_commands_are_refused_with_a_reason(body: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        command_from_wire(msgpack.packb(body))


def test_a_burst_state_round_trips_and_a_snapshot_keeps_it() -> None:
    state = claimed("a")
    assert state.apply(PlanBurst("acme", 1, 1, ("acme-e1",))).ok
    wire = burst_to_wire(burst(state))
    assert burst_from_wire(msgpack.unpackb(msgpack.packb(wire))) == burst(state)
    restored = state_from_streams(state.snapshot(), state.applied, state.bursts())
    assert restored.bursts() == state.bursts()


@pytest.mark.parametrize(
    "wire",
    [
        ["acme", "a", 1, 1, 3, [], 1, "extra"],
        ["acme", "a", 0, 1, 3, [], 1],
        ["acme", "a", 1, 2, 1, [], 1],
        ["acme", "a", 1, 1, 2, ["x", "y"], 1],  # two launched and one by hand exceed 2
        ["acme", "a", 1, 1, 3, ["x", "x"], 1],
        ["acme", "", 1, 1, 3, [], 1],
        "acme",
    ],
)
def test_a_hostile_burst_state_is_refused(wire: object) -> None:
    with pytest.raises(InvalidInput):
        burst_from_wire(wire)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["claim", "plan"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 4),  # the term the deciding peer saw
            st.integers(1, 6),  # the version it saw
            st.integers(0, 4),  # how many names it plans
        ),
        max_size=40,
    )
)
def test_terms_never_fall_plans_hold_only_for_the_current_term_and_never_exceed_max(
    steps: list[tuple[str, str, int, int, int]],
) -> None:
    state = ControlState()
    for kind, node, term, version, count in steps:
        before = state.burst("acme")
        if kind == "claim":
            applied = state.apply(ClaimBurst("acme", node, term, 1, 3))
        else:
            names = tuple(f"e{i}" for i in range(count))
            applied = state.apply(PlanBurst("acme", max(1, term), version, names))
        after = state.burst("acme")
        if before is not None:
            assert after is not None and after.term >= before.term
            assert after.version >= before.version
        if applied.ok and kind == "plan":
            assert before is not None and before.term == max(1, term)
            assert after is not None and after.leader == before.leader
        if not applied.ok:
            assert after == before
        if after is not None:
            assert len(after.launched) <= after.maximum - 1
