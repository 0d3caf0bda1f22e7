"""peer.replication.control: commands, the replicated state, and the failover decisions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.replication.control import (
    Applied,
    Command,
    ControlState,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    SetReplicas,
    SetStandby,
    ShrinkIsr,
    StreamState,
    choose_primary,
    failover_decisions,
    to_probe,
)

ABC = ("a", "b", "c")
StreamCommand = CreateStream | DropStream | Elect | ShrinkIsr | ExpandIsr | SetReplicas | SetStandby


def created(replicas: tuple[str, ...] = ABC, min_insync: int = 2) -> ControlState:
    state = ControlState()
    assert state.apply(CreateStream("s", replicas, min_insync)).ok
    return state


def s(state: ControlState) -> StreamState:
    stream = state.stream("s")
    assert stream is not None
    return stream


def test_a_new_stream_is_led_by_its_first_replica_with_every_replica_in_sync() -> None:
    state = created()
    assert s(state) == StreamState("s", 1, "a", ABC, ABC, 2, 1)
    again = state.apply(CreateStream("s", ("b",), 1))
    assert again == Applied(CreateStream("s", ("b",), 1), False, "stream 's' exists")
    assert s(state).primary == "a"
    assert state.applied == 2


def test_min_insync_never_exceeds_the_replicas() -> None:
    assert s(created(("a",), min_insync=2)).required_insync == 1
    assert s(created(ABC, min_insync=2)).required_insync == 2


def test_elect_moves_to_the_next_epoch_without_the_deposed_primary() -> None:
    state = created()
    assert state.apply(Elect("s", 1, "b")).ok
    assert (s(state).epoch, s(state).primary, s(state).in_sync, s(state).version) == (
        2,
        "b",
        ("b", "c"),
        2,
    )


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (Elect("s", 2, "b"), "decided in epoch 2; 's' is in epoch 1"),
        (Elect("s", 1, "a"), "a already leads 's'"),
        (Elect("s", 1, "d"), "d is not in 's''s ISR"),
        (Elect("t", 1, "b"), "no stream 't'"),
        (ShrinkIsr("s", 1, 1, "a"), "the primary a stays in 's''s ISR"),
        (ShrinkIsr("s", 1, 2, "b"), "decided at epoch 1 version 2"),
        (ShrinkIsr("s", 2, 1, "b"), "decided at epoch 2 version 1"),
        (ShrinkIsr("s", 1, 1, "d"), "d is not in 's''s ISR"),
        (ExpandIsr("s", 1, 1, "b"), "b is in 's''s ISR already"),
        (ExpandIsr("s", 1, 1, "d"), "d is not a replica of 's'"),
        (SetReplicas("s", 1, ("b", "c")), "must keep its primary a"),
        (SetReplicas("s", 3, ABC), "decided at version 3"),
    ],
)
def test_stale_or_inapplicable_commands_change_nothing(command: Command, reason: str) -> None:
    state = created()
    before = state.snapshot()
    outcome = state.apply(command)
    assert not outcome.ok and reason in outcome.reason
    assert state.snapshot() == before


def test_isr_changes_hold_only_at_their_version() -> None:
    state = created()
    assert state.apply(ShrinkIsr("s", 1, 1, "c")).ok
    assert s(state).in_sync == ("a", "b")
    assert state.apply(ExpandIsr("s", 1, 2, "c")).ok
    assert s(state).in_sync == ABC  # in replica order
    # the expansion delivered again after a later shrink must not re-admit c
    assert state.apply(ShrinkIsr("s", 1, 3, "c")).ok
    assert not state.apply(ExpandIsr("s", 1, 2, "c")).ok
    assert s(state).in_sync == ("a", "b")


def test_set_replicas_drops_departed_members_from_the_isr() -> None:
    state = created()
    assert state.apply(SetReplicas("s", 1, ("a", "c", "d"))).ok
    assert (s(state).replicas, s(state).in_sync) == (("a", "c", "d"), ("a", "c"))


def test_commands_name_their_wrong_field() -> None:
    with pytest.raises(ValueError, match=r"CreateStream.name must be a non-empty str"):
        CreateStream("", ABC, 1)
    with pytest.raises(ValueError, match=r"CreateStream\('s'\).replicas names a node twice"):
        CreateStream("s", ("a", "a"), 1)
    with pytest.raises(ValueError, match=r"replicas must be a non-empty tuple"):
        CreateStream("s", ["a"], 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CreateStream.min_insync must be an int >= 1"):
        CreateStream("s", ABC, 0)
    with pytest.raises(ValueError, match=r"Elect.epoch must be an int >= 1"):
        Elect("s", True, "a")
    with pytest.raises(ValueError, match=r"ShrinkIsr.version must be an int >= 1"):
        ShrinkIsr("s", 1, 0, "a")
    with pytest.raises(ValueError, match=r"ExpandIsr.node must be a non-empty str"):
        ExpandIsr("s", 1, 1, "")


nodes = st.sampled_from(("a", "b", "c", "d"))
commands = st.one_of(
    st.builds(
        CreateStream,
        st.sampled_from(("s", "t")),
        st.lists(nodes, min_size=1, max_size=4, unique=True).map(tuple),
        st.integers(1, 4),
    ),
    st.builds(
        CreateStream,
        st.just("u"),
        st.lists(nodes, min_size=1, max_size=4, unique=True).map(tuple),
        st.integers(1, 4),
        st.sampled_from(("s", "t")),
    ),
    st.builds(DropStream, st.sampled_from(("s", "t", "u"))),
    st.builds(Elect, st.sampled_from(("s", "t")), st.integers(1, 4), nodes),
    st.builds(ShrinkIsr, st.sampled_from(("s", "t")), st.integers(1, 4), st.integers(1, 6), nodes),
    st.builds(ExpandIsr, st.sampled_from(("s", "t")), st.integers(1, 4), st.integers(1, 6), nodes),
    st.builds(
        SetReplicas,
        st.sampled_from(("s", "t")),
        st.integers(1, 6),
        st.lists(nodes, min_size=1, max_size=4, unique=True).map(tuple),
    ),
    st.builds(SetStandby, st.sampled_from(("s", "t")), st.integers(1, 4), st.none() | nodes),
)


@settings(max_examples=300)
@given(st.lists(commands, max_size=40))
def test_any_log_keeps_the_invariants_and_every_voter_agrees(log: list[StreamCommand]) -> None:
    voters = [ControlState(), ControlState()]
    for command in log:
        before = voters[0].stream(command.name)
        outcomes = [voter.apply(command) for voter in voters]
        assert outcomes[0] == outcomes[1]
        after = voters[0].stream(command.name)
        if isinstance(command, DropStream):
            assert after is None and outcomes[0].ok == (before is not None)
            continue
        assert after is not None or not outcomes[0].ok
        if before is not None and after is not None:
            assert after.epoch >= before.epoch
            assert after.version == before.version + (1 if outcomes[0].ok else 0)
            if outcomes[0].ok and after.epoch > before.epoch:
                # a new primary came from the ISR, which lost only the deposed primary
                assert after.primary in before.in_sync
                assert set(after.in_sync) == set(before.in_sync) - {before.primary}
        for stream in voters[0].streams():
            assert stream.primary in stream.in_sync
            assert set(stream.in_sync) <= set(stream.replicas)
            assert list(stream.in_sync) == [n for n in stream.replicas if n in stream.in_sync]
            if stream.standby is not None:
                assert stream.standby in stream.in_sync and stream.standby != stream.primary
    assert voters[0].snapshot() == voters[1].snapshot()


def test_choose_primary_takes_the_longest_live_isr_member() -> None:
    stream = StreamState("s", 3, "a", ("a", "b", "c", "d"), ("a", "b", "c"), 2, 7)
    assert choose_primary(stream, {"b": 4, "c": 6, "d": 9}, {"b", "c", "d"}) == "c"
    assert choose_primary(stream, {"b": 6, "c": 6}, {"b", "c"}) == "b"  # tie: replica order
    assert choose_primary(stream, {}, {"c"}) == "c"  # unknown log end still electable
    assert choose_primary(stream, {"d": 9}, {"d"}) is None  # d is not in sync


def test_failover_elects_only_for_silent_primaries_with_a_live_isr_member() -> None:
    state = created()
    assert state.apply(CreateStream("t", ("b", "c"), 2)).ok
    heard = {"a": 0.0, "b": 9.0, "c": 9.5}
    ends = {"s": {"b": 3, "c": 5}, "t": {"c": 1}}
    assert failover_decisions(state.streams(), heard, 10.0, 1.5, ends) == [Elect("s", 1, "c")]
    heard["a"] = 9.9
    assert failover_decisions(state.streams(), heard, 10.0, 1.5, ends) == []
    heard = {"a": 0.0, "b": 0.0, "c": 0.0}
    assert failover_decisions(state.streams(), heard, 10.0, 1.5, ends) == []  # nobody to elect


def test_a_primary_silent_for_a_few_heartbeats_is_probed_once_per_silence() -> None:
    state = created()  # s: primary a
    assert state.apply(CreateStream("t", ("b", "c"), 2)).ok  # t: primary b
    assert state.apply(CreateStream("u", ("a", "c"), 2)).ok  # u: primary a again
    streams = tuple(state.streams())
    heard = {"a": 9.4, "b": 9.8, "c": 9.9}
    assert to_probe(streams, heard, 10.0, 0.5, {}) == ["a"]  # once, though it leads two
    assert to_probe(streams, heard, 10.0, 0.7, {}) == []  # not silent long enough
    assert to_probe(streams, heard, 10.0, 0.5, {"a": 9.4}) == []  # probed in this silence
    heard = {"a": 10.5, "b": 11.0, "c": 11.0}  # a heard again, then silent again: probed
    assert to_probe(streams, heard, 11.2, 0.5, {"a": 9.4}) == ["a"]
    assert to_probe(streams, heard, 11.6, 0.5, {"a": 10.5}) == ["b"]  # a asked, b silent now
    assert to_probe(streams, {"b": 9.0}, 10.0, 0.5, {}) == ["b"]  # a never heard: not probed


def test_a_gone_primary_fails_over_in_the_next_round_a_silent_one_only_after_the_timeout() -> None:
    """What the voter does with a probe's answer: a gone process's last-heard time is dropped
    (minus infinity), so the failover round elects at once; without it, 0.6 s of silence is
    not yet a failover at 1.5 s."""
    state = created()
    heard = {"a": 9.4, "b": 9.9, "c": 9.9}
    ends = {"s": {"b": 3, "c": 5}}
    assert failover_decisions(state.streams(), heard, 10.0, 1.5, ends) == []
    heard["a"] = float("-inf")
    assert failover_decisions(state.streams(), heard, 10.0, 1.5, ends) == [Elect("s", 1, "c")]
