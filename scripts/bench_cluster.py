#!/usr/bin/env python3
"""Distributed queries (issue 4): one peer against three peers of three participants.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_cluster.py            # full run, 10-15 min on 2 cores
    .venv/bin/python scripts/bench_cluster.py --quick    # smoke version, ~5 min
    .venv/bin/python scripts/bench_cluster.py --report-from run.json   # a run saved with --json
    .venv/bin/python scripts/bench_cluster.py --peer-args=--no-voter   # no control plane: streams
                                       # of one copy, as before peer join volunteered by default

What runs
---------
Two setups, one after the other, each a set of separate ``peer join`` processes on loopback
(``peer.testing.PeerProcess``, each with its own JVM), of distinct participants with keys,
a shared trust directory and the first peer as bootstrap:

- *1 peer*: participant ``acme`` alone, Spark ``local[*]`` (``--single-master``). This is the
  reference for what Spark alone does: the same query, fused as far as Spark allows, in one
  session, with no mirror between its parts.
- *3 peers*: ``acme``, ``globex``, ``initech``, Spark ``local[1]`` each (``--cluster-master``),
  so that three JVMs share the machine's two cores.

This process drives them with the asyncio ``peer.client.Client``: pushes go to the peer that
hosts the stream, subscriptions to the peer that hosts the result stream (no relay). Stream
names are picked so that a source stream lives where its first reader runs.

Chain (``--chain-rates``): filter ``v >= 500`` -> map ``v * 2`` -> filter ``k < 50`` over tuples
``(k, v, sent)``, one box per peer through ``"node"`` (acme, globex, initech: two mirror hops)
against the same chain on one peer (one Spark query). Latency = receive time minus ``sent``,
the wall clock just before the push. Per hop = (3-peer p50 - 1-peer p50) / 2, compared with
the duration of one micro-batch of the 1-peer query, read from Spark's own progress: the
modification times of each batch's offset-log entry (written when the batch starts) and its
commit-log entry (written when it ends) in the query's checkpoint.

Traffic (``--rates``): ``peer.examples.traffic`` (Medusa's figure 1) with its boxes spread by
``traffic.BOX_GROUPS`` (statistics and tolls on acme, billing on globex, towing on initech) or,
on one peer, placed by the peer (three fragments there too: a join behind an aggregate starts
a fragment of its own). Input comes from ``traffic.generate``: for an offered rate of R car
positions per second, ``30 * R / scale`` cars (every car reports every 30 s of event time) on
one road segment per 50 cars, and their tow trucks (about 5 % more tuples). Event time runs
``--time-scale`` times faster than the wall clock (60: one one-minute statistics window closes
every second), so that tolls, bills and dispatches happen within a measured window; the
generated ten minutes repeat, shifted in event time. Every push carries the tuples that have
come due since the last one (``--push-interval-ms``), one push in flight per stream, so event
time never goes backwards.

Latency of a toll notification = its receive time minus the push time of the car position it
bills (found by its event time: each push carries a contiguous range of it); of a tow
dispatch, minus the later of the two pushes it joins. A moving car's position is billed once
if its segment had any car in the minute before (then a toll tuple exists, maybe toll 0);
that is the expected count. A car report waits for the toll of its minute, which the
aggregate emits only once the first reports of that minute have moved its watermark (two of
its micro-batches), then the map, on three peers a mirror, and the join's micro-batch. At
``--time-scale 60`` a minute lasts one wall second, less than that path, so nearly every
notification carries the whole path: aggregate -> map -> (mirror) -> join.

A point (one rate): warm up (``--warmup`` s at the first rate, ``--settle`` s at the next
ones), measure ``--duration`` s, then keep pushing for at most ``--tail`` s until every result
of the measured pushes has arrived. Kept up = pushes reached 95 % of the offered rate, >= 99 %
of the expected results arrived, p99 <= ``--max-p99`` s (chain) or ``--traffic-max-p99`` s
(traffic, whose latency is several micro-batches in series) and the median latency of the
last third of the window is within 1 s of the first third. Rates step up until a point does not
keep up. "cores" = CPU of all peers' process trees (peer, JVM, Spark's Python workers).

Everything started here is stopped on the way out (also on Ctrl-C): clients closed, each peer
sent SIGTERM, then its process group killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc
from bench_peer import parse_rates

from contracts.keys import generate as generate_key
from peer.client import Client
from peer.engine.runner import query_key
from peer.examples import traffic
from peer.model.schema import parse_schema, to_arrow_schema
from peer.storage import spool_format as fmt
from peer.testing import PeerProcess, stream_name_on

PARTICIPANTS = ("acme", "globex", "initech")
US = 1_000_000
REPORT_S = 30  # a car reports every 30 s of event time (traffic.generate)
CARS_PER_SEGMENT = 50
EPOCH_MINUTES = 10  # generated once per rate, then repeated

CHAIN_SCHEMA: dict[str, Any] = {
    "name": "chain_tuple",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "sent", "type": "long"},
    ],
}
KEEP_V = 500  # the first filter keeps v >= 500 (half), the last one k < 50 (half again)
KEEP_K = 50


def chain_query(source: str, nodes: tuple[str, str, str] | None) -> dict[str, Any]:
    """filter -> map -> filter; with ``nodes``, one box per participant."""
    boxes: list[dict[str, Any]] = [
        {
            "name": "keep",
            "type": "filter",
            "inputs": [source],
            "outputs": ["chain_kept"],
            "params": {"expression.0": f"v >= {KEEP_V}"},
        },
        {
            "name": "double",
            "type": "map",
            "inputs": ["chain_kept"],
            "outputs": ["chain_doubled"],
            "params": {
                "expression.0": "k",
                "output-field-name.0": "k",
                "expression.1": "v * 2",
                "output-field-name.1": "v",
                "expression.2": "sent",
                "output-field-name.2": "sent",
            },
        },
        {
            "name": "select",
            "type": "filter",
            "inputs": ["chain_doubled"],
            "outputs": ["chain_out"],
            "params": {"expression.0": f"k < {KEEP_K}"},
        },
    ]
    if nodes is not None:
        for box, node in zip(boxes, nodes, strict=True):
            box["node"] = node
    return {"name": "chain", "boxes": boxes}


def traffic_query(cars: str, trucks: str, spread: bool) -> dict[str, Any]:
    """The traffic query over source streams named ``cars`` and ``trucks``; with ``spread``,
    box group i of ``traffic.BOX_GROUPS`` runs at participant i."""
    nodes = (
        {box: PARTICIPANTS[i] for i, group in enumerate(traffic.BOX_GROUPS) for box in group}
        if spread
        else None
    )
    query = traffic.query("traffic", nodes)
    names = {"car_positions": cars, "tow_trucks": trucks}
    for box in query["boxes"]:
        box["inputs"] = [names.get(s, s) for s in box["inputs"]]
    return query


# --------------------------------------------------------------------------- the peers

# Every peer process this script started: main() stops whatever is left, also on Ctrl-C.
STARTED: list[PeerProcess] = []


def stop_peer(peer: PeerProcess) -> None:
    """SIGTERM (60 s to stop its queries and its JVM), then SIGKILL to its process group in
    case something of it outlived it."""
    if peer.proc is None:
        return
    with contextlib.suppress(Exception):
        peer.stop(60)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(peer.proc.pid, signal.SIGKILL)


class Cluster:
    """``size`` peers of the first ``size`` participants, joined through the first one."""

    def __init__(self, work: Path, size: int, master: str, extra: tuple[str, ...] = ()) -> None:
        """``extra``: more ``peer join`` options for every peer (``--peer-args``)."""
        self.work = work
        self.size = size
        self.master = master
        self.extra = extra
        self.names = PARTICIPANTS[:size]
        self.label = "1 peer" if size == 1 else f"{size} peers"
        self.peers: dict[str, PeerProcess] = {}
        self.ctl: dict[str, Client] = {}
        self.clients: list[Client] = []
        self.checkpoints: dict[str, str] = {}  # checkpoint name prefix -> fragment

    def watch(self, made: dict[str, Any]) -> None:
        """Follow the micro-batches of the fragments of a query ``create_query`` made."""
        for fragment in made["fragments"]:
            # a checkpoint is named after the fragment and its incarnation
            self.checkpoints[query_key(fragment["name"], "")] = fragment["name"]

    async def start(self, timeout_s: float = 240) -> None:
        started = time.monotonic()
        keys, trust = self.work / "keys", self.work / "trust"
        trust.mkdir(parents=True, exist_ok=True)
        keyfiles = {}
        for name in self.names:  # every key in the trust directory before any peer reads it
            keyfiles[name], pub = generate_key(name, keys, overwrite=True)
            (trust / pub.name).write_bytes(pub.read_bytes())
        for name, key in keyfiles.items():
            bootstrap = ["--bootstrap", self.peers["acme"].overlay_addr] if self.peers else []
            peer = PeerProcess(
                self.work / name,
                *("--participant", name, "--key", str(key), "--trust", str(trust)),
                *("--spark-master", self.master, *bootstrap),
                *self.extra,
                log_path=self.work / f"{name}.log",
            )
            STARTED.append(peer)
            self.peers[name] = peer.launch()
            if name == "acme":  # the others bootstrap through it
                await asyncio.to_thread(peer.wait_ready, timeout_s)
        for peer in self.peers.values():
            await asyncio.to_thread(peer.wait_ready, timeout_s)
        for name in self.peers:
            self.ctl[name] = await self.client(name, f"bench-ctl-{name}")
        deadline = time.monotonic() + 120
        while True:
            members = (await self.ctl["acme"].status())["overlay"]["members"]
            if sum(m["state"] == "alive" for m in members) >= self.size:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.label}: {len(members)} members after 120 s")
            await asyncio.sleep(0.2)
        print(
            f"  {self.label} ready in {time.monotonic() - started:.1f} s (Spark {self.master}): "
            + ", ".join(f"{n} :{p.port} node {p.node_id[:8]}" for n, p in self.peers.items()),
            flush=True,
        )

    async def client(self, name: str, label: str) -> Client:
        c = Client("127.0.0.1", self.peers[name].port, timeout_s=120, client_name=label)
        await c.connect()
        self.clients.append(c)
        return c

    def source_name(self, base: str, site: str) -> str:
        """A stream name that the overlay places on ``site`` (XOR-closest node id)."""
        ids = [bytes.fromhex(p.node_id) for p in self.peers.values()]
        return stream_name_on(bytes.fromhex(self.peers[site].node_id), ids, base)

    async def host_of(self, stream: str) -> str:
        for name, c in self.ctl.items():
            if stream in (await c.status()).get("hosted", []):
                return name
        raise RuntimeError(f"no peer hosts {stream}")

    async def queries(self) -> dict[str, dict[str, Any]]:
        """Every query (fragment) on every peer: ``peer@fragment`` -> its status entry."""
        out = {}
        for name, c in self.ctl.items():
            for q in (await c.status())["queries"]:
                out[f"{name}@{q['name']}"] = q
        return out

    def check_alive(self) -> None:
        for name, peer in self.peers.items():
            assert peer.proc is not None
            if peer.proc.poll() is not None:
                tail = peer.log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"peer {name} exited with {peer.proc.returncode}:\n{tail}")

    def meters(self) -> list[bc.CpuMeter]:
        return [bc.CpuMeter(p.proc.pid) for p in self.peers.values() if p.proc is not None]

    def batch_durations(self, t0: float, t1: float) -> dict[str, list[float]]:
        """Per fragment, the durations of the micro-batches that started in [t0, t1): commit-log
        minus offset-log modification time, in each query's checkpoint."""
        out: dict[str, list[float]] = {}
        for name, peer in self.peers.items():
            root = peer.data_dir / "checkpoints"
            if not root.is_dir():
                continue
            for checkpoint in root.iterdir():
                fragment = self.checkpoints.get(checkpoint.name.rpartition("-")[0] + "-")
                if fragment is None:
                    continue
                durations = out.setdefault(f"{name}@{fragment}", [])
                commits = checkpoint / "commits"
                for entry in commits.iterdir() if commits.is_dir() else []:
                    start = checkpoint / "offsets" / entry.name
                    with contextlib.suppress(OSError):
                        began = start.stat().st_mtime
                        if entry.name.isdigit() and t0 <= began < t1:
                            durations.append(entry.stat().st_mtime - began)
        return out

    async def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 10)
        self.clients.clear()
        for name, peer in self.peers.items():
            await asyncio.to_thread(stop_peer, peer)
            code = peer.proc.returncode if peer.proc is not None else None
            if code not in (0, None):
                print(f"  peer {name} exited with {code}; see {peer.log_path}", flush=True)


# --------------------------------------------------------------------------- bookkeeping


@dataclass
class PushLog:
    """The pushes of one stream: when each was sent, the first event time it carried (pushes
    carry increasing, contiguous ranges of it), its rows and its expected results."""

    sent: list[float] = field(default_factory=list)
    first_t: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)
    _arrays: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, sent: float, first_t: int, rows: int, expected: int) -> int:
        self.sent.append(sent)
        self.first_t.append(first_t)
        self.rows.append(rows)
        self.expected.append(expected)
        self._arrays = None
        return len(self.sent) - 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (np.array(self.sent), np.array(self.first_t, dtype=np.int64))
        return self._arrays

    def index_of(self, t: np.ndarray) -> np.ndarray:
        """The push that carried each event time ``t``."""
        _sent, first = self.arrays()
        return np.searchsorted(first, t, side="right") - 1


@dataclass
class Received:
    """Result rows as (push index, receive time), for latency and delivery per push."""

    index: list[np.ndarray] = field(default_factory=list)
    recv: list[np.ndarray] = field(default_factory=list)

    def add(self, index: np.ndarray, recv: float) -> None:
        self.index.append(index.astype(np.int64))
        self.recv.append(np.full(len(index), recv))


def analyze(log: PushLog, got: Received, t0: float, t1: float) -> dict[str, Any]:
    """Latency and delivery of the results of the pushes sent in [t0, t1)."""
    sent = np.array(log.sent)
    measured = (sent >= t0) & (sent < t1)
    span = t1 - t0
    expected = np.array(log.expected, dtype=np.int64)
    rows = np.array(log.rows, dtype=np.int64)
    index = np.concatenate(got.index) if got.index else np.zeros(0, dtype=np.int64)
    recv = np.concatenate(got.recv) if got.recv else np.zeros(0)
    ok = index >= 0
    index, recv = index[ok], recv[ok]
    counts = np.bincount(index, minlength=len(sent))[: len(sent)]
    delivered = np.minimum(counts, expected)
    missing = int((expected - delivered)[measured].sum())
    keep = measured[index]
    latency = recv[keep] - sent[index[keep]]
    samples = np.concatenate([latency, np.full(missing, np.inf)])
    sample_t = np.concatenate([sent[index[keep]], np.full(missing, t1)])
    want = int(expected[measured].sum())
    complete = measured & (counts >= expected)
    third = span / 3
    return {
        "push_rate": float(rows[measured].sum()) / span,
        "pushes": int(measured.sum()),
        "expected": want,
        "received": int(delivered[measured].sum()),
        "delivered": float(delivered[measured].sum()) / want if want else float("nan"),
        "missing": missing,
        "duplicates": int(np.maximum(counts - expected, 0)[measured].sum()),
        "achieved": float(rows[complete].sum()) / span,
        "p50": bc.quantile(samples, 0.5),
        "p99": bc.quantile(samples, 0.99),
        "p50_first_third": bc.quantile(samples[sample_t < t0 + third], 0.5),
        "p50_last_third": bc.quantile(samples[sample_t >= t1 - third], 0.5),
    }


def judge(stats: dict[str, Any], offered: float, max_p99: float) -> list[str]:
    """Why a point did not keep up (empty: it kept up)."""
    why = []
    if stats["push_rate"] < 0.95 * offered:
        why.append(f"pushes reached only {bc.fmt_rate(stats['push_rate'])}/s")
    if not stats["delivered"] >= 0.99:
        why.append(f"{stats['missing']} of {stats['expected']} results missing after the tail")
    if not stats["p99"] <= max_p99:
        why.append(f"p99 {bc.fmt_s(stats['p99'])} > {max_p99:g} s")
    if not stats["p50_last_third"] - stats["p50_first_third"] <= 1.0:
        why.append(
            f"latency growing ({bc.fmt_s(stats['p50_first_third'])} -> "
            f"{bc.fmt_s(stats['p50_last_third'])})"
        )
    return why


def fragment_summary(
    durations: dict[str, list[float]], before: dict[str, Any], after: dict[str, Any], span: float
) -> dict[str, dict[str, float]]:
    """Per fragment: micro-batches in the window (from `status`), their period, and the p50 /
    p90 duration of those whose checkpoint entries are still there."""
    out = {}
    for key, entry in after.items():
        batches = int(entry.get("batches", 0)) - int(before.get(key, {}).get("batches", 0))
        seen = np.array(durations.get(key, []))
        out[key] = {
            "batches": batches,
            "period_s": span / batches if batches > 0 else float("nan"),
            "duration_p50": bc.quantile(seen, 0.5),
            "duration_p90": bc.quantile(seen, 0.9),
            "durations_seen": len(seen),
            "status": entry.get("status"),
            "error": entry.get("error"),
        }
    return out


# --------------------------------------------------------------------------- load


class Pacer:
    """Run ``step`` every ``interval_s`` until ``stop``; the schedule slips when a step takes
    longer (the next one then carries more)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s

    async def run(self, step: Callable[[], Any], stop: asyncio.Event) -> None:
        nxt = time.monotonic()
        while not stop.is_set():
            await step()
            nxt = max(nxt + self.interval_s, time.monotonic() - self.interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, nxt - time.monotonic()))


def columns_of(rows: list[dict[str, Any]], schema: pa.Schema) -> dict[str, np.ndarray]:
    return {
        f.name: np.array([r[f.name] for r in rows], dtype=f.type.to_pandas_dtype()) for f in schema
    }


@dataclass
class Population:
    """One rate's cars and tow trucks (``traffic.generate``), as columns in event-time order."""

    rate: float
    cars: int
    segments: int
    car_cols: dict[str, np.ndarray]
    truck_cols: dict[str, np.ndarray]


def make_population(rate: float, scale: float, seed: int) -> Population:
    cars = max(60, round(REPORT_S * rate / scale))
    segments = max(8, cars // CARS_PER_SEGMENT)
    data = traffic.generate(
        seed,
        cars=cars,
        minutes=EPOCH_MINUTES,
        segments=segments,
        jams=max(1, segments // 8),
        flush=False,
    )
    return Population(
        rate,
        cars,
        segments,
        columns_of(data["car_positions"], SCHEMAS["car_positions"]),
        columns_of(data["tow_trucks"], SCHEMAS["tow_trucks"]),
    )


SCHEMAS = {
    stream: to_arrow_schema(parse_schema(next(s for s in traffic.SCHEMAS if s["name"] == name)))
    for stream, name in traffic.SOURCE_STREAMS.items()
}


class Feed:
    """A stream's generated rows, repeated epoch after epoch, shifted to start at ``start_t``."""

    def __init__(self, cols: dict[str, np.ndarray], schema: pa.Schema, start_t: int) -> None:
        self.cols = cols
        self.schema = schema
        self.epoch_s = EPOCH_MINUTES * 60
        self.start_t = start_t
        self.epoch = 0
        self.pos = 0

    def take(self, until_t: int) -> pa.Table | None:
        """The rows with event time before ``until_t`` not taken yet."""
        t = self.cols["t"]
        parts: list[pa.Table] = []
        while len(t):
            base = self.start_t + self.epoch * self.epoch_s
            end = int(np.searchsorted(t, until_t - base, side="left"))
            if end > self.pos:
                arrays = [
                    pa.array(self.cols[f.name][self.pos : end] + (base if f.name == "t" else 0))
                    for f in self.schema
                ]
                parts.append(pa.Table.from_arrays(arrays, schema=self.schema))
            if end < len(t):
                self.pos = end
                break
            self.epoch, self.pos = self.epoch + 1, 0
        return pa.concat_tables(parts) if parts else None


class TollBook:
    """Which (minute, segment) cells have seen a car: a moving car's report is billed iff its
    segment had a car in the minute before."""

    def __init__(self) -> None:
        self.present: dict[int, set[int]] = {}

    def expect(self, table: pa.Table) -> int:
        t = table.column("t").to_numpy()
        seg = table.column("seg").to_numpy()
        moving = table.column("speed").to_numpy() > 0
        minute = t // 60 * 60
        for m in np.unique(minute).tolist():
            self.present.setdefault(m, set()).update(np.unique(seg[minute == m]).tolist())
        billed = 0
        for m in np.unique(minute).tolist():
            segs = self.present.get(m - 60)
            if segs:
                mask = (minute == m) & moving & np.isin(seg, list(segs))
                billed += int(mask.sum())
        for old in [m for m in self.present if m < int(minute.min()) - 120]:
            del self.present[old]
        return billed


class Clock:
    """Event time (seconds) running ``scale`` times faster than the wall clock."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.t0 = time.time()

    def now(self) -> int:
        return int((time.time() - self.t0) * self.scale)


def feed_step(
    clock: Clock,
    feed: Feed,
    log: PushLog,
    client: Client,
    stream: str,
    expect: Callable[[pa.Table], int],
) -> Callable[[], Any]:
    """One push of the rows that have come due (logged before it is sent: a result may
    arrive before the acknowledgement)."""

    async def step() -> None:
        table = feed.take(clock.now())
        if table is None:
            return
        log.add(time.time(), int(table.column("t")[0].as_py()), table.num_rows, expect(table))
        await client.push(stream, table)

    return step


# --------------------------------------------------------------------------- one point


@dataclass
class Window:
    t0: float
    t1: float
    cores: float
    machine_cores: float
    bench_cores: float
    fragments: dict[str, dict[str, float]]


async def measure(
    cluster: Cluster,
    tasks: list[asyncio.Task[None]],
    done: Callable[[float, float], bool],
    *,
    warm_s: float,
    measure_s: float,
    tail_s: float,
    label: str,
) -> Window:
    """Warm up, measure, then wait (bounded) until ``done(t0, t1)``; pushing goes on all along.
    ``tasks`` (pushers, subscribers) must run throughout: one that ends ends the point."""

    async def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            for task in tasks:
                if task.done():
                    task.result()  # raises its error
                    raise RuntimeError(f"{task.get_name()} ended early")
            cluster.check_alive()
            await asyncio.sleep(min(left, 0.5))

    print(f"  [{label}] warm-up {warm_s:g} s", flush=True)
    await sleep(warm_s)
    before = await cluster.queries()
    meters = [m.start() for m in cluster.meters()]
    bench = bc.CpuMeter(os.getpid(), with_children=False).start()
    t0 = time.time()
    await sleep(measure_s)
    t1 = time.time()
    cores = sum(m.stop()[0] for m in meters)
    bench_cores, machine_cores = bench.stop()
    # read Spark's logs now: it keeps only its last 100 batches
    durations = await asyncio.to_thread(cluster.batch_durations, t0, t1)
    after = await cluster.queries()
    deadline = time.monotonic() + tail_s
    while time.monotonic() < deadline and not done(t0, t1):
        await sleep(0.25)
    return Window(
        t0,
        t1,
        cores,
        machine_cores,
        bench_cores,
        fragment_summary(durations, before, after, t1 - t0),
    )


async def stop_pushers(stop: asyncio.Event, pushers: list[asyncio.Task[None]]) -> None:
    stop.set()
    _done, pending = await asyncio.wait(pushers, timeout=150)
    for task in pending:
        task.cancel()
    for task in pushers:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def consume(sub: Any, on_batch: Callable[[float, dict[str, list[Any]]], None]) -> None:
    async for batch in sub:
        on_batch(time.time(), batch.columns)


@contextlib.asynccontextmanager
async def subscribed(client: Client, stream: str, on_batch: Callable[..., None]) -> Any:
    sub = await client.subscribe(stream, start="latest")
    task = asyncio.create_task(consume(sub, on_batch), name=f"subscriber of {stream}")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sub.aclose(), 10)


class SpoolWatcher:
    """When each pushed batch (by its ``sent`` stamp) was appended to each watched spool: the
    append stamp every spool file carries, read while the file exists (a spool is trimmed
    once its readers have committed, so a thread looks every ``interval_s``)."""

    def __init__(self, spools: dict[str, Path], interval_s: float = 0.05) -> None:
        self.spools = spools
        self.interval_s = interval_s
        self.first: dict[str, dict[int, float]] = {label: {} for label in spools}
        self._seen: dict[str, set[int]] = {label: set() for label in spools}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spool-watcher", daemon=True)

    def __enter__(self) -> SpoolWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for label, directory in self.spools.items():
                with contextlib.suppress(OSError):
                    for offset in fmt.list_offsets(directory):
                        if offset not in self._seen[label]:
                            self._seen[label].add(offset)
                            self._read(label, fmt.offset_path(directory, offset))

    def _read(self, label: str, path: Path) -> None:
        try:
            appended = int(fmt.file_metadata(path)[fmt.META_APPEND_NS]) / 1e9
            sent = fmt.read_file(path).column("sent").to_numpy()
        except (OSError, KeyError, pa.ArrowInvalid):
            return  # trimmed meanwhile
        first = self.first[label]
        for stamp in np.unique(sent).tolist():
            first.setdefault(stamp, appended)

    def stages(self, log: PushLog, got: Received, t0: float, t1: float) -> list[tuple[str, float]]:
        """Median time per stage over the pushes sent in [t0, t1): push -> first spool, spool
        -> next spool (a fragment's micro-batch, or a mirror), last spool -> subscriber."""
        sent = np.array(log.sent)
        index = np.concatenate(got.index) if got.index else np.zeros(0, dtype=np.int64)
        recv = np.concatenate(got.recv) if got.recv else np.zeros(0)
        first_recv: dict[int, float] = {}
        for i, r in zip(index.tolist(), recv.tolist(), strict=True):
            if i >= 0 and r < first_recv.get(i, np.inf):
                first_recv[i] = r
        points = [("push", {int(s * US): s for s in sent if t0 <= s < t1})]
        points += [(label, self.first[label]) for label in self.spools]
        points.append(("subscriber", {int(sent[i] * US): r for i, r in first_recv.items()}))
        out = []
        for (a, at), (b, bt) in itertools.pairwise(points):
            common = [k for k in points[0][1] if k in at and k in bt]
            gaps = np.array([bt[k] - at[k] for k in common])
            out.append((f"{a} -> {b}", bc.quantile(gaps, 0.5)))
        return out


# --------------------------------------------------------------------------- chain


async def run_chain(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    spread = cluster.size == 3
    source = cluster.source_name("chain_in", "acme")
    ctl = cluster.ctl["acme"]
    await ctl.create_schema(CHAIN_SCHEMA)
    await ctl.create_stream(source, CHAIN_SCHEMA["name"])
    made = await ctl.create_query(chain_query(source, PARTICIPANTS if spread else None))
    cluster.watch(made)
    await ctl.start_query("chain")
    out_host = await cluster.host_of("chain_out")
    print(
        f"  chain: source {source} on {await cluster.host_of(source)}, fragments "
        + ", ".join(f"{f['name']}@{f['site'][:8]}" for f in made["fragments"])
        + f", chain_out on {out_host}",
        flush=True,
    )
    # where each batch is appended on its way: fragment outputs and their mirrored replicas
    path = [("acme", source), ("acme", "chain_kept"), ("acme", "chain_out")]
    if spread:
        path[2:] = [
            ("globex", "chain_kept"),
            ("globex", "chain_doubled"),
            ("initech", "chain_doubled"),
            ("initech", "chain_out"),
        ]
    else:
        del path[1]  # one micro-batch: chain_kept is appended along with chain_out
    spools = {
        f"{peer}:{stream}": cluster.peers[peer].data_dir / "spool" / fmt.stream_dirname(stream)
        for peer, stream in path
    }
    pusher = await cluster.client("acme", "bench-chain-push")
    subs = await cluster.client(out_host, "bench-chain-sub")
    schema = to_arrow_schema(parse_schema(CHAIN_SCHEMA))
    rng = np.random.default_rng(11)
    rows: list[dict[str, Any]] = []
    try:
        for i, rate in enumerate(args.chain_rates):
            log, got = PushLog(), Received()
            by_sent: dict[int, int] = {}
            per_push = max(1, round(rate * args.push_interval_s))

            def on_batch(
                recv: float, cols: dict[str, list[Any]], by_sent: Any = by_sent, got: Any = got
            ) -> None:
                uniq, counts = np.unique(np.array(cols["sent"], dtype=np.int64), return_counts=True)
                index = [by_sent.get(int(s), -1) for s in uniq]
                got.add(np.repeat(np.array(index, dtype=np.int64), counts), recv)

            async def step(log: PushLog = log, by_sent: Any = by_sent, n: int = per_push) -> None:
                k = rng.integers(0, 100, n, dtype=np.int32)
                v = rng.integers(0, 1000, n, dtype=np.int64)
                sent = time.time()
                sent_us = int(sent * US)
                table = pa.Table.from_arrays(
                    [pa.array(k), pa.array(v), pa.array(np.full(n, sent_us, dtype=np.int64))],
                    schema=schema,
                )
                expected = int(((v >= KEEP_V) & (k < KEEP_K)).sum())
                by_sent[sent_us] = log.add(sent, len(log.sent), n, expected)
                await pusher.push(source, table)

            stop = asyncio.Event()
            async with subscribed(subs, "chain_out", on_batch) as consumer:
                pushers = [
                    asyncio.create_task(Pacer(args.push_interval_s).run(step, stop), name="pusher")
                ]
                try:
                    with SpoolWatcher(spools) as watcher:
                        window = await measure(
                            cluster,
                            [*pushers, consumer],
                            lambda t0, t1, log=log, got=got: (
                                analyze(log, got, t0, t1)["delivered"] >= 1.0
                            ),
                            warm_s=args.warmup if i == 0 else args.settle,
                            measure_s=args.duration,
                            tail_s=args.tail,
                            label=f"{cluster.label} chain {bc.fmt_rate(rate)}/s",
                        )
                finally:
                    await stop_pushers(stop, pushers)
            stats = analyze(log, got, window.t0, window.t1)
            stats["stages"] = watcher.stages(log, got, window.t0, window.t1)
            print("    " + ", ".join(f"{k} {bc.fmt_s(v)}" for k, v in stats["stages"]))
            why = judge(stats, rate, args.max_p99)
            row = {
                "setup": cluster.label,
                "offered": rate,
                **stats,
                "kept_up": not why,
                "why": why,
                "cores": window.cores,
                "machine_cores": window.machine_cores,
                "bench_cores": window.bench_cores,
                "fragments": window.fragments,
                "load": bc.load_average(),
            }
            rows.append(row)
            print_point(row)
    finally:
        with contextlib.suppress(Exception):
            await ctl.delete_query("chain")
    return rows


def print_point(row: dict[str, Any]) -> None:
    frags = "; ".join(
        f"{k}: {f['batches']} batches, p50 {bc.fmt_s(f['duration_p50'])}"
        + (f", ERROR {f['error']}" if f.get("error") else "")
        for k, f in row["fragments"].items()
    )
    print(
        f"    achieved {bc.fmt_rate(row['achieved'])}/s, p50 {bc.fmt_s(row['p50'])}, "
        f"p99 {bc.fmt_s(row['p99'])}, delivered {row['delivered']:.3f}, "
        f"peers {row['cores']:.2f} cores, bench {row['bench_cores']:.2f}, "
        f"machine {row['machine_cores']:.2f}; {frags}; "
        f"{'kept up' if row['kept_up'] else 'FELL BEHIND: ' + '; '.join(row['why'])}",
        flush=True,
    )


# --------------------------------------------------------------------------- traffic


async def run_traffic(
    cluster: Cluster, args: argparse.Namespace, populations: dict[float, Population]
) -> list[dict[str, Any]]:
    spread = cluster.size == 3
    cars = cluster.source_name("cars", "acme")
    trucks = cluster.source_name("trucks", PARTICIPANTS[cluster.size - 1])
    ctl = cluster.ctl["acme"]
    for schema in traffic.SCHEMAS:
        await ctl.create_schema(schema)
    await ctl.create_stream(cars, traffic.SOURCE_STREAMS["car_positions"])
    await ctl.create_stream(trucks, traffic.SOURCE_STREAMS["tow_trucks"])
    made = await ctl.create_query(traffic_query(cars, trucks, spread))
    cluster.watch(made)
    await ctl.start_query("traffic")
    hosts = {s: await cluster.host_of(s) for s in (cars, trucks, *traffic.OUTPUTS)}
    print(
        "  traffic: fragments "
        + ", ".join(f"{f['name']}@{f['site'][:8]}" for f in made["fragments"])
        + "; hosts "
        + ", ".join(f"{s} {h}" for s, h in hosts.items()),
        flush=True,
    )
    car_push = await cluster.client(hosts[cars], "bench-cars")
    truck_push = await cluster.client(hosts[trucks], "bench-trucks")
    toll_sub = await cluster.client(hosts["toll_notifications"], "bench-tolls")
    tow_sub = await cluster.client(hosts["tow_dispatch"], "bench-tows")
    clock = Clock(args.time_scale)
    car_log, truck_log, book = PushLog(), PushLog(), TollBook()
    tolls = Received()
    tows: list[tuple[np.ndarray, float]] = []  # (later push time, receive time)

    def on_tolls(recv: float, cols: dict[str, list[Any]]) -> None:
        tolls.add(car_log.index_of(np.array(cols["t"], dtype=np.int64)), recv)

    def on_tows(recv: float, cols: dict[str, list[Any]]) -> None:
        sent_car, _ = car_log.arrays()
        sent_truck, _ = truck_log.arrays()
        ci = np.maximum(car_log.index_of(np.array(cols["car_t"], dtype=np.int64)), 0)
        ti = np.maximum(truck_log.index_of(np.array(cols["truck_t"], dtype=np.int64)), 0)
        tows.append((np.maximum(sent_car[ci], sent_truck[ti]), recv))

    rows: list[dict[str, Any]] = []
    async with (
        subscribed(toll_sub, "toll_notifications", on_tolls) as toll_consumer,
        subscribed(tow_sub, "tow_dispatch", on_tows) as tow_consumer,
    ):
        consumers = [toll_consumer, tow_consumer]
        for i, rate in enumerate(args.rates):
            pop = populations[rate]
            start = (clock.now() // 60 + 1) * 60
            car_feed = Feed(pop.car_cols, SCHEMAS["car_positions"], start)
            truck_feed = Feed(pop.truck_cols, SCHEMAS["tow_trucks"], start)

            stop = asyncio.Event()
            pushers = [
                asyncio.create_task(Pacer(args.push_interval_s).run(step, stop), name=name)
                for name, step in (
                    (
                        "car pusher",
                        feed_step(clock, car_feed, car_log, car_push, cars, book.expect),
                    ),
                    (
                        "truck pusher",
                        feed_step(clock, truck_feed, truck_log, truck_push, trucks, lambda _t: 0),
                    ),
                )
            ]
            try:
                window = await measure(
                    cluster,
                    [*pushers, *consumers],
                    lambda t0, t1: analyze(car_log, tolls, t0, t1)["delivered"] >= 1.0,
                    warm_s=args.warmup if i == 0 else args.settle,
                    measure_s=args.duration,
                    tail_s=args.tail,
                    label=f"{cluster.label} traffic {bc.fmt_rate(rate)}/s",
                )
            finally:
                await stop_pushers(stop, pushers)
            stats = analyze(car_log, tolls, window.t0, window.t1)
            why = judge(stats, rate, args.traffic_max_p99)
            tow_lat = [recv - sent[(sent >= window.t0) & (sent < window.t1)] for sent, recv in tows]
            tow_all = np.concatenate(tow_lat) if tow_lat else np.zeros(0)
            row = {
                "setup": cluster.label,
                "offered": rate,
                "cars": pop.cars,
                "segments": pop.segments,
                **stats,
                "dispatch_count": len(tow_all),
                "dispatch_p50": bc.quantile(tow_all, 0.5),
                "dispatch_p99": bc.quantile(tow_all, 0.99),
                "kept_up": not why,
                "why": why,
                "cores": window.cores,
                "machine_cores": window.machine_cores,
                "bench_cores": window.bench_cores,
                "fragments": window.fragments,
                "load": bc.load_average(),
            }
            rows.append(row)
            print_point(row)
            print(
                f"    tow dispatches: {row['dispatch_count']}, p50 "
                f"{bc.fmt_s(row['dispatch_p50'])}, p99 {bc.fmt_s(row['dispatch_p99'])}",
                flush=True,
            )
            if why:
                break
    return rows


# --------------------------------------------------------------------------- report


def status_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    return "yes" if r["kept_up"] else "**no**: " + "; ".join(r["why"])


def cores_cell(r: dict[str, Any]) -> str:
    """The peers' CPU, and in brackets what the rest of the machine used besides this script
    (other people's jobs: noise)."""
    others = max(0.0, r["machine_cores"] - r["cores"] - r["bench_cores"])
    return f"{r['cores']:.2f} ({others:.2f})"


def fragments_cell(r: dict[str, Any]) -> str:
    """Micro-batch p50 duration (and count in the window) per fragment."""
    return ", ".join(
        f"{key} {bc.fmt_s(f['duration_p50'])} ({f['batches']})"
        for key, f in sorted(r["fragments"].items(), key=lambda kv: kv[0].split("@")[1])
    )


def traffic_table(rows: list[dict[str, Any]]) -> tuple[str, dict[str, float]]:
    one = {r["offered"]: r for r in rows if r["setup"] == "1 peer"}
    three = {r["offered"]: r for r in rows if r["setup"] == "3 peers"}
    body = []
    for rate in sorted(set(one) | set(three)):
        a, b = one.get(rate), three.get(rate)

        def cells(r: dict[str, Any] | None) -> list[str]:
            if r is None:
                return ["-"] * 4
            return [
                bc.fmt_rate(r["achieved"]),
                f"{bc.fmt_s(r['p50'])} / {bc.fmt_s(r['p99'])}",
                f"{bc.fmt_s(r['dispatch_p50'])} / {bc.fmt_s(r['dispatch_p99'])}",
                cores_cell(r),
            ]

        cars = (a or b or {}).get("cars", 0)
        body.append(
            [
                bc.fmt_rate(rate),
                f"{cars:,}",
                *cells(a),
                *cells(b),
                bc.fmt_ratio(b["p50"], a["p50"]) if a and b else "n/a",
                status_cell(a),
                status_cell(b),
            ]
        )
    header = [
        "offered (car positions/s)",
        "cars",
        "1 peer achieved",
        "1 peer toll p50 / p99",
        "1 peer dispatch p50 / p99",
        "1 peer cores (others)",
        "3 peers achieved",
        "3 peers toll p50 / p99",
        "3 peers dispatch p50 / p99",
        "3 peers cores (others)",
        "p50 ratio 3/1",
        "1 peer kept up",
        "3 peers kept up",
    ]

    def best(d: dict[float, dict[str, Any]]) -> float:
        return max([k for k, r in d.items() if r["kept_up"]], default=0.0)

    return bc.md_table(header, body), {"one": best(one), "three": best(three)}


def chain_table(rows: list[dict[str, Any]]) -> tuple[str, list[str]]:
    body = []
    for r in rows:
        body.append(
            [
                r["setup"],
                bc.fmt_rate(r["offered"]),
                bc.fmt_rate(r["achieved"]),
                bc.fmt_s(r["p50"]),
                bc.fmt_s(r["p99"]),
                f"{r['delivered']:.3f}",
                fragments_cell(r),
                " / ".join(bc.fmt_s(v) for _k, v in r.get("stages", [])),
                cores_cell(r),
                status_cell(r),
            ]
        )
    header = [
        "setup",
        "offered (tuples/s)",
        "achieved",
        "p50",
        "p99",
        "delivered",
        "micro-batch p50 per fragment (batches in window)",
        "stage medians (see below)",
        "cores: peers (others)",
        "kept up",
    ]
    hops = []
    one = {r["offered"]: r for r in rows if r["setup"] == "1 peer"}
    for r in rows:
        base = one.get(r["offered"])
        if r["setup"] != "3 peers" or base is None:
            continue
        per_hop = (r["p50"] - base["p50"]) / 2
        frag = next((f for k, f in base["fragments"].items() if k.endswith("@chain")), {})
        batch = frag.get("duration_p50", float("nan"))
        period = frag.get("period_s", float("nan"))
        verdict = "met" if per_hop <= batch else "**not met**"
        # a hop, measured directly: the mirror, then the next fragment's micro-batch
        stage = [v for _k, v in r.get("stages", [])]
        direct = (
            f"; measured directly, hop 1 = mirror {stage[2]:.3f} s + next fragment "
            f"{stage[3]:.3f} s, hop 2 = mirror {stage[4]:.3f} s + next fragment {stage[5]:.3f} s"
            if len(stage) == 7
            else ""
        )
        own = float(np.median([f["duration_p50"] for f in r["fragments"].values()]))
        hops.append(
            f"- {bc.fmt_rate(r['offered'])}/s: per hop ({bc.fmt_s(r['p50'])} - "
            f"{bc.fmt_s(base['p50'])}) / 2 = **{per_hop:.3f} s**{direct}; one micro-batch of "
            f"the 1-peer query: duration p50 {batch:.3f} s (one every {period:.3f} s; 1-peer "
            f"end-to-end p50 {bc.fmt_s(base['p50'])}); of a 3-peer fragment: {own:.3f} s. "
            f"Aim (a hop <= 1 micro-batch of the 1-peer query): {verdict}"
        )
    names = {r["setup"]: [k for k, _v in r["stages"]] for r in rows if r.get("stages")}
    hops += [f"- stages, {setup}: " + ", ".join(stages) for setup, stages in names.items()]
    return bc.md_table(header, body), hops


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    info = results["machine"]
    out = [
        f"Machine: {info['nproc']} cores, {info['cpu']}, {info['ram_gib']} GiB RAM, kernel "
        f"{info['kernel']}; Python {info['python']}, {info['java']}, pyspark "
        f"{info['pyspark']}, pyarrow {info['pyarrow']}; {info['date']}",
        f"Load average before: {results['load_before']}, after: {results.get('load_after')}",
        f"Command: {results['command']}",
        f"Spark: 1 peer {args.single_master}, 3 peers {args.cluster_master} each. Warm-up "
        f"{args.warmup:g} s (first rate) / {args.settle:g} s, measured {args.duration:g} s, "
        f"tail <= {args.tail:g} s, pushes every {args.push_interval_s * 1000:g} ms; traffic "
        f"event time x{args.time_scale:g}.",
    ]
    for error in results["errors"]:
        out.append(f"\n**Failed**: {error}")
    if results["chain"]:
        table, hops = chain_table(results["chain"])
        out.append(f"\n### Chain filter -> map -> filter\n\n{table}\n")
        out.extend(hops)
    if results["traffic"]:
        table, best = traffic_table(results["traffic"])
        out.append(f"\n### Traffic query\n\n{table}\n")
        out.append(
            f"Highest rate kept up with: 1 peer {bc.fmt_rate(best['one'])}/s, 3 peers "
            f"{bc.fmt_rate(best['three'])}/s"
        )
        out.append("\nMicro-batch p50 per fragment (batches in the window):\n")
        for r in results["traffic"]:
            out.append(f"- {r['setup']} {bc.fmt_rate(r['offered'])}/s: {fragments_cell(r)}")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke version (~5 min)")
    p.add_argument("--rates", help="traffic: offered car positions/s (e.g. 2k,5k,10k)")
    p.add_argument("--chain-rates", help="chain: offered tuples/s (e.g. 5k,50k)")
    p.add_argument("--skip-traffic", action="store_true")
    p.add_argument("--skip-chain", action="store_true")
    p.add_argument("--skip-single", action="store_true", help="only the 3-peer setup")
    p.add_argument("--skip-cluster", action="store_true", help="only the 1-peer setup")
    p.add_argument("--duration", type=float, help="measured seconds per point")
    p.add_argument("--warmup", type=float, help="warm-up seconds at the first rate")
    p.add_argument("--settle", type=float, help="warm-up seconds at each later rate")
    p.add_argument("--tail", type=float, default=15.0, help="at most this long for results")
    p.add_argument("--max-p99", type=float, default=3.0, help="chain: kept up only below")
    p.add_argument(
        "--traffic-max-p99",
        type=float,
        default=10.0,
        help="traffic: kept up only below (every toll notification waits for the aggregate, "
        "the map and the join in series: several micro-batches)",
    )
    p.add_argument("--push-interval-ms", type=float, default=100.0)
    p.add_argument("--time-scale", type=float, default=60.0, help="traffic event time speed-up")
    p.add_argument("--single-master", default="local[*]", help="Spark master of the lone peer")
    p.add_argument("--cluster-master", default="local[1]", help="Spark master of each of 3")
    p.add_argument(
        "--peer-args",
        default="",
        help="extra `peer join` options for every peer, e.g. --peer-args=--no-voter",
    )
    p.add_argument("--json", help="write all measurements to this file")
    p.add_argument("--work-dir", help="peer data directories (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--report-from", help="print the report of a run saved with --json, and exit")
    args = p.parse_args(argv)
    quick = args.quick
    args.rates = parse_rates(args.rates or ("1k,2k" if quick else "1k,2k,4k,8k,16k,32k"))
    args.chain_rates = parse_rates(args.chain_rates or ("5k" if quick else "5k,50k"))
    args.duration = args.duration or (10.0 if quick else 20.0)
    args.warmup = args.warmup or (20.0 if quick else 30.0)
    args.settle = args.settle or (6.0 if quick else 8.0)
    args.push_interval_s = args.push_interval_ms / 1000
    if quick:
        args.tail = min(args.tail, 10.0)
    return args


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    # SIGTERM unwinds like Ctrl-C does: every finally below runs and stops what it started
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    results: dict[str, Any] = {
        "machine": bc.machine_info(),
        "load_before": bc.load_average(),
        "busy_before": bc.busy_processes(exclude={os.getpid()}),
        "command": " ".join(["scripts/bench_cluster.py", *sys.argv[1:]]),
        "chain": [],
        "traffic": [],
        "errors": [],
    }
    print(f"machine: {results['machine']}", flush=True)
    print(f"load average {results['load_before']}; busiest: {results['busy_before']}", flush=True)
    began = time.monotonic()
    populations = {}
    if not args.skip_traffic:
        for i, rate in enumerate(args.rates):
            populations[rate] = make_population(rate, args.time_scale, seed=100 + i)
    setups = [(1, args.single_master), (3, args.cluster_master)]
    if args.skip_single:
        setups = setups[1:]
    if args.skip_cluster:
        setups = setups[:1]
    for size, master in setups:
        cluster = Cluster(work / f"peers{size}", size, master, tuple(args.peer_args.split()))
        print(f"{cluster.label} (load average {bc.load_average()})", flush=True)
        try:
            await cluster.start()
            if not args.skip_chain:
                results["chain"] += await run_chain(cluster, args)
            if not args.skip_traffic:
                results["traffic"] += await run_traffic(cluster, args, populations)
        except Exception as exc:
            # one setup failing must not lose the other's measurements
            traceback.print_exc()
            print(f"{cluster.label} FAILED: {type(exc).__name__}: {exc}", flush=True)
            results["errors"].append(f"{cluster.label}: {type(exc).__name__}: {exc}")
        finally:
            await cluster.close()
        print(f"{cluster.label} done after {time.monotonic() - began:.0f} s", flush=True)
    results["load_after"] = bc.load_average()
    results["busy_after"] = bc.busy_processes(exclude={os.getpid()})
    results["elapsed_s"] = time.monotonic() - began
    return results


def _unjson(obj: Any) -> Any:
    if obj == "inf":
        return float("inf")
    if obj is None:
        return float("nan")
    if isinstance(obj, dict):
        return {k: _unjson(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unjson(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_from:
        saved = _unjson(json.loads(Path(args.report_from).read_text()))
        # the run's own settings, for the report's header
        saved_args = parse_args(saved["command"].split()[1:])
        print(report(saved, saved_args))
        return 0
    work = (
        Path(args.work_dir)
        if args.work_dir
        else Path(tempfile.mkdtemp(prefix="fedstream-bench-cluster-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory {work}", flush=True)
    try:
        results = asyncio.run(main_async(args, work))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"interrupted; logs in {work}", flush=True)
        return 130
    finally:
        for peer in STARTED:  # after Ctrl-C, SIGTERM or a crash: nothing of ours stays behind
            stop_peer(peer)
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
