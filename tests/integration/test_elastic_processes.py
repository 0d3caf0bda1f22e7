"""An elastic participant as a user runs it (issue 28): ``peer join --elastic 1:3``.

One `peer join` process of participant acme, alone in the federation, offering half a core
(``--capacity 0.5``) with its own Spark (``local[1]``), runs three keyed windowed aggregates
over one stream, each in its own streaming query (``--no-lane``). The stream has one copy
(``--replicas 1``): a fragment does not move to a peer holding its input as a replica, and the
control plane would place replicas on the launched peers. A load ramp (batches pushed back to
back) overloads the peer. Its burst leader (itself) sizes the participant from the gossiped
figures and starts peers with the local provisioner: ``peer join --launched-as acme-eN``
processes in data directories beside its own. Its brain's balancer then moves fragments to
them, under no contract. The ramp ends; the leader shrinks the plan back to the one peer
started by hand, and the launched peers drain (their fragments moved back) and exit.

Checked: the plan grew to the MAX of three peers (never more launched processes than MAX - 1
at any look), fragments moved to launched peers, the plan shrank to none and every launched
process exited by itself, the leader's decisions are in ``peer status`` with their figures,
and every result stream equals plain Python over every acknowledged push.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from peer.client import Client
from peer.errors import FedstreamError
from peer.testing import (
    LocalFederation,
    collect,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
    make_participants,
    participant_args,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(1200)]

QUERIES = 3
FAST = ("--gossip-interval", "0.3", "--suspect-after", "3", "--dead-after", "8")


def batch(rng: random.Random, t: int, rows: int) -> dict[str, list[int]]:
    return {
        "k": [rng.randrange(8) for _ in range(rows)],
        "v": [rng.randrange(-10, 50) for _ in range(rows)],
        "t": [t + i * 2 // rows for i in range(rows)],
    }


def launched_pids(work: Path) -> dict[str, int]:
    """Launched peers alive now, by name (their launch.pid files under ``work``)."""
    alive = {}
    for pid_file in work.glob("*/launch.pid"):
        try:
            proc = psutil.Process(int(pid_file.read_text()))
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive[pid_file.parent.name] = proc.pid
        except (OSError, ValueError, psutil.Error):
            continue
    return alive


def kill_launched(work: Path) -> None:
    for pid in launched_pids(work).values():
        try:
            proc = psutil.Process(pid)
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.Error:
            continue


def test_an_elastic_participant_grows_to_max_under_a_ramp_and_shrinks_back(
    tmp_path: Path,
) -> None:
    keys = make_participants(tmp_path, ["acme"])
    args = {
        "acme1": [
            *participant_args("acme", keys["acme"], tmp_path / "trust"),
            "--elastic", "1:3",
            "--capacity", "0.5",
            "--bpm-period", "2",
            "--spark-master", "local[1]",
            "--http", "off",
            "--no-lane",
            "--replicas", "1",
            *FAST,
        ]
    }  # fmt: skip
    fed = LocalFederation(tmp_path, args)
    fed.start(timeout_s=240)
    try:
        asyncio.run(scenario(fed, tmp_path))
    finally:
        fed.stop(60)
        kill_launched(tmp_path)


async def scenario(fed: LocalFederation, work: Path) -> None:
    acme1 = fed.procs["acme1"]
    source = "ramp_in"
    queries = [
        keyed_window_query(f"ramp{i}", source, f"ramp_out{i}", at_least=5 * i)
        for i in range(QUERIES)
    ]
    async with Client("127.0.0.1", acme1.port, timeout_s=120) as cl:
        await cl.create_schema(keyed_window_schema("tick"))
        await cl.create_stream(source, "tick")
        for q in queries:
            await cl.create_query(q)
            await cl.start_query(q["name"])
    rng = random.Random(28)
    pushed: list[dict[str, list[int]]] = []
    most_launched = 0
    t = 0

    async def send(columns: dict[str, list[int]]) -> None:
        for _ in range(240):
            try:
                async with Client("127.0.0.1", acme1.port, timeout_s=60) as c:
                    await c.push(source, {"columns": columns}, producer="ramp", seq=len(pushed))
                pushed.append(columns)
                return
            except (FedstreamError, OSError, TimeoutError):
                await asyncio.sleep(0.5)
        raise AssertionError(f"batch {len(pushed)} was never acknowledged")

    async def status() -> dict[str, Any]:
        async with Client("127.0.0.1", acme1.port, timeout_s=30) as c:
            return (await c.status()).to_wire()

    def look() -> dict[str, int]:
        nonlocal most_launched
        alive = launched_pids(work)
        most_launched = max(most_launched, len(alive))
        return alive

    # the ramp: batches back to back until the plan holds MAX peers, both launched peers are
    # up, and a fragment has moved to one of them
    began = time.monotonic()
    while True:
        assert time.monotonic() - began < 420, "the participant never grew and spread its load"
        await send(batch(rng, t, 400))
        t += 2
        if len(pushed) % 10:
            continue
        alive = look()
        st = await status()
        elastic = st.get("elastic") or {}
        ledger = (st.get("brain") or {}).get("ledger", [])
        moved = [e for e in ledger if e["direction"] == "out" and e["ok"]]
        if len(elastic.get("launched", [])) == 2 and len(alive) == 2 and moved:
            break
    grew = [d for d in elastic["decisions"] if d["action"] == "grow"]
    assert grew and grew[-1]["size"] == 3 and grew[-1]["offered"] and grew[-1]["true_rate"]
    assert all(e["contract"] == "" and e["partner"] == "acme" for e in moved)

    # the ramp ends: a trickle keeps event time moving until the plan is back to one peer
    # and every launched process has drained and exited by itself
    ended = time.monotonic()
    while True:
        assert time.monotonic() - ended < 420, "the participant never shrank back"
        await send(batch(rng, t, 10))
        t += 2
        await asyncio.sleep(1.0)
        alive = look()
        elastic = (await status()).get("elastic") or {}
        if not elastic.get("launched") and not alive:
            break
    shrank = [d for d in elastic["decisions"] if d["action"] == "shrink"]
    assert shrank and shrank[-1]["size"] == 1
    assert most_launched <= 2
    for _ in range(5):
        await send(batch(rng, t, 50))
        t += 2
    await send({"k": [0], "v": [49], "t": [t + 100]})  # closes every window

    for i in range(QUERIES):
        want = keyed_window_sums(pushed, at_least=5 * i)
        async with Client("127.0.0.1", acme1.port, timeout_s=120) as c:
            rows = await collect(c, f"ramp_out{i}", sum(want.values()), timeout_s=240, settle_s=3)
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        assert got == want, f"ramp{i}"
