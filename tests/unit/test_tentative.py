"""Tentative entries and undos in a result log (peer.model.tentative), without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.model.tentative import (
    STABLE,
    TENTATIVE,
    UNDO,
    Entry,
    TentativeView,
    UndoMark,
    stable_rows,
    visible_to,
)

# A schedule step: ("stable", rows) emits the next stable batch of the failure-free output,
# ("tentative", rows) a tentative batch, ("undo",) takes back what is tentative.
step = st.one_of(
    st.tuples(st.just(STABLE), st.lists(st.integers(0, 99), min_size=1, max_size=4)),
    st.tuples(st.just(TENTATIVE), st.lists(st.integers(100, 199), min_size=1, max_size=4)),
    st.tuples(st.just(UNDO)),
)


def write(schedule: list[tuple[object, ...]]) -> tuple[list[Entry], list[int]]:
    """The log a writer makes of ``schedule`` (undos named by UndoMark), and the
    failure-free output (the stable rows in the order they were emitted)."""
    mark, log, expected = UndoMark(), list[Entry](), list[int]()
    for item in schedule:
        offset = len(log)
        if item[0] == UNDO:
            first = mark.take()
            if first is not None:
                log.append(Entry(offset, UNDO, undo=first))
            continue
        status, rows = item[0], item[1]
        assert isinstance(status, str) and isinstance(rows, list)
        log.append(Entry(offset, status, tuple(rows)))
        mark.wrote(offset, status)
        if status == STABLE:
            expected.extend(rows)
    return log, expected


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_the_stable_view_is_the_failure_free_output_for_any_interleaving(
    schedule: list[tuple[object, ...]],
) -> None:
    log, expected = write(schedule)
    assert stable_rows(log) == expected
    # a stable reader skips exactly what visible_to says, and sees the same
    seen = [r for e in log if visible_to(e.status, tentative=False) for r in e.rows]
    assert seen == expected
    # a tentative reader: stable rows plus the tentative rows not yet taken back
    view = TentativeView()
    open_tentative: list[int] = []
    for entry in log:
        view.apply(entry)
        if entry.status == TENTATIVE:
            open_tentative.extend(entry.rows)
        elif entry.status == UNDO:
            open_tentative = []
        assert sorted(view.tentative_rows()) == sorted(open_tentative)
        assert [r for r in view.rows() if r < 100] == stable_rows(
            [e for e in log if e.offset <= entry.offset]
        )
    # after a final undo, the tentative reader holds exactly the failure-free output
    first = UndoMark.recovered([(e.offset, e.status, e.undo) for e in log]).take()
    if first is not None:
        view.apply(Entry(len(log), UNDO, undo=first))
    assert view.rows() == expected
    assert view.undone == sum(len(e.rows) for e in log if e.status == TENTATIVE)


def test_an_undo_keeps_the_stable_entries_written_among_the_tentative_ones() -> None:
    view = TentativeView()
    for entry in (
        Entry(0, STABLE, (1,)),
        Entry(1, TENTATIVE, (101,)),
        Entry(2, STABLE, (2,)),
        Entry(3, TENTATIVE, (102,)),
        Entry(4, UNDO, undo=1),
        Entry(5, STABLE, (3,)),
    ):
        view.apply(entry)
    assert view.rows() == [1, 2, 3]
    assert view.undone == 2


def test_undo_mark_names_the_first_tentative_offset_once() -> None:
    mark = UndoMark()
    mark.wrote(0, STABLE)
    assert mark.take() is None
    mark.wrote(3, TENTATIVE)
    mark.wrote(4, STABLE)
    mark.wrote(5, TENTATIVE)
    assert mark.take() == 3
    assert mark.take() is None
    recovered = UndoMark.recovered([(0, TENTATIVE, None), (1, UNDO, 0), (2, TENTATIVE, None)])
    assert recovered.take() == 2


@pytest.mark.parametrize(
    ("offset", "status", "undo"),
    [(3, "maybe", None), (3, UNDO, None), (3, STABLE, 1), (3, UNDO, 3), (3, UNDO, -1)],
)
def test_malformed_entries_are_refused(offset: int, status: str, undo: int | None) -> None:
    with pytest.raises(ValueError, match="entry 3"):
        Entry(offset, status, undo=undo)


def test_entries_out_of_order_are_refused() -> None:
    view = TentativeView()
    view.apply(Entry(2, STABLE, (1,)))
    with pytest.raises(ValueError, match="out of order"):
        view.apply(Entry(2, STABLE, (1,)))
