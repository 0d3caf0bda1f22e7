"""Backpressure: a stream's slowest reader bounds what its writers may add (no JVM: the Spark
source's planning is called directly). What a client sees of it, through a running peer, is
tests/integration/test_backpressure.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType

from peer.engine.source import SpoolStreamReader
from peer.storage.spool import Spool
from peer.storage.spool_format import backlog, write_reader_offset, write_taken

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
    start = {"offset": -1}
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start
    write_reader_offset(output.directory, "downstream", 3, fsync=False)  # 2 behind now
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"offset": 4}
