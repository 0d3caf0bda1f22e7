"""Warm standbys (process pairs) through kill -9s of real `peer join` processes (issue 26).

Five peers: three run Spark and hold the control plane's seats, two run no engine (so a
stream's three replicas are the three engine peers). A stream with three replicas feeds a
keyed 10 s tumbling window (a filter, then the aggregate), and a windowed join of it with a
second stream (named so that the same peer leads both); both queries ask for a standby
(``"standby": true``). Each query runs on its input's primary; one other engine peer proposes
itself as the streams' standby and runs the same queries over its copies of the streams, their
results held back. Batches go through random peers under one producer id per stream, retried
with the same (producer, seq) after a retriable refusal.

* The primary stopped for 2 s (SIGSTOP) under load: no promotion, no new epoch.
* The primary killed with SIGKILL mid-stream: the control plane elects the standby's peer,
  which promotes its standby (publishing the held results the result streams lack) rather
  than starting the query from a checkpoint record; the third engine peer becomes the new
  standby.
* Once the first victim's replica is replaced (``--repair-after 5``) and in sync, the new
  standby's peer killed with SIGKILL: the query goes on.

Checked against plain Python: the aggregate's and the join's result streams, read from the
earliest offset, hold every window and every pair exactly once. Then a query without a
standby on the same federation, over a second stream: exact too (today's path).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.examples import band_join
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
RIGHT, PAIRS = "sb_right", "sb_pairs"  # (RIGHT: a name led by STREAM's primary, found)
JOIN_PARAMS = {
    "predicate": "left.k = right.k AND left.v > right.v",
    "left-order-by": "VALUES",
    "left-order-on-field": "t",
    "right-order-by": "VALUES",
    "right-order-on-field": "t",
    "left-buffer-size": "1",
    "right-buffer-size": "1",
}
PLAIN_STREAM, PLAIN_OUT = "sb_plain", "sb_plain_out"
PLAIN_QUERY = keyed_window_query("sbp", PLAIN_STREAM, PLAIN_OUT, kept="sbp_kept")
BATCHES, PER_BATCH = 80, 100


def make_batches(seed: int, count: int, keys: int = 5) -> list[dict[str, list[int]]]:
    return keyed_window_batches(seed, count, PER_BATCH, keys=keys, values=(0, 60))


def join_query(right: str) -> dict[str, Any]:
    box = {"name": "pair", "type": "join", "inputs": [STREAM, right], "outputs": [PAIRS]}
    return {"name": "sbj", "standby": True, "boxes": [{**box, "params": JOIN_PARAMS}]}


def led_like(stream: str, engines: list[str]) -> str:
    """A name for the join's second stream that the same engine peer leads as ``stream``
    (a stream's first replica is the engine peer XOR-closest to sha1("sid:" + name))."""

    def closest(name: str) -> str:
        target = int.from_bytes(hashlib.sha1(b"sid:" + name.encode()).digest(), "big")
        return min(engines, key=lambda n: int(n, 16) ^ target)

    return next(f"{RIGHT}{i}" for i in range(1000) if closest(f"{RIGHT}{i}") == closest(stream))


def rows(batches: list[dict[str, list[int]]]) -> list[dict[str, int]]:
    return [
        {"k": k, "v": v, "t": t}
        for b in batches
        for k, v, t in zip(b["k"], b["v"], b["t"], strict=True)
    ]


def pairs_of(left: list[dict[str, list[int]]], right: list[dict[str, list[int]]]) -> Counter[Any]:
    """Plain Python for the join: equal k, left v above right v, |left t - right t| < 1."""
    found = band_join(
        rows(left),
        rows(right),
        left_key=lambda r: r["k"],
        right_key=lambda r: r["k"],
        left_order="t",
        right_order="t",
        left_buffer=1,
        right_buffer=1,
        where=lambda a, b: a["v"] > b["v"],
    )
    return Counter((a["k"], a["v"], a["t"], b["v"], b["t"]) for a, b in found)


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


Batches = list[dict[str, list[int]]]


async def push(ports: list[int], seqs: range, both: tuple[str, Batches, Batches]) -> None:
    """Each seq of both streams in turn (each stream's event time rises with its seq, so the
    join's two sides advance together and no tuple comes behind the watermark)."""
    right, left_batches, right_batches = both
    for seq in seqs:
        await push_anywhere(ports, STREAM, left_batches, range(seq, seq + 1), producer="sb")
        await push_anywhere(ports, right, right_batches, range(seq, seq + 1), producer="sbr")


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


def test_standbys_are_promoted_through_kill_9s_and_the_outputs_stay_exact(
    federation: LocalFederation,
) -> None:
    procs = federation.procs
    by_node = {p.node_id: p for p in procs.values()}
    engines = [procs[n] for n in ENGINES]
    batches = make_batches(29, BATCHES)
    right_batches = make_batches(37, BATCHES, keys=50)  # a tenth of them meet the left keys
    want = keyed_window_sums(batches)
    want_pairs = pairs_of(batches, right_batches)
    first = procs[NAMES[0]]
    right = led_like(STREAM, [p.node_id for p in engines])
    both = (right, batches, right_batches)

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
            second = await c.create_stream(right, "tick", replicas=3)
        assert second["primary"] == created["primary"], "the join's inputs have two primaries"
        async with Client("127.0.0.1", by_node[created["primary"]].port, timeout_s=60) as c:
            await c.create_query(QUERY)
            await c.start_query("sb")
            await c.create_query(join_query(right))
            await c.start_query("sbj")
        await push([p.port for p in procs.values()], range(0, 20), both)
        others = [p for p in engines if p.node_id != created["primary"]]
        standby = await standby_on(others, "sb")
        assert await standby_on(others, "sbj") is standby  # one standby for both inputs
        return created, standby

    created, standby = asyncio.run(setup())
    victim = by_node[created["primary"]]
    ports = [p.port for p in procs.values()]

    async def through_a_stop() -> None:
        async with Client("127.0.0.1", victim.port, timeout_s=60) as c:
            assert await collect(c, OUT, 1, timeout_s=180), "no window before the stop"
        task = asyncio.create_task(push(ports, range(20, 30), both))
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
        task = asyncio.create_task(push(ports, range(30, 45), both))
        await asyncio.sleep(random.Random(5).uniform(0.3, 0.8))
        await asyncio.to_thread(victim.kill)
        await asyncio.wait_for(task, 300)
        await push([p.port for p in survivors], range(45, 60), both)

        async def promoted() -> dict[str, Any] | None:
            status = await replication(standby)
            return status if status["promotions"] >= 2 else None

        status = await wait_until(promoted, "both standbys' promotion", 120, every_s=0.5)
        assert status["promotions"] == 2, status
        async with Client("127.0.0.1", standby.port, timeout_s=60) as c:
            for stream in (OUT, PAIRS):
                found = await c.lookup_object(stream)
                assert found["primary"]["node"] == standby.node_id, stream
        third = [p for p in engines if p not in (victim, standby)]
        new = await standby_on(third, "sb")
        assert await standby_on(third, "sbj") is new
        return new

    second = asyncio.run(through_the_kill())
    living = [p for p in survivors if p is not second]

    async def through_the_second_kill() -> None:
        async def repaired() -> bool:
            async with Client("127.0.0.1", standby.port, timeout_s=30) as c:
                for stream in (STREAM, right):
                    found = await c.lookup_object(stream)
                    in_sync = [r["node"] for r in found["replicas"] if r["in_sync"]]
                    if len(in_sync) != 3 or victim.node_id in in_sync:
                        return False
            return True

        await wait_until(repaired, "the killed replicas replaced and in sync", 120, every_s=0.5)
        await asyncio.to_thread(second.kill)
        await push([p.port for p in living], range(60, BATCHES), both)

    asyncio.run(through_the_second_kill())

    async def read_back() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with Client("127.0.0.1", living[-1].port, timeout_s=60) as c:
            windows = await collect(c, OUT, sum(want.values()), timeout_s=300, settle_s=5)
            pairs = await collect(c, PAIRS, sum(want_pairs.values()), timeout_s=300, settle_s=5)
            return windows, pairs

    windows, pairs = asyncio.run(read_back())
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in windows)
    assert got == want
    got_pairs = Counter((r["k"], r["v"], r["t"], r["right_v"], r["right_t"]) for r in pairs)
    assert got_pairs == want_pairs

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
