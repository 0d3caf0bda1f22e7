"""The client API server, driven by the real Client over an in-memory network (no sockets,
no JVM).

The PeerService is an in-memory fake: a few dicts, one schema check, a batch log per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pyarrow as pa
import pytest

from overlay.transport import FrameStream, MemoryNetwork
from overlay.wire import encode_frame
from peer.client import Batch, Client
from peer.errors import (
    AlreadyExists,
    FedstreamError,
    InvalidInput,
    NotFound,
    SchemaError,
    TupleError,
    Unavailable,
)
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateStreamReply,
    LookupReply,
    PushReply,
    SetQueryStatusReply,
    StatusReply,
)
from peer.server import ApiServer, PeerService
from peer.testing import all_tasks_blocked, wait_until

TEST_TIMEOUT_S = 20
PY_TYPES = {"int": int, "long": int, "double": float, "string": str, "bool": bool}
PEOPLE = {
    "name": "people",
    "fields": [{"name": "name", "type": "string"}, {"name": "id", "type": "int"}],
}


class FakePeer:
    """Just enough of a peer: schemas, streams, queries, a batch log per stream."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, str]] = {}
        self.streams: dict[str, str] = {}
        self.queries: dict[str, str] = {}
        self.log: dict[str, list[dict[str, Any]]] = {}
        self.seen: set[tuple[str, int]] = set()
        self.appended = asyncio.Condition()
        self.slow_release = asyncio.Event()
        self.subscribe_calls = 0
        self.slow_waiting = 0  # lookups of "slow" waiting for slow_release

    async def create_schema(self, schema: str | dict[str, Any]) -> CreateSchemaReply:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise SchemaError(f"schema is not JSON: {exc}") from exc
        assert isinstance(schema, dict)
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        self.schemas[schema["name"]] = fields
        return CreateSchemaReply(schema["name"], list(fields))

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> CreateStreamReply:
        if schema not in self.schemas:
            raise NotFound(f"no schema {schema!r}", schema=schema)
        if name in self.streams:
            raise AlreadyExists(f"stream {name!r} exists", stream=name)
        self.streams[name] = schema
        self.log[name] = []
        return CreateStreamReply(name, schema)

    async def create_query(self, query: str | dict[str, Any]) -> CreateQueryReply:
        name = query["name"] if isinstance(query, dict) else query.split('"')[1]
        self.queries[name] = "SETUP"
        return CreateQueryReply(name, "SETUP")

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply:
        if name not in self.queries:
            raise NotFound(f"no query {name!r}", query=name)
        self.queries[name] = status
        return SetQueryStatusReply(name, status)

    def _columns(self, stream: str, payload: dict[str, Any]) -> dict[str, list[Any]]:
        fields = self.schemas[self.streams[stream]]
        if "arrow" in payload:
            table = pa.ipc.open_stream(payload["arrow"]).read_all()
            columns = table.to_pydict()
        elif "rows" in payload:
            columns = {name: [row.get(name) for row in payload["rows"]] for name in fields}
        else:
            columns = payload["columns"]
        if set(columns) != set(fields):
            raise TupleError(
                f"push to {stream!r}: fields {sorted(columns)} != {sorted(fields)}", stream=stream
            )
        for name, kind in fields.items():
            for i, value in enumerate(columns[name]):
                if not isinstance(value, PY_TYPES[kind]) or isinstance(value, bool) != (
                    kind == "bool"
                ):
                    raise TupleError(
                        f"push to {stream!r}: tuple {i} field {name!r} is not {kind}",
                        stream=stream,
                        field=name,
                        tuple=i,
                    )
        return {name: list(columns[name]) for name in fields}

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> PushReply:
        if stream not in self.streams:
            raise NotFound(f"no stream {stream!r}", stream=stream)
        columns = self._columns(stream, payload)
        count = len(next(iter(columns.values()), []))
        if producer is not None and seq is not None:
            if (producer, seq) in self.seen:
                return PushReply(stream, 0, None, True)
            self.seen.add((producer, seq))
        return PushReply(stream, count, await self.append(stream, columns), False)

    async def append(self, stream: str, columns: dict[str, list[Any]]) -> int:
        """One batch into the stream's log; offsets count batches, as the spool's do."""
        log = self.log[stream]
        async with self.appended:
            log.append({"offset": len(log), "columns": columns})
            self.appended.notify_all()
        return len(log) - 1

    async def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        # Lazy, like the real peer's: checks and fixes its position on the first iteration,
        # which the server runs before it replies.
        if stream == "finite":  # a stream that ends: one batch, or none from "latest"
            if start == "earliest":
                yield {"offset": 0, "columns": {"x": [1]}}
            return
        if stream not in self.streams:
            raise NotFound(f"no stream {stream!r}", stream=stream)
        self.subscribe_calls += 1
        position = 0 if start == "earliest" else len(self.log[stream])
        async for batch in self._follow(stream, position):
            yield batch

    async def _follow(self, stream: str, position: int) -> AsyncIterator[dict[str, Any]]:
        log = self.log[stream]
        while True:
            async with self.appended:
                await self.appended.wait_for(functools.partial(self._beyond, stream, position))
            while position < len(log):
                yield log[position]
                position += 1

    def _beyond(self, stream: str, position: int) -> bool:
        return len(self.log[stream]) > position

    async def lookup(self, name: str) -> LookupReply:
        if name == "slow":
            self.slow_waiting += 1
            await self.slow_release.wait()
            return LookupReply("slow", name)
        if name == "broken":
            raise RuntimeError("secret internal detail")
        if name in self.streams:
            return LookupReply("stream", name, extra={"schema": self.streams[name]})
        raise NotFound(f"no object {name!r}", name=name)

    async def status(self) -> StatusReply:
        streams = [{"name": s, "latest_offset": None} for s in sorted(self.streams)]
        return StatusReply("fake", 1, 0.0, "none", None, streams, [])


class EagerFakePeer(FakePeer):
    """A service whose subscribe checks and fixes its position when called."""

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        if stream not in self.streams:
            raise NotFound(f"no stream {stream!r}", stream=stream)
        self.subscribe_calls += 1
        position = 0 if start == "earliest" else len(self.log[stream])
        return self._follow(stream, position)


def async_test(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test on a fresh loop, bounded by TEST_TIMEOUT_S."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            async with asyncio.timeout(TEST_TIMEOUT_S):
                await fn(*args, **kwargs)

        asyncio.run(main())

    return wrapper


# The network the servers and clients of one test meet on (each test runs on its own loop).
NETWORK = MemoryNetwork()


def api_server(service: PeerService, **options: Any) -> ApiServer:
    return ApiServer(service, "127.0.0.1", 0, network=NETWORK, **options)


def client_of(server: ApiServer, **options: Any) -> Client:
    options.setdefault("timeout_s", 5)
    return Client("127.0.0.1", server.port, network=NETWORK, **options)


@contextlib.asynccontextmanager
async def serving(
    peer_class: type[FakePeer] = FakePeer, **options: Any
) -> AsyncIterator[tuple[ApiServer, FakePeer]]:
    peer = peer_class()
    server = api_server(peer, **options)
    await server.start()
    try:
        yield server, peer
    finally:
        async with asyncio.timeout(10):
            await server.close()


@contextlib.asynccontextmanager
async def connected(server: ApiServer, **options: Any) -> AsyncIterator[Client]:
    async with client_of(server, **options) as client:
        yield client


async def with_people(client: Client) -> None:
    await client.create_schema(PEOPLE)
    await client.create_stream("people", "people")


class RawConnection:
    """A client that speaks bytes, to send what the real Client never would."""

    def __init__(self, stream: FrameStream) -> None:
        self.stream = stream

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        return cls(await NETWORK.connect("127.0.0.1", port))

    async def send(self, data: bytes | dict[str, Any]) -> None:
        await self.stream.send_encoded(data if isinstance(data, bytes) else encode_frame(data))

    async def recv(self) -> dict[str, Any] | None:
        return await self.stream.recv()

    async def close(self) -> None:
        await self.stream.aclose()


# -- every op ---------------------------------------------------------------------------------


@async_test
async def test_hello_reports_version_and_limit() -> None:
    async with serving(max_frame_bytes=1 << 20) as (server, _), connected(server) as client:
        assert client.server_info == {
            "server": "fedstream",
            "version": 1,
            "max_frame_bytes": 1 << 20,
        }


@async_test
async def test_every_op() -> None:
    async with serving() as (server, peer), connected(server) as client:
        assert await client.create_schema(PEOPLE) == CreateSchemaReply("people", ["name", "id"])
        other = {"name": "other", "fields": [{"name": "x", "type": "double"}]}
        assert (await client.create_schema(json.dumps(other)))["schema"] == "other"
        assert await client.create_stream("people", "people") == {
            "stream": "people",
            "schema": "people",
        }
        query = {"name": "FindMrX", "boxes": []}
        assert await client.create_query(query) == {"query": "FindMrX", "status": "SETUP"}
        assert (await client.create_query('<query name="Q2"/>'))["query"] == "Q2"
        assert (await client.start_query("FindMrX"))["status"] == "RUNNING"
        assert (await client.stop_query("FindMrX"))["status"] == "STOPPED"
        assert (await client.set_query_status("FindMrX", "setup"))["status"] == "SETUP"
        assert (await client.delete_query("FindMrX"))["status"] == "DELETED"

        r1 = await client.push("people", {"name": ["ann", "bob"], "id": [1, 2]})
        r2 = await client.push("people", [{"name": "cy", "id": 3}])
        r3 = await client.push(
            "people", pa.table({"name": ["di"], "id": pa.array([4], pa.int32())})
        )
        r4 = await client.post_event("people", {"name": "ed", "id": 5})
        assert [(r["count"], r["offset"]) for r in (r1, r2, r3, r4)] == [
            (2, 0),
            (1, 1),
            (1, 2),
            (1, 3),
        ]
        again = await client.push("people", [{"name": "f", "id": 6}], producer="p", seq=0)
        dup = await client.push("people", [{"name": "f", "id": 6}], producer="p", seq=0)
        assert again["count"] == 1 and dup.get("duplicate") is True

        assert (await client.lookup_object("people"))["kind"] == "stream"
        status = await client.status()
        assert (status.peer, [s["name"] for s in status.streams]) == ("fake", ["people"])
        assert len(peer.log["people"]) == 5


# -- errors -----------------------------------------------------------------------------------


@async_test
async def test_service_errors_arrive_as_their_classes() -> None:
    async with serving() as (server, _), connected(server) as client:
        with pytest.raises(NotFound) as not_found:
            await client.create_stream("people", "nope")
        assert not_found.value.code == "not_found"
        assert not_found.value.details == {"schema": "nope"}
        await with_people(client)
        with pytest.raises(AlreadyExists):
            await client.create_stream("people", "people")
        with pytest.raises(SchemaError):
            await client.create_schema("{not json")
        with pytest.raises(TupleError) as bad:
            await client.push("people", {"name": ["a", "b"], "id": [1, "two"]})
        assert bad.value.details == {"stream": "people", "field": "id", "tuple": 1}
        with pytest.raises(NotFound):
            await client.push("ghosts", [{"x": 1}])
        with pytest.raises(NotFound):
            await client.subscribe("ghosts")
        # The connection is still fine after all that.
        assert (await client.status())["peer"] == "fake"


@async_test
async def test_unexpected_exception_is_internal_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="peer.server")
    async with serving() as (server, _), connected(server) as client:
        with pytest.raises(FedstreamError) as err:
            await client.lookup_object("broken")
        assert err.value.code == "internal"
        assert "secret" not in err.value.message
        assert (await client.status())["peer"] == "fake"
    assert any(
        r.exc_info and "secret internal detail" in str(r.exc_info[1]) for r in caplog.records
    )


@async_test
async def test_unknown_op_and_wrong_argument_types() -> None:
    async with serving() as (server, _), connected(server) as client:
        await with_people(client)
        with pytest.raises(InvalidInput, match="unknown op 'frobnicate'") as unknown:
            await client._request("frobnicate", {})
        assert unknown.value.code == "invalid" and unknown.value.details == {"op": "frobnicate"}
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("create_stream", {"name": 7, "schema": "people"}, "name"),
            ("create_stream", {"name": "s"}, "schema"),
            ("create_schema", {"schema": [1]}, "schema"),
            ("set_query_status", {"name": "q", "status": True}, "status"),
            ("set_query_status", {"name": "q", "status": "PAUSED"}, "status"),
            ("push", {"stream": "people", "columns": [1, 2]}, "columns"),
            ("push", {"stream": "people", "rows": [1]}, "row"),
            ("push", {"stream": "people", "columns": {"id": 1}}, "id"),
            ("push", {"stream": "people", "arrow": "text"}, "arrow"),
            ("push", {"stream": "people", "rows": [], "seq": "1"}, "seq"),
            ("push", {"stream": "people", "rows": [], "seq": True}, "seq"),
            ("push", {"stream": "people", "rows": [], "producer": 1}, "producer"),
            ("push", {"stream": "people", "rows": [], "columns": {}}, "exactly one"),
            ("push", {"stream": "people"}, "exactly one"),
            ("subscribe", {"stream": "people", "start": 0}, "start"),
            ("subscribe", {"stream": "people", "start": "middle"}, "start"),
            ("unsubscribe", {"subscription": "1"}, "subscription"),
            ("lookup", {"name": None}, "name"),
            ("lookup", {"name": ""}, "name"),
            ("hello", {"client": "x", "version": 99}, "version"),
        ]
        for op, args, named in cases:
            with pytest.raises(InvalidInput) as err:
                await client._request(op, args)
            assert err.value.code == "invalid", (op, args)
            assert named in err.value.message, (op, args, err.value.message)
        assert (await client.status())["peer"] == "fake"


@async_test
async def test_request_without_integer_id_gets_error_with_null_id() -> None:
    async with serving() as (server, _):
        raw = await RawConnection.open(server.port)
        await raw.send({"type": "status", "id": "one"})
        reply = await raw.recv()
        assert reply is not None
        assert (reply["type"], reply["id"], reply["code"]) == ("error", None, "invalid")
        await raw.send({"type": "status", "id": 2})
        assert (await raw.recv() or {}).get("result") == StatusReply(
            "fake", 1, 0.0, "none", None, [], []
        )
        await raw.close()


# -- subscriptions ----------------------------------------------------------------------------


@pytest.mark.parametrize("peer_class", [FakePeer, EagerFakePeer])
@async_test
async def test_subscribe_delivers_pushed_batches_in_order(peer_class: type[FakePeer]) -> None:
    async with serving(peer_class) as (server, _), connected(server) as client:
        await with_people(client)
        await client.post_event("people", {"name": "before", "id": 0})
        sub = await client.subscribe("people")  # latest: from after the first tuple
        for i in range(1, 31):
            await client.push("people", {"name": [f"n{i}", f"m{i}"], "id": [i, -i]})
        batches = [await anext(sub) for _ in range(30)]
        assert [b.offset for b in batches] == list(range(1, 31))
        assert all(b.stream == "people" and b.num_rows == 2 for b in batches)
        assert batches[0].rows() == [{"name": "n1", "id": 1}, {"name": "m1", "id": -1}]
        await sub.aclose()

        everything = await client.receive_events("people", limit=61, start="earliest")
        assert [r["id"] for r in everything[:3]] == [0, 1, -1] and len(everything) == 61


@async_test
async def test_receive_events_returns_what_arrived_when_time_is_up() -> None:
    async with serving() as (server, _), connected(server) as client:
        await with_people(client)
        await client.push("people", {"name": ["a", "b"], "id": [1, 2]})
        rows = await client.receive_events("people", limit=10, timeout_s=0.3, start="earliest")
        assert rows == [{"name": "a", "id": 1}, {"name": "b", "id": 2}]


@async_test
async def test_unsubscribe_stops_batches() -> None:
    async with serving() as (server, _), connected(server) as client:
        await with_people(client)
        async with await client.subscribe("people") as sub:
            await client.post_event("people", {"name": "a", "id": 1})
            assert (await anext(sub)).rows() == [{"name": "a", "id": 1}]
        await client.post_event("people", {"name": "b", "id": 2})
        assert await sub.next_batch(0.1) is None
        with pytest.raises(NotFound):
            await client._request("unsubscribe", {"subscription": sub.sid})


@async_test
async def test_credit_bounds_what_a_slow_consumer_buffers() -> None:
    async with serving() as (server, _), connected(server, subscription_credit=4) as client:
        await with_people(client)
        sub = await client.subscribe("people")
        for i in range(20):
            await client.post_event("people", {"name": "x", "id": i})
        await wait_until(lambda: sub._queue.qsize() >= 4, "4 batches buffered", 5, every_s=0.01)
        await all_tasks_blocked()
        assert sub._queue.qsize() == 4  # the peer stopped at the credit
        ids = [(await anext(sub)).rows()[0]["id"] for _ in range(20)]
        assert ids == list(range(20))


@async_test
async def test_big_batches_are_split_to_fit_the_frame_limit() -> None:
    async with serving(max_frame_bytes=4096) as (server, peer), connected(server) as client:
        await with_people(client)
        sub = await client.subscribe("people")
        names = [f"{i:04d}" * 10 for i in range(300)]  # ~13 KiB as one batch frame
        await peer.append("people", {"name": names, "id": list(range(300))})
        await client.post_event("people", {"name": "small", "id": 300})
        parts: list[Batch] = []
        while not parts or parts[-1].part < parts[-1].parts - 1:
            parts.append(await anext(sub))
        assert len(parts) >= 4
        assert {(b.offset, b.parts) for b in parts} == {(0, len(parts))}
        assert [b.part for b in parts] == list(range(len(parts)))
        assert [i for b in parts for i in b.columns["id"]] == list(range(300))
        small = await anext(sub)
        assert (small.offset, small.part, small.parts, small.columns["id"]) == (1, 0, 1, [300])


@async_test
async def test_subscribe_without_await_and_wire_form_payloads() -> None:
    async with serving() as (server, _), connected(server) as client:
        await with_people(client)
        await client.push("people", {"columns": {"name": ["a"], "id": [1]}})
        await client.push("people", {"rows": [{"name": "b", "id": 2}]})
        seen = []
        async for batch in client.subscribe("people", start="earliest"):
            seen.extend(batch.rows())
            if len(seen) == 2:
                break
        assert seen == [{"name": "a", "id": 1}, {"name": "b", "id": 2}]
        with pytest.raises(NotFound):
            async for _ in client.subscribe("ghosts"):
                pass


@async_test
async def test_a_subscription_that_ends_says_so() -> None:
    async with serving() as (server, _), connected(server) as client:
        for start, expected in (("earliest", [[1]]), ("latest", [])):
            got = [batch.columns["x"] async for batch in client.subscribe("finite", start)]
            assert got == expected
        assert (await client.status())["peer"] == "fake"


# -- hostile and broken clients ---------------------------------------------------------------


@async_test
async def test_malformed_frame_closes_only_that_connection() -> None:
    async with serving() as (server, _), connected(server) as good:
        await with_people(good)
        raw = await RawConnection.open(server.port)
        await raw.send(b"\x00\x00\x00\x01\xc1")
        reply = await raw.recv()
        assert reply is not None
        assert (reply["type"], reply["id"], reply["code"]) == ("error", None, "protocol")
        assert await raw.recv() is None  # closed by the peer
        await raw.close()
        assert (await good.push("people", [{"name": "a", "id": 1}]))["count"] == 1
        assert server.connection_count == 1


@async_test
async def test_oversized_frame_refused_from_its_header() -> None:
    async with serving(max_frame_bytes=4096) as (server, _), connected(server) as good:
        raw = await RawConnection.open(server.port)
        await raw.send((1 << 30).to_bytes(4, "big"))  # announces 1 GiB, sends nothing more
        reply = await raw.recv()
        assert reply is not None and reply["code"] == "protocol"
        assert "exceeds the limit of 4096" in reply["message"]
        assert await raw.recv() is None
        await raw.close()
        # The client knows the limit from hello and refuses before sending.
        await with_people(good)
        with pytest.raises(InvalidInput, match="exceeds the limit"):
            await good.push("people", {"name": ["x" * 5000], "id": [1]})
        assert (await good.status())["peer"] == "fake"


@async_test
async def test_slow_subscriber_does_not_block_other_clients() -> None:
    async with serving(outbox_frames=4) as (server, peer), connected(server) as fast:
        await with_people(fast)
        lazy = await RawConnection.open(server.port)  # subscribes, then never reads
        await lazy.send({"type": "subscribe", "id": 1, "stream": "people"})
        await wait_until(lambda: peer.subscribe_calls, "the lazy subscription", 5, every_s=0.01)
        watch = await fast.subscribe("people")
        blob = "x" * 65536
        for i in range(200):  # ~13 MiB: far more than the lazy connection's buffers hold
            async with asyncio.timeout(2):
                await fast.push("people", {"name": [blob], "id": [i]})
            batch = await watch.next_batch(2)
            assert batch is not None and batch.columns["id"] == [i]
        # The lazy client still holds megabytes unread: closing must not wait for it.
        async with asyncio.timeout(3):
            await server.close()
        await lazy.close()


@async_test
async def test_requests_run_concurrently_but_bounded() -> None:
    async with serving(max_in_flight=2) as (server, peer), connected(server) as client:
        slow = [asyncio.create_task(client.lookup_object("slow")) for _ in range(2)]
        await wait_until(lambda: peer.slow_waiting == 2, "two slow requests", 5, every_s=0.01)
        third = asyncio.create_task(client.status())
        await all_tasks_blocked()
        assert not third.done()  # both slots busy: the peer stopped reading
        peer.slow_release.set()
        assert (await third)["peer"] == "fake"
        assert [(await t)["kind"] for t in slow] == ["slow", "slow"]

    async with serving() as (server, peer), connected(server) as client:
        slow_one = asyncio.create_task(client.lookup_object("slow"))
        await wait_until(lambda: peer.slow_waiting == 1, "the slow request", 5, every_s=0.01)
        assert (await client.status())["peer"] == "fake"  # replies out of order
        peer.slow_release.set()
        assert (await slow_one)["kind"] == "slow"


@async_test
async def test_too_many_connections_are_refused() -> None:
    async with serving(max_connections=1) as (server, _), connected(server) as first:
        with pytest.raises(Unavailable, match="too many client connections"):
            async with connected(server):
                pass
        assert (await first.status())["peer"] == "fake"


@async_test
async def test_server_close_ends_everything_within_a_timeout() -> None:
    peer = FakePeer()
    server = api_server(peer, close_timeout_s=2)
    await server.start()
    clients = [client_of(server, timeout_s=10) for _ in range(3)]
    for client in clients:
        await client.connect()
    await with_people(clients[0])
    subs = [await c.subscribe("people") for c in clients]
    pending = asyncio.create_task(clients[1].lookup_object("slow"))
    raw = await RawConnection.open(server.port)
    await raw.send({"type": "subscribe", "id": 1, "stream": "people"})
    await wait_until(
        lambda: peer.subscribe_calls == 4 and peer.slow_waiting == 1,
        "four subscriptions and a slow request",
        5,
        every_s=0.01,
    )

    async with asyncio.timeout(3):
        await server.close()
    assert server.connection_count == 0
    for sub in subs:
        with pytest.raises(Unavailable):
            await anext(sub)
    with pytest.raises(Unavailable):
        await pending
    with pytest.raises(Unavailable):
        await clients[2].status()
    with pytest.raises(Unavailable):
        await client_of(server, timeout_s=1).connect()
    for client in clients:
        await client.close()
    await raw.close()


@async_test
async def test_serve_forever_closes_when_cancelled() -> None:
    server = api_server(FakePeer())
    task = asyncio.create_task(server.serve_forever())

    def listening() -> int | None:
        with contextlib.suppress(RuntimeError):
            return server.port
        return None

    port = await wait_until(listening, "the server listening", 5, every_s=0.01)
    async with Client("127.0.0.1", port, timeout_s=5, network=NETWORK) as client:
        assert (await client.status())["peer"] == "fake"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Unavailable):
            await client.status()
