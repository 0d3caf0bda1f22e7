"""Age-based retention: only for spools no reader holds back."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from peer.storage.spool import Spool

SCHEMA = pa.schema([pa.field("x", pa.int64(), nullable=False)])


def table(x: int) -> pa.Table:
    return pa.table({"x": pa.array([x], pa.int64())}, schema=SCHEMA)


def test_old_files_go_when_no_reader_holds_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    spool.append(table(0))
    spool.append(table(1))
    time.sleep(0.3)
    spool.append(table(2))
    assert spool.trim() == 0  # no age given: a reader-less spool keeps everything
    assert spool.trim(max_age_s=0.2) == 2
    assert spool.earliest == 2
    assert [t.column("x").to_pylist() for _, t in spool.read(1, 2)] == [[2]]


def test_a_reader_holds_back_what_it_has_not_committed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    spool.register_reader("q")
    for i in range(3):
        spool.append(table(i))
    time.sleep(0.3)
    assert spool.trim(max_age_s=0.1) == 0  # old, but uncommitted by reader q
    assert spool.earliest == 0
