"""peer push's JSONL/CSV reading: types by schema, errors naming line and field."""

from __future__ import annotations

from typing import Any

import pytest

from peer.cli.ingest import chunks, read_columns, to_jsonl
from peer.errors import TupleError
from peer.model.schema import parse_schema

SCHEMA = parse_schema(
    {
        "name": "s",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "v", "type": "double"},
            {"name": "ok", "type": "bool"},
            {"name": "name", "type": "string"},
            {"name": "t", "type": "timestamp"},
        ],
    }
)


def test_jsonl_and_csv_give_the_same_columns() -> None:
    jsonl = [
        '{"id": 1, "v": 2.5, "ok": true, "name": "a", "t": "2024-01-01T00:00:01Z"}',
        "",
        '{"id": 2, "v": 3, "ok": false, "name": "b", "t": 1704067202.5}',
    ]
    csv_text = ["id,v,ok,name,t", "1,2.5,true,a,2024-01-01T00:00:01", "2,3,false,b,1704067202.5"]
    a = read_columns(jsonl, "jsonl", SCHEMA)
    b = read_columns(csv_text, "csv", SCHEMA)
    assert a == b
    assert a["t"] == [1704067201_000000, 1704067202_500000]
    assert a["v"] == [2.5, 3.0]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"id": "x", "v": 1, "ok": true, "name": "a", "t": 0}', "id"),
        ('{"id": 1.5, "v": 1, "ok": true, "name": "a", "t": 0}', "id"),
        ('{"id": 3000000000, "v": 1, "ok": true, "name": "a", "t": 0}', "id"),
        ('{"id": 1, "v": true, "ok": true, "name": "a", "t": 0}', "v"),
        ('{"id": 1, "v": 1, "ok": 1, "name": "a", "t": 0}', "ok"),
        ('{"id": 1, "v": 1, "ok": true, "name": 5, "t": 0}', "name"),
        ('{"id": 1, "v": 1, "ok": true, "name": "a", "t": "yesterday"}', "t"),
        ('{"id": 1, "v": 1, "ok": true, "name": "a"}', "t"),
        ('{"id": 1, "v": 1, "ok": true, "name": "a", "t": 0, "zz": 1}', "zz"),
    ],
)
def test_bad_value_names_line_and_field(line: str, field: str) -> None:
    good = '{"id": 1, "v": 1, "ok": true, "name": "a", "t": 0}'
    with pytest.raises(TupleError) as info:
        read_columns([good, line], "jsonl", SCHEMA)
    assert info.value.details["line"] == 2
    assert info.value.details["field"] == field
    assert "line 2" in info.value.message and field in info.value.message


def test_not_json_names_line() -> None:
    with pytest.raises(TupleError, match="line 1"):
        read_columns(["{nope"], "jsonl", SCHEMA)


def test_csv_ragged_row() -> None:
    with pytest.raises(TupleError, match="line 2"):
        read_columns(["id,v", "1"], "csv", SCHEMA)


def test_chunks_and_jsonl_output() -> None:
    cols: dict[str, list[Any]] = {"a": list(range(5)), "b": list("abcde")}
    parts = list(chunks(cols, 2))
    assert [p["a"] for p in parts] == [[0, 1], [2, 3], [4]]
    text = to_jsonl([{"id": 1, "t": 1_000_000}], SCHEMA)
    assert text == '{"id": 1, "t": "1970-01-01T00:00:01+00:00"}\n'
