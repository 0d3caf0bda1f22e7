"""High availability on real processes: the primary of a replicated stream killed with -9.

Five `peer join --no-engine` processes (the first three voters of the control plane), a stream
with three replicas, and one pusher sending numbered batches through random peers under one
producer id, each batch retried with the same (producer, seq) on another peer after a
retriable refusal or a timeout, until it is acknowledged or its deadline passes. Mid-stream
the stream's primary (found with ``lookup``) is first stopped for 2 s (SIGSTOP: probed by
the control plane's leader, it stays primary), then killed with SIGKILL (its refused port
fails it over without waiting out the silence); pushes go on through the survivors. Checked
against plain Python:

* every row of every acknowledged batch is read back exactly once (a subscription from the
  earliest offset through a surviving peer); a batch never acknowledged is there at most once;
* the control plane raised the epoch and named a surviving replica primary;
* the killed peer, restarted on its data directory, comes back as a follower of the new
  primary: once in sync it holds the new primary's spool file for file, byte for byte (so any
  unacknowledged tail it had was cut), and after five more batches every acknowledged row is
  still read back exactly once, through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.protocol.replies import CreateStreamReply, LookupReply, StatusReply
from peer.storage import spool_format as fmt
from peer.testing import (
    LocalFederation,
    PeerProcess,
    make_participants,
    member_states,
    participant_args,
    wait_until,
)
from peer.testing.push import push_one

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAMES = ("ha1", "ha2", "ha3", "ha4", "ha5")
VOTERS = NAMES[:3]
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")
SCHEMA = {"name": "tick", "fields": [{"name": "k", "type": "int"}, {"name": "v", "type": "int"}]}
STREAM = "ha_ticks"
PRODUCER = "ha-pusher"
ROWS = 20
REQUEST_S = 15.0  # above the primary's own wait for its followers (10 s)
BATCH_DEADLINE_S = 60.0

Row = tuple[int, int]


def batch(seq: int) -> list[dict[str, int]]:
    return [{"k": seq, "v": seq * 1000 + j} for j in range(ROWS)]


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LocalFederation]:
    keys = make_participants(tmp_path, NAMES)
    args = {
        name: [
            *participant_args(name, keys[name], tmp_path / "trust"),
            "--no-engine",
            *FAST,
            *(["--voter"] if name in VOTERS else []),
        ]
        for name in NAMES
    }
    fed = LocalFederation(tmp_path, args)
    try:
        fed.start(timeout_s=120)
        yield fed
    finally:
        fed.stop()


# --------------------------------------------------------------------------- helpers


class Pusher:
    """Numbered batches through random peers, one in flight; what was acknowledged."""

    def __init__(self, ports: list[int], seed: int) -> None:
        self.ports = ports
        self.rng = random.Random(seed)
        self.acked: set[int] = set()
        self.tried: set[int] = set()
        self.retries = 0

    async def push(self, seq: int) -> None:
        self.tried.add(seq)
        self.retries += await push_one(
            self.ports, self.rng, STREAM, batch(seq), producer=PRODUCER, seq=seq,
            deadline_s=BATCH_DEADLINE_S, timeout_s=REQUEST_S,
        )  # fmt: skip
        self.acked.add(seq)

    async def push_range(self, seqs: range, gap_s: float = 0.0) -> None:
        for seq in seqs:
            await self.push(seq)
            if gap_s:
                await asyncio.sleep(gap_s)


async def read_back(port: int, want_rows: int, timeout_s: float = 60) -> list[Row]:
    """Every row of the stream from the earliest offset, through the peer at ``port``; after
    ``want_rows`` arrived, two more seconds, so that a duplicate would show."""
    got: list[Row] = []
    async with Client("127.0.0.1", port, timeout_s=30) as c:
        sub = c.subscribe(STREAM, "earliest")

        async def take() -> None:
            async for b in sub:
                got.extend((r["k"], r["v"]) for r in b.rows())
                if len(got) >= want_rows:
                    return

        await asyncio.wait_for(take(), timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(take(), 2.0)
    return got


def check_exactly_once(got: list[Row], acked: set[int], tried: set[int]) -> None:
    """Acknowledged batches: every row once. Others: all of their rows at most once."""
    counts = Counter(got)
    for seq in sorted(tried):
        seen = [counts[(seq, seq * 1000 + j)] for j in range(ROWS)]
        if seq in acked:
            assert seen == [1] * ROWS, f"acknowledged batch {seq} read back {seen} times"
        else:
            assert seen in ([0] * ROWS, [1] * ROWS), f"unacknowledged batch {seq}: {seen}"
    strays = [r for r in counts if r[0] not in tried]
    assert not strays, f"rows nobody pushed: {strays[:5]}"


async def status_of(proc: PeerProcess) -> StatusReply:
    async with Client("127.0.0.1", proc.port, timeout_s=10) as c:
        return await c.status()


def spool_files(proc: PeerProcess) -> dict[int, bytes]:
    """The stream's spool files on the peer's disk, by offset."""
    found = [
        d for d in proc.data_dir.rglob(fmt.stream_dirname(STREAM)) if (d / fmt.SCHEMA_FILE).exists()
    ]
    assert len(found) == 1, f"spool of {STREAM} under {proc.data_dir}: {found}"
    return {
        int(p.name.removesuffix(fmt.SUFFIX)): p.read_bytes()
        for p in found[0].glob(f"*{fmt.SUFFIX}")
        if p.name.removesuffix(fmt.SUFFIX).isdigit()
    }


# --------------------------------------------------------------------------- the test


def test_kill_9_of_the_primary_loses_no_acknowledged_row_and_it_returns_a_follower(
    federation: LocalFederation,
) -> None:
    procs = federation.procs
    by_node = {p.node_id: p for p in procs.values()}
    first = procs[NAMES[0]]

    async def setup() -> CreateStreamReply:
        async def ready() -> bool:
            for p in procs.values():
                status = await status_of(p)
                alive = member_states(status)["alive"]
                if alive < len(NAMES) or len(status["replication"]["voters"]) < 3:
                    return False
            return True

        await wait_until(ready, "five live members that all know three voters", 90, every_s=0.2)
        async with Client("127.0.0.1", first.port, timeout_s=30) as c:
            await c.create_schema(SCHEMA)
            created = await c.create_stream(STREAM, "tick", replicas=3)
            found = await c.lookup_object(STREAM)
        assert created["epoch"] == 1 and len(created["replicas"]) == 3
        assert found["primary"]["node"] == created["primary"]
        return created

    created = asyncio.run(setup())
    victim = by_node[created["primary"]]
    replicas = [by_node[n] for n in created["replicas"]]
    survivors = [p for p in procs.values() if p is not victim]
    pusher = Pusher([p.port for p in procs.values()], seed=11)

    async def through_a_stop() -> LookupReply:
        await pusher.push_range(range(15))
        # stopped for 2 s, longer than suspect_after_s (0.5 s), shorter than failover_after_s
        # (3 s): the leader asks about the silent primary, finds its port open (the kernel
        # accepts for a stopped process) and leaves it primary
        os.killpg(victim.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            await asyncio.sleep(2.0)
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        await pusher.push_range(range(15, 20))
        async with Client("127.0.0.1", first.port, timeout_s=30) as c:
            return await c.lookup_object(STREAM)

    after_stop = asyncio.run(through_a_stop())
    assert (after_stop["epoch"], after_stop["primary"]["node"]) == (1, victim.node_id)

    async def through_the_kill() -> tuple[LookupReply, float]:
        # go on pushing through every peer (the victim too, until it is gone) and kill the
        # primary while batches are in flight
        task = asyncio.create_task(pusher.push_range(range(20, 45), gap_s=0.02))
        await asyncio.sleep(random.Random(3).uniform(0.3, 0.8))
        assert not task.done(), "the pushes ended before the kill"
        await asyncio.to_thread(victim.kill)
        killed = time.monotonic()
        pusher.ports = [p.port for p in survivors]
        await asyncio.wait_for(task, 300)
        took = time.monotonic() - killed
        async with Client("127.0.0.1", survivors[0].port, timeout_s=30) as c:
            return await c.lookup_object(STREAM), took

    after_kill, took = asyncio.run(through_the_kill())
    print(f"45 batches acknowledged, {pusher.retries} retries; 25 after the kill in {took:.1f} s")
    assert pusher.acked == set(range(45))
    assert after_kill["epoch"] >= 2
    new_primary = by_node[after_kill["primary"]["node"]]
    assert new_primary is not victim and new_primary in replicas
    # the leader did not wait out the silence: the killed primary's host refused connections
    said = f"{victim.node_id[:12]} refuses connections"
    assert any(said in p.log_path.read_text(errors="replace") for p in survivors)

    got = asyncio.run(read_back(survivors[-1].port, 45 * ROWS))
    check_exactly_once(got, pusher.acked, pusher.tried)
    assert len(got) == 45 * ROWS

    # the killed peer comes back on its data directory: a follower of the new primary
    victim.start(timeout_s=120)
    pusher.ports = [p.port for p in procs.values()]

    async def after_return() -> tuple[dict[str, Any], dict[str, Any], list[Row]]:
        async def followed() -> dict[str, Any] | None:
            mine = (await status_of(victim))["replication"]["streams"].get(STREAM)
            theirs = (await status_of(new_primary))["replication"]["streams"][STREAM]
            in_sync = victim.node_id in theirs["in_sync"]
            if mine and mine["epoch"] == theirs["epoch"] and in_sync:
                return dict(mine)
            return None

        mine = await wait_until(followed, "the returning peer to be in sync again", 90, every_s=0.2)
        await pusher.push_range(range(45, 50))
        got = await read_back(victim.port, 50 * ROWS)

        async def caught_up() -> dict[str, Any] | None:
            mine = (await status_of(victim))["replication"]["streams"][STREAM]
            theirs = (await status_of(new_primary))["replication"]["streams"][STREAM]
            same = mine["log_end"] == theirs["log_end"]
            return dict(mine) if same else None

        await wait_until(caught_up, "the returning peer to hold the last batches", 30, every_s=0.2)
        return mine, (await status_of(new_primary))["replication"]["streams"][STREAM], got

    mine, theirs, got = asyncio.run(after_return())
    assert mine["role"] == "follower"
    assert mine["primary"] == new_primary.node_id and mine["epoch"] == after_kill["epoch"]
    assert theirs["role"] == "primary"
    assert pusher.acked == set(range(50))
    check_exactly_once(got, pusher.acked, pusher.tried)
    assert len(got) == 50 * ROWS
    # its log is the new primary's, file for file: an unacknowledged tail was cut
    returned, primary_files = spool_files(victim), spool_files(new_primary)
    assert sorted(returned) == sorted(primary_files) == list(range(len(primary_files)))
    assert returned == primary_files
