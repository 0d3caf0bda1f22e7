#!/usr/bin/env python3
"""NEXMark on one fedstream peer against plain Spark Structured Streaming, in one run.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_nexmark.py --quick            # smoke run, a few minutes
    .venv/bin/python scripts/bench_nexmark.py --json nexmark.json # rate ladders, ~30-40 min
    .venv/bin/python scripts/bench_nexmark.py --quick --sql --skip-peer --skip-reference \
        --queries q0                                              # the SQL form alone, smallest
    .venv/bin/python scripts/bench_nexmark.py --sql --rates 10k,25k,50k,100k,200k \
        --warmup 10 --duration 15 --tail 8 --json nx_all.json     # docs/benchmarks.md's quiet run

What runs
---------
*Events*: peer.examples.nexmark's generator at the offered rate, its base time set to the wall
clock when a point starts, so that event time is wall-clock time. The driver pushes the events
in pieces of ``--piece`` seconds of event time, each as soon as the wall clock reaches the
piece's last event, and only the streams the query reads. Both systems get the same events.

*Peer*: ``peer join`` as a separate process (as bench_peer.py); the query's stages
(``peer.examples.nexmark.stages``) are created and started over fresh streams per point; the
real client pushes pyarrow Tables and subscribes to the result stream.

*SQL form* (``--sql``): a second ``peer join`` process runs Flink's published NEXMark SQL
texts (``peer.examples.nexmark.flink_sql``), sent as text in ``create_sql`` requests and
compiled by the peer (peer.model.sql), over streams whose time column is ``dateTime``; the
report puts its figures beside the box form's. Only :data:`SQL_QUERIES` run in SQL.

*Reference*: this script as ``--reference-worker`` with its own local Spark session, reading
spools that this process appends to directly (``Spool.append``, the same ``fedspool`` source as
the peer's engine). Each stage is plain PySpark: the same computation in Spark SQL over
temporary views with the same watermarks, one streaming query per stage (the same cut as the
peer's: a stage's ``foreachBatch`` appends to the spool the next stage reads).

Latency: a result row is due at the event time from which it can be computed (q0, q1: its
bid's time; q2: its bid's time, found by (auction, price) among the pushed bids; q3: its
auction's time, from the auction id; q4, q5, q7, q8: the end of its window); its latency is
its arrival time minus that (event time being wall-clock time). Windowed queries therefore
include their windows' slack (q4: the longest auction plus 10 s) and the wait for a later
event to move the watermark. A point kept up when pushes reached 95 % of the offered rate,
results arrived for the measured window, and the median latency did not grow by more than 1 s
from its first to its last third. Throughput per core: the offered rate over the cores the
system's process tree used while measuring.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc
from bench_peer import parse_rates

ROOT = Path(__file__).resolve().parents[1]
US = 1_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FLINK_PER_CORE = {"q0": 155_000, "q1": 158_000, "q2": 175_000, "q5": 22_000, "q7": 12_000}
READS = {"q0": ("bid",), "q1": ("bid",), "q2": ("bid",), "q3": ("person", "auction"),
         "q4": ("auction", "bid"), "q5": ("bid",), "q7": ("bid",),
         "q8": ("person", "auction")}  # fmt: skip


# --------------------------------------------------------------------------- due times


def _micros(column: Any) -> np.ndarray:
    """Microseconds since the epoch of a timestamp column (Arrow array or list of datetimes)."""
    if isinstance(column, pa.ChunkedArray | pa.Array):
        return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.array(  # a subscription gives datetimes, or microseconds where ISO cannot
        [v if isinstance(v, int) else (v - EPOCH) // datetime.resolution for v in column],
        dtype=np.int64,
    )


def _ints(column: Any) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray | pa.Array):
        return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.asarray(column, dtype=np.int64)


def _auction_time_us(ids: np.ndarray, cfg: Any) -> np.ndarray:
    base0 = ids - 1000
    n = 50 * (base0 // 3) + 1 + base0 % 3  # the event number of auction base0
    return np.asarray(cfg.time_ms(n) * 1000, dtype=np.int64)


# The SQL forms (Flink's published texts) name some result columns differently.
SQL_COLUMNS = {"date_time": "dateTime", "starttime": "stime"}
# Queries whose published SQL text the SQL form runs: q4 as published is refused; q5's
# published result (auction, num) has no window column to time its latency by.
SQL_QUERIES = ("q0", "q1", "q2", "q3", "q7", "q8")


def summarize(q: str, columns: Any, cfg: Any, *, sql: bool = False) -> dict[str, list[Any]]:
    """What latency needs of one result batch: due times (µs) with counts, or for q2 the
    (auction, price) pairs to look up. ``sql``: the batch is the SQL form's."""
    from peer.examples.nexmark.queries import WINDOW_S

    if sql:
        columns = {k: columns[v] for k, v in SQL_COLUMNS.items() if v in columns} | dict(columns)
    if q == "q2":
        return {"pairs": [_ints(columns["auction"]).tolist(), _ints(columns["price"]).tolist()]}
    if q in ("q0", "q1"):
        due = _micros(columns["date_time"])
    elif q == "q7":
        w = WINDOW_S * US
        due = _micros(columns["date_time"]) // w * w + w
    elif q == "q3":
        due = _auction_time_us(_ints(columns["id"]), cfg)
    elif q == "q8":
        due = _micros(columns["starttime"]) + WINDOW_S * US
    else:
        due = _micros(columns["window_end"])
    values, counts = np.unique(due, return_counts=True)
    return {"due": values.tolist(), "cnt": counts.tolist()}


@dataclass
class Point:
    """One query at one offered rate on one system: pushes and results."""

    q: str
    rate: float
    cfg: Any
    pushed: list[tuple[float, int]] = field(default_factory=list)  # (wall time, events)
    results: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)
    pending_pairs: list[tuple[float, list[int], list[int]]] = field(default_factory=list)
    q2_bids: dict[tuple[int, int], int] = field(default_factory=dict)

    def take(self, recv: float, summary: dict[str, list[Any]]) -> None:
        if "pairs" in summary:
            auctions, prices = summary["pairs"]
            self.pending_pairs.append((recv, auctions, prices))
            return
        self.results.append((recv, np.asarray(summary["due"]), np.asarray(summary["cnt"])))

    def note_bids(self, bids: pa.Table) -> None:
        """q2: remember the time of every bid it will select, to find its rows' due time."""
        from peer.examples.nexmark.queries import Q2_SKIP

        kept = bids.filter(pc.equal(pc.remainder(bids.column("auction"), Q2_SKIP), 0))
        times = _micros(kept.column("date_time"))
        for a, p, t in zip(kept.column("auction").to_pylist(), kept.column("price").to_pylist(),
                           times.tolist(), strict=True):  # fmt: skip
            self.q2_bids.setdefault((a, p), t)

    def samples(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """(latency, due time) per result row due in [t0, t1)."""
        for recv, auctions, prices in self.pending_pairs:
            due = [self.q2_bids.get((a, p), -1) for a, p in zip(auctions, prices, strict=True)]
            values, counts = np.unique(np.array(due, dtype=np.int64), return_counts=True)
            self.results.append((recv, values, counts))
        self.pending_pairs.clear()
        lat, when = [], []
        for recv, due, cnt in self.results:
            keep = (due >= t0 * US) & (due < t1 * US)
            lat.append(np.repeat(recv - due[keep] / US, cnt[keep]))
            when.append(np.repeat(due[keep] / US, cnt[keep]))
        if not lat:
            return np.array([]), np.array([])
        return np.concatenate(lat), np.concatenate(when)


def analyze(point: Point, t0: float, t1: float) -> dict[str, Any]:
    pushed = sum(n for t, n in point.pushed if t0 <= t < t1)
    lat, when = point.samples(t0, t1)
    third = (t1 - t0) / 3
    out: dict[str, Any] = {
        "push_rate": pushed / (t1 - t0),
        "results": len(lat),
        "p50": bc.quantile(lat, 0.5),
        "p99": bc.quantile(lat, 0.99),
        "p50_first_third": bc.quantile(lat[when < t0 + third], 0.5),
        "p50_last_third": bc.quantile(lat[when >= t1 - third], 0.5),
    }
    why = []
    if out["push_rate"] < 0.95 * point.rate:
        why.append(f"pushes reached only {bc.fmt_rate(out['push_rate'])}/s")
    if not len(lat):
        why.append("no result due in the measured window arrived")
    elif out["p50_last_third"] - out["p50_first_third"] > 1.0:  # (NaN: too few windows)
        why.append(f"latency growing ({bc.fmt_s(out['p50_first_third'])} -> "
                   f"{bc.fmt_s(out['p50_last_third'])})")  # fmt: skip
    out["why"] = why
    out["kept_up"] = not why
    return out


# --------------------------------------------------------------------------- the two systems


class PeerSide:
    label = "fedstream"

    def __init__(self, work: Path) -> None:
        from peer.testing import PeerProcess

        work.mkdir(parents=True, exist_ok=True)
        self.proc = PeerProcess(work / "peer-data", log_path=work / "peer.log")
        self.ctl: Any = None
        self.pusher: Any = None
        self.subs: Any = None
        self.consumer: asyncio.Task[None] | None = None
        self.queries: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    async def start(self) -> None:
        from peer.client import Client
        from peer.examples.nexmark import SCHEMAS

        await asyncio.to_thread(self.proc.start, 240)
        self.ctl, self.pusher, self.subs = (
            Client("127.0.0.1", self.proc.port, timeout_s=120, client_name=f"nexmark-{role}")
            for role in ("ctl", "push", "sub")
        )
        for client in (self.ctl, self.pusher, self.subs):
            await client.connect()
        for schema in SCHEMAS:
            await self.ctl.create_schema(schema)

    async def setup(self, point: Point, prefix: str) -> None:
        from peer.examples.nexmark import SOURCE_STREAMS, stages

        for stream in READS[point.q]:
            await self.ctl.create_stream(prefix + stream, SOURCE_STREAMS[stream])
        self.queries = []
        for query in stages(point.q, prefix=prefix, cfg=point.cfg):
            await self.ctl.create_query(query)
            await self.ctl.start_query(query["name"])
            self.queries.append(query["name"])
        sub = await self.subs.subscribe(prefix + point.q, start="earliest")

        async def consume() -> None:
            async for batch in sub:
                point.take(time.time(), summarize(point.q, batch.columns, point.cfg))

        self.consumer = asyncio.create_task(consume())

    async def push(self, stream: str, table: pa.Table) -> None:
        await self.pusher.push(stream, table)

    async def teardown(self) -> None:
        if self.consumer is not None:
            self.consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.consumer
        for name in reversed(self.queries):
            await self.ctl.delete_query(name)

    async def close(self) -> None:
        for client in (self.ctl, self.pusher, self.subs):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 10)
        await asyncio.to_thread(self.proc.stop, 60)


class PeerSqlSide(PeerSide):
    """A peer of its own running NEXMark's published SQL (peer.examples.nexmark.flink_sql),
    sent as text (create_sql) and compiled by the peer, over streams whose time column is
    ``dateTime``."""

    label = "fedstream SQL"

    async def setup(self, point: Point, prefix: str) -> None:
        from peer.examples.nexmark.flink_sql import script

        submitted = await self.ctl.submit_sql(
            script(point.q), name=f"nexmark_{point.q}", start=True, namespace=prefix
        )
        self.queries = list(submitted.queries)
        sub = await self.subs.subscribe(f"{prefix}nexmark_{point.q}", start="earliest")

        async def consume() -> None:
            async for batch in sub:
                summary = summarize(point.q, batch.columns, point.cfg, sql=True)
                point.take(time.time(), summary)

        self.consumer = asyncio.create_task(consume())

    async def push(self, stream: str, table: pa.Table) -> None:
        from peer.examples.nexmark.flink_sql import as_flink

        await self.pusher.push(stream, as_flink(table))


class SparkSide:
    """Plain Spark in a worker process; this process appends to its spools directly."""

    label = "Spark"

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc: asyncio.subprocess.Process | None = None
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.point: Point | None = None
        self.spools: dict[str, Any] = {}
        self.reader: asyncio.Task[None] | None = None
        self.trimmer: asyncio.Task[None] | None = None
        self.log = (work / "reference.log").open("ab")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), "--reference-worker",
            "--work-dir", str(self.work), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, cwd=str(ROOT), start_new_session=True, limit=64 * 1024 * 1024,
        )  # fmt: skip
        self.reader = asyncio.create_task(self._read())
        await self._reply(240)
        self.trimmer = asyncio.create_task(self._trim())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            if line.startswith(b"@@ "):
                msg = json.loads(line[3:])
                if "recv" in msg:
                    if self.point is not None:
                        self.point.take(msg["recv"], msg["summary"])
                else:
                    await self.replies.put(msg)
        await self.replies.put({"ok": False, "error": "reference worker exited"})

    async def _reply(self, timeout_s: float) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.replies.get(), timeout_s)
        if not msg.get("ok", True):
            raise RuntimeError(f"reference worker: {msg.get('error')} (see reference.log)")
        return msg

    async def _send(self, cmd: dict[str, Any], timeout_s: float = 120) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self._reply(timeout_s)

    async def _trim(self) -> None:
        while True:  # what a peer's maintenance task does
            await asyncio.sleep(2.0)
            for spool in list(self.spools.values()):
                with contextlib.suppress(OSError, KeyError):
                    await asyncio.to_thread(spool.trim)

    async def setup(self, point: Point, prefix: str) -> None:
        from peer.examples.nexmark import arrow_schemas
        from peer.storage.spool import Spool

        self.point = point
        root = self.work / "spools" / prefix.rstrip(":")
        schemas = arrow_schemas()
        self.spools = {}
        for stream in READS[point.q]:
            spool = Spool(root / stream, schemas[stream])
            self.spools[prefix + stream] = spool
        await self._send({"op": "start", "q": point.q, "root": str(root),
                          "rate": point.cfg.event_rate,
                          "base_ms": point.cfg.base_time_ms})  # fmt: skip

    async def push(self, stream: str, table: pa.Table) -> None:
        await asyncio.to_thread(self.spools[stream].append, table)

    async def teardown(self) -> None:
        await self._send({"op": "stop"})
        self.point = None

    async def close(self) -> None:
        if self.trimmer is not None:
            self.trimmer.cancel()
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            if self.proc.returncode is None:
                await self._send({"op": "quit"}, timeout_s=60)
                await asyncio.wait_for(self.proc.wait(), 60)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its JVM is in its process group
        if self.reader is not None:
            self.reader.cancel()
        self.log.close()


# --------------------------------------------------------------------------- plain Spark


def spark_stages(q: str, cfg: Any) -> list[tuple[str, list[tuple[str, str, str, float]], str]]:
    """Query ``q`` for plain Spark: per stage, (output, [(view, input stream, event-time
    column, watermark delay s)], SQL), the same computation and cut as
    peer.examples.nexmark.stages. Each view has the event-time column copied as
    ``event_time``, which carries the watermark (as fedstream's hidden ``__ts``), so that a
    query may group by the field a window is cut on."""
    from peer.examples.nexmark import queries as nq

    longest = cfg.max_auction_ms / 1000
    w, e, slide = nq.WINDOW_S, 0.001, nq.SLIDE_S
    bounds = "window.start AS window_start, window.end AS window_end"

    def iv(seconds: float) -> str:
        return f"INTERVAL {round(seconds * US)} MICROSECONDS"

    def band(left: str, right: str, left_buffer: float, right_buffer: float) -> str:
        # fedstream's join band: the order fields differ by less than the other side's buffer
        return f"{left} < {right} + {iv(right_buffer)} AND {right} < {left} + {iv(left_buffer)}"

    bid = ("bid", "bid", "date_time", 0.0)
    if q == "q0":
        return [("q0", [bid], "SELECT auction, bidder, price, date_time, extra FROM bid")]
    if q == "q1":
        return [("q1", [bid], "SELECT auction, bidder, 0.908D * price AS price, date_time, "
                              "extra FROM bid")]  # fmt: skip
    if q == "q2":
        return [("q2", [bid], f"SELECT auction, price FROM bid WHERE auction % {nq.Q2_SKIP} = 0")]
    if q == "q3":
        b = nq.Q3_BOUND_S
        states = ", ".join(f"'{x}'" for x in nq.Q3_STATES)
        return [("q3", [("p", "person", "date_time", b), ("a", "auction", "date_time", b)],
                 "SELECT p.name, p.city, p.state, a.id FROM p JOIN a ON p.id = a.seller AND "
                 f"{band('p.event_time', 'a.event_time', b, b)} "
                 f"WHERE p.state IN ({states}) AND a.category = 10")]  # fmt: skip
    if q == "q4":
        return [
            ("q4_won", [("a", "auction", "date_time", longest + e),
                        ("b", "bid", "date_time", longest + e)],
             "SELECT a.id, a.category, a.expires, b.price FROM a JOIN b ON a.id = b.auction "
             "AND b.date_time >= a.date_time AND b.date_time <= a.expires AND "
             f"{band('a.event_time', 'b.event_time', longest + e, e)}"),
            ("q4_final", [("won", "q4_won", "expires", longest + nq.Q4_SKEW_S)],
             f"SELECT {bounds}, id, category, expires, max(price) AS final FROM won "
             f"GROUP BY window(event_time, '{nq.Q4_FINAL_WINDOW_S} seconds'), id, category, "
             "expires"),
            ("q4", [("final", "q4_final", "expires", float(nq.Q4_FINAL_WINDOW_S))],
             f"SELECT {bounds}, category, avg(final) AS avg_price, count(*) AS auctions "
             f"FROM final GROUP BY window(event_time, '{w} seconds'), category"),
        ]  # fmt: skip
    if q == "q5":
        return [
            ("q5_counts", [bid],
             f"SELECT {bounds}, auction, count(*) AS num FROM bid "
             f"GROUP BY window(event_time, '{w} seconds', '{slide} seconds'), auction"),
            ("q5_max", [("c", "q5_counts", "window_start", float(slide))],
             f"SELECT {bounds}, max(num) AS maxn FROM c "
             f"GROUP BY window(event_time, '{slide} seconds')"),
            ("q5", [("c", "q5_counts", "window_start", e), ("m", "q5_max", "window_start", e)],
             "SELECT c.window_start, c.window_end, c.auction, c.num FROM c JOIN m ON "
             "c.window_start = m.window_start AND c.num = m.maxn AND "
             f"{band('c.event_time', 'm.event_time', e, e)}"),
        ]  # fmt: skip
    if q == "q7":
        return [
            ("q7_max", [bid], f"SELECT {bounds}, max(price) AS maxprice FROM bid "
                              f"GROUP BY window(event_time, '{w} seconds')"),
            ("q7", [("m", "q7_max", "window_end", w + e), ("b", "bid", "date_time", w + e)],
             "SELECT b.auction, b.price, b.bidder, b.date_time, b.extra FROM m JOIN b ON "
             "m.maxprice = b.price AND b.date_time >= m.window_start AND b.date_time < "
             f"m.window_end AND {band('m.event_time', 'b.event_time', e, w + e)}"),
        ]  # fmt: skip
    if q == "q8":
        return [
            ("q8_people", [("person", "person", "date_time", 0.0)],
             f"SELECT {bounds}, id, name, count(*) AS n FROM person "
             f"GROUP BY window(event_time, '{w} seconds'), id, name"),
            ("q8_sellers", [("auction", "auction", "date_time", 0.0)],
             f"SELECT {bounds}, seller, count(*) AS n FROM auction "
             f"GROUP BY window(event_time, '{w} seconds'), seller"),
            ("q8", [("p", "q8_people", "window_start", e), ("a", "q8_sellers", "window_start", e)],
             "SELECT p.id, p.name, p.window_start AS starttime FROM p JOIN a ON "
             "p.id = a.seller AND p.window_start = a.window_start AND "
             f"{band('p.event_time', 'a.event_time', e, e)}"),
        ]  # fmt: skip
    raise ValueError(f"unknown query {q!r}")


def stream_schemas(q: str, cfg: Any) -> dict[str, Any]:
    """Every stream's schema (peer.model Schema) for query ``q``, sources and stages."""
    from peer.examples.nexmark import SCHEMAS, SOURCE_STREAMS, stages
    from peer.model.plan import check_query
    from peer.model.query import parse_query
    from peer.model.schema import parse_schema

    by_name = {s["name"]: parse_schema(s) for s in SCHEMAS}
    known = {stream: by_name[schema] for stream, schema in SOURCE_STREAMS.items()}
    for query in stages(q, cfg=cfg):
        known.update(check_query(parse_query(query), known).stream_schemas)
    return known


def reference_worker(work: Path) -> int:
    """Plain Structured Streaming on the spools the driver writes (run as a subprocess)."""
    from peer.engine.session import build_session
    from peer.engine.source import read_stream, register_sources
    from peer.examples.nexmark import GeneratorConfig
    from peer.model.schema import spark_ddl, to_arrow_schema
    from peer.storage import spool_format as fmt
    from peer.storage.spool import Spool

    lock, real_stdout = threading.Lock(), sys.stdout
    sys.stdout = sys.stderr

    def emit(obj: dict[str, Any]) -> None:
        with lock:
            real_stdout.write("@@ " + json.dumps(obj) + "\n")
            real_stdout.flush()

    spark = build_session("local[*]", app_name="nexmark-reference",
                          warehouse_dir=str(work / "reference-warehouse"))  # fmt: skip
    register_sources(spark)
    emit({"ok": True, "version": spark.version})
    running: list[Any] = []

    def start(cmd: dict[str, Any]) -> None:
        q, root = cmd["q"], Path(cmd["root"])
        cfg = GeneratorConfig(event_rate=cmd["rate"], base_time_ms=cmd["base_ms"])
        schemas = stream_schemas(q, cfg)
        for i, (output, inputs, sql) in enumerate(spark_stages(q, cfg)):
            for view, stream, column, delay in inputs:
                reader = f"{output}-{view}"  # a reader of a spool another object writes
                fmt.write_reader_offset(root / stream, reader, -1, fsync=True)
                df = read_stream(spark, root / stream, spark_ddl(schemas[stream]), reader)
                df = df.withColumn("event_time", df[column])
                df = df.withWatermark("event_time", f"{round(delay * US)} microseconds")
                df.createOrReplaceTempView(view)
            frame = spark.sql(sql)
            if output == q:

                def sink(batch: Any, _id: int) -> None:
                    table = batch.toArrow()
                    recv = time.time()
                    if table.num_rows:
                        emit({"recv": recv, "summary": summarize(q, table, cfg)})
            else:
                out = Spool(root / output, to_arrow_schema(schemas[output]))

                def sink(batch: Any, _id: int, out: Any = out) -> None:
                    out.append(batch.toArrow())

            running.append(
                frame.writeStream.queryName(f"{q}_{i}")
                .option("checkpointLocation", str(root / "checkpoints" / output))
                .outputMode("append").trigger(processingTime="0 seconds")
                .foreachBatch(sink).start()
            )  # fmt: skip

    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "start":
                start(cmd)
            elif cmd["op"] == "stop":
                while running:
                    running.pop().stop()
            elif cmd["op"] == "quit":
                emit({"ok": True})
                break
            emit({"ok": True})
        except Exception as exc:
            emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    for query in running:
        with contextlib.suppress(Exception):
            query.stop()
    with contextlib.suppress(Exception):
        spark.stop()
    return 0


# --------------------------------------------------------------------------- a point


def min_tail(q: str, cfg: Any) -> float:
    """Seconds of events after the measured window that close its last windows in every
    stage (a window closes once a later event moves the watermark past it)."""
    from peer.examples.nexmark import queries as nq

    w = nq.WINDOW_S
    if q == "q4":
        return 2 * w + cfg.max_auction_ms / 1000 + nq.Q4_SKEW_S + nq.Q4_FINAL_WINDOW_S + 5
    if q == "q5":
        return w + 2 * nq.SLIDE_S + 5
    return w + 5 if q in ("q7", "q8") else 0


async def run_point(system: Any, q: str, rate: float, index: int,
                    args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    from peer.examples.nexmark import GeneratorConfig, generate

    start_ms = int(time.time() * 1000) + 3000  # event time starts once the stages are up
    cfg = GeneratorConfig(event_rate=rate, seed=index, base_time_ms=start_ms)
    point = Point(q, rate, cfg)
    prefix = f"{q}r{index}:"
    await system.setup(point, prefix)
    piece = max(1, round(rate * args.piece))
    windowed = q in ("q4", "q5", "q7", "q8")
    # the first point also absorbs the system's first micro-batches and the JIT's warm-up;
    # a windowed query is measured over at least two and a half of its windows
    warm = args.warmup * (2 if index == 1 else 1)
    measure = max(args.duration, 25.0) if windowed else args.duration
    tail = max(args.tail, min_tail(q, cfg))
    label = f"{system.label} {q} {bc.fmt_rate(rate)} events/s"
    print(f"  [{label}] warm-up {warm:g} s, measure {measure:g} s", flush=True)
    first = 0
    nxt = asyncio.create_task(asyncio.to_thread(generate, cfg, first, piece))
    meter: bc.CpuMeter | None = None
    t0 = start_ms / 1000 + warm
    t1 = t0 + measure
    cores = 0.0
    try:
        while True:
            tables = await nxt
            first += piece
            nxt = asyncio.create_task(asyncio.to_thread(generate, cfg, first, piece))
            due = cfg.time_ms(np.array([first - 1]))[0] / 1000  # the piece's last event
            if due > t1 + tail or time.time() > t1 + tail + 60:  # done, or hopelessly behind
                break
            if meter is None and due >= t0:
                meter = bc.CpuMeter(system.pid).start()
            if meter is not None and cores == 0.0 and due >= t1:
                cores, _ = meter.stop()
            await asyncio.sleep(max(0.0, due - time.time()))
            sent = time.time()
            for stream in READS[q]:
                if q == "q2":
                    point.note_bids(tables["bid"])
                await system.push(prefix + stream, tables[stream])
            point.pushed.append((sent, piece))
        # results still on their way (a slow system's) count, with their latency
        quiet_until, stop_at = time.time() + 5.0, time.time() + 30.0
        while time.time() < min(quiet_until, stop_at):
            seen = len(point.results) + len(point.pending_pairs)
            await asyncio.sleep(0.5)
            if len(point.results) + len(point.pending_pairs) > seen:
                quiet_until = time.time() + 5.0
    finally:
        nxt.cancel()
        await system.teardown()
    stats = analyze(point, t0, t1)
    dues = [d for _, due, _ in point.results for d in (due.min(), due.max()) if len(due)]
    stats["all_results"] = int(sum(int(cnt.sum()) for _, _, cnt in point.results))
    stats["due_range_s"] = (
        [round(float(d) / US - t0, 1) for d in (min(dues), max(dues))] if dues else None
    )
    stats.update(system=system.label, query=q, offered=rate, cores=cores,
                 per_core=rate / cores if cores else float("nan"))  # fmt: skip
    print(f"    pushed {bc.fmt_rate(stats['push_rate'])}/s, p50 {bc.fmt_s(stats['p50'])}, "
          f"p99 {bc.fmt_s(stats['p99'])}, {cores:.2f} cores, {stats['results']} results "
          f"({stats['all_results']} in all, due {stats['due_range_s']} s after t0), "
          f"{'kept up' if stats['kept_up'] else 'FELL BEHIND: ' + '; '.join(stats['why'])}",
          flush=True)  # fmt: skip
    return stats


async def run_system(system: Any, args: argparse.Namespace, results: dict[str, Any]) -> None:
    await system.start()
    try:
        index = 0
        for q in args.queries:
            if isinstance(system, PeerSqlSide) and q not in SQL_QUERIES:
                print(f"  [{system.label}] {q}: not run (see SQL_QUERIES)", flush=True)
                continue
            for rate in args.rates:
                index += 1
                row = await run_point(system, q, rate, index, args)
                results["points"].append(row)
                if not row["kept_up"]:
                    break
    finally:
        await system.close()


# --------------------------------------------------------------------------- report


def report(results: dict[str, Any]) -> str:
    out = bc.header(results)
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in results["points"]:
        key = (row["system"], row["query"])
        if row["kept_up"] and row["offered"] >= best.get(key, {}).get("offered", 0):
            best[key] = row
    body = []
    for q in results["queries"]:
        cells = [q]
        for system in ("fedstream", "fedstream SQL", "Spark"):
            r = best.get((system, q))
            if r is None:
                cells += ["-", "-", "-"]
                continue
            cells += [bc.fmt_rate(r["offered"]), bc.fmt_rate(r["per_core"]),
                      f"{bc.fmt_s(r['p50'])} / {bc.fmt_s(r['p99'])}"]  # fmt: skip
        flink = FLINK_PER_CORE.get(q)
        cells.append(bc.fmt_rate(flink) if flink else "-")
        body.append(cells)
    header = [
        "query",
        "fedstream sustained (events/s)",
        "per core",
        "p50 / p99",
        "fedstream SQL sustained",
        "per core",
        "p50 / p99",
        "plain Spark sustained",
        "per core",
        "p50 / p99",
        "Flink per core (published)",
    ]
    out.append(bc.md_table(header, body))
    out.append("")
    out.append("Every point:")
    out.append(bc.md_table(
        ["system", "query", "offered", "pushed", "p50", "p99", "cores", "kept up"],
        [[r["system"], r["query"], bc.fmt_rate(r["offered"]), bc.fmt_rate(r["push_rate"]),
          bc.fmt_s(r["p50"]), bc.fmt_s(r["p99"]), f"{r['cores']:.2f}",
          "yes" if r["kept_up"] else "no: " + "; ".join(r["why"])]
         for r in results["points"]]))  # fmt: skip
    for error in results["errors"]:
        out.append(f"\n**Failed**: {error}")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smoke run: one rate, short points")
    p.add_argument("--queries", help="comma-separated (default: q0,q1,q2,q3,q4,q5,q7,q8)")
    p.add_argument("--rates", help="offered event rates, stepped up until one falls behind")
    p.add_argument("--duration", type=float, help="measured seconds per point")
    p.add_argument("--warmup", type=float, help="seconds before measuring")
    p.add_argument("--tail", type=float, help="seconds of pushing after the measured window")
    p.add_argument("--piece", type=float, default=0.2, help="seconds of events per push")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument(
        "--sql",
        action="store_true",
        help="also run the SQL forms (Flink's published NEXMark SQL, compiled by "
        "peer.model.sql) on a peer of their own, beside the box forms",
    )
    p.add_argument("--skip-reference", action="store_true")
    p.add_argument("--json", type=Path, help="write the figures to this file")
    p.add_argument("--work-dir", type=Path)
    p.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from peer.examples.nexmark import QUERIES

    args.queries = (args.queries or ",".join(QUERIES)).split(",")
    unknown = sorted(set(args.queries) - set(QUERIES))
    if unknown:
        p.error(f"unknown queries {unknown} (queries: {', '.join(QUERIES)})")
    args.rates = parse_rates(args.rates or ("10k" if args.quick else "10k,25k,50k,100k,200k"))
    args.duration = args.duration or (8.0 if args.quick else 20.0)
    args.warmup = args.warmup or (8.0 if args.quick else 20.0)
    args.tail = args.tail or (4.0 if args.quick else 15.0)
    return args


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results = bc.new_results("bench_nexmark.py")
    results.update(queries=args.queries, rates=args.rates, points=[])
    began = time.monotonic()
    print(f"load average {results['load_before']}", flush=True)
    systems = []
    if not args.skip_peer:
        systems.append(PeerSide(work / "peer"))
    if args.sql:
        systems.append(PeerSqlSide(work / "peer-sql"))
    if not args.skip_reference:
        systems.append(SparkSide(work))
    for system in systems:
        print(f"{system.label}", flush=True)
        try:
            await run_system(system, args, results)
        except Exception as exc:
            print(f"{system.label} FAILED: {type(exc).__name__}: {exc}", flush=True)
            results["errors"].append(f"{system.label}: {type(exc).__name__}: {exc}")
    results["load_after"] = bc.load_average()
    results["elapsed_s"] = time.monotonic() - began
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference_worker:
        return reference_worker(args.work_dir)
    results = bc.run_in(args, "fedstream-nexmark-", main_async, report)
    return 0 if results is not None and not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
