"""Count-based boxes: TUPLES windows and bsort, with per-group state in Spark's state store.

Spark has no count windows and no bounded sort on streams, so these two boxes run as
``applyInPandasWithState`` functions: Spark groups each micro-batch by the box's group-by
fields and hands every group its new rows together with the group's state (a JSON document in
the state store, checkpointed and restored with the query like any other Spark state). Within a
group, rows are taken in arrival order (``__seq``), which makes both boxes deterministic.

The per-group logic (``TupleWindows``, ``BoundedSorter``) is plain Python so that it can be
tested without a JVM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peer.engine.source import SEQ_COLUMN as SEQ
from peer.model.plan import AggregateCall, AggregateSpec, BSortSpec
from peer.model.schema import Schema, spark_ddl

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame

STATE_DDL = "state STRING"


def _aggregate(call: AggregateCall, values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    fn = call.function
    if fn == "count":
        return len(values) if call.argument is None else len(present)
    if fn == "count_distinct":
        return len(set(present))
    if not present:
        return None
    if fn == "sum":
        return sum(present)
    if fn == "avg":
        return sum(present) / len(present)
    if fn == "min":
        return min(present)
    if fn == "max":
        return max(present)
    if fn == "firstval":
        return present[0]
    if fn == "lastval":
        return present[-1]
    raise ValueError(f"unknown aggregate function {fn!r}")


@dataclass
class TupleWindows:
    """Windows of ``size`` tuples advancing by ``advance`` tuples, for one group."""

    size: int
    advance: int
    calls: tuple[AggregateCall, ...]
    seen: int = 0  # tuples of this group so far
    start: int = 0  # first tuple index of the next window to emit
    buffer: list[list[Any]] = field(default_factory=list)  # [index, arg values...]

    def add(self, args: list[Any]) -> list[tuple[int, int, list[Any]]]:
        """Take one tuple's argument values; return the windows it completes."""
        self.buffer.append([self.seen, *args])
        self.seen += 1
        done = []
        while self.start + self.size <= self.seen:
            rows = [r for r in self.buffer if self.start <= r[0] < self.start + self.size]
            values = [
                _aggregate(call, [r[1 + i] for r in rows]) for i, call in enumerate(self.calls)
            ]
            done.append((self.start, self.start + self.size, values))
            self.start += self.advance
            self.buffer = [r for r in self.buffer if r[0] >= self.start]
        return done

    def dump(self) -> str:
        return json.dumps([self.seen, self.start, self.buffer])

    def load(self, text: str) -> None:
        self.seen, self.start, self.buffer = json.loads(text)


@dataclass
class BoundedSorter:
    """Aurora's BSort: hold ``slack`` + 1 tuples, release the smallest when over the bound."""

    slack: int
    buffer: list[list[Any]] = field(default_factory=list)  # [order value, seq, row values...]

    def add(self, order: Any, seq: int, row: list[Any]) -> list[list[Any]]:
        self.buffer.append([order, seq, *row])
        out = []
        while len(self.buffer) > self.slack:
            # NULL order values sort first, as in Spark's ORDER BY ... ASC.
            smallest = min(
                range(len(self.buffer)),
                key=lambda i: (
                    self.buffer[i][0] is not None,
                    self.buffer[i][0] or 0,
                    self.buffer[i][1],
                ),
            )
            out.append(self.buffer.pop(smallest)[2:])
        return out

    def dump(self) -> str:
        return json.dumps(self.buffer)

    def load(self, text: str) -> None:
        self.buffer = json.loads(text)


def _plain(value: Any, nullable: bool = False) -> Any:
    """A JSON-able Python value for a pandas cell (timestamps become int microseconds). pandas
    shows a NULL as NaN or NaT; in a nullable field that is None (a double NaN there cannot
    be told from NULL, and is taken as one)."""
    import pandas as pd

    if value is None or value is pd.NaT:
        return None
    if isinstance(value, float) and value != value:
        return None if nullable else value
    if isinstance(value, pd.Timestamp):
        return int(value.value // 1000)
    if hasattr(value, "item"):
        return value.item()
    return value


def _frame(rows: list[list[Any]], schema: Schema) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(schema.names))
    for f in schema.fields:
        if f.type == "timestamp":
            frame[f.name] = pd.to_datetime(frame[f.name], unit="us", utc=True)
    return frame


def _grouped(df: DataFrame, group_by: tuple[str, ...]) -> Any:
    """Group by the box's fields; with none, every tuple is in one group (a real column, as
    applyInPandasWithState cannot group by a bare literal)."""
    from pyspark.sql import functions as F

    if group_by:
        return df.groupBy(*[F.col(g) for g in group_by])
    return df.withColumn("__group", F.lit(0)).groupBy("__group")


def tuple_window_aggregate(
    df: DataFrame, spec: AggregateSpec, out: Schema, source: Schema
) -> DataFrame:
    from pyspark.sql.streaming.state import GroupStateTimeout

    size, advance, calls, group_by = (
        int(spec.window_size),
        int(spec.advance),
        spec.calls,
        spec.group_by,
    )
    nullable = {f.name for f in source.fields if f.nullable}
    args = [c.argument for c in calls]

    def run(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        windows = TupleWindows(size, advance, calls)
        if state.exists:
            windows.load(state.get[0])
        batch = pd.concat(list(frames)).sort_values(SEQ)
        rows = []
        group_values = [_plain(v) for v in key] if group_by else []
        for values in batch.to_dict("records"):
            tuple_args = [_plain(values[a], a in nullable) if a else None for a in args]
            for start, end, aggs in windows.add(tuple_args):
                rows.append([start, end, *group_values, *aggs])
        state.update((windows.dump(),))
        yield _frame(rows, out)

    frame: DataFrame = _grouped(df, group_by).applyInPandasWithState(
        run, spark_ddl(out), STATE_DDL, "append", GroupStateTimeout.NoTimeout
    )
    return frame


def bounded_sort(df: DataFrame, spec: BSortSpec, out: Schema) -> DataFrame:
    from pyspark.sql.streaming.state import GroupStateTimeout

    slack, order_on, names = spec.slack, spec.order_on, list(out.names)
    nullable = {f.name for f in out.fields if f.nullable}

    def run(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        sorter = BoundedSorter(slack)
        if state.exists:
            sorter.load(state.get[0])
        batch = pd.concat(list(frames)).sort_values(SEQ)
        rows = []
        for values in batch.to_dict("records"):
            row = [_plain(values[n], n in nullable) for n in names]
            order = _plain(values[order_on], order_on in nullable)
            rows.extend(sorter.add(order, int(values[SEQ]), row))
        state.update((sorter.dump(),))
        yield _frame(rows, out)

    frame: DataFrame = _grouped(df, spec.group_by).applyInPandasWithState(
        run, spark_ddl(out), STATE_DDL, "append", GroupStateTimeout.NoTimeout
    )
    return frame
