"""Windowed aggregates in the shared lane: each member's own windows, watermark and emission.

Theory of operation
-------------------
A Spark streaming query runs its own micro-batch loop (~0.3 s of driver time per batch), so a
peer that ran each of 16 small windowed aggregates as its own streaming query fell behind
(p50 11 s at 5k tuples/s each on 2 cores), as plain Spark does. Fusing them into one Spark
query is not exact: a Spark query has ONE event-time watermark, so a stream that runs behind
another would see its tuples dropped as late, and its windows held open by the other's.

So the lane (``peer.engine.lane``) runs such queries without Spark state: the lane's one SQL
statement applies each member's per-tuple boxes and hands the driver the narrow rows its
aggregate needs (order value, group-by fields, arguments). Here, per member, those rows are
cut into windows, pre-aggregated with Arrow's hash aggregation, and merged into the member's
open windows. Each member keeps its own watermark, as if it ran alone:

- the watermark follows Spark's rule: the largest event time the member has seen (in whole
  milliseconds), minus its slack, never moving back, starting at the epoch;
- a tuple counts in a window only if the window has not been emitted yet, that is unless
  ``window end <= watermark`` when its micro-batch runs (Spark's late-row rule);
- a window is emitted, once and complete, as soon as ``window end <= watermark``: in the same
  lane batch that moved the watermark (Spark emits it in the next, empty, batch);
- windows are cut as Spark's ``window()`` cuts them (aligned to the epoch, ``start <= t <
  end``), over the same event time (``peer.engine.compile.to_event_time``), and their bounds
  are converted back to the order field's type the same way.

The state is the member's open windows (a few accumulators each) and its watermark. After
every lane batch the lane writes all of its members' states to one file named by the batch id
(``Lane`` keeps the last two). Spark runs a batch again with the same id after a crash or a
stop inside it; the lane then starts from the file of the batch before it, and the re-run's
output, tagged (member, batch id) like every lane output, is kept once by the result spool.

Only what merges exactly is taken: count, count_distinct, sum, avg, min and max over time
(VALUES) windows, fed by per-tuple boxes, without an availability bound and not straight from
a union (whose branches each have their own watermark in Spark). Everything else runs as its
own streaming query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from peer.model.plan import (
    AggregateCall,
    AggregateSpec,
    CheckedBox,
    CheckedQuery,
    FilterSpec,
    MapSpec,
    UnionSpec,
)
from peer.model.schema import Field, Schema, arrow_type, to_arrow_schema

MERGEABLE = frozenset({"count", "count_distinct", "sum", "avg", "min", "max"})
WS = "__ws"  # a window's start, microseconds since the epoch
TIMESTAMP = "timestamp"


def window_box(checked: CheckedQuery) -> CheckedBox | None:
    """The aggregate box of a query the lane can run with per-member windows, else None."""
    if checked.query.availability_bound_s is not None:
        return None
    aggregates = [b for b in checked.boxes if isinstance(b.spec, AggregateSpec)]
    others = [b for b in checked.boxes if not isinstance(b.spec, AggregateSpec)]
    if len(aggregates) != 1 or not all(
        isinstance(b.spec, FilterSpec | MapSpec | UnionSpec) for b in others
    ):
        return None
    box = aggregates[0]
    spec = box.spec
    assert isinstance(spec, AggregateSpec)
    if spec.window_by != "VALUES" or spec.order_on is None:
        return None
    if any(call.function not in MERGEABLE for call in spec.calls):
        return None
    if tuple(checked.outputs) != tuple(box.box.outputs):
        return None
    feeding = box.box.inputs[0]
    if any(isinstance(b.spec, UnionSpec) and feeding in b.box.outputs for b in others):
        return None
    return box


def prefix_query(checked: CheckedQuery, box: CheckedBox) -> CheckedQuery:
    """The member's per-tuple part: its boxes before the aggregate, ending in its input."""
    prefix = tuple(b for b in checked.boxes if b is not box)
    return dataclasses.replace(checked, boxes=prefix, outputs=(box.box.inputs[0],))


def narrow_schema(box: CheckedBox) -> Schema:
    """The fields the aggregate reads from its input (order value, group-by, arguments)."""
    spec = box.spec
    assert isinstance(spec, AggregateSpec) and spec.order_on is not None
    source = box.input_schemas[0]
    wanted = [spec.order_on, *spec.group_by, *(c.argument for c in spec.calls if c.argument)]
    names = list(dict.fromkeys(wanted))
    return Schema(f"{source.name}__narrow", tuple(source.field(n) for n in names))


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _trunc_div(value: int, by: int) -> int:
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


def from_micros(values: list[int], type_: str) -> pa.Array:
    """Window bounds back in the order field's type (``compile.from_event_time``)."""
    if type_ == TIMESTAMP:
        return pa.array(values, pa.int64()).cast(arrow_type(TIMESTAMP))
    seconds = [v / 1_000_000 for v in values]
    if type_ == "double":
        return pa.array(seconds, pa.float64())
    return pa.array([int(s) for s in seconds], arrow_type(type_))


class WindowState:
    """One member's open windows and watermark. Plain Python and Arrow: no JVM."""

    def __init__(self, spec: AggregateSpec, narrow: Schema, out: Schema) -> None:
        assert spec.order_on is not None
        self.spec = spec
        self.order_on: str = spec.order_on
        self.narrow = narrow
        self.out = out
        self.order_type = spec.order_type
        self.size = _micros(spec.window_size)
        self.advance = _micros(spec.advance)
        self.delay_ms = _micros(spec.slack) // 1000
        self.per_tuple = -(-self.size // self.advance)  # windows a tuple falls in
        self.timestamps = {f.name for f in narrow.fields if f.type == TIMESTAMP}
        self.arrow_aggs = _arrow_aggs(spec.calls)
        self.reset()

    def reset(self) -> None:
        self.watermark_ms = 0  # Spark's initial watermark: the epoch
        self.groups: dict[tuple[Any, ...], list[Any]] = {}
        self.late = 0  # (tuple, window) pairs dropped because the window was emitted
        self.emitted = 0

    def describe(self) -> dict[str, int]:
        """Counters for the query's status."""
        return {
            "watermark_ms": self.watermark_ms,
            "open_groups": len(self.groups),
            "late": self.late,
        }

    # ------------------------------------------------------------------ taking a batch
    def take(self, rows: pa.Table) -> pa.Table | None:
        """Merge one batch's rows (``narrow`` fields, order value never NULL) and return the
        windows the batch closes (the output stream's schema), or None."""
        if rows.num_rows == 0:
            return None
        ts = event_micros(rows.column(self.order_on), self.order_type)
        newest_ms = _trunc_div(int(ts.max()), 1000)
        columns = {
            name: rows.column(name).cast(pa.int64())
            if name in self.timestamps
            else rows.column(name)
            for name in self.narrow.names
        }
        open_after = self.watermark_ms * 1000  # a window ending at or before it was emitted
        last_start = ts - np.mod(ts, self.advance)
        parts = []
        for k in range(self.per_tuple):
            start = last_start - k * self.advance
            end = start + self.size
            holds = end > ts  # the tuple falls in this window
            keep = holds & (end > open_after)
            self.late += int(np.count_nonzero(holds & ~keep))
            if not keep.any():
                continue
            mask = pa.array(keep)
            part = {WS: pa.array(start[keep], pa.int64())}
            part.update((name, pc.filter(col, mask)) for name, col in columns.items())
            parts.append(pa.table(part))
        if parts:
            self._merge(pa.concat_tables(parts))
        self.watermark_ms = max(self.watermark_ms, newest_ms - self.delay_ms)
        return self._emit()

    def _merge(self, table: pa.Table) -> None:
        spec = self.spec
        aggs = self.arrow_aggs
        keys = [WS, *spec.group_by]
        grouped = table.group_by(keys, use_threads=False).aggregate(aggs)
        cols = [grouped.column(i).to_pylist() for i in range(grouped.num_columns)]
        # Arrow puts the keys last in older releases and first in newer ones.
        if grouped.column_names[: len(keys)] == keys:
            key_cols, values = cols[: len(keys)], cols[len(keys) :]
        else:
            values, key_cols = cols[: len(aggs)], cols[len(aggs) :]
        for r, key in enumerate(zip(*key_cols, strict=True)):
            partial = self._partial(values, r)
            have = self.groups.get(key)
            self.groups[key] = partial if have is None else self._combine(have, partial)

    def _partial(self, values: list[list[Any]], r: int) -> list[Any]:
        out: list[Any] = []
        i = 0
        for call in self.spec.calls:
            if call.function == "avg":
                out.append([values[i][r], values[i + 1][r]])
                i += 2
                continue
            value = values[i][r]
            out.append(set(value) if call.function == "count_distinct" else value)
            i += 1
        return out

    def _combine(self, have: list[Any], new: list[Any]) -> list[Any]:
        out: list[Any] = []
        for call, a, b in zip(self.spec.calls, have, new, strict=True):
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

    # ------------------------------------------------------------------ emitting
    def _emit(self) -> pa.Table | None:
        closed_at = self.watermark_ms * 1000
        due = sorted((k for k in self.groups if k[0] + self.size <= closed_at), key=_sort_key)
        if not due:
            return None
        spec = self.spec
        accs = [self.groups.pop(k) for k in due]
        self.emitted += len(due)
        arrays: list[pa.Array] = [
            from_micros([k[0] for k in due], self.order_type),
            from_micros([k[0] + self.size for k in due], self.order_type),
        ]
        for g, name in enumerate(spec.group_by, start=1):
            arrays.append(self._column([k[g] for k in due], name, self.narrow.field(name)))
        for c, call in enumerate(spec.calls):
            final = [_final(call.function, acc[c]) for acc in accs]
            field = self.out.field(call.output_name)
            if call.function in ("min", "max") and call.argument in self.timestamps:
                arrays.append(pa.array(final, pa.int64()).cast(arrow_type(TIMESTAMP)))
            else:
                arrays.append(pa.array(final, arrow_type(field.type)))
        return pa.Table.from_arrays(arrays, schema=to_arrow_schema(self.out))

    def _column(self, values: list[Any], name: str, field: Field) -> pa.Array:
        if name in self.timestamps:
            return pa.array(values, pa.int64()).cast(arrow_type(TIMESTAMP))
        return pa.array(values, arrow_type(field.type))

    # ------------------------------------------------------------------ state
    def to_state(self) -> dict[str, Any]:
        distinct = [c.function == "count_distinct" for c in self.spec.calls]
        groups = [
            [list(key), [list(a) if d else a for a, d in zip(acc, distinct, strict=True)]]
            for key, acc in self.groups.items()
        ]
        return {"wm": self.watermark_ms, "late": self.late, "emitted": self.emitted, "g": groups}

    def load(self, state: dict[str, Any]) -> None:
        distinct = [c.function == "count_distinct" for c in self.spec.calls]
        self.watermark_ms = int(state["wm"])
        self.late = int(state.get("late", 0))
        self.emitted = int(state.get("emitted", 0))
        self.groups = {
            tuple(key): [set(a) if d else a for a, d in zip(acc, distinct, strict=True)]
            for key, acc in state["g"]
        }


def _arrow_aggs(calls: Iterable[AggregateCall]) -> list[tuple[Any, ...]]:
    """Arrow's hash aggregations giving each call's partial state for one batch (avg: a sum
    and a count)."""
    valid = pc.CountOptions(mode="only_valid")
    some = pc.ScalarAggregateOptions(min_count=1)  # NULL, not 0, when no value is present
    aggs: list[tuple[Any, ...]] = []
    for call in calls:
        arg, fn = call.argument, call.function
        if fn == "count":
            aggs.append(
                (WS, "count", pc.CountOptions(mode="all")) if arg is None else (arg, "count", valid)
            )
        elif fn == "count_distinct":
            aggs.append((arg, "distinct", valid))
        elif fn == "avg":
            aggs += [(arg, "sum", some), (arg, "count", valid)]
        else:  # sum, min, max
            aggs.append((arg, fn, some))
    return aggs


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else a + b


def _final(function: str, acc: Any) -> Any:
    if function == "count_distinct":
        return len(acc)
    if function == "avg":
        total, count = acc
        return None if not count or total is None else total / count
    return acc


def _sort_key(key: Iterable[Any]) -> tuple[Any, ...]:
    """Emission order: by window, then group (NULL first), stable across types."""
    return tuple((v is not None, v) for v in key)
