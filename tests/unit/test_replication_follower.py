"""peer.replication.core.follower and .history: fencing, gaps, duplicates, reconciliation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.replication.core import (
    AppendReply,
    EpochEnd,
    EpochEndReply,
    EpochStart,
    Follower,
    Refusal,
    ReplicaAppend,
    SaveEpoch,
    SaveHistory,
    Truncate,
    WriteEntry,
)
from peer.replication.core.history import check_history, end_of, epoch_at, truncated, with_entry

S = "s"


def append(
    epoch: int, offset: int, entry_epoch: int | None = None, body: bytes = b"x"
) -> ReplicaAppend:
    return ReplicaAppend(S, epoch, offset, entry_epoch or epoch, body, "p", offset)


def history(*pairs: tuple[int, int]) -> tuple[EpochStart, ...]:
    return tuple(EpochStart(e, s) for e, s in pairs)


def reconciled(epoch: int, log_end: int, hist: tuple[EpochStart, ...]) -> Follower:
    follower = Follower(S, "f", epoch=epoch, log_end=log_end, history=hist)
    follower.reconciled = True
    return follower


def test_an_empty_replica_takes_the_first_entry_history_first() -> None:
    follower = Follower(S, "f")
    reply, effects = follower.receive(append(1, 0, body=b"b0"))
    assert reply == AppendReply(S, 1, "f", 0)
    assert effects == (
        SaveEpoch(1),
        SaveHistory(history((1, 0))),
        WriteEntry(0, 1, b"b0", "p", 0),
    )


def test_appends_from_a_lower_epoch_are_fenced() -> None:
    follower = reconciled(3, 4, history((1, 0), (3, 2)))
    reply, effects = follower.receive(append(2, 5))
    assert reply == AppendReply(S, 3, "f", 4, Refusal.STALE_EPOCH)
    assert effects == ()
    assert follower.log_end == 4


def test_a_gap_is_answered_with_the_log_end_and_a_duplicate_changes_nothing() -> None:
    follower = reconciled(1, 4, history((1, 0)))
    assert follower.receive(append(1, 7)) == (AppendReply(S, 1, "f", 4, Refusal.GAP), ())
    assert follower.receive(append(1, 2)) == (AppendReply(S, 1, "f", 4), ())
    assert follower.log_end == 4


def test_a_higher_epoch_is_saved_and_reconciled_before_anything_is_written() -> None:
    follower = reconciled(1, 4, history((1, 0)))
    reply, effects = follower.receive(append(2, 5))
    assert reply == EpochEnd(S, 2, "f", 1)
    assert effects == (SaveEpoch(2),)
    assert follower.log_end == 4 and not follower.reconciled
    # until the answer arrives, appends only repeat the question
    assert follower.receive(append(2, 5)) == (EpochEnd(S, 2, "f", 1), ())


def test_an_empty_replica_needs_no_reconciling() -> None:
    follower = Follower(S, "f", epoch=1)
    assert follower.on_new_epoch(4) == (SaveEpoch(4),)
    assert follower.reconciled
    assert follower.on_new_epoch(3) == ()


def test_the_divergent_tail_is_cut_truncation_before_history() -> None:
    # epoch 2 wrote 3..5 here, but the primary of epoch 3 never saw epoch 2
    follower = Follower(S, "f", epoch=3, log_end=5, history=history((1, 0), (2, 3)))
    ask, _ = follower.receive(append(3, 3))
    assert ask == EpochEnd(S, 3, "f", 2)
    reply, effects = follower.on_epoch_end(EpochEndReply(S, 3, 1, 2))
    assert effects == (Truncate(2), SaveHistory(history((1, 0))))
    assert reply == AppendReply(S, 3, "f", 2)
    assert follower.reconciled and follower.log_end == 2


def test_the_tail_of_a_shared_epoch_is_cut_at_the_primary_s_end() -> None:
    follower = Follower(S, "f", epoch=2, log_end=6, history=history((1, 0)))
    follower.receive(append(2, 7))
    reply, effects = follower.on_epoch_end(EpochEndReply(S, 2, 1, 4))
    assert effects == (Truncate(4),)
    assert reply == AppendReply(S, 2, "f", 4)


def test_reconciling_takes_rounds_when_the_histories_differ_twice() -> None:
    # ours: epoch 1 at 0..3, epoch 3 at 4..6; the primary's: 1 at 0..1, 2 at 2..4, 4 from 5
    follower = Follower(S, "f", epoch=4, log_end=6, history=history((1, 0), (3, 4)))
    assert follower.receive(append(4, 5))[0] == EpochEnd(S, 4, "f", 3)
    ask, effects = follower.on_epoch_end(EpochEndReply(S, 4, 2, 4))
    assert effects == (Truncate(3), SaveHistory(history((1, 0))))
    assert ask == EpochEnd(S, 4, "f", 1)
    # the first answer again is stale now: it answers a question about a later epoch
    assert follower.on_epoch_end(EpochEndReply(S, 4, 2, 4)) == (None, ())
    reply, effects = follower.on_epoch_end(EpochEndReply(S, 4, 1, 1))
    assert effects == (Truncate(1),)
    assert reply == AppendReply(S, 4, "f", 1)
    assert follower.history == history((1, 0))


def test_a_primary_without_any_of_our_epochs_cuts_everything() -> None:
    follower = Follower(S, "f", epoch=3, log_end=2, history=history((2, 0)))
    follower.receive(append(3, 0))
    reply, effects = follower.on_epoch_end(EpochEndReply(S, 3, 0, -1))
    assert effects == (Truncate(-1), SaveHistory(()))
    assert reply == AppendReply(S, 3, "f", -1)


def test_entries_of_the_primary_s_own_epoch_are_never_cut() -> None:
    # restarted while epoch 2 went on: a delayed answer names an end we have passed since
    follower = Follower(S, "f", epoch=2, log_end=6, history=history((1, 0), (2, 3)))
    follower.receive(append(2, 7))
    reply, effects = follower.on_epoch_end(EpochEndReply(S, 2, 2, 4))
    assert effects == ()
    assert reply == AppendReply(S, 2, "f", 6)


def test_answers_from_another_epoch_or_after_reconciling_are_ignored() -> None:
    follower = Follower(S, "f", epoch=2, log_end=3, history=history((1, 0)))
    follower.receive(append(2, 4))
    assert follower.on_epoch_end(EpochEndReply(S, 1, 1, 0)) == (None, ())
    assert follower.on_epoch_end(EpochEndReply(S, 2, 1, 3))[0] == AppendReply(S, 2, "f", 3)
    assert follower.on_epoch_end(EpochEndReply(S, 2, 1, 0)) == (None, ())
    assert follower.log_end == 3


def test_an_entry_from_an_older_epoch_than_ours_makes_it_reconcile_again() -> None:
    follower = reconciled(3, 4, history((1, 0), (3, 2)))
    reply, effects = follower.receive(append(3, 5, entry_epoch=2))
    assert reply == EpochEnd(S, 3, "f", 3)
    assert effects == () and not follower.reconciled


def test_a_restart_drops_empty_epochs_and_checks_its_state() -> None:
    follower = Follower(S, "f", epoch=2, log_end=4, history=history((1, 0), (2, 5)))
    assert follower.history == history((1, 0))
    assert not follower.reconciled
    with pytest.raises(ValueError, match="history holds epoch 3 above its epoch 2"):
        Follower(S, "f", epoch=2, log_end=4, history=history((1, 0), (3, 2)))
    with pytest.raises(ValueError, match="out of order"):
        Follower(S, "f", epoch=3, log_end=4, history=history((2, 0), (1, 2)))
    with pytest.raises(ValueError, match="stream 'other'"):
        follower.receive(ReplicaAppend("other", 2, 0, 1, b""))


def test_messages_name_their_wrong_field() -> None:
    with pytest.raises(ValueError, match=r"ReplicaAppend.offset must be an int >= 0"):
        ReplicaAppend(S, 1, -1, 1, b"")
    with pytest.raises(ValueError, match=r"entry_epoch 3 is above its epoch 2"):
        ReplicaAppend(S, 2, 0, 3, b"")
    with pytest.raises(ValueError, match=r"ReplicaAppend.body must be bytes"):
        ReplicaAppend(S, 1, 0, 1, "text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ReplicaAppend.origin must be a non-empty str"):
        ReplicaAppend(S, 1, 0, 1, b"", None, 3)
    with pytest.raises(ValueError, match=r"AppendReply.epoch must be an int"):
        AppendReply(S, True, "f", 0)
    with pytest.raises(ValueError, match=r"EpochEnd.last_epoch 3 is above epoch 2"):
        EpochEnd(S, 2, "f", 3)
    with pytest.raises(ValueError, match=r"EpochEndReply.end must be an int >= -1"):
        EpochEndReply(S, 2, 1, -2)
    with pytest.raises(ValueError, match=r"epoch must be an int >= 1"):
        EpochStart(0, 0)


def test_history_helpers() -> None:
    h = history((1, 0), (2, 5), (3, 5), (5, 8))
    assert end_of(h, 10, 4) == (3, 7)
    assert end_of(h, 10, 2) == (2, 4)
    assert end_of(h, 10, 9) == (5, 10)
    assert end_of(history((2, 0)), 3, 1) == (0, -1)
    assert epoch_at(h, 5) == 3 and epoch_at(h, 4) == 1 and epoch_at(h, 9) == 5
    assert truncated(h, 5) == h[:3]
    assert with_entry(h, 5, 11) == h
    assert with_entry(h, 6, 11) == (*h, EpochStart(6, 11))
    with pytest.raises(ValueError, match="follows epoch 5"):
        with_entry(h, 4, 11)
    with pytest.raises(ValueError, match="holds offset 0"):
        check_history(history((1, 3)), 5)
    with pytest.raises(ValueError, match="beyond log end"):
        check_history(history((1, 0), (2, 9)), 5)


log_of = st.lists(st.binary(max_size=3), min_size=1, max_size=8)


@settings(max_examples=200)
@given(log_of, st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=40))
def test_whatever_arrives_the_log_is_a_prefix_of_the_primary_s(
    primary_log: list[bytes], arrivals: list[tuple[int, bool]]
) -> None:
    """Appends of epoch 2, duplicated, reordered and lost, mixed with a deposed primary's of
    epoch 1: the follower holds exactly the first ``log_end + 1`` entries of epoch 2's primary,
    and says so in every reply."""
    follower = Follower(S, "f", epoch=2)
    held: list[bytes] = []
    for index, stale in arrivals:
        offset = index % len(primary_log)
        if stale:
            message = ReplicaAppend(S, 1, offset, 1, b"stale")
        else:
            message = ReplicaAppend(S, 2, offset, 2, primary_log[offset])
        reply, effects = follower.receive(message)
        for effect in effects:
            if isinstance(effect, WriteEntry):
                assert effect.offset == len(held)
                held.append(effect.body)
        assert isinstance(reply, AppendReply)
        assert reply.log_end == len(held) - 1 == follower.log_end
        assert held == primary_log[: len(held)]
        assert reply.accepted == (not stale and offset <= len(held) - 1)
        assert (reply.refused is Refusal.STALE_EPOCH) == stale


PURE = {"__future__", "collections.abc", "dataclasses", "enum", "itertools", "math", "typing"}


@pytest.mark.parametrize("package", ["replication/core", "replication/control"])
def test_the_cores_import_nothing_that_does_io_or_reads_a_clock(package: str) -> None:
    root = Path(__file__).resolve().parents[2] / "peer" / package
    imported = set()
    paths = list(root.glob("*.py"))
    assert len(paths) >= 4, f"no core modules found in {root}"
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    ours = {name for name in imported if name.startswith("peer." + package.replace("/", "."))}
    assert imported - ours <= PURE, imported - ours - PURE
