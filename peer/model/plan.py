"""Checking a query against stream schemas into typed specs: what the Spark compiler consumes.

:func:`check_query` walks the boxes in topological order. Each box's input schemas are known by
then (existing streams, or streams derived by an upstream box), so each box's parameters are
read (:class:`~peer.model.params.BoxParams`), its expressions parsed and typed against them,
and its output schemas derived, named after their streams. A derived schema must match the
schema of a stream that already exists under the same name. Every error names the query, the
box and the parameter.

Semantics the specs carry (see DESIGN.md section 5):

- filter is Aurora's case statement: a tuple goes to the output of the first predicate it
  satisfies; with ``pass-on-false-port`` it goes to one extra, last output when it satisfies
  none.
- aggregate windows are aligned to multiples of ``advance`` from zero; its output fields are
  ``window_start``, ``window_end`` (the order field's type; long for TUPLES), the group-by
  fields, then one field per call. Lengths on timestamp fields are seconds.
- join: a left and a right tuple join when the predicate holds and
  ``left.order - right.order < right_buffer`` and ``right.order - left.order < left_buffer``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from peer.errors import ExpressionError, QueryError, SchemaError
from peer.model.borealis import AGGREGATE_PARAMS, DROP_PARAMS, check_drop
from peer.model.expr import Expr, parse_expression
from peer.model.params import ORDER_TYPES, BoxParams
from peer.model.query import Box, Query, make_query, topological_order
from peer.model.schema import Field, Schema, check_field_name, make_schema
from peer.model.windows import (
    AGGREGATE_FUNCTIONS,
    AggregateCall,
    AggregateSpec,
    JoinSpec,
    Outputs,
    check_aggregate,
    check_join,
)

__all__ = [
    "AGGREGATE_FUNCTIONS",
    "AggregateCall",
    "AggregateSpec",
    "BSortSpec",
    "CheckedBox",
    "CheckedQuery",
    "FilterSpec",
    "JoinSpec",
    "MapSpec",
    "Spec",
    "UnionSpec",
    "check_query",
]


@dataclass(frozen=True)
class FilterSpec:
    predicates: tuple[Expr, ...]
    pass_on_false: bool


@dataclass(frozen=True)
class MapSpec:
    outputs: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class UnionSpec:
    pass


@dataclass(frozen=True)
class BSortSpec:
    order_on: str
    slack: int
    group_by: tuple[str, ...]


Spec = FilterSpec | MapSpec | UnionSpec | AggregateSpec | JoinSpec | BSortSpec


@dataclass(frozen=True)
class CheckedBox:
    box: Box
    spec: Spec
    input_schemas: tuple[Schema, ...]
    output_schemas: tuple[Schema, ...]


@dataclass(frozen=True)
class CheckedQuery:
    query: Query
    boxes: tuple[CheckedBox, ...]
    stream_schemas: Mapping[str, Schema]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def check_query(query: Query, streams: Mapping[str, Schema]) -> CheckedQuery:
    """Check ``query`` against the existing ``streams`` (name -> schema)."""
    # A Query may have been built directly rather than parsed: check its structure again.
    make_query(query.name, list(query.boxes))
    known: dict[str, Schema] = {}
    produced = {s for box in query.boxes for s in box.outputs}
    consumed: set[str] = set()
    inputs: list[str] = []
    checked: list[CheckedBox] = []
    for box in topological_order(query):
        in_schemas = []
        for stream in box.inputs:
            consumed.add(stream)
            if stream not in known:
                if stream not in streams:
                    raise QueryError(
                        f"query {query.name}, box {box.name}: input stream {stream} does not exist",
                        query=query.name,
                        box=box.name,
                        stream=stream,
                    )
                known[stream] = streams[stream]
                if stream not in produced and stream not in inputs:
                    inputs.append(stream)
            in_schemas.append(known[stream])
        spec, out_fields = _CHECKS[box.type](
            BoxParams(query.name, box, *_PARAMS[box.type]), in_schemas
        )
        out_schemas = []
        for stream, fields in zip(box.outputs, out_fields, strict=True):
            known[stream] = _output_schema(query.name, box, stream, fields, streams.get(stream))
            out_schemas.append(known[stream])
        checked.append(CheckedBox(box, spec, tuple(in_schemas), tuple(out_schemas)))
    outputs = tuple(s for box in checked for s in box.box.outputs if s not in consumed)
    return CheckedQuery(query, tuple(checked), known, tuple(inputs), outputs)


def _output_schema(
    query: str, box: Box, stream: str, fields: list[Field], existing: Schema | None
) -> Schema:
    try:
        derived = make_schema(stream, fields)
    except SchemaError as exc:
        raise QueryError(
            f"query {query}, box {box.name}: output stream {stream}: {exc.message}",
            query=query,
            box=box.name,
            stream=stream,
        ) from exc
    if existing is None:
        return derived
    if _shape(existing) != _shape(derived):
        raise QueryError(
            f"query {query}, box {box.name}: output stream {stream} exists with fields "
            f"({_shape_text(existing)}) but the box produces ({_shape_text(derived)})",
            query=query,
            box=box.name,
            stream=stream,
        )
    for have, made in zip(existing.fields, derived.fields, strict=True):
        if made.nullable and not have.nullable:
            raise QueryError(
                f"query {query}, box {box.name}: output stream {stream} field '{have.name}' is "
                "not nullable, but the box may produce NULL there (from a nullable input, a "
                "NULL or a CASE without ELSE); declare the field nullable",
                query=query,
                box=box.name,
                stream=stream,
                field=have.name,
            )
    return existing


def _shape(schema: Schema) -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in schema.fields]


def _shape_text(schema: Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema.fields)


# -- per box type (aggregate and join, the windowed ones, live in peer.model.windows) -----------


def _filter(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    (schema,) = inputs
    predicates = []
    for i, text in enumerate(p.indexed("expression")):
        expr = parse_expression(text, schema, where=p.where(f"expression.{i}"))
        if expr.type != "bool":
            raise ExpressionError(
                f"{p.where(f'expression.{i}')}: a filter predicate must be bool, got {expr.type}"
            )
        predicates.append(expr)
    pass_on_false = p.boolean("pass-on-false-port", False)
    wanted = len(predicates) + int(pass_on_false)
    if len(p.box.outputs) != wanted:
        raise p.error(
            f"declares {len(p.box.outputs)} outputs but has {len(predicates)} expressions"
            f"{' plus the pass-on-false output' if pass_on_false else ''}: needs {wanted}",
            "pass-on-false-port" if pass_on_false else None,
        )
    return FilterSpec(tuple(predicates), pass_on_false), [list(schema.fields)] * wanted


def _map(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    (schema,) = inputs
    texts = p.indexed("expression")
    names = p.names_for("output-field-name", len(texts), "expression")
    outputs: list[tuple[str, Expr]] = []
    seen: set[str] = set()
    for i, text in enumerate(texts):
        expr = parse_expression(text, schema, where=p.where(f"expression.{i}"))
        param = f"output-field-name.{i}"
        name = names.get(i)
        if name is None:
            # A bare column keeps its name; anything else must be named.
            if len(expr.columns) != 1 or expr.sql != f"`{next(iter(expr.columns))}`":
                raise p.error("is required for an expression that is not a bare column", param)
            name = next(iter(expr.columns))
        check_field_name(name, QueryError, f"{p.where(param)}: ")
        if name.lower() in seen:
            raise p.error(f"output field '{name}' is produced twice", param)
        seen.add(name.lower())
        outputs.append((name, expr))
    return MapSpec(tuple(outputs)), [[Field(n, e.type, nullable=e.nullable) for n, e in outputs]]


def _union(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    first = inputs[0]
    for stream, schema in zip(p.box.inputs[1:], inputs[1:], strict=True):
        if _shape(schema) != _shape(first):
            raise p.error(
                f"input streams {p.box.inputs[0]} ({_shape_text(first)}) and {stream} "
                f"({_shape_text(schema)}) must have identical fields",
                stream=stream,
            )
    nullable = [any(s.fields[i].nullable for s in inputs) for i in range(len(first.fields))]
    fields = [
        Field(f.name, f.type, nullable=n) for f, n in zip(first.fields, nullable, strict=True)
    ]
    return UnionSpec(), [fields]


def _bsort(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    (schema,) = inputs
    order_on = p.field("order-on", p.require("order-on"), schema, ORDER_TYPES)
    slack = p.number("slack", p.get("slack") or "0", integral=True, zero_ok=True)
    group_by = p.field_list("group-by", schema)
    return BSortSpec(order_on.name, int(slack), group_by), [list(schema.fields)]


def _drop(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    """Borealis' load-shedding boxes: at drop rate 0 they pass every tuple, like a union of
    one input (peer.model.borealis)."""
    check_drop(p)
    return UnionSpec(), [list(inputs[0].fields)]


def _aggregate(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    return check_aggregate(p, inputs[0])


def _join(p: BoxParams, inputs: list[Schema]) -> tuple[Spec, Outputs]:
    return check_join(p, inputs[0], inputs[1])


_CHECKS: dict[str, Callable[[BoxParams, list[Schema]], tuple[Spec, Outputs]]] = {
    "filter": _filter,
    "map": _map,
    "union": _union,
    "aggregate": _aggregate,
    "join": _join,
    "bsort": _bsort,
    "random_drop": _drop,
    "window_drop": _drop,
}

# (fixed parameter names, indexed parameter bases) per box type.
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "filter": (("pass-on-false-port",), ("expression",)),
    "map": ((), ("expression", "output-field-name")),
    "union": ((), ()),
    "aggregate": (
        (
            "window-size",
            "advance",
            "window-size-by",
            "order-on-field",
            "group-by",
            "slack",
            "timeout",
            *AGGREGATE_PARAMS,
        ),
        ("aggregate-function", "aggregate-function-output-name"),
    ),
    "join": (
        (
            "predicate",
            "left-order-by",
            "right-order-by",
            "left-order-on-field",
            "right-order-on-field",
            "left-buffer-size",
            "right-buffer-size",
            "timeout",
        ),
        ("out-field", "out-field-name"),
    ),
    "bsort": (("order-on", "slack", "group-by"), ()),
    "random_drop": (DROP_PARAMS, ()),
    "window_drop": (DROP_PARAMS, ()),
}
