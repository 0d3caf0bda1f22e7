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
"""

from __future__ import annotations

from dataclasses import dataclass

from peer.engine.lane_source import STREAM, column_name
from peer.engine.source import SEQ_COLUMN as SEQ
from peer.model.plan import CheckedQuery, FilterSpec, MapSpec, UnionSpec
from peer.model.schema import Schema, spark_type

VIEW = "fedstream_lane_batch"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def struct_type(schema: Schema) -> str:
    return "STRUCT<" + ", ".join(f"{_q(f.name)}: {spark_type(f.type)}" for f in schema.fields) + ">"


@dataclass(frozen=True)
class MemberSql:
    ctes: tuple[str, ...]  # "name AS (SELECT ...)" definitions, names unique to the member
    outputs: tuple[tuple[str, str, Schema], ...]  # (result stream, CTE holding it, schema)


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
    outputs = tuple((s, names[s], checked.stream_schemas[s]) for s in checked.outputs)
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
    ((_, source, _),) = head.outputs
    name = f"m{member}_w"
    cols = ", ".join(_q(n) for n in narrow.names)
    feed = f"{name} AS (SELECT {cols} FROM {source} WHERE {_q(order_on)} IS NOT NULL)"
    return MemberSql((*head.ctes, feed), ((narrow.name, name, narrow),))


def slot_of(schema: Schema) -> str:
    """Results of the same field names and types share one struct column of the envelope."""
    return struct_type(schema)


def lane_statement(members: list[MemberSql]) -> tuple[str, dict[str, str]]:
    """One statement computing every member's results, folded into the envelope; and the
    envelope column of each result shape (``slot_of``)."""
    slots: dict[str, str] = {}
    for member in members:
        for _, _, schema in member.outputs:
            slots.setdefault(slot_of(schema), f"__slot{len(slots)}")
    selects = []
    for j, member in enumerate(members):
        for k, (_, source, schema) in enumerate(member.outputs):
            mine = slots[slot_of(schema)]
            columns = [f"{j} AS __member", f"{k} AS __out"]
            for type_, column in slots.items():
                if column == mine:
                    fields = ", ".join(f"'{f}', {_q(f)}" for f in schema.names)
                    columns.append(f"named_struct({fields}) AS {column}")
                else:
                    columns.append(f"CAST(NULL AS {type_}) AS {column}")
            selects.append(f"SELECT {', '.join(columns)} FROM {source}")
    ctes = [c for m in members for c in m.ctes]
    return f"WITH {', '.join(ctes)} {' UNION ALL '.join(selects)}", slots
