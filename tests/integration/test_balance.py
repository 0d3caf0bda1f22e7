"""Balancing inside a participant (issue 28): a hot peer hands a fragment to an idle peer of
its own participant, without any contract, and the output stays exact.

Two peers of one participant, acme, with no contracts at all, share this test process's
Spark session and its CPU. Their brains measure that CPU against different capacities: the
"hot" peer offers 0.2 cores, the idle one 16, so the same process load is a high utilisation
on one and a low one on the other (the in-process stand-in for a busy and an idle host). A
filter + windowed aggregate runs on the hot peer over a stream it hosts; while pushes go on,
its brain (peer.elastic.siblings) sees the gap over two rounds and moves the fragment, with
its state, to the idle peer under no contract. Every window equals plain Python, none twice;
both ledgers record the move, with its reason. The second test does the same with the control
plane and a replicated aggregate, which moves by handing its input's primary over.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.move import SIBLING
from peer.testing import (
    PeerThread,
    collect,
    keyed_window_query,
    stream_name_on,
    wait_until_sync,
)
from tests.integration.test_move import (
    SCHEMA,
    make_batches,
    push,
    reference,
    set_up,
    site_of,
)
from tests.integration.test_replication import start_peers

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

CAPACITY = {"hot": 0.2, "idle": 16.0}


@pytest.fixture
def siblings(tmp_path: Path, spark: Any) -> Iterator[tuple[PeerThread, PeerThread]]:
    """The hot and the idle peer of acme; no control plane (their streams are not
    replicated), each windowed aggregate in its own streaming query (movable)."""
    peers = start_peers(
        tmp_path, ("hot", "idle"), voters=0, spark=spark, participant="acme",
        per_peer={name: {"capacity": cores} for name, cores in CAPACITY.items()},
        brain=True, bpm_period_s=1.0, fuse_stateless=False,
    )  # fmt: skip
    try:
        yield peers[0], peers[1]
    finally:
        for p in reversed(peers):
            p.close()


def test_a_hot_peer_hands_a_fragment_to_its_own_participants_idle_peer(
    siblings: tuple[PeerThread, PeerThread],
) -> None:
    hot, idle = siblings
    assert hot.peer.overlay is not None and idle.peer.overlay is not None
    hot_id, idle_id = hot.peer.overlay.node_id, idle.peer.overlay.node_id
    assert hot.peer.book is None and idle.peer.book is None  # no contracts at all
    source = stream_name_on(hot_id, (hot_id, idle_id), "bticks")
    batches = make_batches()
    want = reference(batches)
    query = keyed_window_query("bal", source, "bal_out", kept="bal_kept")

    def moved_away() -> bool:
        return site_of(hot).catalog.moved().get("bal") == idle_id.hex()

    async def scenario() -> list[dict[str, Any]]:
        await set_up(hot.port, 2, source, query)
        third = len(batches) // 3
        await push(hot.port, source, batches[:third], 0)
        async with Client("127.0.0.1", hot.port, timeout_s=120) as cl:
            assert await collect(cl, "bal_out", 1, timeout_s=120), "no result before the move"
        # go on pushing, a batch at a time, until the brain has moved the fragment
        sent = third
        deadline = time.monotonic() + 180
        while not moved_away():
            assert time.monotonic() < deadline, "the hot peer never handed the fragment over"
            if sent < 2 * third:
                await push(hot.port, source, batches[sent : sent + 1], sent)
                sent += 1
            await asyncio.sleep(0.3)
        await push(hot.port, source, batches[sent:], sent)
        async with Client("127.0.0.1", idle.port, timeout_s=120) as cl:
            return await collect(cl, "bal_out", sum(want.values()), timeout_s=300, settle_s=3)

    rows = asyncio.run(scenario())
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
    assert site_of(idle).catalog.query("bal").status == "RUNNING"
    brain_hot, brain_idle = hot.peer.brain, idle.peer.brain
    assert brain_hot is not None and brain_idle is not None
    out = [e for e in brain_hot.status()["ledger"] if e["direction"] == "out"]
    assert [(e["fragment"], e["partner"], e["peer"], e["ok"]) for e in out] == [
        ("bal", "acme", idle_id.hex(), True)
    ]
    assert out[0]["contract"] == SIBLING and out[0]["price"] == 0.0
    assert "margin" in out[0]["reason"]
    into = [e for e in brain_idle.status()["ledger"] if e["direction"] == "in"]
    assert [(e["fragment"], e["partner"], e["contract"]) for e in into] == [
        ("bal", "acme", SIBLING)
    ]


def test_a_hot_peer_hands_a_replicated_fragment_to_a_sibling_by_handing_its_input_over(
    tmp_path: Path, spark: Any
) -> None:
    """With the control plane (three peers of acme, all voters, the default replication), the
    aggregate is replicated and runs on its input's primary, ra, whose brain is hot (0.2
    cores against the others' 16): it hands the stream's primary role to a sibling, the
    fragment follows there (taken over from its replicated checkpoint), and the output stays
    exact."""
    peers = start_peers(
        tmp_path, ("ra", "rb", "rc"), voters=3, spark=spark, participant="acme",
        per_peer={"ra": {"capacity": 0.2}}, brain=True, capacity=16.0, bpm_period_s=1.0,
    )  # fmt: skip
    try:
        by_node = {p.peer.overlay.node_id.hex(): p for p in peers}  # type: ignore[union-attr]
        hot = peers[0]
        ids = [bytes.fromhex(n) for n in by_node]
        source = stream_name_on(ids[0], ids, "rb_ticks")  # (ids[0] is hot's)
        batches = make_batches()
        want = reference(batches)
        query = keyed_window_query("rbal", source, "rbal_out", kept="rbal_kept")

        async def setup() -> str:
            async with Client("127.0.0.1", hot.port, timeout_s=60) as c:
                await c.create_schema(SCHEMA)
                created = await c.create_stream(source, "mtick", replicas=3)
                await c.create_query(query)
                await c.start_query("rbal")
            return str(created["primary"])

        primary = asyncio.run(setup())
        assert by_node[primary] is hot  # the stream is named to be led by ra
        brain = hot.peer.brain
        assert brain is not None
        ports = [p.port for p in peers]

        async def scenario() -> list[dict[str, Any]]:
            sent = 0
            deadline = time.monotonic() + 180
            while True:
                state = await asyncio.to_thread(hot.call, room_of(hot).plane.client.read(source))
                if state is not None and state.primary != primary:
                    break
                assert time.monotonic() < deadline, "the hot peer never handed the stream over"
                if sent < len(batches) - 10:
                    await push(ports[sent % 3], source, batches[sent : sent + 1], sent)
                    sent += 1
                await asyncio.sleep(0.2)
            await push(ports[0], source, batches[sent:], sent)
            async with Client("127.0.0.1", ports[0], timeout_s=120) as cl:
                return await collect(cl, "rbal_out", sum(want.values()), timeout_s=300, settle_s=3)

        rows = asyncio.run(scenario())
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        assert got == want
        out = [e for e in brain.status()["ledger"] if e["direction"] == "out"]
        assert [(e["fragment"], e["partner"], e["contract"], e["ok"]) for e in out][:1] == [
            ("rbal", "acme", SIBLING, True)
        ]
        heir = by_node[out[0]["peer"]]
        engine = heir.peer.engine
        assert engine is not None
        wait_until_sync(lambda: "rbal" in engine.running, "the fragment at the sibling", 60)
    finally:
        for p in reversed(peers):
            p.close()


def room_of(p: PeerThread) -> Any:
    room = p.peer.room
    assert room is not None
    return room
