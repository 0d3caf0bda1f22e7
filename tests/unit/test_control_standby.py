"""peer.replication.control: a stream's standby (the ISR member that runs warm standbys of the
fragments over it), in the state, the failover decisions and the wire forms. Pure: no Spark,
no sockets."""

from __future__ import annotations

import pytest

from peer.errors import InvalidInput
from peer.replication.control import (
    ControlState,
    CreateStream,
    Elect,
    SetReplicas,
    SetStandby,
    ShrinkIsr,
    StreamState,
    failover_decisions,
)
from peer.replication.link_messages import state_from_wire, state_to_wire
from peer.replication.raft import (
    command_from_wire,
    command_to_wire,
    stream_from_wire,
    stream_to_wire,
)

A, B, C = "a" * 40, "b" * 40, "c" * 40


def made(*commands: object) -> ControlState:
    state = ControlState()
    state.apply(CreateStream("s", (A, B, C), 2))
    for command in commands:
        state.apply(command)  # type: ignore[arg-type]
    return state


def standby_of(state: ControlState) -> str | None:
    found = state.stream("s")
    assert found is not None
    return found.standby


def test_a_standby_is_an_isr_member_other_than_the_primary_and_holds_in_its_epoch() -> None:
    state = made()
    assert not state.apply(SetStandby("s", 1, A)).ok  # the primary
    assert not state.apply(SetStandby("s", 2, B)).ok  # another epoch
    assert state.apply(SetStandby("s", 1, C)).ok
    assert standby_of(state) == C
    refused = state.apply(SetStandby("s", 1, C))
    assert not refused.ok and "already" in refused.reason
    assert state.apply(SetStandby("s", 1, None)).ok
    assert standby_of(state) is None


def test_a_standby_that_leaves_the_isr_or_is_elected_is_no_longer_one() -> None:
    state = made(SetStandby("s", 1, B))
    state.apply(ShrinkIsr("s", 1, 2, B))
    assert standby_of(state) is None
    state = made(SetStandby("s", 1, B))
    assert state.apply(Elect("s", 1, B)).ok
    assert standby_of(state) is None
    state = made(SetStandby("s", 1, B))
    assert state.apply(Elect("s", 1, C)).ok  # another member elected: B stays standby
    assert standby_of(state) == B
    state = made(SetStandby("s", 1, B))
    assert state.apply(SetReplicas("s", 2, (A, C))).ok
    assert standby_of(state) is None


def test_failover_elects_a_live_standby_before_the_longest_log() -> None:
    stream = StreamState("s", 1, A, (A, B, C), (A, B, C), 2, 3, standby=C)
    heard = {A: 0.0, B: 10.0, C: 10.0}
    ends = {"s": {B: 90, C: 80}}
    assert failover_decisions([stream], heard, 10.5, 1.5, ends) == [Elect("s", 1, C)]
    heard[C] = 0.0  # the standby is silent too: the longest live log wins
    assert failover_decisions([stream], heard, 10.5, 1.5, ends) == [Elect("s", 1, B)]
    plain = StreamState("s", 1, A, (A, B, C), (A, B, C), 2, 3)
    heard[C] = 10.0
    assert failover_decisions([plain], heard, 10.5, 1.5, ends) == [Elect("s", 1, B)]


def test_the_standby_travels_in_every_wire_form() -> None:
    with_standby = StreamState("s", 2, B, (A, B, C), (B, C), 2, 5, standby=C)
    assert stream_from_wire(stream_to_wire(with_standby)) == with_standby
    assert stream_to_wire(with_standby)[7:] == [None, None, C]
    assert state_from_wire(state_to_wire(with_standby)) == with_standby
    for command in (SetStandby("s", 2, C), SetStandby("s", 2, None)):
        assert command_from_wire(command_to_wire(command)) == command


@pytest.mark.parametrize("standby", [B, A, 7])
def test_a_hostile_standby_in_a_stream_state_is_refused(standby: object) -> None:
    # B is the primary, A is out of the ISR, 7 is not a node
    with pytest.raises(InvalidInput, match="standby"):
        stream_from_wire(["s", 2, B, [A, B, C], [B, C], 2, 5, None, None, standby])
    frame = state_to_wire(StreamState("s", 2, B, (A, B, C), (B, C), 2, 5))
    with pytest.raises(InvalidInput, match="standby"):
        state_from_wire({**frame, "standby": standby})


def test_a_set_standby_command_names_its_wrong_field() -> None:
    with pytest.raises(ValueError, match=r"SetStandby\.standby must be a non-empty str"):
        SetStandby("s", 1, "")
    with pytest.raises(ValueError, match=r"SetStandby\.epoch must be an int"):
        SetStandby("s", 0, B)
