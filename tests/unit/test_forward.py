"""What a non-host peer forwards for a push (peer.federation.forward): the client's Arrow bytes
once validated, bounded as the host bounds them, and as many batches in flight as a link
carries. No sockets: the router and hosting are stand-ins."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pytest

from peer.errors import InvalidInput, TupleError
from peer.federation.forward import INLINE_CHECK_BYTES, MAX_FORWARD_SLOTS, Forwarder, checked_body
from peer.model.schema import parse_schema, to_arrow_schema
from peer.model.tuples import arrow_bytes, batch_from_wire
from peer.protocol.link import PushBatch
from peer.protocol.replies import PushReply
from peer.testing.hostile import arrow_bomb

SCHEMA = parse_schema(
    {
        "name": "reading",
        "fields": [
            {"name": "k", "type": "int"},
            {"name": "v", "type": "long"},
            {"name": "s", "type": "string"},
        ],
    }
)
LIMIT = 64 * 1024 * 1024


def table(rows: int) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array(range(rows), pa.int32()),
            pa.array(range(0, 3 * rows, 3), pa.int64()),
            pa.array([f"s{i}" for i in range(rows)]),
        ],
        schema=to_arrow_schema(SCHEMA),
    )


def ipc(data: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, data.schema, options=options) as writer:
        writer.write(data)
    return bytes(sink.getvalue())


def check(payload: dict[str, Any], max_bytes: int = LIMIT) -> bytes:
    return asyncio.run(checked_body(SCHEMA, payload, stream="readings", max_bytes=max_bytes))


def test_a_valid_arrow_body_travels_as_the_client_sent_it() -> None:
    body = ipc(table(1000))
    assert len(body) <= INLINE_CHECK_BYTES
    assert check({"arrow": body}) is body
    # a body the host must convert (int64 for an int field) still travels unchanged: the
    # host converts it as it would a direct push
    wide = pa.table({"k": pa.array([1, 2], pa.int64()), "v": [5, 6], "s": ["a", "b"]})
    wide_body = ipc(wide)
    assert check({"arrow": wide_body}) is wide_body
    assert batch_from_wire(SCHEMA, {"arrow": wide_body}).equals(
        pa.Table.from_arrays(
            [pa.array([1, 2], pa.int32()), pa.array([5, 6], pa.int64()), pa.array(["a", "b"])],
            schema=to_arrow_schema(SCHEMA),
        )
    )


def test_rows_and_columns_are_encoded_once_as_the_validated_table() -> None:
    rows = [{"k": 1, "v": 10, "s": "x"}, {"k": 2, "v": 20, "s": "y"}]
    body = check({"rows": rows})
    assert pa.ipc.open_stream(body).read_all().equals(batch_from_wire(SCHEMA, {"rows": rows}))
    columns = {"k": [3], "v": [30], "s": ["z"]}
    body = check({"columns": columns})
    assert pa.ipc.open_stream(body).read_all().to_pylist() == [{"k": 3, "v": 30, "s": "z"}]


def test_a_bad_batch_is_refused_before_it_travels() -> None:
    bad = pa.table({"k": pa.array(["one"]), "v": [1], "s": ["a"]})
    with pytest.raises(TupleError, match="field 'k'"):
        check({"arrow": ipc(bad)})
    with pytest.raises(TupleError, match="does not decode"):
        check({"arrow": b"not arrow at all"})
    with pytest.raises(TupleError, match="'s' is missing"):
        check({"rows": [{"k": 1, "v": 2}]})


def test_a_compressed_body_is_held_to_the_real_limit_not_the_inline_bound() -> None:
    # small on the wire, several times the inline bound once decompressed: accepted (decoded
    # in a worker thread) and forwarded compressed, as sent
    rows = 50_000
    big = pa.Table.from_arrays(
        [pa.array([7] * rows, pa.int32()), pa.array([9] * rows, pa.int64()), pa.array([""] * rows)],
        schema=to_arrow_schema(SCHEMA),
    )
    body = ipc(big, "zstd")
    assert len(body) <= INLINE_CHECK_BYTES < big.nbytes
    assert check({"arrow": body}) is body
    # over the push limit: refused naming the real limit, not the inline bound
    with pytest.raises(TupleError, match=f"push limit of {LIMIT} bytes") as err:
        check({"arrow": arrow_bomb(LIMIT + 1, field_name="s")})
    assert err.value.details["limit"] == "max_push_bytes"
    # a peer whose own limit is below the inline bound keeps it
    with pytest.raises(TupleError, match="push limit of 1000 bytes"):
        check({"arrow": ipc(table(1000))}, max_bytes=1000)


class _Router:
    def __init__(self) -> None:
        self.node_id = b"\x01" * 20
        self.sent: list[PushBatch] = []
        self.in_flight = 0
        self.most = 0
        self.release = asyncio.Event()

    async def call(self, host: bytes, message: PushBatch) -> dict[str, Any]:
        self.sent.append(message)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await self.release.wait()
        self.in_flight -= 1
        return {"stream": message.stream, "count": 1, "offset": 0, "duplicate": False}


class _Hosting:
    async def host_of(self, stream: str, *, fresh: bool = False) -> bytes:
        return b"\x02" * 20


def test_forwarded_pushes_fill_a_link_and_keep_one_origin_per_slot() -> None:
    async def go() -> tuple[_Router, list[PushReply]]:
        router = _Router()
        forwarder = Forwarder(router, _Hosting(), None, incarnation=7)  # type: ignore[arg-type]
        pushes = [
            asyncio.create_task(forwarder.push("s", b"body", None, None))
            for _ in range(MAX_FORWARD_SLOTS + 8)
        ]
        async with asyncio.timeout(5):
            while len(router.sent) < MAX_FORWARD_SLOTS:
                await asyncio.sleep(0)
            for _ in range(20):
                await asyncio.sleep(0)
            assert router.in_flight == MAX_FORWARD_SLOTS  # the rest wait for a slot
            router.release.set()
            replies = await asyncio.gather(*pushes)
        return router, replies

    router, replies = asyncio.run(go())
    assert len(replies) == MAX_FORWARD_SLOTS + 8 and router.most == MAX_FORWARD_SLOTS
    assert all(m.arrow == b"body" for m in router.sent)
    ids = [(m.producer, m.seq) for m in router.sent]
    assert len(set(ids)) == len(ids)  # no two forwarded batches share an event id
    origins = {m.producer for m in router.sent}
    assert len(origins) == MAX_FORWARD_SLOTS
    # a reused slot goes on with the next seq of its origin
    for origin in origins:
        seqs = [m.seq for m in router.sent if m.producer == origin]
        assert seqs == list(range(1, len(seqs) + 1))


def test_a_push_with_its_own_event_id_takes_no_slot() -> None:
    async def go() -> _Router:
        router = _Router()
        router.release.set()
        forwarder = Forwarder(router, _Hosting(), None, incarnation=1)  # type: ignore[arg-type]
        await forwarder.push("s", arrow_bytes(table(1)), "cli:abc", 41)
        return router

    router = asyncio.run(go())
    assert [(m.producer, m.seq) for m in router.sent] == [("cli:abc", 41)]


@pytest.mark.parametrize("producer", ["", "a\nb", "tab\there", "x" * 257, "\u2028"])
def test_a_forwarded_push_with_a_bad_producer_id_is_refused(producer: str) -> None:
    frame = {"op": "push", "stream": "s", "arrow": b"", "producer": producer, "seq": 1}
    with pytest.raises(InvalidInput, match="producer"):
        PushBatch.from_wire(frame)


def test_a_forwarded_push_keeps_a_good_producer_id() -> None:
    frame = {"op": "push", "stream": "s", "arrow": b"", "producer": "pusher-1", "seq": 1}
    assert PushBatch.from_wire(frame).producer == "pusher-1"
