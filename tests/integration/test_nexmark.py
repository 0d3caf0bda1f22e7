"""NEXMark q0-q5, q7, q8 on real Spark through one real peer, against DuckDB running each
query's SQL on the same events, tuple for tuple.

One in-process peer (on the shared Spark session) serves the module. Each test creates the
three NEXMark streams under a prefix of its own, creates and starts its query's stages, pushes
the generated events (6,000 at 100 events/s: 60 s of event time; 40 active people, so that
q3's sellers are near enough in time for its bound to keep some matches and drop others) in
pieces of 500 events, each piece stream by stream, then the flush tuples
(peer.examples.nexmark.flush), reads the result stream until every expected row came (and a
little longer, so that extra rows show), and compares it as a multiset with DuckDB's rows.
Rows the flush tuples make are set apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from peer.client import Client
from peer.examples import compare
from peer.examples.nexmark import (
    QUERIES,
    SCHEMAS,
    SOURCE_STREAMS,
    GeneratorConfig,
    chunks,
    flush,
    generate,
    real_rows,
    sql,
    stages,
)
from peer.testing import PeerThread

pytestmark = pytest.mark.spark

CFG = GeneratorConfig(event_rate=100, seed=15, active_people=40)
EVENTS = 6000
PIECE = 500
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def duckdb_rows(queries: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """DuckDB's rows of each query's SQL over the generated events (also the reference of the
    cluster tests, tests/integration/test_spark_cluster.py)."""
    con = duckdb.connect()
    for stream, table in generate(CFG, 0, EVENTS).items():
        con.register(stream, table)
    out = {}
    for q in queries:
        cursor = con.execute(sql(q, CFG))
        names = [d[0] for d in cursor.description]
        out[q] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return out


@pytest.fixture(scope="module")
def expected() -> dict[str, list[dict[str, Any]]]:
    return duckdb_rows(QUERIES)


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A result row with its timestamps as microseconds since the epoch, as the SQL gives them."""
    return {
        k: (v - EPOCH) // (datetime.resolution) if isinstance(v, datetime) else v
        for k, v in row.items()
    }


async def run_query(
    connect: Callable[[], Client], q: str, want: int, *, timeout_s: float
) -> list[dict[str, Any]]:
    """Query ``q``'s stages on the peer ``connect`` reaches, fed the generated events: its rows."""
    prefix = f"{q}:"
    async with connect() as c:
        for schema in SCHEMAS:
            await c.create_schema(schema)  # an identical schema that exists is fine
        for stream, schema_name in SOURCE_STREAMS.items():
            await c.create_stream(prefix + stream, schema_name)
        queries = stages(q, prefix=prefix, cfg=CFG)
        for query in queries:
            await c.create_query(query)
            await c.start_query(query["name"])
        pieces: list[dict[str, pa.Table]] = [t for _, t in chunks(CFG, EVENTS, PIECE)]
        for tables in [*pieces, flush(CFG, EVENTS)]:
            for stream, table in tables.items():
                await c.push(prefix + stream, table)
        rows: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                settling = False
                async for batch in c.subscribe(prefix + q, start="earliest"):
                    rows.extend(real_rows(q, [plain(r) for r in batch.rows()]))
                    if len(rows) >= want and not settling:
                        settling = True  # go on a little: extra rows would show
                        deadline.reschedule(loop.time() + 3.0)
        except TimeoutError:
            pass
        for query in reversed(queries):
            await c.set_query_status(query["name"], "DELETED")
        return rows


@pytest.mark.parametrize("q", QUERIES)
def test_query_matches_duckdb(
    peer: PeerThread, expected: dict[str, list[dict[str, Any]]], q: str
) -> None:
    want = expected[q]
    assert want, f"{q}: the generated events give no result; the test would prove nothing"

    def connect() -> Client:
        return Client("127.0.0.1", peer.port, timeout_s=120)

    got = asyncio.run(run_query(connect, q, len(want), timeout_s=120))
    assert compare(got, want) == []
