"""A query spread over three peers of three participants (separate `peer join` processes, each
with its own Spark), its fragments chained by mirrors; the middle peer is killed with SIGKILL
mid-stream and restarted on its data directory. The output equals plain Python: no loss, no
duplicate."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.keys import generate
from peer.client import Client
from peer.errors import FedstreamError
from peer.protocol.replies import CreateQueryReply
from peer.testing import (
    PeerProcess,
    collect,
    keyed_window_box,
    keyed_window_sums,
    members_alive,
    stream_name_on,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

SCHEMA = {
    "name": "tick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}
QUERY = {
    "name": "chain",
    "boxes": [
        {
            "name": "keep",
            "type": "filter",
            "node": "acme",
            "inputs": ["ticks"],
            "outputs": ["kept"],
            "params": {"expression.0": "v >= 0"},
        },
        {
            "name": "double",
            "type": "map",
            "node": "globex",
            "inputs": ["kept"],
            "outputs": ["doubled"],
            "params": {
                "expression.0": "k",
                "output-field-name.0": "k",
                "expression.1": "v * 2",
                "output-field-name.1": "v",
                "expression.2": "t",
                "output-field-name.2": "t",
            },
        },
        keyed_window_box("doubled", "chain_out", node="initech"),
    ],
}
BATCHES = 60
PARTICIPANTS = ("acme", "globex", "initech")
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")


def make_batches(seed: int = 9) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    batches, t = [], 0
    for _ in range(BATCHES):
        ts = []
        for _ in range(40):
            t += rng.randrange(0, 2)
            ts.append(t)
        batches.append(
            {
                "k": [rng.randrange(4) for _ in ts],
                "v": [rng.randrange(-10, 50) for _ in ts],
                "t": ts,
            }
        )
    last = batches[-1]["t"][-1]
    # closes every window: it must pass the filter, since each fragment's watermark comes
    # from the tuples that reach it
    batches.append({"k": [0], "v": [0], "t": [last + 100]})
    return batches


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[dict[str, PeerProcess]]:
    trust = tmp_path / "trust"
    trust.mkdir()
    keys = {}
    for name in PARTICIPANTS:
        key, pub = generate(name, tmp_path / "keys")
        (trust / pub.name).write_bytes(pub.read_bytes())
        keys[name] = key
    started: dict[str, PeerProcess] = {}
    try:
        for name in PARTICIPANTS:
            extra = ["--bootstrap", started["acme"].overlay_addr] if started else []
            p = PeerProcess(
                tmp_path / name,
                "--participant",
                name,
                "--key",
                str(keys[name]),
                "--trust",
                str(trust),
                "--spark-master",
                "local[1]",
                *FAST,
                *extra,
            )
            started[name] = p.launch()
            if name == "acme":
                p.wait_ready()
        for p in started.values():
            p.wait_ready()
        yield started
    finally:
        for p in started.values():
            p.stop(60)


async def push_all(
    stream: str,
    ports: list[int],
    batches: list[dict[str, list[int]]],
    first: int,
    stop_after: int,
) -> int:
    """Push batches[first:stop_after] (seq = index) through random peers, retrying each until
    it is acknowledged; returns the index after the last acknowledged one."""
    rng = random.Random(first)
    for i in range(first, stop_after):
        for _attempt in range(60):
            try:
                async with Client("127.0.0.1", rng.choice(ports), timeout_s=60) as c:
                    await c.push(stream, {"columns": batches[i]}, producer="pusher", seq=i)
                break
            except (FedstreamError, OSError, TimeoutError):
                await asyncio.sleep(1.0)
        else:
            raise AssertionError(f"batch {i} was never acknowledged")
        await asyncio.sleep(0.02)
    return stop_after


def test_three_peer_chain_survives_kill_9_of_the_middle_peer(
    peers: dict[str, PeerProcess],
) -> None:
    t0 = time.monotonic()
    batches = make_batches()
    want = keyed_window_sums(batches, scale=2)
    a, b, c = peers["acme"], peers["globex"], peers["initech"]

    # the source stream lives on acme, so that the kill of globex moves no stream
    ids = [bytes.fromhex(p.node_id) for p in (a, b, c)]
    source = stream_name_on(ids[0], ids, "ticks")
    query = json.loads(json.dumps(QUERY).replace('"ticks"', json.dumps(source)))

    async def phase_one() -> CreateQueryReply:
        async with Client("127.0.0.1", a.port, timeout_s=120) as cl:
            await members_alive(cl, 3, timeout_s=60)
            await cl.create_schema(SCHEMA)
            await cl.create_stream(source, "tick")
            made = await cl.create_query(query)
            await cl.start_query("chain")
        await push_all(source, [a.port, c.port], batches, 0, BATCHES // 3)
        async with Client("127.0.0.1", c.port, timeout_s=120) as cl:
            first = await collect(cl, "chain_out", 1, timeout_s=180)
            assert first, "no result before the kill: the chain never ran"
        return made

    made = asyncio.run(phase_one())
    print("phase one done", time.monotonic() - t0, flush=True)
    sites = {f["site"] for f in made["fragments"]}
    assert sites == {a.node_id, b.node_id, c.node_id}  # one fragment on each peer

    async def during_kill() -> int:
        pusher = asyncio.create_task(
            push_all(source, [a.port, c.port], batches, BATCHES // 3, BATCHES)
        )
        await asyncio.sleep(1.5)
        b.kill()
        await asyncio.sleep(3)
        return await asyncio.wait_for(pusher, 600)

    asyncio.run(during_kill())
    print("pushed through the kill", time.monotonic() - t0, flush=True)
    b.start()
    print("restarted", time.monotonic() - t0, flush=True)

    async def phase_two() -> list[dict[str, Any]]:
        await push_all(source, [a.port, b.port, c.port], batches, BATCHES, len(batches))
        async with Client("127.0.0.1", c.port, timeout_s=120) as cl:
            rows: list[dict[str, Any]] = await collect(
                cl, "chain_out", sum(want.values()), timeout_s=300, settle_s=5
            )
            return rows

    rows = asyncio.run(phase_two())
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    if got != want:
        print(asyncio.run(statuses([a, b, c])))
    assert got == want


async def statuses(peers: list[PeerProcess]) -> list[Any]:
    out = []
    for p in peers:
        async with Client("127.0.0.1", p.port, timeout_s=30) as cl:
            s = await cl.status()
            out.append(
                {k: s.get(k) for k in ("hosted", "replicas", "mirrors", "queries", "streams")}
            )
    return out
