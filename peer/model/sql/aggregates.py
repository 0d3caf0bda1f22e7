"""Window aggregates: ``GROUP BY window_start, window_end, keys`` over a window table
function, or over an earlier window aggregate's start and end, as an aggregate box (then a
filter for ``HAVING`` and a map for the select list).

Theory of operation: the aggregate box windows the time column (``window-size-by VALUES``,
``window-size``, ``advance`` = the slide, ``slack`` = the column's watermark delay) and groups
by the other keys; each distinct aggregate call of the select list and ``HAVING`` becomes one
``aggregate-function.N`` with output ``agg_N``. The map after it reads the box's own fields:
``window_start``, ``window_end``, the keys and ``agg_N``. Grouping an earlier aggregate's rows
by their window (NEXMark q5's maximum per window) windows its start column by one slide: the
earlier windows start at multiples of the slide, so each new window holds exactly one of them,
and its end is the start plus the earlier size (``timestamp_micros(unix_micros(start) +
size)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sqlglot import exp

from peer.errors import SqlError
from peer.model.sql.build import Boxes, Scope, scope_of
from peer.model.sql.relation import Column, Relation, Window

_AGGREGATES: dict[type[exp.Expr], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max",
}  # fmt: skip
_US = 1_000_000


@dataclass(frozen=True)
class Tvf:
    """A window table function's arguments."""

    time: Column
    size_s: float
    slide_s: float


class Checks(Protocol):
    """What a window aggregate needs from the compiler."""

    out: Boxes

    def fail(self, node: exp.Expr | None, reason: str) -> SqlError: ...

    def unknown(self, column: exp.Column, scope: Scope) -> SqlError: ...

    def expression(
        self,
        node: exp.Expr,
        scope: Scope,
        relation: Relation,
        aggregates: Mapping[str, str] | None = None,
    ) -> tuple[str, Any]: ...

    def items(
        self, sel: exp.Select, relation: Relation, scope: Scope
    ) -> list[tuple[str, exp.Expr]]: ...


class WindowAggregate:
    def __init__(self, checks: Checks) -> None:
        self.checks = checks

    def compile(
        self,
        sel: exp.Select,
        relation: Relation,
        alias: str,
        tvf: Tvf | None,
        hint: str | None,
    ) -> Relation:
        group = sel.args["group"]
        if tvf is not None:
            start_name, end_name = "window_start", "window_end"
            order, size, slide = tvf.time.name, tvf.size_s, tvf.slide_s
            slack = tvf.time.delay_s or 0.0
        else:
            window = relation.window
            assert window is not None
            if window.start is None:
                raise self.checks.fail(
                    group, "the windows' start column was dropped; keep it to group"
                )
            start_name, end_name = window.start, window.end or ""
            # windows one slide long, aligned as the first windows were: each holds one
            order, size, slide, slack = window.start, window.slide_s, window.slide_s, window.slide_s
        keys: list[str] = []
        has = {"start": False, "end": False}
        for key in group.expressions:
            if not isinstance(key, exp.Column):
                raise self.checks.fail(key, "GROUP BY takes columns; compute expressions in a view")
            if key.table and key.table.lower() != alias.lower():
                raise self.checks.fail(key, f"unknown qualifier {key.table}")
            if key.name.lower() == start_name.lower():
                has["start"] = True
                continue
            if key.name.lower() == end_name.lower():
                has["end"] = True
                continue
            column = relation.find(key.name)
            if column is None:
                raise self.checks.unknown(key, scope_of(relation, alias))
            if column.name not in keys:
                keys.append(column.name)
        if not has["start"]:
            raise self.checks.fail(
                group,
                f"GROUP BY must name the window: {start_name}, {end_name} (and any keys)",
            )
        calls: dict[str, str] = {}
        params: dict[str, str] = {
            "window-size-by": "VALUES",
            "window-size": f"{size:g}",
            "advance": f"{slide:g}",
            "order-on-field": order,
            "slack": f"{slack:g}",
        }
        if keys:
            params["group-by"] = ", ".join(keys)
        having = sel.args.get("having")
        found = [a for item in sel.expressions for a in item.find_all(exp.AggFunc)]
        if having is not None:
            found += list(having.find_all(exp.AggFunc))
        for call in found:
            text = call.sql()
            if text in calls:
                continue
            index = len(calls)
            calls[text] = f"agg_{index}"
            params[f"aggregate-function.{index}"] = self.aggregate_call(call, relation, alias)
            params[f"aggregate-function-output-name.{index}"] = f"agg_{index}"
        if not calls:  # GROUP BY without aggregates (distinct keys per window)
            params["aggregate-function.0"] = "count()"
            params["aggregate-function-output-name.0"] = "agg_0"
        stream = self.checks.out.add("aggregate", [relation.stream], params, hint)
        columns = [Column("window_start", "timestamp", False, 0.0),
                   Column("window_end", "timestamp", False, 0.0)]  # fmt: skip
        columns += [replace(c, delay_s=None) for k in keys if (c := relation.find(k))]
        # columns for the aggregate's own output fields, typed by the box model
        scope: dict[tuple[str, str], exp.Expr] = {}
        start_ref = exp.column("window_start", quoted=True)
        end_ref: exp.Expr = exp.column("window_end", quoted=True)
        if tvf is None:
            end_ref = exp.func(
                "timestamp_micros",
                exp.Add(
                    this=exp.func("unix_micros", start_ref.copy()),
                    expression=exp.Literal.number(round(relation.window.size_s * _US)),  # type: ignore[union-attr]
                ),
            )
        for qualifier in ("", alias.lower()):
            scope[(qualifier, start_name.lower())] = start_ref
            if end_name:
                scope[(qualifier, end_name.lower())] = end_ref
            for k in keys:
                scope[(qualifier, k.lower())] = exp.column(k, quoted=True)
        typed = [
            *columns,
            *(Column(name, self._call_type(text, relation), True) for text, name in calls.items()),
        ]
        agg_relation = Relation(stream, tuple(typed))
        if having is not None:
            text, checked = self.checks.expression(having.this, scope, agg_relation, calls)
            if checked.type != "bool":
                raise self.checks.fail(having, f"HAVING must be boolean, got {checked.type}")
            stream = self.checks.out.add("filter", [stream], {"expression.0": text}, hint)
            agg_relation = agg_relation.renamed(stream)
        out_params: dict[str, str] = {}
        out_columns: list[Column] = []
        start_out = end_out = None
        for i, (name, node) in enumerate(self.checks.items(sel, agg_relation, scope)):
            text, checked = self.checks.expression(node, scope, agg_relation, calls)
            out_params[f"expression.{i}"] = text
            out_params[f"output-field-name.{i}"] = name
            is_start = isinstance(node, exp.Column) and node.name.lower() == start_name.lower()
            is_end = isinstance(node, exp.Column) and node.name.lower() == end_name.lower()
            start_out = name if is_start else start_out
            end_out = name if is_end else end_out
            delay = 0.0 if is_start or is_end else None
            out_columns.append(Column(name, checked.type, checked.nullable, delay))
        stream = self.checks.out.add("map", [stream], out_params, hint)
        window_size = size if tvf is not None else relation.window.size_s  # type: ignore[union-attr]
        return Relation(stream, tuple(out_columns), Window(window_size, slide, start_out, end_out))

    def aggregate_call(self, call: exp.Expr, relation: Relation, alias: str) -> str:
        function = _AGGREGATES.get(type(call))
        if function is None:
            raise self.checks.fail(
                call,
                f"aggregate {call.sql()[:40]} is not supported (COUNT, COUNT(DISTINCT), SUM, "
                "AVG, MIN, MAX)",
            )
        argument = call.this
        if isinstance(argument, exp.Distinct):
            if function != "count" or len(argument.expressions) != 1:
                raise self.checks.fail(call, "DISTINCT is supported in COUNT(DISTINCT column) only")
            function, argument = "count_distinct", argument.expressions[0]
        if argument is None or isinstance(argument, exp.Star):
            if function != "count":
                raise self.checks.fail(call, f"{function.upper()} needs a column")
            return "count()"
        if not isinstance(argument, exp.Column):
            raise self.checks.fail(
                argument, "aggregates take a column; compute the expression in a view first"
            )
        if argument.table and argument.table.lower() != alias.lower():
            raise self.checks.fail(argument, f"unknown qualifier {argument.table}")
        column = relation.find(argument.name)
        if column is None:
            raise self.checks.unknown(argument, scope_of(relation, alias))
        return f"{function}({column.name})"

    def _call_type(self, text: str, relation: Relation) -> str:
        node: exp.Expr = exp.maybe_parse(text, dialect="spark")
        function = _AGGREGATES.get(type(node))
        if function == "count" or node.find(exp.Distinct) is not None:
            return "long"
        argument = node.this
        column = relation.find(argument.name) if isinstance(argument, exp.Column) else None
        if column is None:
            return "long"
        if function == "avg":
            return "double"
        if function == "sum":
            return "double" if column.type == "double" else "long"
        return column.type
