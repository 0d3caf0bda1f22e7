#!/usr/bin/env python3
"""Single-peer benchmark: a fedstream peer against plain Spark Structured Streaming.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_peer.py            # full run, ~15-20 min on 2 cores
    .venv/bin/python scripts/bench_peer.py --quick    # smoke version, ~3-4 min

What runs
---------
*Peer*: ``peer join`` as a separate process (peer.testing.PeerProcess, its own JVM, port 0 on
loopback). This process drives it with the real asyncio ``peer.client.Client``: one connection
pushes pyarrow Tables (sent as Arrow IPC) at an offered rate with a paced loop, a second one
subscribes to the result streams, a third one manages schemas/streams/queries.

*Reference*: this script started as ``--reference-worker`` in a separate process with its own
local Spark session (``build_session`` defaults, ``local[*]``), reading a spool directory through
the same ``fedspool`` source (``register_sources``/``read_stream``). This process appends the
same tables to that spool with ``peer.storage.spool.Spool.append`` (no wire, no validation, no
subscriber); the query is plain PySpark (where/select; window groupBy under a watermark); its
``foreachBatch`` records the receive time after ``toArrow()`` and reports it over a pipe.

Data: tuples ``(k int, v long, sent long, t timestamp)``; ``k`` uniform over ``--keys`` keys,
``v`` uniform in [0, 1000), ``sent`` = wall-clock microseconds just before the push call (the
same for every tuple of one pushed batch), ``t`` = ``sent`` as a timestamp (event time). Both
systems get the same batches (same seed, same batch size, same rates).

Queries:
  filter     ``v >= 900`` (keeps 10 %), then a projection to ``(k, v, sent)``
  aggregate  per ``k``, tumbling 1 s windows of ``t``, zero slack: count, avg(v), max(sent)

Latency: filter = receive time of a result tuple minus its ``sent``. Aggregate = receive time of
a window's result row minus the push time of the *window-closing* batch: the first batch with
``sent >= window end`` (its tuples move the watermark past the window, which is what lets Spark
emit it). Results that never arrive count as infinitely late (so a p99 shows "lost").

A point (one offered rate): warm up (``--warmup`` s at the first rate of a query,
``--settle`` s at the next ones), measure ``--duration`` s, then keep pushing for at most
``--tail`` s until every result of the measured pushes has arrived. Kept up = pushes reached
95 % of the offered rate, >= 99 % of the results arrived within the tail, p99 <= ``--max-p99``
and the median latency did not grow by more than 1 s from the first to the last third of the
window. Rates are stepped upwards until a point does not keep up.

Many queries: ``--queries 1,4,16`` tumbling-window aggregate queries (all aggregates), each on
its own input stream fed ``--per-query-rate`` tuples/s; per-query latency, the CPU of the peer's
process tree (peer + JVM + Spark's Python workers) under load and idle (queries running, no
input, ``--idle`` s), and its memory.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

ROOT = Path(__file__).resolve().parents[1]

SCHEMA_DEF: dict[str, Any] = {
    "name": "bench_tuple",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "sent", "type": "long"},
        {"name": "t", "type": "timestamp"},
    ],
}
THRESHOLD = 900  # v uniform in [0, 1000): the filter keeps 10 %
WINDOW_S = 1
US = 1_000_000


def arrow_schema() -> pa.Schema:
    from peer.model.schema import parse_schema, to_arrow_schema

    return to_arrow_schema(parse_schema(SCHEMA_DEF))


def spark_schema_ddl() -> str:
    from peer.model.schema import parse_schema, spark_ddl

    return spark_ddl(parse_schema(SCHEMA_DEF))


PEER_ARGS: list[str] = []  # extra `peer join` options (--peer-args)


def peer_query(kind: str, name: str) -> dict[str, Any]:
    src, out = f"{name}_in", f"{name}_out"
    if kind == "filter":
        return {
            "name": name,
            "boxes": [
                {
                    "name": "sel",
                    "type": "filter",
                    "inputs": [src],
                    "outputs": [f"{name}_hot"],
                    "params": {"expression.0": f"v >= {THRESHOLD}"},
                },
                {
                    "name": "proj",
                    "type": "map",
                    "inputs": [f"{name}_hot"],
                    "outputs": [out],
                    "params": {
                        "expression.0": "k",
                        "output-field-name.0": "k",
                        "expression.1": "v",
                        "output-field-name.1": "v",
                        "expression.2": "sent",
                        "output-field-name.2": "sent",
                    },
                },
            ],
        }
    return {
        "name": name,
        "boxes": [
            {
                "name": "agg",
                "type": "aggregate",
                "inputs": [src],
                "outputs": [out],
                "params": {
                    "aggregate-function.0": "count()",
                    "aggregate-function-output-name.0": "n",
                    "aggregate-function.1": "avg(v)",
                    "aggregate-function-output-name.1": "mean_v",
                    "aggregate-function.2": "max(sent)",
                    "aggregate-function-output-name.2": "max_sent",
                    "window-size": str(WINDOW_S),
                    "advance": str(WINDOW_S),
                    "order-on-field": "t",
                    "group-by": "k",
                    "slack": "0",
                },
            },
        ],
    }


# --------------------------------------------------------------------------- load & results


class Load:
    """Deterministic batches: a pool of (k, v) columns cycled, with ``sent``/``t`` stamped."""

    def __init__(self, rows: int, keys: int, seed: int, pools: int = 16) -> None:
        rng = np.random.default_rng(seed)
        self.rows = rows
        self.schema = arrow_schema()
        self.k: list[pa.Array] = []
        self.v: list[pa.Array] = []
        self.expected: list[int] = []  # filter results per batch
        self.keysets: list[frozenset[int]] = []
        for _ in range(pools):
            k = rng.integers(0, keys, rows, dtype=np.int32)
            v = rng.integers(0, 1000, rows, dtype=np.int64)
            self.k.append(pa.array(k))
            self.v.append(pa.array(v))
            self.expected.append(int((v >= THRESHOLD).sum()))
            self.keysets.append(frozenset(np.unique(k).tolist()))
        self.n = 0

    def next(self, sent_us: int) -> tuple[int, pa.Table]:
        i = self.n % len(self.k)
        self.n += 1
        sent = pa.array(np.full(self.rows, sent_us, dtype=np.int64))
        t = sent.view(pa.timestamp("us", tz="UTC"))
        return i, pa.Table.from_arrays([self.k[i], self.v[i], sent, t], schema=self.schema)


@dataclass
class PushRec:
    sent_us: int
    rows: int
    idx: int
    ack: float | None = None


@dataclass
class Lane:
    """One query under load: how to push to it and what came back."""

    name: str
    kind: str  # filter | agg
    push: Callable[[pa.Table], Awaitable[Any]]
    load: Load
    pushes: list[PushRec] = field(default_factory=list)
    # filter: (recv, sent_us, count) per distinct sent in a result batch; counts by sent_us
    f_recs: list[tuple[float, int, int]] = field(default_factory=list)
    f_count: dict[int, int] = field(default_factory=dict)
    # agg: (window_end_us, k) -> (recv, n, max_sent)
    a_rows: dict[tuple[int, int], tuple[float, int, int]] = field(default_factory=dict)
    a_dups: int = 0
    result_batches: list[tuple[float, int]] = field(default_factory=list)  # (recv, rows)

    def add_filter(self, recv: float, sent: list[int] | np.ndarray, cnt: list[int] | None) -> None:
        if cnt is None:
            arr = np.asarray(sent, dtype=np.int64)
            uniq, counts = np.unique(arr, return_counts=True)
            sent, cnt = uniq.tolist(), counts.tolist()
        rows = 0
        for s, c in zip(sent, cnt, strict=True):
            self.f_recs.append((recv, int(s), int(c)))
            self.f_count[int(s)] = self.f_count.get(int(s), 0) + int(c)
            rows += int(c)
        self.result_batches.append((recv, rows))

    def add_agg(
        self, recv: float, we: list[int], k: list[int], n: list[int], ms: list[int]
    ) -> None:
        for w, key, cnt, m in zip(we, k, n, ms, strict=True):
            cell = (int(w), int(key))
            if cell in self.a_rows:
                self.a_dups += 1
                continue
            self.a_rows[cell] = (recv, int(cnt), int(m))
        self.result_batches.append((recv, len(we)))


def analyze(lane: Lane, t0: float, t1: float, max_p99: float) -> dict[str, Any]:
    pushes = [p for p in lane.pushes if t0 * US <= p.sent_us < t1 * US]
    span = t1 - t0
    pushed_rows = sum(p.rows for p in pushes)
    acks = [p.ack - p.sent_us / US for p in pushes if p.ack is not None]
    out: dict[str, Any] = {
        "lane": lane.name,
        "push_rate": pushed_rows / span,
        "pushes": len(pushes),
        "ack_p50": bc.quantile(np.array(acks), 0.5) if acks else float("nan"),
        "ack_p99": bc.quantile(np.array(acks), 0.99) if acks else float("nan"),
    }
    if lane.kind == "filter":
        wanted = {p.sent_us: lane.load.expected[p.idx] for p in pushes}
        lat, weights, times = [], [], []
        for recv, sent, cnt in lane.f_recs:
            if sent in wanted:
                lat.append(recv - sent / US)
                weights.append(cnt)
                times.append(sent / US)
        expected = sum(wanted.values())
        received = sum(min(lane.f_count.get(s, 0), e) for s, e in wanted.items())
        missing = expected - received
        delivered_rows = sum(
            p.rows for p in pushes if lane.f_count.get(p.sent_us, 0) >= wanted[p.sent_us]
        )
        samples = np.concatenate(
            [np.repeat(np.array(lat), np.array(weights, dtype=np.int64)), np.full(missing, np.inf)]
        )
        sample_t = np.concatenate(
            [np.repeat(np.array(times), np.array(weights, dtype=np.int64)), np.full(missing, t1)]
        )
        out.update(
            expected=expected, received=received, achieved=delivered_rows / span, mismatches=0
        )
    else:
        all_sent = [p.sent_us for p in lane.pushes]  # in push order: increasing
        first, last = math.ceil(t0), math.floor(t1) - WINDOW_S
        starts = list(range(first, last + 1, WINDOW_S))
        lat_l, time_l = [], []
        expected = received = mismatches = 0
        delivered_rows = 0
        by_window: dict[int, list[PushRec]] = {}
        for p in pushes:
            by_window.setdefault(p.sent_us // (WINDOW_S * US) * WINDOW_S, []).append(p)
        for s in starts:
            members = by_window.get(s, [])
            if not members:
                continue
            end_us = (s + WINDOW_S) * US
            keys: set[int] = set()
            for p in members:
                keys |= lane.load.keysets[p.idx]
            rows = sum(p.rows for p in members)
            i = bisect.bisect_left(all_sent, end_us)
            closing = all_sent[i] / US if i < len(all_sent) else None
            n_sum, complete = 0, True
            for key in keys:
                expected += 1
                got = lane.a_rows.get((end_us, key))
                if got is None or closing is None:
                    lat_l.append(np.inf)
                    complete = False
                else:
                    received += 1
                    lat_l.append(got[0] - closing)
                    n_sum += got[1]
                time_l.append(float(s))
            if complete and n_sum != rows:
                mismatches += 1
            if complete and n_sum == rows:
                delivered_rows += rows
        samples, sample_t = np.array(lat_l), np.array(time_l)
        missing = expected - received
        out.update(
            expected=expected,
            received=received,
            windows=len(starts),
            achieved=delivered_rows / max(len(starts) * WINDOW_S, 1e-9),
            mismatches=mismatches,
        )
    out["p50"] = bc.quantile(samples, 0.5)
    out["p99"] = bc.quantile(samples, 0.99)
    out["max"] = float(samples.max()) if len(samples) else float("nan")
    third = span / 3
    early = samples[sample_t < t0 + third]
    late = samples[sample_t >= t1 - third]
    out["p50_first_third"] = bc.quantile(early, 0.5)
    out["p50_last_third"] = bc.quantile(late, 0.5)
    out["delivered"] = received / expected if expected else float("nan")
    out["missing"] = missing
    batches = [b for b in lane.result_batches if t0 <= b[0] < t1]
    out["result_batches_per_s"] = len(batches) / span
    return out


def judge(stats: dict[str, Any], offered: float, max_p99: float) -> list[str]:
    """Why a point did not keep up (empty list: it kept up)."""
    why = []
    if stats["push_rate"] < 0.95 * offered:
        why.append(f"pushes reached only {bc.fmt_rate(stats['push_rate'])}/s")
    if not stats["delivered"] >= 0.99:
        why.append(f"{stats['missing']} results missing after the tail")
    if not stats["p99"] <= max_p99:
        why.append(f"p99 {bc.fmt_s(stats['p99'])} > {max_p99:g} s")
    growth = stats["p50_last_third"] - stats["p50_first_third"]
    if not growth <= 1.0:
        why.append(
            f"latency growing ({bc.fmt_s(stats['p50_first_third'])} -> "
            f"{bc.fmt_s(stats['p50_last_third'])})"
        )
    if stats.get("mismatches"):
        why.append(f"{stats['mismatches']} windows with wrong counts")
    return why


# --------------------------------------------------------------------------- load driver


async def _push_one(
    lane: Lane, rec: PushRec, table: pa.Table, sem: asyncio.Semaphore, errors: list[BaseException]
) -> None:
    try:
        await lane.push(table)
        rec.ack = time.time()
    except Exception as exc:
        errors.append(exc)
    finally:
        sem.release()


async def pace(lane: Lane, rate: float, inflight: int, stop: asyncio.Event) -> None:
    """Push ``lane.load`` batches at ``rate`` tuples/s until ``stop``; at most ``inflight``
    unacknowledged pushes (then the schedule slips: the achieved rate shows it)."""
    interval = lane.load.rows / rate
    sem = asyncio.Semaphore(inflight)
    errors: list[BaseException] = []
    pending: set[asyncio.Task[None]] = set()
    nxt = time.monotonic()
    try:
        while not stop.is_set():
            delay = nxt - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            await sem.acquire()
            if errors:
                raise errors[0]
            if stop.is_set():
                sem.release()
                break
            sent = time.time()
            idx, table = lane.load.next(int(sent * US))
            rec = PushRec(int(sent * US), table.num_rows, idx)
            lane.pushes.append(rec)
            task = asyncio.create_task(_push_one(lane, rec, table, sem, errors))
            pending.add(task)
            task.add_done_callback(pending.discard)
            nxt = max(nxt + interval, time.monotonic() - 1.0)  # slip at most 1 s behind
    finally:
        if pending:
            await asyncio.wait(pending, timeout=120)
    if errors:
        raise errors[0]


@dataclass
class PointResult:
    offered: float  # per lane
    lanes: list[dict[str, Any]]
    server_cores: float
    server_breakdown: dict[str, float]
    system_cores: float
    bench_cores: float
    memory: dict[str, Any]
    t0: float
    t1: float
    tail_s: float


async def run_point(
    lanes: list[Lane],
    rate: float,
    *,
    warm_s: float,
    measure_s: float,
    tail_s: float,
    inflight: int,
    server_pid: int,
    max_p99: float,
    label: str,
) -> PointResult:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(pace(lane, rate, inflight, stop)) for lane in lanes]

    def check() -> None:
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            check()
            await asyncio.sleep(min(left, 0.5))

    try:
        print(f"  [{label}] warm-up {warm_s:g} s", flush=True)
        await sleep(warm_s)
        server = bc.CpuMeter(server_pid).start()
        bench = bc.CpuMeter(os.getpid(), with_children=False).start()
        t0 = time.time()
        await sleep(measure_s)
        t1 = time.time()
        server_cores, system_cores = server.stop()
        bench_cores, _ = bench.stop()
        memory = bc.tree_memory(server_pid).as_dict()
        deadline = time.monotonic() + tail_s
        while time.monotonic() < deadline:
            check()
            if all(analyze(lane, t0, t1, max_p99)["delivered"] >= 1.0 for lane in lanes):
                break
            await asyncio.sleep(0.25)
        tail_used = time.time() - t1
    finally:
        stop.set()
        done, _ = await asyncio.wait(tasks, timeout=150)
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    stats = [analyze(lane, t0, t1, max_p99) for lane in lanes]
    return PointResult(
        rate,
        stats,
        server_cores,
        server.breakdown,
        system_cores,
        bench_cores,
        memory,
        t0,
        t1,
        tail_used,
    )


# --------------------------------------------------------------------------- the peer


class PeerSystem:
    label = "peer"

    def __init__(self, work: Path) -> None:
        from peer.testing import PeerProcess

        work.mkdir(parents=True, exist_ok=True)
        self.proc = PeerProcess(work / "peer-data", *PEER_ARGS, log_path=work / "peer.log")
        self.ctl: Any = None
        self.pusher: Any = None
        self.subs: Any = None
        self.consumers: dict[str, tuple[Any, asyncio.Task[None]]] = {}
        self.lanes: dict[str, Lane] = {}
        self.crashes: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    async def start(self, *, restart: bool = False) -> None:
        from peer.client import Client

        started = time.monotonic()
        await asyncio.to_thread(self.proc.start, 240)
        print(
            f"  peer ready on port {self.proc.port} in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        self.ctl = Client("127.0.0.1", self.proc.port, timeout_s=120, client_name="bench-ctl")
        self.pusher = Client("127.0.0.1", self.proc.port, timeout_s=60, client_name="bench-push")
        self.subs = Client("127.0.0.1", self.proc.port, timeout_s=60, client_name="bench-sub")
        for client in (self.ctl, self.pusher, self.subs):
            await client.connect()
        if not restart:
            await self.ctl.create_schema(SCHEMA_DEF)

    async def _restart(self, why: BaseException) -> None:
        """The peer process died: start it again on its data directory (it resumes its
        RUNNING queries from their checkpoints) and subscribe again."""
        assert self.proc.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.proc.wait(30)
        log = self.proc.log_path.read_text(errors="replace")
        last = [line.strip() for line in log.splitlines() if line.strip()][-1:]
        self.crashes.append(
            f"{type(why).__name__}: {why} / peer exit "
            f"{self.proc.proc.returncode}, log: {' '.join(last)[:300]}"
        )
        print(f"  PEER DIED ({self.crashes[-1]}); restarting it", flush=True)
        for client in (self.ctl, self.pusher, self.subs):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 10)
        for _sub, task in self.consumers.values():
            task.cancel()
        await self.start(restart=True)
        for name, lane in self.lanes.items():
            sub = await self.subs.subscribe(f"{name}_out", start="latest")
            self.consumers[name] = (sub, asyncio.create_task(self._consume(sub, lane)))

    async def add_query(self, kind: str, name: str, load: Load) -> Lane:
        from peer.errors import Conflict, Unavailable

        for attempt in range(3):
            try:
                with contextlib.suppress(Conflict):
                    await self.ctl.create_stream(f"{name}_in", SCHEMA_DEF["name"])
                with contextlib.suppress(Conflict):
                    await self.ctl.create_query(peer_query(kind, name))
                await self.ctl.start_query(name)
                break
            except Unavailable as exc:
                assert self.proc.proc is not None
                # A dying peer first stops its Spark queries: give it time to exit.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(self.proc.proc.wait, 90)
                if attempt == 2 or self.proc.proc.poll() is None:
                    raise
                await self._restart(exc)
        sub = await self.subs.subscribe(f"{name}_out", start="latest")
        stream = f"{name}_in"
        lane = Lane(name, kind, lambda table: self.pusher.push(stream, table), load)
        self.lanes[name] = lane
        self.consumers[name] = (sub, asyncio.create_task(self._consume(sub, lane)))
        return lane

    @staticmethod
    async def _consume(sub: Any, lane: Lane) -> None:
        async for batch in sub:
            recv = time.time()
            cols = batch.columns
            if lane.kind == "filter":
                lane.add_filter(recv, cols["sent"], None)
            else:
                lane.add_agg(recv, cols["window_end"], cols["k"], cols["n"], cols["max_sent"])

    async def drop_query(self, name: str) -> None:
        self.lanes.pop(name, None)
        sub, task = self.consumers.pop(name)
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(sub.aclose(), 30)
        await self.ctl.delete_query(name)

    def stage_times(self, lane: Lane, t0: float, t1: float) -> dict[str, float]:
        """Where a result's latency goes, from the append time the peer's sink stamped on each
        result spool file: push -> result appended (engine) and appended -> received
        (delivery to the subscriber)."""
        from peer.storage import spool_format as fmt

        directory = self.proc.data_dir / "spool" / fmt.stream_dirname(f"{lane.name}_out")
        recv_f: dict[int, float] = {}
        for recv, sent, _cnt in lane.f_recs:
            recv_f.setdefault(sent, recv)
        all_sent = [p.sent_us for p in lane.pushes]
        engine, delivery = [], []
        for offset in fmt.list_offsets(directory):
            path = fmt.offset_path(directory, offset)
            try:
                appended = int(fmt.file_metadata(path)[fmt.META_APPEND_NS]) / 1e9
                if not t0 <= appended <= t1 + 30:
                    continue
                table = fmt.read_file(path)
            except (OSError, KeyError):
                continue
            if lane.kind == "filter":
                for sent in np.unique(table.column("sent").to_numpy()).tolist():
                    if t0 * US <= sent < t1 * US and sent in recv_f:
                        engine.append(appended - sent / US)
                        delivery.append(recv_f[sent] - appended)
            else:
                ends = table.column("window_end").cast(pa.int64()).to_pylist()
                for end, key in zip(ends, table.column("k").to_pylist(), strict=True):
                    got = lane.a_rows.get((end, key))
                    i = bisect.bisect_left(all_sent, end)
                    if got is None or i >= len(all_sent) or not t0 * US <= end <= t1 * US:
                        continue
                    engine.append(appended - all_sent[i] / US)
                    delivery.append(got[0] - appended)
        return {
            "engine_p50": bc.quantile(np.array(engine), 0.5),
            "delivery_p50": bc.quantile(np.array(delivery), 0.5),
            "delivery_p99": bc.quantile(np.array(delivery), 0.99),
        }

    async def micro_batches(self) -> dict[str, int]:
        status = await self.ctl.status()
        return {q["name"]: int(q.get("batches", 0)) for q in status["queries"]}

    async def close(self) -> None:
        for name in list(self.consumers):
            _sub, task = self.consumers.pop(name)
            task.cancel()
        for client in (self.ctl, self.pusher, self.subs):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), 10)
        code = await asyncio.to_thread(self.proc.stop, 60)
        if code not in (0, None):
            tail = self.proc.log_path.read_text(errors="replace")[-3000:]
            print(f"  peer exited with {code}; end of {self.proc.log_path}:\n{tail}", flush=True)


# --------------------------------------------------------------------------- the reference


class ReferenceSystem:
    """Plain Spark in a worker process; this process writes its spools directly."""

    label = "reference"

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc: asyncio.subprocess.Process | None = None
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.lanes: dict[str, Lane] = {}
        self.batches: dict[str, int] = {}
        self.spools: dict[str, Any] = {}
        self._reader: asyncio.Task[None] | None = None
        self._trimmer: asyncio.Task[None] | None = None
        self._log = (work / "reference.log").open("ab")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        started = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).resolve()),
            "--reference-worker",
            "--work-dir",
            str(self.work),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=str(ROOT),
            start_new_session=True,
            limit=64 * 1024 * 1024,
        )
        self._reader = asyncio.create_task(self._read())
        ready = await self._reply(240)
        print(
            f"  reference Spark {ready.get('version')} ready in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        self._trimmer = asyncio.create_task(self._trim())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            if not line.startswith(b"@@ "):
                continue
            msg = json.loads(line[3:])
            name = msg.get("r")
            if name is None:
                await self.replies.put(msg)
                continue
            self.batches[name] = self.batches.get(name, 0) + 1
            lane = self.lanes.get(name)
            if lane is None:
                continue
            if lane.kind == "filter":
                lane.add_filter(msg["recv"], msg["sent"], msg["cnt"])
            else:
                lane.add_agg(msg["recv"], msg["we"], msg["k"], msg["n"], msg["ms"])
        await self.replies.put({"eof": True})

    async def _reply(self, timeout_s: float) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.replies.get(), timeout_s)
        if msg.get("eof"):
            raise RuntimeError(f"reference worker exited; see {self.work / 'reference.log'}")
        if not msg.get("ok", True):
            raise RuntimeError(f"reference worker: {msg.get('error')}")
        return msg

    async def _send(self, cmd: dict[str, Any], timeout_s: float = 120) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self._reply(timeout_s)

    async def _trim(self) -> None:
        # What the peer's maintenance task does every 2 s.
        while True:
            await asyncio.sleep(2.0)
            for spool in list(self.spools.values()):
                with contextlib.suppress(OSError, KeyError):
                    await asyncio.to_thread(spool.trim)

    async def add_query(self, kind: str, name: str, load: Load) -> Lane:
        from peer.storage.spool import Spool

        spool_dir = self.work / "reference-spool" / name
        spool = Spool(spool_dir, arrow_schema())
        reader = f"{name}-0"
        spool.register_reader(reader)
        self.spools[name] = spool
        lane = Lane(name, kind, lambda table: asyncio.to_thread(spool.append, table), load)
        self.lanes[name] = lane
        await self._send(
            {
                "op": "start",
                "name": name,
                "kind": kind,
                "spool": str(spool_dir),
                "reader": reader,
                "checkpoint": str(self.work / "reference-checkpoints" / name),
            }
        )
        return lane

    async def drop_query(self, name: str) -> None:
        await self._send({"op": "stop", "name": name})
        self.lanes.pop(name, None)
        self.spools.pop(name, None)

    async def micro_batches(self) -> dict[str, int]:
        return dict(self.batches)

    async def close(self) -> None:
        if self._trimmer is not None:
            self._trimmer.cancel()
        if self.proc is None:
            return
        try:
            if self.proc.returncode is None:
                with contextlib.suppress(Exception):
                    await self._send({"op": "quit"}, timeout_s=60)
                await asyncio.wait_for(self.proc.wait(), 60)
        except (TimeoutError, ProcessLookupError):
            pass
        finally:
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), 30)
            else:
                # the JVM is in the worker's process group: make sure it went too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            if self._reader is not None:
                self._reader.cancel()
            self._log.close()


def reference_worker(work: Path) -> int:
    """Plain Structured Streaming on the spools this benchmark writes (run as a subprocess)."""
    from pyspark.sql import functions as F

    from peer.engine.session import build_session
    from peer.engine.source import read_stream, register_sources

    out_lock = threading.Lock()
    real_stdout = sys.stdout

    def emit(obj: dict[str, Any]) -> None:
        with out_lock:
            real_stdout.write("@@ " + json.dumps(obj) + "\n")
            real_stdout.flush()

    sys.stdout = sys.stderr  # anything else printed goes to the log
    spark = build_session(
        "local[*]", app_name="bench-reference", warehouse_dir=str(work / "reference-warehouse")
    )
    register_sources(spark)
    ddl = spark_schema_ddl()
    emit({"ready": True, "version": spark.version})
    queries: dict[str, Any] = {}

    def start(cmd: dict[str, Any]) -> None:
        name, kind = cmd["name"], cmd["kind"]
        df = read_stream(spark, cmd["spool"], ddl, cmd["reader"])
        if kind == "filter":
            frame = df.where(F.col("v") >= THRESHOLD).select("k", "v", "sent")

            def sink(batch: Any, batch_id: int) -> None:
                table = batch.toArrow()
                recv = time.time()
                sent, cnt = [], []
                if table.num_rows:
                    uniq, counts = np.unique(table.column("sent").to_numpy(), return_counts=True)
                    sent, cnt = uniq.tolist(), counts.tolist()
                emit({"r": name, "recv": recv, "sent": sent, "cnt": cnt})
        else:
            w = F.window("t", f"{WINDOW_S} seconds")
            frame = (
                df.withWatermark("t", "0 seconds")
                .groupBy(w.alias("w"), "k")
                .agg(
                    F.count(F.lit(1)).alias("n"),
                    F.avg("v").alias("mean_v"),
                    F.max("sent").alias("max_sent"),
                )
                .select(
                    F.col("w.start").alias("window_start"),
                    F.col("w.end").alias("window_end"),
                    "k",
                    "n",
                    "mean_v",
                    "max_sent",
                )
            )

            def sink(batch: Any, batch_id: int) -> None:
                table = batch.toArrow()
                recv = time.time()
                we = table.column("window_end").cast(pa.int64()).to_pylist()
                emit(
                    {
                        "r": name,
                        "recv": recv,
                        "we": we,
                        "k": table.column("k").to_pylist(),
                        "n": table.column("n").to_pylist(),
                        "ms": table.column("max_sent").to_pylist(),
                    }
                )

        queries[name] = (
            frame.writeStream.queryName(name)
            .option("checkpointLocation", cmd["checkpoint"])
            .outputMode("append")
            .trigger(processingTime="0 seconds")
            .foreachBatch(sink)
            .start()
        )

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "start":
                start(cmd)
            elif op == "stop":
                queries.pop(cmd["name"]).stop()
            elif op == "quit":
                emit({"reply": op, "ok": True})
                break
            emit({"reply": op, "ok": True})
        except Exception as exc:
            emit({"reply": op, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    for query in queries.values():
        with contextlib.suppress(Exception):
            query.stop()
    with contextlib.suppress(Exception):
        spark.stop()
    return 0


# --------------------------------------------------------------------------- phases


async def rate_steps(
    system: Any, kind: str, rates: list[float], args: argparse.Namespace, seed: int
) -> list[dict[str, Any]]:
    """Step the offered rate of one query until a point does not keep up."""
    name = f"b{kind}"
    load = Load(args.batch_rows, args.keys, seed)
    lane = await system.add_query(kind, name, load)
    inflight = args.inflight if kind == "filter" else 1
    results: list[dict[str, Any]] = []
    discarded: list[dict[str, Any]] = []
    plan = list(enumerate(rates))
    try:
        while plan:
            i, rate = plan.pop(0)
            b0 = await system.micro_batches()
            point = await run_point(
                [lane],
                rate,
                warm_s=args.warmup if i == 0 else args.settle,
                measure_s=args.duration,
                tail_s=args.tail,
                inflight=inflight,
                server_pid=system.pid,
                max_p99=args.max_p99,
                label=f"{system.label} {kind} {bc.fmt_rate(rate)}/s",
            )
            b1 = await system.micro_batches()
            stats = point.lanes[0]
            if isinstance(system, PeerSystem):
                stats.update(system.stage_times(lane, point.t0, point.t1))
            why = judge(stats, rate, args.max_p99)
            row = {
                "system": system.label,
                "query": kind,
                "offered": rate,
                **stats,
                "kept_up": not why,
                "why": why,
                "server_cores": point.server_cores,
                "server_breakdown": point.server_breakdown,
                "system_cores": point.system_cores,
                "bench_cores": point.bench_cores,
                "memory": point.memory,
                "tail_s": point.tail_s,
                "micro_batches": b1.get(name, 0) - b0.get(name, 0),
            }
            results.append(row)
            if "engine_p50" in stats:
                print(
                    f"    push -> result spool p50 {bc.fmt_s(stats['engine_p50'])}, "
                    f"result spool -> subscriber p50 {bc.fmt_s(stats['delivery_p50'])} "
                    f"p99 {bc.fmt_s(stats['delivery_p99'])}",
                    flush=True,
                )
            print(
                f"    achieved {bc.fmt_rate(stats['achieved'])}/s, "
                f"p50 {bc.fmt_s(stats['p50'])}, p99 {bc.fmt_s(stats['p99'])}, "
                f"push ack p50 {bc.fmt_s(stats['ack_p50'])}, "
                f"server {point.server_cores:.2f} cores ("
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(point.server_breakdown.items()))
                + f"), bench {point.bench_cores:.2f}, machine {point.system_cores:.2f}, "
                f"{row['micro_batches']} micro-batches, "
                f"{'kept up' if not why else 'FELL BEHIND: ' + '; '.join(why)}",
                flush=True,
            )
            if why and i == 0 and not discarded:
                # The first point of a query also absorbs its slow first micro-batches (state
                # store, Python workers, JIT): give it one more go before concluding.
                print("    first rate fell behind: repeating it once", flush=True)
                discarded.append(results.pop())
                plan.insert(0, (1, rate))  # with the shorter settle warm-up
                continue
            if why:
                break
    finally:
        await system.drop_query(name)
    for row in discarded:
        row["discarded_first_try"] = True
    if results:
        results[0]["first_try"] = discarded[0] if discarded else None
    return results


async def idle_cpu(pid: int, seconds: float) -> tuple[float, float]:
    meter = bc.CpuMeter(pid).start()
    await asyncio.sleep(seconds)
    return meter.stop()


async def many_queries(
    peer: PeerSystem, args: argparse.Namespace, results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    lanes: list[Lane] = []
    for count in args.queries:
        print(
            f"  {count} {args.multi_kind} queries at {bc.fmt_rate(args.per_query_rate)}/s each",
            flush=True,
        )
        started = time.monotonic()
        while len(lanes) < count:
            i = len(lanes)
            load = Load(args.multi_batch_rows, args.keys, 1000 + i)
            lanes.append(await peer.add_query(args.multi_kind, f"m{i}", load))
        start_s = time.monotonic() - started
        point = await run_point(
            lanes,
            args.per_query_rate,
            warm_s=args.warmup,
            measure_s=args.duration,
            tail_s=args.tail,
            inflight=1,
            server_pid=peer.pid,
            max_p99=args.max_p99,
            label=f"peer {count} queries",
        )
        # Idle: queries running, no input. Results still arriving mean a backlog drained.
        await asyncio.sleep(2.0)
        before = sum(len(lane.result_batches) for lane in lanes)
        idle_cores, idle_system = await idle_cpu(peer.pid, args.idle)
        draining = sum(len(lane.result_batches) for lane in lanes) - before
        memory_idle = bc.tree_memory(peer.pid).as_dict()
        whys = [judge(s, args.per_query_rate, args.max_p99) for s in point.lanes]
        p50s = [s["p50"] for s in point.lanes]
        p99s = [s["p99"] for s in point.lanes]
        row = {
            "queries": count,
            "per_query_rate": args.per_query_rate,
            "start_s": start_s,
            "p50_median": float(np.median(p50s)),
            "p50_worst": max(p50s),
            "p99_median": float(np.median(p99s)),
            "p99_worst": max(p99s),
            "delivered_min": min(s["delivered"] for s in point.lanes),
            "push_rate_total": sum(s["push_rate"] for s in point.lanes),
            "kept_up": sum(1 for w in whys if not w),
            "why": sorted({x for w in whys for x in w}),
            "load_cores": point.server_cores,
            "load_system_cores": point.system_cores,
            "load_breakdown": point.server_breakdown,
            "idle_cores": idle_cores,
            "idle_system_cores": idle_system,
            "idle_result_batches": draining,
            "memory_load": point.memory,
            "memory_idle": memory_idle,
            "lanes": point.lanes,
        }
        results.append(row)
        print(
            f"    p50 median {bc.fmt_s(row['p50_median'])} worst {bc.fmt_s(row['p50_worst'])}, "
            f"p99 median {bc.fmt_s(row['p99_median'])} worst {bc.fmt_s(row['p99_worst'])}, "
            f"{row['kept_up']}/{count} kept up, load {point.server_cores:.2f} cores, "
            f"idle {idle_cores:.2f} cores, RSS {memory_idle['rss_mb']} MB "
            f"({memory_idle['processes']} processes)",
            flush=True,
        )
    for lane in lanes:
        with contextlib.suppress(Exception):
            await peer.drop_query(lane.name)
    return results


# --------------------------------------------------------------------------- report


def single_table(rows: list[dict[str, Any]], kind: str) -> tuple[str, dict[str, Any]]:
    peer = {r["offered"]: r for r in rows if r["system"] == "peer" and r["query"] == kind}
    ref = {r["offered"]: r for r in rows if r["system"] == "reference" and r["query"] == kind}
    body = []

    def status(r: dict[str, Any] | None) -> str:
        if r is None:
            return "not run"
        return "yes" if r["kept_up"] else "**no**: " + "; ".join(r["why"])

    for rate in sorted(set(peer) | set(ref)):
        p, f = peer.get(rate), ref.get(rate)
        body.append(
            [
                bc.fmt_rate(rate),
                bc.fmt_rate(p["achieved"]) if p else "-",
                bc.fmt_s(p["p50"]) if p else "-",
                bc.fmt_s(p["p99"]) if p else "-",
                f"{bc.fmt_s(p.get('engine_p50'))} / {bc.fmt_s(p.get('delivery_p50'))}"
                if p
                else "-",
                bc.fmt_rate(f["achieved"]) if f else "-",
                bc.fmt_s(f["p50"]) if f else "-",
                bc.fmt_s(f["p99"]) if f else "-",
                bc.fmt_ratio(p["achieved"], f["achieved"]) if p and f else "n/a",
                bc.fmt_ratio(p["p50"], f["p50"]) if p and f else "n/a",
                f"{p['server_cores']:.2f} / {f['server_cores']:.2f}" if p and f else "-",
                status(p),
                status(f),
            ]
        )
    header = [
        "offered (tuples/s)",
        "peer achieved",
        "peer p50",
        "peer p99",
        "peer p50: push→result spool / spool→subscriber",
        "Spark achieved",
        "Spark p50",
        "Spark p99",
        "throughput ratio",
        "p50 ratio",
        "cores (peer / Spark tree)",
        "peer kept up",
        "Spark kept up",
    ]

    def best(d: dict[float, dict[str, Any]]) -> float:
        ok = [r["achieved"] for r in d.values() if r["kept_up"]]
        return max(ok) if ok else 0.0

    summary = {
        "peer_sustained": best(peer),
        "reference_sustained": best(ref),
        "peer_max_offered_kept": max([k for k, r in peer.items() if r["kept_up"]], default=0),
        "reference_max_offered_kept": max([k for k, r in ref.items() if r["kept_up"]], default=0),
    }
    common = [
        rate for rate in peer if rate in ref and peer[rate]["kept_up"] and ref[rate]["kept_up"]
    ]
    ratios = [peer[r]["p50"] / ref[r]["p50"] for r in common if ref[r]["p50"] > 0]
    summary["p50_ratio_median"] = float(np.median(ratios)) if ratios else float("nan")
    return bc.md_table(header, body), summary


def multi_table(rows: list[dict[str, Any]], idle0: dict[str, Any] | None, idle_s: float) -> str:
    header = [
        "queries",
        "tuples/s (total pushed)",
        "per-query p50 (median / worst)",
        "per-query p99 (median / worst)",
        "kept up",
        "peer tree CPU under load",
        f"idle CPU ({idle_s:g} s, no input)",
        "RSS tree (JVM)",
        "processes (Python)",
        "note",
    ]
    body = []
    if idle0 is not None:
        m = idle0["memory"]
        body.append(
            [
                "0",
                "-",
                "-",
                "-",
                "-",
                "-",
                f"{idle0['cores']:.2f} cores",
                f"{m['rss_mb'] / 1024:.2f} GB ({m['jvm_rss_mb'] / 1024:.2f} GB)",
                f"{m['processes']} ({m['python_processes']})",
                "peer started, no query",
            ]
        )
    for r in rows:
        m = r["memory_idle"]
        note = "; ".join(r["why"][:3]) if r["why"] else ""
        if r["idle_result_batches"]:
            note += ("; " if note else "") + (
                f"still draining a backlog during the idle "
                f"measurement ({r['idle_result_batches']} "
                "result batches)"
            )
        body.append(
            [
                str(r["queries"]),
                bc.fmt_rate(r["push_rate_total"]),
                f"{bc.fmt_s(r['p50_median'])} / {bc.fmt_s(r['p50_worst'])}",
                f"{bc.fmt_s(r['p99_median'])} / {bc.fmt_s(r['p99_worst'])}",
                f"{r['kept_up']}/{r['queries']}",
                f"{r['load_cores']:.2f} cores",
                f"{r['idle_cores']:.2f} cores",
                f"{m['rss_mb'] / 1024:.2f} GB ({m['jvm_rss_mb'] / 1024:.2f} GB)",
                f"{m['processes']} ({m['python_processes']})",
                note or "-",
            ]
        )
    return bc.md_table(header, body)


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    out = []
    info = results["machine"]
    out.append(
        f"Machine: {info['nproc']} cores, {info['cpu']}, {info['ram_gib']} GiB RAM; "
        f"Python {info['python']}, {info['java']}, pyspark {info['pyspark']}, "
        f"pyarrow {info['pyarrow']}; {info['date']}"
    )
    out.append(
        f"Load average before: {results['load_before']}, after: {results.get('load_after', '?')}"
    )
    out.append(f"Command: {results['command']}")
    out.append(
        f"Batches of {args.batch_rows} rows, {args.keys} keys; warm-up {args.warmup:g} s "
        f"(first rate) / {args.settle:g} s (next rates), measured {args.duration:g} s, "
        f"tail <= {args.tail:g} s; kept up = p99 <= {args.max_p99:g} s and >= 99 % "
        "delivered and no latency growth."
    )
    summaries = {}
    for kind, title in (
        ("filter", "Filter v >= 900 + projection (keeps 10 %)"),
        ("agg", "Tumbling 1 s window per key: count, avg, max(sent)"),
    ):
        if not any(r["query"] == kind for r in results["single"]):
            continue
        table, summary = single_table(results["single"], kind)
        summaries[kind] = summary
        out.append(f"\n### {title}\n\n{table}\n")
        out.append(
            f"Highest sustained: peer {bc.fmt_rate(summary['peer_sustained'])}/s, plain "
            f"Spark {bc.fmt_rate(summary['reference_sustained'])}/s (ratio "
            f"{bc.fmt_ratio(summary['peer_sustained'], summary['reference_sustained'])}); "
            f"median p50 ratio at rates both kept up with: "
            f"{summary['p50_ratio_median']:.2f}x"
        )
    results["summary"] = summaries
    for error in results.get("errors", []):
        out.append(f"\n**Failed**: {error}")
    for crash in results.get("peer_crashes", []):
        out.append(f"\n**Peer process died and was restarted** (many-queries phase): {crash}")
    if results.get("multi"):
        table = multi_table(results["multi"], results.get("idle0"), args.idle)
        kind = (
            "tumbling-window aggregates"
            if args.multi_kind == "agg"
            else "filter queries, run in the stateless lane"
        )
        out.append(
            f"\n### One peer, many queries (all {kind}, "
            f"{bc.fmt_rate(args.per_query_rate)} tuples/s each, batches of "
            f"{args.multi_batch_rows})\n\n{table}\n"
        )
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = 1_000_000 if part.endswith("m") else 1_000 if part.endswith("k") else 1
        out.append(float(part.rstrip("mk")) * mult)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="~3-4 minute smoke version")
    p.add_argument("--rates", help="filter offered rates, tuples/s (e.g. 50k,100k,200k)")
    p.add_argument("--agg-rates", help="aggregate offered rates, tuples/s")
    p.add_argument("--duration", type=float, help="measured seconds per point")
    p.add_argument("--warmup", type=float, help="warm-up seconds at a query's first rate")
    p.add_argument("--settle", type=float, help="warm-up seconds at each later rate")
    p.add_argument(
        "--tail",
        type=float,
        default=10.0,
        help="at most this many seconds to wait for the measured results",
    )
    p.add_argument("--idle", type=float, help="idle CPU measurement seconds")
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows per pushed batch")
    p.add_argument("--keys", type=int, default=100)
    p.add_argument(
        "--inflight",
        type=int,
        default=4,
        help="unacknowledged pushes allowed (filter; aggregates push one at a time so "
        "that event time never goes backwards)",
    )
    p.add_argument("--max-p99", type=float, default=3.0)
    p.add_argument("--queries", help="numbers of concurrent queries (e.g. 1,4,16)")
    p.add_argument("--per-query-rate", type=float, default=5000)
    p.add_argument(
        "--multi-kind",
        choices=("agg", "filter"),
        default="agg",
        help="the kind of the many queries: window aggregates (one Spark streaming "
        "query each) or filters (all in the peer's stateless lane)",
    )
    p.add_argument("--multi-batch-rows", type=int, default=1000)
    p.add_argument("--skip-reference", action="store_true")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-multi", action="store_true")
    p.add_argument("--skip-single", action="store_true", help="only the many-queries phase")
    p.add_argument("--only", choices=("filter", "agg"), help="run one single-query kind only")
    p.add_argument("--json", help="write all measurements to this file")
    p.add_argument(
        "--peer-args", default="", help="extra `peer join` options, e.g. --peer-args=--no-lane"
    )
    p.add_argument("--work-dir", help="where peer data and spools go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.rates = parse_rates(
        args.rates or ("50k,200k" if quick else "50k,100k,200k,400k,600k,800k,1.2m")
    )
    args.agg_rates = parse_rates(
        args.agg_rates or ("50k,200k" if quick else "50k,200k,400k,600k,800k,1.2m")
    )
    args.duration = args.duration or (8.0 if quick else 20.0)
    args.warmup = args.warmup or (10.0 if quick else 25.0)
    args.settle = args.settle or (4.0 if quick else 6.0)
    args.idle = args.idle or (5.0 if quick else 10.0)
    args.queries = [int(x) for x in (args.queries or ("1,4" if quick else "1,4,16")).split(",")]
    if quick:
        args.tail = min(args.tail, 6.0)
    return args


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": bc.machine_info(),
        "load_before": bc.load_average(),
        "busy_before": bc.busy_processes(exclude={os.getpid()}),
        "command": " ".join(["scripts/bench_peer.py", *sys.argv[1:]]),
        "single": [],
        "multi": [],
    }
    print(f"machine: {results['machine']}", flush=True)
    print(f"load average {results['load_before']}; busiest: {results['busy_before']}", flush=True)
    kinds = [args.only] if args.only else ["filter", "agg"]
    began = time.monotonic()
    results["errors"] = []

    def failed(phase: str, exc: BaseException) -> None:
        # One phase failing (a peer dying) must not lose the others' measurements.
        print(f"{phase} FAILED: {type(exc).__name__}: {exc}", flush=True)
        results["errors"].append(f"{phase}: {type(exc).__name__}: {exc}")

    if not args.skip_peer and not args.skip_single:
        print("peer (peer join process, real client)", flush=True)
        peer = PeerSystem(work / "single")
        try:
            await peer.start()
            for kind in kinds:
                rates = args.rates if kind == "filter" else args.agg_rates
                results["single"] += await rate_steps(peer, kind, rates, args, seed=7)
        except Exception as exc:
            failed("peer single-query phase", exc)
        finally:
            await peer.close()
        print(f"peer phase done after {time.monotonic() - began:.0f} s", flush=True)
    if not args.skip_peer and not args.skip_multi:
        # A fresh peer: the single-query phase ends by overloading the previous one.
        print("peer, many queries (fresh peer join process)", flush=True)
        peer = PeerSystem(work / "multi")
        try:
            await peer.start()
            await asyncio.sleep(3.0)
            cores, _ = await idle_cpu(peer.pid, args.idle)
            results["idle0"] = {"cores": cores, "memory": bc.tree_memory(peer.pid).as_dict()}
            await many_queries(peer, args, results["multi"])
        except Exception as exc:
            failed("peer many-queries phase", exc)
        finally:
            results["peer_crashes"] = peer.crashes
            await peer.close()
        print(f"many-queries phase done after {time.monotonic() - began:.0f} s", flush=True)
    if not args.skip_reference and not args.skip_single:
        print("reference (plain Spark Structured Streaming, same source, no peer)", flush=True)
        ref = ReferenceSystem(work)
        try:
            await ref.start()
            for kind in kinds:
                rates = args.rates if kind == "filter" else args.agg_rates
                results["single"] += await rate_steps(ref, kind, rates, args, seed=7)
        except Exception as exc:
            failed("reference phase", exc)
        finally:
            await ref.close()
        print(f"reference phase done after {time.monotonic() - began:.0f} s", flush=True)
    results["load_after"] = bc.load_average()
    results["busy_after"] = bc.busy_processes(exclude={os.getpid()})
    results["elapsed_s"] = time.monotonic() - began
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    PEER_ARGS[:] = args.peer_args.split()
    if args.reference_worker:
        return reference_worker(Path(args.work_dir))
    work = (
        Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="fedstream-bench-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory {work}", flush=True)
    try:
        results = asyncio.run(main_async(args, work))
    except BaseException:
        print(f"benchmark failed: logs kept in {work} (peer.log, reference.log)", flush=True)
        raise
    if results["errors"]:
        print(f"errors: {results['errors']}; logs kept in {work}", flush=True)
    elif not args.keep and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    text = report(results, args)
    print("\n" + text)
    print(f"\nbusiest processes after: {results['busy_after']}")
    print(f"elapsed {results['elapsed_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(bc.jsonable(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
