#!/usr/bin/env python3
"""High availability of a running query (issue 11): kill -9 of a windowed aggregate's peer
-> its next result, beside kill -9 -> the next acknowledged push, in the same run.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_ha_query.py              # 10 kills; ~10 min
    .venv/bin/python scripts/bench_ha_query.py --standby    # the same with a warm standby
    .venv/bin/python scripts/bench_ha_query.py --kills 2    # a quick look
    .venv/bin/python scripts/bench_ha_query.py --json run.json
    .venv/bin/python scripts/bench_ha_query.py --kills 0 --rates 5000,20000,80000  # rates only

What runs
---------
Five ``peer join`` processes on loopback (``peer.testing.cluster.LocalFederation``), gossip every
0.3 s: three with Spark, the control plane's voters, and two without an engine, so that a
stream's three replicas are the three engine peers. A stream with three replicas feeds the
keyed 10 s tumbling window of ``peer.examples.keyed_window`` (a filter, then sum and count per
key); the query runs on the stream's primary, its result and checkpoint streams replicated
with the stream and anchored to it.

One pusher sends 100-row batches continuously, one in flight, each through a random live peer,
retrying a refused or timed-out push with the same (producer, seq) on another; each batch
advances event time by 10 s, so each closes a window per key. A watcher subscribes to the
result stream through a random live peer (re-subscribing after an error) and notes when each
window first arrives.

Each kill takes the stream's primary, which runs the aggregate (its process group: its JVM
too). Measured from the kill: the first acknowledged push *sent* after it (the reference: the
stream's failover alone) and the first result window not seen before it (the stream's
failover, the result stream's and checkpoint stream's following it, the new primary unpacking
the checkpoint and starting the streaming query, and a micro-batch). The killed peer is
restarted and the next kill waits until every stream is in sync on three replicas again.
At the end the result stream must equal plain Python over the pushed batches.

Before the kills, ``--rates`` (rows/s, rising) measures the aggregate's sustained rate: for each
rate the pusher sends ``rate / 10``-row batches ten times a second (still one in flight, so
event time stays in order; each batch advances it by 1 s, so a window per key closes each
second), for ``--step-s`` seconds, the last two thirds measured: the rows acknowledged per
second, the rows the result windows that first arrived then count per second (the aggregate's
processed rate), and each such window's latency (from the acknowledgement of the batch that
closed it to its arrival). A rate is kept up with when at least 95 % of it is acknowledged,
the windows count at least 90 % of what was acknowledged and their p90 latency is under 3 s;
the steps stop at the first rate that is not. The CPU of each engine peer's process group is
sampled over each measured part.

With ``--standby`` the query asks for a warm standby (peer.replication.standby): each kill
then waits, besides, until a standby runs, and the failover promotes it instead of starting
the query from its checkpoint record. Before the first kill, the CPU (cores, over 10 s) and
resident memory of each engine peer's process group (its JVM included) are sampled: the
primary, the standby (or a follower) and the other follower.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc
import bench_ha as ha

from peer.client import Client
from peer.errors import FedstreamError
from peer.testing import (
    keyed_window_query,
    keyed_window_sums,
    wait_until,
)

STREAM, OUT = "haq_ticks", "haq_out"
QUERY = keyed_window_query("haq", STREAM, OUT, kept="haq_kept")
USAGE_S = 10.0  # the window the engine peers' CPU is sampled over
SCHEMA = {
    "name": "haq_tick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}
ROWS, KEYS = 100, 5
BATCHES_PER_S = 10  # in the rate steps
KEPT_UP = (0.95, 0.90, 3.0)  # acked / offered, counted / acked, p90 latency (s)


def make_batch(seq: int, rows: int = ROWS, t0: int | None = None, advance: int = 10) -> pa.Table:
    """Batch ``seq``: ``rows`` tuples, keys in turn, seeded values, event time rising from
    ``t0`` (``seq * 10``) by ``advance`` seconds over the batch."""
    first = seq * 10 if t0 is None else t0
    at = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "k": pa.array(at % KEYS, pa.int32()),
            "v": pa.array(np.random.default_rng(seq).integers(0, 100, rows), pa.int64()),
            "t": pa.array(first + at * advance // rows, pa.int64()),
        }
    )


def as_columns(table: pa.Table) -> dict[str, list[int]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


class EnginePeers(ha.Peers):
    """bench_ha's five peers, the three voters with Spark."""

    def __init__(self, work: Path) -> None:
        super().__init__(work, voters=3, engines=ha.NAMES[:3])

    def start(self) -> None:
        self.fed.start(timeout_s=300)


class Pusher:
    """Numbered batches, one in flight, through random live peers; (sent, acked) times.

    By default a 100-row batch advancing event time by 10 s, then 0.1 s of pause, each over
    a new connection; :meth:`pace` switches to a rate (over kept connections)."""

    def __init__(self, peers: EnginePeers) -> None:
        self.peers = peers
        self.excluded: set[str] = set()
        self.acks: list[tuple[float, float]] = []
        self.log: list[tuple[int, int, int]] = []  # per batch pushed: rows, t0, advance
        self.closes: list[tuple[int, float]] = []  # per batch pushed: its last t, acked at
        self.acked_rows = 0
        self.pushed = 0
        self.refusals = 0
        self.stopped = False
        self.rng = random.Random(5)
        self.t = 0  # the next batch's first event time
        self.rate: float | None = None
        self.rows = ROWS
        self.paced_from = 0.0
        self.paced = 0
        self.connections = ha.Connections()  # kept while a rate is paced

    def pace(self, rate: float | None) -> None:
        """Offer ``rate`` rows/s from now (``None``: back to the default)."""
        self.rate = rate
        self.rows = ROWS if rate is None else max(1, int(rate / BATCHES_PER_S))
        self.paced_from, self.paced = time.monotonic(), 0

    async def _push(self, port: int, batch: pa.Table) -> None:
        if self.rate is None:
            async with Client("127.0.0.1", port, timeout_s=5) as c:
                await c.push(STREAM, batch, producer="bench-q", seq=self.pushed)
        else:
            client = await self.connections.get(port)
            await client.push(STREAM, batch, producer="bench-q", seq=self.pushed)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self.connections.close()

    async def _run(self) -> None:
        while not self.stopped:
            if self.rate is not None:
                due = self.paced_from + self.paced / BATCHES_PER_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            rows, advance = (self.rows, 10 if self.rate is None else 1)
            batch = make_batch(self.pushed, rows, self.t, advance)
            names = [n for n in self.peers.alive() if n not in self.excluded]
            port = self.peers.procs[self.rng.choice(names)].port
            sent = time.monotonic()
            try:
                await self._push(port, batch)
            except (FedstreamError, TimeoutError, OSError) as exc:
                if isinstance(exc, FedstreamError) and not exc.retriable:
                    raise
                self.refusals += 1
                await self.connections.drop(port)
                await asyncio.sleep(0.02)
                continue
            acked = time.monotonic()
            self.acks.append((sent, acked))
            self.log.append((rows, self.t, advance))
            self.closes.append((self.t + (rows - 1) * advance // rows, acked))
            self.acked_rows += rows
            self.t += advance
            self.pushed += 1
            self.paced += 1
            if self.rate is None:
                await asyncio.sleep(0.1)

    def batches(self) -> list[dict[str, list[int]]]:
        return [as_columns(make_batch(s, *entry)) for s, entry in enumerate(self.log)]

    def closed_at(self, end: int) -> float | None:
        """When the first batch holding event time ``end`` or later was acknowledged."""
        at = bisect.bisect_left(self.closes, (end, -1.0))
        return self.closes[at][1] if at < len(self.closes) else None

    def first_ack_after(self, t: float) -> float | None:
        after = [acked for sent, acked in self.acks if sent >= t]
        return min(after) if after else None


class Watcher:
    """The result stream through a random live peer; when each window first arrived."""

    def __init__(self, peers: EnginePeers, pusher: Pusher) -> None:
        self.peers = peers
        self.pusher = pusher
        self.seen: dict[tuple[int, int], float] = {}  # (window start, key) -> first arrival
        self.counts: dict[tuple[int, int], int] = {}  # (window start, key) -> its n
        self.rows: list[dict[str, Any]] = []
        self.stopped = False
        self.rng = random.Random(9)

    async def run(self) -> None:
        while not self.stopped:
            names = [n for n in self.peers.alive() if n not in self.pusher.excluded]
            if not names:  # the peers are stopping
                return
            port = self.peers.procs[self.rng.choice(names)].port
            rows: list[dict[str, Any]] = []
            try:
                async with Client("127.0.0.1", port, timeout_s=5) as c:
                    async for batch in c.subscribe(OUT, "earliest"):
                        now = time.monotonic()
                        for row in batch.rows():
                            rows.append(row)
                            self.seen.setdefault((row["window_start"], row["k"]), now)
                            self.counts.setdefault((row["window_start"], row["k"]), row["n"])
                        self.rows = rows
                        if self.stopped:
                            return
            except (FedstreamError, TimeoutError, OSError):
                await asyncio.sleep(0.05)

    def newest_start(self) -> int:
        return max((start for start, _k in self.seen), default=-1)

    def first_new_after(self, t: float, newest: int) -> float | None:
        after = [at for (start, _k), at in self.seen.items() if start > newest and at >= t]
        return min(after) if after else None


async def in_sync(peers: EnginePeers, port: int) -> bool:
    for stream in (STREAM, OUT, "~ckpt.haq"):
        found = await ha.ask(port, "lookup_object", stream)
        if len(found["replicas"]) != 3 or not all(r["in_sync"] for r in found["replicas"]):
            return False
    return True


async def standby_running(peers: EnginePeers) -> str | None:
    """The peer running a warm standby of the query that has run a batch, if one does."""
    for name in peers.alive():
        try:
            status = await ha.ask(peers.procs[name].port, "status")
        except FedstreamError:
            continue
        held = (status.get("replication") or {}).get("standbys", {}).get("haq")
        if held is not None and not held["promoted"] and held["batches"] > 0:
            return name
    return None


def cpu_seconds(peers: EnginePeers, name: str) -> float:
    """The CPU seconds a peer's process tree (its JVM too) has used."""
    proc = peers.procs[name].proc
    assert proc is not None
    return bc.tree_cpu_seconds(proc.pid)


def rss_mib(peers: EnginePeers, name: str) -> float:
    """The resident memory of a peer's process tree, MiB."""
    proc = peers.procs[name].proc
    assert proc is not None
    return bc.tree_memory(proc.pid).rss_mb


async def usage(peers: EnginePeers, names: list[str]) -> dict[str, dict[str, float]]:
    """Cores used over USAGE_S and resident MiB at its end, per peer (its process group)."""
    before = {n: cpu_seconds(peers, n) for n in names}
    began = time.monotonic()
    await asyncio.sleep(USAGE_S)
    took = time.monotonic() - began
    return {
        n: {"cores": (cpu_seconds(peers, n) - before[n]) / took, "rss_mib": rss_mib(peers, n)}
        for n in names
    }


async def roles(peers: EnginePeers, standby: str | None) -> list[tuple[str, str]]:
    """(role, peer) of the engine peers: the stream's primary, the standby, the followers."""
    found = await ha.ask(peers.procs[peers.alive()[0]].port, "lookup_object", STREAM)
    primary = peers.by_node(found["primary"]["node"])
    engines = [n for n in ha.NAMES[:3] if n in peers.alive()]
    followers = sorted(n for n in engines if n not in (primary, standby))
    order = [primary, *([standby] if standby else []), *followers]
    names = ["primary", *(["standby"] if standby else []), "follower", "follower 2"]
    return list(zip(names, order, strict=False))


async def run_rates(
    peers: EnginePeers, pusher: Pusher, watcher: Watcher, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The rate steps (module docstring); stops at the first rate not kept up with."""
    steps: list[dict[str, Any]] = []
    who = await roles(peers, await standby_running(peers) if args.standby else None)
    for rate in args.rates:
        pusher.pace(rate)
        await asyncio.sleep(args.step_s / 3)
        began, rows0 = time.monotonic(), pusher.acked_rows
        cpu0 = {n: cpu_seconds(peers, n) for _role, n in who}
        await asyncio.sleep(args.step_s * 2 / 3)
        ended, rows1 = time.monotonic(), pusher.acked_rows
        took = ended - began
        cores = {role: (cpu_seconds(peers, n) - cpu0[n]) / took for role, n in who}
        arrived = [w for w, at in watcher.seen.items() if began <= at < ended]
        counted = sum(watcher.counts[w] for w in arrived)
        lat = []
        for start, k in arrived:
            closed = pusher.closed_at(start + 10)
            if closed is not None:
                lat.append(watcher.seen[(start, k)] - closed)
        latency = np.array(lat)
        step = {
            "offered": rate,
            "acked_per_s": (rows1 - rows0) / took,
            "counted_per_s": counted / took,
            "windows": len(arrived),
            "latency_p50_s": bc.quantile(latency, 0.5),
            "latency_p90_s": bc.quantile(latency, 0.9),
            "cores": cores,
            "rss_mib": {role: rss_mib(peers, n) for role, n in who},
        }
        acked_ok, counted_ok, p90_ok = KEPT_UP
        step["kept_up"] = bool(
            step["acked_per_s"] >= acked_ok * rate
            and step["counted_per_s"] >= counted_ok * step["acked_per_s"]
            and len(latency) > 0
            and step["latency_p90_s"] < p90_ok
        )
        steps.append(step)
        print(
            f"  {rate:,} rows/s offered: {step['acked_per_s']:,.0f} acked, "
            f"{step['counted_per_s']:,.0f} counted in windows/s, latency p50 "
            f"{step['latency_p50_s']:.2f} s, p90 {step['latency_p90_s']:.2f} s; "
            + ", ".join(f"{r} {c:.2f} cores" for r, c in cores.items())
            + ("" if step["kept_up"] else "; NOT kept up"),
            flush=True,
        )
        if not step["kept_up"]:
            break
    pusher.pace(None)
    return steps


async def run_kills(peers: EnginePeers, args: argparse.Namespace) -> dict[str, Any]:
    first = peers.procs[ha.NAMES[0]].port
    await ha.ask(first, "create_schema", SCHEMA)
    await ha.ask(first, "create_stream", STREAM, "haq_tick", replicas=3)
    query = {**QUERY, "standby": True} if args.standby else QUERY
    await ha.ask(first, "create_query", query)
    await ha.ask(first, "start_query", "haq")
    pusher = Pusher(peers)
    watcher = Watcher(peers, pusher)
    tasks = [asyncio.create_task(pusher.run()), asyncio.create_task(watcher.run())]
    kills: list[dict[str, Any]] = []
    used: dict[str, dict[str, float]] = {}
    steps: list[dict[str, Any]] = []
    try:
        if args.rates:
            port = peers.procs[peers.alive()[0]].port
            await wait_until(lambda p=port: in_sync(peers, p), "three in-sync replicas", 180)
            await wait_until(lambda: asyncio.sleep(0, watcher.newest_start() >= 0), "results", 180)
            if args.standby:
                await wait_until(lambda: standby_running(peers), "a standby", 180)
            steps = await run_rates(peers, pusher, watcher, args)
        for i in range(args.kills):
            port = peers.procs[peers.alive()[0]].port
            await wait_until(lambda p=port: in_sync(peers, p), "three in-sync replicas", 180)
            await wait_until(lambda: asyncio.sleep(0, watcher.newest_start() >= 0), "results", 180)
            standby = None
            if args.standby:
                standby = await wait_until(lambda: standby_running(peers), "a standby", 180)
            await asyncio.sleep(args.settle)
            who = await roles(peers, standby)
            victim = who[0][1]
            if i == 0:
                sampled = await usage(peers, [n for _role, n in who])
                used = {role: sampled[n] for role, n in who}
            newest = watcher.newest_start()
            pusher.excluded = {victim}
            killed = time.monotonic()
            await asyncio.to_thread(peers.procs[victim].kill)
            acked = await wait_until(
                lambda t=killed: asyncio.sleep(0, pusher.first_ack_after(t)), "a push", 120
            )
            result = await wait_until(
                lambda t=killed, n=newest: asyncio.sleep(0, watcher.first_new_after(t, n)),
                "a new result window",
                180,
            )
            record = {
                "kill": i + 1,
                "victim": victim,
                "standby": standby,
                "push_s": acked - killed,
                "result_s": result - killed,
            }
            await asyncio.to_thread(peers.restart, victim)
            pusher.excluded = set()
            kills.append(record)
            print(
                f"  kill {i + 1}: {victim}; next acknowledged push {record['push_s']:.2f} s, "
                f"next result window {record['result_s']:.2f} s after the kill",
                flush=True,
            )
    finally:
        pusher.stopped = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(tasks[0], 30)
    pushed = pusher.pushed
    want: Counter[tuple[int, ...]] = keyed_window_sums(pusher.batches())
    last = max(w[0] for w in want)
    await wait_until(
        lambda: asyncio.sleep(0, watcher.newest_start() >= last), "the last window", 300
    )
    await asyncio.sleep(3)  # a duplicate would arrive now
    watcher.stopped = True
    tasks[1].cancel()
    got: Counter[tuple[int, ...]] = Counter(
        (r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in watcher.rows
    )
    # a result stream keeps 10 minutes of windows (the peer's retention): compare from the
    # oldest window still there
    floor = min((w[0] for w in got), default=0)
    want = Counter({w: n for w, n in want.items() if w[0] >= floor})
    return {
        "standby": args.standby,
        "usage": used,
        "rates": steps,
        "kills": kills,
        "batches": pushed,
        "refusals": pusher.refusals,
        "windows": sum(want.values()),
        "from_window": floor,
        "exact": got == want,
        "missing": sum((want - got).values()),
        "extra": sum((got - want).values()),
        # (start, key) of some windows that differ, for a look at the peers' logs
        "differing": sorted({(w[0], w[2]) for w in (got - want) + (want - got)})[:20],
    }


def report(results: dict[str, Any]) -> str:
    lines = bc.header(results)
    run = results.get("run") or {}
    kills = run.get("kills") or []
    steps = run.get("rates") or []
    if steps:
        roles = list(steps[0]["cores"])
        lines += [
            bc.md_table(
                [
                    "offered rows/s",
                    "acked /s",
                    "counted in windows /s",
                    "latency p50 / p90",
                    *(f"{role} cores" for role in roles),
                    "kept up",
                ],
                [
                    [
                        f"{st['offered']:,}",
                        f"{st['acked_per_s']:,.0f}",
                        f"{st['counted_per_s']:,.0f}",
                        f"{st['latency_p50_s']:.2f} s / {st['latency_p90_s']:.2f} s",
                        *(f"{st['cores'][role]:.2f}" for role in roles),
                        "yes" if st["kept_up"] else "no",
                    ]
                    for st in steps
                ],
            ),
            "",
            "Highest rate kept up with: "
            + (
                f"{max(st['offered'] for st in steps if st['kept_up']):,} rows/s"
                if any(st["kept_up"] for st in steps)
                else "none of those offered"
            )
            + f" (query with a warm standby: {'yes' if run.get('standby') else 'no'}).",
            "",
        ]
    if kills:
        rows = []
        for what, key in (("next acknowledged push", "push_s"), ("next result", "result_s")):
            times = np.array([k[key] for k in kills])
            rows.append(
                [
                    f"kill -9 of the aggregate's peer -> {what}",
                    f"{bc.quantile(times, 0.5):.2f} s",
                    f"{bc.quantile(times, 0.99):.2f} s",
                    f"{times.min():.2f} s",
                    f"{times.max():.2f} s",
                ]
            )
        lines += [
            bc.md_table([f"{len(kills)} kills", "p50", "p99", "min", "max"], rows),
            "",
            f"Query with a warm standby: {'yes' if run.get('standby') else 'no'}. Before the "
            f"first kill, each engine peer's process group over {USAGE_S:.0f} s: "
            + "; ".join(
                f"{role} {u['cores']:.2f} cores, {u['rss_mib']:.0f} MiB"
                for role, u in (run.get("usage") or {}).items()
            )
            + ".",
            "",
            "Each kill, push / result: "
            + ", ".join(f"{k['push_s']:.2f}/{k['result_s']:.2f}" for k in kills)
            + " s.",
            "",
        ]
    if run:
        lines += [
            f"{run['batches']} batches pushed ({run['refusals']} refusals retried); the result "
            f"stream {'equals' if run['exact'] else 'DIFFERS FROM'} plain Python "
            f"({run['windows']} windows from event time {run['from_window']}; {run['missing']} "
            f"missing, {run['extra']} extra)"
            + (
                f"; some that differ (start, key): {run['differing']}."
                if run.get("differing")
                else "."
            ),
        ]
    if results["errors"]:
        lines += ["", f"Errors: {results['errors']}"]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results = bc.new_results("bench_ha_query.py")
    peers = EnginePeers(work)

    async def body() -> None:
        results["run"] = await run_kills(peers, args)

    return await ha.run_on_peers(results, peers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="aggregate peers killed")
    parser.add_argument("--settle", type=float, default=3.0, help="s of results before a kill")
    parser.add_argument("--standby", action="store_true", help="the query asks for a standby")
    parser.add_argument(
        "--rates",
        type=lambda text: [int(r) for r in text.split(",") if r],
        default=[],
        help="rows/s offered in rising steps before the kills, comma-separated",
    )
    parser.add_argument("--step-s", type=float, default=30.0, help="s per rate step")
    parser.add_argument("--work-dir", type=Path, help="keep the peers' data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    results = bc.run_in(args, "fedstream-bench-haq-", main_async, report)
    if results is None:
        return 130
    return 0 if not results["errors"] and results.get("run", {}).get("exact") else 1


if __name__ == "__main__":
    sys.exit(main())
