#!/usr/bin/env python3
"""How long a fragment stops when it moves to another peer, with plain Spark's own
stop-and-restart-from-checkpoint measured beside it in the same run.

Two peers (participants alpha and beta, one signed contract) run in this process on one Spark
session, with real peer links and spools. For each backlog size K, a filter + windowed aggregate
runs on alpha over a stream alpha hosts; after a warm-up, K batches are pushed at once and the
fragment moves to beta at once, so K batches of uncommitted input travel with it. Measured:

* pause: from the fragment's stop on alpha until beta says it runs again (peer.move's figure);
* to first output: from the start of the move until beta appends the fragment's first result
  after it (the spool's append stamp);
* bytes shipped (checkpoint + uncommitted input + the result spool), and whether the output of
  the whole run equals plain Python.

The reference is plain Spark Structured Streaming on the same query and data (the same batches
as Parquet files, ``maxFilesPerTrigger=1``, a ``foreachBatch`` sink): with K files unread it
stops the query, copies its checkpoint to a new directory (what a move must ship at least) and
starts the query again from the copy; measured the same way (until the new query runs; until
its first batch with output completes).

With ``--placements own lane`` the same moves run twice over, on two pairs of peers: the
fragment in its own streaming query, and as a member of the shared lane (issue 28: the lane
holds at a batch boundary instead of stopping, and the member's windows travel instead of a
checkpoint).

    .venv/bin/python scripts/bench_move.py                 # K = 0, 100, 400; 3 runs each
    .venv/bin/python scripts/bench_move.py --backlogs 0 --runs 1   # a quick look
    .venv/bin/python scripts/bench_move.py --placements own lane   # lane members beside
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import jsonable

ROWS = 1000
WARM = 20
SCHEMA = {
    "name": "btick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}


def make_batches(n: int, first_t: int, seed: int) -> list[dict[str, list[int]]]:
    import random

    rng = random.Random(seed)
    out, t = [], first_t
    for _ in range(n):
        ts = []
        for _ in range(ROWS):
            t += 1 if rng.random() < 0.02 else 0
            ts.append(t)
        out.append(
            {
                "k": [rng.randrange(8) for _ in ts],
                "v": [rng.randrange(-10, 50) for _ in ts],
                "t": ts,
            }
        )
    return out


def reference(batches: list[dict[str, list[int]]]) -> Counter[tuple[int, ...]]:
    from peer.testing import keyed_window_sums

    return keyed_window_sums(batches)


def query(name: str, source: str, out: str) -> dict[str, Any]:
    from peer.testing import keyed_window_query

    return keyed_window_query(name, source, out, site="alpha")


# -- fedstream: a move between two peers --------------------------------------------------------


def start_pair(work: Path, spark: Any, *, lane: bool = False) -> tuple[Any, Any, str]:
    from peer.node import PeerConfig
    from peer.testing import PeerThread, signed_contracts

    keys, ids = signed_contracts(work, [("alpha", "beta", 2.0)])
    peers = []
    for name in ("alpha", "beta"):
        bootstrap = []
        if peers:
            bootstrap = [("127.0.0.1", peers[0].peer.overlay.port)]
        config = PeerConfig(
            data_dir=work / name,
            port=0,
            participant=name,
            key_path=keys[name],
            contracts_dir=work / "contracts",
            bootstrap=bootstrap,
            brain=False,
            gossip_interval_s=0.3,
            fuse_stateless=lane,  # the aggregate in the shared lane, or in a query of its own
            lane_after=0,
        )
        peers.append(PeerThread(config, spark).__enter__())
    return peers[0], peers[1], ids[("alpha", "beta")]


async def push_all(port: int, stream: str, batches: list[dict[str, list[int]]], first: int) -> None:
    from peer.client import Client

    async with Client("127.0.0.1", port, timeout_s=120) as c:
        for i, columns in enumerate(batches, first):
            await c.push(stream, {"columns": columns}, producer="bench", seq=i)


def ours_once(a: Any, b: Any, contract: str, run: int, backlog: int) -> dict[str, Any]:
    from overlay.membership import stream_target
    from peer.client import Client
    from peer.testing import collect

    a_id, b_id = a.peer.overlay.node_id, b.peer.overlay.node_id

    def closest(name: str) -> bytes:
        t = int.from_bytes(stream_target(name), "big")
        return min((a_id, b_id), key=lambda n: int.from_bytes(n, "big") ^ t)

    source = next(f"bsrc{run}_{i}" for i in range(10_000) if closest(f"bsrc{run}_{i}") == a_id)
    name, out = f"bq{run}", f"bout{run}"
    warm = make_batches(WARM, 0, seed=run)
    burst = make_batches(backlog, warm[-1]["t"][-1], seed=1000 + run)
    closing = [{"k": [0], "v": [1], "t": [(burst or warm)[-1]["t"][-1] + 100]}]
    want = reference(warm + burst + closing)

    async def scenario() -> dict[str, Any]:
        async with Client("127.0.0.1", a.port, timeout_s=120) as cl:
            await cl.create_stream(source, "btick")
            await cl.create_query(query(name, source, out))
            await cl.start_query(name)
        await push_all(a.port, source, warm, 0)
        async with Client("127.0.0.1", a.port, timeout_s=120) as cl:
            await collect(cl, out, 1, timeout_s=120)
        await push_all(a.port, source, burst, WARM)
        before = a.peer.site.spools.get(out).latest
        started_ns = time.time_ns()
        loop = asyncio.get_running_loop()
        moved = await loop.run_in_executor(
            None, lambda: a.call(a.peer.move_fragment(name, b_id, contract=contract), 600)
        )
        spool = b.peer.site.spools.get(out)
        first_out = None
        deadline = time.monotonic() + (120 if backlog else 0)  # no backlog: nothing to emit
        while time.monotonic() < deadline:
            if spool.latest > before:
                first_out = (spool.append_time_ns(before + 1) - started_ns) / 1e9
                break
            await asyncio.sleep(0.01)
        await push_all(b.port, source, closing, WARM + backlog)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            rows = await collect(cl, out, sum(want.values()), timeout_s=300, settle_s=2)
        async with Client("127.0.0.1", a.port, timeout_s=120) as cl:  # alpha owns the query
            await cl.set_query_status(name, "DELETED")
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        return {
            "pause_s": moved["pause_s"],
            "resume_s": moved.get("resume_s"),
            "first_output_s": first_out,
            "bytes": moved["bytes"],
            "exact": got == want,
        }

    return asyncio.run(scenario())


# -- the reference: plain Spark stop, copy the checkpoint, restart ------------------------------


def reference_once(spark: Any, work: Path, run: int, backlog: int) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    src = work / f"ref{run}" / "in"
    src.mkdir(parents=True)
    warm = make_batches(WARM, 0, seed=run)
    burst = make_batches(backlog, warm[-1]["t"][-1], seed=1000 + run)
    for i, b in enumerate(warm):
        pq.write_table(pa.table(b), src / f"{i:06d}.parquet")
    ddl = "k BIGINT, v BIGINT, t BIGINT"  # what pyarrow writes for Python ints
    done = threading.Event()
    batches_with_rows: list[float] = []

    def sink(df: Any, batch_id: int) -> None:
        if df.count() > 0:
            batches_with_rows.append(time.monotonic())
        done.set()

    def start(checkpoint: Path) -> Any:
        frame = (
            spark.readStream.schema(ddl)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(src))
            .where("v >= 0")
            .withColumn("ts", F.timestamp_seconds("t"))
            .withWatermark("ts", "0 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.sum("v").alias("s"), F.count(F.lit(1)).alias("n"))
        )
        return (
            frame.writeStream.option("checkpointLocation", str(checkpoint))
            .outputMode("append")
            .trigger(processingTime="0 seconds")
            .foreachBatch(sink)
            .start()
        )

    first_cp, second_cp = work / f"ref{run}" / "cp1", work / f"ref{run}" / "cp2"
    handle = start(first_cp)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and handle.lastProgress is None:
        time.sleep(0.05)
    handle.processAllAvailable()
    for i, b in enumerate(burst, WARM):
        pq.write_table(pa.table(b), src / f"{i:06d}.parquet")
    began = time.monotonic()
    handle.stop()
    shutil.copytree(first_cp, second_cp)
    batches_with_rows.clear()
    handle = start(second_cp)
    restarted = time.monotonic() - began
    deadline = time.monotonic() + (120 if backlog else 0)
    while time.monotonic() < deadline and not batches_with_rows:
        time.sleep(0.005)
    first = batches_with_rows[0] - began if batches_with_rows else None
    handle.stop()
    size = sum(p.stat().st_size for p in second_cp.rglob("*") if p.is_file())
    return {"restart_s": restarted, "first_output_s": first, "checkpoint_bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlogs", type=int, nargs="+", default=[0, 100, 400])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--placements",
        nargs="+",
        choices=["own", "lane"],
        default=["own"],
        help="where the moving aggregate runs: its own streaming query, the shared lane, or both",
    )
    args = parser.parse_args()

    from peer.engine.session import build_session
    from peer.engine.source import register_sources

    work = Path(tempfile.mkdtemp(prefix="fedstream-bench-move-"))
    spark = build_session(master="local[2]", app_name="bench-move", warehouse_dir=str(work / "wh"))
    register_sources(spark)
    results: dict[str, Any] = {"ours": [], "reference": []}
    pairs: dict[str, tuple[Any, Any, str]] = {}
    try:
        for placement in args.placements:
            pairs[placement] = start_pair(work / placement, spark, lane=placement == "lane")
            asyncio.run(_schema(pairs[placement][0].port))
        run = 0
        for backlog in args.backlogs:
            for _ in range(args.runs):
                for placement, (a, b, contract) in pairs.items():  # taking turns
                    run += 1
                    ours = ours_once(a, b, contract, run, backlog)
                    results["ours"].append({"backlog": backlog, "placement": placement, **ours})
                    line = {"backlog": backlog, "placement": placement, "ours": ours}
                    print(json.dumps(line), flush=True)
                ref = reference_once(spark, work, run, backlog)
                results["reference"].append({"backlog": backlog, **ref})
                print(json.dumps({"backlog": backlog, "reference": ref}), flush=True)
    finally:
        for a, b, _ in pairs.values():
            b.close()
            a.close()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(jsonable(results), indent=1))
    print_table(results, args.backlogs, args.placements)
    return 0


async def _schema(port: int) -> None:
    from peer.client import Client

    async with Client("127.0.0.1", port, timeout_s=120) as c:
        async with asyncio.timeout(60):
            while len((await c.status())["overlay"]["members"]) < 2:
                await asyncio.sleep(0.2)
        await c.create_schema(SCHEMA)


def print_table(results: dict[str, Any], backlogs: list[int], placements: list[str]) -> None:
    def med(rows: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in rows if r.get(key) is not None]
        return f"{statistics.median(values):.3f}" if values else "-"

    print(
        "| backlog (batches of 1,000) | placement | ours: pause s | ours: to first output s "
        "| ours: bytes | exact | Spark: stop+copy+restart s | Spark: to first output s "
        "| Spark: checkpoint bytes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for k in backlogs:
        ref = [r for r in results["reference"] if r["backlog"] == k]
        for placement in placements:
            ours = [r for r in results["ours"] if r["backlog"] == k and r["placement"] == placement]
            exact = sum(1 for r in ours if r["exact"])
            print(
                f"| {k} | {placement} | {med(ours, 'pause_s')} | {med(ours, 'first_output_s')} | "
                f"{med(ours, 'bytes').split('.')[0]} | {exact}/{len(ours)} | "
                f"{med(ref, 'restart_s')} | {med(ref, 'first_output_s')} | "
                f"{med(ref, 'checkpoint_bytes').split('.')[0]} |"
            )


if __name__ == "__main__":
    raise SystemExit(main())
