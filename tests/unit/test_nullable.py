"""Nullable fields: declared in JSON and XML, taken on the wire and from text, derived by boxes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from peer.cli.ingest import read_columns
from peer.errors import QueryError, TupleError
from peer.model.plan import check_query
from peer.model.query import parse_query
from peer.model.schema import parse_schema, to_arrow_schema
from peer.model.tuples import arrow_bytes, batch_from_wire

JSON = {
    "name": "m",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "v", "type": "double", "nullable": True},
        {"name": "t", "type": "timestamp", "nullable": True},
        {"name": "s", "type": "string", "size": 3, "nullable": True},
    ],
}
XML = """<schema name="m">
  <field name="id" type="int"/>
  <field name="v" type="double" nullable="true"/>
  <field name="t" type="timestamp" nullable="1"/>
  <field name="s" type="string" size="3" nullable="true"/>
</schema>"""


def test_json_and_xml_declare_the_same_nullable_fields() -> None:
    schema = parse_schema(JSON)
    assert parse_schema(XML) == schema
    assert [f.nullable for f in schema.fields] == [False, True, True, True]
    assert parse_schema(schema.to_dict()) == schema
    assert "nullable" not in schema.to_dict()["fields"][0]
    assert [f.nullable for f in to_arrow_schema(schema)] == [False, True, True, True]


@pytest.mark.parametrize("kind", ["columns", "rows", "arrow"])
def test_nil_is_taken_by_nullable_fields_and_read_back_as_null(kind: str) -> None:
    schema = parse_schema(JSON)
    columns: dict[str, list[Any]] = {
        "id": [1, 2, 3],
        "v": [None, 1.5, None],
        "t": [None, 7, None],
        "s": ["ab", None, None],
    }
    payload: dict[str, Any]
    if kind == "columns":
        payload = {"columns": columns}
    elif kind == "rows":
        payload = {
            "rows": [
                dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)
            ]
        }
    else:
        table = pa.table(columns, schema=to_arrow_schema(schema))
        payload = {"arrow": arrow_bytes(table)}
    table = batch_from_wire(schema, payload, stream="m")
    assert table.column("v").to_pylist() == [None, 1.5, None]
    assert table.column("s").null_count == 2
    assert table.column("t").null_count == 2


def test_nil_in_a_field_that_is_not_nullable_is_refused_naming_it() -> None:
    schema = parse_schema(JSON)
    columns = {"id": [1, None], "v": [None, None], "t": [None, None], "s": [None, None]}
    with pytest.raises(TupleError) as info:
        batch_from_wire(schema, {"columns": columns}, stream="m")
    assert info.value.details == {"stream": "m", "field": "id", "tuple": 1}
    assert "not nullable" in info.value.message


def test_text_formats_read_null() -> None:
    schema = parse_schema(JSON)
    got = read_columns(['{"id": 1, "v": null, "t": null, "s": null}'], "jsonl", schema)
    assert got == {"id": [1], "v": [None], "t": [None], "s": [None]}
    got = read_columns(["id,v,t,s", "1,,,"], "csv", schema)
    assert got == {"id": [1], "v": [None], "t": [None], "s": [None]}
    with pytest.raises(TupleError, match=r"line 1, field 'id' \(int\): missing value"):
        read_columns(['{"id": null, "v": 1, "t": 1, "s": "a"}'], "jsonl", schema)


def _query(box_type: str, params: dict[str, str]) -> dict[str, Any]:
    return {
        "name": "q",
        "boxes": [
            {"name": "b", "type": box_type, "inputs": ["in"], "outputs": ["out"], "params": params}
        ],
    }


def test_boxes_derive_nullability() -> None:
    schema = parse_schema(JSON)
    checked = check_query(
        parse_query(
            _query(
                "map",
                {
                    "expression.0": "id + 1",
                    "output-field-name.0": "a",
                    "expression.1": "v * 2",
                    "output-field-name.1": "b",
                    "expression.2": "CASE WHEN id > 1 THEN 1 END",
                    "output-field-name.2": "c",
                    "expression.3": "coalesce(s, 'x')",
                    "output-field-name.3": "d",
                },
            )
        ),
        {"in": schema},
    )
    assert [f.nullable for f in checked.stream_schemas["out"].fields] == [False, True, True, True]
    checked = check_query(
        parse_query(
            _query(
                "aggregate",
                {
                    "aggregate-function.0": "count(v)",
                    "aggregate-function.1": "sum(v)",
                    "aggregate-function.2": "max(id)",
                    "window-size": "5",
                    "order-on-field": "id",
                },
            )
        ),
        {"in": schema},
    )
    fields = checked.stream_schemas["out"].fields
    assert [(f.name, f.nullable) for f in fields] == [
        ("window_start", False),
        ("window_end", False),
        ("agg_0", False),
        ("agg_1", True),
        ("agg_2", False),
    ]


def test_a_nullable_result_does_not_fit_an_existing_non_nullable_stream() -> None:
    schema = parse_schema(JSON)
    strict = parse_schema({"name": "o", "fields": [{"name": "b", "type": "double"}]})
    query = _query("map", {"expression.0": "v * 2", "output-field-name.0": "b"})
    with pytest.raises(QueryError, match="field 'b' is not nullable, but the box may produce NULL"):
        check_query(parse_query(query), {"in": schema, "out": strict})
