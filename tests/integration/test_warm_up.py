"""The engine's warm-up (peer.engine.warm) runs its small windowed query on a real Spark
session until the aggregate emits, and leaves nothing behind: no running streaming query, no
spool, no checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from peer.engine.runner import Engine
from peer.engine.warm import warm_up
from peer.storage.spool import SpoolSet
from peer.testing import run_async
from peer.timing import wait_until

pytestmark = pytest.mark.spark


def test_warm_up_emits_a_window_and_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    engine = Engine(SpoolSet(tmp_path / "spool"), tmp_path / "checkpoints")

    async def body() -> float | None:
        await engine.start(spark)
        try:
            return await warm_up(engine, timeout_s=90)
        finally:
            await engine.close()

    took = run_async(body, timeout_s=120)
    assert took is not None and took > 0  # None: it did not see the aggregate emit
    assert not (tmp_path / "checkpoints" / "~warm-up").exists()
    assert not [q.name for q in spark.streams.active if q.name == "~warm_up"]
    assert not engine.owns_session  # adopted: a peer would not have warmed it up


def test_warm_up_yields_to_a_query_of_the_peers_own(spark: Any, tmp_path: Path) -> None:
    # A query that starts while the warm-up runs (engine.serving, which run_query sets) ends
    # the warm-up at once: no window needed, nothing left behind.
    engine = Engine(SpoolSet(tmp_path / "spool"), tmp_path / "checkpoints")

    async def body() -> tuple[float | None, float | None]:
        await engine.start(spark)
        try:
            warming = asyncio.ensure_future(warm_up(engine, timeout_s=90))
            await wait_until(
                lambda: any(q.name == "~warm_up" for q in spark.streams.active) or None,
                "the warm-up's streaming query",
                60,
            )
            engine.serving.set()
            yielded = await asyncio.wait_for(warming, 60)
            again = await warm_up(engine, timeout_s=90)  # serving already: not even started
            return yielded, again
        finally:
            await engine.close()

    yielded, again = run_async(body, timeout_s=120)
    assert yielded is None and again is None
    assert not (tmp_path / "checkpoints" / "~warm-up").exists()
    assert not [q.name for q in spark.streams.active if q.name == "~warm_up"]
