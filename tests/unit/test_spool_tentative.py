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


def test_a_mirrored_undo_names_the_receivers_own_first_tentative_offset(tmp_path: Path) -> None:
    """A replica's offsets need not be its host's: an undo is translated on arrival."""
    import asyncio

    from peer.model.schema import parse_schema
    from peer.site import LocalSite, SiteConfig

    def body(*values: int) -> bytes:
        sink = pa.BufferOutputStream()
        table = pa.table({"v": pa.array(values, pa.int64())})
        with pa.ipc.new_stream(sink, table.schema) as out:
            out.write_table(table)
        data: bytes = sink.getvalue().to_pybytes()
        return data

    async def go() -> list[tuple[int, str, int | None, int]]:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        schema = parse_schema({"name": "s", "fields": [{"name": "v", "type": "long"}]})
        await site.add_schema(schema)
        await site.add_replica("r", schema, "ab" * 20)
        spool = site.spools.get("r")
        spool.append(rows(0))  # the replica's own offset 0: its offsets differ by one
        batches = ((10, body(1), STABLE), (11, body(101), TENTATIVE), (12, body(102), TENTATIVE))
        await site.append_mirrored("r", "m:host", batches)
        empty = body()
        await site.append_mirrored("r", "m:host", ((13, empty, UNDO), (14, body(2), STABLE)))
        # a replayed undo finds nothing open and is not kept twice
        await site.append_mirrored("r", "m:host", ((13, empty, UNDO),))
        out = [(o, s, u, t.num_rows) for o, s, u, t in spool.read_entries(-1, spool.latest)]
        await site.close()
        return out

    assert asyncio.run(go()) == [
        (0, STABLE, None, 1),
        (1, STABLE, None, 1),
        (2, TENTATIVE, None, 1),
        (3, TENTATIVE, None, 1),
        (4, UNDO, 2, 0),
        (5, STABLE, None, 1),
    ]
