#!/usr/bin/env python3
"""A participant growing with its load (issue 28): a load ramp against a fixed one-peer
participant and an elastic one (``peer join --elastic 1:3``), in one run.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_elastic.py                      # ~15 min
    .venv/bin/python scripts/bench_elastic.py --ramp 4000,12000 --step-s 30 --cool-s 60
    .venv/bin/python scripts/bench_elastic.py --json run.json

What runs
---------
Each of the two runs starts one ``peer join`` of participant acme on loopback, offering half a
core (``--capacity 0.5``) with its own Spark (``local[1]``), gossip every 0.3 s, running three
keyed 10 s windows (``peer.examples.keyed_window``, filters ``v >= 0, 5, 10``) over one stream,
each in its own streaming query (``--no-lane``), the stream at one copy (``--replicas 1``). The
elastic run adds ``--elastic 1:3 --elastic-interval 5``: its burst leader starts peers with the
local provisioner and its balancer moves fragments to them.

The ramp offers ``--ramp`` rows/s, each for ``--step-s`` seconds: batches of ``rate / 5`` rows
five times a second, one in flight, each advancing event time by 1 s. Then ``--cool-s``
seconds with no pushes (the elastic run shrinks), then one batch that closes every window.

Measured, per run: rows acknowledged; the backlog (the rows waiting in the participant's
queries' inputs, the sum of its peers' gossiped ``lag``, sampled every second) at its peak;
each result window of the first query from the acknowledgement of the batch that closed it
to its arrival at a subscriber (p50, p99, during the ramp); the CPU-seconds of every process
of the participant (its peers and their JVMs, launched peers included); and, for the elastic
run, the burst leader's decisions: the seconds from the ramp's start to the plan's largest
size and to every launched peer of it being live, how many changes of size, the move pauses
of the fragments it moved out (the move protocol's pause, under this load). At the end each
result stream is compared with plain Python.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

from peer.client import Client
from peer.demo.elastic import kill_launched, launched_pids
from peer.errors import FedstreamError
from peer.examples.keyed_window import keyed_window_query, keyed_window_schema, keyed_window_sums
from peer.testing.cluster import LocalFederation, collect, make_participants, participant_args

SOURCE = "bench_ramp"
QUERIES = 3
BATCHES_PER_S = 5
FAST = ("--gossip-interval", "0.3", "--suspect-after", "3", "--dead-after", "8")


class Ramp:
    """Batches at the offered rate, one in flight; when each was acknowledged."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.rng = random.Random(28)
        self.batches: list[dict[str, list[int]]] = []
        self.closes: list[tuple[int, float]] = []  # (the batch's last t, acknowledged at)
        self.t = 0
        self.rate = 0.0
        self.stopped = False

    def batch(self, rows: int) -> dict[str, list[int]]:
        rng, t = self.rng, self.t
        self.t += 1
        return {
            "k": [rng.randrange(8) for _ in range(rows)],
            "v": [rng.randrange(-10, 50) for _ in range(rows)],
            "t": [t] * rows,
        }

    async def send(self, client: Client, batch: dict[str, list[int]]) -> None:
        for _ in range(600):
            try:
                await client.push(
                    SOURCE, {"columns": batch}, producer="ramp", seq=len(self.batches)
                )
                break
            except (FedstreamError, TimeoutError, OSError) as exc:
                if isinstance(exc, FedstreamError) and not exc.retriable:
                    raise
                await asyncio.sleep(0.2)
        else:
            raise RuntimeError(f"batch {len(self.batches)} was never acknowledged")
        self.batches.append(batch)
        self.closes.append((max(batch["t"]), time.monotonic()))

    async def run(self) -> None:
        async with Client("127.0.0.1", self.port, timeout_s=120) as client:
            began, sent = time.monotonic(), 0
            while not self.stopped:
                if self.rate <= 0:
                    await asyncio.sleep(0.2)
                    began, sent = time.monotonic(), 0
                    continue
                due = began + sent / BATCHES_PER_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await self.send(client, self.batch(max(1, int(self.rate / BATCHES_PER_S))))
                sent += 1

    def pace(self, rate: float) -> None:
        self.rate = rate

    def closed_at(self, end: int) -> float | None:
        at = bisect.bisect_left(self.closes, (end, -1.0))
        return self.closes[at][1] if at < len(self.closes) else None


class Watch:
    """When each window of ``ramp_out0`` first arrived."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: dict[tuple[int, int], float] = {}
        self.stopped = False

    async def run(self) -> None:
        while not self.stopped:
            try:
                async with Client("127.0.0.1", self.port, timeout_s=30) as c:
                    async for batch in c.subscribe("ramp_out0", "earliest"):
                        now = time.monotonic()
                        for row in batch.rows():
                            self.seen.setdefault((row["window_start"], row["k"]), now)
                        if self.stopped:
                            return
            except (FedstreamError, TimeoutError, OSError):
                await asyncio.sleep(0.2)


async def status(port: int) -> dict[str, Any]:
    async with Client("127.0.0.1", port, timeout_s=30) as c:
        return (await c.status()).to_wire()


async def one_run(elastic: bool, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    keys = make_participants(work, ["acme"])
    extra = ["--elastic", "1:3", "--elastic-interval", "5"] if elastic else []
    peer_args = [
        *participant_args("acme", keys["acme"], work / "trust"),
        *extra,
        "--capacity", "0.5",
        "--bpm-period", "2",
        "--spark-master", "local[1]",
        "--http", "off",
        "--no-lane",
        "--replicas", "1",
        *FAST,
    ]  # fmt: skip
    fed = LocalFederation(work, {"acme1": peer_args})
    fed.start(timeout_s=240)
    try:
        return await measure(fed, elastic, args, work)
    finally:
        fed.stop(60)
        kill_launched(work)


def participant_cpu(fed: LocalFederation, work: Path) -> float:
    roots = [p.proc.pid for p in fed.procs.values() if p.proc is not None]
    roots += list(launched_pids(work).values())
    return sum(bc.tree_cpu_seconds(r) for r in roots)


async def measure(
    fed: LocalFederation, elastic: bool, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    port = fed.procs["acme1"].port
    async with Client("127.0.0.1", port, timeout_s=120) as cl:
        await cl.create_schema(keyed_window_schema("tick"))
        await cl.create_stream(SOURCE, "tick")
        for i in range(QUERIES):
            q = keyed_window_query(f"ramp{i}", SOURCE, f"ramp_out{i}", at_least=5 * i)
            await cl.create_query(q)
            await cl.start_query(q["name"])
    ramp, watch = Ramp(port), Watch(port)
    tasks = [asyncio.create_task(ramp.run()), asyncio.create_task(watch.run())]
    backlog: list[tuple[float, float]] = []  # (seconds since the ramp began, rows)
    cpu: dict[str, float] = {}  # pid -> its tree's CPU-seconds, the most seen (a gone
    # launched peer keeps what it was last seen using)
    began = time.monotonic()

    async def sample() -> None:
        while True:
            with contextlib.suppress(Exception):
                members = ((await status(port)).get("overlay") or {}).get("members", [])
                lag = sum(float((m.get("load") or {}).get("lag", 0)) for m in members)
                backlog.append((time.monotonic() - began, lag))
            roots = [p.proc.pid for p in fed.procs.values() if p.proc is not None]
            for root in roots + list(launched_pids(work).values()):
                with contextlib.suppress(Exception):
                    cpu[str(root)] = max(cpu.get(str(root), 0.0), bc.tree_cpu_seconds(root))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    try:
        for rate in args.ramp:
            ramp.pace(rate)
            print(f"  {'elastic' if elastic else 'fixed'}: {rate:,} rows/s offered", flush=True)
            await asyncio.sleep(args.step_s)
        ramp_ended = time.monotonic() - began
        ramp.pace(0)
        await asyncio.sleep(args.cool_s)
        ramp.stopped = True
        await asyncio.wait_for(tasks[0], 120)
        async with Client("127.0.0.1", port, timeout_s=120) as c:
            await ramp.send(c, {"k": [0], "v": [49], "t": [ramp.t + 100]})
        final = await status(port)
    finally:
        sampler.cancel()
        watch.stopped = True
        for task in (sampler, *tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    exact = {}
    async with Client("127.0.0.1", port, timeout_s=120) as c:
        for i in range(QUERIES):
            want = keyed_window_sums(ramp.batches, at_least=5 * i)
            rows = await collect(c, f"ramp_out{i}", sum(want.values()), timeout_s=300, settle_s=3)
            got = Counter(
                (r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows
            )
            exact[f"ramp{i}"] = got == want
    lat = []
    for (start, _k), at in watch.seen.items():
        closed = ramp.closed_at(start + 10)
        if closed is not None and closed - began <= ramp_ended:
            lat.append(at - closed)
    latency = np.array(lat)
    result: dict[str, Any] = {
        "mode": "elastic" if elastic else "fixed",
        "rows": sum(len(b["t"]) for b in ramp.batches),
        "ramp_s": ramp_ended,
        "peak_backlog_rows": max((b for _t, b in backlog), default=0.0),
        "latency_p50_s": bc.quantile(latency, 0.5),
        "latency_p99_s": bc.quantile(latency, 0.99),
        "windows": len(lat),
        "cpu_s": sum(cpu.values()),
        "exact": exact,
    }
    if elastic:
        el = final.get("elastic") or {}
        decisions = el.get("decisions") or []
        changes = [d for d in decisions if d["action"] in ("grow", "shrink")]
        grows = [d for d in changes if d["action"] == "grow"]
        t0 = time.time() - (time.monotonic() - began)  # the ramp's start, wall clock
        top = max((d["size"] for d in grows), default=1)
        first_top = next((d for d in grows if d["size"] == top), None)
        ledger = (final.get("brain") or {}).get("ledger", [])
        moves = [e for e in ledger if e.get("direction") == "out" and e.get("ok")]
        result.update(
            {
                "decisions": decisions,
                "changes": len(changes),
                "changes_in_ramp": sum(1 for d in changes if d["t"] - t0 <= ramp_ended),
                "largest": top,
                "to_largest_s": None if first_top is None else first_top["t"] - t0,
                "move_pauses_s": [e.get("pause_s") for e in moves],
            }
        )
    print(f"  {json.dumps({k: v for k, v in result.items() if k != 'decisions'}, default=str)}")
    return result


def report(results: dict[str, Any]) -> str:
    runs = {r["mode"]: r for r in results["runs"]}
    fixed, elastic = runs.get("fixed"), runs.get("elastic")
    rows = []
    for label, key, fmt in (
        ("rows pushed in the ramp", "rows", lambda v: f"{v:,}"),
        ("peak backlog, rows", "peak_backlog_rows", lambda v: f"{v:,.0f}"),
        ("window latency p50", "latency_p50_s", bc.fmt_s),
        ("window latency p99", "latency_p99_s", bc.fmt_s),
        ("CPU-seconds, all its processes", "cpu_s", lambda v: f"{v:,.0f}"),
        ("outputs equal plain Python", "exact", lambda v: "yes" if all(v.values()) else "NO"),
    ):
        rows.append([label] + [("-" if r is None else fmt(r[key])) for r in (fixed, elastic)])
    lines = [*bc.header(results), "", bc.md_table(["", "fixed, one peer", "elastic 1:3"], rows)]
    if elastic is not None:
        lines += [
            "",
            f"- seconds from the ramp's start to the largest size ({elastic['largest']} peers): "
            f"{bc.fmt_s(elastic['to_largest_s'])}",
            f"- changes of size: {elastic['changes']} "
            f"({elastic['changes_in_ramp']} during the ramp)",
            f"- move pauses under the ramp: {elastic['move_pauses_s']}",
            "- decisions: "
            + "; ".join(
                f"{d['action']} {d['current']}->{d['size']} ({d['reason']})"
                for d in elastic["decisions"]
            ),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ramp", default="4000,8000,16000,24000", help="rows/s per step")
    p.add_argument("--step-s", type=float, default=60.0)
    p.add_argument("--cool-s", type=float, default=120.0)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    args.ramp = [float(r) for r in args.ramp.split(",")]
    results = bc.new_results("bench_elastic.py")
    results["args"] = {"ramp": args.ramp, "step_s": args.step_s, "cool_s": args.cool_s}
    results["runs"] = []
    started = time.monotonic()
    for elastic in (False, True):
        with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
            results["runs"].append(asyncio.run(one_run(elastic, args, Path(tmp))))
    results["load_after"] = bc.load_average()
    results["elapsed_s"] = time.monotonic() - started
    text = report(results)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(bc.jsonable(results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
