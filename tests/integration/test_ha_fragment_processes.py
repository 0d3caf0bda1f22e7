"""A windowed aggregate whose peer is killed with -9 fails over (real `peer join` processes).

Five peers: three run Spark and hold the control plane's seats, two run no engine (so a
stream's three replicas are the three engine peers). A stream with three replicas feeds a
keyed 10 s tumbling window; the query runs on the stream's primary, its result stream and
checkpoint stream replicated with the stream and anchored to it. Batches go through random
peers under one producer id, retried with the same (producer, seq) after a retriable refusal.
Mid-stream the primary (the aggregate's peer, with its JVM) is killed with SIGKILL. A survivor
takes the stream, the result stream and the checkpoint over and resumes the aggregate; the
result stream, read from the earliest offset, equals plain Python: no window lost, none twice.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.protocol.replies import CreateStreamReply, LookupReply
from peer.testing import (
    LocalFederation,
    collect,
    keyed_window_batches,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
    make_participants,
    member_states,
    participant_args,
    wait_until,
)
from peer.testing.push import push_anywhere

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]

NAMES = ("hf1", "hf2", "hf3", "hf4", "hf5")
ENGINES = NAMES[:3]
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")
SCHEMA = keyed_window_schema()
STREAM, OUT = "hf_ticks", "hf_out"
QUERY = keyed_window_query("hf", STREAM, OUT, kept="hf_kept")
BATCHES, PER_BATCH = 60, 100


def make_batches() -> list[dict[str, list[int]]]:
    return keyed_window_batches(23, BATCHES, PER_BATCH, keys=5, values=(0, 60))


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LocalFederation]:
    keys = make_participants(tmp_path, NAMES)
    args = {
        name: [
            *participant_args(name, keys[name], tmp_path / "trust"),
            *FAST,
            *(["--voter"] if name in ENGINES else ["--no-engine"]),
        ]
        for name in NAMES
    }
    fed = LocalFederation(tmp_path, args)
    try:
        fed.start(timeout_s=240)
        yield fed
    finally:
        fed.stop()


async def push(ports: list[int], batches: list[dict[str, list[int]]], seqs: range) -> None:
    await push_anywhere(ports, STREAM, batches, seqs, producer="hf")


def test_kill_9_of_an_aggregates_peer_keeps_its_output_exact(
    federation: LocalFederation,
) -> None:
    procs = federation.procs
    by_node = {p.node_id: p for p in procs.values()}
    batches = make_batches()
    want = keyed_window_sums(batches)
    first = procs[NAMES[0]]

    async def setup() -> CreateStreamReply:
        async def ready() -> bool:
            for p in procs.values():
                async with Client("127.0.0.1", p.port, timeout_s=10) as c:
                    status = await c.status()
                alive = member_states(status)["alive"]
                if alive < len(NAMES) or len(status["replication"]["voters"]) < 3:
                    return False
            return True

        await wait_until(ready, "five live members that all know three voters", 120, every_s=0.3)
        async with Client("127.0.0.1", first.port, timeout_s=60) as c:
            await c.create_schema(SCHEMA)
            created = await c.create_stream(STREAM, "tick", replicas=3)
        # The query is created through the peer that will be killed: its definition must
        # outlive its publisher (the query: record carries it).
        async with Client("127.0.0.1", by_node[created["primary"]].port, timeout_s=60) as c:
            await c.create_query(QUERY)
            await c.start_query("hf")
            placed = await c.lookup_object(OUT)
        assert placed["primary"]["node"] == created["primary"], "the query is not on its input"
        assert sorted(r["node"] for r in placed["replicas"]) == sorted(created["replicas"])
        return created

    created = asyncio.run(setup())
    victim = by_node[created["primary"]]
    survivors = [p for p in procs.values() if p is not victim]
    ports = [p.port for p in procs.values()]

    async def through_the_kill() -> None:
        await push(ports, batches, range(0, 20))
        async with Client("127.0.0.1", victim.port, timeout_s=60) as c:
            assert await collect(c, OUT, 1, timeout_s=180), "no window before the kill"
        task = asyncio.create_task(push(ports, batches, range(20, 40)))
        await asyncio.sleep(random.Random(4).uniform(0.3, 0.8))
        await asyncio.to_thread(victim.kill)
        await asyncio.wait_for(task, 300)
        await push([p.port for p in survivors], batches, range(40, BATCHES))

    asyncio.run(through_the_kill())

    async def read_back() -> tuple[LookupReply, LookupReply, list[dict[str, Any]]]:
        async with Client("127.0.0.1", survivors[-1].port, timeout_s=60) as c:
            found = await c.lookup_object(OUT)
            query = await c.lookup_object("hf")
            rows = await collect(c, OUT, sum(want.values()), timeout_s=240, settle_s=5)
            return found, query, rows

    found, query, rows = asyncio.run(read_back())
    assert found["epoch"] >= 2 and found["primary"]["node"] != victim.node_id
    assert query["kind"] == "query" and query["name"] == "hf", query
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
