"""High availability by default (issue 26): three `peer join` processes with no HA flags.

As a new user would run it (the README's way): three participants, each one `peer join` with
Spark and nothing about voters or replicas. The first peer founds the control plane and the
other two, started together, volunteer for its seats (one plane, not three). A stream created
with the default `--replicas` gets three copies; a keyed 10 s tumbling aggregate runs on its
primary, its results and checkpoints replicated beside it. Batches go through random peers
under one producer id, retried with the same (producer, seq) after a retriable refusal. After
30 of 90 batches, the aggregate's peer is killed with SIGKILL. Checked against plain Python:
every window, before and after the kill, is read back exactly once; `peer lookup` answers in
its one documented shape before and after.
"""

from __future__ import annotations

import asyncio
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

NAMES = ("hd1", "hd2", "hd3")
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")
SCHEMA = keyed_window_schema()
STREAM, OUT = "hd_ticks", "hd_out"
QUERY = keyed_window_query("hd", STREAM, OUT, kept="hd_kept")
BATCHES, KILL_AFTER, PER_BATCH = 90, 30, 100
STREAM_KEYS = {"stream", "epoch", "primary", "replicas", "in_sync", "copies", "replicated"}


def make_batches() -> list[dict[str, list[int]]]:
    return keyed_window_batches(26, BATCHES, PER_BATCH, keys=5, values=(0, 60))


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LocalFederation]:
    keys = make_participants(tmp_path, NAMES)
    args = {
        name: [*participant_args(name, keys[name], tmp_path / "trust"), *FAST] for name in NAMES
    }
    fed = LocalFederation(tmp_path, args)
    try:
        fed.start(timeout_s=240)
        yield fed
    finally:
        fed.stop()


async def push(ports: list[int], batches: list[dict[str, list[int]]], seqs: range) -> None:
    await push_anywhere(ports, STREAM, batches, seqs, producer="hd")


def check_stream_shape(found: LookupReply, nodes: set[str]) -> None:
    """`peer lookup` of a stream: the one shape of docs/protocol.md."""
    assert set(found.extra) >= STREAM_KEYS, sorted(found.extra)
    assert found["replicated"] is True and isinstance(found["epoch"], int)
    assert set(found["primary"]) >= {"node", "api"}
    assert {r["node"] for r in found["replicas"]} <= nodes
    assert all(set(r) >= {"node", "api", "in_sync"} for r in found["replicas"])


def test_three_plain_peers_are_highly_available_through_a_kill_9(
    federation: LocalFederation,
) -> None:
    procs = federation.procs
    by_node = {p.node_id: p for p in procs.values()}
    nodes = set(by_node)
    batches = make_batches()
    want = keyed_window_sums(batches)
    first = procs[NAMES[0]]

    async def setup() -> CreateStreamReply:
        async def ready() -> bool:
            voters: set[tuple[str, ...]] = set()
            for p in procs.values():
                async with Client("127.0.0.1", p.port, timeout_s=10) as c:
                    status = await c.status()
                if member_states(status)["alive"] < len(NAMES):
                    return False
                voters.add(tuple(sorted(status["replication"]["voters"])))
            return voters == {tuple(sorted(nodes))}  # one plane, every peer a voter of it

        await wait_until(ready, "three live peers, all three voters of one plane", 120, every_s=0.3)
        async with Client("127.0.0.1", first.port, timeout_s=60) as c:
            await c.create_schema(SCHEMA)
            created = await c.create_stream(STREAM, "tick")  # the default --replicas
            found = await c.lookup_object(STREAM)
        assert sorted(created["replicas"]) == sorted(nodes), created
        check_stream_shape(found, nodes)
        assert found["copies"] == "3 of 3 copies"
        async with Client("127.0.0.1", by_node[created["primary"]].port, timeout_s=60) as c:
            await c.create_query(QUERY)
            await c.start_query("hd")
            placed = await c.lookup_object(OUT)
            query = await c.lookup_object("hd")
        assert placed["primary"]["node"] == created["primary"], "the query is not on its input"
        assert [f["peer"] for f in query["fragments"]] == [created["primary"]], query
        return created

    created = asyncio.run(setup())
    victim = by_node[created["primary"]]
    survivors = [p for p in procs.values() if p is not victim]
    ports = [p.port for p in procs.values()]

    async def through_the_kill() -> None:
        await push(ports, batches, range(0, KILL_AFTER))
        async with Client("127.0.0.1", victim.port, timeout_s=60) as c:
            assert await collect(c, OUT, 1, timeout_s=180), "no window before the kill"
        await asyncio.to_thread(victim.kill)
        await push([p.port for p in survivors], batches, range(KILL_AFTER, BATCHES))

    asyncio.run(through_the_kill())

    async def read_back() -> tuple[LookupReply, list[dict[str, Any]]]:
        async with Client("127.0.0.1", survivors[-1].port, timeout_s=60) as c:
            found = await c.lookup_object(OUT)
            rows = await collect(c, OUT, sum(want.values()), timeout_s=240, settle_s=5)
            return found, rows

    found, rows = asyncio.run(read_back())
    check_stream_shape(found, nodes)
    assert found["epoch"] >= 2 and found["primary"]["node"] != victim.node_id
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
