"""The stateless lane: many per-tuple queries in one Spark streaming query, results exact.

Members join while the lane runs (one on streams the lane already reads, one that needs a new
stream and so restarts the lane), one leaves; every member's output is compared with plain
Python over exactly the tuples pushed while it was running.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.node import PeerConfig
from peer.testing import PeerThread, collect, wait_until_sync

pytestmark = pytest.mark.spark

SCHEMA = {"name": "ev", "fields": [{"name": "k", "type": "int"}, {"name": "v", "type": "long"}]}


@pytest.fixture(scope="module")
def peer_options() -> dict[str, Any]:
    # lane_after=0: every per-tuple query joins the lane (by default the first runs on its own).
    return {"lane_after": 0}


def batch(rng: random.Random, n: int) -> dict[str, list[int]]:
    return {
        "k": [rng.randrange(10) for _ in range(n)],
        "v": [rng.randrange(1000) for _ in range(n)],
    }


def flt(name: str, src: str, out: str, cond: str) -> dict[str, Any]:
    return {
        "name": name,
        "boxes": [
            {
                "name": "f",
                "type": "filter",
                "inputs": [src],
                "outputs": [out],
                "params": {"expression.0": cond},
            }
        ],
    }


def rows_of(batches: list[dict[str, list[int]]]) -> list[tuple[int, int]]:
    return [(k, v) for b in batches for k, v in zip(b["k"], b["v"], strict=True)]


def test_members_join_and_leave_with_exact_output(peer: PeerThread) -> None:
    rng = random.Random(3)

    async def go() -> dict[str, Any]:
        async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
            await c.create_schema(SCHEMA)
            await c.create_stream("lane_a", "ev")
            await c.create_stream("lane_b", "ev")
            await c.create_query(flt("big", "lane_a", "lane_big", "v >= 900"))
            await c.create_query(flt("even", "lane_a", "lane_even", "v % 2 = 0"))
            await c.create_query(
                {
                    "name": "both",
                    "boxes": [
                        {
                            "name": "u",
                            "type": "union",
                            "inputs": ["lane_a", "lane_b"],
                            "outputs": ["lane_ab"],
                        },
                        {
                            "name": "m",
                            "type": "map",
                            "inputs": ["lane_ab"],
                            "outputs": ["lane_sq"],
                            "params": {
                                "expression.0": "k",
                                "output-field-name.0": "k",
                                "expression.1": "v * v",
                                "output-field-name.1": "v2",
                            },
                        },
                    ],
                }
            )
            await c.start_query("big")
            first = [batch(rng, 500) for _ in range(4)]
            for b in first:
                await c.push("lane_a", {"columns": b})
            big_1 = [r for r in rows_of(first) if r[1] >= 900]
            got_big = await collect(c, "lane_big", len(big_1), timeout_s=90)
            assert Counter(map(tuple, ([r["k"], r["v"]] for r in got_big))) == Counter(big_1)

            # A member on a stream the lane reads already: no restart, sees new tuples only.
            await c.start_query("even")
            # A member that needs lane_b: the lane restarts over both streams.
            await c.start_query("both")
            second_a = [batch(rng, 400) for _ in range(3)]
            second_b = [batch(rng, 300) for _ in range(3)]
            for a, b in zip(second_a, second_b, strict=True):
                await c.push("lane_a", {"columns": a})
                await c.push("lane_b", {"columns": b})
            status = await c.status()
            lane = {q["name"]: q.get("lane") for q in status["queries"]}
            # The last member leaves; the others keep running.
            want_even = [r for r in rows_of(second_a) if r[1] % 2 == 0]
            got_even = await collect(c, "lane_even", len(want_even), timeout_s=90)
            await c.set_query_status("even", "STOPPED")
            third = [batch(rng, 200)]
            await c.push("lane_a", {"columns": third[0]})
            want_big = big_1 + [r for r in rows_of(second_a + third) if r[1] >= 900]
            want_sq = [(k, v * v) for k, v in rows_of(second_a + second_b + third)]
            got_big = await collect(c, "lane_big", len(want_big), timeout_s=90, settle_s=3)
            got_sq = await collect(c, "lane_sq", len(want_sq), timeout_s=90, settle_s=3)
            got_even_after = await collect(c, "lane_even", len(want_even), timeout_s=30, settle_s=3)
            return {
                "lane": lane,
                "even": got_even,
                "even_after": got_even_after,
                "big": got_big,
                "sq": got_sq,
                "want_even": want_even,
                "want_big": want_big,
                "want_sq": want_sq,
            }

    r = asyncio.run(go())
    assert r["lane"] == {"big": True, "even": True, "both": True}
    assert Counter((x["k"], x["v"]) for x in r["even"]) == Counter(r["want_even"])
    # Stopped before the third batch: nothing of it reached lane_even.
    assert Counter((x["k"], x["v"]) for x in r["even_after"]) == Counter(r["want_even"])
    assert Counter((x["k"], x["v"]) for x in r["big"]) == Counter(r["want_big"])
    # "both" started before second_a/second_b were pushed and saw all of them.
    assert Counter((x["k"], x["v2"]) for x in r["sq"]) == Counter(r["want_sq"])


def test_the_lane_source_reads_each_stream_to_its_watermark(spark: Any, tmp_path: Path) -> None:
    import json
    import threading
    import time

    import pyarrow as pa

    from peer.engine.lane_source import SOURCE_NAME, STREAM, column_name, register_lane_source
    from peer.storage.spool import Spool

    register_lane_source(spark)
    schema = pa.schema([("k", pa.int32()), ("v", pa.int64())])
    held, free = (Spool(tmp_path / n, schema, fsync=False) for n in ("held", "free"))
    spec: dict[str, list[dict[str, Any]]] = {"streams": []}
    for spool in (held, free):
        spool.register_reader("lane")
        spec["streams"].append(
            {
                "name": spool.directory.name,
                "dir": str(spool.directory),
                "reader": "lane",
                "fields": [["k", "int"], ["v", "long"]],
            }
        )
        for i in range(4):
            spool.append(pa.table({"k": pa.array([i] * 5, pa.int32()), "v": [i] * 5}))
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    held.hold(1)  # the held stream: offsets 2 and 3 are not acknowledged yet
    lock = threading.Lock()
    seen: list[tuple[int, int]] = []  # (stream index, k)

    def sink(df: Any, _batch_id: int) -> None:
        table = df.toArrow()
        with lock:
            seen.extend(
                zip(
                    table.column(STREAM).to_pylist(),
                    table.column(column_name(0, "k")).to_pylist(),
                    strict=True,
                )
            )

    def count(stream: int) -> int:
        with lock:
            return sum(1 for s, _ in seen if s == stream)

    frame = spark.readStream.format(SOURCE_NAME).option("spec", str(tmp_path / "spec.json"))
    query = (
        frame.load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="0 seconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        wait_until_sync(
            lambda: count(0) >= 10 and count(1) >= 20, "both streams", 90.0, every_s=0.1
        )
        time.sleep(1.5)  # idle plans: the held stream stays at its watermark
        assert (count(0), count(1)) == (10, 20)
        held.hold(3)
        wait_until_sync(lambda: count(0) >= 20, "the held stream's rest", 90.0, every_s=0.1)
        time.sleep(0.5)
        assert query.exception() is None
    finally:
        query.stop()
    with lock:
        assert sorted(k for s, k in seen if s == 0) == sorted([0, 1, 2, 3] * 5)
        assert len(seen) == 40


# ---------------------------------------------------------------- windowed aggregates in the lane

WIN = {
    "name": "wev",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long", "nullable": True},
        {"name": "t", "type": "long"},
    ],
}


def window_query(name: str, src: str, out: str, size: int, advance: int, fn: list[str]) -> Any:
    params = {
        "window-size-by": "VALUES",
        "order-on-field": "t",
        "window-size": str(size),
        "advance": str(advance),
        "slack": "2",
        "group-by": "k",
    }
    for i, call in enumerate(fn):
        params[f"aggregate-function.{i}"] = call
        params[f"aggregate-function-output-name.{i}"] = f"a{i}"
    return {
        "name": name,
        "boxes": [
            flt(name, src, f"{out}_f", "k <> 3")["boxes"][0],
            {
                "name": "w",
                "type": "aggregate",
                "inputs": [f"{out}_f"],
                "outputs": [out],
                "params": params,
            },
        ],
    }


def events(rng: random.Random, start: int, end: int, n: int) -> list[dict[str, Any]]:
    """``n`` tuples with t from start to end, a little out of order (within the slack)."""
    rows = []
    for i in range(n):
        t = start + (end - start) * i // n + rng.choice([0, 0, -1, -2])
        rows.append({"k": rng.randrange(5), "v": rng.choice([None, *range(20)]), "t": t})
    return rows


def duck(rows: list[dict[str, Any]], size: int, advance: int, aggs: str) -> list[tuple[Any, ...]]:
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE ev (k INTEGER, v BIGINT, t BIGINT)")
    con.executemany("INSERT INTO ev VALUES (?, ?, ?)", [(r["k"], r["v"], r["t"]) for r in rows])
    sql = f"""
        WITH w AS (
            SELECT CAST(floor(t / {advance}) AS BIGINT) * {advance} - {advance} * i AS s, k, v, t
            FROM ev, range(0, {size // advance}) AS g(i) WHERE k <> 3
        )
        SELECT s, s + {size}, k, {aggs} FROM w WHERE t < s + {size} GROUP BY s, k
    """
    return [tuple(r) for r in con.execute(sql).fetchall()]


def test_windowed_members_keep_their_own_watermarks_across_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    """Two windowed aggregates in the lane, on streams 100,000 s apart in event time (one
    Spark query with one watermark would drop every tuple of the stream behind as late).
    The peer restarts between two halves whose windows overlap; each member's output is
    DuckDB's over its tuples, tuple for tuple, none twice."""
    rng = random.Random(11)
    ahead = events(rng, 100_000, 100_200, 600) + events(rng, 100_200, 100_400, 600)
    # (From t = 5: Spark's first watermark is the epoch, so a window ending at or before
    # t = 0 would be late from the start, in the lane as in a query of its own.)
    behind = events(rng, 5, 200, 600) + events(rng, 200, 400, 600)
    flush_ahead = {"k": 0, "v": 0, "t": 200_000}
    flush_behind = {"k": 0, "v": 0, "t": 100_000}
    fa = ["count()", "sum(v)", "avg(v)", "max(v)"]
    fb = ["count(v)", "count_distinct(v)", "min(v)"]
    want_a = duck(ahead, 20, 5, "count(*), sum(v), avg(v), max(v)")
    want_b = duck(behind, 10, 10, "count(v), count(DISTINCT v), min(v)")
    config = PeerConfig(data_dir=tmp_path / "p", port=0, maintenance_interval_s=1.0, lane_after=0)

    def cols(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
        return {f: [r[f] for r in rows] for f in ("k", "v", "t")}

    async def first_half(port: int) -> dict[str, Any]:
        async with Client("127.0.0.1", port, timeout_s=120) as c:
            await c.create_schema(WIN)
            await c.create_stream("wa", "wev")
            await c.create_stream("wb", "wev")
            await c.create_query(window_query("qa", "wa", "wa_out", 20, 5, fa))
            await c.create_query(window_query("qb", "wb", "wb_out", 10, 10, fb))
            await c.start_query("qa")
            await c.start_query("qb")
            for i in range(0, 600, 100):
                await c.push("wa", {"columns": cols(ahead[i : i + 100])})
                await c.push("wb", {"columns": cols(behind[i : i + 100])})
            # Windows that end at or before the newest t - slack are out (no late tuples).
            closed_a = [w for w in want_a if w[1] <= max(r["t"] for r in ahead[:600]) - 2]
            got = await collect(c, "wa_out", len(closed_a), timeout_s=90)
            status = await c.status()
            return {"lane": {q["name"]: q.get("lane") for q in status["queries"]}, "got": got}

    async def second_half(port: int) -> dict[str, list[dict[str, Any]]]:
        async with Client("127.0.0.1", port, timeout_s=120) as c:
            for i in range(600, 1200, 100):
                await c.push("wa", {"columns": cols(ahead[i : i + 100])})
                await c.push("wb", {"columns": cols(behind[i : i + 100])})
            await c.push("wa", {"columns": cols([flush_ahead])})
            await c.push("wb", {"columns": cols([flush_behind])})
            got_a = await collect(c, "wa_out", len(want_a), timeout_s=120, settle_s=3)
            got_b = await collect(c, "wb_out", len(want_b), timeout_s=60, settle_s=3)
            return {"a": got_a, "b": got_b}

    with PeerThread(config, spark) as peer:
        first = asyncio.run(first_half(peer.port))
    assert first["lane"] == {"qa": True, "qb": True}
    assert first["got"], "no window closed before the restart"
    with PeerThread(config, spark) as peer:
        second = asyncio.run(second_half(peer.port))

    def rows(got: list[dict[str, Any]], n: int) -> Counter[tuple[Any, ...]]:
        keys = ["window_start", "window_end", "k"] + [f"a{i}" for i in range(n)]
        return Counter(
            tuple(round(r[f], 9) if isinstance(r[f], float) else r[f] for f in keys) for r in got
        )

    def want(w: list[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
        return Counter(tuple(round(x, 9) if isinstance(x, float) else x for x in r) for r in w)

    assert rows(second["a"], len(fa)) == want(want_a)
    assert rows(second["b"], len(fb)) == want(want_b)
