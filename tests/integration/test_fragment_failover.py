"""A windowed aggregate fails over with its input (in-process peers, real Spark, real Raft).

Three peers, all voters, share one Spark session. A stream with three replicas feeds a keyed
10 s tumbling window (a filter, then the aggregate): the coordinator places the query on the
stream's primary, and its result stream and checkpoint stream are replicated with the input,
anchored to it. First the fragment moves on purpose (issue 28): its peer hands the input's
primary role to the third peer while pushes go on, and the fragment follows. Then that
primary stops; the control plane moves the input, the result
stream and the checkpoint stream to one survivor, which resumes the query from the replicated
checkpoint. The result stream, read from the earliest offset, equals plain Python exactly:
no window lost, none twice. The peers keep their checkpoints in one shared directory
(``--checkpoint-dir``, issue 25 item 3), as peers on a Spark cluster do: the record the
survivor resumes from is unpacked there, not in its data directory.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.errors import InvalidInput
from peer.move.candidates import why_not
from peer.protocol.replies import CreateStreamReply
from peer.replication.fragment_failover import FragmentHandOver
from peer.testing import (
    PeerThread,
    collect,
    keyed_window_batches,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
    wait_until,
    wait_until_sync,
)
from tests.integration.test_replication import start_peers

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

NAMES = ("fa", "fb", "fc")
SCHEMA = keyed_window_schema()
QUERY = keyed_window_query("fo", "fo_ticks", "fo_out", kept="fo_kept")
BATCHES, PER_BATCH = 40, 100


def make_batches() -> list[dict[str, list[int]]]:
    return keyed_window_batches(7, BATCHES, PER_BATCH, keys=4, values=(0, 50))


async def push(ports: list[int], batches: list[dict[str, list[Any]]], seqs: range) -> None:
    rng = random.Random(seqs.start)
    for seq in seqs:
        for attempt in range(300):
            try:
                async with Client("127.0.0.1", rng.choice(ports), timeout_s=30) as c:
                    await c.push("fo_ticks", {"columns": batches[seq]}, producer="p", seq=seq)
                break
            except Exception:
                if attempt == 299:
                    raise
                await asyncio.sleep(0.2)


def test_a_windowed_aggregate_fails_over_with_its_input(tmp_path: Path, spark: Any) -> None:
    shared = tmp_path / "nfs"
    peers = start_peers(tmp_path, NAMES, voters=3, spark=spark, shared=shared)
    try:
        run(peers, shared)
    finally:
        for p in reversed(peers):
            p.close()


def run(peers: list[PeerThread], shared: Path) -> None:
    batches = make_batches()
    want = keyed_window_sums(batches)
    by_node = {p.peer.overlay.node_id.hex(): p for p in peers}  # type: ignore[union-attr]

    async def setup() -> tuple[CreateStreamReply, PeerThread]:
        async with Client("127.0.0.1", peers[0].port, timeout_s=60) as c:
            await c.create_schema(SCHEMA)
            created = await c.create_stream("fo_ticks", "tick", replicas=3)
        # the query through a peer that survives: its definition is served by the peer that
        # published it (a query's catalog record is not replicated yet)
        other = next(p for p in peers if p.peer.overlay.node_id.hex() != created["primary"])  # type: ignore[union-attr]
        async with Client("127.0.0.1", other.port, timeout_s=60) as c:
            await c.create_query(QUERY)
            await c.start_query("fo")
        return created, other

    created, owner = asyncio.run(setup())
    first = by_node[created["primary"]]
    ports = [p.port for p in peers]

    async def before() -> list[dict[str, Any]]:
        await push(ports, batches, range(0, 14))
        async with Client("127.0.0.1", first.port, timeout_s=60) as c:
            return await collect(c, "fo_out", 1, timeout_s=120)

    assert asyncio.run(before()), "no window before the fragment moved"
    # a planned move (issue 28): the fragment goes to the third peer by handing its input's
    # primary over, while pushes go on; its results and checkpoints follow
    victim = next(p for p in peers if p is not first and p is not owner)
    target = victim.peer.overlay.node_id.hex()  # type: ignore[union-attr]
    room = first.peer.room
    assert room is not None
    fragments = room.fragments
    with pytest.raises(InvalidInput, match="in-sync replica"):
        first.call(fragments.hand_over("fo", "ab" * 32))

    async def move() -> FragmentHandOver:
        pushing = asyncio.create_task(push(ports, batches, range(14, 20)))
        moved: FragmentHandOver = await asyncio.to_thread(
            first.call, fragments.hand_over("fo", target), 60
        )
        await pushing
        return moved

    moved = asyncio.run(move())
    assert moved["to"] == target and moved["epochs"] == {"fo_ticks": 2}
    wait_until_sync(
        lambda: (
            "fo" in (victim.peer.engine.running if victim.peer.engine else {})
            and "fo" not in (first.peer.engine.running if first.peer.engine else {})
        ),
        "the fragment to run on the peer it was handed to",
        120,
        every_s=0.2,
    )
    survivors = [p for p in peers if p is not victim]
    # a replicated fragment runs where the control plane puts its input's primary: no move
    assert victim.peer.fed is not None and victim.peer.mover is not None
    assert "fo" not in [name for name, _ in victim.peer.mover.movable()]
    reason = why_not(victim.peer.fed.site, victim.peer.fed.hosting.hosted, "fo")
    assert reason is not None and "replicated" in reason
    victim.close()

    async def after() -> list[dict[str, Any]]:
        live = [p.port for p in survivors]
        await push(live, batches, range(20, BATCHES))
        async with Client("127.0.0.1", survivors[0].port, timeout_s=60) as c:

            async def moved() -> bool:
                found = await c.lookup_object("fo_out")
                return bool(found.get("primary", {}).get("node") != target)

            await wait_until(moved, "the result stream to have a new primary", 60, every_s=0.5)
            return await collect(c, "fo_out", sum(want.values()), timeout_s=180, settle_s=5)

    rows = asyncio.run(after())
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
    # the survivor resumed the fragment from its record unpacked beneath the shared
    # checkpoint directory, not in its data directory
    engines = [(p, p.peer.engine) for p in survivors]
    running = [(p, e) for p, e in engines if e is not None and "fo" in e.running]
    assert len(running) == 1
    heir, engine = running[0]
    checkpoint = engine.checkpoint_dir("fo", engine.running["fo"].incarnation)
    assert checkpoint.is_relative_to(shared) and any((checkpoint / "commits").iterdir())
    assert not (heir.peer.data_dir / "checkpoints").exists()

    # deleting the query drops its replicated streams from the control plane and every replica
    async def delete() -> None:
        async with Client("127.0.0.1", owner.port, timeout_s=60) as c:  # its participant's
            await c.delete_query("fo")

    asyncio.run(delete())
    internal = ("fo_out", "fo_kept", "~ckpt.fo")
    for p in survivors:
        fed, room = p.peer.fed, p.peer.room
        assert fed is not None and room is not None
        assert not set(internal) & set(room.plane.replicas.streams)
        assert not set(internal) & set(fed.site.spools.streams())
        states = p.call(room.plane.client.read("fo_out"))
        assert states is None
