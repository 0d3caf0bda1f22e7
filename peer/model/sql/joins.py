"""A join of two inputs: which conditions filter one side, which bound the join in time, and
the join box they make.

Theory of operation: the ``ON`` and ``WHERE`` conditions are split at ``AND``. A condition
reading one side only becomes a filter box on that side before the join. A condition
comparing a time column of each side, each optionally moved by an ``INTERVAL``
(``a.t >= b.t - INTERVAL '10' SECOND``, ``a.t BETWEEN b.t AND b.t + INTERVAL ...``,
``a.window_start = b.window_start``), bounds ``D = left.t - right.t``: the join box keeps a
left tuple ``max(0, -low)`` and a right tuple ``max(0, high)`` seconds (plus a millisecond,
as its buffers compare strictly), on those two order fields. Every two-sided condition,
bounds included (as microsecond arithmetic), is the join's predicate, so the result is
exactly what the SQL says.

A join whose ``D`` has no lower or no upper bound keeps its tuples forever: it is compiled
with buffers of ten years on the sides' event-time columns, a warning names the unbounded
state, and an aggregate over its result is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from sqlglot import exp

from peer.errors import ExpressionError, SqlError
from peer.model.expr import parse_expression
from peer.model.sql.build import Boxes, Scope, interval_seconds, scope_of
from peer.model.sql.relation import Column, Relation
from peer.model.sql.unbounded import UNBOUNDED_S

EPSILON_S = 0.001  # TIMESTAMP(3): one millisecond past a bound
_US = 1_000_000
_SIDES = ("left", "right")
_SYMBOLS: dict[type[exp.Expr], str] = {
    exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.EQ: "=",
}  # fmt: skip
_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ,
}  # fmt: skip


class Checks(Protocol):
    """What the join needs from the compiler: errors at a node, and expressions checked."""

    text: str
    out: Boxes

    def fail(self, node: exp.Expr | None, reason: str) -> SqlError: ...

    def filter(
        self, relation: Relation, condition: exp.Expr, scope: Scope, hint: str | None
    ) -> Relation: ...

    def screen(self, node: exp.Expr, aggregates_ok: bool = False) -> None: ...


@dataclass(frozen=True)
class _Term:
    side: int
    column: Column
    offset_s: float


class JoinPlan:
    def __init__(
        self,
        checks: Checks,
        left: tuple[Relation, str],
        right: tuple[Relation, str],
        conditions: Sequence[exp.Expr],
    ) -> None:
        self.checks = checks
        self.inputs = (left[0], right[0])
        self.aliases = (left[1] or "left", right[1] or "right")
        if self.aliases[0].lower() == self.aliases[1].lower():
            raise checks.fail(
                conditions[0] if conditions else None,
                "give the sides of the join different aliases",
            )
        self.one_side: tuple[list[exp.Expr], list[exp.Expr]] = ([], [])
        self.both: list[exp.Expr] = []
        for condition in conditions:
            sides = {self.side_of(c) for c in condition.find_all(exp.Column)}
            if len(sides) == 1:
                self.one_side[sides.pop()].append(condition)
            else:
                self.both.append(condition)

    def side_of(self, column: exp.Column) -> int:
        qualifier, name = column.table.lower(), column.name.lower()
        found = [
            i
            for i in (0, 1)
            if (not qualifier or qualifier == self.aliases[i].lower())
            and self.inputs[i].find(name) is not None
        ]
        if len(found) == 1:
            return found[0]
        what = f"{column.table}.{column.name}" if column.table else column.name
        if found:
            raise self.checks.fail(
                column,
                f"column {what} is ambiguous; write {self.aliases[0]}.{column.name} or "
                f"{self.aliases[1]}.{column.name}",
            )
        names = [f"{self.aliases[i]}.{c.name}" for i in (0, 1) for c in self.inputs[i].columns]
        raise self.checks.fail(column, f"unknown column {what} (columns: {', '.join(names)})")

    def filtered(self, side: int, hint: str | None) -> Relation:
        relation = self.inputs[side]
        conditions = self.one_side[side]
        if not conditions:
            return relation
        condition = conditions[0] if len(conditions) == 1 else exp.and_(*conditions)
        scope = scope_of(relation, self.aliases[side])
        return self.checks.filter(relation, condition, scope, hint)

    # -- the join -------------------------------------------------------------------------

    def join(self, left: Relation, right: Relation, hint: str | None) -> tuple[Relation, Scope]:
        inputs = (left, right)
        sides_scope: dict[tuple[str, str], exp.Expr] = {}
        for i, relation in enumerate(inputs):
            for c in relation.columns:
                ref = exp.column(c.name, table=_SIDES[i], quoted=True)
                sides_scope[(self.aliases[i].lower(), c.name.lower())] = ref
                other = inputs[1 - i].find(c.name)
                if other is None:
                    sides_scope[("", c.name.lower())] = ref
        low: float | None = None
        high: float | None = None
        pair: tuple[Column, Column] | None = None
        predicate: list[str] = []
        for condition in self.both:
            bound = self._bound(condition)
            if bound is not None and (pair is None or pair == bound[0]):
                pair = bound[0]
                for op, value in bound[1]:
                    if op in ("<=", "="):
                        high = value if high is None else min(high, value)
                    if op in (">=", "="):
                        low = value if low is None else max(low, value)
                predicate.append(bound[2])
                continue
            predicate.append(self._predicate(condition, sides_scope))
        unbounded = None
        if low is None or high is None or pair is None:
            unbounded = f"the join of {self.aliases[0]} and {self.aliases[1]}"
            pair = (self._time(0, left), self._time(1, right))
            self.checks.out.warnings.append(
                f"{unbounded} has no time bound: it keeps every tuple of both inputs forever "
                "(unbounded state); bound it with a.t BETWEEN b.t - INTERVAL ... AND b.t + "
                "INTERVAL ..."
            )
        left_buffer = UNBOUNDED_S if low is None else max(0.0, -low) + EPSILON_S
        right_buffer = UNBOUNDED_S if high is None else max(0.0, high) + EPSILON_S
        params = {
            "left-order-by": "VALUES", "left-order-on-field": pair[0].name,
            "right-order-by": "VALUES", "right-order-on-field": pair[1].name,
            "left-buffer-size": f"{left_buffer:g}", "right-buffer-size": f"{right_buffer:g}",
        }  # fmt: skip
        if predicate:
            params["predicate"] = " AND ".join(f"({p})" for p in predicate)
        columns: list[Column] = []
        scope: dict[tuple[str, str], exp.Expr] = {}
        taken: set[str] = set()
        for i, relation in enumerate(inputs):
            for c in relation.columns:
                name = c.name
                if name.lower() in taken:
                    name = f"{self.aliases[i]}_{c.name}"
                while name.lower() in taken:
                    name = f"{_SIDES[i]}_{name}"
                taken.add(name.lower())
                n = len(columns)
                params[f"out-field.{n}"] = f"{_SIDES[i]}.{c.name}"
                params[f"out-field-name.{n}"] = name
                columns.append(replace(c, name=name))
                ref = exp.column(name, quoted=True)
                scope[(self.aliases[i].lower(), c.name.lower())] = ref
                if inputs[1 - i].find(c.name) is None:
                    scope[("", c.name.lower())] = ref
                scope.setdefault(("", name.lower()), ref)
        stream = self.checks.out.add("join", [left.stream, right.stream], params, hint)
        reason = unbounded or left.unbounded or right.unbounded
        return Relation(stream, tuple(columns), None, reason), scope

    def _time(self, side: int, relation: Relation) -> Column:
        times = relation.time_columns()
        if not times:
            raise self.checks.fail(
                None,
                f"the join input {self.aliases[side]} has no event-time column to order it by",
            )
        return times[0]

    def _predicate(self, condition: exp.Expr, scope: Scope) -> str:
        """A two-sided condition as join predicate text over ``left.`` and ``right.``."""
        self.checks.screen(condition)
        for n in condition.walk():
            if isinstance(n, exp.Interval):
                raise self.checks.fail(
                    n,
                    "an INTERVAL in a join condition must bound a time column of each side: "
                    "a.t BETWEEN b.t - INTERVAL ... AND b.t + INTERVAL ...",
                )

        def rewrite(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.Column):
                target = scope.get((n.table.lower(), n.name.lower()))
                if target is None:
                    raise self.checks.fail(n, f"unknown or ambiguous column {n.sql()}")
                return target.copy()
            return n

        text = condition.copy().transform(rewrite).sql(dialect="spark", identify=True)
        sides = {"left": self.inputs[0].schema, "right": self.inputs[1].schema}
        try:
            checked = parse_expression(text, sides)
        except ExpressionError as exc:
            raise self.checks.fail(condition, exc.message) from exc
        if checked.type != "bool":
            raise self.checks.fail(
                condition, f"a join condition must be boolean, got {checked.type}"
            )
        return text

    # -- time bounds -------------------------------------------------------------------------

    def _term(self, node: exp.Expr) -> _Term | None:
        offset = 0.0
        if isinstance(node, exp.Paren):
            return self._term(node.this)
        if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
            seconds = interval_seconds(self.checks.text, node.expression)
            offset = seconds if isinstance(node, exp.Add) else -seconds
            node = node.this
        if not isinstance(node, exp.Column):
            return None
        side = self.side_of(node)
        column = self.inputs[side].find(node.name)
        if column is None or column.type != "timestamp":
            return None
        return _Term(side, column, offset)

    def _bound(
        self, condition: exp.Expr
    ) -> tuple[tuple[Column, Column], list[tuple[str, float]], str] | None:
        """For a condition bounding ``left.t - right.t``: the column pair, the bounds as
        (op, seconds) with op one of <=, >=, =, and the condition as predicate text."""
        comparisons: list[tuple[type[exp.Expr], exp.Expr, exp.Expr]] = []
        if isinstance(condition, exp.Between):
            comparisons = [
                (exp.GTE, condition.this, condition.args["low"]),
                (exp.LTE, condition.this, condition.args["high"]),
            ]
        elif type(condition) in (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ):
            comparisons = [(type(condition), condition.this, condition.expression)]
        else:
            return None
        pair: tuple[Column, Column] | None = None
        bounds: list[tuple[str, float]] = []
        texts: list[str] = []
        for op, a, b in comparisons:
            ta, tb = self._term(a), self._term(b)
            if ta is None or tb is None or ta.side == tb.side:
                return None
            if ta.side == 1:  # write it as left op' right
                ta, tb = tb, ta
                op = _FLIPPED[op]
            this_pair = (ta.column, tb.column)
            if pair is not None and pair != this_pair:
                return None
            pair = this_pair
            # left + oa  op  right + ob   <=>   left - right  op  ob - oa
            value = tb.offset_s - ta.offset_s
            symbol = _SYMBOLS[op]
            bounds.append(({">": ">=", "<": "<="}.get(symbol, symbol), value))
            micros = round(value * _US)
            if micros == 0 and ta.offset_s == 0 and tb.offset_s == 0:
                texts.append(f"`left`.`{ta.column.name}` {symbol} `right`.`{tb.column.name}`")
            else:
                texts.append(
                    f"unix_micros(`left`.`{ta.column.name}`) - "
                    f"unix_micros(`right`.`{tb.column.name}`) {symbol} {micros}"
                )
        assert pair is not None
        return pair, bounds, " AND ".join(texts)
