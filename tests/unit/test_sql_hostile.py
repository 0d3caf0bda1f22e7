"""Hostile SQL is refused within the request budgets, quickly, with SqlError only: huge
scripts, deep nesting, token floods, forbidden functions, and text sqlglot cannot parse."""

from __future__ import annotations

import time

import pytest

from peer.errors import SqlError
from peer.model.limits import ContentLimits
from peer.model.sql import compile_script

DDL = "CREATE STREAM s (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"

# each hostile script, and a part of the reason it must be refused for
HOSTILE = {
    "huge": DDL + "INSERT INTO o SELECT a FROM s WHERE " + " OR ".join(["a = 1"] * 300_000),
    "deep parentheses": DDL + "INSERT INTO o SELECT " + "(" * 5000 + "a" + ")" * 5000 + " FROM s",
    "deep subqueries": DDL + "INSERT INTO o " + "SELECT a FROM (" * 60 + "SELECT a FROM s"
    + ")" * 60,
    "token flood": DDL + "INSERT INTO o SELECT a FROM s WHERE a IN ("
    + ",".join(["1"] * 60_000) + ")",
    "reflect": DDL + "INSERT INTO o SELECT reflect('java.lang.Runtime', 'getRuntime') AS x FROM s",
    "java_method": DDL + "INSERT INTO o SELECT java_method('java.lang.System', 'exit', 0) AS x "
    "FROM s",
    "udf": DDL + "CREATE FUNCTION f AS 'com.evil.F';\nINSERT INTO o SELECT f(a) AS x FROM s",
    "many statements": DDL + "CREATE VIEW v0 AS SELECT a FROM s;\n" * 300,
    "unterminated": DDL + "INSERT INTO o SELECT 'a FROM s",
    "binary junk": "\x00\xff\ufffe" * 1000,
    "self view": "CREATE VIEW v AS SELECT a FROM v;",
    # each view reads the one before twice: 2^30 copies to compile, in 32 short statements
    "doubling views": DDL + "CREATE VIEW v0 AS SELECT a, t FROM s;\n" + "".join(
        f"CREATE VIEW v{i} AS SELECT a, t FROM v{i - 1} UNION ALL SELECT a, t FROM v{i - 1};\n"
        for i in range(1, 30)) + "INSERT INTO o SELECT a FROM v29;",
    # a chain of 120 views, each read by the next: 7,000 SELECTs (each declaration compiles
    # its view, and so the chain below it)
    "chained views": DDL + "CREATE VIEW v0 AS SELECT a, t FROM s;\n" + "".join(
        f"CREATE VIEW v{i} AS SELECT a, t FROM v{i - 1} WHERE a > {i};\n"
        for i in range(1, 120)) + "INSERT INTO o SELECT a FROM v119;",
}  # fmt: skip


REASONS = {
    "huge": "larger than 1048576 bytes",
    "deep parentheses": "parentheses nest deeper than 48",
    "deep subqueries": "parentheses nest deeper than 48",
    "token flood": "more than 50000 tokens",
    "reflect": "function reflect is not allowed",
    "java_method": "function java_method is not allowed",
    "udf": "user-defined functions are not supported",
    "many statements": "more than 200 statements",
    "unterminated": "does not tokenize",
    "binary junk": "is not a statement fedstream takes",
    "self view": "unknown stream or view v",
    "doubling views": "views expand into more than 1000 SELECTs",
    "chained views": "views expand into more than 1000 SELECTs",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_sql_is_refused_quickly(name: str) -> None:
    limits = ContentLimits(max_query_bytes=1 << 20)
    started = time.perf_counter()
    with pytest.raises(SqlError, match=REASONS[name]):
        compile_script(HOSTILE[name], name="h", limits=limits)
    assert time.perf_counter() - started < 5.0


def test_the_size_budget_is_the_query_budget() -> None:
    small = ContentLimits(max_query_bytes=100)
    with pytest.raises(SqlError, match="larger than 100 bytes") as refused:
        compile_script(DDL + "INSERT INTO o SELECT a FROM s WHERE a > 1", name="h", limits=small)
    assert refused.value.details["limit"] == "max_query_bytes"
