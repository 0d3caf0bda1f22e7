"""What a replica's spool does: its primary's bytes at its offsets, and divergent tails dropped.

Real spools in temporary directories; Hypothesis mutates files and drives a model of appends,
copies, trims, truncations and reopens. No JVM, no sockets.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import SpoolFault, TrimmedError

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string())])


def batch(k: int, rows: int = 2) -> pa.Table:
    return pa.table({"k": pa.array([k] * rows, pa.int64()), "name": [f"n{k}"] * rows})


def ks(spool: Spool) -> dict[int, int]:
    return {
        o: t.column("k")[0].as_py()
        for o, t in spool.read(spool.earliest - 1, spool.latest, skip_trimmed=True)
    }


def primary_with(tmp_path: Path, n: int) -> Spool:
    spool = Spool(tmp_path / "primary", SCHEMA, fsync=False)
    for k in range(n):
        spool.append(batch(k), origin="p" if k % 2 else "q", seq=k)
    return spool


# --------------------------------------------------------------------------- copying


def test_a_replica_holds_the_primarys_bytes_at_its_offsets(tmp_path: Path) -> None:
    primary = primary_with(tmp_path, 5)
    follower = Spool(tmp_path / "follower", SCHEMA, fsync=False)
    heard: list[int] = []
    follower.add_listener(heard.append)
    for offset in range(5):
        data = primary.read_file_bytes(offset)
        assert data == fmt.offset_path(primary.directory, offset).read_bytes()
        assert follower.append_file(offset, data) == offset
    assert heard == [0, 1, 2, 3, 4]
    for offset in range(5):
        assert follower.read_file_bytes(offset) == primary.read_file_bytes(offset)
        assert follower.append_time_ns(offset) == primary.append_time_ns(offset)
    assert ks(follower) == ks(primary)
    for reopened in (follower, Spool(tmp_path / "follower", SCHEMA, fsync=False)):
        assert (reopened.highest_seq("p"), reopened.highest_seq("q")) == (3, 4)
        # the duplicate filter follows the files: a retried push is dropped on the replica too
        assert reopened.append(batch(9), origin="p", seq=3) is None
        assert reopened.append(batch(9), origin="p", seq=5) == 5


def test_read_file_bytes_outside_the_log(tmp_path: Path) -> None:
    primary = primary_with(tmp_path, 3)
    primary.register_reader("r")
    fmt.write_reader_offset(primary.directory, "r", 0, fsync=False)
    primary.trim()
    with pytest.raises(TrimmedError, match="offset 0 was trimmed"):
        primary.read_file_bytes(0)
    for offset in (3, -1):
        with pytest.raises(ValueError, match=f"no offset {offset}"):
            primary.read_file_bytes(offset)


def test_append_file_only_at_the_next_offset(tmp_path: Path) -> None:
    primary = primary_with(tmp_path, 3)
    follower = Spool(tmp_path / "follower", SCHEMA, fsync=False, name="sensors")
    follower.append_file(0, primary.read_file_bytes(0))
    for offset in (0, 2, 7):
        with pytest.raises(ValueError, match=r"sensors.*the next offset is 1"):
            follower.append_file(offset, primary.read_file_bytes(min(offset, 2)))
    assert fmt.list_offsets(follower.directory) == [0]
    assert not list(follower.directory.glob(f"{fmt.TMP_PREFIX}*"))


def _other_schema() -> bytes:
    return fmt.file_bytes(pa.table({"k": pa.array([1], pa.int32()), "name": ["x"]}))


def _lying_rows(good: bytes) -> bytes:
    table = pa.ipc.open_file(pa.BufferReader(good)).read_all()
    meta = dict(table.schema.metadata or {})
    meta[fmt.META_ROWS] = b"99"
    return fmt.file_bytes(table.replace_schema_metadata(meta))


def _bad_seq(good: bytes) -> bytes:
    table = pa.ipc.open_file(pa.BufferReader(good)).read_all()
    meta = dict(table.schema.metadata or {})
    meta[fmt.META_SEQ] = b"seven"
    return fmt.file_bytes(table.replace_schema_metadata(meta))


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda good: good[: len(good) // 2], "not a whole Arrow IPC file"),
        (lambda good: b"", "not a whole Arrow IPC file"),
        (lambda good: b"hello" * 40, "not a whole Arrow IPC file"),
        (lambda good: _other_schema(), "the file holds schema"),
        (lambda good: fmt.file_bytes(SCHEMA.empty_table()), "the file holds 0 rows"),
        (_lying_rows, "the file says it holds 99 rows but holds 2"),
        (_bad_seq, "malformed spool metadata"),
    ],
    ids=["truncated", "empty", "garbage", "other-schema", "no-rows", "lying-rows", "bad-seq"],
)
def test_append_file_refuses_what_is_not_a_spool_file_of_its_schema(
    tmp_path: Path, make: Any, says: str
) -> None:
    primary = primary_with(tmp_path, 1)
    follower = Spool(tmp_path / "follower", SCHEMA, fsync=False, name="sensors")
    with pytest.raises(ValueError, match=f"stream sensors: offset 0: {says}"):
        follower.append_file(0, make(primary.read_file_bytes(0)))
    assert follower.latest == -1 and fmt.list_offsets(follower.directory) == []
    assert follower.append_file(0, primary.read_file_bytes(0)) == 0  # nothing was used up


def test_append_file_refuses_a_null_in_a_non_nullable_field(tmp_path: Path) -> None:
    strict = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    # what a broken primary might send: the declared schema, holding a null all the same
    table = pa.Table.from_arrays([pa.array([1, None], pa.int64())], schema=strict)
    follower = Spool(tmp_path / "f", strict, fsync=False)
    with pytest.raises(ValueError, match="'k' holds a null"):
        follower.append_file(0, fmt.file_bytes(table))
    assert follower.latest == -1


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_files_are_refused_or_stored_readable(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        primary = primary_with(Path(tmp), 1)
        good = bytearray(primary.read_file_bytes(0))
        cut = data.draw(st.integers(0, len(good)), label="cut")
        flips = data.draw(
            st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)), max_size=4),
            label="flips",
        )
        for at, mask in flips:
            good[at] ^= mask
        mutated = bytes(good[:cut] if cut < len(good) else good)
        follower = Spool(Path(tmp) / "follower", SCHEMA, fsync=False)
        try:
            follower.append_file(0, mutated)
        except ValueError:
            assert follower.latest == -1 and fmt.list_offsets(follower.directory) == []
            return
        # stored: then it reads back as a table of the schema, also after a reopen
        ((_, table),) = list(Spool(follower.directory, SCHEMA, fsync=False).read(-1, 0))
        assert table.schema == SCHEMA and table.num_rows > 0


def test_append_file_survives_a_failed_directory_fsync_like_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = primary_with(tmp_path, 1)
    follower = Spool(tmp_path / "follower", SCHEMA, fsync=True)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SpoolFault, match="directory fsync"):
        follower.append_file(0, primary.read_file_bytes(0))
    monkeypatch.undo()
    assert follower.latest == -1 and fmt.list_offsets(follower.directory) == []
    assert follower.highest_seq("q") is None
    assert follower.append_file(0, primary.read_file_bytes(0)) == 0


# --------------------------------------------------------------------------- truncating


def test_truncate_after_drops_the_tail_and_its_seqs(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=True)
    for seq in range(10):
        spool.append(batch(seq), origin="a", seq=seq)
    spool.register_reader("q")
    fmt.write_reader_offset(spool.directory, "q", 4)
    assert spool.trim() == 5  # the state file remembers seqs up to 4 only
    assert spool.truncate_after(6) == 3
    assert spool.truncate_after(6) == 0 and spool.truncate_after(8) == 0
    for reopened in (spool, Spool(tmp_path / "s", SCHEMA)):
        assert (reopened.earliest, reopened.latest) == (5, 6)
        assert fmt.list_offsets(reopened.directory) == [5, 6]
        assert reopened.highest_seq("a") == 6
        assert list(ks(reopened).values()) == [5, 6]
    # the new primary's batches take the offsets the dropped tail had
    assert spool.append(batch(70), origin="a", seq=7) == 7
    assert spool.append(batch(70), origin="a", seq=6) is None


def test_truncate_after_refuses_below_a_commit_or_the_trimmed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, name="sensors")
    for k in range(6):
        spool.append(batch(k))
    spool.register_reader("q")
    spool.register_reader("slow")
    fmt.write_reader_offset(spool.directory, "q", 3, fsync=False)
    fmt.write_reader_offset(spool.directory, "slow", 1, fsync=False)
    with pytest.raises(ValueError, match=r"sensors.*reader 'q' has committed offset 3"):
        spool.truncate_after(2)
    assert spool.latest == 5
    assert spool.trim() == 2  # through 1
    spool.unregister_reader("q")
    with pytest.raises(ValueError, match="through 1 were trimmed"):
        spool.truncate_after(0)
    assert spool.truncate_after(1) == 4
    assert (spool.earliest, spool.latest) == (2, 1)
    assert spool.append(batch(9)) == 2


def test_a_truncation_cut_short_by_the_disk_leaves_a_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=True)
    for seq in range(6):
        spool.append(batch(seq), origin="a", seq=seq)
    calls: list[int] = []
    real = fmt.fsync_dir

    def fsync_dir(directory: Path) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(directory)

    monkeypatch.setattr(fmt, "fsync_dir", fsync_dir)
    with pytest.raises(SpoolFault, match="stopped at offset 3"):
        spool.truncate_after(1)
    monkeypatch.undo()
    assert spool.latest == 3 and spool.highest_seq("a") == 3
    reopened = Spool(tmp_path / "s", SCHEMA)
    assert (reopened.latest, list(ks(reopened).values())) == (3, [0, 1, 2, 3])
    assert reopened.truncate_after(1) == 2 and reopened.highest_seq("a") == 1


def test_an_old_state_file_without_per_file_memory_still_opens(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for seq in range(3):
        spool.append(batch(seq), origin="a", seq=seq)
    state = {"trimmed_through": -1, "seqs": {"a": 2, "gone": 5}}
    (spool.directory / fmt.STATE_FILE).write_text(json.dumps(state))
    reopened = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert (reopened.highest_seq("a"), reopened.highest_seq("gone")) == (2, 5)


# --------------------------------------------------------------------------- model


class ReplicaModel(RuleBasedStateMachine):
    """A primary and a follower fed with ``append_file``; trims, truncations and reopens
    of the follower, against a model of every offset ever appended and not truncated."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="spool-replica-"))
        self.primary = Spool(self.dir / "p", SCHEMA, fsync=False)
        self.follower = Spool(self.dir / "f", SCHEMA, fsync=False)
        self.log: dict[int, tuple[str | None, int, int]] = {}  # follower: offset -> tag, k
        self.trimmed = -1
        self.committed = -1
        self.next_seq = {"a": 0, "b": 0}
        self.k = 0

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(origin=st.sampled_from(["a", "b", None]))
    def primary_appends_and_ships(self, origin: str | None) -> None:
        seq = self.next_seq[origin] if origin is not None else 0
        offset = self.primary.append(batch(self.k), origin=origin, seq=seq)
        if offset is None:
            return
        if origin is not None:
            self.next_seq[origin] += 1
        assert offset == self.follower.latest + 1  # primary and follower stay aligned
        assert self.follower.append_file(offset, self.primary.read_file_bytes(offset)) == offset
        self.log[offset] = (origin, seq, self.k)
        self.k += 1

    def _primary_like_follower(self) -> Spool:
        """A new primary whose log is the follower's (a failover to it)."""
        shutil.rmtree(self.dir / "p")
        self.follower.export(self.dir / "p", after=self.follower.earliest - 1, readers=[])
        return Spool(self.dir / "p", SCHEMA, fsync=False)

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        self.follower.register_reader("r")
        latest = self.follower.latest
        if latest > self.committed:
            self.committed = data.draw(st.integers(self.committed, latest))
            fmt.write_reader_offset(self.follower.directory, "r", self.committed, fsync=False)

    @rule()
    def trim(self) -> None:
        if "r" in self.follower.readers():
            self.follower.trim()
            self.trimmed = max(self.trimmed, min(self.committed, self.follower.latest))

    @precondition(lambda self: self.log)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        latest = self.follower.latest
        offset = data.draw(st.integers(-1, latest), label="truncate after")
        floor = max(self.trimmed, self.committed if "r" in self.follower.readers() else -1)
        if offset < floor:
            with pytest.raises(ValueError, match="cannot truncate"):
                self.follower.truncate_after(offset)
            return
        assert self.follower.truncate_after(offset) == max(0, latest - offset)
        for o in [o for o in self.log if o > offset]:
            del self.log[o]
        for origin in self.next_seq:  # the next producer seqs continue from what is kept
            kept = [s for (org, s, _) in self.log.values() if org == origin]
            self.next_seq[origin] = max(kept, default=-1) + 1
        self.primary = self._primary_like_follower()

    @rule()
    def reopen(self) -> None:
        self.follower = Spool(self.dir / "f", SCHEMA, fsync=False)

    @invariant()
    def matches_model(self) -> None:
        f = self.follower
        assert f.latest == max(self.log, default=-1)
        assert f.earliest == self.trimmed + 1
        assert ks(f) == {o: k for o, (_, _, k) in self.log.items() if o > self.trimmed}
        for origin in ("a", "b"):
            seqs = [s for (org, s, _) in self.log.values() if org == origin]
            assert f.highest_seq(origin) == (max(seqs) if seqs else None)


ReplicaModel.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
test_replica_model = ReplicaModel.TestCase
