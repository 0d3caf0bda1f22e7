"""Query files as Borealis and Medusa write them, run unchanged on real Spark.

The corpus (tests/data/borealis/) holds whole ``<borealis>`` documents (a DOCTYPE line,
schemas, input and output declarations, several queries chained by streams, aggregates with
``order-by``, joins with their order and buffer parameters, load-shedding boxes at rate 0,
nullable fields) and the Medusa paper's appendix query. Each is submitted through the real
``peer`` command (``query submit``, which reads a whole document), fed generated tuples over
loopback, and its result streams are compared tuple for tuple, as multisets, with a plain
Python computation of the same semantics (SQL NULLs included).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from peer.cli import main as cli_main
from peer.client import Client
from peer.testing import PeerThread, collect

pytestmark = pytest.mark.spark

CORPUS = Path(__file__).parent.parent / "data" / "borealis"


def cli(peer: PeerThread, *argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main([*argv, "--peer", f"127.0.0.1:{peer.port}", "--timeout", "120"])
    assert code == 0, out.getvalue()
    return out.getvalue()


def push_and_collect(
    peer: PeerThread, pushes: dict[str, list[dict[str, Any]]], expect: dict[str, int]
) -> dict[str, list[dict[str, Any]]]:
    """Push each stream's rows in chunks, the streams interleaved chunk by chunk (a join's
    sides then advance together, so no tuple is behind the watermark), then collect."""

    async def go() -> dict[str, list[dict[str, Any]]]:
        async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
            longest = max(len(rows) for rows in pushes.values())
            for i in range(0, longest, 100):
                for stream, rows in pushes.items():
                    if rows[i : i + 100]:
                        await c.push(stream, {"rows": rows[i : i + 100]})
            return {
                stream: await collect(c, stream, count, timeout_s=120, settle_s=2.0)
                for stream, count in expect.items()
            }

    return asyncio.run(go())


def multiset(rows: list[dict[str, Any]], fields: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple(round(r[f], 6) if isinstance(r[f], float) else r[f] for f in fields) for r in rows
    )


def test_chained_queries_with_a_nullable_field(peer: PeerThread) -> None:
    out = cli(peer, "query", "submit", str(CORPUS / "stock.xml"), "--start")
    assert '"StockType_USD"' in out and "USQuoteToCanadian" in out
    rng = random.Random(1)
    rows: list[dict[str, Any]] = [
        {
            "symbol": rng.choice(["IBM", "MSFT", "ORCL"]),
            "time": i,
            "price_usd": round(rng.uniform(10, 200), 2),
            "volume": None if rng.random() < 0.3 else rng.randrange(0, 300),
        }
        for i in range(600)
    ]
    busy = [r for r in rows if r["volume"] is not None and r["volume"] > 100]
    quiet = [r for r in rows if not (r["volume"] is not None and r["volume"] > 100)]
    want_br = Counter((r["symbol"], r["time"], round(r["price_usd"] / 0.75 / 2.5, 6)) for r in busy)
    got = push_and_collect(
        peer, {"Stock_USD": rows}, {"Stock_BR": len(busy), "Stock_USD_quiet": len(quiet)}
    )
    assert multiset(got["Stock_BR"], ["symbol", "time", "price_br"]) == want_br
    fields = ["symbol", "time", "price_usd", "volume"]
    assert multiset(got["Stock_USD_quiet"], fields) == multiset(quiet, fields)
    assert any(r["volume"] is None for r in got["Stock_USD_quiet"])


def _sum(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def test_aggregates_with_order_by_and_load_shedding_at_rate_zero(peer: PeerThread) -> None:
    cli(peer, "query", "submit", str(CORPUS / "packets.xml"), "--start")
    rng = random.Random(2)
    rows: list[dict[str, Any]] = [
        {
            "time": i // 4,
            "source": rng.randrange(3),
            "size": None if rng.random() < 0.25 else rng.randrange(40, 1500),
            "proto": rng.choice(["tcp", "udp"]),
        }
        for i in range(800)
    ]
    # VALUES windows of 10 advancing by 5, aligned to multiples of 5 (independent alignment);
    # a window is emitted once the largest time seen passes its end (slack 0).
    watermark = max(r["time"] for r in rows)
    windows: dict[tuple[int, int], list[int | None]] = defaultdict(list)
    for r in rows:
        for start in range((r["time"] // 5) * 5 - 5, r["time"] + 1, 5):
            if start <= r["time"] < start + 10:
                windows[(start, r["source"])].append(r["size"])
    want_stats: Counter[tuple[Any, ...]] = Counter()
    for (start, source), sizes in windows.items():
        if start + 10 <= watermark:
            present = [s for s in sizes if s is not None]
            want_stats[
                (
                    start,
                    start + 10,
                    source,
                    len(sizes),
                    _sum(sizes),
                    len(present),
                    max(present) if present else None,
                )
            ] += 1
    # TUPLES windows of 4 per source in arrival order (TUPLENUM).
    by_source: dict[int, list[int | None]] = defaultdict(list)
    for r in rows:
        by_source[r["source"]].append(r["size"])
    want_runs: Counter[tuple[Any, ...]] = Counter()
    for source, sizes in by_source.items():
        for start in range(0, len(sizes) - 3, 4):
            run = sizes[start : start + 4]
            want_runs[
                (start, start + 4, source, _sum(run), len([s for s in run if s is not None]))
            ] += 1
    got = push_and_collect(
        peer,
        {"Packets": rows},
        {"SourceStats": sum(want_stats.values()), "SourceRuns": sum(want_runs.values())},
    )
    stats = ["window_start", "window_end", "source", "n", "total", "sized", "biggest"]
    assert multiset(got["SourceStats"], stats) == want_stats
    assert any(r["total"] is not None and r["sized"] < r["n"] for r in got["SourceStats"])
    runs = ["window_start", "window_end", "source", "total", "sized"]
    assert multiset(got["SourceRuns"], runs) == want_runs


def test_join_filter_and_window_drop(peer: PeerThread) -> None:
    cli(peer, "query", "submit", str(CORPUS / "trades.xml"), "--start")
    rng = random.Random(3)
    symbols = ["IBM", "HPQ", "SUN"]
    quotes: list[dict[str, Any]] = [
        {"time": t, "symbol": s, "price": round(rng.uniform(5, 60), 2)}
        for t in range(60)
        for s in symbols
        if rng.random() < 0.6
    ]
    trades: list[dict[str, Any]] = [
        {"time": t, "symbol": rng.choice(symbols), "qty": rng.randrange(1, 40)}
        for t in range(60)
        for _ in range(2)
    ]
    # left = quotes, right = trades: left.time - right.time < 2 and right.time - left.time < 3
    matched = [
        (q["time"], q["symbol"], q["price"], tr["time"], tr["qty"])
        for q in quotes
        for tr in trades
        if q["symbol"] == tr["symbol"] and q["time"] - tr["time"] < 2 and tr["time"] - q["time"] < 3
    ]
    big = Counter((m[0], m[1], round(m[2], 6), m[3], m[4]) for m in matched if m[4] * m[2] > 500)
    small = Counter(
        (m[0], m[1], round(m[2], 6), m[3], m[4]) for m in matched if not m[4] * m[2] > 500
    )
    got = push_and_collect(
        peer,
        {"Quotes": quotes, "Trades": trades},
        {"BigKept": sum(big.values()), "Small": sum(small.values())},
    )
    fields = ["qtime", "symbol", "price", "ttime", "qty"]
    assert multiset(got["BigKept"], fields) == big
    assert multiset(got["Small"], fields) == small


def test_medusa_appendix_query(peer: PeerThread) -> None:
    people = "medusa://nms.lcs.mit.edu/locator/people"
    person = "medusa://nms.lcs.mit.edu/locator/person"
    cli(peer, "schema", "create", str(CORPUS / "medusa_person.xml"))
    cli(peer, "stream", "create", people, "--schema", person)
    cli(peer, "query", "submit", str(CORPUS / "medusa_findmrx.xml"), "--start")
    rng = random.Random(4)
    rows = [{"person_name": f"p{i}", "person_id": rng.randrange(5)} for i in range(300)]
    want = [r for r in rows if r["person_id"] == 2]
    got = push_and_collect(
        peer, {people: rows}, {"medusa://nms.lcs.mit.edu/locator/MrX": len(want)}
    )
    fields = ["person_name", "person_id"]
    assert multiset(got["medusa://nms.lcs.mit.edu/locator/MrX"], fields) == multiset(want, fields)
