"""Hypothesis: for generated filter and projection expressions, the SQL form and the box form
the compiler makes give the same rows. Both are evaluated by DuckDB over the same table: the
SQL as written, and the boxes' expressions (Spark SQL text, as the engine gets them) rendered
for DuckDB by sqlglot; a compiler that renamed, reordered, dropped or changed an expression
would show as a different multiset of rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.model.sql import compile_script

DDL = (
    "CREATE STREAM t (a INT, b BIGINT NOT NULL, x DOUBLE, s VARCHAR, k BOOLEAN, "
    "ts TIMESTAMP(3) NOT NULL);\n"
)
TABLE = pa.table(
    {
        "a": pa.array([1, -2, None, 7, 0, 3, None, -5], pa.int32()),
        "b": pa.array([10, 20, 30, -40, 0, 5, 6, 7], pa.int64()),
        "x": pa.array([0.5, None, -1.25, 3.0, 0.0, 2.5, 1e3, -7.5], pa.float64()),
        "s": pa.array(["ab", "Cd", None, "", "xyz", "ab", "Q", "lm"], pa.string()),
        "k": pa.array([True, False, None, True, False, None, True, False], pa.bool_()),
        "ts": pa.array(range(8), pa.timestamp("ms")),
    }
)

numbers = st.recursive(
    st.sampled_from(["a", "b", "x", "1", "2", "-3", "0.5"]),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"abs({e})"),
        st.tuples(inner, inner).map(lambda t: f"coalesce({t[0]}, {t[1]})"),
    ),
    max_leaves=6,
)
strings = st.one_of(
    st.sampled_from(["s", "'ab'", "lower(s)", "upper(s)", "trim(s)"]),
    st.tuples(st.sampled_from(["s", "'q'"]), st.sampled_from(["s", "'z'"])).map(
        lambda t: f"concat({t[0]}, {t[1]})"
    ),
)
conditions = st.recursive(
    st.one_of(
        st.tuples(numbers, st.sampled_from(["<", "<=", "=", "<>", ">", ">="]), numbers).map(
            lambda t: f"{t[0]} {t[1]} {t[2]}"
        ),
        st.sampled_from(["k", "a IS NULL", "s IS NOT NULL", "s LIKE 'a%'", "b IN (10, 0, 7)"]),
        st.tuples(numbers, numbers, numbers).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
    ),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda c: f"NOT ({c})"),
    ),
    max_leaves=4,
)
projections = st.one_of(
    numbers,
    strings,
    st.tuples(conditions, numbers, numbers).map(
        lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"
    ),
    strings.map(lambda e: f"length({e})"),
)


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for row in con.execute(sql).fetchall():
        out[tuple(round(v, 6) if isinstance(v, float) else v for v in row)] += 1
    return out


def duck(spark_sql: str) -> str:
    return sqlglot.transpile(spark_sql, read="spark", write="duckdb")[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(projections, min_size=1, max_size=3), conditions)
def test_sql_form_and_box_form_give_the_same_rows(items: list[str], where: str) -> None:
    select = ", ".join(f"{e} AS c{i}" for i, e in enumerate(items))
    script = compile_script(f"{DDL}INSERT INTO out SELECT {select} FROM t WHERE {where}", name="h")
    (query,) = script.queries
    kinds = [b.type for b in query.boxes]
    assert kinds == ["filter", "map"]
    filter_box, map_box = (dict(b.params) for b in query.boxes)
    box_select = ", ".join(
        f"{duck(map_box[f'expression.{i}'])} AS {map_box[f'output-field-name.{i}']}"
        for i in range(len(items))
    )
    con = duckdb.connect()
    con.register("t", TABLE)
    sql_form = rows(con, duck(f"SELECT {select} FROM t WHERE {where}"))
    box_form = rows(con, f"SELECT {box_select} FROM t WHERE {duck(filter_box['expression.0'])}")
    assert box_form == sql_form
