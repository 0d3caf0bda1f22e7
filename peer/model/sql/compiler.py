"""Compiling one ``SELECT`` (with its subqueries and views) into boxes.

Theory of operation: a query is compiled bottom-up. Every ``FROM`` item becomes a
:class:`~peer.model.sql.relation.Relation` (a source stream, a view compiled in place, a
subquery, or a window table function over one of these); every step on top adds boxes whose
output stream is the next relation:

- ``WHERE`` on one input: a filter box; projections: a map box (``expression.N``,
  ``output-field-name.N``);
- ``TUMBLE``/``HOP`` with ``GROUP BY window_start, window_end, keys``: an aggregate box on
  VALUES windows of the time column (``slack`` is the column's watermark delay), then a
  filter for ``HAVING`` and a map for the select list; a ``GROUP BY`` of an earlier window
  aggregate's start and end: an aggregate whose windows are that aggregate's slide, each
  holding exactly one of its windows;
- a join of two inputs: single-side conditions become filters before it; conditions
  comparing a time column of each side (``=``, ``<``, ``BETWEEN`` with ``± INTERVAL``) bound
  the join's buffers; every two-sided condition is the join's predicate, so the bound is
  exact; the join emits every column of both sides and a map makes the select list;
- ``UNION ALL``: a union box, its inputs mapped to the first one's field names.

Expressions are the box expressions' subset (:mod:`peer.model.expr`): each is screened here
for what the subset refuses, so the error carries the line and column, then rendered as box
expression text and checked by the same parser a JSON query's boxes go through.

What cannot be an append-only stream is refused (:func:`peer.model.sql.dialect.refuse`):
a ``GROUP BY`` without a window, an aggregate over a join without a time bound, ``ORDER BY``,
``LIMIT``, ``DISTINCT``, outer joins and subqueries in expressions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlglot import exp

from peer.errors import ExpressionError, SqlError
from peer.model.expr import FUNCTIONS, parse_expression
from peer.model.sql.aggregates import Tvf, WindowAggregate
from peer.model.sql.build import Boxes, Scope, interval_seconds, scope_of
from peer.model.sql.dialect import refuse
from peer.model.sql.joins import JoinPlan
from peer.model.sql.relation import Column, Relation

# Functions the box expressions take besides FUNCTIONS: their operators spelled as calls.
_CALL_FORMS = frozenset({"case", "cast", "try_cast", "if", "mod"})
# SELECTs compiling one script may take, a view's counted at each use (each reader compiles
# its own copy, and a view is compiled once more where it is declared): a chain of 40 views,
# or views that read one view twice, ten deep, would otherwise cost seconds to hours.
MAX_SELECTS = 1000


class CompileWork:
    """What compiling one script has cost so far, shared by the compilers of its statements;
    SqlError once a script's views expand past :data:`MAX_SELECTS` SELECTs."""

    def __init__(self, limit: int = MAX_SELECTS) -> None:
        self.limit = limit
        self.selects = 0

    def select(self, text: str, node: exp.Expr) -> None:
        self.selects += 1
        if self.selects > self.limit:
            raise refuse(
                text,
                node,
                f"the script's views expand into more than {self.limit} SELECTs to compile "
                "(every reader of a view compiles its own copy); read views of views less "
                "often, or split the script",
                limit="max_sql_selects",
            )


def _allowed_call(node: exp.Expr) -> bool:
    """Whether a call is one box expressions take, to point at a refused one by its line and
    column; peer.model.expr checks the whole expression again and stays the authority."""
    if isinstance(node, exp.Binary | exp.Unary | exp.Connector | exp.Predicate):
        return True  # operators (sqlglot types some as functions)
    if isinstance(node, exp.Anonymous):
        name = str(node.name)
    elif isinstance(node, exp.Func):
        name = node.sql_name()
    else:
        return True
    return name.lower() in FUNCTIONS or name.lower() in _CALL_FORMS


class Compiler:
    """Compiles queries of one script against its streams and views."""

    def __init__(
        self,
        text: str,
        boxes: Boxes,
        streams: Mapping[str, Relation],
        views: Mapping[str, exp.Expr],
        work: CompileWork | None = None,
    ) -> None:
        self.text = text
        self.out = boxes
        self.work = work or CompileWork()
        self.streams = {k.lower(): v for k, v in streams.items()}
        self.views = {k.lower(): v for k, v in views.items()}
        self._compiling: list[str] = []

    def fail(self, node: exp.Expr | None, reason: str) -> SqlError:
        return refuse(self.text, node, reason)

    # -- queries ---------------------------------------------------------------------------

    def query(self, node: exp.Expr, hint: str | None = None) -> Relation:
        if isinstance(node, exp.Subquery):
            return self.query(node.this, hint)
        if isinstance(node, exp.Union) and not isinstance(node, exp.Intersect | exp.Except):
            return self.union(node, hint)
        if isinstance(node, exp.Select):
            return self.select(node, hint)
        raise self.fail(node, f"expected a SELECT, got {node.key.upper()}")

    def union(self, node: exp.Union, hint: str | None) -> Relation:
        if node.args.get("distinct"):
            raise self.fail(
                node,
                "UNION (distinct) must remember every row forever to drop duplicates; "
                "write UNION ALL",
            )
        first = self.query(node.this, hint)
        second = self.query(node.expression, hint)
        if [c.type for c in first.columns] != [c.type for c in second.columns]:
            raise self.fail(
                node.expression,
                "the inputs of UNION ALL differ in their column types: "
                f"{[c.type for c in first.columns]} and {[c.type for c in second.columns]}",
            )
        if [c.name for c in first.columns] != [c.name for c in second.columns]:
            params = {}
            for i, (a, b) in enumerate(zip(first.columns, second.columns, strict=True)):
                params[f"expression.{i}"] = f"`{b.name}`"
                params[f"output-field-name.{i}"] = a.name
            second = second.renamed(self.out.add("map", [second.stream], params, hint))
        stream = self.out.add("union", [first.stream, second.stream], {}, hint)
        unbounded = first.unbounded or second.unbounded
        columns = tuple(
            replace(a, nullable=a.nullable or b.nullable)
            for a, b in zip(first.columns, second.columns, strict=True)
        )
        return Relation(stream, columns, None, unbounded)

    def select(self, sel: exp.Select, hint: str | None) -> Relation:
        self.work.select(self.text, sel)
        self._refuse_modifiers(sel)
        hint = self._hint(sel) or hint
        from_ = sel.args.get("from_") or sel.args.get("from")
        if from_ is None:
            raise self.fail(sel, "a SELECT needs a FROM: a stream, a view or a subquery")
        group = sel.args.get("group")
        having = sel.args.get("having")
        where = sel.args.get("where")
        aggregates = [a for item in sel.expressions for a in item.find_all(exp.AggFunc)]
        if sel.args.get("joins"):
            relation, scope = self.join(sel, from_.this, sel.args["joins"], where, hint)
            culprit = group or (aggregates[0] if aggregates else having)
            if culprit is not None:
                raise self._unwindowed(culprit, relation)
            return self.project(sel, relation, scope, hint)
        relation, alias, tvf = self.from_item(from_.this, hint)
        scope = scope_of(relation, alias)
        if where is not None:
            relation = self.filter(relation, where.this, scope, hint)
        if tvf is not None:
            if group is None:
                raise self.fail(
                    from_.this,
                    "a window table function needs GROUP BY window_start, window_end (and "
                    "keys) with aggregates: fedstream emits one row per window and group",
                )
            return WindowAggregate(self).compile(sel, relation, alias, tvf, hint)
        if group is not None:
            if relation.window is not None and relation.unbounded is None:
                return WindowAggregate(self).compile(sel, relation, alias, None, hint)
            raise self._unwindowed(group, relation)
        if aggregates:
            raise self._unwindowed(aggregates[0], relation)
        if having is not None:
            raise self._unwindowed(having, relation)
        return self.project(sel, relation, scope, hint)

    def _unwindowed(self, node: exp.Expr, relation: Relation) -> SqlError:
        if relation.unbounded is not None:
            return self.fail(
                node,
                f"an aggregate over {relation.unbounded} would change its results forever "
                "(every new tuple may join any old one); bound the join in time (a.t BETWEEN "
                "b.t - INTERVAL ... AND b.t + INTERVAL ...) and aggregate over TUMBLE or HOP "
                "windows of its result",
            )
        return self.fail(
            node,
            "GROUP BY without a window would update its results forever, which an "
            "append-only stream cannot; aggregate over a window table function: FROM "
            "TABLE(TUMBLE(TABLE s, DESCRIPTOR(t), INTERVAL '10' SECOND)) GROUP BY "
            "window_start, window_end, ...",
        )

    def _refuse_modifiers(self, sel: exp.Select) -> None:
        for item in sel.expressions:
            over = item.find(exp.Window)
            if over is not None:
                raise self.fail(
                    over, "OVER windows are not supported; aggregate over TUMBLE or HOP windows"
                )
        if sel.args.get("order") is not None:
            raise self.fail(
                sel.args["order"],
                "ORDER BY without a window: a stream never ends, so it cannot be sorted; drop "
                "it (a window aggregate emits each window once, in window order)",
            )
        for key in ("limit", "offset"):
            if sel.args.get(key) is not None:
                raise self.fail(
                    sel.args[key],
                    f"{key.upper()} has no meaning on a stream that never ends; drop it",
                )
        if sel.args.get("distinct") is not None:
            raise self.fail(
                sel.args["distinct"],
                "SELECT DISTINCT must remember every row forever; write GROUP BY over a "
                "TUMBLE or HOP window instead",
            )
        if sel.args.get("with_") is not None or sel.args.get("with") is not None:
            raise self.fail(
                sel, "WITH (common table expressions) is not supported: write CREATE VIEW"
            )
        for key in ("laterals", "pivots", "windows", "qualify", "cluster", "distribute", "sort"):
            if sel.args.get(key):
                raise self.fail(sel, f"{key.upper()} is not supported in a streaming query")

    def _hint(self, sel: exp.Select) -> str | None:
        hint = sel.args.get("hint")
        if hint is None:
            return None
        node: str | None = None
        for option in hint.expressions:
            if not (isinstance(option, exp.Anonymous) and option.name.upper() == "OPTIONS"):
                raise self.fail(
                    option, "the only hint is /*+ OPTIONS('node' = 'peer') */ (where it runs)"
                )
            for pair in option.expressions:
                if not (
                    isinstance(pair, exp.EQ)
                    and isinstance(pair.this, exp.Literal)
                    and isinstance(pair.expression, exp.Literal)
                    and pair.this.name.lower() == "node"
                ):
                    raise self.fail(pair, "OPTIONS takes 'node' = 'a peer or participant'")
                node = pair.expression.name
        return node

    # -- FROM ------------------------------------------------------------------------------

    def from_item(self, item: exp.Expr, hint: str | None) -> tuple[Relation, str, Tvf | None]:
        alias = item.alias if isinstance(item, exp.Table | exp.Subquery) else ""
        if isinstance(item, exp.Subquery):
            return self.query(item.this, hint), alias, None
        if isinstance(item, exp.Table) and isinstance(item.this, exp.Identifier):
            if item.args.get("db") or item.args.get("catalog"):
                raise self.fail(item, "catalogs and databases are not supported: name a stream")
            return self.named(item, hint), alias or item.name, None
        if isinstance(item, exp.Table) and isinstance(item.this, exp.Anonymous):
            call = item.this
            if call.name.upper() == "TABLE" and len(call.expressions) == 1:
                call = call.expressions[0]
            if isinstance(call, exp.Anonymous) and call.name.upper() in ("TUMBLE", "HOP"):
                relation, tvf = self.window_function(call, hint)
                return relation, alias, tvf
            raise self.fail(
                item,
                f"table function {call.sql()[:40]} is not supported (TUMBLE and HOP are)",
            )
        raise self.fail(item, f"{item.sql()[:40]} is not a stream, a view or a subquery")

    def named(self, table: exp.Table, hint: str | None) -> Relation:
        name = table.name.lower()
        view = self.views.get(name)
        if view is not None:
            if name in self._compiling:
                raise self.fail(table, f"view {table.name} refers to itself")
            self._compiling.append(name)
            try:
                return self.query(view, hint)
            finally:
                self._compiling.pop()
        relation = self.streams.get(name)
        if relation is None:
            known = ", ".join(sorted(self.streams) + sorted(self.views)) or "none"
            raise self.fail(
                table,
                f"unknown stream or view {table.name} (known: {known}); declare it with "
                "CREATE STREAM",
            )
        return relation

    def window_function(self, call: exp.Anonymous, hint: str | None) -> tuple[Relation, Tvf]:
        kind = call.name.upper()
        args = list(call.expressions)
        wanted = 3 if kind == "TUMBLE" else 4
        if len(args) != wanted:
            shape = (
                "TUMBLE(TABLE s, DESCRIPTOR(t), size)"
                if kind == "TUMBLE"
                else "HOP(TABLE s, DESCRIPTOR(t), slide, size)"
            )
            raise self.fail(call, f"{kind} takes {wanted} arguments: {shape}")
        source, descriptor = args[0], args[1]
        if not isinstance(source, exp.Table):
            raise self.fail(source, f"the first argument of {kind} is TABLE stream")
        relation = self.named(source, hint)
        if not (
            isinstance(descriptor, exp.Anonymous)
            and descriptor.name.upper() == "DESCRIPTOR"
            and len(descriptor.expressions) == 1
            and isinstance(descriptor.expressions[0], exp.Column)
        ):
            raise self.fail(descriptor, f"the second argument of {kind} is DESCRIPTOR(column)")
        time = relation.find(descriptor.expressions[0].name)
        if time is None or time.delay_s is None:
            times = ", ".join(c.name for c in relation.time_columns()) or "none"
            raise self.fail(
                descriptor,
                f"{descriptor.expressions[0].name} is not an event-time column of "
                f"{relation.stream} (time columns: {times})",
            )
        if relation.unbounded is not None:
            raise self._unwindowed(call, relation)
        if kind == "TUMBLE":
            size = slide = interval_seconds(self.text, args[2])
        else:
            slide = interval_seconds(self.text, args[2])
            size = interval_seconds(self.text, args[3])
            if slide > size:
                raise self.fail(args[2], "HOP's slide must not exceed its size")
        return relation, Tvf(time, size, slide)

    # -- per-tuple boxes ----------------------------------------------------------------------

    def filter(
        self, relation: Relation, condition: exp.Expr, scope: Scope, hint: str | None
    ) -> Relation:
        text, checked = self.expression(condition, scope, relation)
        if checked.type != "bool":
            raise self.fail(condition, f"a condition must be boolean, got {checked.type}")
        stream = self.out.add("filter", [relation.stream], {"expression.0": text}, hint)
        return relation.renamed(stream)

    def project(
        self, sel: exp.Select, relation: Relation, scope: Scope, hint: str | None
    ) -> Relation:
        items = self.items(sel, relation, scope)
        params: dict[str, str] = {}
        columns = []
        window = relation.window
        starts = {window.start, window.end} if window is not None else set()
        kept: dict[str | None, str] = {}
        for i, (name, node) in enumerate(items):
            text, checked = self.expression(node, scope, relation)
            params[f"expression.{i}"] = text
            params[f"output-field-name.{i}"] = name
            source = relation.find(node.name) if isinstance(node, exp.Column) else None
            delay = source.delay_s if source is not None else None
            if source is not None and source.name in starts:
                kept[source.name] = name
            columns.append(Column(name, checked.type, checked.nullable, delay))
        if window is not None:
            window = replace(window, start=kept.get(window.start), end=kept.get(window.end))
        stream = self.out.add("map", [relation.stream], params, hint)
        return Relation(stream, tuple(columns), window, relation.unbounded)

    def items(
        self, sel: exp.Select, relation: Relation, scope: Scope
    ) -> list[tuple[str, exp.Expr]]:
        """The select list as (output name, expression), ``*`` expanded."""
        items: list[tuple[str, exp.Expr]] = []
        seen: set[str] = set()
        for i, item in enumerate(sel.expressions):
            found: list[tuple[str, exp.Expr]] = []
            if isinstance(item, exp.Star):
                found = [(c.name, exp.column(c.name, quoted=True)) for c in relation.columns]
            elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                qualifier = item.table.lower()
                found = [
                    (target.name, target)
                    for (q, _), target in scope.items()
                    if q == qualifier and isinstance(target, exp.Column)
                ]
                if not found:
                    raise self.fail(item, f"unknown qualifier {item.table}")
            else:
                node = item.this if isinstance(item, exp.Alias) else item
                name = item.alias if isinstance(item, exp.Alias) else ""
                if not name and isinstance(node, exp.Column):
                    name = node.name
                found = [(name or f"expr_{i}", node)]
            for name, node in found:
                if name.lower() in seen:
                    raise self.fail(item, f"the select list names {name} twice; rename one with AS")
                seen.add(name.lower())
                items.append((name, node))
        return items

    # -- expressions ------------------------------------------------------------------------

    def expression(
        self,
        node: exp.Expr,
        scope: Scope,
        relation: Relation,
        aggregates: Mapping[str, str] | None = None,
    ) -> tuple[str, Any]:
        """``node`` as box expression text over ``relation`` and its checked form."""
        self.screen(node, aggregates is not None)
        copy = node.copy()

        def rewrite(n: exp.Expr) -> exp.Expr:
            if isinstance(n, exp.AggFunc) and aggregates is not None:
                return exp.column(aggregates[n.sql()], quoted=True)
            if isinstance(n, exp.Column):
                key = (n.table.lower(), n.name.lower())
                target = scope.get(key)
                if target is None:
                    raise self.unknown(n, scope)
                return target.copy()
            return n

        text = copy.transform(rewrite).sql(dialect="spark", identify=True)
        try:
            checked = parse_expression(text, relation.schema)
        except ExpressionError as exc:
            raise self.fail(node, exc.message) from exc
        return text, checked

    def unknown(self, column: exp.Column, scope: Scope) -> SqlError:
        names = sorted({name for qualifier, name in scope if not qualifier})
        what = f"{column.table}.{column.name}" if column.table else column.name
        return self.fail(column, f"unknown column {what} (columns: {', '.join(names)})")

    def screen(self, node: exp.Expr, aggregates_ok: bool = False) -> None:
        """Refuse, at its line and column, what box expressions cannot hold."""
        for n in node.walk():
            if isinstance(n, exp.Subquery | exp.Select | exp.Exists | exp.Union):
                raise self.fail(
                    n,
                    "a subquery inside an expression is not supported; write a join (bounded "
                    "in time) or a view",
                )
            if isinstance(n, exp.Window):
                raise self.fail(
                    n, "OVER windows are not supported; aggregate over TUMBLE or HOP windows"
                )
            if isinstance(n, exp.AggFunc):
                if not aggregates_ok:
                    raise self.fail(n, f"aggregate {n.sql()} needs a GROUP BY over a window")
                continue
            if isinstance(n, exp.Interval):
                raise self.fail(
                    n,
                    "an INTERVAL may appear only in TUMBLE, HOP and a join's time bound "
                    "(a.t BETWEEN b.t - INTERVAL ... AND b.t + INTERVAL ...)",
                )
            if isinstance(n, exp.Func | exp.Anonymous) and not _allowed_call(n):
                if n.find_ancestor(exp.AggFunc) is not None and aggregates_ok:
                    continue
                name = n.name if isinstance(n, exp.Anonymous) else n.sql_name()
                raise self.fail(
                    n,
                    f"function {name.lower()} is not allowed: user-defined functions, reflect "
                    f"and java_method never run; the functions are {', '.join(FUNCTIONS)}",
                )

    # -- joins ------------------------------------------------------------------------------

    def join(
        self,
        sel: exp.Select,
        first: exp.Expr,
        joins: list[exp.Join],
        where: exp.Where | None,
        hint: str | None,
    ) -> tuple[Relation, Scope]:
        if len(joins) > 1:
            raise self.fail(joins[1], "join two inputs at a time; join the others in a view")
        j = joins[0]
        side = (j.args.get("side") or "").upper()
        kind = (j.args.get("kind") or "").upper()
        if side or kind not in ("", "INNER", "CROSS"):
            raise self.fail(
                j,
                f"{(side + ' ' + kind).strip()} JOIN is not supported: only inner joins make "
                "an append-only stream",
            )
        if j.args.get("using"):
            raise self.fail(j, "JOIN ... USING is not supported; write ON a.x = b.x")
        left, left_alias, left_tvf = self.from_item(first, hint)
        right, right_alias, right_tvf = self.from_item(j.this, hint)
        for tvf, item in ((left_tvf, first), (right_tvf, j.this)):
            if tvf is not None:
                raise self.fail(
                    item,
                    "aggregate each side in a subquery (FROM (SELECT ... GROUP BY window_start, "
                    "window_end, ...) a JOIN (...) b) before joining windows",
                )
        conditions: list[exp.Expr] = []
        for node in (j.args.get("on"), where.this if where is not None else None):
            if node is not None:
                conditions.extend(node.flatten() if isinstance(node, exp.And) else [node])
        plan = JoinPlan(self, (left, left_alias), (right, right_alias), conditions)
        left = plan.filtered(0, hint)
        right = plan.filtered(1, hint)
        return plan.join(left, right, hint)
