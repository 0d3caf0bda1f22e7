"""Per-tuple boxes as one Spark SQL statement over the lane's micro-batch.

The lane runs every member query on each micro-batch. Building each member's DataFrames anew
for every batch costs dozens of py4j round trips (50-90 ms a batch, measured). Instead each
member is translated ONCE, when it joins, into SQL text over the temp view that holds the
micro-batch; a batch then costs two py4j calls (register the view, run the statement) whatever
the number of members.

The translation follows the same box semantics as ``peer.engine.compile`` (filter is a case
statement with NULL as "not satisfied"; map casts each expression to its declared type; union
keeps every tuple) and keeps ``__seq`` through every box. Every member's result streams are
folded into the lane's envelope: ``__member``, ``__out`` and one struct column per distinct
result schema (results of the same shape share it), NULL in the rows of the others. The
statement thus grows with the number of members, not with its square.

A windowed member's part ends in its partial aggregates (``window_partial_sql``): its tuples
cut into windows and grouped per (window, group) by Spark, so that the executors aggregate
and the driver collects one row per (window, group) rather than the member's input rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from peer.engine.lane_source import STREAM, column_name
from peer.engine.lanepartial import TIMESTAMP, TMAX, WS, N, PartialColumn, Partials, T
from peer.engine.source import SEQ_COLUMN as SEQ
from peer.model.plan import CheckedQuery, FilterSpec, MapSpec, UnionSpec
from peer.model.schema import Schema, spark_type

VIEW = "fedstream_lane_batch"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def struct_type(schema: Schema) -> str:
    return "STRUCT<" + ", ".join(f"{_q(f.name)}: {spark_type(f.type)}" for f in schema.fields) + ">"


@dataclass(frozen=True)
class MemberOutput:
    """What one output of a member folds into the envelope: the CTE holding its rows, its
    column names and its struct type (outputs of the same struct type share a column)."""

    cte: str
    names: tuple[str, ...]
    struct: str

    @classmethod
    def of(cls, cte: str, schema: Schema) -> MemberOutput:
        return cls(cte, schema.names, struct_type(schema))


@dataclass(frozen=True)
class MemberSql:
    ctes: tuple[str, ...]  # "name AS (SELECT ...)" definitions, names unique to the member
    outputs: tuple[MemberOutput, ...]  # in the order of the member's result streams


def member_sql(checked: CheckedQuery, member: int, layout: dict[str, tuple[int, int]]) -> MemberSql:
    """Translate a member's boxes; ``layout`` gives each lane stream's (index, shape)."""
    names: dict[str, str] = {}
    ctes: list[str] = []

    def cte(stream: str) -> str:
        return names.setdefault(stream, f"m{member}_s{len(names)}")

    for stream in checked.inputs:
        i, shape = layout[stream]
        schema = checked.stream_schemas[stream]
        cols = ", ".join(f"{_q(column_name(shape, f.name))} AS {_q(f.name)}" for f in schema.fields)
        ctes.append(f"{cte(stream)} AS (SELECT {cols}, {SEQ} FROM {VIEW} WHERE {STREAM} = {i})")
    for box in checked.boxes:
        spec = box.spec
        sources = [names[s] for s in box.box.inputs]
        if isinstance(spec, FilterSpec):
            conds = [f"coalesce(({p.sql}), false)" for p in spec.predicates]
            for k, out in enumerate(box.box.outputs):
                holds = [f"NOT {c}" for c in conds[:k]]
                if k < len(conds):
                    holds.append(conds[k])
                where = " AND ".join(holds) or "true"
                ctes.append(f"{cte(out)} AS (SELECT * FROM {sources[0]} WHERE {where})")
        elif isinstance(spec, MapSpec):
            schema = box.output_schemas[0]
            cols = ", ".join(
                f"CAST(({e.sql}) AS {spark_type(schema.field(n).type)}) AS {_q(n)}"
                for n, e in spec.outputs
            )
            ctes.append(f"{cte(box.box.outputs[0])} AS (SELECT {cols}, {SEQ} FROM {sources[0]})")
        elif isinstance(spec, UnionSpec):
            cols = ", ".join([*map(_q, box.output_schemas[0].names), SEQ])
            union = " UNION ALL ".join(f"SELECT {cols} FROM {s}" for s in sources)
            ctes.append(f"{cte(box.box.outputs[0])} AS ({union})")
        else:
            raise ValueError(f"box {box.box.name} ({box.box.type}) is not a per-tuple box")
    outputs = tuple(MemberOutput.of(names[s], checked.stream_schemas[s]) for s in checked.outputs)
    return MemberSql(tuple(ctes), outputs)


def window_member_sql(
    prefix: CheckedQuery,
    narrow: Schema,
    order_on: str,
    member: int,
    layout: dict[str, tuple[int, int]],
) -> MemberSql:
    """A windowed-aggregate member (``peer.engine.lanewin``): its per-tuple boxes, then only
    the fields its aggregate reads, of the tuples that have an order value."""
    head = member_sql(prefix, member, layout)
    (output,) = head.outputs
    source = output.cte
    name = f"m{member}_w"
    cols = ", ".join(_q(n) for n in narrow.names)
    feed = f"{name} AS (SELECT {cols} FROM {source} WHERE {_q(order_on)} IS NOT NULL)"
    return MemberSql((*head.ctes, feed), (MemberOutput.of(name, narrow),))


def window_partial_sql(
    prefix: CheckedQuery, partials: Partials, member: int, layout: dict[str, tuple[int, int]]
) -> MemberSql:
    """A windowed-aggregate member, aggregated in the executors (``peer.engine.lanepartial``):
    its per-tuple boxes; then each tuple with an order value in every window that holds it
    (Spark's ``window()`` cut: aligned to the epoch, ``start <= t < end``); then one partial
    row per (window, group)."""
    head = member_sql(prefix, member, layout)
    (output,) = head.outputs
    source = output.cte
    order = _q(partials.order_on)
    if partials.order_type == TIMESTAMP:
        event = f"unix_micros({order})"
    else:  # compile.to_event_time
        event = f"CAST(round(CAST({order} AS DOUBLE) * 1000000.0) AS BIGINT)"
    cols = [
        f"unix_micros({_q(n)}) AS {_q(n)}" if n in partials.timestamps else _q(n)
        for n in partials.narrow.names
    ]
    x, e, p = f"m{member}_x", f"m{member}_e", f"m{member}_p"
    fed = (
        f"{x} AS (SELECT {', '.join(cols)}, {event} AS {T} FROM {source} WHERE {order} IS NOT NULL)"
    )
    size, advance = f"{partials.size}L", f"{partials.advance}L"
    last = f"{T} - pmod({T}, {advance})"  # the start of the last window holding the tuple
    if partials.per_tuple == 1:  # tumbling, or a tuple in one window only
        cut = f"{e} AS (SELECT *, {last} AS {WS} FROM {x})"
    else:
        ks = f"explode(sequence(0, {partials.per_tuple - 1}))"
        every = f"SELECT *, {last} - {advance} * __k AS {WS} FROM {x} LATERAL VIEW {ks} g AS __k"
        cut = f"{e} AS (SELECT * FROM ({every}) WHERE {WS} + {size} > {T})"
    keys = [_q(name) for _, name in partials.keys]
    picked = [
        WS,
        *(f"{key} AS {alias}" for key, (alias, _) in zip(keys, partials.keys, strict=True)),
        f"count(1) AS {N}",
        f"max({T}) AS {TMAX}",
        *(f"{_partial(c)} AS {c.name}" for c in partials.columns),
    ]
    grouped = f"{p} AS (SELECT {', '.join(picked)} FROM {e} GROUP BY {', '.join([WS, *keys])})"
    struct = (
        "STRUCT<"
        + ", ".join(
            f"{n}: {t}" for n, t in zip(partials.names, partials.spark_types(), strict=True)
        )
        + ">"
    )
    return MemberSql((*head.ctes, fed, cut, grouped), (MemberOutput(p, partials.names, struct),))


def _partial(column: PartialColumn) -> str:
    arg = _q(column.argument) if column.argument is not None else ""
    if column.kind == "count_all":
        return "count(1)"
    if column.kind == "count":
        return f"count({arg})"
    if column.kind == "distinct":
        return f"collect_set({arg})"
    if column.kind == "sum":
        return f"CAST(sum({arg}) AS {column.spark})"
    return f"{column.kind}({arg})"  # min, max


def lane_statement(members: list[MemberSql]) -> tuple[str, list[list[str]]]:
    """One statement computing every member's results, folded into the envelope; and, per
    member and output, the envelope column that holds it (outputs of one struct type share)."""
    slots: dict[str, str] = {}
    for member in members:
        for out in member.outputs:
            slots.setdefault(out.struct, f"__slot{len(slots)}")
    selects = []
    for j, member in enumerate(members):
        for k, out in enumerate(member.outputs):
            mine = slots[out.struct]
            columns = [f"{j} AS __member", f"{k} AS __out"]
            for type_, column in slots.items():
                if column == mine:
                    fields = ", ".join(f"'{f}', {_q(f)}" for f in out.names)
                    columns.append(f"named_struct({fields}) AS {column}")
                else:
                    columns.append(f"CAST(NULL AS {type_}) AS {column}")
            selects.append(f"SELECT {', '.join(columns)} FROM {out.cte}")
    ctes = [c for m in members for c in m.ctes]
    statement = f"WITH {', '.join(ctes)} {' UNION ALL '.join(selects)}"
    return statement, [[slots[out.struct] for out in m.outputs] for m in members]
