"""Box expressions: a small SQL subset, parsed by sqlglot, checked, and rendered as Spark SQL.

Theory of operation: the text is bounded (4 KiB, 1,024 tokens, 32 levels of parentheses) before
sqlglot sees it, because sqlglot's recursive-descent parser spends about sixteen Python frames
per nesting level. sqlglot parses it with the Spark dialect, so literals and escapes mean what
Spark will make of them. The tree is then walked once: every node must belong to the subset
below, every column must resolve in the scope, and every operator must type-check; the walk
rewrites columns to their backquoted canonical names and fractional literals to doubles
(Spark would read ``1.5`` as a DECIMAL). Anything else raises :class:`ExpressionError` whose
message starts with the caller's ``where`` and names the offending thing; hostile text can
raise nothing else.

The subset:
- column references (``x``; ``left.x`` / ``right.y`` in join predicates), literals (integers,
  decimals, 'strings', true/false, NULL), parentheses;
- ``= == != <> < <= > >= <=>``, ``AND OR NOT``, ``+ - * / %`` and unary minus,
  ``CASE``, ``IN (list)``, ``BETWEEN``, ``IS [NOT] NULL``, ``[NOT] LIKE``/``ILIKE``,
  ``CAST(x AS int|bigint|double|boolean|string|timestamp)``;
- the functions in :data:`FUNCTIONS`, all deterministic and free of side effects.

Types follow Spark: numeric types widen int < long < double; ``/``, sqrt, exp, ln, log, pow are
double; floor/ceil are long; length is int; comparisons need two numeric operands or two of the
same type; NULL takes any type. ``Expr.nullable``: the value may be NULL (SQL semantics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from peer.errors import ExpressionError
from peer.model.schema import NUMERIC_TYPES, TYPES, Field, Schema

MAX_TEXT = 4096
MAX_TOKENS = 1024
MAX_PAREN_DEPTH = 32
MAX_TREE_DEPTH = 256
MAX_NODES = 2048

FUNCTIONS = (
    "abs", "round", "floor", "ceil", "sqrt", "exp", "ln", "log", "log10", "pow", "power",
    "greatest", "least", "coalesce", "nvl", "ifnull", "if", "lower", "upper", "length", "trim",
    "ltrim", "rtrim", "substring", "substr", "concat", "unix_seconds", "unix_millis",
    "unix_micros", "timestamp_seconds", "timestamp_millis", "timestamp_micros",
)  # fmt: skip

_DIALECT = sqlglot.Dialect.get_or_raise("spark")
_checking: ContextVar[bool] = ContextVar("checking_expression", default=False)


class _QuietWhileChecking(logging.Filter):
    """sqlglot logs warnings quoting the input when it meets syntax it does not support (it
    falls back to an opaque Command, or an invalid JSON path). Our errors already say what is
    wrong; left alone, hostile expressions would write themselves into the peer's log. Only
    records emitted while this module is checking an expression are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _checking.get()


logging.getLogger("sqlglot").addFilter(_QuietWhileChecking())

_RANK = {"int": 0, "long": 1, "double": 2}
_NULL = "null"
_CAST_TYPES = {
    exp.DataType.Type.INT: "int",
    exp.DataType.Type.BIGINT: "long",
    exp.DataType.Type.DOUBLE: "double",
    exp.DataType.Type.BOOLEAN: "bool",
    exp.DataType.Type.TEXT: "string",
    exp.DataType.Type.VARCHAR: "string",
    exp.DataType.Type.TIMESTAMP: "timestamp",
    exp.DataType.Type.TIMESTAMPTZ: "timestamp",  # Spark's TIMESTAMP '...' literal
}
_CASTS_FROM = {  # target type -> source types Spark casts without complaint
    **dict.fromkeys(("int", "long", "double", "string"), frozenset(TYPES)),
    "bool": frozenset(TYPES) - {"timestamp"},
    "timestamp": frozenset({"string", "timestamp"}),
}
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Mod)
_MATH = (exp.Abs, exp.Floor, exp.Ceil, exp.Sqrt, exp.Exp, exp.Ln, exp.Log, exp.Pow)


@dataclass(frozen=True)
class Expr:
    text: str
    sql: str
    type: str
    columns: frozenset[str]
    nullable: bool = False  # may be NULL: reads a nullable column, has NULL or CASE sans ELSE


Scope = Schema | Mapping[str, Schema]


def parse_expression(text: str, scope: Scope, *, where: str = "") -> Expr:
    """Parse, check and type ``text`` against ``scope``; raise only ExpressionError."""
    token = _checking.set(True)
    try:
        return _parse_expression(text, scope, where)
    finally:
        _checking.reset(token)


def _parse_expression(text: str, scope: Scope, where: str) -> Expr:
    prefix = f"{where}: " if where else ""
    if not isinstance(text, str):
        raise ExpressionError(f"{prefix}expression must be text, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise ExpressionError(f"{prefix}expression is longer than {MAX_TEXT} characters")
    if not text.strip():
        raise ExpressionError(f"{prefix}expression is empty")
    tree = _parse(text, prefix)
    nodes = list(tree.walk())
    # The checker rewrites nodes in place; a holder gives even the root a parent to be
    # replaced in.
    holder = exp.Paren(this=tree)
    checker = _Checker(scope, prefix)
    try:
        type_ = checker.check(tree)
        checker.check_all_visited(nodes)
        sql = holder.this.sql(dialect=_DIALECT, identify=True, comments=False)
    except ExpressionError:
        raise
    except Exception as exc:  # sqlglot's generator on a tree it built itself; see _parse.
        raise ExpressionError(
            f"{prefix}expression cannot be rendered ({type(exc).__name__})"
        ) from exc
    if type_ == _NULL:
        raise ExpressionError(f"{prefix}expression has no type; write CAST(NULL AS <type>)")
    return Expr(text, sql, type_, frozenset(checker.columns), checker.nullable)


def with_columns(expr: Expr, names: Mapping[str, str]) -> str:
    """``expr.sql`` with each column (keyed as in ``expr.columns``) renamed to ``names[key]``,
    for an engine that renames columns before evaluating, e.g. the two sides of a join."""
    tree = sqlglot.parse_one(expr.sql, read=_DIALECT)

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            key = f"{node.table}.{node.name}" if node.table else node.name
            return exp.column(names[key], quoted=True)
        return node

    return tree.transform(rename).sql(dialect=_DIALECT, identify=True, comments=False)


def _parse(text: str, prefix: str) -> exp.Expr:
    # sqlglot is a parser, not a validator: on malformed input it has raised ValueError,
    # KeyError, IndexError, RecursionError and others besides its own errors. Our contract is
    # ExpressionError only, so everything it raises is translated here.
    try:
        tokens = _DIALECT.tokenize(text)
    except Exception as exc:
        raise ExpressionError(f"{prefix}expression does not parse: {_reason(exc)}") from exc
    if len(tokens) > MAX_TOKENS:
        raise ExpressionError(f"{prefix}expression has more than {MAX_TOKENS} tokens")
    _refuse_hints(text, tokens, prefix)
    depth = 0
    for token in tokens:
        if token.token_type == sqlglot.TokenType.L_PAREN:
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                raise ExpressionError(
                    f"{prefix}expression nests parentheses deeper than {MAX_PAREN_DEPTH}"
                )
        elif token.token_type == sqlglot.TokenType.R_PAREN:
            depth -= 1
    try:
        trees = _DIALECT.parser().parse(tokens, text)
    except RecursionError as exc:
        raise ExpressionError(f"{prefix}expression is nested too deeply") from exc
    except Exception as exc:
        raise ExpressionError(f"{prefix}expression does not parse: {_reason(exc)}") from exc
    statements = [t for t in trees if t is not None]
    if len(statements) != 1:
        if not statements:
            raise ExpressionError(f"{prefix}expression is empty")
        raise ExpressionError(f"{prefix}multiple statements are not allowed (found ';')")
    tree = statements[0]
    _check_size(tree, prefix)
    return tree


def _refuse_hints(text: str, tokens: list[sqlglot.Token], prefix: str) -> None:
    # The tokenizer keeps a comment's text but drops the '+' that makes it a Spark hint, so
    # look for the marker in the source with string literals blanked out.
    if "/*+" not in text:
        return
    chars = list(text)
    for token in tokens:
        if token.token_type == sqlglot.TokenType.STRING:
            chars[token.start : token.end + 1] = " " * (token.end + 1 - token.start)
    if "/*+" in "".join(chars):
        raise ExpressionError(f"{prefix}optimizer hints (/*+ ... */) are not allowed")


def _check_size(tree: exp.Expr, prefix: str) -> None:
    stack = [(tree, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_TREE_DEPTH or count > MAX_NODES:
            raise ExpressionError(f"{prefix}expression is too large or nested too deeply")
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def _reason(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        where = f"line {first.get('line')}, column {first.get('col')}: " if "line" in first else ""
        return f"{where}{first.get('description')}"
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return message[:200]


def _snippet(node: exp.Expr) -> str:
    try:
        text = node.sql(dialect=_DIALECT)
    except Exception:
        text = node.key
    return text if len(text) <= 60 else text[:57] + "..."


def _fname(node: exp.Expr) -> str:
    return (node.sql_name() if isinstance(node, exp.Func) else node.key).lower()


def _widen(a: str, b: str) -> str | None:
    """The common type of two operands, or None when they do not mix."""
    if a == _NULL:
        return b
    if b == _NULL or a == b:
        return a
    if a in NUMERIC_TYPES and b in NUMERIC_TYPES:
        return a if _RANK[a] > _RANK[b] else b
    return None


class _Checker:
    def __init__(self, scope: Scope, prefix: str) -> None:
        self.prefix = prefix
        self.columns: set[str] = set()
        self.nullable = False
        self.visited: set[int] = set()
        self.sides: dict[str, Schema] = {} if isinstance(scope, Schema) else dict(scope)
        self.schema = scope if isinstance(scope, Schema) else None

    def fail(self, message: str) -> ExpressionError:
        return ExpressionError(f"{self.prefix}{message}")

    def check(self, node: exp.Expr) -> str:
        handler = _HANDLERS.get(type(node))
        if handler is None:
            raise self.fail(self._refusal(node))
        for key in _FORBIDDEN_ARGS.get(type(node), ()):
            if node.args.get(key) not in (None, False, []):
                raise self.fail(f"'{_snippet(node)}' uses {key}, which is not allowed")
        self.visited.add(id(node))
        return handler(self, node)

    def check_all_visited(self, nodes: list[exp.Expr]) -> None:
        """Refuse any node no check looked at, so a sqlglot argument we did not foresee
        cannot smuggle a subtree past the allow-list."""
        for node in nodes:
            if id(node) in self.visited:
                continue
            parent = node.parent
            if isinstance(node, exp.Identifier) and isinstance(parent, exp.Column):
                continue
            if isinstance(node, exp.DataType) and isinstance(parent, exp.Cast):
                continue
            raise self.fail(f"'{_snippet(node)}' ({node.key}) is not allowed here")

    def _refusal(self, node: exp.Expr) -> str:
        if isinstance(node, exp.Window):
            return f"window function (OVER) is not allowed: '{_snippet(node)}'"
        if isinstance(node, exp.AggFunc):
            return f"aggregate function '{_fname(node)}' is not allowed in an expression"
        if isinstance(node, exp.Query | exp.Subquery | exp.Exists):
            return f"subquery is not allowed: '{_snippet(node)}'"
        if isinstance(node, exp.Lambda):
            return f"lambda is not allowed: '{_snippet(node)}'"
        if isinstance(node, exp.Star):
            return "'*' is not allowed"
        if isinstance(node, exp.Placeholder | exp.Parameter | exp.SessionParameter):
            return f"parameter or placeholder '{_snippet(node)}' is not allowed"
        if isinstance(node, exp.Alias):
            return f"alias is not allowed: '{_snippet(node)}'"
        if isinstance(node, exp.Anonymous | exp.Func):
            name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            return f"function '{name.lower()}' is not allowed (functions: {', '.join(FUNCTIONS)})"
        return f"'{_snippet(node)}' ({node.key}) is not allowed"

    def operands(self, node: exp.Expr, *keys: str) -> list[str]:
        return [self.check(node.args[k]) for k in keys]

    def need(
        self, type_: str, allowed: set[str] | frozenset[str], node: exp.Expr, what: str
    ) -> None:
        if type_ != _NULL and type_ not in allowed:
            raise self.fail(
                f"{what} needs {' or '.join(sorted(allowed))}, got {type_} in '{_snippet(node)}'"
            )

    def comparable(self, a: str, b: str, node: exp.Expr) -> None:
        if _widen(a, b) is None:
            raise self.fail(f"cannot compare {a} with {b} in '{_snippet(node)}'")

    def unify(self, types: list[str], node: exp.Expr) -> str:
        result = _NULL
        for t in types:
            widened = _widen(result, t)
            if widened is None:
                raise self.fail(f"branches mix {result} and {t} in '{_snippet(node)}'")
            result = widened
        return result

    # -- leaves ----------------------------------------------------------------------------

    def column(self, node: exp.Column) -> str:
        if node.args.get("db") or node.args.get("catalog") or isinstance(node.this, exp.Star):
            raise self.fail(f"column reference '{_snippet(node)}' is not allowed")
        name, qualifier = node.name, node.table
        if self.schema is not None:
            if qualifier:
                raise self.fail(f"qualified column '{qualifier}.{name}' is not allowed here")
            field, side = self._lookup(self.schema, name), ""
        elif qualifier:
            side = next((s for s in self.sides if s.lower() == qualifier.lower()), "")
            if not side:
                raise self.fail(
                    f"unknown qualifier '{qualifier}' in '{qualifier}.{name}' "
                    f"(qualifiers: {', '.join(self.sides)})"
                )
            field = self._lookup(self.sides[side], name, side)
        else:
            found = [(s, f) for s, sch in self.sides.items() if (f := _find(sch, name))]
            if len(found) > 1:
                raise self.fail(
                    f"column '{name}' is ambiguous; write "
                    + " or ".join(f"{s}.{name}" for s, _ in found)
                )
            if not found:
                raise self.fail(f"unknown column '{name}' (columns: {self._available()})")
            side, field = found[0]
        key = f"{side}.{field.name}" if side else field.name
        self.columns.add(key)
        self.nullable = self.nullable or field.nullable
        node.replace(exp.column(field.name, table=side or None, quoted=True))
        return field.type

    def _lookup(self, schema: Schema, name: str, side: str = "") -> Field:
        field = _find(schema, name)
        if field is None:
            raise self.fail(
                f"unknown column '{side + '.' if side else ''}{name}' "
                f"(columns: {self._available()})"
            )
        return field

    def _available(self) -> str:
        if self.schema is not None:
            return ", ".join(self.schema.names)
        return ", ".join(f"{s}.{n}" for s, sch in self.sides.items() for n in sch.names)

    def literal(self, node: exp.Literal) -> str:
        if node.is_string:
            return "string"
        text = node.this
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is not None:
            if -(2**31) <= value < 2**31:
                return "int"
            if -(2**63) <= value < 2**63:
                return "long"
            raise self.fail(f"integer literal {text} is out of range for long")
        try:
            number = float(text)
        except ValueError:
            raise self.fail(f"number literal '{text}' does not parse") from None
        if number in (float("inf"), float("-inf")):
            raise self.fail(f"number literal '{text}' is out of range for double")
        # Inside a CAST the decimal is converted anyway, and leaving it keeps rendering stable.
        if not isinstance(node.parent, exp.Cast | exp.TryCast):
            node.replace(exp.cast(exp.Literal.number(text), exp.DataType.Type.DOUBLE))
        return "double"

    # -- operators -------------------------------------------------------------------------

    def compare(self, node: exp.Expr) -> str:
        a, b = self.operands(node, "this", "expression")
        self.comparable(a, b, node)
        return "bool"

    def logic(self, node: exp.Expr) -> str:
        for t in self.operands(node, *(k for k in ("this", "expression") if k in node.args)):
            self.need(t, {"bool"}, node, node.key.upper())
        return "bool"

    def arithmetic(self, node: exp.Expr) -> str:
        a, b = self.operands(node, "this", "expression")
        self.need(a, NUMERIC_TYPES, node, "arithmetic")
        self.need(b, NUMERIC_TYPES, node, "arithmetic")
        if isinstance(node, exp.Div):
            return "double"
        widened = _widen(a, b)
        return "int" if widened in (None, _NULL) else widened

    def negate(self, node: exp.Neg) -> str:
        (t,) = self.operands(node, "this")
        self.need(t, NUMERIC_TYPES, node, "unary minus")
        return t

    def paren(self, node: exp.Paren) -> str:
        return self.check(node.this)

    def case(self, node: exp.Case) -> str:
        subject = self.check(node.this) if node.this is not None else None
        results = []
        for branch in node.args.get("ifs") or []:
            if not isinstance(branch, exp.If) or branch.args.get("false") is not None:
                raise self.fail(f"malformed CASE in '{_snippet(node)}'")
            self.visited.add(id(branch))
            condition = self.check(branch.this)
            if subject is None:
                self.need(condition, {"bool"}, branch, "WHEN")
            else:
                self.comparable(subject, condition, branch)
            results.append(self.check(branch.args["true"]))
        if node.args.get("default") is not None:
            results.append(self.check(node.args["default"]))
        self.nullable |= node.args.get("default") is None
        return self.unify(results, node)

    def if_(self, node: exp.If) -> str:
        if node.args.get("false") is None:
            raise self.fail(f"if() needs three arguments in '{_snippet(node)}'")
        condition, a, b = self.operands(node, "this", "true", "false")
        self.need(condition, {"bool"}, node, "if()")
        return self.unify([a, b], node)

    def in_(self, node: exp.In) -> str:
        subject = self.check(node.this)
        for item in node.expressions:
            self.comparable(subject, self.check(item), node)
        return "bool"

    def between(self, node: exp.Between) -> str:
        subject, low, high = self.operands(node, "this", "low", "high")
        self.comparable(subject, low, node)
        self.comparable(subject, high, node)
        return "bool"

    def is_(self, node: exp.Is) -> str:
        if not isinstance(node.expression, exp.Null):
            raise self.fail(f"only IS [NOT] NULL is allowed, not '{_snippet(node)}'")
        self.visited.add(id(node.expression))
        self.check(node.this)
        return "bool"

    def like(self, node: exp.Expr) -> str:
        for t in self.operands(node, "this", "expression"):
            self.need(t, {"string"}, node, "LIKE")
        return "bool"

    def cast(self, node: exp.Cast) -> str:
        to = node.args["to"]
        target = _CAST_TYPES.get(to.this) if not to.expressions else None
        if target is None:
            raise self.fail(
                f"CAST to {_snippet(to)} is not allowed (types: int, bigint, double, boolean, "
                f"string, timestamp)"
            )
        source = self.check(node.this)
        if source != _NULL and source not in _CASTS_FROM[target]:
            raise self.fail(f"cannot CAST {source} to {target} in '{_snippet(node)}'")
        return target

    def constant(self, node: exp.Expr) -> str:
        self.nullable |= isinstance(node, exp.Null)
        return "bool" if isinstance(node, exp.Boolean) else _NULL

    # -- functions -------------------------------------------------------------------------

    def math(self, node: exp.Expr) -> str:
        for key in ("this", "expression"):
            if node.args.get(key) is not None:
                self.need(self.check(node.args[key]), NUMERIC_TYPES, node, _fname(node))
        if isinstance(node, exp.Abs):
            return self.check(node.this)
        return "long" if isinstance(node, exp.Floor | exp.Ceil) else "double"

    def round_(self, node: exp.Round) -> str:
        (t,) = self.operands(node, "this")
        self.need(t, NUMERIC_TYPES, node, "round")
        decimals = node.args.get("decimals")
        if decimals is not None and not (
            isinstance(decimals, exp.Literal) and self.check(decimals) == "int"
        ):
            raise self.fail(f"round() takes an integer literal as its scale in '{_snippet(node)}'")
        return "double" if t == _NULL else t

    def variadic(self, node: exp.Expr) -> str:
        args = ([node.this] if node.args.get("this") is not None else []) + list(node.expressions)
        types = [self.check(a) for a in args]
        if isinstance(node, exp.Concat):
            for t in types:
                self.need(t, {"string"}, node, "concat")
            return "string"
        return self.unify(types, node)

    def text(self, node: exp.Expr) -> str:
        (t,) = self.operands(node, "this")
        self.need(t, {"string"}, node, _fname(node))
        return "int" if isinstance(node, exp.Length) else "string"

    def substring(self, node: exp.Substring) -> str:
        (t,) = self.operands(node, "this")
        self.need(t, {"string"}, node, "substring")
        for key in ("start", "length"):
            if node.args.get(key) is not None:
                self.need(self.check(node.args[key]), {"int"}, node, f"substring {key}")
        return "string"

    def epoch(self, node: exp.Expr) -> str:
        (t,) = self.operands(node, "this")
        self.need(t, {"timestamp"}, node, _fname(node))
        return "long"

    def anonymous(self, node: exp.Anonymous) -> str:
        name = str(node.name).lower()
        if name not in ("timestamp_seconds", "timestamp_millis", "timestamp_micros"):
            raise self.fail(self._refusal(node))
        if len(node.expressions) != 1:
            raise self.fail(f"{name}() takes one argument")
        allowed = NUMERIC_TYPES if name == "timestamp_seconds" else {"int", "long"}
        self.need(self.check(node.expressions[0]), allowed, node, name)
        return "timestamp"


def _find(schema: Schema, name: str) -> Field | None:
    lowered = name.lower()
    return next((f for f in schema.fields if f.name.lower() == lowered), None)


# Each accepted node class with its check. Classes are matched exactly (not by isinstance) so
# a sqlglot subclass with different semantics never slips through as its parent.
_HANDLERS: dict[type[exp.Expr], Callable[[_Checker, Any], str]] = {
    exp.Column: _Checker.column,
    exp.Literal: _Checker.literal,
    exp.Boolean: _Checker.constant,
    exp.Null: _Checker.constant,
    exp.Paren: _Checker.paren,
    **dict.fromkeys(_COMPARISONS, _Checker.compare),
    **dict.fromkeys((exp.And, exp.Or, exp.Not), _Checker.logic),
    **dict.fromkeys((*_ARITHMETIC, exp.Div), _Checker.arithmetic),
    exp.Neg: _Checker.negate,
    exp.Case: _Checker.case,
    exp.If: _Checker.if_,
    exp.In: _Checker.in_,
    exp.Between: _Checker.between,
    exp.Is: _Checker.is_,
    **dict.fromkeys((exp.Like, exp.ILike), _Checker.like),
    **dict.fromkeys((exp.Cast, exp.TryCast), _Checker.cast),
    **dict.fromkeys(_MATH, _Checker.math),
    exp.Round: _Checker.round_,
    **dict.fromkeys((exp.Greatest, exp.Least, exp.Coalesce, exp.Concat), _Checker.variadic),
    **dict.fromkeys((exp.Lower, exp.Upper, exp.Length, exp.Trim), _Checker.text),
    exp.Substring: _Checker.substring,
    **dict.fromkeys((exp.UnixSeconds, exp.UnixMillis, exp.UnixMicros), _Checker.epoch),
    exp.Anonymous: _Checker.anonymous,
}

# Arguments that give a node meaning beyond what its check reads (a Trim of explicit
# characters, a Floor with a scale, IN over a subquery): refused with a specific message.
_FORBIDDEN_ARGS: dict[type[exp.Expr], tuple[str, ...]] = {
    exp.Column: ("db", "catalog", "join_mark"),
    exp.In: ("query", "unnest", "field"),
    exp.Trim: ("expression", "collation"),
    exp.Floor: ("decimals", "to"),
    exp.Ceil: ("decimals", "to"),
    exp.Round: ("truncate",),
    exp.Length: ("binary", "encoding"),
    exp.Cast: ("format", "action", "default"),
    exp.TryCast: ("format", "action", "default"),
}
