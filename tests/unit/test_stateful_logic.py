"""The per-group logic of the count-based boxes, against straightforward references."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from peer.engine.stateful import BoundedSorter, TupleWindows
from peer.model.plan import AggregateCall

CALLS = (
    AggregateCall("count", None, "n", "long"),
    AggregateCall("sum", "x", "s", "long"),
    AggregateCall("min", "x", "lo", "long"),
    AggregateCall("max", "x", "hi", "long"),
    AggregateCall("firstval", "x", "first", "long"),
    AggregateCall("lastval", "x", "last", "long"),
    AggregateCall("count_distinct", "x", "d", "long"),
)


def reference_windows(
    values: list[int], size: int, advance: int
) -> list[tuple[int, int, list[int]]]:
    out: list[tuple[int, int, list[int]]] = []
    start = 0
    while start + size <= len(values):
        w = values[start : start + size]
        out.append(
            (start, start + size, [len(w), sum(w), min(w), max(w), w[0], w[-1], len(set(w))])
        )
        start += advance
    return out


@given(
    st.lists(st.integers(-50, 50), max_size=60),
    st.integers(1, 7),
    st.integers(1, 7),
    st.integers(1, 10),
)
def test_tuple_windows_match_reference_across_state_round_trips(
    values: list[int], size: int, advance: int, every: int
) -> None:
    advance = min(advance, size)
    windows = TupleWindows(size, advance, CALLS)
    got: list[tuple[int, int, list[Any]]] = []
    for i, v in enumerate(values):
        if i % every == 0:  # a micro-batch boundary: state goes through the state store
            restored = TupleWindows(size, advance, CALLS)
            restored.load(windows.dump())
            windows = restored
        got.extend(windows.add([None, v, v, v, v, v, v]))
    assert [(s, e, list(a)) for s, e, a in got] == reference_windows(values, size, advance)


def reference_bsort(items: list[tuple[int, int]], slack: int) -> list[int]:
    buffer, out = [], []
    for order, seq in items:
        buffer.append((order, seq))
        if len(buffer) > slack:
            buffer.sort()
            out.append(buffer.pop(0)[1])
    return out


@given(st.lists(st.integers(0, 20), max_size=50), st.integers(0, 5), st.integers(1, 10))
def test_bounded_sort_matches_reference(orders: list[int], slack: int, every: int) -> None:
    sorter = BoundedSorter(slack)
    got: list[Any] = []
    for seq, order in enumerate(orders):
        if seq % every == 0:
            restored = BoundedSorter(slack)
            restored.load(sorter.dump())
            sorter = restored
        got.extend(row[0] for row in sorter.add(order, seq, [seq]))
    assert got == reference_bsort(list(zip(orders, range(len(orders)), strict=True)), slack)


def test_bounded_sort_with_zero_slack_is_identity() -> None:
    sorter = BoundedSorter(0)
    assert [sorter.add(o, i, [o]) for i, o in enumerate([3, 1, 2])] == [[[3]], [[1]], [[2]]]
