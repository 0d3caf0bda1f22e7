"""peer.replication.control: anchored streams and DropStream, in the state, the failover decisions
and the wire forms (the Raft log's commands, the snapshot's streams, the heartbeat's states). Pure:
no Spark, no sockets."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.errors import InvalidInput
from peer.replication.control import (
    Applied,
    Command,
    ControlState,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    ShrinkIsr,
    StreamState,
    anchor_roots,
    can_fail_over,
    failover_decisions,
)
from peer.replication.link_messages import state_from_wire, state_to_wire
from peer.replication.raft import (
    command_from_wire,
    command_to_wire,
    stream_from_wire,
    stream_to_wire,
)

A, B, C, D = "a" * 40, "b" * 40, "c" * 40, "d" * 40
ABC = (A, B, C)


def pack(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


def stream(
    name: str,
    primary: str,
    in_sync: tuple[str, ...] = ABC,
    *,
    anchor: str | None = None,
    epoch: int = 1,
    replicas: tuple[str, ...] = ABC,
) -> StreamState:
    return StreamState(name, epoch, primary, replicas, in_sync, 2, 1, anchor)


def decide(
    streams: list[StreamState], live: set[str], ends: dict[str, dict[str, int]] | None = None
) -> list[Elect]:
    heard = {node: (10.0 if node in live else 0.0) for node in (A, B, C, D)}
    return failover_decisions(streams, heard, 10.5, 1.5, ends or {})


def test_a_fragment_is_replicated_only_beside_a_standby_of_its_anchor() -> None:
    # A lone peer's stream (1 of 3 copies) has nowhere to fail over to: a fragment anchored
    # to it runs unreplicated (and may share the lane), as it did without a control plane.
    assert not can_fail_over(StreamState("s", 1, A, (A,), (A,), 1, 1, wanted=3))
    assert can_fail_over(stream("s", A, replicas=(A, B), in_sync=(A,)))
    assert can_fail_over(stream("s", B))


# --------------------------------------------------------------------------- commands


def test_an_anchor_must_be_another_non_empty_name() -> None:
    assert CreateStream("s", ABC, 2).anchor is None
    assert CreateStream("s", ABC, 2, "a").anchor == "a"
    assert CreateStream("s", ABC, 2, anchor="a") == CreateStream("s", ABC, 2, "a")
    with pytest.raises(ValueError, match=r"CreateStream.anchor must be a non-empty str"):
        CreateStream("s", ABC, 2, "")
    with pytest.raises(ValueError, match=r"CreateStream.anchor must be a non-empty str"):
        CreateStream("s", ABC, 2, 7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CreateStream\('s'\).anchor must name another"):
        CreateStream("s", ABC, 2, "s")
    with pytest.raises(ValueError, match=r"DropStream.name must be a non-empty str"):
        DropStream("")
    with pytest.raises(ValueError, match=r"DropStream.name must be a non-empty str"):
        DropStream(None)  # type: ignore[arg-type]


def test_an_anchored_stream_records_its_anchor_and_old_positional_forms_still_work() -> None:
    state = ControlState()
    assert state.apply(CreateStream("in", ABC, 2)).ok
    assert state.apply(CreateStream("out", (B, A, C), 2, "in")).ok
    assert state.stream("in") == StreamState("in", 1, A, ABC, ABC, 2, 1)
    assert state.stream("out") == StreamState("out", 1, B, (B, A, C), (B, A, C), 2, 1, "in")
    assert StreamState("in", 1, A, ABC, ABC, 2, 1).anchor is None
    # the anchor survives every change of the stream
    assert state.apply(Elect("out", 1, A)).ok
    assert state.apply(ShrinkIsr("out", 2, 2, C)).ok
    assert state.stream("out") == StreamState("out", 2, A, (B, A, C), (A,), 2, 3, "in")


def test_drop_stream_removes_it_and_is_a_no_op_for_a_missing_one() -> None:
    state = ControlState()
    assert state.apply(CreateStream("s", ABC, 2)).ok
    assert state.apply(CreateStream("t", ABC, 2, "s")).ok
    assert state.apply(DropStream("s")) == Applied(DropStream("s"), True)
    assert state.stream("s") is None
    assert [s.name for s in state.streams()] == ["t"]
    again = state.apply(DropStream("s"))
    assert again == Applied(DropStream("s"), False, "no stream 's'")
    assert not state.apply(Elect("s", 1, B)).ok
    assert state.applied == 5
    # the name can be created afresh; the stream anchored to it follows the new one
    assert state.apply(CreateStream("s", (B, C), 1)).ok
    assert state.stream("s") == StreamState("s", 1, B, (B, C), (B, C), 1, 1)


# ------------------------------------------------------------------------- wire forms

WIRE_COMMANDS: list[Command] = [
    CreateStream("s", ABC, 2),
    CreateStream("out", (B, A), 1, "in"),
    DropStream("s"),
]


@pytest.mark.parametrize("command", WIRE_COMMANDS, ids=repr)
def test_anchors_and_drops_round_trip_through_the_command_wire_form(command: Command) -> None:
    frame = command_to_wire(command)
    assert command_from_wire(frame) == command


def test_an_unanchored_create_keeps_the_old_wire_form() -> None:
    body = msgpack.unpackb(command_to_wire(CreateStream("s", ABC, 2)))
    assert body == {"type": "create_stream", "name": "s", "replicas": list(ABC), "min_insync": 2}
    assert msgpack.unpackb(command_to_wire(CreateStream("s", ABC, 2, "t")))["anchor"] == "t"
    assert msgpack.unpackb(command_to_wire(DropStream("s"))) == {"type": "drop_stream", "name": "s"}
    nil = {"type": "create_stream", "name": "s", "replicas": [A], "min_insync": 1, "anchor": None}
    assert command_from_wire(pack(nil)) == CreateStream("s", (A,), 1)


CREATE = {"type": "create_stream", "name": "s", "replicas": [A, B], "min_insync": 1}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({**CREATE, "anchor": ""}, "anchor must be a non-empty str"),
        ({**CREATE, "anchor": "s"}, "anchor must name another stream"),
        ({**CREATE, "anchor": 5}, "create_stream.anchor must be a str"),
        ({**CREATE, "anchor": b"t"}, "create_stream.anchor must be a str"),
        ({**CREATE, "anchor": ["t"]}, "create_stream.anchor must be a str"),
        ({**CREATE, "anchor": True}, "create_stream.anchor must be a str"),
        ({"type": "drop_stream"}, "missing field 'name'"),
        ({"type": "drop_stream", "name": ""}, "DropStream.name"),
        ({"type": "drop_stream", "name": 3}, "drop_stream.name must be a str"),
        ({"type": "drop_stream", "name": "s", "anchor": "t"}, "unexpected field 'anchor'"),
        ({"type": "elect", "name": "s", "epoch": 1, "primary": A, "anchor": None}, "unexpected"),
    ],
)
def test_a_hostile_anchor_or_drop_is_refused_naming_the_field(body: Any, named: str) -> None:
    with pytest.raises(InvalidInput) as err:
        command_from_wire(pack(body))
    assert named in str(err.value)


ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
hostile = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    st.text(max_size=8),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), ints, max_size=2),
)


@settings(max_examples=200, deadline=None)
@given(hostile)
def test_any_anchor_value_is_a_command_or_refused(anchor: Any) -> None:
    try:
        command = command_from_wire(pack({**CREATE, "anchor": anchor}))
    except InvalidInput:
        assert not (isinstance(anchor, str) and anchor not in ("", "s"))
        return
    assert isinstance(command, CreateStream)
    assert command.anchor == anchor
    assert command_from_wire(command_to_wire(command)) == command


def test_a_stream_state_carries_its_anchor_and_the_old_7_element_form_is_read() -> None:
    plain = StreamState("s", 2, B, ABC, (B, C), 2, 5)
    anchored = StreamState("t", 2, B, ABC, (B, C), 2, 5, "s")
    assert len(stream_to_wire(plain)) == 7
    assert stream_to_wire(anchored)[7] == "s"
    for state in (plain, anchored):
        assert stream_from_wire(stream_to_wire(state)) == state
        assert stream_from_wire(msgpack.unpackb(pack(stream_to_wire(state)))) == state
    assert stream_from_wire(["s", 2, B, [A, B, C], [B, C], 2, 5]) == plain
    assert stream_from_wire(["s", 2, B, [A, B, C], [B, C], 2, 5, None]) == plain


@pytest.mark.parametrize(
    ("anchor", "named"),
    [
        ("", "the anchor must name another stream"),
        ("t", "the anchor must name another stream"),
        (7, "anchor must be a str"),
        (b"s", "anchor must be a str"),
        (["s"], "anchor must be a str"),
    ],
)
def test_a_hostile_anchor_in_a_stream_state_is_refused(anchor: Any, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        stream_from_wire(["t", 2, B, [A, B, C], [B, C], 2, 5, anchor])
    with pytest.raises(InvalidInput, match="list of 7 to 10"):
        stream_from_wire(["t", 2, B, [A, B, C], [B, C], 2, 5, "s", 3, C, "extra"])


def test_a_heartbeat_state_carries_its_anchor_and_old_frames_are_read() -> None:
    plain = StreamState("s", 2, B, ABC, (B, C), 2, 5)
    anchored = StreamState("t", 2, B, ABC, (B, C), 2, 5, "s")
    assert "anchor" not in state_to_wire(plain)
    assert state_to_wire(anchored)["anchor"] == "s"
    for state in (plain, anchored):
        assert state_from_wire(msgpack.unpackb(pack(state_to_wire(state)))) == state
    assert state_from_wire({**state_to_wire(plain), "anchor": None}) == plain
    for anchor in ("", "t", 5, ["s"], True):
        with pytest.raises(InvalidInput, match="anchor"):
            state_from_wire({**state_to_wire(anchored), "anchor": anchor})


# -------------------------------------------------------------------------- failover


def test_an_anchored_stream_follows_its_anchors_primary() -> None:
    anchor = stream("in", B, (B, C), epoch=2)
    follower = stream("out", A, anchor="in", epoch=4)
    assert decide([anchor, follower], {A, B, C}) == [Elect("out", 4, B)]
    # already together: nothing to do
    assert decide([anchor, stream("out", B, anchor="in")], {A, B, C}) == []


def test_a_follower_waits_if_the_anchors_primary_is_outside_its_isr_or_silent() -> None:
    anchor = stream("in", B, (B, C), epoch=2)
    assert decide([anchor, stream("out", A, (A, C), anchor="in")], {A, B, C}) == []
    # the anchor's primary is silent: the anchor is elected first, the follower waits
    assert decide([anchor, stream("out", A, anchor="in")], {A, C}) == [Elect("in", 2, C)]


def test_an_anchored_stream_is_never_elected_on_its_own_silence() -> None:
    anchor = stream("in", B)
    follower = stream("out", A, anchor="in")  # not moved yet, and its primary is silent
    assert decide([anchor, follower], {B, C}) == [Elect("out", 1, B)]
    assert decide([anchor, stream("out", A, (A, C), anchor="in")], {B, C}) == []


def test_a_stream_whose_anchor_is_missing_fails_over_on_its_own() -> None:
    follower = stream("out", A, anchor="in")
    ends = {"out": {B: 3, C: 7}}
    assert decide([follower], {B, C}, ends) == [Elect("out", 1, C)]
    assert decide([follower], {A, B, C}, ends) == []


def test_an_anchor_prefers_a_new_primary_in_every_followers_isr() -> None:
    anchor = stream("in", A)
    ends = {"in": {B: 9, C: 3}}
    followers = [stream("out", A, (A, C), anchor="in"), stream("ckpt", A, (A, C, B), anchor="in")]
    # alone, B (the longest log) would win; C is in every follower's ISR
    assert decide([anchor], {B, C}, ends) == [Elect("in", 1, B)]
    assert decide([anchor, *followers], {B, C}, ends) == [Elect("in", 1, C)]
    # among the shared members, the longest log wins (ties: the earlier replica)
    both = [stream("out", A, anchor="in")]
    assert decide([anchor, *both], {B, C}, ends) == [Elect("in", 1, B)]
    assert decide([anchor, *both], {B, C}, {}) == [Elect("in", 1, B)]
    # no live shared member: the choice is over the anchor's ISR alone
    assert decide([anchor, *followers], {B}, ends) == [Elect("in", 1, B)]
    lonely = [stream("out", A, (A,), anchor="in")]
    assert decide([anchor, *lonely], {B, C}, ends) == [Elect("in", 1, B)]


def test_chains_follow_their_anchor_and_the_root_prefers_every_descendants_isr() -> None:
    root = stream("in", A)
    mid = stream("mid", A, anchor="in")
    leaf = stream("leaf", A, (A, C), anchor="mid")
    assert anchor_roots([root, mid, leaf]) == {"leaf": "in", "mid": "in"}
    ends = {"in": {B: 9, C: 3}}
    assert decide([root, mid, leaf], {B, C}, ends) == [Elect("in", 1, C)]
    moved = stream("in", C, (B, C), epoch=2)
    assert decide([moved, mid, leaf], {B, C}, ends) == [Elect("mid", 1, C)]
    mid_moved = stream("mid", C, (B, C), anchor="in", epoch=2)
    assert decide([moved, mid_moved, leaf], {B, C}, ends) == [Elect("leaf", 1, C)]


def test_a_cycle_of_anchors_is_cut_at_its_least_name() -> None:
    s = stream("s", A, anchor="t")
    t = stream("t", B, anchor="s")
    u = stream("u", B, anchor="t")
    assert anchor_roots([s, t, u]) == {"t": "s", "u": "s"}
    # s fails over on its own silence; t and u follow it
    assert decide([s, t, u], {B, C}, {"s": {B: 1, C: 5}}) == [Elect("s", 1, C)]
    assert decide([s, t, u], {A, B, C}) == [Elect("t", 1, A)]
    assert anchor_roots([stream("s", A, anchor="s")]) == {}


def test_the_decisions_are_deterministic_and_in_stream_order() -> None:
    streams = [
        stream("a-in", A),
        stream("b-out", B, anchor="a-in"),
        stream("c-out", C, anchor="a-in"),
        stream("d", A),
    ]
    first = decide(streams, {A, B, C})
    assert first == [Elect("b-out", 1, A), Elect("c-out", 1, A)]
    assert decide(list(reversed(streams)), {A, B, C}) == list(reversed(first))
    for _ in range(5):
        assert decide(streams, {A, B, C}) == first
    assert decide(streams, {B, C}, {"a-in": {B: 1, C: 1}}) == [
        Elect("a-in", 1, B),
        Elect("d", 1, B),
    ]


# ---------------------------------------------------- a control plane alone, at random

NODES = (A, B, C, D)
subsets = st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True).map(tuple)


@settings(max_examples=300, deadline=None)
@given(
    isr_in=subsets,
    isr_out=subsets,
    isr_ckpt=subsets,
    live=st.sets(st.sampled_from(NODES)),
    ends=st.dictionaries(st.sampled_from(NODES), st.integers(0, 5)),
)
def test_after_a_failover_followers_join_the_new_primary_whenever_they_can(
    isr_in: tuple[str, ...],
    isr_out: tuple[str, ...],
    isr_ckpt: tuple[str, ...],
    live: set[str],
    ends: dict[str, int],
) -> None:
    # every stream starts on A, with A in sync and the drawn members next to it
    state = ControlState()
    assert state.apply(CreateStream("in", NODES, 1)).ok
    assert state.apply(CreateStream("out", NODES, 1, "in")).ok
    assert state.apply(CreateStream("ckpt", NODES, 1, "in")).ok
    for name, isr in (("in", isr_in), ("out", isr_out), ("ckpt", isr_ckpt)):
        for node in NODES[1:]:
            if node not in isr:
                current = state.stream(name)
                assert current is not None
                assert state.apply(ShrinkIsr(name, 1, current.version, node)).ok
    live = live - {A}  # A, the primary of all three, dies
    heard = {node: (10.0 if node in live else 0.0) for node in NODES}
    rounds = []
    for _ in range(3):
        decisions = failover_decisions(state.streams(), heard, 10.5, 1.5, {"in": ends})
        assert decisions == failover_decisions(state.streams(), heard, 10.5, 1.5, {"in": ends})
        rounds.append(decisions)
        for command in decisions:
            assert state.apply(command).ok
    streams = {s.name: s for s in state.streams()}
    new = streams["in"].primary
    assert rounds[2] == []  # settled
    if new == A:  # nobody alive in the anchor's ISR: everything waits
        assert rounds[0] == [] and all(s.primary == A for s in streams.values())
        return
    assert new in live and new in isr_in
    shared = set(isr_in) & set(isr_out) & set(isr_ckpt) & live
    assert (new in shared) or not shared
    for name in ("out", "ckpt"):
        # a follower joins the anchor's new primary if it was in its ISR; never anyone else
        drawn = isr_ckpt if name == "ckpt" else isr_out
        assert streams[name].primary == (new if new in drawn else A)
    # the follower's election came a round after the anchor's, never before
    assert all(e.name == "in" for e in rounds[0])


def test_expanding_a_followers_isr_lets_it_follow() -> None:
    state = ControlState()
    assert state.apply(CreateStream("in", ABC, 1)).ok
    assert state.apply(CreateStream("out", ABC, 1, "in")).ok
    assert state.apply(ShrinkIsr("out", 1, 1, C)).ok
    assert state.apply(ShrinkIsr("in", 1, 1, B)).ok
    assert state.apply(Elect("in", 1, C)).ok
    live = {B, C}
    assert decide(list(state.streams()), live) == []  # C is not in out's ISR: it waits
    assert state.apply(ExpandIsr("out", 1, 2, C)).ok
    assert decide(list(state.streams()), live) == [Elect("out", 1, C)]
