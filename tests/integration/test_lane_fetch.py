"""The lane's ``fedlane`` reader with fetched input, over real loopback TLS and without a JVM:
pickled as Spark ships it to an executor, it reads through the peer's fetch server exactly what
it reads from the spool directories, carries tickets (never the key), and a ticket another
piece's files do not match is refused with the server's reason, nothing read."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives import serialization
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from peer.engine.lane_source import LaneRange, LaneStreamReader
from peer.errors import Unauthorized
from peer.fetch.capability import FetchKey, fetch_key_path
from peer.fetch.protocol import FetchTicket
from peer.fetch.server import FetchServer
from peer.model.tentative import TENTATIVE
from peer.storage.spool import Spool

SPOOL_SCHEMA = pa.schema([("a", pa.int64()), ("s", pa.string())])
WIDE = StructType(
    [
        StructField("__stream", IntegerType()),
        StructField("__seq", LongType()),
        StructField("c0_a", LongType()),
        StructField("c0_s", StringType()),
    ]
)
TIMEOUT_S = 20.0


def table(n: int, first: int) -> pa.Table:
    return pa.table({"a": pa.array(range(first, first + n), pa.int64()), "s": [f"s{first}"] * n})


@pytest.fixture
def spools(data_dir: Path) -> list[Spool]:
    made = []
    for name, base in (("left", 0), ("right", 1_000_000)):
        s = Spool(data_dir / "spools" / name, SPOOL_SCHEMA, fsync=False, name=name)
        s.append(table(3_000, base))
        s.append(table(4, base + 500), status=TENTATIVE)  # not an input of exact results
        s.append(table(2_500, base + 10_000))
        made.append(s)
    return made


def spec_file(data_dir: Path, spools: list[Spool]) -> Path:
    spec = {
        "streams": [
            {
                "name": s.directory.name,
                "dir": str(s.directory.resolve()),
                "reader": "lane",
                "fields": [["a", "long"], ["s", "string"]],
            }
            for s in spools
        ]
    }
    path = data_dir / "lane-spec.json"
    path.write_text(json.dumps(spec))
    return path


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await body()

    asyncio.run(bounded())


def read_all(reader: LaneStreamReader, parts: list[LaneRange]) -> pa.Table:
    batches = [b for part in parts for b in reader.read(part)]
    return pa.Table.from_batches(batches).sort_by(
        [("__stream", "ascending"), ("__seq", "ascending")]
    )


def test_the_lane_reads_through_the_fetch_server_exactly_what_it_reads_locally(
    spools: list[Spool], data_dir: Path
) -> None:
    spec = spec_file(data_dir, spools)
    key = FetchKey.load_or_create(data_dir)
    server = FetchServer(key, fetch_key_path(data_dir), [data_dir])

    async def body() -> None:
        await server.start()
        try:
            remote = LaneStreamReader({"spec": str(spec), **server.endpoint.to_options()}, WIDE)
            local = LaneStreamReader({"spec": str(spec)}, WIDE)
            start = remote.initialOffset()
            end = remote.latestOffset(start, remote.getDefaultReadLimit())
            assert end == {"o": {"left": 2, "right": 2}}
            parts = list(remote.partitions(start, end))
            assert parts and all(
                p.tickets is not None and len(p.tickets) == len(p.pieces) for p in parts
            )
            # what Spark ships to an executor: tickets, never the key that signs them
            shipped = pickle.dumps((remote, parts))
            assert raw(key) not in shipped
            executor_reader, executor_parts = pickle.loads(shipped)
            got = await asyncio.to_thread(read_all, executor_reader, executor_parts)
            want = read_all(local, list(local.partitions(start, end)))
            assert got.equals(want)
            assert got.num_rows == 2 * (3_000 + 2_500)
            stable = [(0, 3_000), (10_000, 2_500), (1_000_000, 3_000), (1_010_000, 2_500)]
            want_a = sorted(a for first, n in stable for a in range(first, first + n))
            assert sorted(got.column("c0_a").to_pylist()) == want_a
            assert server.served_files == 6  # the tentative files too: skipped after reading
        finally:
            await server.close()

    run(body)


def test_a_piece_whose_ticket_names_other_files_is_refused_and_nothing_is_read(
    spools: list[Spool], data_dir: Path
) -> None:
    spec = spec_file(data_dir, spools)
    key = FetchKey.load_or_create(data_dir)
    server = FetchServer(key, fetch_key_path(data_dir), [data_dir])
    left = str(spools[0].directory.resolve())

    async def body() -> None:
        await server.start()
        try:
            reader = LaneStreamReader({"spec": str(spec), **server.endpoint.to_options()}, WIDE)
            # a capability for file 0 of the left spool, used for files 0..2 of it
            token = key.mint(left, 0, 0, now=time.time(), ttl_s=60)
            ticket = FetchTicket(server.address, server.pin, left, token)
            part = LaneRange([(0, 0, 2)], [ticket])
            got: list[pa.RecordBatch] = []

            def drain() -> None:
                got.extend(reader.read(part))

            with pytest.raises(Unauthorized, match=r"read capability refused \(out-of-range\)"):
                await asyncio.to_thread(drain)
            assert len(got) == 1  # file 0, which the capability covers; then the refusal
            assert server.served_files == 1 and server.refused == 1
        finally:
            await server.close()

    run(body)


def raw(key: FetchKey) -> bytes:
    return key.private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
