"""Queries: Medusa XML, Borealis XML and JSON agree; the graph's structure is checked."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.errors import QueryError
from peer.model.query import Box, Query, parse_query, query_to_dict, topological_order

# Verbatim from the Medusa paper's appendix (section 6.3), including its "nexpression.0".
MEDUSA_QUERY_XML = (
    '<query name="medusa://nms.lcs.mit.edu/locator/FindMrX">\n'
    ' <box name="foo" type="filter">\n'
    ' <input port="1" stream="medusa://nms.lcs.mit.edu/locator/people"/>\n'
    ' <output port="1" stream="medusa://nms.lcs.mit.edu/locator/MrX"/>\n'
    ' <param name="nexpression.0" value="person_id = 2"/>\n'
    ' <param name="pass-on-false-port" value="0"/>\n'
    " </box>\n"
    "</query>\n"
)
BOREALIS_QUERY_XML = """
<query name="medusa://nms.lcs.mit.edu/locator/FindMrX">
  <box name="foo" type="Filter">
    <in stream="medusa://nms.lcs.mit.edu/locator/people"/>
    <out stream="medusa://nms.lcs.mit.edu/locator/MrX"/>
    <parameter name="pass-on-false-port" value="0"/>
    <parameter name="expression.0" value="person_id = 2"/>
  </box>
</query>
"""
FIND_MR_X = {
    "name": "medusa://nms.lcs.mit.edu/locator/FindMrX",
    "boxes": [
        {
            "name": "foo",
            "type": "filter",
            "inputs": ["medusa://nms.lcs.mit.edu/locator/people"],
            "outputs": ["medusa://nms.lcs.mit.edu/locator/MrX"],
            "params": {"expression.0": "person_id = 2", "pass-on-false-port": "0"},
        }
    ],
}
EXPECTED = Query(
    "medusa://nms.lcs.mit.edu/locator/FindMrX",
    (
        Box(
            "foo",
            "filter",
            ("medusa://nms.lcs.mit.edu/locator/people",),
            ("medusa://nms.lcs.mit.edu/locator/MrX",),
            (("expression.0", "person_id = 2"), ("pass-on-false-port", "0")),
        ),
    ),
)


def test_medusa_borealis_and_json_are_equal() -> None:
    assert parse_query(MEDUSA_QUERY_XML) == EXPECTED
    assert parse_query(MEDUSA_QUERY_XML.encode()) == EXPECTED
    assert parse_query(BOREALIS_QUERY_XML) == EXPECTED
    assert parse_query(json.dumps(FIND_MR_X)) == EXPECTED
    assert parse_query(FIND_MR_X) == EXPECTED


def test_borealis_wrapper_holding_one_query() -> None:
    wrapped = f"""<borealis>
      <input stream="medusa://nms.lcs.mit.edu/locator/people" schema="person"/>
      {BOREALIS_QUERY_XML}
    </borealis>"""
    assert parse_query(wrapped) == EXPECTED
    with pytest.raises(QueryError, match="exactly one <query>"):
        parse_query("<network></network>")


def test_query_to_dict_round_trips() -> None:
    assert query_to_dict(EXPECTED) == FIND_MR_X
    multi = parse_query(
        {
            "name": "q",
            "boxes": [
                {
                    "name": "u",
                    "type": "union",
                    "inputs": ["a", "b"],
                    "outputs": ["c"],
                    "node": "peer1",
                },
                {
                    "name": "f",
                    "type": "filter",
                    "inputs": ["c"],
                    "outputs": ["d", "e"],
                    "params": {"expression.0": "x > 1", "pass-on-false-port": 1},
                },
            ],
        }
    )
    assert parse_query(query_to_dict(multi)) == multi
    assert multi.boxes[0].node == "peer1"
    assert "node" not in query_to_dict(multi)["boxes"][1]


def test_ports_order_the_arrows() -> None:
    xml = """<query name="q"><box name="j" type="join">
      <input port="2" stream="right"/><input port="1" stream="left"/>
      <output port="1" stream="out"/></box></query>"""
    assert parse_query(xml).boxes[0].inputs == ("left", "right")


def test_params_are_sorted_and_typed_values_become_text() -> None:
    query = parse_query(
        {
            "name": "q",
            "boxes": [
                {
                    "name": "m",
                    "type": "map",
                    "inputs": ["a"],
                    "outputs": ["b"],
                    "params": {
                        "expression.10": "x",
                        "expression.2": "y",
                        "output-field-name.2": "y",
                        "flag": True,
                        "size": 1.5,
                        "count": 3,
                    },
                }
            ],
        }
    )
    box = query.boxes[0]
    assert [k for k, _ in box.params] == [
        "count",
        "expression.2",
        "expression.10",
        "flag",
        "output-field-name.2",
        "size",
    ]
    assert box.param("flag") == "true"
    assert box.param("size") == "1.5"
    assert box.param("count") == "3"
    assert box.param("missing") is None
    assert box.param("missing", "d") == "d"


def test_box_type_is_case_insensitive() -> None:
    xml = (
        '<query name="q"><box name="b" type="BSort"><in stream="a"/><out stream="b"/></box></query>'
    )
    assert parse_query(xml).boxes[0].type == "bsort"


def _one_box(box: dict[str, object]) -> dict[str, object]:
    return {"name": "q", "boxes": [{"inputs": ["a"], "outputs": ["b"], **box}]}


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (_one_box({"name": "b", "type": "sql"}), "box b: unknown box type 'sql'"),
        (_one_box({"name": "b", "type": None}), "unknown box type None"),
        (_one_box({"name": "b", "type": "map", "outputs": ["b", "c"]}), "takes 1 outputs, got 2"),
        (_one_box({"name": "b", "type": "join"}), "takes 2 inputs, got 1"),
        (_one_box({"name": "b", "type": "union", "inputs": []}), "takes at least 1 inputs"),
        (_one_box({"name": "b", "type": "filter", "outputs": ["c", "c"]}), "same output stream"),
        (_one_box({"name": "b", "type": "map", "inputs": ["bad name"]}), "stream name"),
        (_one_box({"name": "b", "type": "map", "node": "a b"}), "node name"),
        (_one_box({"name": "b c", "type": "map"}), "box name"),
        (_one_box({"name": "b", "type": "map", "params": {"bad name": "x"}}), "bad parameter name"),
        (_one_box({"name": "b", "type": "map", "params": {"x": None}}), "parameter x must be text"),
        (_one_box({"name": "b", "type": "map", "params": []}), "'params' must be an object"),
        (_one_box({"name": "b", "type": "map", "inputs": "a"}), "must be lists"),
        (_one_box({"name": "b", "type": "map", "extra": 1}), "unknown keys"),
        (
            _one_box(
                {
                    "name": "b",
                    "type": "filter",
                    "params": {"expression.0": "x", "nexpression.0": "y"},
                }
            ),
            "box b: parameter expression.0 is given twice",
        ),
        ({"name": "q", "boxes": []}, "has no boxes"),
        ({"name": "q", "boxes": {}}, "'boxes' must be a list"),
        ({"name": "q", "boxes": [1]}, "box #0 must be an object"),
        ({"name": "q", "boxes": [], "x": 1}, "unknown keys"),
        ({"boxes": []}, "query name"),
        ("<query/>", "query name"),
        ("<queries name='q'/>", "<query> root"),
        ("<query name='q'><stream/></query>", "unexpected element <stream>"),
        (
            "<query name='q'><box name='b' type='map'><inn/></box></query>",
            "unexpected element <inn>",
        ),
        (
            "<query name='q'><box name='b' type='map'><in stream='a'/><out stream='b'/>"
            "<param name='expression.0'/></box></query>",
            "has no value",
        ),
        (
            "<query name='q'><box name='b' type='union'><input port='1' stream='a'/>"
            "<input stream='c'/><out stream='b'/></box></query>",
            "numeric port",
        ),
        (
            "<query name='q'><box name='b' type='union'><input port='1' stream='a'/>"
            "<input port='1' stream='c'/><out stream='b'/></box></query>",
            "same port",
        ),
        ("<!DOCTYPE q><query name='q'/>", "DOCTYPE"),
        ("nonsense", "neither XML nor valid JSON"),
    ],
)
def test_bad_queries_are_refused(source: object, fragment: str) -> None:
    with pytest.raises(QueryError) as info:
        parse_query(source)  # type: ignore[arg-type]
    assert fragment in info.value.message


def test_duplicate_box_names_and_producers() -> None:
    boxes = [
        {"name": "a", "type": "map", "inputs": ["s"], "outputs": ["t"]},
        {"name": "a", "type": "map", "inputs": ["s"], "outputs": ["u"]},
    ]
    with pytest.raises(QueryError, match="two boxes are named a"):
        parse_query({"name": "q", "boxes": boxes})
    boxes[1]["name"] = "b"
    boxes[1]["outputs"] = ["t"]
    with pytest.raises(QueryError, match="stream t is produced by both box a and box b"):
        parse_query({"name": "q", "boxes": boxes})


def test_cycles_are_refused_naming_the_boxes() -> None:
    boxes = [
        {"name": "src", "type": "map", "inputs": ["in"], "outputs": ["s0"]},
        {"name": "x", "type": "union", "inputs": ["s0", "s3"], "outputs": ["s1"]},
        {"name": "y", "type": "map", "inputs": ["s1"], "outputs": ["s2"]},
        {"name": "z", "type": "map", "inputs": ["s2"], "outputs": ["s3"]},
    ]
    with pytest.raises(QueryError) as info:
        parse_query({"name": "loopy", "boxes": boxes})
    message = info.value.message
    assert message.startswith("query loopy: boxes form a cycle: ")
    assert all(name in message for name in ("x", "y", "z"))
    assert "src" not in message.split(": ", 1)[1].replace("cycle", "")


def test_a_box_reading_its_own_output_is_a_cycle() -> None:
    boxes = [{"name": "me", "type": "union", "inputs": ["a", "b"], "outputs": ["b"]}]
    with pytest.raises(QueryError, match="cycle: me -> me"):
        parse_query({"name": "q", "boxes": boxes})


def test_topological_order_follows_the_arrows() -> None:
    query = parse_query(
        {
            "name": "q",
            "boxes": [
                {"name": "last", "type": "map", "inputs": ["mid"], "outputs": ["out"]},
                {"name": "first", "type": "map", "inputs": ["in"], "outputs": ["mid"]},
                {"name": "other", "type": "map", "inputs": ["in"], "outputs": ["side"]},
            ],
        }
    )
    assert [b.name for b in topological_order(query)] == ["first", "other", "last"]


@settings(deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_query_error(text: str) -> None:
    with contextlib.suppress(QueryError):
        parse_query(text)


@settings(deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_query_error(data: bytes) -> None:
    with contextlib.suppress(QueryError):
        parse_query(data)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(deadline=None)
@given(
    st.fixed_dictionaries(
        {"name": _json_values | st.just("q")},
        optional={
            "boxes": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "name": _json_values | st.just("b"),
                        "type": _json_values | st.sampled_from(["map", "union", "join"]),
                        "inputs": _json_values | st.just(["a"]),
                        "outputs": _json_values | st.just(["b"]),
                        "params": _json_values,
                        "node": _json_values,
                    },
                ),
                max_size=3,
            )
        },
    )
)
def test_arbitrary_json_shapes_raise_only_query_error(data: dict[str, object]) -> None:
    try:
        query = parse_query(data)
    except QueryError:
        return
    assert parse_query(query_to_dict(query)) == query
