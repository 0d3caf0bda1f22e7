#!/usr/bin/env python3
"""Delay, Process and Correct (issue 16): how long results wait when a participant is cut
off, how many are tentative, and how long the correction takes after the heal.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_dpc.py              # bounds 2, 5, 10 s x partitions 10, 30, 60 s
    .venv/bin/python scripts/bench_dpc.py --quick      # bound 5 s, partition 10 s
    .venv/bin/python scripts/bench_dpc.py --bounds 5 --partitions 30 --json run.json

What runs
---------
Two ``peer join`` processes of two participants (``peer.testing.cluster.LocalFederation``):
acme with a Spark session (``local[2]``), globex with one too (``local[1]``, so that its stream
is placed on it and reaches acme's query over a mirror). For each (bound, partition) pair, in
turn: two new streams, one on each peer, and at acme the workload of
``peer.examples.partition`` (a union of both into a 10 s tumbling window per segment) with
that availability bound. Both sides push one batch of five reports (five seconds of event
time) every ``--interval`` seconds; after
``--warmup`` batches, globex's peer is cut off for the partition while acme's pushes go on;
then the cut heals, globex's producer sends what it held back (once globex's peer sees acme's
again), both go on for ``--after`` batches, and the run waits until a stable subscriber at acme
holds exactly plain Python's windows.

The cut (``--fault``): ``partition`` (the default when run as root with iproute2) puts globex's
peer in a network namespace whose veth link to acme's silently drops every frame while cut
(``peer.testing.netns``): a real partition, each side declaring the other dead; clients then
speak TLS as their participant, as a peer listening off loopback requires. ``freeze`` stops
globex's peer with SIGSTOP instead (both on loopback).

Figures (a window's *close* is the push that took the slowest input it waits for past its
end: both inputs before the freeze, acme's alone during it; its *delay* is from its close to
its first result at a ``tentative`` subscriber, tentative or stable):

- reference: the p50 and largest delay of the windows closed in the second half of the
  warm-up, before the freeze (both inputs flowing: the query's own latency, a micro-batch
  or two, measured in the same run);
- largest delay of a window closed during the partition (DPC's promise: within the bound
  plus a micro-batch; here also plus the time a fork needs to start, which the first fork
  measures and later detections subtract);
- first tentative result after the freeze; tentative tuples and undo entries written;
- heal to last stable result: from the heal to the moment the stable subscriber holds every
  window plain Python expects.

Everything started here is stopped on the way out (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

from peer.client import Client
from peer.examples.partition import (
    SIZE,
    partition_query,
    partition_reference,
    partition_schema,
    reports,
    window_key,
)
from peer.testing import (
    LocalFederation,
    make_participants,
    netns,
    participant_args,
    stream_name_on,
)
from peer.testing.netns import Cutoff, Island, whole_again

STEP = 5  # seconds of event time per pushed batch


async def one_run(
    fed: LocalFederation,
    cut: Cutoff,
    bound: float,
    partition_s: float,
    args: argparse.Namespace,
    n: int,
) -> dict[str, Any]:
    acme, globex = fed.procs["acme"], fed.procs["globex"]
    ids = [bytes.fromhex(acme.node_id), bytes.fromhex(globex.node_id)]
    mine = stream_name_on(ids[0], ids, f"r{n}a")
    theirs = stream_name_on(ids[1], ids, f"r{n}g")
    name = f"dpc{n}"
    pushed: list[dict[str, Any]] = []
    reached: dict[str, list[tuple[float, int]]] = {mine: [], theirs: []}  # (time, max t)
    seen: dict[int, float] = {}  # window start -> first result at the tentative subscriber
    stable: list[tuple[int, ...]] = []
    stable_at: list[float] = []
    async with (
        cut.client("acme", acme) as at_acme,
        cut.client("globex", globex) as at_globex,
    ):
        await at_acme.create_stream(mine, "report")
        await at_acme.create_stream(theirs, "report")
        await at_acme.create_query(partition_query(name, mine, theirs, bound_s=bound, node="acme"))
        await at_acme.start_query(name)

        async def watch(tentative: bool) -> None:
            out = f"{name}_out"
            async with await at_acme.subscribe(out, "earliest", tentative=tentative) as sub:
                async for batch in sub:
                    now = time.monotonic()
                    for row in batch.rows():
                        if tentative:
                            seen.setdefault(row["window_start"], now)
                        else:
                            stable.append(window_key(row))
                            stable_at.append(now)

        watchers = [asyncio.create_task(watch(True)), asyncio.create_task(watch(False))]

        async def push(client: Client, stream: str, first: int, last: int, origin: int) -> None:
            rows = reports(first, last, origin)
            await client.push(stream, rows)
            pushed.extend(rows)
            reached[stream].append((time.monotonic(), last - 1))

        t = 0
        warm = time.monotonic() + args.warmup * args.interval / 2  # the query's start is over
        for _ in range(args.warmup):
            await push(at_acme, mine, t, t + STEP, 1)
            await push(at_globex, theirs, t, t + STEP, 2)
            t += STEP
            await asyncio.sleep(args.interval)
        g_last = t
        cut.begin(globex)
        frozen = time.monotonic()
        try:
            while time.monotonic() - frozen < partition_s:
                await push(at_acme, mine, t, t + STEP, 1)
                t += STEP
                await asyncio.sleep(args.interval)
        finally:
            cut.end(globex)
        healed = time.monotonic()
        await whole_again(at_globex)  # globex's producer waits until its peer sees acme's
        back = time.monotonic()
        await push(at_globex, theirs, g_last, t, 2)
        for _ in range(args.after):
            await push(at_acme, mine, t, t + STEP, 1)
            await push(at_globex, theirs, t, t + STEP, 2)
            t += STEP
            await asyncio.sleep(args.interval)
        want = partition_reference(pushed, t - 1)
        deadline = time.monotonic() + args.settle_timeout
        while Counter(stable) != want and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        exact = Counter(stable) == want
        status = await at_acme.status()
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await at_acme.set_query_status(name, "DELETED")

    def first_reach(stream: str, end: int, after: float = 0.0) -> float | None:
        return next((at for at, top in reached[stream] if top >= end and at >= after), None)

    before, during = [], []
    for start, result_at in seen.items():
        end = start + SIZE
        a_at = first_reach(mine, end)
        if a_at is None:
            continue
        if end <= g_last:  # both inputs passed it before the freeze
            g_at = first_reach(theirs, end)
            if g_at is not None and warm <= max(a_at, g_at) < frozen:
                before.append(result_at - max(a_at, g_at))
        elif frozen <= a_at < healed:
            during.append(result_at - a_at)
    dpc = next(q for q in status["queries"] if q["name"] == name).get("availability") or {}
    last_stable = max(stable_at) if stable_at else None
    return {
        "bound_s": bound,
        "partition_s": partition_s,
        "reference_p50_s": round(statistics.median(before), 2) if before else None,
        "reference_max_s": round(max(before), 2) if before else None,
        "max_delay_s": round(max(during), 2) if during else None,
        "windows_during": len(during),
        "first_tentative_s": round(min(seen[s] for s in seen if s + SIZE > g_last) - frozen, 2)
        if any(s + SIZE > g_last and seen[s] >= frozen for s in seen)
        else None,
        "tentative_tuples": dpc.get("tentative_tuples"),
        "corrections": dpc.get("corrections"),
        "corrected_tuples": dpc.get("corrected_tuples"),
        "fork_first_result_s": dpc.get("fork_first_result_s"),
        "heal_to_peer_back_s": round(back - healed, 2),
        "heal_to_last_stable_s": round(last_stable - healed, 2) if last_stable else None,
        "exact": exact,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bounds", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    parser.add_argument("--partitions", type=float, nargs="+", default=[10.0, 30.0, 60.0])
    parser.add_argument("--quick", action="store_true", help="bound 5 s, partition 10 s only")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between batches")
    parser.add_argument("--warmup", type=int, default=16, help="batches before the freeze")
    parser.add_argument("--after", type=int, default=6, help="batches after the heal")
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--work", type=Path, help="directory for the peers (default: a temp)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--fault",
        choices=("partition", "freeze"),
        default="partition" if netns.available() else "freeze",
        help="cut globex off by a network partition (root) or by SIGSTOP",
    )
    args = parser.parse_args()
    if args.quick:
        args.bounds, args.partitions = [5.0], [10.0]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_dpc-"))
    keys = make_participants(work, ("acme", "globex"))
    trust = work / "trust"
    runs: list[dict[str, Any]] = []
    print(
        f"machine: {bc.machine_info()}  load average: {bc.load_average()}  fault: {args.fault}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:  # the peers stop, then the island goes
        island = stack.enter_context(Island()) if args.fault == "partition" else None
        cut = Cutoff(island, keys, trust)
        fed = LocalFederation(
            work,
            {
                "acme": [
                    *participant_args("acme", keys["acme"], trust), "--spark-master", "local[2]"
                ],
                "globex": [
                    *participant_args("globex", keys["globex"], trust),
                    "--spark-master", "local[1]", "--no-warm-up",
                ],
            },
            **cut.places("globex", ["acme"]),
        )  # fmt: skip
        stack.callback(fed.stop)
        fed.start(timeout_s=180)

        async def setup() -> None:
            async with cut.client("acme", fed.procs["acme"]) as c:
                async with asyncio.timeout(60):
                    while len((await c.status())["overlay"]["members"]) < 2:
                        await asyncio.sleep(0.2)
                await c.create_schema(partition_schema())

        asyncio.run(setup())
        n = 0
        for partition_s in args.partitions:
            for bound in args.bounds:
                n += 1
                run = asyncio.run(one_run(fed, cut, bound, partition_s, args, n))
                run["fault"] = args.fault
                run["load_average"] = bc.load_average()
                runs.append(run)
                print(json.dumps(run), flush=True)
    cols = (
        "bound_s",
        "partition_s",
        "reference_p50_s",
        "reference_max_s",
        "max_delay_s",
        "first_tentative_s",
        "tentative_tuples",
        "corrections",
        "heal_to_last_stable_s",
        "exact",
    )
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for run in runs:
        print("| " + " | ".join(str(run[c]) for c in cols) + " |")
    if args.json:
        args.json.write_text(json.dumps({"machine": bc.machine_info(), "runs": runs}, indent=2))
    return 0 if all(r["exact"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
