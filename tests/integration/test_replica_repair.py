"""A replica that dies for good is replaced, and the newcomer is seeded (issue 11).

Five peers in this process (all voters, no Spark), a stream with three replicas, a short
retention so that the primary trims what every replica holds. One follower stops for good;
after the repair delay its primary replaces it with the closest peer that was no replica,
which starts its log after what was trimmed (a seed, with the replay memory of the trimmed
batches), takes the rest, and joins the in-sync set. Then the primary stops too: the stream
goes on with the newcomer in its in-sync set, the new primary holds every batch it keeps once,
and a retry of a batch trimmed before the newcomer arrived is still known as a duplicate.
"""

from __future__ import annotations

import time
from typing import Any

from peer.client import Client
from peer.protocol.replies import CreateStreamReply, PushReply
from peer.testing import PeerThread, run_async, wait_until_sync
from tests.integration.test_replication import (
    SCHEMA,
    batch,
    expected,
    push_all,
    replication_of,
    start_peers,
)

NAMES = ("alpha", "beta", "gamma", "delta", "epsilon")  # five voters: two may stop


def node(p: PeerThread) -> str:
    assert p.peer.overlay is not None
    return p.peer.overlay.node_id.hex()


def spool_of(p: PeerThread, stream: str) -> Any:
    assert p.peer.site is not None
    return p.peer.site.spools.get(stream)


def test_a_dead_replica_is_replaced_and_the_newcomer_seeded(tmp_path: Any) -> None:
    peers = start_peers(
        tmp_path,
        NAMES,
        voters=5,
        repair_after_s=2.0,
        retention_s=0.5,
        maintenance_interval_s=0.2,
    )
    closed: list[PeerThread] = []
    try:
        by_node = {node(p): p for p in peers}

        async def setup() -> CreateStreamReply:
            async with Client("127.0.0.1", peers[0].port, timeout_s=30) as c:
                await c.create_schema(SCHEMA)
                created = await c.create_stream("rticks", "tick", replicas=3)
            await push_all([p.port for p in peers], "rticks", range(30))
            return created

        created = run_async(setup, timeout_s=120)
        primary = by_node[created["primary"]]
        followers = [by_node[n] for n in created["replicas"] if n != created["primary"]]
        spares = [p for p in peers if node(p) not in created["replicas"]]
        # the primary trims what every replica holds (retention 0.5 s, no reader)
        wait_until_sync(
            lambda: spool_of(primary, "rticks").earliest > 10,
            "the primary to trim",
            30,
            every_s=0.05,
        )
        victim = followers[0]
        victim_id = node(victim)
        victim.close()
        closed.append(victim)
        live = [p for p in peers if p is not victim]
        run_async(lambda: push_all([p.port for p in live], "rticks", range(30, 50)), timeout_s=120)
        started = time.monotonic()

        async def in_sync() -> bool:
            async with Client("127.0.0.1", primary.port, timeout_s=30) as c:
                found = await c.lookup_object("rticks")
            members = {r["node"]: r["in_sync"] for r in found["replicas"]}
            newcomers = [n for n, ok in members.items() if ok and n in map(node, spares)]
            return victim_id not in members and len(newcomers) == 1

        wait_until_sync(
            lambda: run_async(in_sync, timeout_s=30),
            "the spare to join the in-sync set",
            60,
            every_s=0.05,
        )
        print(f"repaired and in sync {time.monotonic() - started:.1f} s after the pushes")
        spare = next(p for p in spares if replication_of(p, "rticks"))
        assert replication_of(spare, "rticks")["role"] == "follower"
        seeded = spool_of(spare, "rticks")
        through, _ = seeded.trimmed_state()
        assert through >= 10, "the spare was not seeded: it took the trimmed batches whole"
        assert seeded.log_end == spool_of(primary, "rticks").log_end == 49
        assert seeded.highest_seq("p") == 49

        # the primary stops too: the stream goes on with the newcomer in sync
        primary.close()
        closed.append(primary)
        rest = [p for p in peers if p not in closed]
        run_async(lambda: push_all([p.port for p in rest], "rticks", range(50, 60)), timeout_s=120)

        async def retry() -> PushReply:
            async with Client("127.0.0.1", rest[0].port, timeout_s=30) as c:
                again = await c.push("rticks", batch(3), producer="p", seq=3)
            return again

        assert run_async(retry, timeout_s=60)["duplicate"] is True  # trimmed long ago
        # the new primary holds a whole suffix of the batches, through 59, each once
        leader = next(p for p in rest if replication_of(p, "rticks").get("role") == "primary")
        spool = spool_of(leader, "rticks")
        rows = [
            (r["k"], r["v"])
            for _, table in spool.read(spool.earliest - 1, spool.latest, skip_trimmed=True)
            for r in table.to_pylist()
        ]
        first = min(k for k, _ in rows)
        assert first <= 50 and sorted(rows) == sorted(expected(range(first, 60)))
    finally:
        for p in reversed(peers):
            if p not in closed:
                p.close()
