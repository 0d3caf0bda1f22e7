"""Windowed aggregates in the lane (peer.engine.lanewin), without a JVM: which queries qualify,
and every member's windows, watermark and late rule against a plain-Python reference that
cuts windows and applies the watermark tuple by tuple."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.engine.lane import lane_kind
from peer.engine.lanewin import WindowState, narrow_schema, window_box
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema

EV = Schema(
    "ev",
    (
        Field("k", "int", nullable=True),
        Field("v", "long", nullable=True),
        Field("t", "long"),
        Field("ts", "timestamp"),
        Field("x", "double", nullable=True),
    ),
)
STREAMS = {"a": EV, "b": EV}


def query(boxes: list[dict[str, Any]], bound: float | None = None) -> CheckedQuery:
    spelled: dict[str, Any] = {"name": "Q", "boxes": boxes}
    if bound is not None:
        spelled["availability_bound"] = bound
    return check_query(parse_query(spelled), STREAMS)


def agg(src: str, out: str, **params: str) -> dict[str, Any]:
    base = {
        "window-size-by": "VALUES",
        "order-on-field": "t",
        "window-size": "10",
        "group-by": "k",
        "aggregate-function.0": "count()",
        "aggregate-function-output-name.0": "n",
    }
    base.update(params)
    return {"name": "w", "type": "aggregate", "inputs": [src], "outputs": [out], "params": base}


def flt(src: str, out: str) -> dict[str, Any]:
    return {
        "name": "f",
        "type": "filter",
        "inputs": [src],
        "outputs": [out],
        "params": {"expression.0": "v > 3"},
    }


def test_which_queries_the_lane_runs_with_their_own_windows() -> None:
    assert lane_kind(query([flt("a", "o")])) == "stateless"
    assert lane_kind(query([agg("a", "o")])) == "window"
    assert lane_kind(query([flt("a", "f1"), agg("f1", "o")])) == "window"
    # Arrival order, count windows, an availability bound, two aggregates: own query.
    assert window_box(query([agg("a", "o", **{"aggregate-function.0": "lastval(v)"})])) is None
    tuples = {"window-size-by": "TUPLES", "window-size": "5"}
    assert window_box(query([agg("a", "o", **tuples)])) is None
    assert window_box(query([agg("a", "o")], bound=5)) is None
    second = agg("o1", "o", **{"order-on-field": "window_end"})
    second["name"] = "w2"
    assert window_box(query([agg("a", "o1", **{"group-by": "k"}), second])) is None
    # Straight from a union: Spark keeps a watermark per branch.
    union = {"name": "u", "type": "union", "inputs": ["a", "b"], "outputs": ["ab"]}
    assert window_box(query([union, agg("ab", "o")])) is None
    # After a union and a filter: one watermark, as in Spark.
    assert window_box(query([union, flt("ab", "f1"), agg("f1", "o")])) is not None


def _state(q: CheckedQuery) -> WindowState:
    box = window_box(q)
    assert box is not None and box.spec is not None
    return WindowState(box.spec, narrow_schema(box), box.output_schemas[0])  # type: ignore[arg-type]


def reference(
    batches: list[list[dict[str, Any]]], size: int, advance: int, slack: int
) -> list[tuple[Any, ...]]:
    """Per batch: each tuple goes into every window [s, s + size) holding its t (s a multiple
    of advance) that is not closed yet; then the watermark moves to max t - slack, and the
    windows it passed are emitted (whole seconds: the order field is a long)."""
    wm = 0
    closed: set[tuple[int, Any]] = set()
    windows: dict[tuple[int, Any], list[dict[str, Any]]] = defaultdict(list)
    out: list[tuple[Any, ...]] = []
    for rows in batches:
        for r in rows:
            s = (r["t"] // advance) * advance
            while s + size > r["t"]:
                if s + size > wm:
                    windows[(s, r["k"])].append(r)
                s -= advance
        if rows:
            wm = max(wm, max(r["t"] for r in rows) - slack)
        for key in sorted(windows, key=lambda k: (k[0], k[1] is not None, k[1] or 0)):
            s, k = key
            if s + size <= wm and key not in closed:
                rs = windows[key]
                vs = [r["v"] for r in rs if r["v"] is not None]
                xs = [r["x"] for r in rs if r["x"] is not None]
                out.append(
                    (
                        s,
                        s + size,
                        k,
                        len(rs),
                        sum(vs) if vs else None,
                        len(set(vs)),
                        min(vs) if vs else None,
                        max(xs) if xs else None,
                        sum(vs) / len(vs) if vs else None,
                    )
                )
                closed.add(key)
        for key in [k for k in windows if k[0] + size <= wm]:
            del windows[key]
    return out


CALLS = {
    "aggregate-function.0": "count()",
    "aggregate-function-output-name.0": "n",
    "aggregate-function.1": "sum(v)",
    "aggregate-function-output-name.1": "s",
    "aggregate-function.2": "count_distinct(v)",
    "aggregate-function-output-name.2": "d",
    "aggregate-function.3": "min(v)",
    "aggregate-function-output-name.3": "lo",
    "aggregate-function.4": "max(x)",
    "aggregate-function-output-name.4": "hi",
    "aggregate-function.5": "avg(v)",
    "aggregate-function-output-name.5": "mean",
}

ROW = st.fixed_dictionaries(
    {
        "k": st.one_of(st.none(), st.integers(0, 3)),
        "v": st.one_of(st.none(), st.integers(0, 6)),
        "t": st.integers(0, 60),
        "x": st.one_of(st.none(), st.sampled_from([0.5, 1.25, -2.0])),
    }
)


def table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table(
        {
            "t": pa.array([r["t"] for r in rows], pa.int64()),
            "k": pa.array([r["k"] for r in rows], pa.int32()),
            "v": pa.array([r["v"] for r in rows], pa.int64()),
            "x": pa.array([r["x"] for r in rows], pa.float64()),
        }
    )


def run(state: WindowState, batches: list[list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for rows in batches:
        got = state.take(table(rows)) if rows else None
        if got is not None:
            cols = ["window_start", "window_end", "k", "n", "s", "d", "lo", "hi", "mean"]
            out.extend(zip(*(got.column(c).to_pylist() for c in cols), strict=True))
    return out


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(st.lists(ROW, max_size=12), min_size=1, max_size=8),
    size=st.sampled_from([5, 10]),
    step=st.sampled_from([1, 2, 5]),
    slack=st.integers(0, 6),
    cut=st.integers(0, 8),
)
def test_windows_watermark_and_late_rows_match_the_reference(
    batches: list[list[dict[str, Any]]], size: int, step: int, slack: int, cut: int
) -> None:
    advance = min(step, size)
    q = query(
        [
            agg(
                "a",
                "o",
                **CALLS,
                **{"window-size": str(size), "advance": str(advance), "slack": str(slack)},
            )
        ]
    )
    state = _state(q)
    # Stop after ``cut`` batches, save and load the state into a new member, go on.
    first = run(state, batches[:cut])
    packed = msgpack.packb(state.to_state(), use_bin_type=True)
    again = _state(q)
    again.load(msgpack.unpackb(packed, strict_map_key=False))
    got = first + run(again, batches[cut:])
    want = reference(batches, size, advance, slack)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[:8] == w[:8]
        assert (g[8] is None and w[8] is None) or math.isclose(g[8], w[8])


def test_each_member_keeps_its_own_watermark() -> None:
    """Two members, one far ahead in event time: the other's tuples are not late, and its
    windows close on its own watermark (one Spark query would drop them all)."""
    ahead, behind = _state(query([agg("a", "o")])), _state(query([agg("b", "o")]))
    ahead.take(table([{"t": 10_000, "k": 1, "v": 1, "x": None}]))
    got = behind.take(table([{"t": t, "k": 1, "v": 1, "x": None} for t in (1, 2, 12, 25)]))
    assert got is not None
    assert got.to_pylist() == [
        {"window_start": 0, "window_end": 10, "k": 1, "n": 2},
        {"window_start": 10, "window_end": 20, "k": 1, "n": 1},
    ]
    assert behind.late == 0 and behind.watermark_ms == 25_000


def test_timestamp_windows_keys_and_bounds() -> None:
    q = query(
        [
            agg(
                "a",
                "o",
                **{
                    "order-on-field": "ts",
                    "window-size": "2",
                    "advance": "1",
                    "group-by": "ts",
                    "aggregate-function.0": "max(ts)",
                    "aggregate-function-output-name.0": "last",
                },
            )
        ]
    )
    state = _state(q)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    at = [base + timedelta(seconds=s) for s in (0.5, 0.5, 3.25)]
    got = state.take(pa.table({"ts": pa.array(at, pa.timestamp("us", tz="UTC"))}))
    assert got is not None
    assert got.schema.field("window_start").type == pa.timestamp("us", tz="UTC")
    assert got.to_pylist() == [
        {"window_start": base - timedelta(seconds=1), "window_end": base + timedelta(seconds=1),
         "ts": at[0], "last": at[0]},
        {"window_start": base, "window_end": base + timedelta(seconds=2),
         "ts": at[0], "last": at[0]},
    ]  # fmt: skip
    # The watermark is 3.25 s; [1, 3) closes, [2, 4) and [3, 5) stay open.
    assert sorted(k[0] for k in state.groups) == [
        int((base + timedelta(seconds=s)).timestamp() * 1_000_000) for s in (2, 3)
    ]


def test_a_window_closed_before_its_tuple_arrives_drops_it() -> None:
    state = _state(query([agg("a", "o")]))
    first = state.take(table([{"t": t, "k": 0, "v": 0, "x": None} for t in (1, 15)]))
    assert first is not None and first.column("n").to_pylist() == [1]
    assert state.take(table([{"t": 3, "k": 0, "v": 0, "x": None}])) is None
    assert state.late == 1


@pytest.mark.parametrize("value", [0.0000004, 0.0000005, -0.0000005, 7.9999995])
def test_numeric_event_times_round_as_spark_does(value: float) -> None:
    from peer.engine.lanewin import event_micros

    got = int(event_micros(pa.array([value], pa.float64()), "double")[0])
    # Spark: round((x as double) * 1e6), HALF_UP (away from zero)
    scaled = value * 1_000_000
    want = math.floor(abs(scaled) + 0.5) * (1 if scaled >= 0 else -1)
    assert got == want
