"""The lane's windowed members aggregated in the executors (peer.engine.lanepartial), on real
Spark: every function the lane takes, over keys and arguments of every type, on sliding
windows, fed by a union of two streams (so a batch has two partitions) and a filter. The
output is plain Python's over the same tuples, tuple for tuple; it is the same with the
pre-aggregation off (the driver aggregating the rows); and the driver collects partials, not
input rows.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from peer.engine.lane import Lane
from peer.engine.lane_source import register_lane_source
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema, to_arrow_schema
from peer.storage.spool import SpoolSet

pytestmark = pytest.mark.spark

EV = Schema(
    "ev",
    (
        Field("t", "double"),
        Field("k", "int", nullable=True),
        Field("s", "string", nullable=True),
        Field("v", "long", nullable=True),
        Field("x", "double", nullable=True),
        Field("ts", "timestamp", nullable=True),
    ),
)
BASE = datetime(2026, 1, 1, tzinfo=UTC)
SIZE, ADVANCE, SLACK = 5, 2, 3  # a tuple falls in two or three windows
CALLS = [
    ("count", None),
    ("count", "v"),
    ("count_distinct", "s"),
    ("count_distinct", "ts"),
    ("sum", "v"),
    ("sum", "x"),
    ("avg", "v"),
    ("min", "s"),
    ("min", "ts"),
    ("max", "x"),
    ("max", "v"),
]
FLUSH_T = 10_000.0


def checked_queries() -> tuple[CheckedQuery, CheckedQuery]:
    params = {
        "window-size-by": "VALUES",
        "order-on-field": "t",
        "window-size": str(SIZE),
        "advance": str(ADVANCE),
        "slack": str(SLACK),
        "group-by": "k,ts",
    }
    for i, (fn, arg) in enumerate(CALLS):
        params[f"aggregate-function.{i}"] = f"{fn}({arg or ''})"
        params[f"aggregate-function-output-name.{i}"] = f"a{i}"
    windowed = {
        "name": "W",
        "boxes": [
            {"name": "u", "type": "union", "inputs": ["e1", "e2"], "outputs": ["u"]},
            {
                "name": "f",
                "type": "filter",
                "inputs": ["u"],
                "outputs": ["f"],
                "params": {"expression.0": "k IS NULL OR k <> 3"},
            },
            {
                "name": "w",
                "type": "aggregate",
                "inputs": ["f"],
                "outputs": ["wo"],
                "params": params,
            },
        ],
    }
    per_tuple = {
        "name": "P",
        "boxes": [
            {
                "name": "g",
                "type": "filter",
                "inputs": ["e1"],
                "outputs": ["po"],
                "params": {"expression.0": "v > 2"},
            }
        ],
    }
    streams = {"e1": EV, "e2": EV}
    return (
        check_query(parse_query(windowed), streams),
        check_query(parse_query(per_tuple), streams),
    )


def events(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """Tuples with t (seconds, fractions included) rising, out of order within the slack."""
    rows = []
    for i in range(n):
        # (From t = 5: a window ending at or before the epoch, Spark's first watermark, would
        # be late from the start.)
        t = round(5 + i * 0.05 - rng.choice([0.0, 0.0, 0.5, 2.9]), 3)
        rows.append(
            {
                "t": t,
                "k": rng.choice([None, 0, 1, 2, 3]),
                "s": rng.choice([None, "a", "b", "ü"]),
                "v": rng.choice([None, *range(-3, 8)]),
                "x": rng.choice([None, 0.25, -1.5, 2.0]),
                "ts": rng.choice([None, BASE, BASE + timedelta(seconds=1)]),
            }
        )
    return rows


def arrow(rows: list[dict[str, Any]]) -> pa.Table:
    schema = to_arrow_schema(EV)
    return pa.table({f.name: pa.array([r[f.name] for r in rows], f.type) for f in schema})


def cut(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Each tuple (k <> 3) in every window [s, s + 5) holding t, s a multiple of 2, keyed
    (s, k, ts)."""
    windows: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["k"] == 3:
            continue
        start = math.floor(r["t"] / ADVANCE) * ADVANCE
        while start + SIZE > r["t"]:
            windows[(start, r["k"], r["ts"])].append(r)
            start -= ADVANCE
    return windows


def reference(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Plain Python over ``cut``: every window is closed by the last tuple (no tuple comes
    later than the slack), but the last tuple's own."""
    windows = cut(rows)
    out = []
    for (start, k, ts), rs in windows.items():
        if start + SIZE > FLUSH_T - SLACK:
            continue  # the flush tuple's own windows stay open
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
        out.append((float(start), float(start + SIZE), k, ts, *values))
    return sorted(out, key=_key)


def _key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is not None, v) for v in row)


FILE_ROWS = 100


def files(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The input as spool files: alternately on e1 and e2 (a batch of both has two
    partitions), then the flush tuple."""
    out = [
        ("e1" if i % (2 * FILE_ROWS) == 0 else "e2", rows[i : i + FILE_ROWS])
        for i in range(0, len(rows), FILE_ROWS)
    ]
    flush = {"t": FLUSH_T, "k": 0, "s": None, "v": None, "x": None, "ts": None}
    return [*out, ("e2", [flush])]


def run_lane(
    spark: Any, root: Path, rows: list[dict[str, Any]], *, preaggregate: bool
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]], Lane]:
    windowed, per_tuple = checked_queries()
    spools = SpoolSet(root / "spools", fsync=False)
    for stream in ("e1", "e2"):
        spools.create(stream, to_arrow_schema(EV))
    for q in (windowed, per_tuple):
        for out in q.outputs:
            spools.create(out, to_arrow_schema(q.stream_schemas[out]))
    lane = Lane(
        spools,
        root / "lane",
        name=f"lane_partials_{preaggregate}",
        trigger_s=0.0,
        max_rows=300,  # several batches
        preaggregate=preaggregate,
    )
    lane.add(spark, windowed, "1", resume=True)
    lane.add(spark, per_tuple, "1", resume=True)
    want_windows = reference([r for _, f in files(rows) for r in f])
    try:
        for stream, part in files(rows):
            spools.get(stream).append(arrow(part))
        deadline = time.monotonic() + 180
        while _count(spools, "wo") < len(want_windows):
            assert lane.failure() is None, lane.failure()
            assert time.monotonic() < deadline, "timed out waiting for the lane's windows"
            time.sleep(0.2)
        time.sleep(1.0)  # nothing more may come
    finally:
        lane.stop(release=True)
    got = sorted((tuple(r.values()) for r in _rows(spools, "wo")), key=_key)
    return got, _rows(spools, "po"), lane


def _rows(spools: SpoolSet, stream: str) -> list[dict[str, Any]]:
    spool = spools.get(stream)
    return [r for _, t in spool.read(-1, spool.latest) for r in t.to_pylist()]


def _count(spools: SpoolSet, stream: str) -> int:
    spool = spools.get(stream)
    return sum(t.num_rows for _, t in spool.read(-1, spool.latest))


def close(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y) if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.timeout(600)  # two lanes, one after the other
def test_windowed_members_aggregate_in_the_executors_exactly(spark: Any, tmp_path: Path) -> None:
    register_lane_source(spark)
    rows = events(random.Random(25), 1200)
    pre, per_tuple, lane = run_lane(spark, tmp_path / "pre", rows, preaggregate=True)
    want = reference([r for _, f in files(rows) for r in f])
    assert len(pre) == len(want) > 50
    for got_row, want_row in zip(pre, want, strict=True):
        assert close(got_row, want_row), (got_row, want_row)
    # The per-tuple member in the same lane still gets its rows: they are its output.
    e1 = [r for stream, f in files(rows) if stream == "e1" for r in f]
    assert sorted(_key(tuple(r.values())) for r in per_tuple) == sorted(
        _key(tuple(r.values())) for r in e1 if r["v"] is not None and r["v"] > 2
    )
    # The driver took partials, at most one per (window, group) and batch (Spark merges the
    # partitions' partials before they are collected), plus the per-tuple member's rows. A
    # batch is made of whole files: so at least one row per (window, group) of the input,
    # and at most that many per file.
    partials_rows = lane.collected_rows_total - len(per_tuple)
    per_file = sum(len(cut(f)) for _, f in files(rows))
    assert len(cut([r for _, f in files(rows) for r in f])) <= partials_rows <= per_file
    assert per_file < sum(len(rs) for rs in cut(rows).values())  # fewer than (tuple, window)s

    # The driver aggregating the rows instead (the lane before): the same windows, and the
    # input rows it collected, one per tuple with k <> 3, plus the per-tuple member's rows.
    rows_path, per_tuple_too, before = run_lane(spark, tmp_path / "rows", rows, preaggregate=False)
    assert len(rows_path) == len(pre)
    for a, b in zip(rows_path, pre, strict=True):
        assert close(a, b), (a, b)
    assert len(per_tuple_too) == len(per_tuple)
    passed = sum(1 for r in rows if r["k"] != 3) + 1  # the flush tuple too
    assert before.collected_rows_total == passed + len(per_tuple)
    # (Bytes are not compared here: with 12 groups, ~3 windows per 100-tuple file and 13
    # partial columns, these partials are about as large as the rows. The reduction shows
    # where batches hold many tuples per (window, group): scripts/bench_lane_collect.py.)
