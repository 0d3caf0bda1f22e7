"""A corpus of SQL, one query per construct of docs/sql.md, compiled by peer.model.sql and run
on real Spark through one real peer, each compared tuple for tuple with DuckDB computing the
same SQL's meaning over the same tuples. The scripts go through the client's SQL path
(``Client.create_query`` with SQL text, and ``peer query submit FILE.sql`` in a process).

Two streams of deterministic tuples, 40 s of event time: ``trades`` (a tuple every 100 ms)
and ``quotes`` (every 150 ms), then per stream one tuple an hour and one two hours later, so
that every window of the data closes. Rows at or after the hour are left out on both sides.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from peer.client import Client
from peer.examples import compare
from peer.testing import PeerThread
from tests.integration.test_nexmark import EPOCH, plain

pytestmark = pytest.mark.spark

BASE = datetime(2026, 1, 1, tzinfo=UTC)
HOUR_US = 3600 * 1_000_000
BASE_US = (BASE - EPOCH) // timedelta(microseconds=1)
SYMS = ["A", "B", "C", "D"]

DDL = """\
CREATE STREAM {p}trades (sym VARCHAR(4) NOT NULL, px DOUBLE NOT NULL, qty BIGINT NOT NULL,
  t TIMESTAMP(3) NOT NULL, WATERMARK FOR t AS t - INTERVAL '1' SECOND);
CREATE STREAM {p}quotes (sym VARCHAR(4) NOT NULL, bid DOUBLE NOT NULL, t TIMESTAMP(3) NOT NULL,
  WATERMARK FOR t AS t);
"""


def tables() -> dict[str, pa.Table]:
    trades = [(SYMS[i % 4 if i % 7 else 1], float((i * 37) % 100) + 0.5, (i * 13) % 11,
               BASE + timedelta(milliseconds=100 * i)) for i in range(400)]  # fmt: skip
    quotes = [(SYMS[(i * 3) % 4], float((i * 29) % 90), BASE + timedelta(milliseconds=150 * i))
              for i in range(267)]  # fmt: skip
    for hours in (1, 2):
        later = BASE + timedelta(hours=hours)
        trades.append(("Z", 1.0, 1, later))
        quotes.append(("Z", 1.0, later))
    return {
        "trades": pa.table(
            {
                "sym": [r[0] for r in trades],
                "px": [r[1] for r in trades],
                "qty": [r[2] for r in trades],
                "t": pa.array([r[3] for r in trades], pa.timestamp("us", tz="UTC")),
            }
        ),
        "quotes": pa.table(
            {
                "sym": [r[0] for r in quotes],
                "bid": [r[1] for r in quotes],
                "t": pa.array([r[2] for r in quotes], pa.timestamp("us", tz="UTC")),
            }
        ),
    }


W5 = 5_000_000
# name: (SQL body after the DDL, with {p} for the namespace; DuckDB SQL; the output's time
# column that sets rows at or after the hour apart)
CORPUS: dict[str, tuple[str, str, str]] = {
    "filter_case_mod": (
        "INSERT INTO {p}out SELECT sym, CASE WHEN px > 50 THEN 'hi' ELSE 'lo' END AS band, "
        "qty * 2 AS q2, t FROM {p}trades WHERE MOD(qty, 3) <> 0 OR sym = 'B'",
        "SELECT sym, CASE WHEN px > 50 THEN 'hi' ELSE 'lo' END AS band, qty * 2 AS q2, "
        "epoch_us(t) AS t FROM trades WHERE qty % 3 <> 0 OR sym = 'B'",
        "t",
    ),
    "union_all": (
        "INSERT INTO {p}out SELECT sym, px AS price, t FROM {p}trades WHERE qty > 5 "
        "UNION ALL SELECT sym, bid, t FROM {p}quotes",
        "SELECT sym, px AS price, epoch_us(t) AS t FROM trades WHERE qty > 5 "
        "UNION ALL SELECT sym, bid, epoch_us(t) FROM quotes",
        "t",
    ),
    "tumble_having": (
        "INSERT INTO {p}out SELECT window_start AS ws, sym, COUNT(*) AS n, "
        "COUNT(DISTINCT qty) AS kinds, SUM(qty) AS total, AVG(px) AS mean, MIN(px) AS lo, "
        "MAX(px) AS hi FROM TABLE(TUMBLE(TABLE {p}trades, DESCRIPTOR(t), INTERVAL '5' SECOND)) "
        "GROUP BY window_start, window_end, sym HAVING COUNT(*) > 3",
        f"SELECT epoch_us(t) // {W5} * {W5} AS ws, sym, count(*) AS n, "
        "count(DISTINCT qty) AS kinds, sum(qty) AS total, avg(px) AS mean, min(px) AS lo, "
        "max(px) AS hi FROM trades GROUP BY 1, 2 HAVING count(*) > 3",
        "ws",
    ),
    "hop": (
        "INSERT INTO {p}out SELECT window_start AS ws, window_end AS we, sym, COUNT(*) AS n "
        "FROM TABLE(HOP(TABLE {p}quotes, DESCRIPTOR(t), INTERVAL '5' SECOND, "
        "INTERVAL '10' SECOND)) GROUP BY window_start, window_end, sym",
        f"SELECT epoch_us(t) // {W5} * {W5} - k * {W5} AS ws, "
        f"epoch_us(t) // {W5} * {W5} - k * {W5} + {2 * W5} AS we, sym, count(*) AS n "
        "FROM quotes, range(2) AS r(k) GROUP BY 1, 2, 3",
        "ws",
    ),
    "interval_join": (
        "INSERT INTO {p}out SELECT tr.sym, tr.px, qu.bid, tr.t AS traded, qu.t AS quoted "
        "FROM {p}trades tr JOIN {p}quotes qu ON tr.sym = qu.sym "
        "AND qu.t BETWEEN tr.t - INTERVAL '1' SECOND AND tr.t WHERE tr.qty > 2",
        "SELECT tr.sym, tr.px, qu.bid, epoch_us(tr.t) AS traded, epoch_us(qu.t) AS quoted "
        "FROM trades tr JOIN quotes qu ON tr.sym = qu.sym AND qu.t BETWEEN "
        "tr.t - INTERVAL 1 SECOND AND tr.t WHERE tr.qty > 2",
        "traded",
    ),
    "window_join_of_views": (
        "CREATE VIEW {p}tn AS SELECT sym, window_start AS ws, COUNT(*) AS n FROM "
        "TABLE(TUMBLE(TABLE {p}trades, DESCRIPTOR(t), INTERVAL '5' SECOND)) "
        "GROUP BY sym, window_start, window_end;\n"
        "CREATE VIEW {p}qm AS SELECT sym, window_start AS ws, MAX(bid) AS top FROM "
        "TABLE(TUMBLE(TABLE {p}quotes, DESCRIPTOR(t), INTERVAL '5' SECOND)) "
        "GROUP BY sym, window_start, window_end;\n"
        "CREATE QUERY {q}named AS INSERT INTO {p}out SELECT a.sym, a.ws, a.n, b.top "
        "FROM {p}tn a JOIN {p}qm b ON a.sym = b.sym AND a.ws = b.ws",
        f"WITH a AS (SELECT sym, epoch_us(t) // {W5} * {W5} AS ws, count(*) AS n FROM trades "
        "GROUP BY 1, 2), b AS (SELECT sym, epoch_us(t) // "
        f"{W5} * {W5} AS ws, max(bid) AS top FROM quotes GROUP BY 1, 2) "
        "SELECT a.sym, a.ws, a.n, b.top FROM a JOIN b ON a.sym = b.sym AND a.ws = b.ws",
        "ws",
    ),
}


def expected(name: str) -> list[dict[str, Any]]:
    _, reference, time_column = CORPUS[name]
    con = duckdb.connect()
    for stream, table in tables().items():
        con.register(stream, table)
    cursor = con.execute(reference)
    names = [d[0] for d in cursor.description]
    rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return [r for r in rows if r[time_column] < BASE_US + HOUR_US]


async def run(port: int, name: str, want: int, *, via_cli: Path | None) -> list[dict[str, Any]]:
    p = f"{name}_"
    body, _, time_column = CORPUS[name]
    text = DDL.format(p=p) + body.format(p=p, q=f"{name}_")
    async with Client("127.0.0.1", port, timeout_s=120) as c:
        if via_cli is None:
            submitted = await c.create_query(text, name=f"{name}_query")
            for query in submitted["queries"]:
                await c.start_query(query)
        else:
            via_cli.write_text(text)
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "peer.cli", "query", "submit", str(via_cli), "--start",
                 "--peer", f"127.0.0.1:{port}"],
                capture_output=True, text=True, timeout=120, env=dict(os.environ),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        for stream, table in tables().items():
            await c.push(p + stream, table)
        rows: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(90) as deadline:
                settling = False
                async for batch in c.subscribe(f"{p}out", start="earliest"):
                    for row in map(plain, batch.rows()):
                        if row[time_column] < BASE_US + HOUR_US:
                            rows.append(row)
                    if len(rows) >= want and not settling:
                        settling = True
                        deadline.reschedule(loop.time() + 3.0)
        except TimeoutError:
            pass
        return rows


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_sql_construct_matches_duckdb(peer: PeerThread, name: str, tmp_path: Path) -> None:
    want = expected(name)
    assert want, f"{name}: the tuples give no result; the test would prove nothing"
    via_cli = tmp_path / f"{name}.sql" if name == "union_all" else None
    got = asyncio.run(run(peer.port, name, len(want), via_cli=via_cli))
    assert compare(got, want) == []
