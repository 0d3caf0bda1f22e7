"""Warm standbys (process pairs) through kill -9s of real `peer join` processes (issue 26).

Five peers: three run Spark and hold the control plane's seats, two run no engine (so a
stream's three replicas are the three engine peers). A stream with three replicas feeds a
keyed 10 s tumbling window (a filter, then the aggregate) that asks for a
standby (``"standby": true``). The query runs on the stream's primary; one other engine
peer proposes itself as the stream's standby and runs the same query over its copy of the
stream, its results held back. Batches go through random peers under one producer id,
retried with the same (producer, seq) after a retriable refusal.

* The primary stopped for 2 s (SIGSTOP) under load: no promotion, no new epoch.
* The primary killed with SIGKILL mid-stream: the control plane elects the standby's peer,
  which promotes its standby (publishing the held results the result streams lack) rather
  than starting the query from a checkpoint record; the third engine peer becomes the new
  standby.
* Once the first victim's replica is replaced (``--repair-after 5``) and in sync, the new
  standby's peer killed with SIGKILL: the query goes on.

Checked against plain Python: the aggregate's result stream, read from the earliest offset,
holds every window exactly once. Then a query without a
standby on the same federation, over a second stream: exact too (today's path).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.protocol.replies import CreateStreamReply
from peer.testing import (
    LocalFederation,
    PeerProcess,
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

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(1200)]

NAMES = ("sb1", "sb2", "sb3", "sb4", "sb5")
ENGINES = NAMES[:3]
FAST = ("--gossip-interval", "0.3", "--suspect-after", "2", "--dead-after", "5")
REPAIR = ("--repair-after", "5")  # a dead replica is replaced soon: two kills in a row
SCHEMA = keyed_window_schema()
STREAM, OUT = "sb_ticks", "sb_out"
QUERY = {**keyed_window_query("sb", STREAM, OUT), "standby": True}
PLAIN_STREAM, PLAIN_OUT = "sb_plain", "sb_plain_out"
PLAIN_QUERY = keyed_window_query("sbp", PLAIN_STREAM, PLAIN_OUT, kept="sbp_kept")
BATCHES, PER_BATCH = 80, 100


def make_batches(seed: int, count: int) -> list[dict[str, list[int]]]:
    return keyed_window_batches(seed, count, PER_BATCH, keys=5, values=(0, 60))


@pytest.fixture
def federation(tmp_path: Path) -> Iterator[LocalFederation]:
    keys = make_participants(tmp_path, NAMES)
    args = {
        name: [
            *participant_args(name, keys[name], tmp_path / "trust"),
            *FAST,
            *REPAIR,
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


async def push(ports: list[int], seqs: range, batches: list[dict[str, list[int]]]) -> None:
    await push_anywhere(ports, STREAM, batches, seqs, producer="sb")


async def replication(proc: PeerProcess) -> dict[str, Any]:
    async with Client("127.0.0.1", proc.port, timeout_s=10) as c:
        status: dict[str, Any] = (await c.status())["replication"]
    return status


async def standby_on(procs: list[PeerProcess], query: str) -> PeerProcess:
    """The peer among ``procs`` whose standby of ``query`` has run a batch."""

    async def found() -> PeerProcess | None:
        for proc in procs:
            held = (await replication(proc)).get("standbys", {}).get(query)
            if held is not None and not held["promoted"] and held["batches"] > 0:
                return proc
        return None

    proc: PeerProcess = await wait_until(found, f"a running standby of {query}", 180, every_s=0.5)
    return proc


def test_a_standby_is_promoted_through_kill_9s_and_the_output_stays_exact(
    federation: LocalFederation,
) -> None:
    procs = federation.procs
    by_node = {p.node_id: p for p in procs.values()}
    engines = [procs[n] for n in ENGINES]
    batches = make_batches(29, BATCHES)
    want = keyed_window_sums(batches)
    first = procs[NAMES[0]]

    async def setup() -> tuple[CreateStreamReply, PeerProcess]:
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
        async with Client("127.0.0.1", by_node[created["primary"]].port, timeout_s=60) as c:
            await c.create_query(QUERY)
            await c.start_query("sb")
        await push_anywhere(
            [p.port for p in procs.values()], STREAM, batches, range(0, 20), producer="sb"
        )
        others = [p for p in engines if p.node_id != created["primary"]]
        return created, await standby_on(others, "sb")

    created, standby = asyncio.run(setup())
    victim = by_node[created["primary"]]
    ports = [p.port for p in procs.values()]

    async def through_a_stop() -> None:
        async with Client("127.0.0.1", victim.port, timeout_s=60) as c:
            assert await collect(c, OUT, 1, timeout_s=180), "no window before the stop"
        task = asyncio.create_task(push(ports, range(20, 30), batches))
        os.killpg(victim.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            await asyncio.sleep(2.0)
        finally:
            os.killpg(victim.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        await asyncio.wait_for(task, 300)
        async with Client("127.0.0.1", first.port, timeout_s=30) as c:
            found = await c.lookup_object(STREAM)
        assert (found["epoch"], found["primary"]["node"]) == (1, victim.node_id)
        for proc in engines:
            assert (await replication(proc))["promotions"] == 0

    asyncio.run(through_a_stop())
    survivors = [p for p in procs.values() if p is not victim]

    async def through_the_kill() -> PeerProcess:
        task = asyncio.create_task(push(ports, range(30, 45), batches))
        await asyncio.sleep(random.Random(5).uniform(0.3, 0.8))
        await asyncio.to_thread(victim.kill)
        await asyncio.wait_for(task, 300)
        await push_anywhere(
            [p.port for p in survivors], STREAM, batches, range(45, 60), producer="sb"
        )

        async def promoted() -> dict[str, Any] | None:
            status = await replication(standby)
            return status if status["promotions"] else None

        status = await wait_until(promoted, "the standby's promotion", 120, every_s=0.5)
        assert status["promotions"] == 1, status
        async with Client("127.0.0.1", standby.port, timeout_s=60) as c:
            found = await c.lookup_object(OUT)
        assert found["primary"]["node"] == standby.node_id
        third = [p for p in engines if p not in (victim, standby)]
        return await standby_on(third, "sb")

    second = asyncio.run(through_the_kill())
    living = [p for p in survivors if p is not second]

    async def through_the_second_kill() -> None:
        async def repaired() -> bool:
            async with Client("127.0.0.1", standby.port, timeout_s=30) as c:
                found = await c.lookup_object(STREAM)
            in_sync = [r["node"] for r in found["replicas"] if r["in_sync"]]
            return len(in_sync) == 3 and victim.node_id not in in_sync

        await wait_until(repaired, "the killed replica replaced and in sync", 120, every_s=0.5)
        await asyncio.to_thread(second.kill)
        await push_anywhere(
            [p.port for p in living], STREAM, batches, range(60, BATCHES), producer="sb"
        )

    asyncio.run(through_the_second_kill())

    async def read_back() -> list[dict[str, Any]]:
        async with Client("127.0.0.1", living[-1].port, timeout_s=60) as c:
            return await collect(c, OUT, sum(want.values()), timeout_s=300, settle_s=5)

    rows = asyncio.run(read_back())
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want

    plain = make_batches(31, 30)

    async def without_a_standby() -> list[dict[str, Any]]:
        async with Client("127.0.0.1", standby.port, timeout_s=60) as c:
            await c.create_stream(PLAIN_STREAM, "tick", replicas=3)
            await c.create_query(PLAIN_QUERY)
            await c.start_query("sbp")
        await push_anywhere(
            [p.port for p in living], PLAIN_STREAM, plain, range(30), producer="sbp"
        )
        async with Client("127.0.0.1", living[-1].port, timeout_s=60) as c:
            want_n = sum(keyed_window_sums(plain).values())
            return await collect(c, PLAIN_OUT, want_n, timeout_s=240, settle_s=3)

    plain_rows = asyncio.run(without_a_standby())
    assert Counter(
        (r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in plain_rows
    ) == keyed_window_sums(plain)
