"""Age-based retention: only for spools no reader holds back. Time is a ManualClock's."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from peer.storage.spool import Spool, SpoolSet
from peer.testing import ManualClock

SCHEMA = pa.schema([pa.field("x", pa.int64(), nullable=False)])


def table(x: int) -> pa.Table:
    return pa.table({"x": pa.array([x], pa.int64())}, schema=SCHEMA)


def test_old_files_go_when_no_reader_holds_them(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, clock_ns=clock.time_ns)
    spool.append(table(0))
    clock.advance(0.1)
    spool.append(table(1))
    clock.advance(0.3)
    spool.append(table(2))
    assert spool.append_time_ns(1) == 1_000_100_000_000
    assert spool.trim() == 0  # no age given: a reader-less spool keeps everything
    assert spool.trim(max_age_s=0.35) == 1  # offset 0 is 0.4 s old, offset 1 only 0.3 s
    assert spool.earliest == 1
    clock.advance(0.1)
    assert spool.trim(max_age_s=0.35) == 1  # now offset 1 is 0.4 s old too
    assert spool.earliest == 2
    assert [t.column("x").to_pylist() for _, t in spool.read(1, 2)] == [[2]]


def test_a_reader_holds_back_what_it_has_not_committed(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, clock_ns=clock.time_ns)
    spool.register_reader("q")
    for i in range(3):
        spool.append(table(i))
    clock.advance(0.3)
    assert spool.trim(max_age_s=0.1) == 0  # old, but uncommitted by reader q
    assert spool.earliest == 0


def test_a_spool_set_hands_its_clock_to_every_spool_it_opens(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    spools = SpoolSet(tmp_path / "spool", fsync=False, clock_ns=clock.time_ns)
    spools.create("s", SCHEMA).append(table(0))
    clock.advance(5.0)
    reopened = SpoolSet(tmp_path / "spool", fsync=False, clock_ns=clock.time_ns).get("s")
    assert reopened.append_time_ns(0) == 1_000_000_000_000
    assert reopened.trim(max_age_s=6.0) == 0 and reopened.trim(max_age_s=4.0) == 1
