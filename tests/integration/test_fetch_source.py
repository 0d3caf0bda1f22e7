"""Fetched input under real Spark: the ``fedspool`` source in remote mode (as the engine sets
it when the master is not local; forced here under ``local[2]``) reads every file through the
peer's fetch server, and queries over it equal plain Python tuple for tuple. A capability the
peer did not sign, or one past its expiry, fails the query with the reason, and the server goes
on serving the next query."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from peer.engine.source import read_stream
from peer.fetch.capability import FetchKey
from peer.fetch.protocol import FetchEndpoint
from peer.storage.spool import Spool
from peer.testing import FetchServerThread, wait_until_sync
from tests.integration.test_source import Collected

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("k", pa.int32()), ("v", pa.float64()), ("t", pa.timestamp("us", "UTC"))])
DDL = "`k` INT, `v` DOUBLE, `t` TIMESTAMP"
FILES, ROWS = 6, 10_000  # 60 s of event time, one row a millisecond
TIMEOUT_S = 120.0


def batch(first: int, n: int) -> pa.Table:
    ids = range(first, first + n)
    return pa.table(
        {
            "k": pa.array([(i * 7) % 5 for i in ids], pa.int32()),
            "v": pa.array([i * 0.5 for i in ids]),
            "t": pa.array([i * 1000 for i in ids], pa.timestamp("us", "UTC")),
        }
    )


@pytest.fixture
def spool(data_dir: Path) -> Spool:
    s = Spool(data_dir / "spools" / "in", SCHEMA, fsync=False, name="in")
    s.register_reader("q")
    for f in range(FILES):
        s.append(batch(f * ROWS, ROWS))
    return s


def inputs() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = batch(0, FILES * ROWS).to_pylist()
    return rows


@contextmanager
def running(frame: Any, checkpoint: Path, sink: Collected, mode: str = "append") -> Iterator[Any]:
    query = (
        frame.writeStream.foreachBatch(sink)
        .outputMode(mode)
        .trigger(processingTime="0 seconds")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        yield query
    finally:
        query.stop()


def test_a_filter_over_fetched_input_equals_plain_python(
    spark: Any, spool: Spool, data_dir: Path, tmp_path: Path
) -> None:
    with FetchServerThread(data_dir) as fetch:
        df = read_stream(spark, spool.directory, DDL, "q", fetch=fetch.endpoint)
        frame = df.where("k = 3 AND v >= 100").select("k", "v")
        sink = Collected()
        want = sorted((r["k"], r["v"]) for r in inputs() if r["k"] == 3 and r["v"] >= 100)
        with running(frame, tmp_path / "ck", sink) as query:
            wait_until_sync(lambda: sink.count() >= len(want), "the filtered rows", TIMEOUT_S)
            time.sleep(1.0)  # nothing more may arrive
            assert query.exception() is None
        got = sorted(zip(*(sink.table().column(c).to_pylist() for c in ("k", "v")), strict=True))
        assert got == want
        assert fetch.server.served_files == FILES  # every file came through the peer
        assert fetch.server.refused == 0


def test_a_windowed_aggregate_over_fetched_input_equals_plain_python(
    spark: Any, spool: Spool, data_dir: Path, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    spool.append(batch(1_000_000, 1))  # its event time (1000 s) closes every earlier window
    sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0, 0.0])
    for r in inputs():
        key = (int(r["t"].timestamp()), r["k"])
        sums[key][0] += 1
        sums[key][1] += r["v"]
    want = sorted((start, k, int(n), total) for (start, k), (n, total) in sums.items())
    with FetchServerThread(data_dir) as fetch:
        df = read_stream(spark, spool.directory, DDL, "q", fetch=fetch.endpoint)
        frame = (
            df.withWatermark("t", "0 seconds")
            .groupBy(F.window("t", "1 second"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
            .select(F.unix_timestamp("window.start").alias("start"), "k", "n", "total")
        )
        sink = Collected()
        with running(frame, tmp_path / "ck", sink) as query:
            wait_until_sync(lambda: sink.count() >= len(want), "every window", TIMEOUT_S)
            time.sleep(1.0)
            assert query.exception() is None
        table = sink.table()
        got = sorted(
            zip(*(table.column(c).to_pylist() for c in ("start", "k", "n", "total")), strict=True)
        )
        assert len(got) == len(want) == 60 * 5
        assert [g[:3] for g in got] == [w[:3] for w in want]
        assert all(g[3] == pytest.approx(w[3], rel=1e-12) for g, w in zip(got, want, strict=True))
        assert fetch.server.served_files == FILES + 1


def failure_of(spark: Any, spool: Spool, checkpoint: Path, endpoint: FetchEndpoint) -> str:
    df = read_stream(spark, spool.directory, DDL, "q", fetch=endpoint)
    sink = Collected()
    with running(df, checkpoint, sink) as query:
        wait_until_sync(lambda: query.exception() is not None, "the query to fail", TIMEOUT_S)
        message = str(query.exception())
    assert sink.count() == 0
    return message


def test_capabilities_the_peer_did_not_sign_or_that_expired_are_refused(
    spark: Any, spool: Spool, data_dir: Path, tmp_path: Path
) -> None:
    forger = tmp_path / "forger"
    FetchKey.load_or_create(forger)
    with FetchServerThread(data_dir) as fetch:
        real = fetch.endpoint
        # planned with a key that is not the peer's: a forger's capabilities
        forged = FetchEndpoint(real.address, real.pin, str(forger / "keys" / "fetch.key"), 60)
        message = failure_of(spark, spool, tmp_path / "ck1", forged)
        assert "read capability refused (other-key)" in message
        # signed by the peer, but the peer's clock is past their expiry when they arrive
        fetch.skew_s = 3600.0
        message = failure_of(spark, spool, tmp_path / "ck2", real)
        assert "read capability refused (expired)" in message
        assert fetch.server.refused >= 2 and fetch.server.served_files == 0
        # the server goes on serving: the next query reads everything
        fetch.skew_s = 0.0
        df = read_stream(spark, spool.directory, DDL, "q", fetch=real)
        sink = Collected()
        with running(df, tmp_path / "ck3", sink):
            wait_until_sync(lambda: sink.count() >= FILES * ROWS, "every row", TIMEOUT_S)
        assert sorted(sink.table().column("v").to_pylist()) == [r["v"] for r in inputs()]
