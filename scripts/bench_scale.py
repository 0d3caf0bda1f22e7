#!/usr/bin/env python3
"""A peer whose engine is a Spark cluster (issue 25): does the rate grow with the Workers?

Usage (from the repository root, as root: the cluster needs network namespaces)::

    .venv/bin/python scripts/bench_scale.py            # full run, ~15 min on 2 cores
    .venv/bin/python scripts/bench_scale.py --quick    # smoke run, ~10 min
    .venv/bin/python scripts/bench_scale.py --rate 80000 --setups cluster1,cluster2  # saturated

What runs
---------
One query on one ``peer join`` process (``peer.testing.PeerProcess``, its own JVM), in turn on
five engines:

- ``local[2] before``: the peer's code before issue 25 (``--before``, exported with
  ``git archive`` into the work directory and put first on the peer's ``PYTHONPATH``), Spark
  ``local[2]``: single-host speed before the change;
- ``local[2]``: this tree, the same engine: single-host speed after it;
- ``local[1]``: this tree, one core;
- ``cluster 1x1``: a standalone Master and one Worker of one core
  (``peer.testing.sparkcluster``: the Worker on a host of its own, a network namespace, that
  does not see the peer's data directory; the executors fetch the input from the peer);
- ``cluster 2x1``: the same with two Workers of one core each.

The query (``--query``) is CPU-bound in the executors on purpose. Its input tuples are ``(k
int, v long, sent double, pad string)`` with a 48-byte ``pad``, ``v`` counting up from 0. Each
is decoded by the ``fedspool`` source in an executor's Python worker (Arrow IPC, fetched from
the peer on a cluster), converted to Spark rows and tested there, and about one in a hundred
passes, so the driver's ``foreachBatch`` collects 1 % of the rows: the executors' work grows
with the input, the driver's stays small.

- ``heavy`` (the default): three filter boxes in a row, each over a sum of 135 square roots
  (``floor((sqrt(v+1)+...+sqrt(v+15))+...) >= 0`` twice, offsets 1..135 and 1001..1135, then
  the same with offsets 2001..2135 and ``% 100 = 0``): about 23 µs of Spark CPU per tuple on
  this machine's cores, on top of the decoding, so an executor's cost per tuple is above the
  peer's own (ingest, planning, the 1 % it collects) and more Workers can pay off. Each box
  stays under the expression limits (1,024 tokens, docs/security.md), hence three. Which
  tuples pass is computed with numpy in the same order of additions (IEEE, so exactly).
- ``light``: one filter ``(v * 7919) % 100 = 0``; the executors' cost per tuple (decoding, a
  multiplication) is under half the peer's, so the peer's host saturates first.

A client in this process pushes ``--rate`` tuples per second in batches every 0.1 s (``sent`` =
the wall clock at the push) and subscribes to the result. After ``--warmup-s`` it measures for
``--seconds``: the processed rate (result rows received in the window, times 100, per second:
below the offered rate, the engine is saturated and this is its capacity), p50 of result time
minus ``sent`` over those rows, the CPU each process used (the peer's Python, the driver JVM and
its local Python workers; on a cluster, each Worker host's tree: Worker and executor JVMs and
their Python workers) and, on a cluster, the bytes the Worker hosts received (their veth's
``rx_bytes``: the spool files fetched from the peer plus Spark's own traffic to them, an upper
bound on the fetched bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from peer.client import Client
from peer.errors import FedstreamError
from peer.testing import PeerProcess, make_participants, participant_args
from peer.testing.sparkcluster import SparkCluster, missing

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {
    "name": "scale_ev",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "sent", "type": "double"},
        {"name": "pad", "type": "string"},
    ],
}
PREDICATE = "(v * 7919) % 100 = 0"
PAD = "x" * 48
PIECE_S = 0.1
# The commit before the first of issue 25's work was merged (e2bcba9 "Merge h25net").
BEFORE = "e2bcba9^1"


HEAVY_TERMS, HEAVY_GROUP, HEAVY_BOXES = 135, 15, 3


def heavy_expression(box: int) -> str:
    """Box ``box``'s predicate: a sum of square roots, grouped so that the tree stays shallow."""
    base = 1000 * box
    groups = []
    for g in range(1, HEAVY_TERMS + 1, HEAVY_GROUP):
        terms = range(base + g, base + min(g + HEAVY_GROUP, HEAVY_TERMS + 1))
        groups.append("(" + "+".join(f"sqrt(v+{i})" for i in terms) + ")")
    test = "% 100 = 0" if box == HEAVY_BOXES - 1 else ">= 0"
    return f"floor({'+'.join(groups)}) {test}"


def heavy_floor(v: np.ndarray, box: int) -> np.ndarray:
    """``floor(...)`` of :func:`heavy_expression` in numpy, adding in Spark's order."""
    base = 1000 * box
    total: np.ndarray | None = None
    for g in range(1, HEAVY_TERMS + 1, HEAVY_GROUP):
        acc: np.ndarray | None = None
        for i in range(g, min(g + HEAVY_GROUP, HEAVY_TERMS + 1)):
            x = np.sqrt((v + (base + i)).astype(np.float64))
            acc = x if acc is None else acc + x
        assert acc is not None
        total = acc if total is None else total + acc
    assert total is not None
    return np.floor(total).astype(np.int64)


def query(kind: str) -> dict[str, Any]:
    if kind == "light":
        predicates = [PREDICATE]
    else:
        predicates = [heavy_expression(b) for b in range(HEAVY_BOXES)]
    streams = ["scale_in", *(f"scale_h{b}" for b in range(len(predicates) - 1)), "scale_out"]
    boxes = [
        {
            "name": f"pick{b}",
            "type": "filter",
            "inputs": [streams[b]],
            "outputs": [streams[b + 1]],
            "params": {"expression.0": predicate},
        }
        for b, predicate in enumerate(predicates)
    ]
    return {"name": "scale", "boxes": boxes}


def piece(first: int, n: int) -> pa.Table:
    v = np.arange(first, first + n, dtype=np.int64)
    return pa.table(
        {
            "k": pa.array((v % 7).astype(np.int32)),
            "v": pa.array(v),
            "sent": pa.array(np.full(n, time.time())),
            "pad": pa.array([PAD] * n),
        }
    )


def passes(first: int, n: int, kind: str) -> int:
    """How many of the tuples ``v = first .. first + n - 1`` the query lets through."""
    v = np.arange(first, first + n, dtype=np.int64)
    if kind == "light":
        return int(np.count_nonzero((v * 7919) % 100 == 0))
    keep = np.ones(n, dtype=bool)
    for b in range(HEAVY_BOXES):
        floor = heavy_floor(v, b)
        keep &= floor % 100 == 0 if b == HEAVY_BOXES - 1 else floor >= 0
    return int(np.count_nonzero(keep))


class Setup:
    """One engine to measure: its name, its ``peer join`` options, where it listens."""

    def __init__(
        self,
        name: str,
        options: list[str],
        host: str = "127.0.0.1",
        pythonpath: Path | None = None,
        cluster: SparkCluster | None = None,
    ) -> None:
        self.name = name
        self.options = options
        self.host = host
        self.pythonpath = pythonpath
        self.cluster = cluster


def rx_bytes(cluster: SparkCluster) -> int:
    total = 0
    for h in cluster.hosts:
        done = cluster.run_on(h.index, "cat", f"/sys/class/net/{h.veth_there}/statistics/rx_bytes")
        total += int(done.stdout.strip() or 0)
    return total


async def measure(setup: Setup, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    data = work / setup.name.replace(" ", "-").replace("[", "").replace("]", "")
    extra = [*setup.options, "--http", "off"]
    client_args: dict[str, Any] = {}
    if setup.host != "127.0.0.1":  # an API off loopback takes trusted TLS clients only
        key = make_participants(work / f"{data.name}-keys", ["acme"])["acme"]
        trust = work / f"{data.name}-keys" / "trust"
        extra = [*participant_args("acme", key, trust), *extra]
        client_args = {"participant": "acme", "key_path": key, "trust_dir": trust}
    saved = os.environ.get("PYTHONPATH")
    if setup.pythonpath is not None:
        os.environ["PYTHONPATH"] = str(setup.pythonpath)
    peer = PeerProcess(data, *extra, log_path=work / f"{data.name}.log", host=setup.host)
    try:
        peer.launch()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    print(f"[{setup.name}] starting the peer", flush=True)
    peer.wait_ready(600)
    try:
        return await drive(setup, peer, client_args, args)
    finally:
        peer.stop()


async def drive(
    setup: Setup, peer: PeerProcess, client_args: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    per_piece = max(1, int(args.rate * PIECE_S))
    results: list[tuple[float, float]] = []  # (sent, received)
    resubscribed: list[str] = []  # why the subscription was opened again
    async with Client(setup.host, peer.port, timeout_s=120, **client_args) as c:
        await c.create_schema(SCHEMA)
        await c.create_stream("scale_in", "scale_ev")
        await c.create_query(query(args.query))
        await c.start_query("scale")

        seen: set[int] = set()  # the v of each result received

        async def subscribe() -> None:
            # a subscription the peer drops (on a machine this busy this process may read
            # too slowly) is opened again from the start; results already seen are skipped
            while True:
                try:
                    async with Client(setup.host, peer.port, timeout_s=120, **client_args) as sub:
                        async for batch in sub.subscribe("scale_out", start="earliest"):
                            now = time.time()
                            for r in batch.rows():
                                if r["v"] not in seen:
                                    seen.add(r["v"])
                                    results.append((r["sent"], now))
                except (FedstreamError, OSError) as exc:
                    resubscribed.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)

        pushed = 0
        acked_in_window = 0
        meters: dict[str, bc.CpuMeter] = {}
        window: tuple[float, float] = (0.0, 0.0)
        rx0 = 0
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(subscribe())
            start = time.monotonic()
            begin = start + args.warmup_s
            end = begin + args.seconds
            tick = start
            while time.monotonic() < end:
                if not meters and time.monotonic() >= begin:
                    window = (time.time(), 0.0)
                    assert peer.proc is not None
                    meters = {"peer": bc.CpuMeter(peer.proc.pid).start()}
                    if setup.cluster is not None:
                        for h in setup.cluster.hosts:
                            if h.proc is not None:
                                meters[f"worker{h.index}"] = bc.CpuMeter(h.proc.pid).start()
                        rx0 = rx_bytes(setup.cluster)
                await c.push("scale_in", piece(pushed, per_piece))
                if meters:
                    acked_in_window += per_piece
                pushed += per_piece
                tick += PIECE_S
                await asyncio.sleep(max(0.0, tick - time.monotonic()))
            window = (window[0], time.time())
            cpu = {name: m.stop() for name, m in meters.items()}
            breakdown = {name: dict(m.breakdown) for name, m in meters.items()}
            rx = rx_bytes(setup.cluster) - rx0 if setup.cluster is not None else None
            # the window's results may still come: wait for them (bounded)
            want = passes(0, pushed, args.query)
            deadline = time.monotonic() + args.drain_s
            while len(results) < want and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            reader.cancel()
    seconds = window[1] - window[0]
    in_window = [(s, r) for s, r in results if window[0] <= r < window[1]]
    latencies = np.array([r - s for s, r in in_window])
    return {
        "setup": setup.name,
        "offered_rate": args.rate,
        "acked_rate": acked_in_window / seconds,
        # the results in the window, times the input tuples per result
        "processed_rate": len(in_window) * pushed / max(1, want) / seconds,
        "p50_s": bc.quantile(latencies, 0.5) if len(latencies) else None,
        "results": len(results),
        "expected_results": want,
        "cores": {name: round(total, 3) for name, (total, _) in cpu.items()},
        "breakdown": breakdown,
        "machine_busy_cores": max((busy for _, busy in cpu.values()), default=None),
        "worker_rx_bytes": rx,
        "resubscribed": resubscribed,
        "seconds": seconds,
    }


def export_before(rev: str, work: Path) -> Path:
    """The tree at ``rev`` (its Python packages), exported into ``work``."""
    target = work / "before"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "peer", "overlay", "contracts"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results = bc.new_results("bench_scale.py")
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    wanted = set(args.setups.split(","))
    setups = []
    if "before" in wanted:
        before = export_before(args.before, work)
        setups.append(Setup("local[2] before", ["--spark-master", "local[2]"], pythonpath=before))
    if "local2" in wanted:
        setups.append(Setup("local[2]", ["--spark-master", "local[2]"]))
    if "local1" in wanted:
        setups.append(Setup("local[1]", ["--spark-master", "local[1]"]))
    for setup in setups:
        try:
            runs.append(await measure(setup, work, args))
        except Exception as exc:  # a failed setup is reported, the others still run
            results["errors"].append(f"{setup.name}: {exc!r}")
    why = missing()
    clusters = [
        (n, w) for n, w in (("cluster 1x1", 1), ("cluster 2x1", 2)) if f"cluster{w}" in wanted
    ]
    if clusters and why is not None:
        results["errors"].append(f"cluster setups skipped: {why}")
    elif clusters:
        shared = work / "shared-checkpoints"
        shared.mkdir(exist_ok=True)
        with SparkCluster(shared=shared, hidden=[work], workers=2, cores=1) as cluster:
            cluster.kill_worker(1)  # one Worker of one core first
            options = [
                "--spark-master", cluster.master_url,
                "--checkpoint-dir", f"file://{shared}",
                "--spark-conf", "spark.executor.memory=512m",
            ]  # fmt: skip
            for name, workers in clusters:
                if workers == 2:
                    cluster.start_worker(1)
                setup = Setup(name, options, host=cluster.driver_host, cluster=cluster)
                try:
                    runs.append(await measure(setup, work, args))
                except Exception as exc:
                    results["errors"].append(f"{name}: {exc!r}")
    results["runs"] = runs
    results["load_after"] = bc.load_average()
    results["elapsed_s"] = time.monotonic() - started
    return results


def report(results: dict[str, Any]) -> str:
    lines = bc.header(results)
    rows = []
    by_name = {r["setup"]: r for r in results.get("runs", [])}
    for r in results.get("runs", []):
        cores = r["cores"]
        peer = r["breakdown"].get("peer", {})
        executors = sum(v for k, v in cores.items() if k.startswith("worker"))
        rx = r["worker_rx_bytes"]
        rows.append(
            [
                r["setup"],
                bc.fmt_rate(r["offered_rate"]),
                bc.fmt_rate(r["acked_rate"]),
                bc.fmt_rate(r["processed_rate"]),
                bc.fmt_s(r["p50_s"]),
                f"{peer.get('driver', 0):.2f}",
                f"{peer.get('jvm', 0):.2f}",
                f"{peer.get('workers', 0):.2f}",
                f"{executors:.2f}" if executors else "-",
                "-" if rx is None else f"{rx / r['seconds'] / 1e6:.2f} MB/s",
                f"{r['results']}/{r['expected_results']}",
            ]
        )
    header = [
        "engine", "offered /s", "pushes acked /s", "processed /s", "p50", "peer Python cores",
        "driver JVM cores", "local Python workers cores", "Worker hosts cores",
        "Worker hosts rx", "results",
    ]  # fmt: skip
    lines.append(bc.md_table(header, rows))
    one, two = by_name.get("cluster 1x1"), by_name.get("cluster 2x1")
    if one and two:
        lines.append("")
        lines.append(
            "two Workers / one Worker, processed rate: "
            + bc.fmt_ratio(two["processed_rate"], one["processed_rate"])
        )
        lines += projection(one)
    before, after = by_name.get("local[2] before"), by_name.get("local[2]")
    if before and after:
        lines.append(
            "local[2] after / before, processed rate: "
            + bc.fmt_ratio(after["processed_rate"], before["processed_rate"])
        )
    for r in results.get("runs", []):
        if r.get("resubscribed"):
            lines.append(
                f"{r['setup']}: the result subscription was opened again "
                f"{len(r['resubscribed'])} times (first: {r['resubscribed'][0]})"
            )
    for error in results["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def projection(one: dict[str, Any]) -> list[str]:
    """On paper, from the one-Worker run's per-tuple costs: the rate with N Workers, and
    where the peer's own work (ingest, planning, fetch serving, the 1 % it collects) stops it."""
    rate = one["processed_rate"]
    executors = sum(v for k, v in one["cores"].items() if k.startswith("worker"))
    peer = one["cores"].get("peer", 0.0)
    if not rate or not executors or not peer:
        return ["(no projection: a figure of the one-Worker run is missing)"]
    per_exec = executors / rate  # executor core-seconds per tuple
    per_peer = peer / rate  # the peer's (Python + driver JVM) core-seconds per tuple
    limit = 1.0 / per_peer  # the peer's tree (one Python process, one driver JVM) at one core
    lines = [
        f"per tuple: {per_exec * 1e6:.1f} µs of executor CPU, {per_peer * 1e6:.1f} µs of the "
        f"peer's (Python, driver JVM); the peer's tree at 1 core caps the rate near "
        f"{bc.fmt_rate(limit)}",
    ]
    for n in (1, 2, 4, 8, 16):
        lines.append(
            f"N={n}: {bc.fmt_rate(min(n / per_exec, limit))} "
            f"({'executors' if n / per_exec < limit else 'the peer'} the limit)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: shorter windows")
    parser.add_argument("--rate", type=int, default=None, help="offered tuples per second")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds")
    parser.add_argument("--warmup-s", type=float, default=None)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument(
        "--query", choices=("heavy", "light"), default="heavy", help="which query (docstring)"
    )
    parser.add_argument("--before", default=BEFORE, help="the commit measured as 'before'")
    parser.add_argument(
        "--setups",
        default="before,local2,local1,cluster1,cluster2",
        help="which engines, comma-separated (default: all five)",
    )
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.rate = args.rate or (20_000 if args.quick else 40_000)
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    args.warmup_s = args.warmup_s or (20.0 if args.quick else 60.0)
    bc.run_in(args, "bench-scale-", main_async, report)


if __name__ == "__main__":
    main()
