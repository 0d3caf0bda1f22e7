"""The SQL compiler (peer.model.sql), without a JVM: each construct's boxes, the published
NEXMark texts' shapes, and refusals with their line, column and text."""

from __future__ import annotations

import pytest

from peer.errors import SqlError
from peer.examples.nexmark import stages
from peer.examples.nexmark.flink_sql import PUBLISHED, script
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.sql import compile_script, is_sql

DDL = """\
CREATE STREAM trades (sym VARCHAR(8) NOT NULL, px DOUBLE NOT NULL, qty BIGINT,
  venue INT NOT NULL, ok BOOLEAN, t TIMESTAMP(3) NOT NULL,
  WATERMARK FOR t AS t - INTERVAL '2' SECOND) WITH ('replicas' = '2');
CREATE STREAM quotes (sym STRING NOT NULL, bid DOUBLE NOT NULL, t TIMESTAMP(3) NOT NULL,
  WATERMARK FOR t AS t);
"""


def only(text: str, **kwargs: object) -> Query:
    compiled = compile_script(DDL + text, name="q", **kwargs)  # type: ignore[arg-type]
    assert len(compiled.queries) == 1, compiled.queries
    return compiled.queries[0]


def params(query: Query, kind: str, n: int = 0) -> dict[str, str]:
    return dict([b for b in query.boxes if b.type == kind][n].params)


def test_create_stream_maps_types_nullability_watermark_and_replicas() -> None:
    compiled = compile_script(DDL, name="ddl")
    trades, quotes = compiled.streams
    assert trades.name == "trades" and trades.replicas == 2 and quotes.replicas is None
    fields = {f.name: (f.type, f.size, f.nullable) for f in trades.schema.fields}
    assert fields == {
        "sym": ("string", 8, False), "px": ("double", None, False), "qty": ("long", None, True),
        "venue": ("int", None, False), "ok": ("bool", None, True),
        "t": ("timestamp", None, False),
    }  # fmt: skip
    assert compiled.queries == ()


def test_projection_and_where_become_filter_then_map() -> None:
    q = only(
        "INSERT INTO out SELECT sym, px * qty AS notional, "
        "CASE WHEN px > 10 THEN 'high' ELSE 'low' END AS band FROM trades "
        "WHERE venue IN (1, 2) AND MOD(qty, 2) = 0"
    )
    assert [b.type for b in q.boxes] == ["filter", "map"]
    assert q.boxes[0].inputs == ("trades",) and q.boxes[-1].outputs == ("out",)
    assert params(q, "filter")["expression.0"] == ("`venue` IN (1, 2) AND `qty` % 2 = 0")
    m = params(q, "map")
    assert m["output-field-name.1"] == "notional" and m["expression.1"] == "`px` * `qty`"
    assert m["expression.2"].startswith("CASE WHEN `px` > 10")


def test_sql_form_equals_the_json_form_of_the_same_boxes() -> None:
    q = only("INSERT INTO out SELECT sym FROM trades WHERE px > 1")
    assert parse_query(query_to_dict(q)) == q


def test_tumble_aggregate_with_keys_having_and_every_function() -> None:
    q = only(
        "INSERT INTO out SELECT window_start, sym, COUNT(*) AS n, COUNT(DISTINCT venue) AS v, "
        "SUM(qty) AS s, AVG(px) AS a, MIN(px) AS lo, MAX(px) AS hi "
        "FROM TABLE(TUMBLE(TABLE trades, DESCRIPTOR(t), INTERVAL '1' MINUTE)) "
        "GROUP BY window_start, window_end, sym HAVING COUNT(*) > 1"
    )
    assert [b.type for b in q.boxes] == ["aggregate", "filter", "map"]
    a = params(q, "aggregate")
    assert (a["window-size"], a["advance"], a["order-on-field"], a["slack"]) == (
        "60", "60", "t", "2"
    )  # fmt: skip
    assert a["group-by"] == "sym"
    calls = [a[f"aggregate-function.{i}"] for i in range(6)]
    assert calls == ["count()", "count_distinct(venue)", "sum(qty)", "avg(px)", "min(px)",
                     "max(px)"]  # fmt: skip
    assert params(q, "filter")["expression.0"] == "`agg_0` > 1"


def test_hop_window_sets_size_and_advance() -> None:
    q = only(
        "INSERT INTO out SELECT window_start, window_end, COUNT(*) AS n FROM TABLE(HOP("
        "TABLE trades, DESCRIPTOR(t), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
        "GROUP BY window_start, window_end"
    )
    a = params(q, "aggregate")
    assert (a["window-size"], a["advance"]) == ("10", "2")


def test_union_all_maps_the_second_input_to_the_first_names() -> None:
    q = only(
        "INSERT INTO out SELECT sym, px AS price FROM trades UNION ALL SELECT sym, bid FROM quotes"
    )
    kinds = [b.type for b in q.boxes]
    assert kinds.count("union") == 1 and kinds[-1] == "union"
    union = q.boxes[-1]
    assert len(union.inputs) == 2 and union.outputs == ("out",)


def test_interval_join_bounds_buffers_and_keeps_the_exact_predicate() -> None:
    q = only(
        "INSERT INTO out SELECT tr.sym, tr.px, qu.bid FROM trades tr JOIN quotes qu "
        "ON tr.sym = qu.sym AND tr.t BETWEEN qu.t - INTERVAL '5' SECOND AND qu.t"
    )
    j = params(q, "join")
    assert (j["left-order-on-field"], j["right-order-on-field"]) == ("t", "t")
    # left.t - right.t in [-5 s, 0]: the left keeps 5 s (+1 ms), the right 1 ms
    assert (j["left-buffer-size"], j["right-buffer-size"]) == ("5.001", "0.001")
    assert "unix_micros(`left`.`t`) - unix_micros(`right`.`t`) >= -5000000" in j["predicate"]
    assert "`left`.`sym` = `right`.`sym`" in j["predicate"]


def test_unbounded_join_warns_and_aggregate_over_it_is_refused() -> None:
    compiled = compile_script(
        DDL + "INSERT INTO out SELECT tr.sym, qu.bid FROM trades tr, quotes qu "
        "WHERE tr.sym = qu.sym AND tr.px > 3",
        name="q",
    )
    (warning,) = compiled.warnings
    assert "no time bound" in warning and "unbounded state" in warning
    kinds = [b.type for b in compiled.queries[0].boxes]
    assert kinds == ["filter", "join", "map"]  # the one-sided condition filters first
    with pytest.raises(SqlError, match="aggregate over the join of tr and qu"):
        compile_script(
            DDL + "CREATE VIEW j AS SELECT tr.sym, tr.t FROM trades tr JOIN quotes qu "
            "ON tr.sym = qu.sym;\nINSERT INTO out SELECT window_start, COUNT(*) AS n FROM "
            "TABLE(TUMBLE(TABLE j, DESCRIPTOR(t), INTERVAL '1' SECOND)) "
            "GROUP BY window_start, window_end",
            name="q",
        )


def test_views_named_queries_options_and_hints() -> None:
    compiled = compile_script(
        DDL + "CREATE VIEW cheap AS SELECT sym, px, t FROM trades WHERE px < 5;\n"
        "CREATE QUERY watch WITH ('availability_bound' = '2.5') AS INSERT INTO alerts "
        "SELECT /*+ OPTIONS('node'='peer-b') */ sym FROM cheap;",
        name="file",
    )
    (q,) = compiled.queries
    assert q.name == "watch" and q.availability_bound_s == 2.5
    assert q.boxes[-1].node == "peer-b" and q.boxes[-1].outputs == ("alerts",)


def test_namespace_prefixes_streams_and_queries() -> None:
    compiled = compile_script(DDL + "INSERT INTO out SELECT sym FROM trades", name="q",
                              namespace="run1:")  # fmt: skip
    assert [s.name for s in compiled.streams] == ["run1:trades", "run1:quotes"]
    (q,) = compiled.queries
    assert q.name == "run1_q" and q.boxes[0].inputs == ("run1:trades",)
    assert q.boxes[-1].outputs == ("run1:out",)


@pytest.mark.parametrize("q", sorted(set(PUBLISHED) - {"q4"}))
def test_published_nexmark_compiles_into_as_many_stages_as_the_box_forms(q: str) -> None:
    compiled = compile_script(script(q), name=q)
    # the hand-made box forms (peer.examples.nexmark.stages) chain q5 in 3 queries; SQL runs
    # its join in the second one (the planner gives a join behind an aggregate its own
    # fragment, as for q7 and q8)
    want = {"q5": 2}.get(q, len(stages(q)))
    assert len(compiled.queries) == want
    assert compiled.queries[-1].boxes[-1].outputs == (f"nexmark_{q}",)
    assert bool(compiled.warnings) == (q == "q3")


def test_q5_second_stage_groups_the_first_windows_by_their_slide() -> None:
    compiled = compile_script(script("q5"), name="q5")
    a = params(compiled.queries[1], "aggregate")
    assert (a["order-on-field"], a["window-size"], a["advance"]) == ("starttime", "2", "2")
    j = params(compiled.queries[1], "join")
    assert "`left`.`num` >= `right`.`maxn`" in j["predicate"]


def test_sink_declaration_renames_by_position_and_checks_types() -> None:
    q = only("CREATE TABLE out (a VARCHAR, b DOUBLE);\nINSERT INTO out SELECT sym, qty FROM trades")
    m = dict(q.boxes[-1].params)
    assert (m["output-field-name.0"], m["output-field-name.1"]) == ("a", "b")
    assert m["expression.1"] == "CAST(`qty` AS DOUBLE)"
    with pytest.raises(SqlError, match="column a of out is long, the query gives string"):
        compile_script(
            DDL + "CREATE TABLE out (a BIGINT);\nINSERT INTO out SELECT sym FROM trades",
            name="q",
        )


def test_is_sql_tells_sql_from_xml_and_json() -> None:
    assert is_sql("INSERT INTO x SELECT a FROM b")
    assert not is_sql("  <query name='x'/>") and not is_sql('{"name": "x"}')


# -- refused SQL: (text after the DDL, line, column, part of the message) ----------------------

L = DDL.count("\n") + 1  # the first line after the DDL
REFUSED = [
    ("INSERT INTO out SELECT sym, COUNT(*) AS n FROM trades GROUP BY sym",
     L, 55, "GROUP BY without a window would update its results forever"),
    ("INSERT INTO out SELECT sym FROM trades\nORDER BY px",
     L + 1, 1, "ORDER BY without a window"),
    ("INSERT INTO out SELECT reflect('java.lang.Runtime', 'exec', sym) AS x FROM trades",
     L, 24, "function reflect is not allowed"),
    ("INSERT INTO out SELECT my_udf(px) AS x FROM trades",
     L, 24, "function my_udf is not allowed"),
    ("INSERT INTO out SELECT sym FROM trades WHERE px > (SELECT MAX(bid) FROM quotes)",
     L, 52, "a subquery inside an expression is not supported"),
    ("INSERT INTO out SELECT sym FROM trades LIMIT 3",
     L, 40, "LIMIT has no meaning on a stream"),
    ("INSERT INTO out SELECT DISTINCT sym FROM trades",
     L, 24, "SELECT DISTINCT must remember every row forever"),
    ("INSERT INTO out SELECT tr.sym FROM trades tr LEFT JOIN quotes qu ON tr.sym = qu.sym",
     L, 51, "LEFT JOIN is not supported"),
    ("INSERT INTO out SELECT sym FROM nowhere",
     L, 33, "unknown stream or view nowhere"),
    ("INSERT INTO out SELECT nope FROM trades",
     L, 24, "unknown column nope"),
    ("INSERT INTO out SELECT COUNT(*) AS n FROM trades",
     L, 24, "GROUP BY without a window"),
    ("INSERT INTO out SELECT window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE trades, "
     "DESCRIPTOR(sym), INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
     L, 84, "sym is not an event-time column of trades"),
    ("INSERT INTO out SELECT sym, px + 'a' AS x FROM trades",
     L, 29, "arithmetic needs"),
    ("INSERT INTO out SELECT SUM(px) OVER (PARTITION BY sym) AS x FROM trades",
     L, 24, "OVER windows are not supported"),
    ("DELETE FROM trades",
     L, 1, "DELETE is not a statement fedstream takes"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "column", "message"), REFUSED)
def test_refused_with_line_column_and_reason(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(SqlError) as refused:
        compile_script(DDL + text, name="q")
    error = refused.value
    assert message in error.message
    assert (error.details.get("line"), error.details.get("column")) == (line, column)
    assert error.message.startswith(f"line {line}, column {column}: ")


def test_published_q4_is_refused_at_its_unwindowed_group_by() -> None:
    with pytest.raises(SqlError) as refused:
        compile_script(script("q4"), name="q4")
    text = script("q4").splitlines()[refused.value.details["line"] - 1]
    column = refused.value.details["column"]
    assert text[column - 1 :].startswith("GROUP BY A.id, A.category")


def test_star_expands_a_stream_and_a_join_side() -> None:
    q = only("INSERT INTO out SELECT * FROM quotes")
    m = dict(q.boxes[-1].params)
    assert [m[f"output-field-name.{i}"] for i in range(3)] == ["sym", "bid", "t"]
    q = only(
        "INSERT INTO out SELECT qu.*, tr.px FROM trades tr JOIN quotes qu ON tr.sym = qu.sym "
        "AND tr.t = qu.t"
    )
    m = dict(q.boxes[-1].params)
    names = [m[f"output-field-name.{i}"] for i in range(4)]
    assert names == ["qu_sym", "bid", "qu_t", "px"]
    with pytest.raises(SqlError, match="names sym twice"):
        compile_script(DDL + "INSERT INTO out SELECT *, sym FROM quotes", name="q")


def test_an_equal_box_is_made_once() -> None:
    # q5 counts bids per auction and window twice (AuctionBids, CountBids): one aggregate
    first = compile_script(script("q5"), name="q5").queries[0]
    assert [b.type for b in first.boxes] == ["aggregate", "map", "map"]


def test_having_without_a_window_is_refused_after_a_join_too() -> None:
    with pytest.raises(SqlError, match="GROUP BY without a window") as refused:
        compile_script(
            DDL + "INSERT INTO out SELECT tr.sym FROM trades tr JOIN quotes qu "
            "ON tr.sym = qu.sym AND tr.t = qu.t\nHAVING tr.px > 1",
            name="q",
        )
    assert (refused.value.details["line"], refused.value.details["column"]) == (L + 1, 1)
