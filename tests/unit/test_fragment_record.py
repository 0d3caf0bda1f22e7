"""A fragment's checkpoint record as a one-row table and back (peer.replication.fragment_failover):
round trips, and hostile tables from another peer refused with a ValueError that names what
is malformed."""

from __future__ import annotations

import base64
import subprocess
import sys
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.replication.checkpoint_record import FragmentRecord

names = st.text(max_size=20)
records = st.builds(
    FragmentRecord,
    fragment=st.text(min_size=1, max_size=20),
    definition=st.dictionaries(names, names, max_size=5),
    incarnation=st.text(min_size=1, max_size=20),
    status=st.text(min_size=1, max_size=20),
    batch=st.integers(-(2**63), 2**63 - 1),
    checkpoint=st.binary(max_size=200),
    inputs=st.lists(names, max_size=4).map(tuple),
    outputs=st.lists(names, max_size=4).map(tuple),
)

GOOD: dict[str, Any] = {
    "fragment": "q#1",
    "definition": {"name": "q#1", "boxes": []},
    "incarnation": "inc-7",
    "status": "RUNNING",
    "batch": 3,
    "checkpoint": b"PK\x05\x06" + b"\x00" * 18,
    "inputs": ["s"],
    "outputs": ["a", "b"],
}


def table_of(text: Any, batch: int = 0) -> pa.Table:
    return pa.table(
        {"batch": pa.array([batch], pa.int64()), "record": pa.array([text], pa.string())}
    )


def packed(value: Any) -> pa.Table:
    """A table whose record is ``value`` as msgpack in base64 (as to_table writes it)."""
    return table_of(base64.b64encode(msgpack.packb(value, use_bin_type=True)).decode("ascii"))


def refused(table: pa.Table, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FragmentRecord.from_table(table)


# --------------------------------------------------------------------------- round trips


@settings(max_examples=300)
@given(records)
def test_a_record_round_trips(record: FragmentRecord) -> None:
    table = record.to_table()
    assert table.num_rows == 1
    assert table.schema == pa.schema([("batch", pa.int64()), ("record", pa.string())])
    assert table.column("batch")[0].as_py() == record.batch
    assert FragmentRecord.from_table(table) == record


def test_the_record_column_is_base64_msgpack_of_a_map() -> None:
    record = FragmentRecord.from_table(packed(GOOD))
    text = record.to_table().column("record")[0].as_py()
    assert msgpack.unpackb(base64.b64decode(text, validate=True), raw=False) == GOOD


def test_inputs_and_outputs_default_to_empty() -> None:
    record = FragmentRecord("f", {}, "i", "SETUP", -1, b"")
    assert FragmentRecord.from_table(record.to_table()) == record
    assert record.inputs == record.outputs == ()


def test_a_wider_table_and_a_large_string_column_are_read() -> None:
    text = packed(GOOD).column("record")[0].as_py()
    table = pa.table(
        {
            "record": pa.array([text], pa.large_string()),
            "batch": pa.array([99], pa.int64()),
            "extra": pa.array([1]),
        }
    )
    assert FragmentRecord.from_table(table).batch == 3


# --------------------------------------------------------------------------- hostile tables


def test_no_rows_is_refused() -> None:
    refused(table_of("x").slice(0, 0), "one row with a 'record' column")


def test_two_rows_are_refused() -> None:
    one = packed(GOOD)
    refused(pa.concat_tables([one, one]), "one row with a 'record' column")


def test_a_table_without_a_record_column_is_refused() -> None:
    refused(pa.table({"batch": pa.array([1], pa.int64())}), "one row with a 'record' column")
    refused(pa.table({"Record": packed(GOOD).column("record")}), "'record' column")


@pytest.mark.parametrize(
    "text",
    ["", "not base64!", "abc", "YWJj=", "YW Jj", "YWJj\n", "é", "\x00", "Z" * 5, None],
)
def test_a_record_that_is_not_base64_msgpack_is_refused(text: str | None) -> None:
    refused(table_of(text), "not base64 msgpack")


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array cut short
        b"\x81\xa1a",  # a map cut short
        b"\x01\x02",  # extra data after one value
        b"\xa2\xff\xfe",  # a str that is not UTF-8
        b"\x81\x01\x02",  # a map with an int key
        b"\x81\x90\x01",  # a map with an array key
        b"\xd5\xff\x00\x00",  # a timestamp of a wrong length
        b"\x91" * 100_000 + b"\xc0",  # nested deeper than msgpack's stack
    ],
)
def test_base64_of_bad_msgpack_is_refused(raw: bytes) -> None:
    refused(table_of(base64.b64encode(raw).decode("ascii")), "not base64 msgpack")


@pytest.mark.parametrize("value", [[GOOD], list(GOOD.items()), 7, "record", b"record", None])
def test_msgpack_of_something_other_than_a_map_is_refused(value: Any) -> None:
    refused(packed(value), "not a map")


@pytest.mark.parametrize("key", ["fragment", "incarnation", "status"])
@pytest.mark.parametrize("value", ["", None, b"q#1", 1, ["q#1"], {"q": "1"}])
def test_a_name_that_is_not_a_non_empty_string_is_refused(key: str, value: Any) -> None:
    refused(packed({**GOOD, key: value}), f"{key} must be a non-empty string")


@pytest.mark.parametrize("key", sorted(GOOD))
def test_each_key_missing_is_refused(key: str) -> None:
    rest = {k: v for k, v in GOOD.items() if k != key}
    refused(packed(rest), f"checkpoint record: .*{key}")


@pytest.mark.parametrize("value", [True, False, 1.0, "3", b"3", None, [3], 2**63, 2**64 - 1])
def test_a_batch_that_is_not_an_int64_is_refused(value: Any) -> None:
    refused(packed({**GOOD, "batch": value}), "batch must be an int")


@pytest.mark.parametrize("value", [-(2**63), -1, 0, 2**63 - 1])
def test_a_batch_at_the_ends_of_int64_is_read(value: int) -> None:
    assert FragmentRecord.from_table(packed({**GOOD, "batch": value})).batch == value


@pytest.mark.parametrize("value", ["PK", "", None, 1, [1, 2], {"a": b"x"}])
def test_a_checkpoint_that_is_not_bytes_is_refused(value: Any) -> None:
    refused(packed({**GOOD, "checkpoint": value}), "checkpoint must be bytes")


@pytest.mark.parametrize("value", [[], [["name", "q"]], "q", b"q", None, 1])
def test_a_definition_that_is_not_a_map_is_refused(value: Any) -> None:
    refused(packed({**GOOD, "definition": value}), "definition a map")


def test_a_definition_with_a_non_string_key_is_refused() -> None:
    refused(packed({**GOOD, "definition": {b"name": "q#1"}}), "definition keys must be strings")


@pytest.mark.parametrize("key", ["inputs", "outputs"])
@pytest.mark.parametrize("value", [["s", 1], [None], [b"s"], [["s"]], "s", {"s": "t"}, None])
def test_names_that_are_not_a_list_of_strings_are_refused(key: str, value: Any) -> None:
    refused(packed({**GOOD, key: value}), f"{key} must be a list of names")


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_any_text_is_a_record_or_a_value_error(text: str) -> None:
    try:
        FragmentRecord.from_table(table_of(text))
    except ValueError as exc:
        assert str(exc).startswith("checkpoint record"), exc


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(GOOD)), msgpack_values, max_size=8))
def test_a_record_with_any_values_is_read_whole_or_refused(replaced: dict[str, Any]) -> None:
    """GOOD with some keys of any msgpack value: a record of the declared types or a
    ValueError, never another exception."""
    body = {**GOOD, **replaced}
    try:
        packed_table = packed(body)
    except (OverflowError, TypeError, ValueError):  # msgpack cannot carry it
        return
    try:
        record = FragmentRecord.from_table(packed_table)
    except ValueError as exc:
        assert str(exc).startswith("checkpoint record"), exc
        return
    for text in (record.fragment, record.incarnation, record.status):
        assert isinstance(text, str) and text
    assert type(record.batch) is int and type(record.checkpoint) is bytes
    assert isinstance(record.definition, dict)
    assert all(isinstance(s, str) for s in (*record.inputs, *record.outputs))
    assert FragmentRecord.from_table(record.to_table()) == record


def test_importing_the_module_starts_nothing() -> None:
    code = (
        "import threading, sys\n"
        "import peer.replication.fragment_failover\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert 'pyspark.sql.session' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
