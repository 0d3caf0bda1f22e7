"""A query's availability bound (Borealis DPC): JSON, Borealis XML, fragments, round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peer.errors import QueryError
from peer.model.borealis import parse_document
from peer.model.fragments import fragment_query
from peer.model.query import parse_query, query_to_dict

UNION: dict[str, Any] = {
    "name": "tolls",
    "boxes": [
        {"name": "u", "type": "union", "inputs": ["a", "g"], "outputs": ["both"]},
        {
            "name": "f",
            "type": "filter",
            "inputs": ["both"],
            "outputs": ["big"],
            "params": {"expression.0": "v > 1"},
        },
    ],
}
XML = """
<query name="tolls">
  <parameter name="availability-bound" value="{bound}"/>
  <box name="u" type="union"><in stream="a"/><in stream="g"/><out stream="both"/></box>
  <box name="f" type="filter"><in stream="both"/><out stream="big"/>
    <parameter name="expression.0" value="v &gt; 1"/></box>
</query>
"""


def test_absent_bound_is_none_and_is_not_written_back() -> None:
    query = parse_query(UNION)
    assert query.availability_bound_s is None
    assert "availability_bound" not in query_to_dict(query)
    assert (
        parse_query(XML.replace('<parameter name="availability-bound" value="{bound}"/>', ""))
        == query
    )


@pytest.mark.parametrize("given", [5, 5.0, "5", 0.5])
def test_json_and_xml_give_the_same_bound(given: object) -> None:
    from_json = parse_query({**UNION, "availability_bound": given})
    from_xml = parse_query(XML.format(bound=given))
    assert from_json.availability_bound_s == float(str(given))
    assert from_json == from_xml
    # it survives the catalog's and the link's JSON form
    again = parse_query(json.dumps(query_to_dict(from_json)))
    assert again == from_json and again.availability_bound_s == float(str(given))


@pytest.mark.parametrize("bad", [0, -1, "soon", "nan", "inf", True, [5], 86_401])
def test_a_bad_bound_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(QueryError, match="availability bound"):
        parse_query({**UNION, "availability_bound": bad})


def test_xml_query_parameters_other_than_the_bound_are_refused() -> None:
    text = XML.format(bound=5).replace("availability-bound", "slack")
    with pytest.raises(QueryError, match="unknown query parameter 'slack'"):
        parse_query(text)
    twice = XML.format(bound=5).replace(
        "<box", '<parameter name="availability-bound" value="2"/><box', 1
    )
    with pytest.raises(QueryError, match="given twice"):
        parse_query(twice)
    with pytest.raises(QueryError, match="availability bound"):
        parse_query(XML.format(bound="x"))


def test_a_borealis_document_carries_the_bound_to_its_query() -> None:
    doc = f"""<borealis>
      <schema name="s"><field name="v" type="int"/></schema>
      <input stream="a" schema="s"/><input stream="g" schema="s"/>
      {XML.format(bound=7)}
    </borealis>"""
    (query,) = parse_document(doc).queries
    assert query.availability_bound_s == 7.0


def test_every_fragment_keeps_the_query_bound() -> None:
    query = parse_query({**UNION, "availability_bound": 3})
    sites = {"a": "acme", "g": "globex", "both": "acme"}
    fragments = fragment_query(
        query,
        default=lambda stream: sites[stream],
        resolve=lambda node, _stream: node,
    )
    assert fragments and all(f.as_query().availability_bound_s == 3.0 for f in fragments)
    split = parse_query(
        {
            **UNION,
            "availability_bound": 3,
            "boxes": [UNION["boxes"][0], {**UNION["boxes"][1], "node": "globex"}],
        }
    )
    parts = fragment_query(split, default=lambda s: sites[s], resolve=lambda n, _s: n)
    assert len(parts) == 2
    assert [p.as_query().availability_bound_s for p in parts] == [3.0, 3.0]
