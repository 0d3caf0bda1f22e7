"""Partial aggregates of the lane's windowed members (peer.engine.lanepartial), without a JVM:
partials computed over arbitrary pieces of the input (partitions of a batch, batches) and
merged give what aggregating all rows at once gives, for every function the lane takes,
checked against plain Python that cuts the windows and aggregates tuple by tuple."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.engine.lanepartial import Partials, final
from peer.engine.lanewin import MERGEABLE, WindowState, narrow_schema, window_box
from peer.model.plan import check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema, to_arrow_schema

EV = Schema(
    "ev",
    (
        Field("t", "long"),
        Field("k", "int", nullable=True),
        Field("s", "string", nullable=True),
        Field("v", "long", nullable=True),
        Field("x", "double", nullable=True),
        Field("ts", "timestamp", nullable=True),
        Field("b", "bool", nullable=True),
    ),
)
BASE = datetime(2026, 1, 1, tzinfo=UTC)

# Every function the lane takes, over every kind of argument it can have.
CALLS = [
    ("count", None),
    ("count", "v"),
    ("count", "s"),
    ("count_distinct", "v"),
    ("count_distinct", "s"),
    ("count_distinct", "ts"),
    ("count_distinct", "b"),
    ("sum", "v"),
    ("sum", "x"),
    ("sum", "k"),
    ("avg", "v"),
    ("avg", "x"),
    ("min", "v"),
    ("min", "s"),
    ("min", "ts"),
    ("min", "x"),
    ("min", "b"),
    ("max", "k"),
    ("max", "s"),
    ("max", "ts"),
    ("max", "x"),
    ("max", "b"),
]


def spelled(calls: list[tuple[str, str | None]], size: int, advance: int, slack: int) -> Any:
    params = {
        "window-size-by": "VALUES",
        "order-on-field": "t",
        "window-size": str(size),
        "advance": str(advance),
        "slack": str(slack),
        "group-by": "k,s",
    }
    for i, (fn, arg) in enumerate(calls):
        params[f"aggregate-function.{i}"] = f"{fn}({arg or ''})"
        params[f"aggregate-function-output-name.{i}"] = f"a{i}"
    box = {"name": "w", "type": "aggregate", "inputs": ["ev"], "outputs": ["o"], "params": params}
    return {"name": "Q", "boxes": [box]}


def state_for(size: int, advance: int, slack: int) -> WindowState:
    checked = check_query(parse_query(spelled(CALLS, size, advance, slack)), {"ev": EV})
    box = window_box(checked)
    assert box is not None
    spec = box.spec
    assert spec is not None
    return WindowState(spec, narrow_schema(box), box.output_schemas[0])  # type: ignore[arg-type]


ROW = st.fixed_dictionaries(
    {
        "t": st.integers(-20, 60),
        "k": st.one_of(st.none(), st.integers(0, 2)),
        "s": st.one_of(st.none(), st.sampled_from(["a", "b", "é", "ab"])),
        "v": st.one_of(st.none(), st.integers(-5, 5)),
        # Quarters: their sums are exact in any order, as integers are.
        "x": st.one_of(st.none(), st.integers(-8, 8).map(lambda q: q / 4)),
        "ts": st.one_of(st.none(), st.integers(0, 4).map(lambda s: BASE + timedelta(seconds=s))),
        "b": st.one_of(st.none(), st.booleans()),
    }
)


def table(rows: list[dict[str, Any]], narrow: Schema) -> pa.Table:
    full = to_arrow_schema(EV)
    return pa.table({n: pa.array([r[n] for r in rows], full.field(n).type) for n in narrow.names})


def reference(rows: list[dict[str, Any]], size: int, advance: int) -> dict[Any, list[Any]]:
    """Each tuple in every window [s, s + size) holding it, s a multiple of advance; then
    every function over each (window, k, s) in plain Python."""
    windows: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        s = r["t"] - r["t"] % advance
        while s + size > r["t"]:
            windows[(s * 1_000_000, r["k"], r["s"])].append(r)
            s -= advance
    out: dict[Any, list[Any]] = {}
    for key, rs in windows.items():
        values: list[Any] = []
        for fn, arg in CALLS:
            vs: list[Any] = [r[arg] for r in rs if r[arg] is not None] if arg else list(rs)
            if fn == "count":
                values.append(len(vs))
            elif fn == "count_distinct":
                values.append(len(set(vs)))
            elif fn == "sum":
                values.append(sum(vs) if vs else None)
            elif fn == "avg":
                values.append(sum(vs) / len(vs) if vs else None)
            else:
                values.append((min if fn == "min" else max)(vs) if vs else None)
        out[key] = [micros_of(v) for v in values]
    return out


def micros_of(value: Any) -> Any:
    """Timestamps as the partials hold them: microseconds since the epoch."""
    if isinstance(value, datetime):
        return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return value


def finals(state: WindowState) -> dict[Any, list[Any]]:
    return {
        key: [final(fn, acc[c]) for c, (fn, _) in enumerate(CALLS)]
        for key, acc in state.groups.items()
    }


def cut(rows: list[dict[str, Any]], points: list[int]) -> list[list[dict[str, Any]]]:
    edges = sorted({min(p, len(rows)) for p in points} | {0, len(rows)})
    return [rows[a:b] for a, b in itertools.pairwise(edges)]


def test_every_mergeable_function_is_covered() -> None:
    assert {fn for fn, _ in CALLS} == MERGEABLE


@settings(max_examples=120, deadline=None)
@given(
    rows=st.lists(ROW, max_size=40),
    batches=st.lists(st.integers(0, 40), max_size=4),
    partitions=st.lists(st.integers(0, 40), max_size=6),
    size=st.sampled_from([5, 10, 7]),
    step=st.sampled_from([1, 2, 3, 5, 10]),
)
def test_partials_merged_in_any_pieces_equal_one_aggregation_of_all_rows(
    rows: list[dict[str, Any]],
    batches: list[int],
    partitions: list[int],
    size: int,
    step: int,
) -> None:
    """The rows are cut into batches and each batch into partitions at arbitrary points; each
    partition's partials are computed alone (as an executor does), a batch's partials are
    merged by the driver. A watermark that never closes a window (a slack beyond every t)
    leaves the windows open: their accumulators must equal plain Python's over all rows."""
    advance = min(step, size)
    state = state_for(size, advance, slack=10_000)
    state.watermark_ms = -(10**9)  # (below Spark's first watermark: negative t are not late)
    partials: Partials = state.partials
    for batch in cut(rows, batches):
        if not batch:
            continue
        pieces = [partials.of_rows(table(p, state.narrow)) for p in cut(batch, partitions) if p]
        state.take_partials(pa.concat_tables(pieces))
    got, want = finals(state), reference(rows, size, advance)
    assert got.keys() == want.keys()
    for key, values in want.items():
        for (fn, arg), g, w in zip(CALLS, got[key], values, strict=True):
            if isinstance(w, float) and fn == "avg":
                assert math.isclose(g, w), (fn, arg, key)
            else:
                assert g == w, (fn, arg, key)
    assert state.late == 0


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.lists(ROW, max_size=15), min_size=1, max_size=5),
    partitions=st.lists(st.integers(0, 15), max_size=4),
    size=st.sampled_from([5, 10]),
    step=st.sampled_from([1, 2, 5]),
    slack=st.integers(0, 6),
)
def test_partials_from_partitions_emit_what_the_rows_emit(
    batches: list[list[dict[str, Any]]],
    partitions: list[int],
    size: int,
    step: int,
    slack: int,
) -> None:
    """With a watermark that closes windows and drops late tuples: a member fed each batch's
    partials, computed per partition, emits exactly what a member fed the batch's rows emits,
    and counts the same late (tuple, window) pairs."""
    advance = min(step, size)
    by_rows, by_partials = state_for(size, advance, slack), state_for(size, advance, slack)
    for batch in batches:
        if not batch:
            continue
        want = by_rows.take(table(batch, by_rows.narrow))
        pieces = [
            by_partials.partials.of_rows(table(p, by_partials.narrow))
            for p in cut(batch, partitions)
            if p
        ]
        got = by_partials.take_partials(pa.concat_tables(pieces))
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.to_pylist() == want.to_pylist()
        assert by_partials.watermark_ms == by_rows.watermark_ms
    assert by_partials.late == by_rows.late


def test_a_partial_row_per_window_and_group_not_per_row() -> None:
    state = state_for(10, 5, slack=0)
    rows = [
        {"t": t, "k": 1, "s": "a", "v": t, "x": None, "ts": None, "b": None} for t in range(100)
    ]
    partials = state.partials.of_rows(table(rows, state.narrow))
    # t in [0, 100): windows start at -5, 0, 5, ..., 95; one group.
    assert partials.num_rows == 21
    assert partials.schema == state.partials.schema()
    assert sum(partials.column("__n").to_pylist()) == 200  # every tuple in two windows
    assert max(partials.column("__tmax").to_pylist()) == 99_000_000
