"""A peer killed with SIGKILL mid-stream and restarted on its data directory loses nothing and
duplicates nothing: the result equals an uninterrupted run computed in plain Python.

The peer is a real `peer join` process (its own JVM); the kill takes its whole process group.
The pusher retries unacknowledged batches after the restart with the same (producer, seq), as a
client must, and the spool drops what it already had. Its checkpoints are in a directory of
its own beneath ``--checkpoint-dir`` (issue 25 item 3: shared storage on a cluster), and it is
restarted without the option: the record in its data directory finds them again.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.errors import Unavailable
from peer.testing import (
    PeerProcess,
    collect,
    keyed_window_batches,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCHEMA = keyed_window_schema()
QUERY = keyed_window_query("rec", "ticks", "rec_out", kept="pos_ticks")
# Per-tuple queries: the first runs as its own streaming query, the second in the peer's
# stateless lane; the aggregate runs on its own. The kill must leave all three exact.
BIG_QUERY = {
    "name": "big",
    "boxes": [
        {
            "name": "big",
            "type": "filter",
            "inputs": ["ticks"],
            "outputs": ["rec_big"],
            "params": {"expression.0": "v >= 40"},
        },
    ],
}
LANE_QUERY = {
    "name": "neg",
    "boxes": [
        {
            "name": "neg",
            "type": "filter",
            "inputs": ["ticks"],
            "outputs": ["rec_neg"],
            "params": {"expression.0": "v < 0"},
        },
    ],
}
BATCHES, PER_BATCH = 60, 200


def make_batches() -> list[dict[str, list[int]]]:
    return keyed_window_batches(99, BATCHES, PER_BATCH, keys=5, values=(-10, 50))


async def push_from(
    port: int, batches: list[dict[str, list[Any]]], first: int, stop_after: int | None = None
) -> int:
    """Push batches[first:] with seq = index; return the first index not acknowledged."""
    async with Client("127.0.0.1", port, timeout_s=60) as c:
        for i in range(first, len(batches)):
            if stop_after is not None and i >= stop_after:
                return i
            try:
                await c.push("ticks", {"columns": batches[i]}, producer="pusher", seq=i)
            except (Unavailable, OSError, ConnectionError):
                return i
            await asyncio.sleep(0.02)
    return len(batches)


def test_kill_9_mid_stream_then_restart_gives_exact_output(tmp_path: Path) -> None:
    batches = make_batches()
    want = keyed_window_sums(batches)
    want_neg = Counter(
        (k, v, t) for b in batches for k, v, t in zip(b["k"], b["v"], b["t"], strict=True) if v < 0
    )
    want_big = Counter(
        (k, v, t)
        for b in batches
        for k, v, t in zip(b["k"], b["v"], b["t"], strict=True)
        if v >= 40
    )
    data, shared = tmp_path / "peer-data", tmp_path / "nfs"
    peer = PeerProcess(
        data, "--checkpoint-dir", f"file://{shared}", log_path=tmp_path / "peer.log"
    ).start()
    try:

        async def phase_one() -> int:
            async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
                await c.create_schema(SCHEMA)
                await c.create_stream("ticks", "tick")
                await c.create_query(QUERY)
                await c.start_query("rec")
                await c.create_query(LANE_QUERY)
                await c.start_query("neg")
                await c.create_query(BIG_QUERY)
                await c.start_query("big")
            acked = await push_from(peer.port, batches, 0, stop_after=BATCHES // 3)
            async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
                first = await collect(c, "rec_out", 1, timeout_s=120)
                assert first, "no result before the kill: the query never ran"
            # Keep pushing and kill the peer (and its JVM) while batches are in flight.
            pusher = asyncio.create_task(push_from(peer.port, batches, acked))
            await asyncio.sleep(random.Random(5).uniform(0.3, 1.0))
            peer.kill()
            return await asyncio.wait_for(pusher, 60)

        resume_at = asyncio.run(phase_one())
        assert resume_at < BATCHES, "the kill came after the last push; nothing was interrupted"

        peer.extra = ()  # restarted without --checkpoint-dir
        peer.start()

        async def phase_two() -> tuple[list[dict[str, Any]], ...]:
            # Re-send the batch that may have landed without its ack reaching us.
            done = await push_from(peer.port, batches, max(0, resume_at - 1))
            assert done == BATCHES
            async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
                status = await c.status()
                assert [q["status"] for q in status["queries"]] == ["RUNNING"] * 3
                # Each query came back where its checkpoint is: big in the lane, neg alone.
                lane = {q["name"]: bool(q.get("lane")) for q in status["queries"]}
                assert lane == {"big": True, "neg": False, "rec": False}
                out = await collect(c, "rec_out", sum(want.values()), timeout_s=180, settle_s=5)
                neg = await collect(c, "rec_neg", sum(want_neg.values()), timeout_s=60, settle_s=3)
                big = await collect(c, "rec_big", sum(want_big.values()), timeout_s=60, settle_s=3)
                return out, neg, big

        rows, neg_rows, big_rows = asyncio.run(phase_two())
    finally:
        peer.stop()
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
    # every query resumed from beneath the shared directory; none under the data directory
    assert not (data / "checkpoints").exists()
    (home,) = shared.iterdir()
    assert {"lane", "rec", "neg"} <= {
        d.name.split("-")[0] for d in (home / "checkpoints").iterdir()
    }
    assert Counter((r["k"], r["v"], r["t"]) for r in neg_rows) == want_neg
    assert Counter((r["k"], r["v"], r["t"]) for r in big_rows) == want_big
