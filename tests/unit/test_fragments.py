"""Splitting queries into fragments (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from peer.errors import QueryError
from peer.model.fragments import fragment_query, topological_boxes
from peer.model.query import parse_query


def box(
    name: str, kind: str, inputs: list[str], outputs: list[str], node: str | None = None
) -> dict[str, Any]:
    params: dict[str, str] = {"expression.0": "x > 0"} if kind == "filter" else {}
    made: dict[str, Any] = {
        "name": name,
        "type": kind,
        "inputs": inputs,
        "outputs": outputs,
        "params": params,
    }
    if node:
        made["node"] = node
    return made


def split(
    boxes: list[dict[str, Any]], default: str = "A"
) -> list[tuple[str, str, list[str], tuple[str, ...], tuple[str, ...]]]:
    query = parse_query({"name": "q", "boxes": boxes})
    fragments = fragment_query(
        query, default=lambda stream: default, resolve=lambda node, stream: node.upper()
    )
    return [(f.name, f.site, [b.name for b in f.boxes], f.inputs, f.outputs) for f in fragments]


def test_an_unsplit_query_keeps_its_name() -> None:
    got = split([box("f", "filter", ["s"], ["a"]), box("g", "filter", ["a"], ["b"])])
    assert got == [("q", "A", ["f", "g"], ("s",), ("a", "b"))]


def test_nodes_split_a_chain_and_boxes_follow_their_upstream() -> None:
    got = split(
        [
            box("f", "filter", ["s"], ["a"], node="a"),
            box("g", "filter", ["a"], ["b"], node="b"),
            box("h", "filter", ["b"], ["c"]),  # follows g to B
            box("i", "filter", ["c"], ["d"], node="c"),
        ]
    )
    assert got == [
        ("q#0", "A", ["f"], ("s",), ("a",)),
        ("q#1", "B", ["g", "h"], ("a",), ("b", "c")),
        ("q#2", "C", ["i"], ("c",), ("d",)),
    ]


def test_boxes_on_sources_go_to_the_default_site_of_their_first_input() -> None:
    query = parse_query(
        {
            "name": "q",
            "boxes": [box("f", "filter", ["s1"], ["a"]), box("g", "filter", ["s2"], ["b"])],
        }
    )
    sites = {"s1": "X", "s2": "Y"}
    fragments = fragment_query(query, default=sites.__getitem__, resolve=lambda n, s: n)
    assert [(f.site, f.inputs) for f in fragments] == [("X", ("s1",)), ("Y", ("s2",))]


def test_a_join_behind_an_aggregate_is_a_fragment_of_its_own() -> None:
    agg = {
        "name": "agg",
        "type": "aggregate",
        "inputs": ["s"],
        "outputs": ["stats"],
        "params": {
            "aggregate-function.0": "count()",
            "window-size": "10",
            "advance": "10",
            "order-on-field": "t",
        },
    }
    join = {
        "name": "j",
        "type": "join",
        "inputs": ["stats", "s"],
        "outputs": ["out"],
        "params": {"predicate": "left.agg_0 > 0"},
    }
    got = split([agg, join])
    assert [(name, boxes, inputs) for name, _, boxes, inputs, _ in got] == [
        ("q#0", ["agg"], ("s",)),
        ("q#1", ["j"], ("stats", "s")),
    ]


def test_topological_order_and_loops() -> None:
    query = parse_query(
        {"name": "q", "boxes": [box("g", "filter", ["a"], ["b"]), box("f", "filter", ["s"], ["a"])]}
    )
    assert [b.name for b in topological_boxes(query)] == ["f", "g"]


def test_fragments_that_feed_each_other_are_refused() -> None:
    with pytest.raises(QueryError, match="loop"):
        split(
            [
                box("f", "filter", ["s"], ["a"], node="a"),
                box("g", "filter", ["a"], ["b"], node="b"),
                box("h", "filter", ["b"], ["c"], node="a"),
                box("u", "union", ["c", "s"], ["d"], node="a"),
                box("k", "filter", ["d"], ["e"], node="b"),
                box("m", "union", ["e", "a"], ["z"], node="a"),
            ]
        )
