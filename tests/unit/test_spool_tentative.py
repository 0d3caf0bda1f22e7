"""Tentative batches and undo entries in a spool (peer.storage, issue 16)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from peer.model.tentative import STABLE, TENTATIVE, UNDO
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool

SCHEMA = pa.schema([pa.field("v", pa.int64(), nullable=False)])


def rows(*values: int) -> pa.Table:
    return pa.table({"v": pa.array(values, pa.int64())}, schema=SCHEMA)


def test_marks_survive_a_reopen_and_stable_readers_skip_them(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, name="s")
    assert spool.append(rows(1)) == 0
    assert spool.append(rows(101), status=TENTATIVE) == 1
    assert spool.append(rows(2)) == 2
    assert spool.append(rows(102), status=TENTATIVE, origin="t", seq=0) == 3
    assert spool.append(rows().slice(0, 0), undo=1) == 4  # an undo holds no rows
    assert spool.append(rows(3)) == 5
    again = Spool(tmp_path / "s", SCHEMA, fsync=False, name="s")
    for log in (spool, again):
        assert [(o, t.column("v").to_pylist()) for o, t in log.read(-1, 5)] == [
            (0, [1]),
            (2, [2]),
            (5, [3]),
        ]
        entries = [(o, st, u, t.num_rows) for o, st, u, t in log.read_entries(-1, 5)]
        assert entries == [
            (0, STABLE, None, 1),
            (1, TENTATIVE, None, 1),
            (2, STABLE, None, 1),
            (3, TENTATIVE, None, 1),
            (4, UNDO, 1, 0),
            (5, STABLE, None, 1),
        ]
    # a tentative batch keeps the replay memory of its tag
    assert again.append(rows(102), status=TENTATIVE, origin="t", seq=0) is None


def test_an_undo_file_is_a_valid_replica_entry_and_junk_marks_are_not(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, name="s")
    spool.append(rows(7), status=TENTATIVE)
    spool.append(rows().slice(0, 0), undo=0)
    data = (fmt.offset_path(spool.directory, 1)).read_bytes()
    info = fmt.check_file_bytes(data, SCHEMA)
    assert (info.status, info.undo, info.rows) == (UNDO, 0, 0)
    bad = SCHEMA.with_metadata({b"fedstream.status": b"maybe"})
    junk = fmt.file_bytes(pa.table({"v": [1]}, schema=bad))
    with pytest.raises(ValueError, match="unknown status 'maybe'"):
        fmt.check_file_bytes(junk, SCHEMA)
    empty = fmt.file_bytes(rows().slice(0, 0))
    with pytest.raises(ValueError, match="0 rows"):
        fmt.check_file_bytes(empty, SCHEMA)
