"""Windowed aggregates in the shared lane: each member's own windows, watermark and emission.

Theory of operation
-------------------
A Spark streaming query runs its own micro-batch loop (~0.3 s of driver time per batch), so a
peer that ran each of 16 small windowed aggregates as its own streaming query fell behind
(p50 11 s at 5k tuples/s each on 2 cores), as plain Spark does. Fusing them into one Spark
query is not exact: a Spark query has ONE event-time watermark, so a stream that runs behind
another would see its tuples dropped as late, and its windows held open by the other's.

So the lane (``peer.engine.lane``) runs such queries without Spark state: the lane's one SQL
statement applies each member's per-tuple boxes, cuts the member's tuples into windows and
aggregates them per (window, group) in the executors, so the driver receives partial
aggregates, not input rows (``peer.engine.lanepartial``; on a local master the lane collects
the rows and the same partials are computed here with Arrow). Here, per member, the partials
are merged into the member's open windows. Each member keeps its own watermark, as if it ran
alone:

- the watermark follows Spark's rule: the largest event time the member has seen (in whole
  milliseconds), minus its slack, never moving back, starting at the epoch;
- a tuple counts in a window only if the window has not been emitted yet, that is unless
  ``window end <= watermark`` when its micro-batch runs (Spark's late-row rule; it drops
  whole windows, so it applies to the partials as it would to the rows);
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

import pyarrow as pa

from peer.engine.lanepartial import TIMESTAMP, Partials, combine, final, micros, trunc_div
from peer.engine.lanepartial import event_micros as event_micros  # (its home before)
from peer.model.plan import (
    AggregateSpec,
    CheckedBox,
    CheckedQuery,
    FilterSpec,
    MapSpec,
    UnionSpec,
)
from peer.model.schema import Field, Schema, arrow_type, to_arrow_schema

MERGEABLE = frozenset({"count", "count_distinct", "sum", "avg", "min", "max"})


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
        self.partials = Partials(spec, narrow)
        self.size = self.partials.size
        self.delay_ms = micros(spec.slack) // 1000
        self.timestamps = self.partials.timestamps
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
        windows the batch closes (the output stream's schema), or None. The lane's path
        without pre-aggregation in the executors: the partials are computed here."""
        if rows.num_rows == 0:
            return None
        return self.take_partials(self.partials.of_rows(rows))

    def take_partials(self, partials: pa.Table) -> pa.Table | None:
        """Merge one batch's partial aggregates (``Partials``: from the executors, possibly
        several per window and group) and return the windows the batch closes, or None."""
        if partials.num_rows == 0:
            return None
        open_after = self.watermark_ms * 1000  # a window ending at or before it was emitted
        newest = None
        calls = self.spec.calls
        for start, group, pairs, tmax, accs in self.partials.rows(partials):
            newest = tmax if newest is None else max(newest, tmax)
            if start + self.size <= open_after:
                self.late += pairs
                continue
            key = (start, *group)
            have = self.groups.get(key)
            self.groups[key] = accs if have is None else combine(calls, have, accs)
        assert newest is not None
        self.watermark_ms = max(self.watermark_ms, trunc_div(newest, 1000) - self.delay_ms)
        return self._emit()

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
            results = [final(call.function, acc[c]) for acc in accs]
            field = self.out.field(call.output_name)
            if call.function in ("min", "max") and call.argument in self.timestamps:
                arrays.append(pa.array(results, pa.int64()).cast(arrow_type(TIMESTAMP)))
            else:
                arrays.append(pa.array(results, arrow_type(field.type)))
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


def _sort_key(key: Iterable[Any]) -> tuple[Any, ...]:
    """Emission order: by window, then group (NULL first), stable across types."""
    return tuple((v is not None, v) for v in key)
