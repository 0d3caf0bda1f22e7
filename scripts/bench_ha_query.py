#!/usr/bin/env python3
"""High availability of a running query (issue 11): kill -9 of a windowed aggregate's peer
-> its next result, beside kill -9 -> the next acknowledged push, in the same run.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_ha_query.py              # 10 kills; ~10 min
    .venv/bin/python scripts/bench_ha_query.py --standby    # the same with a warm standby
    .venv/bin/python scripts/bench_ha_query.py --kills 2    # a quick look
    .venv/bin/python scripts/bench_ha_query.py --json run.json

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

With ``--standby`` the query asks for a warm standby (peer.replication.standby): each kill
then waits, besides, until a standby runs, and the failover promotes it instead of starting
the query from its checkpoint record. Before the first kill, the CPU (cores, over 10 s) and
resident memory of each engine peer's process group (its JVM included) are sampled: the
primary, the standby (or a follower) and the other follower.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil

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


def make_batch(seq: int) -> dict[str, list[int]]:
    rng = random.Random(seq)
    return {
        "k": [i % KEYS for i in range(ROWS)],
        "v": [rng.randrange(100) for _ in range(ROWS)],
        "t": [seq * 10 + i * 10 // ROWS for i in range(ROWS)],
    }


class EnginePeers(ha.Peers):
    """bench_ha's five peers, the three voters with Spark."""

    def __init__(self, work: Path) -> None:
        super().__init__(work, voters=3, engines=ha.NAMES[:3])

    def start(self) -> None:
        self.fed.start(timeout_s=300)


class Pusher:
    """Numbered batches, one in flight, through random live peers; (sent, acked) times."""

    def __init__(self, peers: EnginePeers) -> None:
        self.peers = peers
        self.excluded: set[str] = set()
        self.acks: list[tuple[float, float]] = []
        self.pushed = 0
        self.refusals = 0
        self.stopped = False
        self.rng = random.Random(5)

    async def run(self) -> None:
        while not self.stopped:
            names = [n for n in self.peers.alive() if n not in self.excluded]
            port = self.peers.procs[self.rng.choice(names)].port
            sent = time.monotonic()
            try:
                async with Client("127.0.0.1", port, timeout_s=5) as c:
                    batch = {"columns": make_batch(self.pushed)}
                    await c.push(STREAM, batch, producer="bench-q", seq=self.pushed)
            except (FedstreamError, TimeoutError, OSError) as exc:
                if isinstance(exc, FedstreamError) and not exc.retriable:
                    raise
                self.refusals += 1
                await asyncio.sleep(0.02)
                continue
            self.acks.append((sent, time.monotonic()))
            self.pushed += 1
            await asyncio.sleep(0.1)

    def first_ack_after(self, t: float) -> float | None:
        after = [acked for sent, acked in self.acks if sent >= t]
        return min(after) if after else None


class Watcher:
    """The result stream through a random live peer; when each window first arrived."""

    def __init__(self, peers: EnginePeers, pusher: Pusher) -> None:
        self.peers = peers
        self.pusher = pusher
        self.seen: dict[tuple[int, int], float] = {}  # (window start, key) -> first arrival
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


def group(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


async def usage(peers: EnginePeers, names: list[str]) -> dict[str, dict[str, float]]:
    """Cores used over USAGE_S and resident MiB at its end, per peer (its process group)."""

    def cpu(name: str) -> float:
        proc = peers.procs[name].proc
        assert proc is not None
        total = 0.0
        for p in group(proc.pid):
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        return total

    def rss(name: str) -> float:
        proc = peers.procs[name].proc
        assert proc is not None
        total = 0
        for p in group(proc.pid):
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total / 2**20

    before = {n: cpu(n) for n in names}
    began = time.monotonic()
    await asyncio.sleep(USAGE_S)
    took = time.monotonic() - began
    return {n: {"cores": (cpu(n) - before[n]) / took, "rss_mib": rss(n)} for n in names}


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
    roles: dict[str, dict[str, float]] = {}
    try:
        for i in range(args.kills):
            port = peers.procs[peers.alive()[0]].port
            await wait_until(lambda p=port: in_sync(peers, p), "three in-sync replicas", 180)
            await wait_until(lambda: asyncio.sleep(0, watcher.newest_start() >= 0), "results", 180)
            standby = None
            if args.standby:
                standby = await wait_until(lambda: standby_running(peers), "a standby", 180)
            await asyncio.sleep(args.settle)
            found = await ha.ask(port, "lookup_object", STREAM)
            victim = peers.by_node(found["primary"]["node"])
            if i == 0:
                engines = [n for n in ha.NAMES[:3] if n in peers.alive()]
                followers = sorted(n for n in engines if n not in (victim, standby))
                order = [victim, *([standby] if standby else []), *followers]
                names = ["primary", *(["standby"] if standby else []), "follower", "follower 2"]
                sampled = await usage(peers, order)
                roles = {role: sampled[n] for role, n in zip(names, order, strict=False)}
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
    want: Counter[tuple[int, ...]] = keyed_window_sums([make_batch(s) for s in range(pushed)])
    last = max(w[0] for w in want)
    await wait_until(
        lambda: asyncio.sleep(0, watcher.newest_start() >= last), "the last window", 180
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
        "usage": roles,
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
    parser.add_argument("--work-dir", type=Path, help="keep the peers' data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    results = bc.run_in(args, "fedstream-bench-haq-", main_async, report)
    if results is None:
        return 130
    return 0 if not results["errors"] and results.get("run", {}).get("exact") else 1


if __name__ == "__main__":
    sys.exit(main())
