"""Borealis' box parameters and query-file shapes (peer.model.borealis), without a JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.errors import QueryError
from peer.model.borealis import deployed, is_document, parse_deploy, parse_document
from peer.model.plan import AggregateSpec, UnionSpec, check_query
from peer.model.query import parse_query
from peer.model.schema import Schema, parse_schema

CORPUS = Path(__file__).parent.parent / "data" / "borealis"
PACKETS = parse_schema(
    {
        "name": "packets",
        "fields": [
            {"name": "time", "type": "int"},
            {"name": "source", "type": "int"},
            {"name": "size", "type": "int", "nullable": True},
        ],
    }
)
AGG = {
    "aggregate-function.0": "sum(size)",
    "window-size-by": "VALUES",
    "window-size": "10",
    "advance": "5",
    "order-by": "FIELD",
    "order-on-field": "time",
}


def check(box_type: str, params: dict[str, str], schema: Schema = PACKETS) -> object:
    query = {
        "name": "q",
        "boxes": [
            {"name": "b", "type": box_type, "inputs": ["in"], "outputs": ["out"], "params": params}
        ],
    }
    return check_query(parse_query(query), {"in": schema}).boxes[0].spec


def test_borealis_aggregate_parameters_are_read_with_their_meaning() -> None:
    spec = check(
        "aggregate",
        {
            **AGG,
            "timeout": "-1",
            "independent-window-alignment": "1",
            "drop-empty-outputs": "true",
            "drop-mode": "0",
            "last-agg": "1",
        },
    )
    assert isinstance(spec, AggregateSpec)
    assert (spec.window_by, spec.order_on, spec.window_size, spec.advance) == (
        "VALUES",
        "time",
        10,
        5,
    )
    # TUPLENUM: tuples counted in arrival order; order-on-field is not read, as in Borealis.
    spec = check(
        "aggregate",
        {**AGG, "window-size-by": "TUPLES", "order-by": "tuplenum", "order-on-field": "nope"},
    )
    assert isinstance(spec, AggregateSpec) and spec.order_on is None
    # FIELD on count windows orders by the field.
    spec = check("aggregate", {**AGG, "window-size-by": "TUPLES", "window-size": "5"})
    assert isinstance(spec, AggregateSpec) and spec.order_on == "time"


@pytest.mark.parametrize(
    ("params", "param", "fragment"),
    [
        ({**AGG, "order-by": "ROWS"}, "order-by", "must be FIELD or TUPLENUM"),
        ({**AGG, "timeout": "5"}, "timeout", "5 is not supported: a timeout closes windows"),
        ({**AGG, "timeout": "0"}, "timeout", "wall-clock"),
        ({**AGG, "independent-window-alignment": "0"}, "independent-window-alignment", "first"),
        ({**AGG, "drop-empty-outputs": "0"}, "drop-empty-outputs", "no tuple fell in"),
        ({**AGG, "drop-mode": "1"}, "drop-mode", "sheds no load"),
        (
            {**AGG, "window-size-by": "TUPLES", "order-on-field": ""},
            "order-on-field",
            "required for order-by FIELD",
        ),
    ],
)
def test_borealis_values_fedstream_cannot_honour_are_refused_by_name(
    params: dict[str, str], param: str, fragment: str
) -> None:
    with pytest.raises(QueryError) as info:
        check("aggregate", params)
    assert info.value.details["parameter"] == param
    assert f"parameter {param}: " in info.value.message
    assert fragment in info.value.message


def test_join_timeout_follows_borealis() -> None:
    right = parse_schema({"name": "r", "fields": [{"name": "time", "type": "int"}]})
    params = {
        "predicate": "left.source = right.time",
        "left-order-by": "VALUES",
        "left-order-on-field": "time",
        "left-buffer-size": "2",
        "right-order-by": "VALUES",
        "right-order-on-field": "time",
        "right-buffer-size": "2",
    }

    def join(extra: dict[str, str]) -> object:
        query = {
            "name": "j",
            "boxes": [
                {
                    "name": "b",
                    "type": "join",
                    "inputs": ["l", "r"],
                    "outputs": ["o"],
                    "params": {**params, **extra},
                }
            ],
        }
        return check_query(parse_query(query), {"l": PACKETS, "r": right})

    join({"timeout": "-1"})
    with pytest.raises(QueryError, match="parameter timeout: 30 is not supported"):
        join({"timeout": "30"})


def test_load_shedding_boxes_pass_everything_at_rate_zero_and_refuse_more() -> None:
    assert isinstance(check("random_drop", {"drop_rate": "0", "max_batch_size": "100"}), UnionSpec)
    spec = check(
        "window_drop",
        {"drop": "0", "window-size": "10", "window-slide": "5", "window-size-by": "VALUES"},
    )
    assert isinstance(spec, UnionSpec)
    with pytest.raises(QueryError, match=r"parameter drop_rate: 0\.3 is not supported"):
        check("random_drop", {"drop_rate": "0.3"})
    with pytest.raises(QueryError, match="parameter window-slide: must not exceed window-size"):
        check("window_drop", {"window-size": "5", "window-slide": "6"})
    with pytest.raises(QueryError, match="unknown parameter for a box of type random_drop"):
        check("random_drop", {"rate": "0"})


def test_a_whole_borealis_document_and_its_deploy_file() -> None:
    text = (CORPUS / "stock.xml").read_text()
    assert is_document(text)
    document = parse_document(text)
    assert [s.name for s in document.schemas] == ["StockType_USD", "StockType_BR"]
    assert document.inputs == (("Stock_USD", "StockType_USD"),)
    assert [q.name for q in document.queries] == ["USQuoteToCanadian", "CADQuoteToBrazilian"]
    assert document.schemas[0].fields[3].nullable
    placed = parse_deploy(
        '<?xml version="1.0"?>\n<!DOCTYPE borealis SYSTEM "borealis.dtd">\n<deploy>'
        '<publish stream="Stock_USD" node="127.0.0.1:15000"/>'
        '<node endpoint="127.0.0.1:15000" query="USQuoteToCanadian"/></deploy>'
    )
    assert placed == {"USQuoteToCanadian": "127.0.0.1:15000"}
    first, second = (deployed(q, placed) for q in document.queries)
    assert {b.node for b in first.boxes} == {"127.0.0.1:15000"}
    assert {b.node for b in second.boxes} == {None}
    # The server's create_query takes one query; a document with several says where to go.
    with pytest.raises(QueryError, match="peer query submit FILE"):
        parse_query(text)
    assert not is_document((CORPUS / "medusa_findmrx.xml").read_text())


@pytest.mark.parametrize(
    "text",
    [
        '<!DOCTYPE borealis [<!ENTITY x "y">]><borealis/>',
        '<!DOCTYPE borealis SYSTEM "b.dtd" [<!ELEMENT a ANY>]><borealis/>',
        '<!DOCTYPE a SYSTEM "a.dtd"><!DOCTYPE b SYSTEM "b.dtd"><borealis/>',
    ],
)
def test_only_an_external_doctype_is_allowed(text: str) -> None:
    with pytest.raises(QueryError, match="ENTITY declarations or a DOCTYPE"):
        parse_document(text)
