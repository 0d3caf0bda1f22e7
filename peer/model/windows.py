"""The windowed boxes, aggregate and join: their specs and how their parameters are checked.

Aggregate windows come in two kinds (``window-size-by``): VALUES windows are ranges of an
order field (``order-on-field``: int, long, double or timestamp; lengths on a timestamp field
are seconds), TUPLES windows are runs of ``window-size`` tuples per group, counted in the order
of ``order-on-field`` when one is given and in arrival order otherwise (Borealis' ``order-by``
FIELD and TUPLENUM). ``advance`` defaults to ``window-size`` (tumbling windows) and may not
exceed it. ``slack`` bounds how late a tuple may arrive and still count. Borealis' other
aggregate parameters are read by :mod:`peer.model.borealis`.

A join buffers each side on its order field; only VALUES buffers exist (a TUPLES buffer's
contents would depend on arrival order across peers, which no batch engine can reproduce).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from peer.errors import ExpressionError, QueryError
from peer.model.borealis import aggregate_order_by, check_timeout
from peer.model.expr import Expr, parse_expression
from peer.model.params import ORDER_TYPES, BoxParams
from peer.model.schema import NUMERIC_TYPES, Field, Schema, check_field_name

AGGREGATE_FUNCTIONS = ("count", "count_distinct", "sum", "avg", "min", "max", "firstval", "lastval")
_CALL = re.compile(r"\s*([A-Za-z_]+)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)?\s*\)\s*")

Outputs = list[list[Field]]


@dataclass(frozen=True)
class AggregateCall:
    function: str
    argument: str | None
    output_name: str
    output_type: str
    nullable: bool = False  # NULL for a window whose argument values are all NULL


@dataclass(frozen=True)
class AggregateSpec:
    calls: tuple[AggregateCall, ...]
    window_by: str
    window_size: float
    advance: float
    order_on: str | None
    group_by: tuple[str, ...]
    slack: float
    order_type: str


@dataclass(frozen=True)
class JoinSpec:
    predicate: Expr | None
    left_order_on: str
    right_order_on: str
    left_buffer: float
    right_buffer: float
    out_fields: tuple[tuple[str, str], ...]


def check_aggregate(p: BoxParams, schema: Schema) -> tuple[AggregateSpec, Outputs]:
    window_by = (p.get("window-size-by") or "VALUES").strip().upper()
    if window_by not in ("VALUES", "TUPLES"):
        raise p.error(f"must be VALUES or TUPLES, got {window_by!r}", "window-size-by")
    order_by = aggregate_order_by(p)
    slack_text = p.get("slack") or "0"
    order_field: Field | None = None
    if window_by == "VALUES":
        order_field = p.field(
            "order-on-field",
            p.require("order-on-field", " for VALUES windows"),
            schema,
            ORDER_TYPES,
        )
        order_type = order_field.type
    else:
        if order_by == "FIELD" or (order_by is None and p.get("order-on-field") is not None):
            why = " for order-by FIELD" if order_by else ""
            order_field = p.field(
                "order-on-field", p.require("order-on-field", why), schema, ORDER_TYPES
            )
        order_type = "long"
    # Windows over int fields (and tuple counts) are cut at whole numbers.
    integral = order_type in ("int", "long")
    size = p.duration("window-size", p.require("window-size"), order_type, integral=integral)
    advance_text = p.get("advance")
    advance = (
        size
        if advance_text is None
        else p.duration("advance", advance_text, order_type, integral=integral)
    )
    if advance > size:
        raise p.error(f"must not exceed window-size ({advance:g} > {size:g})", "advance")
    slack = p.duration("slack", slack_text, order_type, integral=integral, zero_ok=True)
    group_by = p.field_list("group-by", schema)

    for name in group_by:
        if name.lower() in ("window_start", "window_end"):
            raise p.error(f"field '{name}' clashes with the window's own field", "group-by")
    fields = [Field("window_start", order_type), Field("window_end", order_type)]
    fields += [schema.field(name) for name in group_by]
    taken = {"window_start": "window", "window_end": "window"}
    taken.update((name.lower(), "group-by") for name in group_by)
    calls = _calls(p, schema, taken)
    fields += [Field(c.output_name, c.output_type, nullable=c.nullable) for c in calls]
    spec = AggregateSpec(
        calls=tuple(calls),
        window_by=window_by,
        window_size=size,
        advance=advance,
        order_on=order_field.name if order_field else None,
        group_by=group_by,
        slack=slack,
        order_type=order_type,
    )
    return spec, [fields]


def _calls(p: BoxParams, schema: Schema, taken: dict[str, str]) -> list[AggregateCall]:
    texts = p.indexed("aggregate-function")
    names = p.names_for("aggregate-function-output-name", len(texts), "aggregate-function")
    calls = []
    for i, text in enumerate(texts):
        param = f"aggregate-function.{i}"
        match = _CALL.fullmatch(text)
        if match is None:
            raise p.error(f"must look like 'sum(field)' or 'count()', got {text!r}", param)
        function, argument = match.group(1).lower(), match.group(2)
        if function not in AGGREGATE_FUNCTIONS:
            raise p.error(
                f"unknown aggregate function {function!r} "
                f"(functions: {', '.join(AGGREGATE_FUNCTIONS)})",
                param,
            )
        if argument in (None, "*"):
            if function != "count":
                raise p.error(f"{function}() needs a field", param)
            field = None
        else:
            numeric = function in ("sum", "avg")
            field = p.field(param, argument, schema, NUMERIC_TYPES if numeric else None)
        name_param = f"aggregate-function-output-name.{i}"
        name = names.get(i) or f"agg_{i}"
        check_field_name(name, QueryError, f"{p.where(name_param)}: ")
        if name.lower() in taken:
            raise p.error(
                f"output field '{name}' clashes with a {taken[name.lower()]} field", name_param
            )
        taken[name.lower()] = "previous aggregate"
        calls.append(
            AggregateCall(
                function,
                field.name if field else None,
                name,
                _result_type(function, field),
                nullable=field is not None and field.nullable and not function.startswith("count"),
            )
        )
    return calls


def _result_type(function: str, field: Field | None) -> str:
    if function in ("count", "count_distinct"):
        return "long"
    assert field is not None
    if function == "sum":
        return "double" if field.type == "double" else "long"
    if function == "avg":
        return "double"
    return field.type


def check_join(p: BoxParams, left: Schema, right: Schema) -> tuple[JoinSpec, Outputs]:
    for side in ("left", "right"):
        param = f"{side}-order-by"
        by = (p.get(param) or "VALUES").strip().upper()
        if by == "TUPLES":
            raise p.error(
                "TUPLES join buffers are not supported (their contents depend on arrival "
                "order); use VALUES with an order-on-field",
                param,
            )
        if by != "VALUES":
            raise p.error(f"must be VALUES, got {by!r}", param)
    left_order = p.field("left-order-on-field", p.require("left-order-on-field"), left, ORDER_TYPES)
    right_order = p.field(
        "right-order-on-field", p.require("right-order-on-field"), right, ORDER_TYPES
    )
    if (left_order.type == "timestamp") != (right_order.type == "timestamp"):
        raise p.error(
            f"field '{right_order.name}' is {right_order.type} but left-order-on-field "
            f"'{left_order.name}' is {left_order.type}; both must be timestamps or both numbers",
            "right-order-on-field",
        )
    order_type = left_order.type
    check_timeout(p)
    left_buffer = p.duration("left-buffer-size", p.require("left-buffer-size"), order_type)
    right_buffer = p.duration("right-buffer-size", p.require("right-buffer-size"), order_type)

    predicate = None
    text = p.get("predicate")
    if text is not None and text.strip():
        predicate = parse_expression(
            text, {"left": left, "right": right}, where=p.where("predicate")
        )
        if predicate.type != "bool":
            raise ExpressionError(
                f"{p.where('predicate')}: a join predicate must be bool, got {predicate.type}"
            )
    out_fields, fields = _join_outputs(p, left, right)
    spec = JoinSpec(
        predicate=predicate,
        left_order_on=left_order.name,
        right_order_on=right_order.name,
        left_buffer=left_buffer,
        right_buffer=right_buffer,
        out_fields=tuple(out_fields),
    )
    return spec, [fields]


def _join_outputs(
    p: BoxParams, left: Schema, right: Schema
) -> tuple[list[tuple[str, str]], list[Field]]:
    sides = {"left": left, "right": right}
    sources = p.indexed("out-field", required=False)
    names = p.names_for("out-field-name", len(sources), "out-field")
    picked: list[tuple[str, Field, str]] = []
    if not sources:
        taken = {f.name.lower() for f in left.fields}
        picked = [("left", f, f.name) for f in left.fields]
        for f in right.fields:
            name = f.name
            while name.lower() in taken:
                name = f"right_{name}"
            taken.add(name.lower())
            picked.append(("right", f, name))
    for i, text in enumerate(sources):
        param = f"out-field.{i}"
        side, dot, fname = text.strip().partition(".")
        if not dot or side.lower() not in sides:
            raise p.error(f"must be 'left.<field>' or 'right.<field>', got {text!r}", param)
        field = p.field(param, fname, sides[side.lower()])
        picked.append((side.lower(), field, names.get(i) or field.name))
    seen: set[str] = set()
    for i, (_, _, name) in enumerate(picked):
        name_param = f"out-field-name.{i}" if sources else None
        check_field_name(name, QueryError, f"{p.where(name_param)}: ")
        if name.lower() in seen:
            raise p.error(f"output field '{name}' is produced twice", name_param)
        seen.add(name.lower())
    out_fields = [(f"{side}.{field.name}", name) for side, field, name in picked]
    return out_fields, [
        Field(name, field.type, nullable=field.nullable) for _, field, name in picked
    ]
