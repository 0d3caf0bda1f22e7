"""A query whose Spark streaming query fails is started again from its checkpoint, and its
output stays exact (peer.site.restarts: Flink's restart strategy, on a peer).

One peer on the test process's Spark session runs two keyed windowed aggregates over one
stream: the first in its own streaming query, the second in the shared lane. Each result
spool refuses its first append (as a full or failing disk would), which fails the batch
and with it the streaming query (the whole lane, for the second). The peer's maintenance
sees them failed, waits its first delay and starts them again: Spark re-runs the failed
batch from the checkpoint, and both outputs equal plain Python, no window lost or twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from peer.client import Client
from peer.testing import (
    PeerThread,
    collect,
    keyed_window_batches,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

QUERIES = {"own_q": "own_out", "lane_q": "lane_out"}


@pytest.fixture(scope="module")
def peer_options() -> dict[str, Any]:
    return {"lane_after": 1}  # the first windowed aggregate on its own, the second in the lane


def test_failed_queries_start_again_and_their_outputs_stay_exact(peer: PeerThread) -> None:
    batches = keyed_window_batches(7, 40, 100, keys=4, values=(0, 50))
    batches.append({"k": [0], "v": [1], "t": [batches[-1]["t"][-1] + 100]})  # closes them all
    want = keyed_window_sums(batches)
    site = peer.peer.site
    assert site is not None and site.engine is not None
    engine = site.engine

    async def scenario() -> dict[str, list[dict[str, Any]]]:
        async with Client("127.0.0.1", peer.port, timeout_s=120) as cl:
            await cl.create_schema(keyed_window_schema("rtick"))
            await cl.create_stream("rticks", "rtick")
            for name, out in QUERIES.items():
                q = keyed_window_query(name, "rticks", out, kept=f"{name}_kept")
                await cl.create_query(q)
                await cl.start_query(name)
            assert "own_q" in engine.running and "lane_q" in engine.lane.members
            refused: list[str] = []
            for out in QUERIES.values():  # each result spool refuses its first append
                spool = site.spools.get(out)
                real, calls = spool.append, [0]

                def failing(*args: Any, _real: Any = real, _calls: list[int] = calls,
                            _out: str = out, **kwargs: Any) -> Any:  # fmt: skip
                    _calls[0] += 1
                    if _calls[0] == 1:
                        refused.append(_out)
                        raise OSError(f"{_out}: no space left on device (injected)")
                    return _real(*args, **kwargs)

                spool.append = failing  # type: ignore[method-assign]
            for seq, batch in enumerate(batches):
                await cl.push("rticks", {"columns": batch}, producer="p", seq=seq)
                await asyncio.sleep(0.05)

            async def both_restarted() -> bool:
                return all(site.restarts.attempts(q) >= 1 for q in QUERIES) and not (
                    await engine.failed()
                )

            await wait_until(both_restarted, "both queries started again", 120, every_s=0.5)
            assert sorted(refused) == sorted(QUERIES.values())
            return {
                out: await collect(cl, out, sum(want.values()), timeout_s=120, settle_s=3)
                for out in QUERIES.values()
            }

    outputs = peer.call(scenario(), 240)
    for out, rows in outputs.items():
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        assert got == want, f"{out}: {sum(got.values())} windows, plain Python {len(want)}"
