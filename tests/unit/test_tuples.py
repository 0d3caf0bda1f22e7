"""Pushed batches: accepted whole as a table of the schema's Arrow types, or refused whole with
a TupleError naming the line and the field."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from peer.errors import TupleError
from peer.model.schema import TYPES, Field, Schema, to_arrow_schema
from peer.model.tuples import batch_from_wire, batch_to_wire, rows_from_table

ALL = Schema(
    "all",
    (
        Field("i", "int"),
        Field("l", "long"),
        Field("d", "double"),
        Field("b", "bool"),
        Field("s", "string", 8),
        Field("t", "timestamp"),
    ),
)
COLUMNS: dict[str, list[Any]] = {
    "i": [1, -2, 2**31 - 1],
    "l": [2**63 - 1, 0, -(2**63)],
    "d": [1.5, 2, float("inf")],
    "b": [True, False, True],
    "s": ["a", "", "ünïcödé"],
    "t": [0, 1_700_000_000_000_000, -1],
}


def rows_of(columns: dict[str, list[Any]]) -> list[dict[str, Any]]:
    n = len(next(iter(columns.values())))
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_columns_rows_and_arrow_give_the_same_table() -> None:
    table = batch_from_wire(ALL, {"columns": COLUMNS})
    assert table.schema == to_arrow_schema(ALL)
    assert table.num_rows == 3
    assert batch_from_wire(ALL, {"rows": rows_of(COLUMNS)}).equals(table)
    assert batch_from_wire(ALL, {"arrow": arrow_bytes(table)}).equals(table)
    wire = batch_to_wire(table)["columns"]
    assert wire["t"] == COLUMNS["t"]
    assert wire["i"] == COLUMNS["i"]
    assert wire["d"] == [1.5, 2.0, float("inf")]


def test_nan_is_a_double() -> None:
    schema = Schema("n", (Field("d", "double"),))
    table = batch_from_wire(schema, {"columns": {"d": [float("nan"), 1]}})
    assert math.isnan(batch_to_wire(table)["columns"]["d"][0])


def test_arrow_payload_is_converted_to_the_schema_types() -> None:
    loose = pa.table(
        {
            "s": pa.array(["x"], pa.large_string()),
            "i": pa.array([7], pa.int64()),
            "l": pa.array([8], pa.int16()),
            "d": pa.array([1.5], pa.float32()),
            "b": pa.array([True]),
            "t": pa.array([5], pa.timestamp("ms")),
        }
    )
    table = batch_from_wire(ALL, {"arrow": arrow_bytes(loose)})
    assert table.schema == to_arrow_schema(ALL)
    assert rows_from_table(table) == [{"i": 7, "l": 8, "d": 1.5, "b": True, "s": "x", "t": 5000}]


def test_timestamps_accept_micros_msgpack_and_datetimes() -> None:
    schema = Schema("ts", (Field("t", "timestamp"),))
    values = [
        1_000_001,
        msgpack.Timestamp(1, 1_000),
        dt.datetime(1970, 1, 1, 0, 0, 1, 3),
        dt.datetime(1970, 1, 1, 2, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    ]
    table = batch_from_wire(schema, {"columns": {"t": values}})
    assert batch_to_wire(table) == {"columns": {"t": [1_000_001, 1_000_001, 1_000_003, 1_000_000]}}
    naive = batch_from_wire(schema, {"columns": {"t": [dt.datetime(2024, 1, 1)]}})
    assert rows_from_table(naive) == [{"t": 1_704_067_200_000_000}]


def test_integral_floats_are_ints_and_ints_are_doubles() -> None:
    schema = Schema("n", (Field("i", "int"), Field("d", "double")))
    table = batch_from_wire(schema, {"columns": {"i": [1.0, 2], "d": [1, 2**63 - 1]}})
    assert batch_to_wire(table) == {"columns": {"i": [1, 2], "d": [1.0, float(2**63 - 1)]}}


def test_empty_batch_is_an_empty_table() -> None:
    table = batch_from_wire(ALL, {"columns": {k: [] for k in COLUMNS}})
    assert table.num_rows == 0
    assert table.schema == to_arrow_schema(ALL)
    assert batch_from_wire(ALL, {"rows": []}).num_rows == 0


def bad(column: str, line: int, value: Any) -> dict[str, list[Any]]:
    columns = {k: list(v) for k, v in COLUMNS.items()}
    columns[column][line] = value
    return columns


@pytest.mark.parametrize(
    ("field", "line", "value", "fragment"),
    [
        ("i", 1, "3", "expected int, got str '3'"),
        ("i", 2, 1.5, "has a fraction"),
        ("i", 0, True, "expected int, got bool"),
        ("i", 1, 2**31, "out of range for int"),
        ("i", 1, float("nan"), "expected int"),
        ("l", 2, 2**63, "out of range for long"),
        ("l", 0, -(2**63) - 1, "out of range for long"),
        ("l", 0, 1e300, "out of range for long"),
        ("d", 1, "1.5", "expected double, got str"),
        ("d", 1, True, "expected double, got bool"),
        ("d", 0, 10**400, "out of range for double"),
        ("b", 2, 1, "expected bool, got int"),
        ("b", 0, "true", "expected bool, got str"),
        ("s", 1, 5, "expected string, got int"),
        ("s", 1, b"x", "expected string, got bytes"),
        ("s", 2, "\ud800", "lone surrogate"),
        ("s", 2, "123456789", "longer than 8 characters"),
        ("t", 1, "2024-01-01", "expected timestamp"),
        ("t", 1, True, "expected timestamp"),
        ("t", 2, 2**63, "out of range"),
        ("t", 1, 1.5, "expected timestamp"),
        ("i", 2, None, "the field is not nullable"),
        ("s", 0, None, "the field is not nullable"),
        ("t", 1, None, "the field is not nullable"),
        ("d", 2, None, "the field is not nullable"),
        ("b", 0, [True], "expected bool, got list"),
    ],
)
def test_bad_values_name_line_and_field(field: str, line: int, value: Any, fragment: str) -> None:
    for payload in (
        {"columns": bad(field, line, value)},
        {"rows": rows_of(bad(field, line, value))},
    ):
        with pytest.raises(TupleError) as info:
            batch_from_wire(ALL, payload, stream="cars")
        assert info.value.message.startswith(f"stream cars, tuple {line}, field '{field}': ")
        assert fragment in info.value.message
        assert info.value.details == {"stream": "cars", "tuple": line, "field": field}


def test_without_a_stream_the_schema_is_named() -> None:
    with pytest.raises(TupleError, match=r"^schema all, tuple 0, field 'i'"):
        batch_from_wire(ALL, {"columns": bad("i", 0, "x")})


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"columns": {k: v for k, v in COLUMNS.items() if k != "b"}}, "field 'b' is missing"),
        ({"columns": {**COLUMNS, "zz": [1, 2, 3]}}, "unknown field 'zz'"),
        ({"columns": {**COLUMNS, "s": ["a"]}}, "field 's' has 1 values but field 'i' has 3"),
        ({"columns": {**COLUMNS, "s": "abc"}}, "field 's' must be a list"),
        ({"columns": [1]}, "'columns' must map"),
        ({"rows": [{**rows_of(COLUMNS)[0], "zz": 1}]}, "tuple 0: unknown field 'zz'"),
        ({"rows": [rows_of(COLUMNS)[0], {"i": 1}]}, "tuple 1: field 'l' is missing"),
        ({"rows": [rows_of(COLUMNS)[0], 5]}, "tuple 1: a tuple must be an object"),
        ({"rows": {}}, "'rows' must be a list"),
        ({"tuples": []}, "unknown batch encoding 'tuples'"),
        ({}, "a batch is one of"),
        ({"rows": [], "columns": {}}, "a batch is one of"),
        ({"arrow": b"garbage"}, "does not decode"),
        ({"arrow": "text"}, "must be Arrow IPC stream bytes"),
    ],
)
def test_malformed_batches_are_refused(payload: dict[str, Any], fragment: str) -> None:
    with pytest.raises(TupleError) as info:
        batch_from_wire(ALL, payload, stream="cars")
    assert fragment in info.value.message


def test_arrow_payload_errors_name_the_field() -> None:
    table = batch_from_wire(ALL, {"columns": COLUMNS})
    with_null = table.set_column(0, pa.field("i", pa.int32()), pa.array([1, None, 3], pa.int32()))
    with pytest.raises(TupleError, match="tuple 1, field 'i': is nil, but the field is not"):
        batch_from_wire(ALL, {"arrow": arrow_bytes(with_null)})
    too_big = table.set_column(0, "i", pa.array([1, 2**40, 3], pa.int64()))
    with pytest.raises(TupleError, match=r"tuple 1, field 'i': .* out of range for int"):
        batch_from_wire(ALL, {"arrow": arrow_bytes(too_big)})
    wrong = table.set_column(3, "b", pa.array(["x", "y", "z"]))
    with pytest.raises(TupleError, match="tuple 0, field 'b': expected bool"):
        batch_from_wire(ALL, {"arrow": arrow_bytes(wrong)})
    missing = table.remove_column(1)
    with pytest.raises(TupleError, match="field 'l' is missing"):
        batch_from_wire(ALL, {"arrow": arrow_bytes(missing)})
    extra = table.append_column("zz", pa.array([1, 2, 3]))
    with pytest.raises(TupleError, match="unknown field 'zz'"):
        batch_from_wire(ALL, {"arrow": arrow_bytes(extra)})


def test_max_rows() -> None:
    schema = Schema("one", (Field("x", "int"),))
    assert batch_from_wire(schema, {"columns": {"x": [1] * 10}}, max_rows=10).num_rows == 10
    with pytest.raises(TupleError, match="more than 10 tuples"):
        batch_from_wire(schema, {"columns": {"x": [1] * 11}}, max_rows=10)
    with pytest.raises(TupleError, match="more than 10 tuples"):
        batch_from_wire(schema, {"rows": [{"x": 1}] * 11}, max_rows=10)
    table = pa.table({"x": pa.array([1] * 11, pa.int32())})
    with pytest.raises(TupleError, match="more than 10 tuples"):
        batch_from_wire(schema, {"arrow": arrow_bytes(table)}, max_rows=10)


# -- properties ----------------------------------------------------------------------------------

_VALUES = {
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "string": st.text(max_size=20),
    "timestamp": st.integers(-(2**62), 2**62),
}
# A value of the wrong kind for each type, never acceptable.
_WRONG = {
    "int": st.sampled_from(["1", True, 2**31, 0.5, None, b"1"]),
    "long": st.sampled_from(["1", False, 2**63, -0.5, None]),
    "double": st.sampled_from(["1.0", True, None, [1.0]]),
    "bool": st.sampled_from([1, 0, "true", None]),
    "string": st.sampled_from([1, b"x", None, True, 1.5]),
    "timestamp": st.sampled_from(["2024-01-01", 1.5, True, None, 2**63]),
}


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=6))
    return Schema("gen", tuple(Field(f"f{i}", t) for i, t in enumerate(types)))


@st.composite
def batches(draw: st.DrawFn) -> tuple[Schema, list[dict[str, Any]]]:
    schema = draw(schemas())
    row = st.fixed_dictionaries({f.name: _VALUES[f.type] for f in schema.fields})
    return schema, draw(st.lists(row, max_size=20))


@settings(deadline=None)
@given(batches())
def test_valid_batches_round_trip(batch: tuple[Schema, list[dict[str, Any]]]) -> None:
    schema, rows = batch
    table = batch_from_wire(schema, {"rows": rows})
    assert table.schema == to_arrow_schema(schema)
    columns = {f.name: [r[f.name] for r in rows] for f in schema.fields}
    assert batch_to_wire(table) == {"columns": columns}
    assert rows_from_table(table) == rows
    assert batch_from_wire(schema, batch_to_wire(table)).equals(table)
    assert batch_from_wire(schema, {"arrow": arrow_bytes(table)}).equals(table)


@settings(deadline=None)
@given(batches(), st.data())
def test_corrupted_batches_name_line_and_field(
    batch: tuple[Schema, list[dict[str, Any]]], data: st.DataObject
) -> None:
    schema, rows = batch
    assume(rows)
    line = data.draw(st.integers(0, len(rows) - 1))
    field = data.draw(st.sampled_from(schema.fields))
    rows[line] = {**rows[line], field.name: data.draw(_WRONG[field.type])}
    columns = {f.name: [r[f.name] for r in rows] for f in schema.fields}
    for payload in ({"rows": rows}, {"columns": columns}):
        with pytest.raises(TupleError) as info:
            batch_from_wire(schema, payload, stream="gen")
        # The first bad value is the corrupted one: every other value is valid.
        assert info.value.details == {"stream": "gen", "tuple": line, "field": field.name}


def test_rows_may_be_any_mapping() -> None:
    from types import MappingProxyType

    schema = Schema("one", (Field("x", "int"),))
    table = batch_from_wire(schema, {"rows": [MappingProxyType({"x": 1})]})
    assert rows_from_table(table) == [{"x": 1}]


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_arrow_bytes_raise_only_tuple_error(data: bytes) -> None:
    with contextlib.suppress(TupleError):
        batch_from_wire(ALL, {"arrow": data})


_VALID_IPC = arrow_bytes(
    pa.table({k: pa.array(v, to_arrow_schema(ALL).field(k).type) for k, v in COLUMNS.items()})
)


@settings(deadline=None, max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, len(_VALID_IPC) - 1), st.integers(0, 255)), min_size=1, max_size=4
    )
)
def test_corrupted_arrow_bytes_raise_only_tuple_error(flips: list[tuple[int, int]]) -> None:
    data = bytearray(_VALID_IPC)
    for position, value in flips:
        data[position] = value
    with contextlib.suppress(TupleError):
        table = batch_from_wire(ALL, {"arrow": bytes(data)})
        assert table.schema == to_arrow_schema(ALL)
