#!/usr/bin/env python3
"""High availability (issue 11): failover time after kill -9 of a primary, and what
replication costs pushes (r = 3 against r = 1, same peers, same run).

Usage (from the repository root)::

    .venv/bin/python scripts/bench_ha.py                 # 10 kills, 2 rounds of r1/r3; ~5 min
    .venv/bin/python scripts/bench_ha.py --kills 3 --rounds 1 --duration 5   # a quick look
    .venv/bin/python scripts/bench_ha.py --json run.json   # the figures as JSON too

What runs
---------
Five ``peer join --no-engine`` processes on loopback (``peer.testing.cluster.LocalFederation``:
participants with keys and one trust directory; no Spark: a stream needs none), the first
three voters of the control plane (Raft on pysyncobj; ``--voter``) and the other two
``--no-voter``, gossip every 0.3 s. ``--voters 5`` makes all five voters, which is what
``peer join``'s default (volunteering for a seat) gives five live peers. Defaults of the
peer otherwise: heartbeats to the voters every 0.25 s, failover after 3 s of silence, or
after 0.5 s if the primary's host refuses connections to its port (a killed process: the
leader's probe, docs/replication.md), ``--min-insync 2``.

(b) Throughput, first, while every peer is fresh: two streams of four int columns, one
created with ``replicas=1`` and one with ``replicas=3``. N pushers (for each N of
``--pushers``), each its own producer id and its own connection to the stream's primary (from
``lookup``: no forwarding hop), push the same pre-built ``--rows``-row Arrow table with rising
seqs, one push in flight each. A push is acknowledged once it is fsynced on the primary and
(r = 3) on every in-sync follower. r = 1 and r = 3 alternate for ``--rounds`` rounds of
``--warmup`` + ``--duration`` seconds; only pushes that end inside the measured part count.
Ack latency = the client's time from sending a push to its reply. CPU: the machine's busy
cores over the window, each peer's process tree's, and this process's (the pushers').

(a) Failover: a third stream (``replicas=3``); one pusher sends 10-row batches continuously,
one in flight, each through a random live peer (which forwards it to the primary), retrying a
refused or timed-out push with the same (producer, seq) on another peer. The stream's primary
(from ``lookup``) is killed with SIGKILL (its process group); the pusher stops choosing it at
that instant. Failover time = from the kill to the first acknowledgement of a push *sent*
after the kill (a reply already on its way from the dead primary does not count). The killed
peer is then restarted on its data directory (bootstrapping through a live peer) and the next
kill waits until it is back in the stream's in-sync set and knows the Raft leader, so each
kill finds three replicas in sync and every voter. ``--kills`` times.

Everything started here is stopped on the way out (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

from peer.client import Client
from peer.errors import FedstreamError
from peer.testing import (
    LocalFederation,
    PeerProcess,
    make_participants,
    participant_args,
    wait_until,
)

NAMES = ("ha1", "ha2", "ha3", "ha4", "ha5")
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")
SCHEMA = {
    "name": "hab",
    "fields": [{"name": n, "type": "int"} for n in ("a", "b", "c", "d")],
}
SMALL_ROWS = 10


def table(rows: int) -> pa.Table:
    return pa.table(
        {n: pa.array(np.arange(rows, dtype=np.int32) + i) for i, n in enumerate("abcd")}
    )


def election_time(peers: Peers, stream: str, since: float) -> float | None:
    """The wall time at which a voter logged its decision to replace the primary of
    ``stream``, the first at or after ``since`` (the logs' own timestamps, local time)."""
    found = []
    for name in peers.voters:
        path = peers.procs[name].log_path
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                if not line.rstrip().endswith(f"primary of {stream}") or "electing" not in line:
                    continue
                with contextlib.suppress(ValueError):
                    stamp, _, ms = line[:23].partition(",")
                    t = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1e3
                    if t >= since - 0.01:
                        found.append(t)
    return min(found) if found else None


# --------------------------------------------------------------------------- the peers


class Peers:
    """The five peers; a killed one is restarted on its data directory through a live one."""

    def __init__(self, work: Path, voters: int = 3, engines: tuple[str, ...] = ()) -> None:
        """``voters``: the first that many take a seat (``--voter``), the others stay out
        (``--no-voter``); ``engines``: the peers that run Spark (the others ``--no-engine``)."""
        self.work = work
        self.voters = NAMES[:voters]
        keys = make_participants(work, NAMES)
        self.args = {
            name: [
                *participant_args(name, keys[name], work / "trust"),
                *([] if name in engines else ["--no-engine"]),
                *FAST,
                "--voter" if name in self.voters else "--no-voter",
            ]
            for name in NAMES
        }
        self.fed = LocalFederation(work, self.args)

    def start(self) -> None:
        self.fed.start(timeout_s=120)

    @property
    def procs(self) -> dict[str, PeerProcess]:
        return self.fed.procs

    def by_node(self, node: str) -> str:
        return next(n for n, p in self.procs.items() if p.node_id == node)

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.proc is not None and p.proc.poll() is None]

    def restart(self, name: str) -> None:
        old = self.procs[name]
        via = next(n for n in self.alive() if n != name)
        proc = PeerProcess(
            old.data_dir,
            *self.args[name],
            "--bootstrap",
            self.procs[via].overlay_addr,
            log_path=old.log_path,
        )
        self.procs[name] = proc.start(timeout_s=120)

    def stop(self) -> None:
        self.fed.stop()


async def ask(port: int, what: str, *args: Any, **kwargs: Any) -> Any:
    async with Client("127.0.0.1", port, timeout_s=15) as c:
        return await getattr(c, what)(*args, **kwargs)


async def federation_ready(peers: Peers) -> None:
    async def ready() -> bool:
        for p in peers.procs.values():
            status = await ask(p.port, "status")
            alive = [m for m in status["overlay"]["members"] if m["state"] == "alive"]
            if len(alive) < len(NAMES) or len(status["replication"]["voters"]) < len(peers.voters):
                return False
        return True

    await wait_until(ready, f"five live members that know {len(peers.voters)} voters", 90)


# --------------------------------------------------------------------------- (b) throughput


@dataclass
class Window:
    replicas: int
    pushers: int
    latencies: list[float] = field(default_factory=list)
    rows: int = 0
    errors: int = 0
    seconds: float = 0.0
    busy_cores: float = 0.0  # the whole machine
    cores: dict[str, float] = field(default_factory=dict)  # each peer's, and the pushers'


def cpu_seconds(peers: Peers) -> dict[str, float]:
    pids = {n: p.proc.pid for n, p in peers.procs.items() if p.proc is not None}
    return {"pushers": bc.tree_cpu_seconds(os.getpid(), with_children=False)} | {
        n: bc.tree_cpu_seconds(pid) for n, pid in pids.items()
    }


async def throughput_window(
    peers: Peers, port: int, r: int, n: int, data: pa.Table, args: argparse.Namespace, tag: str
) -> Window:
    window, stream = Window(r, n), f"hab_r{r}"
    loop = asyncio.get_running_loop()
    start = loop.time() + args.warmup
    end = start + args.duration

    async def pusher(i: int) -> None:
        producer, seq = f"bench-{tag}-{i}", 0
        async with Client("127.0.0.1", port, timeout_s=60) as c:
            while loop.time() < end:
                sent = loop.time()
                try:
                    await c.push(stream, data, producer=producer, seq=seq)
                except FedstreamError as exc:
                    if not exc.retriable:
                        raise
                    window.errors += 1
                    await asyncio.sleep(0.05)
                    continue  # the same seq again
                done = loop.time()
                seq += 1
                if start <= done < end:
                    window.latencies.append(done - sent)
                    window.rows += data.num_rows

    async def measure() -> None:
        await asyncio.sleep(max(0.0, start - loop.time()))
        busy0, cpu0, t0 = bc.system_busy_seconds(), cpu_seconds(peers), loop.time()
        await asyncio.sleep(max(0.0, end - loop.time()))
        wall = loop.time() - t0
        window.busy_cores = (bc.system_busy_seconds() - busy0) / wall
        window.cores = {k: (v - cpu0.get(k, v)) / wall for k, v in cpu_seconds(peers).items()}

    await asyncio.gather(measure(), *(pusher(i) for i in range(n)))
    window.seconds = args.duration
    return window


async def run_throughput(peers: Peers, args: argparse.Namespace) -> list[Window]:
    first = peers.procs[NAMES[0]].port
    primaries: dict[int, int] = {}
    for r in (1, 3):
        stream = f"hab_r{r}"
        await ask(first, "create_stream", stream, "hab", replicas=r)
        found = await wait_until(
            lambda s=stream: ask(first, "lookup_object", s), f"lookup of {stream}", 30
        )
        primaries[r] = int(found["primary"]["api"].rpartition(":")[2])
        print(
            f"  r={r}: stream {stream}, primary {peers.by_node(found['primary']['node'])}, "
            f"replicas {[peers.by_node(x['node']) for x in found['replicas']]}",
            flush=True,
        )
    data = table(args.rows)
    windows = []
    for round_ in range(args.rounds):
        for n in args.pushers:
            for r in (1, 3):
                tag = f"r{r}-n{n}-round{round_}"
                w = await throughput_window(peers, primaries[r], r, n, data, args, tag)
                windows.append(w)
                lat = np.array(w.latencies)
                cores = ", ".join(f"{k} {v:.2f}" for k, v in w.cores.items())
                print(
                    f"  round {round_ + 1}, {n} pushers, r={r}: {w.rows / w.seconds:,.0f} rows/s,"
                    f" {len(lat) / w.seconds:.1f} batches/s, p50 {bc.quantile(lat, 0.5) * 1e3:.1f}"
                    f" ms, p99 {bc.quantile(lat, 0.99) * 1e3:.1f} ms, {w.errors} refusals; "
                    f"machine busy {w.busy_cores:.2f} cores ({cores})",
                    flush=True,
                )
    return windows


# --------------------------------------------------------------------------- (a) failover


class Connections:
    """One kept client connection per peer port: made on first use, dropped after an error."""

    def __init__(self) -> None:
        self.clients: dict[int, Client] = {}

    async def get(self, port: int) -> Client:
        client = self.clients.get(port)
        if client is None or not client.connected:
            client = Client("127.0.0.1", port, timeout_s=5)
            await client.connect()
            self.clients[port] = client
        return client

    async def drop(self, port: int) -> None:
        client = self.clients.pop(port, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 2)

    async def close(self) -> None:
        for port in list(self.clients):
            await self.drop(port)


class SmallPusher:
    """10-row batches, one in flight, each through a random live peer; (sent, acked) times."""

    def __init__(self, peers: Peers, stream: str) -> None:
        self.peers = peers
        self.stream = stream
        self.data = table(SMALL_ROWS)
        self.excluded: set[str] = set()
        self.acks: list[tuple[float, float]] = []
        self.refusals = 0
        self.stopped = False
        self.rng = random.Random(7)
        self.connections = Connections()

    async def run(self) -> None:
        seq = 0
        try:
            while not self.stopped:
                names = [n for n in self.peers.alive() if n not in self.excluded]
                port = self.peers.procs[self.rng.choice(names)].port
                sent = time.monotonic()
                try:
                    client = await self.connections.get(port)
                    await client.push(self.stream, self.data, producer="bench-failover", seq=seq)
                except (FedstreamError, TimeoutError, OSError) as exc:
                    if isinstance(exc, FedstreamError) and not exc.retriable:
                        raise
                    self.refusals += 1
                    await self.connections.drop(port)
                    await asyncio.sleep(0.02)
                    continue
                self.acks.append((sent, time.monotonic()))
                seq += 1
        finally:
            await self.connections.close()

    def first_ack_after(self, t: float) -> float | None:
        after = [acked for sent, acked in self.acks if sent >= t]
        return min(after) if after else None


async def run_failover(peers: Peers, args: argparse.Namespace) -> list[dict[str, Any]]:
    stream = "hab_failover"
    first = peers.procs[NAMES[0]].port
    await ask(first, "create_stream", stream, "hab", replicas=3)
    pusher = SmallPusher(peers, stream)
    task = asyncio.create_task(pusher.run())
    kills: list[dict[str, Any]] = []
    try:
        for i in range(args.kills):
            port = peers.procs[peers.alive()[0]].port

            async def settled(port: int = port) -> dict[str, Any] | None:
                found = await ask(port, "lookup_object", stream)
                ok = all(r["in_sync"] for r in found["replicas"]) and len(found["replicas"]) == 3
                return found if ok and len(pusher.acks) > 0 else None

            found = await wait_until(settled, "three in-sync replicas", 120)
            await asyncio.sleep(args.settle)
            victim = peers.by_node(found["primary"]["node"])
            acked_before = len(pusher.acks)
            pusher.excluded = {victim}
            killed, killed_wall = time.monotonic(), time.time()
            await asyncio.to_thread(peers.procs[victim].kill)
            first_ack = await wait_until(
                lambda t=killed: asyncio.sleep(0, pusher.first_ack_after(t)),
                "an acknowledged push after the kill",
                120,
            )
            took = first_ack - killed
            after = await ask(peers.procs[peers.alive()[0]].port, "lookup_object", stream)
            record = {
                "kill": i + 1,
                "victim": victim,
                "voter": victim in peers.voters,
                "failover_s": took,
                "epoch_before": found["epoch"],
                "epoch_after": after["epoch"],
                "new_primary": peers.by_node(after["primary"]["node"]),
                "acked_before": acked_before,
            }
            elected = election_time(peers, stream, killed_wall)
            record["to_election_s"] = None if elected is None else elected - killed_wall
            restarted = time.monotonic()
            await asyncio.to_thread(peers.restart, victim)
            back = peers.procs[victim]

            async def in_sync_again(back: PeerProcess = back) -> bool:
                status = await ask(back.port, "status")
                mine = status["replication"]["streams"].get(stream) or {}
                if status["replication"].get("leader") is None or mine.get("role") != "follower":
                    return False
                found = await ask(back.port, "lookup_object", stream)
                return any(r["node"] == back.node_id and r["in_sync"] for r in found["replicas"])

            await wait_until(in_sync_again, f"{victim} in sync again", 120)
            record["resync_s"] = time.monotonic() - restarted
            pusher.excluded = set()
            kills.append(record)
            print(
                f"  kill {i + 1}: {victim}{' (voter)' if record['voter'] else ''} primary in "
                f"epoch {record['epoch_before']} -> {record['new_primary']} in epoch "
                f"{record['epoch_after']}; first ack {took:.2f} s after the kill; restarted "
                f"and in sync after {record['resync_s']:.1f} s",
                flush=True,
            )
    finally:
        pusher.stopped = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
    print(f"  failover pusher: {len(pusher.acks)} acknowledged, {pusher.refusals} refusals")
    return kills


# --------------------------------------------------------------------------- report


def report(results: dict[str, Any]) -> str:
    lines = bc.header(results)
    kills = results["failover"]
    if kills:
        times = np.array([k["failover_s"] for k in kills])
        elect = np.array([k["to_election_s"] for k in kills if k["to_election_s"] is not None])
        voters = sum(k["voter"] for k in kills)
        lines += [
            f"(a) Failover, kill -9 of the primary -> first acknowledged push sent after it "
            f"({len(kills)} kills, {voters} of them of a voter):",
            "",
            bc.md_table(
                ["kills", "p50", "p99", "max", "min", "epochs", "resync after restart, p50"],
                [
                    [
                        str(len(kills)),
                        f"{bc.quantile(times, 0.5):.2f} s",
                        f"{bc.quantile(times, 0.99):.2f} s",
                        f"{times.max():.2f} s",
                        f"{times.min():.2f} s",
                        f"{kills[0]['epoch_before']} -> {kills[-1]['epoch_after']}",
                        f"{np.median([k['resync_s'] for k in kills]):.1f} s",
                    ]
                ],
            ),
            "",
            "Each kill: " + ", ".join(f"{k['failover_s']:.2f}" for k in kills) + " s. "
            f"Of that, kill -> the Raft leader's decision to elect (its log's timestamp): p50 "
            f"{bc.fmt_s(bc.quantile(elect, 0.5))}, max {bc.fmt_s(bc.quantile(elect, 1.0))}"
            "; the rest is the Elect commit, the new primary learning it (a heartbeat answer) "
            "and taking office, and the forwarding peer finding it.",
            "",
        ]
    if results["throughput"]:
        lines += throughput_report(results["throughput"], results["args"])
    if results["errors"]:
        lines += ["", f"Errors: {results['errors']}"]
    return "\n".join(lines)


def throughput_report(windows: list[dict[str, Any]], a: dict[str, Any]) -> list[str]:
    rows = []
    for n in a["pushers"]:
        summary: dict[int, dict[str, float]] = {}
        for r in (1, 3):
            ws = [w for w in windows if w["replicas"] == r and w["pushers"] == n]
            lat = np.concatenate([np.array(w["latencies"]) for w in ws])
            secs = sum(w["seconds"] for w in ws)
            s = summary[r] = {
                "rows": sum(w["rows"] for w in ws) / secs,
                "batches": len(lat) / secs,
                "p50": bc.quantile(lat, 0.5),
                "p99": bc.quantile(lat, 0.99),
            }
            busiest = max(ws[0]["cores"], key=lambda k: ws[0]["cores"][k] if k != "pushers" else 0)
            cpu = [
                f"{np.mean([w['busy_cores'] for w in ws]):.2f}",
                f"{np.mean([w['cores'][busiest] for w in ws]):.2f} ({busiest})",
                f"{np.mean([w['cores']['pushers'] for w in ws]):.2f}",
            ]
            figures = [f"{s['rows']:,.0f}", f"{s['batches']:.1f}"]
            figures += [f"{s['p50'] * 1e3:.1f} ms", f"{s['p99'] * 1e3:.1f} ms"]
            rows.append([str(n), f"r = {r}", *figures, str(sum(w["errors"] for w in ws)), *cpu])
        ratio = [summary[3][k] / summary[1][k] for k in ("rows", "batches", "p50", "p99")]
        rows.append([str(n), "**r3 / r1**", *(f"**{x:.2f}x**" for x in ratio), "", "", "", ""])
    header = ["pushers", "", "rows/s", "batches/s", "ack p50", "ack p99", "refusals"]
    header += ["machine busy cores", "busiest peer, cores", "pushers' cores"]
    return [
        f"(b) Pushes straight to the primary: N pushers, one push in flight each, {a['rows']} "
        f"rows of 4 int columns per batch, {a['rounds']} rounds of {a['duration']:.0f} s per "
        f"(N, r) (after {a['warmup']:.0f} s of warm-up each), r = 1 and r = 3 alternating:",
        "",
        bc.md_table(header, rows),
    ]


# --------------------------------------------------------------------------- main


async def run_on_peers(
    results: dict[str, Any], peers: Peers, body: Callable[[], Awaitable[None]]
) -> dict[str, Any]:
    """The run frame of the HA benchmarks: start ``peers``, run ``body`` once they are
    ready, stop them; an error is recorded in ``results``, not raised."""
    print(f"load average {results['load_before']}; busiest: {bc.busy_processes()}", flush=True)
    began = time.monotonic()
    try:
        await asyncio.to_thread(peers.start)
        await federation_ready(peers)
        print(f"five peers ready after {time.monotonic() - began:.1f} s", flush=True)
        await body()
    except Exception as exc:
        results["errors"].append(f"{type(exc).__name__}: {exc}")
        print(f"FAILED: {type(exc).__name__}: {exc}; logs in {peers.work}", flush=True)
    finally:
        await asyncio.to_thread(peers.stop)
    results["load_after"] = bc.load_average()
    results["elapsed_s"] = time.monotonic() - began
    return results


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results = bc.new_results("bench_ha.py") | {
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "throughput": [],
        "failover": [],
    }
    peers = Peers(work, voters=args.voters)

    async def body() -> None:
        await ask(peers.procs[NAMES[0]].port, "create_schema", SCHEMA)
        if args.rounds:
            print("(b) throughput, r = 1 and r = 3", flush=True)
            windows = await run_throughput(peers, args)
            results["throughput"] = [{**w.__dict__, "latencies": w.latencies} for w in windows]
        if args.kills:
            print("(a) failover", flush=True)
            results["failover"] = await run_failover(peers, args)

    return await run_on_peers(results, peers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="primaries killed (a)")
    parser.add_argument("--settle", type=float, default=2.0, help="s of pushes before a kill")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of r=1 then r=3 (b)")
    parser.add_argument("--duration", type=float, default=15.0, help="measured s per window")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured s per window")
    parser.add_argument("--pushers", type=int, nargs="+", default=[4, 16], help="N (b)")
    parser.add_argument("--rows", type=int, default=1000, help="rows per batch (b)")
    parser.add_argument(
        "--voters", type=int, choices=(3, 5), default=3, help="control-plane seats taken"
    )
    parser.add_argument("--work-dir", type=Path, help="keep the peers' data and logs here")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    results = bc.run_in(args, "fedstream-bench-ha-", main_async, report)
    if results is None:
        return 130
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
