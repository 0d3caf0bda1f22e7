"""Backpressure: a stream's slowest reader bounds what its writers may add (no JVM: the Spark
source's planning is called directly). What a client sees of it, through a running peer, is
tests/integration/test_backpressure.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from peer.engine.source import SpoolOffset, SpoolStreamReader
from peer.errors import Unavailable
from peer.site import LocalSite, SiteConfig
from peer.storage.spool import Spool
from peer.storage.spool_format import backlog, write_reader_offset, write_taken
from peer.testing import ManualClock
from peer.timing import wait_until

SCHEMA = pa.schema([("x", pa.int64())])


def fill(spool: Spool, n: int) -> None:
    for i in range(n):
        spool.append(pa.table({"x": pa.array([i], pa.int64())}))


def test_backlog_counts_the_slowest_active_reader(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert spool.backlog() == 0  # no readers: nothing to wait for
    fill(spool, 10)
    spool.register_reader("fast")
    spool.register_reader("slow")
    write_reader_offset(spool.directory, "fast", 8, fsync=False)
    write_reader_offset(spool.directory, "slow", 2, fsync=False)
    assert spool.backlog() == backlog(spool.directory) == 7
    spool.pause_reader("slow")  # a stopped query keeps its data but holds nobody back
    assert spool.backlog() == backlog(spool.directory) == 1
    assert spool.trim() == 3  # ...and still protects what it has not read
    spool.pause_reader("slow", False)
    assert spool.backlog() == 7
    # what a query has taken into a batch counts at once (its commit comes a batch later,
    # and a query with no new input would never commit: no deadlock at a small bound)
    write_taken(spool.directory, "slow", 9)
    assert spool.backlog() == backlog(spool.directory) == 1


def test_a_query_reads_no_input_while_its_output_is_backlogged(tmp_path: Path) -> None:
    source = Spool(tmp_path / "in", SCHEMA, fsync=False)
    output = Spool(tmp_path / "out", SCHEMA, fsync=False)
    fill(source, 5)
    fill(output, 6)
    output.register_reader("downstream")  # at -1: 6 batches behind
    options = {
        "path": str(source.directory),
        "holdBack": str(output.directory),
        "maxBacklog": "4",
        "maxRowsPerBatch": "0",
    }
    reader = SpoolStreamReader(options, StructType([StructField("x", LongType())]))
    start: SpoolOffset = {"offset": -1}
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start
    write_reader_offset(output.directory, "downstream", 3, fsync=False)  # 2 behind now
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"offset": 4}


def test_a_backlogged_push_waits_on_the_sites_clock_then_fails_retriably(tmp_path: Path) -> None:
    """The site's backlog wait runs on the clock it was given: with a ManualClock the push
    waits while time stands still, goes through once the reader catches up, and fails after
    ``backlog_wait_s`` of the clock, not of the wall (nothing here sleeps)."""
    clock = ManualClock(100.0)
    config = SiteConfig(data_dir=tmp_path, max_backlog_batches=2, backlog_wait_s=5.0)

    async def main() -> None:
        site = LocalSite(config, clock=clock)
        try:
            await site.create_schema({"name": "n", "fields": [{"name": "x", "type": "long"}]})
            await site.create_stream("s", "n")
            spool = site.spools.get("s")
            spool.register_reader("lagging")
            for i in range(3):
                await site.push("s", {"columns": {"x": [i]}}, None, None)
            assert spool.backlog() == 3

            waiting = asyncio.create_task(site.push("s", {"columns": {"x": [3]}}, None, None))
            await wait_for_sleepers(clock)
            clock.advance(4.9)  # still inside backlog_wait_s
            await wait_for_sleepers(clock)
            assert not waiting.done() and spool.latest == 2
            write_reader_offset(spool.directory, "lagging", 0, fsync=False)  # the reader moves
            clock.advance(0.05)
            reply = await asyncio.wait_for(waiting, 5)
            assert (reply.count, reply.offset, spool.latest) == (1, 3, 3)

            failing = asyncio.create_task(site.push("s", {"columns": {"x": [4]}}, None, None))
            await wait_for_sleepers(clock)
            clock.advance(5.1)  # past backlog_wait_s on the site's clock
            with pytest.raises(Unavailable, match="backlogged") as refused:
                await asyncio.wait_for(failing, 5)
            assert refused.value.retriable
            assert spool.latest == 3  # the refused batch was not kept
        finally:
            await site.close()

    asyncio.run(main())


async def wait_for_sleepers(clock: ManualClock) -> None:
    """Until a task sleeps on ``clock`` (the push's backlog wait; its decoding runs in a
    thread, so the loop is polled rather than asked whether all tasks are blocked)."""
    await wait_until(lambda: clock.sleepers, "the push to wait on the clock", 5, every_s=0)
