"""``peer demo``: start a real peer process, run a sample traffic query, check what comes out.

The peer is a separate ``peer join`` process with its own data directory and a local Spark
session. The demo creates a schema and a stream of car positions, submits a query (moving cars
only, then per road segment and minute the average speed and the car count), pushes generated
positions, subscribes to the results, and compares them tuple for tuple with the same
computation done in plain Python.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

POSITIONS = {
    "name": "car_position",
    "fields": [
        {"name": "car_id", "type": "int"},
        {"name": "seg", "type": "int"},
        {"name": "speed", "type": "double"},
        {"name": "ts", "type": "long"},
    ],
}

QUERY = """<query name="segment_stats">
  <box name="moving" type="filter">
    <input port="1" stream="positions"/>
    <output port="1" stream="moving_cars"/>
    <param name="expression.0" value="speed &gt; 0"/>
    <param name="pass-on-false-port" value="0"/>
  </box>
  <box name="per_minute" type="aggregate">
    <input port="1" stream="moving_cars"/>
    <output port="1" stream="segment_stats"/>
    <param name="aggregate-function.0" value="avg(speed)"/>
    <param name="aggregate-function-output-name.0" value="avg_speed"/>
    <param name="aggregate-function.1" value="count()"/>
    <param name="aggregate-function-output-name.1" value="cars"/>
    <param name="window-size-by" value="VALUES"/>
    <param name="window-size" value="60"/>
    <param name="advance" value="60"/>
    <param name="order-on-field" value="ts"/>
    <param name="group-by" value="seg"/>
    <param name="slack" value="0"/>
  </box>
</query>"""


def generate(tuples: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(tuples):
        moving = rng.random() > 0.2
        rows.append(
            {
                "car_id": rng.randrange(500),
                "seg": rng.randrange(10),
                "speed": round(rng.uniform(5, 120), 1) if moving else 0.0,
                "ts": i // 50,
            }
        )  # 50 positions a second, in event-time order
    return rows


def expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The same query in plain Python: windows the watermark (max ts) has passed."""
    watermark = max(r["ts"] for r in rows)
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in rows:
        if r["speed"] > 0:
            start = r["ts"] // 60 * 60
            groups[(start, r["seg"])].append(r["speed"])
    return sorted(
        (start, start + 60, seg, round(sum(v) / len(v), 6), len(v))
        for (start, seg), v in groups.items()
        if start + 60 <= watermark
    )


async def _demo(workdir: Path, tuples: int, console: Any) -> int:
    from peer.client import Client
    from peer.testing import PeerProcess, collect

    data_dir = workdir / "peer-data"
    console.print(f"[bold]starting a peer[/] (data in {data_dir}; Spark takes a few seconds)")
    peer = PeerProcess(data_dir, log_path=workdir / "peer.log")
    try:
        await asyncio.to_thread(peer.start, 180)
        console.print(f"peer ready on 127.0.0.1:{peer.port}")
        rows = generate(tuples)
        want = expected(rows)
        async with Client("127.0.0.1", peer.port, timeout_s=120) as client:
            await client.create_schema(POSITIONS)
            await client.create_stream("positions", "car_position")
            await client.create_query(QUERY)
            await client.start_query("segment_stats")
            console.print(
                "query [bold]segment_stats[/] running: moving cars -> per segment "
                "and minute: avg speed, car count"
            )
            started = time.monotonic()
            for i in range(0, len(rows), 5_000):
                part = rows[i : i + 5_000]
                await client.push(
                    "positions", {"columns": {k: [r[k] for r in part] for k in part[0]}}
                )
            console.print(f"pushed {len(rows)} positions in {time.monotonic() - started:.2f} s")
            results = await collect(client, "segment_stats", len(want), timeout_s=120)
            console.print(f"{len(results)} result tuples after {time.monotonic() - started:.1f} s")
        got = sorted(
            (r["window_start"], r["window_end"], r["seg"], round(r["avg_speed"], 6), r["cars"])
            for r in results
        )
        _show(console, got)
        ok = got == want
        console.print(
            f"[bold {'green' if ok else 'red'}]"
            f"{'MATCH' if ok else 'MISMATCH'}[/]: {len(got)} results vs {len(want)} "
            "computed independently in plain Python"
        )
        return 0 if ok else 1
    finally:
        await asyncio.to_thread(peer.stop, 30)


def _show(console: Any, rows: list[tuple[Any, ...]]) -> None:
    from rich.table import Table

    table = Table("window", "segment", "avg speed", "cars", title="segment_stats (first 12)")
    for start, end, seg, avg, cars in rows[:12]:
        table.add_row(f"[{start}, {end})", str(seg), f"{avg:.2f}", str(cars))
    console.print(table)


def run_demo(*, peers: int = 1, duration_s: float = 0.0, tuples: int = 20_000) -> int:
    from rich.console import Console

    console = Console()
    from peer.engine.java import find_java

    find_java()  # the same actionable message as `peer join`, before any process starts
    if peers != 1:
        console.print("error: this build runs the single-peer demo only (--peers 1)")
        return 2
    del duration_s  # the demo pushes a fixed amount of data
    with tempfile.TemporaryDirectory(prefix="fedstream-demo-") as tmp:
        return asyncio.run(_demo(Path(tmp), tuples, console))
