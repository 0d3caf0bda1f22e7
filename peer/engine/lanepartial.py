"""Partial aggregates of a windowed lane member: what the executors compute per micro-batch,
and how the driver merges them into its open windows.

Theory of operation
-------------------
A windowed member of the lane (``peer.engine.lanewin``) keeps its open windows and its
watermark on the driver. If the driver took the member's input rows and aggregated them
there, the lane's cost would grow with input rows on one machine whatever the cluster. So the
lane's SQL statement (``peer.engine.lanesql.window_partial_sql``) cuts the rows into windows
and aggregates them in the executors, and the driver receives one partial aggregate per
(window, group) and batch; the watermark, the late rule and emission stay on the driver.

That is exact because every function the lane takes has a partial state that merges: a
count (count, count(x)), a sum, a minimum, a maximum, an average as a sum and a count, and
count_distinct as the set of distinct values (an exact distinct list from the executors).
Every partial row also carries the number of (tuple, window) pairs it holds (``__n``: the late
rule drops whole windows, and counts what it drops) and the largest event time among them
(``__tmax``: every tuple falls in at least one window, since ``advance <= window-size``, so
the largest over the partials is the batch's largest event time, which moves the watermark).

This module has the layout of a partial row (its columns and their types, for the SQL and
for Arrow), the same partials computed by Arrow from rows (the lane's path without
pre-aggregation, and the reference the tests merge in arbitrary pieces), and the merge rules.
Event times are Spark's: ``compile.to_event_time`` (numeric order fields: round(x * 1e6),
half away from zero; timestamps: microseconds), timestamps as microseconds throughout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from peer.model.plan import AggregateCall, AggregateSpec
from peer.model.schema import Schema, arrow_type, spark_type

WS = "__ws"  # a window's start, microseconds since the epoch
N = "__n"  # (tuple, window) pairs in the partial
TMAX = "__tmax"  # the largest event time among them, microseconds
T = "__t"  # a row's event time, microseconds (the rows before aggregation)
TIMESTAMP = "timestamp"

# The partial columns each function gives, by kind: count_all (count()), count, distinct,
# sum, min, max. avg is a sum and a count.
_KINDS = {
    "count_distinct": ("distinct",),
    "avg": ("sum", "count"),
    "sum": ("sum",),
    "min": ("min",),
    "max": ("max",),
}


def micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def trunc_div(value: int, by: int) -> int:
    """Integer division toward zero (the JVM's ``/`` on longs)."""
    q = abs(value) // by
    return q if value >= 0 else -q


def event_micros(column: pa.ChunkedArray | pa.Array, type_: str) -> np.ndarray:
    """The event time Spark windows on, in microseconds (``compile.to_event_time``)."""
    if type_ == TIMESTAMP:
        return np.asarray(pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False))
    scaled = pc.multiply(pc.cast(column, pa.float64()), 1_000_000.0)
    rounded = pc.round(scaled, round_mode="half_towards_infinity")
    return np.asarray(pc.cast(rounded, pa.int64()).to_numpy(zero_copy_only=False))


# (window start, group key, (tuple, window) pairs, largest event time, accumulators)
PartialRow = tuple[int, tuple[Any, ...], int, int, list[Any]]


@dataclass(frozen=True)
class PartialColumn:
    name: str  # __p0, __p1, ...: reserved names, no clash with a field
    kind: str  # count_all, count, distinct, sum, min, max
    argument: str | None
    spark: str  # its Spark SQL type
    arrow: pa.DataType


class Partials:
    """The partial row of one windowed member: ``__ws``, the group-by values (``__g0``...),
    ``__n``, ``__tmax``, then the partial columns of its calls in order (``__p0``...).
    Timestamps (keys, arguments) are microseconds."""

    def __init__(self, spec: AggregateSpec, narrow: Schema) -> None:
        assert spec.order_on is not None
        self.spec = spec
        self.narrow = narrow
        self.order_on: str = spec.order_on
        self.order_type = spec.order_type
        self.size = micros(spec.window_size)
        self.advance = micros(spec.advance)
        self.per_tuple = -(-self.size // self.advance)  # windows a tuple falls in
        self.timestamps = frozenset(f.name for f in narrow.fields if f.type == TIMESTAMP)
        self.keys = tuple((f"__g{i}", name) for i, name in enumerate(spec.group_by))
        columns: list[PartialColumn] = []
        for call in spec.calls:
            for kind in _kinds(call):
                columns.append(self._column(f"__p{len(columns)}", kind, call.argument))
        self.columns = tuple(columns)

    def _type(self, name: str) -> tuple[str, pa.DataType]:
        """A narrow field's type as the partials hold it (timestamps: microseconds)."""
        type_ = self.narrow.field(name).type
        if type_ == TIMESTAMP:
            return "BIGINT", pa.int64()
        return spark_type(type_), arrow_type(type_)

    def _column(self, name: str, kind: str, argument: str | None) -> PartialColumn:
        if kind in ("count_all", "count"):
            return PartialColumn(name, kind, argument, "BIGINT", pa.int64())
        assert argument is not None
        spark, arrow = self._type(argument)
        if kind == "distinct":
            return PartialColumn(name, kind, argument, f"ARRAY<{spark}>", pa.list_(arrow))
        if kind == "sum":
            if pa.types.is_floating(arrow):
                return PartialColumn(name, kind, argument, "DOUBLE", pa.float64())
            return PartialColumn(name, kind, argument, "BIGINT", pa.int64())
        return PartialColumn(name, kind, argument, spark, arrow)  # min, max

    @property
    def names(self) -> tuple[str, ...]:
        return (WS, *(k for k, _ in self.keys), N, TMAX, *(c.name for c in self.columns))

    def schema(self) -> pa.Schema:
        keys = [pa.field(k, self._type(name)[1]) for k, name in self.keys]
        return pa.schema(
            [
                pa.field(WS, pa.int64()),
                *keys,
                pa.field(N, pa.int64()),
                pa.field(TMAX, pa.int64()),
                *(pa.field(c.name, c.arrow) for c in self.columns),
            ]
        )

    def spark_types(self) -> tuple[str, ...]:
        """Each column's Spark SQL type, in ``names`` order."""
        keys = [self._type(name)[0] for _, name in self.keys]
        return ("BIGINT", *keys, "BIGINT", "BIGINT", *(c.spark for c in self.columns))

    # ------------------------------------------------------------------ from rows (Arrow)
    def of_rows(self, rows: pa.Table) -> pa.Table:
        """The partials of ``rows`` (``narrow`` fields, order value never NULL), computed by
        Arrow on this process: what the executors compute for the same rows."""
        if rows.num_rows == 0:
            return self.schema().empty_table()
        ts = event_micros(rows.column(self.order_on), self.order_type)
        columns = {
            name: rows.column(name).cast(pa.int64())
            if name in self.timestamps
            else rows.column(name)
            for name in self.narrow.names
        }
        last_start = ts - np.mod(ts, self.advance)
        parts = []
        for k in range(self.per_tuple):
            start = last_start - k * self.advance
            holds = start + self.size > ts  # the tuple falls in this window
            if not holds.any():
                continue
            mask = pa.array(holds)
            part = {WS: pa.array(start[holds], pa.int64()), T: pa.array(ts[holds], pa.int64())}
            part.update((name, pc.filter(col, mask)) for name, col in columns.items())
            parts.append(pa.table(part))
        table = pa.concat_tables(parts)
        aggs = [(T, "count", pc.CountOptions(mode="all")), (T, "max"), *self._arrow_aggs()]
        keys = [WS, *(name for _, name in self.keys)]
        grouped = table.group_by(keys, use_threads=False).aggregate(aggs)
        # Arrow puts the keys last in older releases and first in newer ones.
        if grouped.column_names[: len(keys)] == keys:
            key_cols, values = grouped.columns[: len(keys)], grouped.columns[len(keys) :]
        else:
            values, key_cols = grouped.columns[: len(aggs)], grouped.columns[len(aggs) :]
        schema = self.schema()
        return pa.Table.from_arrays(
            [c.cast(f.type) for c, f in zip([*key_cols, *values], schema, strict=True)],
            schema=schema,
        )

    def _arrow_aggs(self) -> list[tuple[Any, ...]]:
        valid = pc.CountOptions(mode="only_valid")
        some = pc.ScalarAggregateOptions(min_count=1)  # NULL, not 0, when no value is present
        aggs: list[tuple[Any, ...]] = []
        for c in self.columns:
            if c.kind == "count_all":
                aggs.append((T, "count", pc.CountOptions(mode="all")))
            elif c.kind == "count":
                aggs.append((c.argument, "count", valid))
            elif c.kind == "distinct":
                aggs.append((c.argument, "distinct", valid))
            else:  # sum, min, max
                aggs.append((c.argument, c.kind, some))
        return aggs

    # ------------------------------------------------------------------ to the driver's state
    def rows(
        self, partials: pa.Table
    ) -> Iterator[tuple[int, tuple[Any, ...], int, int, list[Any]]]:
        """Each partial row as (window start, group key, pairs, largest event time,
        accumulators: one per call, as ``combine`` merges them)."""
        cols = [partials.column(name).to_pylist() for name in self.names]
        ws, keys = cols[0], cols[1 : 1 + len(self.keys)]
        n, tmax = cols[1 + len(self.keys)], cols[2 + len(self.keys)]
        values = cols[3 + len(self.keys) :]
        calls = self.spec.calls
        for r in range(partials.num_rows):
            accs: list[Any] = []
            i = 0
            for call in calls:
                if call.function == "avg":
                    accs.append([values[i][r], values[i + 1][r]])
                    i += 2
                    continue
                value = values[i][r]
                accs.append(set(value) if call.function == "count_distinct" else value)
                i += 1
            yield ws[r], tuple(k[r] for k in keys), n[r], tmax[r], accs


def _kinds(call: AggregateCall) -> tuple[str, ...]:
    if call.function == "count":
        return ("count_all",) if call.argument is None else ("count",)
    return _KINDS[call.function]


def combine(calls: Iterable[AggregateCall], have: list[Any], new: list[Any]) -> list[Any]:
    """Two accumulators of the same window and group, merged (each call's own rule)."""
    out: list[Any] = []
    for call, a, b in zip(calls, have, new, strict=True):
        fn = call.function
        if fn == "count":
            out.append(a + b)
        elif fn == "count_distinct":
            out.append(a | b)
        elif fn == "avg":
            out.append([_add(a[0], b[0]), a[1] + b[1]])
        elif fn == "sum":
            out.append(_add(a, b))
        elif fn == "min":
            out.append(b if a is None else a if b is None else min(a, b))
        else:
            out.append(b if a is None else a if b is None else max(a, b))
    return out


def final(function: str, acc: Any) -> Any:
    """A call's result from its accumulator."""
    if function == "count_distinct":
        return len(acc)
    if function == "avg":
        total, count = acc
        return None if not count or total is None else total / count
    return acc


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a + b
