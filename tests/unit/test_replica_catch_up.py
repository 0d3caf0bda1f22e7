"""A stream created while fewer peers lived than the replicas it asked for is brought up to its
count as peers join (peer.replication.control.repair), the count asked for travels through the
control plane's log, snapshots and heartbeats, and ``peer status`` says why copies are missing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.errors import InvalidInput
from peer.replication.control import (
    NO_CONTROL_PLANE,
    ControlState,
    CreateStream,
    SetReplicas,
    StreamState,
    copies_text,
    repaired_replicas,
)
from peer.replication.link_messages import state_from_wire, state_to_wire
from peer.replication.raft.codec import (
    command_from_wire,
    command_to_wire,
    stream_from_wire,
    stream_to_wire,
)

NODES = [f"{i:040x}" for i in range(8)]
A, B, C, D, E = NODES[:5]


def created(replicas: tuple[str, ...], wanted: int | None) -> StreamState:
    state = ControlState()
    assert state.apply(CreateStream("s", replicas, 2, wanted=wanted)).ok
    found = state.stream("s")
    assert found is not None
    return found


def test_a_stream_created_on_a_lone_peer_remembers_the_replicas_it_asked_for() -> None:
    lone = created((A,), 3)
    assert (lone.asked, lone.missing, lone.required_insync) == (3, 2, 1)
    full = created((A, B, C), None)
    assert (full.asked, full.missing, full.required_insync) == (3, 0, 2)


def test_a_short_stream_grows_with_the_closest_live_peers_up_to_its_count() -> None:
    lone = created((A,), 3)
    assert repaired_replicas(lone, set(), []) is None  # nobody joined yet
    assert repaired_replicas(lone, set(), [A]) is None  # only itself
    assert repaired_replicas(lone, set(), [A, B]) == (A, B)  # one more peer: one more copy
    assert repaired_replicas(lone, set(), [C, A, B, D]) == (A, C, B)  # XOR order, up to 3
    two = created((A, B), 3)
    assert repaired_replicas(two, set(), [B, A, D, E]) == (A, B, D)
    assert repaired_replicas(created((A, B, C), None), set(), [D, E]) is None  # full: stays


def test_a_dead_member_is_replaced_before_a_short_stream_grows() -> None:
    two = created((A, B), 3)
    # B died for good; C and D are live outsiders: C replaces B, D is the third copy
    assert repaired_replicas(two, {B}, [C, D]) == (A, C, D)
    assert repaired_replicas(two, {B}, [C]) == (A, C)  # one newcomer: the replacement first
    assert repaired_replicas(two, {B, C}, [C, D]) == (A, D)  # a dead peer never joins


def test_growth_goes_through_set_replicas_and_newcomers_start_out_of_the_isr() -> None:
    state = ControlState()
    state.apply(CreateStream("s", (A,), 2, wanted=3))
    lone = state.stream("s")
    assert lone is not None
    wanted = repaired_replicas(lone, set(), [A, B, C])
    assert wanted is not None
    assert state.apply(SetReplicas("s", lone.version, wanted)).ok
    grown = state.stream("s")
    assert grown is not None
    assert grown.replicas == (A, B, C) and grown.in_sync == (A,) and grown.missing == 0
    assert grown.wanted == 3 and grown.required_insync == 2  # acks now need a second copy
    assert repaired_replicas(grown, set(), [D]) is None


@given(
    have=st.integers(1, 4),
    asked=st.integers(1, 6),
    outsiders=st.lists(st.sampled_from(NODES[4:]), max_size=6),
    dead=st.sets(st.sampled_from(NODES[1:4])),
)
def test_a_repaired_set_never_exceeds_the_count_keeps_the_primary_and_no_dead_peer(
    have: int, asked: int, outsiders: list[str], dead: set[str]
) -> None:
    replicas = tuple(NODES[:have])
    state = StreamState("s", 1, A, replicas, replicas, 2, 1, None, max(asked, have))
    wanted = repaired_replicas(state, dead, [*replicas, *outsiders])
    if wanted is None:
        return
    assert wanted[0] == A and len(set(wanted)) == len(wanted)
    assert len(replicas) <= len(wanted) <= state.asked
    assert not set(wanted) & (dead - set(replicas))  # (a dead member may stay: none to take over)


def test_the_count_asked_for_travels_in_commands_snapshots_and_heartbeats() -> None:
    command = CreateStream("s", (A,), 2, wanted=3)
    assert command_from_wire(command_to_wire(command)) == command
    plain = CreateStream("s", (A, B), 2)
    assert b"wanted" not in command_to_wire(plain)  # as older voters wrote and read it
    lone = created((A,), 3)
    assert stream_from_wire(stream_to_wire(lone)) == lone
    assert len(stream_to_wire(lone)) == 9 and stream_to_wire(lone)[7] is None
    full = created((A, B), None)
    assert len(stream_to_wire(full)) == 7  # the form older voters read
    assert state_from_wire(state_to_wire(lone)) == lone
    assert "wanted" not in state_to_wire(full)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CreateStream("s", (A, B), 2, wanted=1), "wanted must be an int >= 2"),
        (lambda: stream_from_wire(["s", 1, A, [A], [A], 1, 1, None, 0]), "at least 1"),
        (lambda: stream_from_wire(["s", 1, A, [A], [A], 1, 1, None, "3"]), "wanted"),
        (
            lambda: state_from_wire({**state_to_wire(created((A,), 3)), "wanted": 0}),
            "wanted must be at least 1",
        ),
        (
            lambda: state_from_wire({**state_to_wire(created((A,), 3)), "wanted": True}),
            "'wanted' must be a int or nil",
        ),
    ],
)
def test_a_bad_count_is_refused_naming_it(make: object, message: str) -> None:
    with pytest.raises((InvalidInput, ValueError), match=message):
        make()  # type: ignore[operator]


def test_status_says_how_many_copies_and_why_fewer() -> None:
    assert copies_text(created((A, B, C), None), 3) == "3 of 3 copies"
    assert copies_text(created((A,), 3), 1) == "1 of 3 copies: only 1 peer live"
    assert copies_text(created((A, B), 3), 2) == "2 of 3 copies: only 2 peers live"
    assert copies_text(created((A,), 3), 3) == "1 of 3 copies: adding 2 (peers joined)"
    catching_up = StreamState("s", 1, A, (A, B, C), (A,), 2, 2, None, 3)
    assert copies_text(catching_up, 3) == "3 of 3 copies; 1 in sync, 2 catching up"
    assert NO_CONTROL_PLANE == "1 copy: no control plane"
