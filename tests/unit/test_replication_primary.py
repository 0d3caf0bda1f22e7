"""peer.replication.core.primary: acknowledging, refusing, ISR proposals, deposition."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from peer.replication.core import (
    Appended,
    AppendReply,
    Duplicate,
    EpochEnd,
    EpochEndReply,
    EpochStart,
    IsrProposal,
    Outgoing,
    Primary,
    Probe,
    PushRefusal,
    Refusal,
    Refused,
    ReplicaAppend,
    SaveEpoch,
    SaveHistory,
    Ship,
    WriteEntry,
    begin_epoch,
)

S = "s"


def make(
    *,
    epoch: int = 1,
    log_end: int = -1,
    in_sync: tuple[str, ...] = ("a", "b", "c"),
    replicas: tuple[str, ...] = ("a", "b", "c"),
    min_insync: int = 2,
    history: tuple[EpochStart, ...] | None = None,
    seqs: dict[str, int] | None = None,
) -> Primary:
    if history is None:
        history = (EpochStart(epoch, log_end + 1),) if log_end < 0 else (EpochStart(1, 0),)
        if epoch > 1 and log_end >= 0:
            history = (EpochStart(1, 0), EpochStart(epoch, log_end + 1))
    return Primary(
        S,
        "a",
        epoch=epoch,
        version=1,
        replicas=replicas,
        in_sync=in_sync,
        min_insync=min_insync,
        log_end=log_end,
        history=history,
        now=0.0,
        seqs=seqs,
        replica_lag_s=1.0,
        resend_s=0.2,
        propose_retry_s=0.5,
        max_ship=3,
    )


def push(primary: Primary, seq: int, now: float = 0.0) -> Appended:
    outcome = primary.append(f"b{seq}".encode(), origin="p", seq=seq, now=now)
    assert isinstance(outcome, Appended), outcome
    return outcome


def ok(node: str, end: int, epoch: int = 1) -> AppendReply:
    return AppendReply(S, epoch, node, end)


def test_an_append_is_written_then_sent_and_acknowledged_when_every_isr_member_holds_it() -> None:
    primary = make()
    appended = push(primary, 0)
    assert appended.offset == 0 and appended.acknowledged == -1
    assert appended.effects == (WriteEntry(0, 1, b"b0", "p", 0),)
    message = ReplicaAppend(S, 1, 0, 1, b"b0", "p", 0)
    assert appended.messages == (Outgoing("b", message), Outgoing("c", message))
    progress = primary.on_reply(ok("b", 0), 0.1)
    assert progress.acknowledged == -1  # min_insync (2) hold it, but c is in the ISR too
    progress = primary.on_reply(ok("c", 0), 0.1)
    assert progress.acknowledged == 0 and progress.newly_acknowledged == range(0, 1)


def test_a_duplicate_id_is_acknowledged_with_what_the_log_held() -> None:
    primary = make(log_end=4, seqs={"p": 2})
    assert primary.append(b"again", origin="p", seq=2, now=0.0) == Duplicate(4)
    assert primary.append(b"older", origin="p", seq=0, now=0.0) == Duplicate(4)
    assert isinstance(primary.append(b"new", origin="p", seq=3, now=0.0), Appended)


def test_too_few_in_sync_members_refuse_retriably() -> None:
    primary = make(in_sync=("a",))
    refused = primary.append(b"x", now=0.0)
    assert isinstance(refused, Refused) and refused.retriable
    assert refused.reason is PushRefusal.TOO_FEW_IN_SYNC
    assert "stream 's' has 1 in-sync replicas (a); 2 needed" in refused.detail
    assert primary.log_end == -1
    assert isinstance(make(in_sync=("a",), min_insync=1).append(b"x", now=0.0), Appended)


def test_a_lagging_member_counts_as_unreachable() -> None:
    primary = make(in_sync=("a", "b"))
    push(primary, 0, now=0.0)  # b never answers
    assert isinstance(primary.append(b"x", origin="p", seq=1, now=0.9), Appended)
    refused = primary.append(b"y", origin="p", seq=2, now=1.1)
    assert isinstance(refused, Refused) and refused.reason is PushRefusal.TOO_FEW_REACHABLE
    primary.on_reply(ok("b", 1), 1.2)  # b catches up: reachable again
    assert isinstance(primary.append(b"y", origin="p", seq=2, now=1.2), Appended)


def test_a_lagging_member_is_shrunk_through_the_control_plane_first() -> None:
    primary = make()
    push(primary, 0)
    primary.on_reply(ok("b", 0), 0.1)
    assert primary.tick(0.9).proposals == ()
    progress = primary.tick(1.1)
    assert progress.proposals == (IsrProposal("shrink", "c", 1, 1),)
    assert primary.tick(1.3).proposals == ()  # one proposal at a time, re-sent ...
    assert primary.tick(1.7).proposals == (IsrProposal("shrink", "c", 1, 1),)  # ... later
    assert primary.on_reply(ok("b", 0), 1.8).acknowledged == -1  # still waiting for c
    progress = primary.on_isr(1, 2, ("a", "b"))
    assert progress.acknowledged == 0 and progress.newly_acknowledged == range(0, 1)


def test_a_stale_isr_update_changes_nothing() -> None:
    primary = make()
    push(primary, 0)
    primary.on_reply(ok("b", 0), 0.1)
    assert primary.on_isr(1, 1, ("a", "b")).acknowledged == -1  # not a newer version
    assert primary.in_sync == ("a", "b", "c")
    with pytest.raises(ValueError, match="a leads 's' but is not in its ISR"):
        primary.on_isr(1, 2, ("b", "c"))


def test_a_caught_up_replica_is_counted_from_the_moment_its_expansion_is_proposed() -> None:
    primary = make(in_sync=("a", "b"), min_insync=1)
    push(primary, 0)
    primary.on_reply(ok("b", 0), 0.1)
    assert primary.acknowledged == 0
    progress = primary.on_reply(ok("c", 0), 0.2)
    assert progress.proposals == (IsrProposal("expand", "c", 1, 1),)
    assert primary.counted() == ("a", "b", "c")
    push(primary, 1, now=0.3)
    assert primary.on_reply(ok("b", 1), 0.3).acknowledged == 0  # waits for c already
    assert primary.on_reply(ok("c", 1), 0.3).acknowledged == 1
    # the control plane settled something else at version 2: the proposal can never apply
    primary.on_isr(1, 2, ("a", "b"))
    assert primary.counted() == ("a", "b")


def test_expansion_waits_until_the_follower_holds_what_the_primary_held_at_taking_office() -> None:
    # entries 0..5 came from epoch 1, where some were acknowledged: nothing says which, and b
    # has not reported in epoch 2, so the acknowledged end here is still -1
    primary = make(epoch=2, log_end=5, in_sync=("a", "b"), min_insync=1)
    assert primary.epoch_start == 6 and primary.acknowledged == -1
    progress = primary.on_reply(ok("c", 3, epoch=2), 0.1)
    assert progress.proposals == ()
    assert progress.ships == (Ship("c", 4, 5),)
    assert primary.on_reply(ok("c", 5, epoch=2), 0.2).proposals == (
        IsrProposal("expand", "c", 2, 1),
    )


def test_a_primary_restarted_in_office_expands_only_with_followers_holding_its_whole_log() -> None:
    # restarted in epoch 1: entries up to 5 are on disk, some acknowledged before the crash
    primary = make(epoch=1, log_end=5, in_sync=("a", "b"), min_insync=1)
    assert primary.epoch_start == 0 and primary.acknowledged == -1
    assert primary.on_reply(ok("c", 3), 0.1).proposals == ()
    assert primary.on_reply(ok("c", 5), 0.2).proposals == (IsrProposal("expand", "c", 1, 1),)


def test_gaps_and_resends_ship_ranges_of_at_most_max_ship() -> None:
    primary = make(log_end=9, in_sync=("a", "b"))
    assert primary.on_reply(AppendReply(S, 1, "b", 2, Refusal.GAP), 0.0).ships == (Ship("b", 3, 5),)
    assert primary.on_reply(ok("b", 4), 0.05).ships == ()  # 5 is still in flight
    assert primary.on_reply(ok("b", 5), 0.1).ships == (Ship("b", 6, 8),)
    assert primary.tick(0.2).messages == (Outgoing("c", Probe(S, 1)),)  # c is unknown
    assert primary.tick(0.35).ships == (Ship("b", 6, 8),)  # b silent for resend_s


def test_replies_that_cannot_be_from_this_epoch_s_followers_are_ignored() -> None:
    primary = make(epoch=2, log_end=3, in_sync=("a", "b"), min_insync=1)
    assert primary.on_reply(ok("b", 3, epoch=1), 0.0).acknowledged == -1  # older epoch
    assert primary.on_reply(ok("z", 3, epoch=2), 0.0).acknowledged == -1  # not a replica
    assert primary.on_reply(ok("b", 7, epoch=2), 0.0).acknowledged == -1  # beyond our log
    assert primary.on_reply(ok("b", 3, epoch=2), 0.0).acknowledged == 3
    assert primary.on_reply(ok("b", 1, epoch=2), 0.0).acknowledged == 3  # late: no step back


def _by_reply(primary: Primary) -> bool:
    return primary.on_reply(ok("b", 0, epoch=2), 0.0).deposed


def _by_control_plane(primary: Primary) -> bool:
    return primary.on_isr(2, 5, ("b", "c")).deposed


def _by_question(primary: Primary) -> bool:
    return primary.on_epoch_end(EpochEnd(S, 2, "b", 1)) is None and primary.deposed


def _by_append(primary: Primary) -> bool:
    return primary.fence(ReplicaAppend(S, 2, 0, 2, b"")) is None and primary.deposed


@pytest.mark.parametrize("learn", [_by_reply, _by_control_plane, _by_question, _by_append])
def test_a_higher_epoch_deposes_the_primary(learn: Callable[[Primary], bool]) -> None:
    primary = make()
    assert learn(primary)
    refused = primary.append(b"x", now=0.0)
    assert isinstance(refused, Refused) and refused.reason is PushRefusal.NOT_PRIMARY
    assert primary.tick(5.0).proposals == ()
    assert primary.on_reply(ok("b", 0), 5.0).acknowledged == -1


def test_appends_of_its_own_or_an_older_epoch_are_fenced_by_the_primary() -> None:
    primary = make(epoch=3, log_end=4)
    for epoch in (2, 3):
        assert primary.fence(ReplicaAppend(S, epoch, 5, 1, b"")) == AppendReply(
            S, 3, "a", 4, Refusal.STALE_EPOCH
        )
    assert not primary.deposed


def test_epoch_end_answers_from_the_history() -> None:
    primary = make(epoch=3, log_end=7, history=(EpochStart(1, 0), EpochStart(3, 4)))
    assert primary.on_epoch_end(EpochEnd(S, 3, "b", 2)) == EpochEndReply(S, 3, 1, 3)
    assert primary.on_epoch_end(EpochEnd(S, 3, "b", 3)) == EpochEndReply(S, 3, 3, 7)
    assert primary.on_epoch_end(EpochEnd(S, 2, "b", 1)) is None  # asked of epoch 2's primary


def test_entry_messages_carry_the_epoch_that_wrote_the_entry() -> None:
    primary = make(epoch=3, log_end=7, history=(EpochStart(1, 0), EpochStart(3, 4)))
    push(primary, 9)
    assert primary.entry_message(2, b"old").entry_epoch == 1
    assert primary.entry_message(8, b"new").entry_epoch == 3
    with pytest.raises(ValueError, match="offset 9 is not in 's'"):
        primary.entry_message(9, b"")


def test_begin_epoch_records_the_start_once() -> None:
    history, effects = begin_epoch((EpochStart(1, 0),), 3, 6)
    assert history == (EpochStart(1, 0), EpochStart(3, 7))
    assert effects == (SaveEpoch(3), SaveHistory(history))
    assert begin_epoch(history, 3, 9) == (history, (SaveEpoch(3),))  # restarted in office
    with pytest.raises(ValueError, match="has seen epoch 3 cannot lead epoch 2"):
        begin_epoch(history, 2, 9)


def test_a_primary_is_built_only_from_a_consistent_state() -> None:
    with pytest.raises(ValueError, match="does not end with its epoch start"):
        make(epoch=2, log_end=3, history=(EpochStart(1, 0),))
    with pytest.raises(ValueError, match="must be drawn from distinct replicas"):
        make(in_sync=("a", "d"))
    with pytest.raises(ValueError, match="a leads 's' but is not in its ISR"):
        make(in_sync=("b", "c"))
