"""The durable record of moves (peer.move.journal): intents survive a restart whole, an
outcome is final, and epochs count only arrivals."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from peer.move.journal import JOURNAL_DIR, Decision, Intent, Journal, Outcome

IDS = st.text("0123456789abcdef", min_size=32, max_size=32)
NAMES = st.text("abcdefghij_", min_size=1, max_size=12)


def intent(move_id: str = "a" * 32, fragment: str = "agg") -> Intent:
    return Intent(
        id=move_id,
        fragment=fragment,
        target="b" * 64,
        incarnation="inc1",
        epoch=3,
        replica_inputs=["r"],
        hosted_inputs=["h"],
        outputs=["o"],
        readers={"h": ["query:agg-0"]},
        kept=["h"],
    )


def test_an_intent_reads_back_as_written_and_across_a_new_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path, fsync=False)
    first = intent()
    first.detached["r"] = ("c" * 64, 17)
    first.phase = "installing"
    journal.write_intent(first)
    again = Journal(tmp_path, fsync=False).intents()
    assert again == [first]
    assert journal.fragments_in_doubt() == {"agg"}
    journal.drop_intent(first.id)
    assert journal.intents() == [] and journal.fragments_in_doubt() == set()


def test_a_rewritten_intent_replaces_the_old_one(tmp_path: Path) -> None:
    journal = Journal(tmp_path, fsync=False)
    record = intent()
    journal.write_intent(record)
    record.phase = "installing"
    journal.write_intent(record)
    assert [i.phase for i in journal.intents()] == ["installing"]


def test_a_malformed_intent_is_skipped_not_fatal(tmp_path: Path) -> None:
    journal = Journal(tmp_path, fsync=False)
    journal.write_intent(intent("1" * 32, "good"))
    (tmp_path / JOURNAL_DIR / f"out-{'2' * 32}.json").write_text(json.dumps({"id": "x"}))
    (tmp_path / JOURNAL_DIR / f"out-{'3' * 32}.json").write_text("{not json")
    assert [i.fragment for i in journal.intents()] == ["good"]


def test_outcomes_are_found_by_id_and_epochs_count_only_arrivals(tmp_path: Path) -> None:
    journal = Journal(tmp_path, fsync=False)
    assert journal.outcome("f" * 32) is None and journal.last_epoch("agg") == 0
    journal.decide(Outcome("1" * 32, "agg", 1, "aborted", "alpha"))
    assert journal.last_epoch("agg") == 0  # the sender retries with the same epoch
    journal.decide(Outcome("2" * 32, "agg", 1, "installed", "alpha"))
    journal.decide(Outcome("3" * 32, "other", 7, "installed", "alpha"))
    assert journal.last_epoch("agg") == 1 and journal.last_epoch("other") == 7
    assert journal.outcome("1" * 32) == Outcome("1" * 32, "agg", 1, "aborted", "alpha")
    assert journal.outcome("../../etc/passwd") is None  # not an id: never a path


def test_arrivals_are_kept_until_dropped(tmp_path: Path) -> None:
    journal = Journal(tmp_path, fsync=False)
    journal.write_arrival("4" * 32, {"id": "4" * 32, "manifest": {"fragment": "agg"}})
    assert [a["id"] for a in Journal(tmp_path, fsync=False).arrivals()] == ["4" * 32]
    journal.drop_arrival("4" * 32)
    assert journal.arrivals() == []


@given(
    st.lists(st.tuples(IDS, NAMES, st.integers(1, 50), st.booleans()), max_size=12),
    NAMES,
)
def test_last_epoch_is_the_highest_installed_epoch(
    moves: list[tuple[str, str, int, bool]], name: str
) -> None:
    with tempfile.TemporaryDirectory() as where:
        journal = Journal(Path(where), fsync=False)
        final: dict[str, tuple[str, int, bool]] = {}
        for move_id, fragment, epoch, installed in moves:
            decision: Decision = "installed" if installed else "aborted"
            journal.decide(Outcome(move_id, fragment, epoch, decision, "p"))
            final[move_id] = (fragment, epoch, installed)
        want = max((e for f, e, ok in final.values() if ok and f == name), default=0)
        assert journal.last_epoch(name) == want
