"""The client's pure parts: batch encodings, batches, error mapping (no sockets)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from overlay.transport import MemoryNetwork
from peer.client import Batch, Client, batch_payload
from peer.errors import FedstreamError, InvalidInput, TupleError, Unavailable
from peer.protocol.api import error_from_wire


def test_columns_rows_and_arrow_payloads() -> None:
    assert batch_payload({"a": (1, 2), "b": ["x", "y"]}) == {
        "columns": {"a": [1, 2], "b": ["x", "y"]}
    }
    assert batch_payload([{"a": 1}, {"a": 2}]) == {"rows": [{"a": 1}, {"a": 2}]}
    table = pa.table({"a": [1, 2]})
    arrow = batch_payload(table)["arrow"]
    assert isinstance(arrow, bytes)
    assert pa.ipc.open_stream(arrow).read_all().equals(table)
    assert "arrow" in batch_payload(table.to_batches()[0])


def test_timestamps_become_utc_microseconds() -> None:
    aware = datetime(2024, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    naive = datetime(2024, 1, 1, 0, 0, 0, 1)
    expected = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000
    assert batch_payload({"t": [aware, naive]}) == {"columns": {"t": [expected, expected + 1]}}
    assert batch_payload([{"t": aware}]) == {"rows": [{"t": expected}]}


def test_payloads_already_in_wire_form_pass_through() -> None:
    columns = {"columns": {"a": [1]}}
    assert batch_payload(columns) == columns
    assert batch_payload({"rows": [{"a": 1}]}) == {"rows": [{"a": 1}]}
    assert batch_payload({"arrow": b"\x00"}) == {"arrow": b"\x00"}
    # A stream whose only field is called "rows" or "columns" still works.
    assert batch_payload({"rows": [1, 2]}) == {"columns": {"rows": [1, 2]}}


@pytest.mark.parametrize("bad", [42, "text", {"a": 5}, {"a": "abc"}, [1, 2]])
def test_unpushable_data_is_invalid_input(bad: object) -> None:
    with pytest.raises(InvalidInput):
        batch_payload(bad)


def test_batch_rows() -> None:
    batch = Batch("s", 10, {"a": [1, 2], "b": ["x", "y"]})
    assert batch.num_rows == 2
    assert batch.rows() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert Batch("s", 0, {}).num_rows == 0 and Batch("s", 0, {}).rows() == []


def test_error_frames_become_their_classes() -> None:
    err = error_from_wire(
        {
            "type": "error",
            "id": 1,
            "code": "invalid_tuple",
            "message": "bad",
            "details": {"field": "x"},
        }
    )
    assert isinstance(err, TupleError) and err.details == {"field": "x"}
    internal = error_from_wire(
        {"type": "error", "id": 1, "code": "internal", "message": "oops", "details": {}}
    )
    assert type(internal) is FedstreamError and internal.code == "internal"


def test_requests_without_a_connection_are_unavailable() -> None:
    async def main() -> None:
        async with asyncio.timeout(5):
            client = Client("127.0.0.1", 1, timeout_s=1, network=MemoryNetwork())
            with pytest.raises(Unavailable):
                await client.status()
            with pytest.raises(Unavailable, match="cannot connect"):
                await client.connect()

    asyncio.run(main())
