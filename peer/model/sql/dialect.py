"""The SQL dialect fedstream reads: Spark's, extended through sqlglot's parser seams.

Flink's streaming SQL is Spark SQL plus a few forms sqlglot's Spark dialect does not parse;
this module adds them as parser entries, not by rewriting text:

- window table functions ``TUMBLE(TABLE s, DESCRIPTOR(t), INTERVAL ...)`` and
  ``HOP(TABLE s, DESCRIPTOR(t), slide, size)`` (the ``TABLE`` keyword before the input);
- ``WATERMARK FOR t AS t - INTERVAL 'n' SECOND`` inside a column list (the constraint
  sqlglot's RisingWave parser already knows, reused from there);
- ``CREATE STREAM`` read as ``CREATE TABLE`` (the keyword ``STREAM`` names a table kind);
- ``CREATE QUERY name [WITH (...)] AS INSERT ...``, a named query.

A script is bounded before sqlglot sees it (its bytes, tokens and parenthesis depth):
sqlglot's recursive-descent parser spends Python frames per nesting level, so a hostile
script is refused by counting, never by running out of stack. Everything sqlglot raises on
malformed text becomes a :class:`~peer.errors.SqlError` with the line and column it names.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.spark import Spark
from sqlglot.parsers.risingwave import RisingWaveParser
from sqlglot.parsers.spark import SparkParser

from peer.errors import SqlError

MAX_TOKENS = 50_000
MAX_PAREN_DEPTH = 48
MAX_STATEMENTS = 200
_ROUGH_TOKEN = re.compile(r"\w+|[^\w\s]")
WINDOW_FUNCTIONS = ("TUMBLE", "HOP")


class _Parser(SparkParser):
    def _parse_window_tvf(self, name: str) -> exp.Expr:
        self._match(TokenType.TABLE)
        table = self._parse_table_parts()
        if table is None:
            self.raise_error(f"expected TABLE stream as the first argument of {name}")
        args: list[exp.Expr] = [table] if table is not None else []
        while self._match(TokenType.COMMA):
            arg = self._parse_assignment()
            if arg is None:
                self.raise_error(f"expected an argument of {name}")
            else:
                args.append(arg)
        return self.expression(exp.Anonymous(this=name, expressions=args))

    FUNCTION_PARSERS = {
        **SparkParser.FUNCTION_PARSERS,
        **{name: (lambda self, n=name: self._parse_window_tvf(n)) for name in WINDOW_FUNCTIONS},
    }
    CONSTRAINT_PARSERS = {
        **SparkParser.CONSTRAINT_PARSERS,
        "WATERMARK": RisingWaveParser.CONSTRAINT_PARSERS["WATERMARK"],
    }
    SCHEMA_UNNAMED_CONSTRAINTS = {*SparkParser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    def _parse_create(self) -> exp.Create | exp.Command:
        if not (self._curr and self._curr.text.upper() == "QUERY"):
            return super()._parse_create()
        start = self._prev
        self._advance()
        name = self._parse_table_parts()
        properties = (
            self._parse_properties() if self._match(TokenType.WITH, advance=False) else None
        )
        if not self._match(TokenType.ALIAS):
            self.raise_error("expected AS after CREATE QUERY name")
        body = self._parse_statement()
        create = exp.Create(this=name, kind="QUERY", expression=body, properties=properties)
        return create.update_positions(start)


class FedstreamSQL(Spark):
    """Spark SQL with Flink's window table functions, watermarks and named queries."""

    Parser = _Parser

    class Tokenizer(Spark.Tokenizer):
        KEYWORDS = {**Spark.Tokenizer.KEYWORDS, "STREAM": TokenType.TABLE}


DIALECT = FedstreamSQL()


@dataclass(frozen=True)
class Position:
    line: int
    column: int


def position_of(text: str, offset: int) -> Position:
    """Line and column (from 1) of a character offset into ``text``."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    return Position(line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


def node_offset(node: exp.Expr) -> int | None:
    """The offset of the first source character of ``node`` (None if sqlglot kept none)."""
    found = [n.meta["start"] for n in node.walk() if isinstance(n.meta.get("start"), int)]
    return min(found) if found else None


def refuse(
    text: str,
    node: exp.Expr | int | None,
    reason: str,
    *,
    keyword: str | None = None,
    **details: Any,
) -> SqlError:
    """A :class:`SqlError` at ``node`` (or an offset): 'line L, column C: reason'. sqlglot
    keeps positions of names and literals only, so a clause (or ``keyword``) is found as its
    keyword before its first positioned part."""
    offset = node if isinstance(node, int) or node is None else node_offset(node)
    if offset is None and isinstance(node, exp.Expr) and node.parent is not None:
        offset = node_offset(node.parent)
    if keyword is None and isinstance(node, exp.Expr):
        keyword = _KEYWORDS.get(type(node))
    if keyword is not None and offset is not None:
        # sqlglot keeps no position for a clause; point at its keyword before its first part
        found = text.upper().rfind(keyword, 0, offset)
        offset = found if found >= 0 else offset
    if offset is None:
        return SqlError(reason, **details)
    where = position_of(text, offset)
    return SqlError(
        f"line {where.line}, column {where.column}: {reason}",
        line=where.line,
        column=where.column,
        **details,
    )


_KEYWORDS: dict[type[exp.Expr], str] = {
    exp.Group: "GROUP",
    exp.Order: "ORDER",
    exp.Having: "HAVING",
    exp.Limit: "LIMIT",
    exp.Offset: "OFFSET",
    exp.Where: "WHERE",
    exp.Distinct: "DISTINCT",
    exp.Join: "JOIN",
    exp.Subquery: "SELECT",
    exp.Select: "SELECT",
}


class _QuietWhileParsing(logging.Filter):
    """sqlglot logs warnings quoting unsupported input; our errors already say what is wrong,
    and hostile scripts must not write themselves into the peer's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("sqlglot")


def parse_script(text: str, *, max_bytes: int) -> list[exp.Expr]:
    """The statements of ``text``, within the budgets; raises only SqlError."""
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise SqlError(f"the SQL script is larger than {max_bytes} bytes", limit="max_query_bytes")
    # a cheap over-estimate first: sqlglot's tokenizer takes ~40 us a token here
    if len(_ROUGH_TOKEN.findall(text)) > 2 * MAX_TOKENS:
        raise SqlError(
            f"the SQL script has more than {MAX_TOKENS} tokens; split it into several files"
        )
    try:
        tokens = DIALECT.tokenize(text)
    except Exception as exc:
        raise SqlError(f"the SQL script does not tokenize: {_reason(exc)}") from exc
    _check_tokens(text, tokens)
    quiet = _QuietWhileParsing()
    logger = logging.getLogger("sqlglot")
    logger.addFilter(quiet)
    try:
        trees = DIALECT.parser().parse(tokens, text)
    except RecursionError as exc:
        raise SqlError("the SQL script is nested too deeply") from exc
    except sqlglot.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        start = first.get("start_context", "")
        offset = _error_offset(text, tokens, first)
        detail = str(first.get("description") or exc).splitlines()[0][:200]
        raise refuse(text, offset, f"{detail} (near {start[-30:]!r})") from exc
    except Exception as exc:
        raise SqlError(f"the SQL script does not parse: {_reason(exc)}") from exc
    finally:
        logger.removeFilter(quiet)
    statements = [t for t in trees if t is not None]
    if not statements:
        raise SqlError("the SQL script holds no statement")
    if len(statements) > MAX_STATEMENTS:
        raise SqlError(f"the SQL script holds more than {MAX_STATEMENTS} statements")
    return statements


def _check_tokens(text: str, tokens: list[Token]) -> None:
    if len(tokens) > MAX_TOKENS:
        raise SqlError(
            f"the SQL script has more than {MAX_TOKENS} tokens; split it into several files"
        )
    depth = 0
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            if depth > MAX_PAREN_DEPTH:
                raise refuse(
                    text,
                    token.start,
                    f"parentheses nest deeper than {MAX_PAREN_DEPTH}; use a view "
                    "(CREATE VIEW) for a part of the query",
                )
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1


def _error_offset(text: str, tokens: list[Token], error: dict[str, Any]) -> int | None:
    line, col = error.get("line"), error.get("col")
    if not isinstance(line, int) or not isinstance(col, int):
        return None
    # sqlglot reports the line and the column where the offending token ends
    for token in tokens:
        if token.line == line and token.col == col:
            return token.start
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + max(0, col - 1)


def _reason(exc: Exception) -> str:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return message[:200]
