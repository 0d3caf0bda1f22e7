"""The fedspool streaming source under a real Spark session: exactly once, in order, bounded."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from peer.engine.source import SEQ_SHIFT, read_stream
from peer.storage.spool import Spool
from peer.testing import wait_until_sync

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("t", pa.timestamp("us", "UTC"))])
DDL = "`k` BIGINT, `v` DOUBLE, `t` TIMESTAMP"
TIMEOUT_S = 90.0


def rows(first: int, n: int) -> pa.Table:
    ks = pa.array(range(first, first + n), pa.int64())
    return pa.table(
        {
            "k": ks,
            "v": pa.array([float(k) / 2 for k in range(first, first + n)]),
            "t": pa.array([k * 1000 for k in range(first, first + n)], pa.timestamp("us", "UTC")),
        }
    )


class Collected:
    """What foreachBatch saw: (batch id, Arrow table) per micro-batch."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[int, pa.Table]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        table = df.toArrow()
        with self.lock:
            self.batches.append((batch_id, table))

    def table(self) -> pa.Table:
        with self.lock:
            tables = [t for _, t in self.batches if t.num_rows]
        return pa.concat_tables(tables) if tables else pa.table({"k": pa.array([], pa.int64())})

    def count(self) -> int:
        with self.lock:
            return sum(t.num_rows for _, t in self.batches)

    def keys(self) -> list[int]:
        return list(self.table().column("k").to_pylist())


@contextmanager
def running(
    spark: Any, spool: Spool, checkpoint: Path, sink: Collected, **kwargs: Any
) -> Iterator[Any]:
    df = read_stream(spark, spool.directory, DDL, "q", **kwargs)
    query = (
        df.writeStream.foreachBatch(sink)
        .trigger(processingTime="0 seconds")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        yield query
        assert query.exception() is None
    finally:
        query.stop()


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", SCHEMA, fsync=False)
    s.register_reader("q")
    return s


def test_rows_arrive_once_in_order_and_later_appends_are_picked_up(
    spark: Any, spool: Spool, tmp_path: Path
) -> None:
    # 12k-row files: the first micro-batch is split across two source partitions.
    for i in range(5):
        spool.append(rows(i * 12_000, 12_000))
    sink = Collected()
    with running(spark, spool, tmp_path / "ck", sink):
        wait_until_sync(lambda: sink.count() >= 60_000, "the backlog", TIMEOUT_S, every_s=0.1)
        for i in range(5, 8):
            spool.append(rows(i * 12_000, 12_000))

            def arrived(i: int = i) -> bool:
                return sink.count() >= (i + 1) * 12_000

            wait_until_sync(arrived, f"file {i}", TIMEOUT_S, every_s=0.1)
        time.sleep(1.0)  # nothing more may arrive
    assert sink.keys() == list(range(96_000))
    table = sink.table()
    assert table.column("v").to_pylist()[:3] == [0.0, 0.5, 1.0]
    assert table.schema.field("t").type == pa.timestamp("us", "UTC")
    assert table.column("t")[1_234].value == 1_234_000


def test_max_rows_bounds_each_micro_batch(spark: Any, spool: Spool, tmp_path: Path) -> None:
    for i in range(20):
        spool.append(rows(i * 100, 100))
    spool.append(rows(2_000, 400))  # bigger than the limit: still read, alone
    sink = Collected()
    with running(spark, spool, tmp_path / "ck", sink, max_rows=250):
        wait_until_sync(lambda: sink.count() >= 2_400, "all rows", TIMEOUT_S, every_s=0.1)
    sizes = [t.num_rows for _, t in sink.batches if t.num_rows]
    assert sizes == [200] * 10 + [400]
    assert sink.keys() == list(range(2_400))


def test_commits_advance_and_trim_deletes_consumed_files(
    spark: Any, spool: Spool, tmp_path: Path
) -> None:
    for i in range(6):
        spool.append(rows(i * 10, 10))
    sink = Collected()
    with running(spark, spool, tmp_path / "ck", sink, max_rows=20):
        wait_until_sync(lambda: sink.count() >= 60, "all rows", TIMEOUT_S, every_s=0.1)
        # Spark commits batch N to the source when it plans batch N + 1: the last batch's
        # files stay until more data comes.
        wait_until_sync(lambda: spool.committed("q") >= 3, "a commit", TIMEOUT_S, every_s=0.1)
        committed = spool.committed("q")
        assert spool.trim() == committed + 1
        assert spool.earliest == committed + 1
        spool.append(rows(60, 10))
        wait_until_sync(lambda: sink.count() >= 70, "the new rows", TIMEOUT_S, every_s=0.1)
        wait_until_sync(
            lambda: spool.committed("q") >= 5, "the commit of file 5", TIMEOUT_S, every_s=0.1
        )
        spool.trim()
        assert spool.earliest == spool.committed("q") + 1
    assert sink.keys() == list(range(70))


def test_restart_on_same_checkpoint_continues_without_duplicates(
    spark: Any, spool: Spool, tmp_path: Path
) -> None:
    for i in range(4):
        spool.append(rows(i * 50, 50))
    first, second = Collected(), Collected()
    with running(spark, spool, tmp_path / "ck", first, max_rows=100):
        wait_until_sync(lambda: first.count() >= 200, "the first run", TIMEOUT_S, every_s=0.1)
    for i in range(4, 7):
        spool.append(rows(i * 50, 50))
    with running(spark, spool, tmp_path / "ck", second, max_rows=100):
        wait_until_sync(
            lambda: first.count() + second.count() >= 350, "the second run", TIMEOUT_S, every_s=0.1
        )
        spool.append(rows(350, 50))
        wait_until_sync(
            lambda: first.count() + second.count() >= 400, "a later append", TIMEOUT_S, every_s=0.1
        )
        time.sleep(1.0)
    # A stop between the sink and Spark's commit log makes the restart re-run the last batch
    # with the same id and the same rows (an at-least-once sink): the peer's spool keeps one
    # copy per (query, batch id), and so does this merge. Anything else would be a bug.
    merged: dict[int, pa.Table] = {}
    for bid, table in first.batches + second.batches:
        if bid in merged:
            assert merged[bid].equals(table), f"batch {bid} re-ran with other rows"
        merged[bid] = table
    keys = [k for bid in sorted(merged) for k in merged[bid].column("k").to_pylist()]
    assert keys == list(range(400))
    assert min(bid for bid, _ in second.batches) >= max(bid for bid, _ in first.batches)


def test_with_seq_gives_strictly_increasing_arrival_order(
    spark: Any, spool: Spool, tmp_path: Path
) -> None:
    sizes = [3, 1, 500, 7, 40]
    first = 0
    for n in sizes:
        spool.append(rows(first, n))
        first += n
    sink = Collected()
    with running(spark, spool, tmp_path / "ck", sink, with_seq=True, max_rows=100):
        wait_until_sync(lambda: sink.count() >= first, "all rows", TIMEOUT_S, every_s=0.1)
    table = sink.table()
    assert table.column_names == ["k", "v", "t", "__seq"]
    assert table.schema.field("__seq").type == pa.int64()
    expected = [(offset << SEQ_SHIFT) + row for offset, n in enumerate(sizes) for row in range(n)]
    assert table.column("__seq").to_pylist() == expected
    assert table.column("k").to_pylist() == list(range(first))


def test_a_query_reads_no_further_than_the_watermark(
    spark: Any, spool: Spool, tmp_path: Path
) -> None:
    for i in range(6):
        spool.append(rows(i * 10, 10))
    spool.hold(2)  # a replicated stream: 3..5 are not acknowledged yet
    sink = Collected()
    with running(spark, spool, tmp_path / "ck", sink):
        wait_until_sync(lambda: sink.count() >= 30, "the acknowledged rows", TIMEOUT_S, every_s=0.1)
        time.sleep(1.5)  # several idle micro-batch plans: none may pass the watermark
        assert sink.count() == 30 and spool.committed("q") <= 2
        spool.hold(4)
        wait_until_sync(
            lambda: sink.count() >= 50, "rows up to the new watermark", TIMEOUT_S, every_s=0.1
        )
        time.sleep(1.0)
        assert sink.count() == 50
        spool.hold(None)  # no longer replicated: to the log end
        wait_until_sync(lambda: sink.count() >= 60, "the last file", TIMEOUT_S, every_s=0.1)
    assert sink.keys() == list(range(60))
