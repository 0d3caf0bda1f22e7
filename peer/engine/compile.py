"""Compiling a checked query into Spark DataFrame operations.

Theory of operation
-------------------
A query's boxes are realised in topological order on streaming DataFrames, one DataFrame per
stream name: filter is ``where``, map is ``select``, union is ``unionByName``, a VALUES
aggregate is an event-time ``window()`` under a watermark, a join is a stream-stream join with a
time-range condition, and the count-based boxes (TUPLES aggregate, bsort) keep their state per
group in Spark's state store through ``applyInPandasWithState`` (see ``peer.engine.stateful``).

When some box depends on arrival order (firstval, lastval, count windows, bsort), every
input stream carries a hidden ``__seq`` column (the spool's arrival order) through the
per-tuple boxes, which makes those boxes deterministic; other queries do without it. Order
fields of any numeric type are mapped to timestamps (one unit = one second)
in a hidden ``__ts`` column, because Spark's windows and watermarks need timestamps; window bounds
are mapped back to the order field's type. Windows are aligned to multiples of ``advance``
counted from zero, as Spark's ``window()`` is aligned to the epoch.

An aggregate over a union puts its watermark on each of the union's inputs, so that Spark's
global watermark is the lowest of them (its default multiple-watermark policy): a window
closes only once every input has passed it, and an input that falls silent holds results
back instead of seeing its late tuples dropped. A query with an availability bound reads its
sources with a hidden ``__hb`` column: a tentative fork (``peer.engine.forks``) feeds a
missing input one heartbeat row far ahead in event time, which advances that input's
watermark and is dropped right after it (heartbeats pass every filter and leave before a
stateful box or the sink).

The query's result streams are folded into one DataFrame: a column ``__out`` says which result
a row belongs to and one struct column per result holds its fields. A single streaming query
(one micro-batch loop, one job per batch) thus serves a query with any number of results; the
sink splits the batch again (``split_outputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from peer.engine.source import HB_COLUMN as HB  # heartbeat rows of a tentative fork
from peer.engine.source import SEQ_COLUMN as SEQ  # the arrival order the spool sources add
from peer.errors import QueryError
from peer.model.plan import (
    AggregateSpec,
    BSortSpec,
    CheckedBox,
    CheckedQuery,
    FilterSpec,
    JoinSpec,
    MapSpec,
    UnionSpec,
)
from peer.model.schema import Schema, spark_type
from peer.storage.spool_format import is_lineage, lineage_seq

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

TS = "__ts"
OUT = "__out"
ORDERED = ("firstval", "lastval")  # aggregate functions that depend on arrival order

# Reads one input stream: (stream name, schema) -> streaming DataFrame with a trailing __seq.
SourceFactory = Callable[[str, Schema], "DataFrame"]


@dataclass(frozen=True)
class CompiledQuery:
    """The single DataFrame a query's streaming query writes, and how to split its batches."""

    frame: DataFrame
    outputs: tuple[tuple[str, Schema], ...]  # result stream name and schema, by __out index


def _micros(seconds: float) -> str:
    return f"{round(seconds * 1_000_000)} microseconds"


# Spark treats an event time at or before its initial watermark (the epoch) as late in a
# stream-stream join, which drops tuples whose order value is 0. A join depends only on
# differences of order values, so its numeric order fields are mapped from this base instead.
JOIN_BASE_S = 946_684_800  # 2000-01-01T00:00:00Z


def to_event_time(df: DataFrame, field: str, type_: str, *, base_s: int = 0) -> Column:
    """The timestamp Spark windows and watermarks on, for an order field of any type."""
    from pyspark.sql import functions as F

    col = F.col(field)
    if type_ == "timestamp":
        return col
    micros = F.round((col.cast("double") + base_s) * 1_000_000).cast("bigint")
    return F.timestamp_micros(micros)


def from_event_time(col: Column, type_: str) -> Column:
    """Inverse of to_event_time for window bounds."""
    from pyspark.sql import functions as F

    if type_ == "timestamp":
        return col
    seconds = F.unix_micros(col).cast("double") / 1_000_000
    return seconds.cast(spark_type(type_))


def _data_columns(schema: Schema) -> list[str]:
    return list(schema.names)


def _with_seq(df: DataFrame, columns: list[str]) -> list[str]:
    return [*columns, SEQ] if SEQ in df.columns else columns


def _beatless(df: DataFrame, event_time: str | None = None) -> DataFrame:
    """``df`` without heartbeat rows. Right after a watermark the condition names the event
    time, or Spark's optimizer would push it below the watermark, which would then never
    see a heartbeat."""
    from pyspark.sql import functions as F

    if HB not in df.columns:
        return df
    keep = ~F.col(HB)
    if event_time is not None:
        keep = keep | F.col(event_time).isNull()
    return df.where(keep).drop(HB)


class _Compiler:
    def __init__(
        self, checked: CheckedQuery, source: SourceFactory, *, lineage: bool = False
    ) -> None:
        self.checked = checked
        self.lineage = lineage
        self.frames: dict[str, DataFrame] = {}
        self.branches: dict[str, list[DataFrame]] = {}  # a union's inputs, by its output
        for name in checked.inputs:
            self.frames[name] = source(name, checked.stream_schemas[name])

    def where(self, box: CheckedBox, param: str = "") -> str:
        text = f"query {self.checked.query.name}, box {box.box.name}"
        return f"{text}, parameter {param}" if param else text

    def run(self) -> CompiledQuery:
        for box in self.checked.boxes:
            inputs = [self.frames[s] for s in box.box.inputs]
            outputs = self.box(box, inputs)
            for stream, frame in zip(box.box.outputs, outputs, strict=True):
                self.frames[stream] = frame
        return self.fold()

    def box(self, box: CheckedBox, inputs: list[DataFrame]) -> list[DataFrame]:
        spec = box.spec
        if isinstance(spec, FilterSpec):
            return self.filter(spec, box, inputs[0])
        if isinstance(spec, MapSpec):
            return [self.map(spec, box, inputs[0])]
        if isinstance(spec, UnionSpec):
            return [self.union(box, inputs)]
        if isinstance(spec, AggregateSpec):
            if spec.window_by == "TUPLES":
                from peer.engine.stateful import tuple_window_aggregate

                out, source = box.output_schemas[0], box.input_schemas[0]
                return [tuple_window_aggregate(_beatless(inputs[0]), spec, out, source)]
            return [self.aggregate(spec, box, inputs[0])]
        if isinstance(spec, JoinSpec):
            return [self.join(spec, box, inputs[0], inputs[1])]
        if isinstance(spec, BSortSpec):
            from peer.engine.stateful import bounded_sort

            return [bounded_sort(_beatless(inputs[0]), spec, box.output_schemas[0])]
        raise QueryError(f"{self.where(box)}: box type {box.box.type!r} cannot run on Spark")

    def filter(self, spec: FilterSpec, box: CheckedBox, df: DataFrame) -> list[DataFrame]:
        from pyspark.sql import functions as F

        # A case statement: a tuple leaves through the first predicate it satisfies. NULL is
        # "not satisfied", so every predicate is wrapped in coalesce(..., false).
        conds = [F.coalesce(F.expr(p.sql), F.lit(False)) for p in spec.predicates]
        beat = F.col(HB) if HB in df.columns else F.lit(False)  # heartbeats pass every port
        outs: list[DataFrame] = []
        none_before: Column = F.lit(True)
        for cond in conds:
            outs.append(df.where((none_before & cond) | beat))
            none_before = none_before & ~cond
        if spec.pass_on_false:
            outs.append(df.where(none_before | beat))
        return outs

    def map(self, spec: MapSpec, box: CheckedBox, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        schema = box.output_schemas[0]
        cols = [
            F.expr(expr.sql).cast(spark_type(schema.field(name).type)).alias(name)
            for name, expr in spec.outputs
        ]
        cols.extend(F.col(c) for c in (SEQ, HB) if c in df.columns)
        return df.select(*cols)

    def union(self, box: CheckedBox, inputs: list[DataFrame]) -> DataFrame:
        columns = _data_columns(box.output_schemas[0])
        wanted = columns + [c for c in (SEQ, HB) if all(c in df.columns for df in inputs)]
        branches = [df.select(*wanted) for df in inputs]
        self.branches[box.box.outputs[0]] = branches
        result = branches[0]
        for other in branches[1:]:
            result = result.unionByName(other)
        return result

    def aggregate(self, spec: AggregateSpec, box: CheckedBox, df: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        order_on = spec.order_on
        assert order_on is not None  # check_query requires it for VALUES windows
        schema = box.output_schemas[0]

        def watermarked(df: DataFrame) -> DataFrame:
            # A tuple whose order value is NULL belongs to no window (SQL: no comparison holds).
            df = df.where(F.col(order_on).isNotNull())
            timed = df.withColumn(TS, to_event_time(df, order_on, spec.order_type))
            return _beatless(timed.withWatermark(TS, _micros(spec.slack)), TS)

        # Over a union: one watermark per input, so the lowest holds the windows open.
        branches = self.branches.get(box.box.inputs[0], [df])
        timed = watermarked(branches[0])
        for other in branches[1:]:
            timed = timed.unionByName(watermarked(other))
        window = F.window(TS, _micros(spec.window_size), _micros(spec.advance)).alias("__w")
        aggs = [
            self._agg(call.function, call.argument, SEQ in df.columns).alias(call.output_name)
            for call in spec.calls
        ]
        grouped = timed.groupBy(window, *[F.col(g) for g in spec.group_by]).agg(*aggs)
        out = [
            from_event_time(F.col("__w.start"), spec.order_type).alias("window_start"),
            from_event_time(F.col("__w.end"), spec.order_type).alias("window_end"),
            *[F.col(g) for g in spec.group_by],
            *[
                F.col(c.output_name)
                .cast(spark_type(schema.field(c.output_name).type))
                .alias(c.output_name)
                for c in spec.calls
            ],
        ]
        return grouped.select(*out)

    @staticmethod
    def _agg(function: str, argument: str | None, has_seq: bool) -> Column:
        from pyspark.sql import functions as F

        if function == "count":
            return F.count(F.lit(1)) if argument is None else F.count(F.col(argument))
        assert argument is not None
        col = F.col(argument)
        if function == "sum":
            return F.sum(col)
        if function == "avg":
            return F.avg(col)
        if function == "min":
            return F.min(col)
        if function == "max":
            return F.max(col)
        if function == "count_distinct":
            # Spark refuses distinct aggregates on streams; a set in the state store is exact.
            return F.size(F.collect_set(col))
        if function in ("firstval", "lastval"):
            if not has_seq:
                raise QueryError(
                    f"{function}({argument}) needs arrival order, which is lost "
                    "after a join or an aggregate"
                )
            pick = F.min_by if function == "firstval" else F.max_by
            # Aggregates skip NULL: a NULL value's row has no order, so min_by/max_by skip it.
            return pick(col, F.when(col.isNotNull(), F.col(SEQ)))
        raise QueryError(f"aggregate function {function!r} cannot run on Spark")

    def join(self, spec: JoinSpec, box: CheckedBox, left: DataFrame, right: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        lschema, rschema = box.input_schemas
        delay = _micros(max(spec.left_buffer, spec.right_buffer))
        lt = left.withColumn(
            TS,
            to_event_time(
                left, spec.left_order_on, lschema.field(spec.left_order_on).type, base_s=JOIN_BASE_S
            ),
        )
        rt = right.withColumn(
            TS,
            to_event_time(
                right,
                spec.right_order_on,
                rschema.field(spec.right_order_on).type,
                base_s=JOIN_BASE_S,
            ),
        )
        lt = _beatless(lt.withWatermark(TS, delay), TS).alias("left")
        rt = _beatless(rt.withWatermark(TS, delay), TS).alias("right")
        # The order fields differ by less than the other side's buffer (DESIGN.md section 5).
        cond = F.expr(
            f"`left`.`{TS}` < `right`.`{TS}` + INTERVAL {_micros(spec.right_buffer)}"
        ) & F.expr(f"`right`.`{TS}` < `left`.`{TS}` + INTERVAL {_micros(spec.left_buffer)}")
        if spec.predicate is not None:
            cond = cond & F.expr(spec.predicate.sql)
        joined = lt.join(rt, cond, "inner")
        cols = []
        for source, name in spec.out_fields:
            side, _, field = source.partition(".")
            cols.append(F.col(f"`{side}`.`{field}`").alias(name))
        if self.lineage and SEQ in left.columns and SEQ in right.columns:
            # the two input tuples behind each pair, left first (a standby names it by them)
            for k, side in enumerate(("left", "right")):
                cols.append(F.col(f"`{side}`.`{SEQ}`").alias(lineage_seq(k)))
        return joined.select(*cols)

    def fold(self) -> CompiledQuery:
        from pyspark.sql import functions as F

        outputs = tuple((s, self.checked.stream_schemas[s]) for s in self.checked.outputs)
        if not outputs:
            raise QueryError(f"query {self.checked.query.name}: produces no stream")
        parts = []
        for index, (stream, schema) in enumerate(outputs):
            df = _beatless(self.frames[stream])
            fields = [F.col(c) for c in schema.names]
            if self.lineage:
                fields.extend(F.col(c) for c in df.columns if c == SEQ or is_lineage(c))
            parts.append(df.select(F.lit(index).alias(OUT), F.struct(*fields).alias(f"__o{index}")))
        frame = parts[0]
        for part in parts[1:]:
            frame = frame.unionByName(part, allowMissingColumns=True)
        return CompiledQuery(frame, outputs)


def needs_arrival_order(checked: CheckedQuery) -> bool:
    """Whether some box depends on the order tuples arrived in (then sources add ``__seq``,
    an extra column on every row that other queries need not pay for)."""
    for box in checked.boxes:
        spec = box.spec
        if isinstance(spec, BSortSpec):
            return True
        if isinstance(spec, AggregateSpec) and (
            spec.window_by == "TUPLES" or any(c.function in ORDERED for c in spec.calls)
        ):
            return True
    return False


def compile_query(
    checked: CheckedQuery, source: SourceFactory, *, lineage: bool = False
) -> CompiledQuery:
    """Build the streaming DataFrame of ``checked``. Blocking py4j calls: run off the loop.
    ``lineage``: each result of a stream whose frame carries the sources' ``__seq`` (the input
    tuple behind a per-tuple result) keeps it, and :func:`split_outputs` hands it on (a warm
    standby names its results by it, peer.replication.standby)."""
    return _Compiler(checked, source, lineage=lineage).run()


def split_outputs(compiled: CompiledQuery, table: pa.Table) -> dict[str, pa.Table]:
    """Split one collected micro-batch of the folded frame into per-stream tables."""
    import pyarrow.compute as pc

    result: dict[str, pa.Table] = {}
    if table.num_rows == 0:
        return result
    out = table.column(OUT)
    for index, (stream, schema) in enumerate(compiled.outputs):
        rows = table.filter(pc.equal(out, index)) if len(compiled.outputs) > 1 else table
        if rows.num_rows:
            result[stream] = unfold(rows, f"__o{index}", schema)
    return result


def unfold(rows: pa.Table, column: str, schema: Schema) -> pa.Table:
    """The fields of a result's struct column, as a table of the result stream's schema (and
    ``__seq`` or ``__lineage<k>_seq`` after it when the struct carries them: compiled with
    lineage)."""
    import pyarrow as pa

    struct = rows.column(column).combine_chunks()
    names = list(schema.names)
    names.extend(
        f.name for f in struct.type if f.name not in names and (f.name == SEQ or is_lineage(f.name))
    )
    return pa.table({name: struct.field(name) for name in names})
