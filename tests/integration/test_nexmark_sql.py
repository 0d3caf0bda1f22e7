"""NEXMark q0, q1, q2, q3, q5, q7 and q8 in the SQL text Flink's NEXMark suite publishes
(peer.examples.nexmark.flink_sql; only the source DDL is fedstream's), sent to one real peer
as SQL text (create_sql), compiled there by peer.model.sql and run on real Spark, against
DuckDB computing each published query's semantics on the same events, tuple for tuple; the
peer's status names q3's unbounded state, and no other's. q4 as published is refused.

As tests/integration/test_nexmark.py: 6,000 events at 100 events/s pushed in pieces of 500,
then the flush tuples; the result stream is read until every expected row came (and 3 s
more, so that extra rows show). Rows the flush tuples make are set apart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from peer.client import Client
from peer.errors import SqlError
from peer.examples import compare
from peer.examples.nexmark import FLUSH_KEYS, GeneratorConfig, chunks, flush, generate
from peer.examples.nexmark.flink_sql import as_flink, script
from peer.model.sql import compile_script
from peer.testing import PeerThread
from tests.integration.test_nexmark import plain

pytestmark = pytest.mark.spark

CFG = GeneratorConfig(event_rate=100, seed=15, active_people=40)
EVENTS = 6000
PIECE = 500
W = 10_000_000  # 10 s in microseconds
SLIDE = 2_000_000

# Each published query's meaning in DuckDB (times as microseconds since the epoch).
REFERENCE = {
    "q0": "SELECT auction, bidder, price, epoch_us(date_time) AS dateTime, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908::DOUBLE * price AS price, "
    "epoch_us(date_time) AS dateTime, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p ON a.seller = p.id "
    "WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')",
    "q5": f"""
        WITH counts AS (
            SELECT epoch_us(date_time) // {SLIDE} * {SLIDE} - k * {SLIDE} AS ws, auction,
                   count(*) AS num
            FROM bid, range({W // SLIDE}) AS r(k) GROUP BY 1, 2),
        most AS (SELECT ws, max(num) AS maxn FROM counts GROUP BY ws)
        SELECT c.auction, c.num FROM counts c JOIN most m ON c.ws = m.ws AND c.num >= m.maxn""",
    "q7": f"""
        WITH highest AS (SELECT epoch_us(date_time) // {W} * {W} + {W} AS we,
                                max(price) AS maxprice FROM bid GROUP BY 1)
        SELECT b.auction, b.bidder, b.price, epoch_us(b.date_time) AS dateTime, b.extra
        FROM bid b JOIN highest h ON b.price = h.maxprice
         AND epoch_us(b.date_time) BETWEEN h.we - {W} AND h.we""",
    "q8": f"""
        WITH p AS (SELECT DISTINCT id, name, epoch_us(date_time) // {W} * {W} AS ws FROM person),
             a AS (SELECT DISTINCT seller, epoch_us(date_time) // {W} * {W} AS ws FROM auction)
        SELECT p.id, p.name, p.ws AS stime FROM p JOIN a ON p.id = a.seller AND p.ws = a.ws""",
}
# The field that is negative exactly for rows the flush tuples make.
KEYS = {**FLUSH_KEYS, "q8": "id"}


@pytest.fixture(scope="module")
def expected() -> dict[str, list[dict[str, Any]]]:
    con = duckdb.connect()
    for stream, table in generate(CFG, 0, EVENTS).items():
        con.register(stream, table)
    out = {}
    for q, text in REFERENCE.items():
        cursor = con.execute(text)
        names = [d[0] for d in cursor.description]
        out[q] = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return out


async def run_query(
    port: int, q: str, want: int, *, timeout_s: float
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The result rows of ``q``'s published text, sent to the peer to compile (create_sql),
    and the unbounded state ``peer status`` names for its queries."""
    prefix = f"sql{q}:"
    out = f"{prefix}nexmark_{q}"
    async with Client("127.0.0.1", port, timeout_s=120) as c:
        done = await c.submit_sql(script(q), name=q, start=True, namespace=prefix)
        assert done.queries == tuple(
            query.name for query in compile_script(script(q), name=q, namespace=prefix).queries
        )
        status = await c.status()
        unbounded = {
            entry["name"]: entry["unbounded_state"]
            for entry in status.queries
            if entry["name"] in done.queries and "unbounded_state" in entry
        }
        pieces: list[dict[str, pa.Table]] = [t for _, t in chunks(CFG, EVENTS, PIECE)]
        for tables in [*pieces, flush(CFG, EVENTS)]:
            for stream, table in tables.items():
                await c.push(prefix + stream, as_flink(table))
        rows: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                settling = False
                async for batch in c.subscribe(out, start="earliest"):
                    rows.extend(r for r in map(plain, batch.rows()) if r[KEYS[q]] >= 0)
                    if len(rows) >= want and not settling:
                        settling = True
                        deadline.reschedule(loop.time() + 3.0)
        except TimeoutError:
            pass
        for name in reversed(done.queries):
            await c.set_query_status(name, "DELETED")
        return rows, unbounded


@pytest.mark.parametrize("q", sorted(REFERENCE))
def test_published_sql_matches_duckdb(
    peer: PeerThread, expected: dict[str, list[dict[str, Any]]], q: str
) -> None:
    want = expected[q]
    assert want, f"{q}: the generated events give no result; the test would prove nothing"
    got, unbounded = asyncio.run(run_query(peer.port, q, len(want), timeout_s=120))
    assert compare(got, want) == []
    # only q3's join has no time bound; peer status names what it keeps
    if q == "q3":
        assert unbounded == {
            "sqlq3_q3": ["join join2 keeps every sqlq3:auction and sqlq3:person (no time bound)"]
        }
    else:
        assert unbounded == {}


def test_published_q4_is_refused() -> None:
    with pytest.raises(SqlError) as refused:
        compile_script(script("q4"), name="q4")
    assert (refused.value.details["line"], refused.value.details["column"]) == (31, 5)
    assert "an aggregate over the join of A and B would change its results forever" in str(
        refused.value
    )
