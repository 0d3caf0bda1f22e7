"""Fetched input over real loopback TLS, without a JVM: the ``fedspool`` reader in remote mode
reads what it reads locally, the server's pin is checked, and hostile clients (garbage, huge
lengths, slowloris, idle, not reading, too many connections) lose their connection while the
server goes on serving a well-behaved executor."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives import serialization
from pyspark.sql.types import LongType, StringType, StructField, StructType

from peer.engine.source import SpoolOffset, SpoolRange, SpoolStreamReader
from peer.fetch.capability import FetchKey, fetch_key_path
from peer.fetch.client import FetchFailed, SpoolFetcher, client_context
from peer.fetch.protocol import FetchTicket
from peer.fetch.server import FetchLimits, FetchServer
from peer.model.tentative import TENTATIVE
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import TrimmedError

SPOOL_SCHEMA = pa.schema([("a", pa.int32()), ("s", pa.string())])
SPARK_SCHEMA = StructType(
    [StructField("a", LongType()), StructField("s", StringType()), StructField("__seq", LongType())]
)
TIMEOUT_S = 20.0


def table(n: int, first: int = 0) -> pa.Table:
    return pa.table(
        {"a": pa.array(range(first, first + n), pa.int32()), "s": [f"s{i}" * 3 for i in range(n)]}
    )


@pytest.fixture
def spool(data_dir: Path) -> Spool:
    s = Spool(data_dir / "spools" / "s", SPOOL_SCHEMA, fsync=False, name="s")
    s.append(table(30_000))
    s.append(table(5, 100), status=TENTATIVE)  # not an input of exact results
    s.append(table(25_000, 40_000))
    s.append(table(7, 90_000))
    return s


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await body()

    asyncio.run(bounded())


class Running:
    """A fetch server on loopback with real TLS, on the test's own loop."""

    def __init__(self, data_dir: Path, **limits: Any) -> None:
        self.key = FetchKey.load_or_create(data_dir)
        self.server = FetchServer(
            self.key, fetch_key_path(data_dir), [data_dir], limits=FetchLimits(**limits)
        )

    async def __aenter__(self) -> FetchServer:
        await self.server.start()
        return self.server

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()


def reader(spool: Spool, **options: str) -> SpoolStreamReader:
    opts = {"path": str(spool.directory), "reader": "q", "noFsync": "true", "withSeq": "true"}
    opts.update(options)
    return SpoolStreamReader(opts, SPARK_SCHEMA)


def read_all(r: SpoolStreamReader, parts: list[SpoolRange]) -> list[pa.RecordBatch]:
    return [batch for part in parts for batch in r.read(part)]


def test_the_remote_reader_reads_exactly_what_the_local_one_does(
    spool: Spool, data_dir: Path
) -> None:
    async def body() -> None:
        async with Running(data_dir) as server:
            options = {**server.endpoint.to_options(), "numPartitions": "2"}
            remote, local = reader(spool, **options), reader(spool)
            start: SpoolOffset = {"offset": -1}
            end: SpoolOffset = {"offset": 3}
            parts = list(remote.partitions(start, end))
            assert len(parts) == 2 and all(p.ticket is not None for p in parts)
            # an executor gets the reader and its partitions pickled: tokens, never the key
            raw_key = server_key_bytes(data_dir)
            shipped = pickle.dumps((remote, parts))
            assert raw_key not in shipped
            executor_reader, executor_parts = pickle.loads(shipped)
            got = await asyncio.to_thread(read_all, executor_reader, executor_parts)
            want = read_all(local, list(local.partitions(start, end)))
            assert pa.Table.from_batches(got).equals(pa.Table.from_batches(want))
            assert pa.Table.from_batches(got).num_rows == 30_000 + 25_000 + 7
            assert server.served_files == 4  # the tentative file too: skipped after reading

    run(body)


def server_key_bytes(data_dir: Path) -> bytes:
    return FetchKey.load(fetch_key_path(data_dir)).private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def test_a_trimmed_file_fails_the_remote_read_as_it_fails_the_local_one(
    spool: Spool, data_dir: Path
) -> None:
    async def body() -> None:
        async with Running(data_dir) as server:
            remote = reader(spool, **server.endpoint.to_options())
            parts = list(remote.partitions({"offset": -1}, {"offset": 3}))
            fmt.offset_path(spool.directory, 0).unlink()
            with pytest.raises(TrimmedError, match="offset 0 was trimmed before it was read"):
                await asyncio.to_thread(read_all, remote, parts)

    run(body)


def test_a_server_with_another_certificate_is_never_sent_a_capability(
    spool: Spool, data_dir: Path
) -> None:
    async def body() -> None:
        async with Running(data_dir) as server:
            token = server_token(data_dir, spool)
            ticket = FetchTicket(server.address, "00" * 32, str(spool.directory), token)
            fetcher = SpoolFetcher(ticket, timeout_s=5)
            with pytest.raises(FetchFailed, match="does not match pin"):
                await fetcher.fetch_async(0)
            await fetcher.aclose()
            assert server.served_files == 0 and server.refused == 0  # it never asked

    run(body)


def server_token(data_dir: Path, spool: Spool) -> bytes:
    key = FetchKey.load(fetch_key_path(data_dir))
    return key.mint(str(spool.directory), 0, 3, now=time.time(), ttl_s=60)


async def good_fetch(server: FetchServer, data_dir: Path, spool: Spool) -> None:
    """A well-behaved executor is served, whatever the others are doing."""
    ticket = FetchTicket(
        server.address, server.pin, str(spool.directory), server_token(data_dir, spool)
    )
    fetcher = SpoolFetcher(ticket, timeout_s=5)
    try:
        data = await fetcher.fetch_async(3)
    finally:
        await fetcher.aclose()
    assert data == fmt.offset_path(spool.directory, 3).read_bytes()


async def tls_connection(
    server: FetchServer,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.listener.port, ssl=client_context())


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before it closed the connection, which it must do in time."""
    data = b""
    async with asyncio.timeout(seconds):
        while chunk := await reader.read(65536):
            data += chunk
    return data


def test_garbage_and_a_huge_length_close_that_connection_only(spool: Spool, data_dir: Path) -> None:
    async def body() -> None:
        async with Running(data_dir) as server:
            reader_, writer = await tls_connection(server)
            writer.write(struct.pack(">I", 2**32 - 1) + b"\x00" * 16)
            reply = await closed_within(reader_, 5)
            assert b"max_frame_bytes" in reply or b"protocol error" in reply
            writer.close()
            reader_, writer = await tls_connection(server)
            writer.write(struct.pack(">I", 12) + b"\xc1" * 12)  # 0xc1: never valid msgpack
            assert b"protocol error" in await closed_within(reader_, 5)
            writer.close()
            await good_fetch(server, data_dir, spool)

    run(body)


def test_slowloris_and_idle_connections_are_cut_off(spool: Spool, data_dir: Path) -> None:
    async def body() -> None:
        async with Running(data_dir, frame_timeout_s=0.5, idle_timeout_s=1.0) as server:
            slow_r, slow_w = await tls_connection(server)
            slow_w.write(struct.pack(">I", 200) + b"\x84")  # a frame begun, never finished
            idle_r, idle_w = await tls_connection(server)
            began = time.monotonic()
            assert b"frame_timeout_s" in await closed_within(slow_r, 5)
            assert await closed_within(idle_r, 5) == b""
            assert time.monotonic() - began < 4
            slow_w.close()
            idle_w.close()
            await good_fetch(server, data_dir, spool)

    run(body)


def test_a_client_that_stops_reading_loses_its_connection_not_the_servers_slots(
    data_dir: Path,
) -> None:
    big = Spool(data_dir / "spools" / "big", SPOOL_SCHEMA, fsync=False, name="big")
    big.append(table(400_000))  # some 8 MB: far beyond the socket buffers
    small = Spool(data_dir / "spools" / "small", SPOOL_SCHEMA, fsync=False, name="small")
    for i in range(4):
        small.append(table(10, i * 10))

    async def body() -> None:
        async with Running(data_dir, send_timeout_s=0.5, max_concurrent_reads=1) as server:
            stalled_r, stalled_w = await tls_connection(server)
            key = FetchKey.load(fetch_key_path(data_dir))
            token = key.mint(str(big.directory), 0, 0, now=time.time(), ttl_s=60)
            from overlay.wire import encode_frame
            from peer.fetch.protocol import FetchRequest

            stalled_w.write(encode_frame(FetchRequest(str(big.directory), 0, token).to_wire()))
            await good_fetch(server, data_dir, small)  # served while the other is stalled
            # the stalled client's send_timeout_s passes: the server drops it (within 5 s)
            async with asyncio.timeout(5):
                while server.listener.connection_count:
                    await asyncio.sleep(0.05)
            assert server.served_files == 1  # only the good one was ever completed
            async with asyncio.timeout(5):  # what was in flight, then the end (no hang)
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    while await stalled_r.read(1 << 20):
                        pass
            stalled_w.close()

    run(body)


def test_connections_beyond_the_per_address_limit_are_refused(spool: Spool, data_dir: Path) -> None:
    async def body() -> None:
        async with Running(data_dir, max_per_address=2) as server:
            held = [await tls_connection(server) for _ in range(2)]
            with pytest.raises((ConnectionError, ssl.SSLError)):  # no room: closed at once
                await tls_connection(server)
            for _, w in held:
                w.close()
            async with asyncio.timeout(5):
                while server.listener.connection_count:
                    await asyncio.sleep(0.05)
            await good_fetch(server, data_dir, spool)

    run(body)
