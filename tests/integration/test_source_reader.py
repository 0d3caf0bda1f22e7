"""The fedspool reader's planning and reading, called directly as Spark's runner would (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
)
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from peer.engine.source import SpoolDataSource, SpoolRange, SpoolStreamReader
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import TrimmedError

SPOOL_SCHEMA = pa.schema([("a", pa.int32()), ("s", pa.string()), ("t", pa.timestamp("us"))])
SPARK_SCHEMA = StructType(
    [
        StructField("a", IntegerType()),
        StructField("s", StringType()),
        StructField("t", TimestampType()),
    ]
)


def table(n: int, first: int = 0) -> pa.Table:
    return pa.table(
        {
            "a": pa.array(range(first, first + n), pa.int32()),
            "s": [f"s{i}" for i in range(n)],
            "t": pa.array([i * 1_000_000 for i in range(n)], pa.timestamp("us")),
        }
    )


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "s", SPOOL_SCHEMA, fsync=False)


def reader(spool: Spool, schema: StructType = SPARK_SCHEMA, **options: str) -> SpoolStreamReader:
    opts = {"path": str(spool.directory), "reader": "q", "noFsync": "true", **options}
    return SpoolStreamReader(opts, schema)


def test_data_source_schema_and_options_are_case_insensitive(spool: Spool) -> None:
    from pyspark.sql.datasource import CaseInsensitiveDict

    options = CaseInsensitiveDict(
        {"path": str(spool.directory), "schema": "`a` INT", "withSeq": "true"}
    )
    source = SpoolDataSource(options)
    assert SpoolDataSource.name() == "fedspool"
    assert source.schema() == "`a` INT, `__seq` BIGINT"
    seq_schema = StructType([StructField("a", IntegerType()), StructField("__seq", LongType())])
    r = source.streamReader(seq_schema)
    assert r.with_seq and r.max_rows == 200_000
    assert r.getDefaultReadLimit() == ReadMaxRows(200_000)
    assert reader(spool, maxRowsPerBatch="0").getDefaultReadLimit() == ReadAllAvailable()
    with pytest.raises(ValueError, match="schema"):
        SpoolDataSource(CaseInsensitiveDict({"path": "x"})).schema()
    with pytest.raises(ValueError, match="path"):
        SpoolStreamReader({}, SPARK_SCHEMA)


def test_latest_offset_honours_each_read_limit(spool: Spool) -> None:
    for n in [100, 100, 100, 500, 10]:
        spool.append(table(n))
    r = reader(spool)
    start = r.initialOffset()
    assert start == {"offset": -1}
    assert r.latestOffset(start, ReadAllAvailable()) == {"offset": 4}
    assert r.latestOffset(start, ReadMaxRows(250)) == {"offset": 1}
    assert r.latestOffset({"offset": 2}, ReadMaxRows(250)) == {"offset": 3}  # one file at least
    assert r.latestOffset(start, ReadMaxFiles(3)) == {"offset": 2}
    size = fmt.offset_path(spool.directory, 0).stat().st_size
    assert r.latestOffset(start, ReadMaxBytes(size * 2)) == {"offset": 1}
    assert r.latestOffset({"offset": 3}, ReadMinRows(50)) == {"offset": 3}  # 10 rows < 50
    assert r.latestOffset({"offset": 2}, ReadMinRows(50)) == {"offset": 4}
    assert r.latestOffset({"offset": 4}, ReadMaxRows(250)) == {"offset": 4}  # idle
    assert r.reportLatestOffset() == {"offset": 4}


def test_latest_offset_stops_at_a_gap(spool: Spool) -> None:
    for _ in range(3):
        spool.append(table(5))
    # A file not yet renamed into place (simulated): nothing after it may be read yet.
    hidden = fmt.offset_path(spool.directory, 1)
    hidden.rename(hidden.with_name(".tmp-hidden"))
    assert reader(spool).latestOffset({"offset": -1}, ReadAllAvailable()) == {"offset": 0}


def test_trimmed_data_is_an_error_not_a_stall(spool: Spool) -> None:
    for _ in range(4):
        spool.append(table(5))
    spool.register_reader("other")
    spool.register_reader("q")
    fmt.write_reader_offset(spool.directory, "other", 2)
    fmt.write_reader_offset(spool.directory, "q", 2)
    spool.trim()
    r = reader(spool)
    assert r.initialOffset() == {"offset": 2}
    with pytest.raises(TrimmedError, match=r"0\.\.2"):
        r.latestOffset({"offset": -1}, ReadAllAvailable())
    with pytest.raises(TrimmedError, match="offset 1"):
        list(r.read(SpoolRange(1, 3)))


def test_initial_offset_latest_and_after_full_trim(spool: Spool) -> None:
    assert reader(spool).initialOffset() == {"offset": -1}
    for _ in range(3):
        spool.append(table(5))
    assert reader(spool, startingOffset="latest").initialOffset() == {"offset": 2}
    spool.register_reader("q")
    fmt.write_reader_offset(spool.directory, "q", 2)
    spool.trim()
    assert reader(spool).initialOffset() == {"offset": 2}
    assert reader(spool, startingOffset="latest").initialOffset() == {"offset": 2}
    with pytest.raises(ValueError, match="startingOffset"):
        reader(spool, startingOffset="middle")


def test_partitions_split_by_rows_and_cover_the_range(spool: Spool) -> None:
    for n in [30_000, 5_000, 5_000, 20_000, 10]:
        spool.append(table(n))
    r = reader(spool)
    parts = r.partitions({"offset": -1}, {"offset": 4})
    assert [(p.first, p.last) for p in parts] == [(0, 0), (1, 4)]
    assert r.partitions({"offset": 4}, {"offset": 4}) == []
    assert [(p.first, p.last) for p in r.partitions({"offset": 0}, {"offset": 2})] == [(1, 2)]
    single = reader(spool, numPartitions="1").partitions({"offset": -1}, {"offset": 4})
    assert [(p.first, p.last) for p in single] == [(0, 4)]
    import pickle

    assert pickle.loads(pickle.dumps(parts[1])).last == 4


def test_read_matches_sparks_arrow_schema_exactly(spool: Spool) -> None:
    spool.append(table(3))
    spool.append(table(2, first=3))
    batches = list(reader(spool).read(SpoolRange(0, 1)))
    expected = pa.schema(
        [("a", pa.int32()), ("s", pa.string()), ("t", pa.timestamp("us", tz="UTC"))]
    )
    assert all(b.schema.equals(expected) for b in batches)
    assert pa.Table.from_batches(batches).column("a").to_pylist() == [0, 1, 2, 3, 4]


def test_read_with_seq_and_a_cast(spool: Spool) -> None:
    spool.append(table(3))
    spool.append(table(2))
    schema = StructType(
        [
            StructField("a", DoubleType()),
            StructField("t", TimestampType()),
            StructField("__seq", LongType()),
        ]
    )
    r = reader(spool, schema, withSeq="true")
    got = pa.Table.from_batches(list(r.read(SpoolRange(0, 1))))
    assert got.column_names == ["a", "t", "__seq"]
    assert got.column("a").to_pylist() == [0.0, 1.0, 2.0, 0.0, 1.0]
    assert got.column("__seq").to_pylist() == [0, 1, 2, 1 << 24, (1 << 24) + 1]


def test_commit_writes_the_reader_file_atomically(spool: Spool) -> None:
    spool.register_reader("q")
    r = reader(spool)
    r.commit({"offset": 7})
    assert spool.committed("q") == 7
    assert not list((spool.directory / "readers").glob(".tmp*"))
    anonymous = SpoolStreamReader({"path": str(spool.directory)}, SPARK_SCHEMA)
    anonymous.commit({"offset": 9})  # no reader id: nothing to record
    assert spool.committed("q") == 7


def test_trigger_available_now_stops_at_the_target(spool: Spool) -> None:
    spool.append(table(5))
    r = reader(spool)
    r.prepareForTriggerAvailableNow()
    spool.append(table(5))
    assert r.latestOffset({"offset": -1}, ReadAllAvailable()) == {"offset": 0}


def test_planning_never_passes_the_watermark(spool: Spool) -> None:
    for _ in range(6):
        spool.append(table(5))
    spool.hold(2)  # a replicated stream: offsets 3..5 are not acknowledged yet
    r = reader(spool)
    assert r.latestOffset({"offset": -1}, ReadAllAvailable()) == {"offset": 2}
    assert fmt.taken_offset(fmt.reader_path(spool.directory, "q")) == 2  # (backpressure)
    assert r.latestOffset({"offset": -1}, ReadMaxFiles(2)) == {"offset": 1}
    assert r.latestOffset({"offset": 2}, ReadAllAvailable()) == {"offset": 2}  # idle, not trimmed
    assert r.reportLatestOffset() == {"offset": 2}
    assert reader(spool, startingOffset="latest").initialOffset() == {"offset": 2}
    spool.hold(4)
    assert r.latestOffset({"offset": 2}, ReadAllAvailable()) == {"offset": 4}
    spool.hold(None)  # no file: no bound
    assert r.latestOffset({"offset": 4}, ReadAllAvailable()) == {"offset": 5}


def test_a_watermark_below_a_readers_start_plans_nothing(spool: Spool) -> None:
    for _ in range(4):
        spool.append(table(5))
    spool.hold(1)  # e.g. an older bound after a crash, before the peer holds again
    assert reader(spool).latestOffset({"offset": 3}, ReadAllAvailable()) == {"offset": 3}


def test_trigger_available_now_stops_at_the_watermark(spool: Spool) -> None:
    for _ in range(3):
        spool.append(table(5))
    spool.hold(0)
    r = reader(spool)
    r.prepareForTriggerAvailableNow()
    spool.hold(2)  # acknowledged after the trigger began: not part of this run
    assert r.latestOffset({"offset": -1}, ReadAllAvailable()) == {"offset": 0}
    later = reader(spool)
    later.prepareForTriggerAvailableNow()
    spool.hold(None)
    spool.append(table(5))
    assert later.latestOffset({"offset": 0}, ReadAllAvailable()) == {"offset": 2}


def test_named_offsets_and_a_follower_read_to_the_log_end(spool: Spool) -> None:
    # nameOffsets: each offset names the stream (a query with a standby); ignoreHold: a
    # standby reads a follower's copy to its log end, past the hold that keeps others out.
    for n in [10, 10, 10]:
        spool.append(table(n))
    spool.hold(0)  # readers may see offset 0 only
    held = reader(spool)
    assert held.latestOffset(held.initialOffset(), ReadAllAvailable()) == {"offset": 0}
    follower = reader(spool, ignoreHold="true", nameOffsets="true")
    start = follower.initialOffset()
    assert start == {"offset": -1, "stream": spool.name}
    assert follower.latestOffset(start, ReadAllAvailable()) == {"offset": 2, "stream": spool.name}
    assert follower.reportLatestOffset() == {"offset": 2, "stream": spool.name}
    assert len(follower.partitions(start, {"offset": 2, "stream": spool.name})) >= 1
