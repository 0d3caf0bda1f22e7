#!/usr/bin/env python3
"""What the lane's driver collects per micro-batch, with the windowed members' pre-aggregation
in the executors (``partials``) and without it (``rows``: the driver takes the members' input
rows and aggregates them, the lane before), side by side in one run.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_lane_collect.py                       # 3 points, ~10 min
    .venv/bin/python scripts/bench_lane_collect.py --points 20000:100 --seconds 20

What runs
---------
One local Spark session (``peer.engine.session.build_session``, ``--master``), and per point
and mode a fresh ``peer.engine.lane.Lane`` over its own spools, with ``--members`` windowed
aggregate queries on one input stream (a filter that passes every tuple, then a tumbling
``--window-s`` window grouped by ``k``: count(), sum(v), avg(v), min(v), max(v)). A writer
thread appends the input to the spool every 0.1 s at the point's rate: tuple i has event time
1000 + i / rate seconds, ``k = i mod groups``, and v from a seeded generator, so both modes
get the same tuples. After ``--warmup-s`` and at least 3 lane batches the script samples
every lane batch for ``--seconds``: the Arrow bytes and rows the driver collected
(``Lane.collected_bytes``, the ``nbytes`` of the table ``toArrow`` returned), the batch's
seconds and its collect phase.
Input rows per batch: the rows appended while measuring over the batches run. Both modes'
emitted windows are compared where both closed them (they must be equal).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from peer.engine.lane import Lane
from peer.engine.lane_source import register_lane_source
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema, to_arrow_schema
from peer.storage.spool import SpoolSet

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

EV = Schema("ev", (Field("t", "double"), Field("k", "int"), Field("v", "long")))
FUNCTIONS = ["count()", "sum(v)", "avg(v)", "min(v)", "max(v)"]
PIECE_S = 0.1


def member(name: str, window_s: float) -> CheckedQuery:
    params = {
        "window-size-by": "VALUES",
        "order-on-field": "t",
        "window-size": str(window_s),
        "slack": "1",
        "group-by": "k",
    }
    for i, call in enumerate(FUNCTIONS):
        params[f"aggregate-function.{i}"] = call
        params[f"aggregate-function-output-name.{i}"] = f"a{i}"
    spelled = {
        "name": name,
        "boxes": [
            {
                "name": "f",
                "type": "filter",
                "inputs": ["ev"],
                "outputs": [f"{name}_f"],
                "params": {"expression.0": "v >= 0"},
            },
            {
                "name": "w",
                "type": "aggregate",
                "inputs": [f"{name}_f"],
                "outputs": [f"{name}_out"],
                "params": params,
            },
        ],
    }
    return check_query(parse_query(spelled), {"ev": EV})


class Writer(threading.Thread):
    """Appends the point's input every 0.1 s, paced by the wall clock."""

    def __init__(self, spools: SpoolSet, rate: int, groups: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.spools, self.rate, self.groups = spools, rate, groups
        self.rng = np.random.default_rng(seed)
        self.stop = threading.Event()
        self.appended = 0

    def run(self) -> None:
        schema = to_arrow_schema(EV)
        per_piece = max(1, round(self.rate * PIECE_S))
        start = time.monotonic()
        n = 0
        while not self.stop.is_set():
            i = np.arange(n, n + per_piece)
            table = pa.table(
                {
                    "t": pa.array(1000.0 + i / self.rate, pa.float64()),
                    "k": pa.array(i % self.groups, pa.int32()),
                    "v": pa.array(self.rng.integers(0, 1000, per_piece), pa.int64()),
                },
                schema=schema,
            )
            self.spools.get("ev").append(table)
            n += per_piece
            self.appended = n
            self.stop.wait(max(0.0, start + n / self.rate - time.monotonic()))


def run_mode(
    spark: Any, work: Path, args: argparse.Namespace, rate: int, groups: int, mode: str
) -> dict[str, Any]:
    root = work / f"{mode}-{rate}-{groups}"
    spools = SpoolSet(root / "spools", fsync=False)
    spools.create("ev", to_arrow_schema(EV))
    members = [member(f"m{j}", args.window_s) for j in range(args.members)]
    for q in members:
        for out in q.outputs:
            spools.create(out, to_arrow_schema(q.stream_schemas[out]))
    lane = Lane(
        spools,
        root / "lane",
        name=f"bench_lane_{mode}_{rate}_{groups}",
        trigger_s=args.trigger_s,
        max_rows=args.max_rows,
        preaggregate=mode == "partials",
    )
    for q in members:
        lane.add(spark, q, "1", resume=True)
    writer = Writer(spools, rate, groups, seed=rate * 7919 + groups)
    writer.start()
    samples: list[dict[str, float]] = []
    try:
        # Warm-up: the first batches start Spark's Python workers and plan the statement.
        time.sleep(args.warmup_s)
        ready = time.monotonic() + 300
        while lane.batches < 3 and time.monotonic() < ready:
            time.sleep(0.1)
        seen, first_rows, first_batches = lane.batches, writer.appended, lane.batches
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            failure = lane.failure()
            if failure is not None:
                raise RuntimeError(f"lane failed: {failure}")
            if lane.batches != seen:
                if lane.batches == seen + 1:  # one batch since the last look: its own figures
                    samples.append(
                        {
                            "bytes": lane.collected_bytes,
                            "rows": lane.collected_rows,
                            "batch_s": lane.last_batch_s,
                            "collect_s": lane.phase_s.get("collect", float("nan")),
                        }
                    )
                seen = lane.batches
            time.sleep(0.02)
        batches = lane.batches - first_batches
        input_rows = writer.appended - first_rows
    finally:
        writer.stop.set()
        writer.join(timeout=10)
        lane.stop(release=True)
    outputs = {}
    for q in members:
        spool = spools.get(q.outputs[0])
        outputs[q.query.name] = [
            tuple(r.values()) for _, t in spool.read(-1, spool.latest) for r in t.to_pylist()
        ]

    def col(name: str) -> np.ndarray:
        return np.array([s[name] for s in samples], dtype=float)

    return {
        "mode": mode,
        "rate": rate,
        "groups": groups,
        "members": args.members,
        "batches": batches,
        "sampled": len(samples),
        "input_rows_per_batch": input_rows / batches if batches else float("nan"),
        "rows_p50": bc.quantile(col("rows"), 0.5),
        "bytes_p50": bc.quantile(col("bytes"), 0.5),
        "bytes_max": float(col("bytes").max()) if samples else float("nan"),
        "batch_s_p50": bc.quantile(col("batch_s"), 0.5),
        "collect_s_p50": bc.quantile(col("collect_s"), 0.5),
        "outputs": outputs,
    }


def same_windows(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Both modes' windows, where both closed them, are the same (floats to 9 places)."""
    for name, rows_a in a["outputs"].items():
        rows_b = b["outputs"][name]
        if not rows_a or not rows_b:
            continue
        closed = min(max(r[1] for r in rows_a), max(r[1] for r in rows_b))

        def norm(rows: list[tuple[Any, ...]], upto: float = closed) -> list[tuple[Any, ...]]:
            kept = [r for r in rows if r[1] <= upto]
            return sorted(
                tuple(round(x, 9) if isinstance(x, float) else x for x in r) for r in kept
            )

        if norm(rows_a) != norm(rows_b):
            return False
    return True


def report(results: dict[str, Any]) -> str:
    rows = []
    for r in results["runs"]:
        rows.append(
            [
                f"{r['rate']:,}",
                str(r["groups"]),
                str(r["members"]),
                r["mode"],
                f"{r['batches']} ({r['sampled']})",
                f"{r['input_rows_per_batch']:,.0f}",
                f"{r['rows_p50']:,.0f}",
                f"{r['bytes_p50'] / 1024:,.1f} / {r['bytes_max'] / 1024:,.1f}",
                f"{r['batch_s_p50']:.3f}",
                f"{r['collect_s_p50']:.3f}",
            ]
        )
    table = bc.md_table(
        [
            "input tuples/s",
            "groups",
            "members",
            "mode",
            "batches (sampled)",
            "input rows/batch",
            "collected rows/batch p50",
            "collected KiB/batch p50 / max",
            "batch s p50",
            "collect s p50",
        ],
        rows,
    )
    checks = [
        f"- {p}: the windows both modes closed are {'the same' if ok else 'DIFFERENT'}"
        for p, ok in results["same"].items()
    ]
    return "\n".join([*bc.header(results), table, "", *checks])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--points",
        default="2000:10,20000:10,20000:1000",
        help="comma-separated RATE:GROUPS (input tuples/s, distinct k)",
    )
    parser.add_argument("--members", type=int, default=1, help="windowed member queries")
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=25.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured per mode")
    parser.add_argument("--trigger-s", type=float, default=1.0)
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]

    from peer.engine.session import build_session

    results = bc.new_results("bench_lane_collect.py")
    started = time.monotonic()
    spark = build_session(master=args.master, app_name="bench-lane-collect")
    register_lane_source(spark)
    work = Path(tempfile.mkdtemp(prefix="bench-lane-collect-"))
    runs, same = [], {}
    try:
        for n, (rate, groups) in enumerate(points):
            # Alternate which mode goes first, so that a trend in the machine's load shows.
            order = ["rows", "partials"] if n % 2 == 0 else ["partials", "rows"]
            done = {}
            for mode in order:
                print(f"{rate} tuples/s, {groups} groups: {mode}", flush=True)
                done[mode] = run_mode(spark, work, args, rate, groups, mode)
            same[f"{rate}:{groups}"] = same_windows(done["rows"], done["partials"])
            runs += [done["rows"], done["partials"]]
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    results.update(
        runs=[{k: v for k, v in r.items() if k != "outputs"} for r in runs],
        same=same,
        load_after=bc.load_average(),
        elapsed_s=time.monotonic() - started,
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    print("\n" + report(results))


if __name__ == "__main__":
    random.seed(0)
    main()
