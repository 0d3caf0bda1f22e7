"""``peer demo --partition``: a participant cut off, tentative tolls, then the corrections.

Two participants, acme and globex, each run a ``peer join`` process (acme with a one-core
Spark session, globex without: it hosts its stream). acme runs the workload of
:mod:`peer.examples.partition`: the union of acme's and globex's car reports into a 10 s
tumbling toll window per road segment, with an availability bound of 5 s. Both push a batch
of five seconds of reports every second; then globex's peer is frozen (SIGSTOP) for
``--duration`` seconds (default 30) while acme's pushes go on, and thawed (SIGCONT), and its
producer sends what it held back.

Meanwhile the demo subscribes to the toll windows with ``tentative`` and prints each as it
comes: stable ones, TENTATIVE ones (computed without globex) and the UNDO that takes them
back once globex is back, followed by the corrected ones. At the end it checks the stable
windows, and what a tentative reader holds after the undos, against plain Python over every
report, stops the peers and exits 0 only if both match.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from peer.examples.partition import (
    partition_query,
    partition_reference,
    partition_schema,
    reports,
    window_key,
)
from peer.testing.cluster import (
    LocalFederation,
    make_participants,
    participant_args,
    stream_name_on,
)

BOUND_S = 5.0
STEP = 5  # seconds of event time per pushed batch


def run_partition(*, freeze_s: float | None = None, keep: bool = False) -> int:
    from rich.console import Console

    console = Console()
    freeze = 30.0 if freeze_s is None else freeze_s
    work = Path(tempfile.mkdtemp(prefix="fedstream-partition-"))
    keys = make_participants(work, ("acme", "globex"))
    trust = work / "trust"
    fed = LocalFederation(
        work,
        {
            "acme": [*participant_args("acme", keys["acme"], trust), "--spark-master", "local[1]"],
            "globex": [*participant_args("globex", keys["globex"], trust), "--no-engine"],
        },
    )
    try:
        console.print(f"starting acme and globex (work directory {work}) ...")
        fed.start(timeout_s=180)
        return asyncio.run(_run(fed, console, freeze))
    finally:
        fed.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


async def _run(fed: LocalFederation, console: Any, freeze_s: float) -> int:
    from peer.client import Client

    acme, globex = fed.procs["acme"], fed.procs["globex"]
    ids = [bytes.fromhex(acme.node_id), bytes.fromhex(globex.node_id)]
    mine = stream_name_on(ids[0], ids, "cars_acme")
    theirs = stream_name_on(ids[1], ids, "cars_globex")
    pushed: list[dict[str, Any]] = []
    stable: list[tuple[int, ...]] = []
    tentative: list[tuple[int, ...]] = []
    undone = 0
    started = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.1f} s[/dim]  {text}")

    async with (
        Client("127.0.0.1", acme.port, timeout_s=120) as at_acme,
        Client("127.0.0.1", globex.port, timeout_s=120) as at_globex,
    ):
        async with asyncio.timeout(60):
            while len((await at_acme.status()).extra["overlay"]["members"]) < 2:
                await asyncio.sleep(0.2)
        await at_acme.create_schema(partition_schema())
        await at_acme.create_stream(mine, "report")
        await at_acme.create_stream(theirs, "report")
        await at_acme.create_query(
            partition_query("tolls", mine, theirs, bound_s=BOUND_S, node="acme")
        )
        await at_acme.start_query("tolls")
        say(f"tolls over {mine} (acme) and {theirs} (globex), availability bound {BOUND_S:g} s")

        async def watch() -> None:
            nonlocal undone
            async with await at_acme.subscribe("tolls_out", "earliest", tentative=True) as sub:
                async for batch in sub:
                    if batch.undo is not None:
                        undone += len(tentative)
                        say(f"[bold red]UNDO[/bold red] {len(tentative)} tentative windows")
                        tentative.clear()
                        continue
                    for row in batch.rows():
                        key = window_key(row)
                        if batch.status == "tentative":
                            tentative.append(key)
                            mark = "[bold yellow]TENTATIVE[/bold yellow]"
                        else:
                            stable.append(key)
                            mark = "[green]stable[/green]   "
                        say(
                            f"{mark} toll window [{key[0]}, {key[1]}) segment {key[2]}: "
                            f"total {key[3]} over {key[4]} cars"
                        )

        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(watch())

            async def push(client: Client, stream: str, first: int, last: int, origin: int) -> None:
                rows = reports(first, last, origin)
                await client.push(stream, rows)
                pushed.extend(rows)

            t = 0
            for _ in range(15):
                await push(at_acme, mine, t, t + STEP, 1)
                await push(at_globex, theirs, t, t + STEP, 2)
                t += STEP
                await asyncio.sleep(1.0)
            held = t
            assert globex.proc is not None
            os.killpg(globex.proc.pid, signal.SIGSTOP)
            say(f"[bold]globex frozen (SIGSTOP) for {freeze_s:g} s[/bold]; acme goes on")
            frozen = time.monotonic()
            try:
                while time.monotonic() - frozen < freeze_s:
                    await push(at_acme, mine, t, t + STEP, 1)
                    t += STEP
                    await asyncio.sleep(1.0)
            finally:
                os.killpg(globex.proc.pid, signal.SIGCONT)
            say("[bold]globex thawed (SIGCONT)[/bold]; it sends what it held back")
            await push(at_globex, theirs, held, t, 2)
            for _ in range(10):
                await push(at_acme, mine, t, t + STEP, 1)
                await push(at_globex, theirs, t, t + STEP, 2)
                t += STEP
                await asyncio.sleep(1.0)
            want = partition_reference(pushed, t - 1)
            deadline = time.monotonic() + 120
            while Counter(stable) != want and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(2.0)
            watcher.cancel()
    exact = Counter(stable) == want and not tentative
    verdict = "[bold green]MATCH[/bold green]" if exact else "[bold red]MISMATCH[/bold red]"
    console.print(
        f"{verdict}: {len(stable)} stable toll windows against plain Python's "
        f"{sum(want.values())}; {undone} tentative windows taken back, "
        f"{len(tentative)} left open"
    )
    return 0 if exact else 1
