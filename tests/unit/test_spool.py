"""The spool: offsets, durability, exactly-once appends, trimming (no JVM, no pyspark)."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from peer.storage import spool_format as fmt
from peer.storage.spool import Spool, SpoolSet
from peer.storage.spool_format import TrimmedError
from peer.timing import wait_until_sync

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("t", pa.timestamp("us", "UTC"))])


def batch(k: int, rows: int = 3) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([k] * rows, pa.int64()),
            "name": [f"n{k}"] * rows,
            "t": pa.array([k * 1_000_000] * rows, pa.timestamp("us", "UTC")),
        }
    )


def ks(spool: Spool, start: int = -1) -> list[tuple[int, int]]:
    return [(o, t.column("k")[0].as_py()) for o, t in spool.read(start, spool.latest)]


def test_append_read_offsets(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert (spool.latest, spool.earliest) == (-1, 0)
    assert [spool.append(batch(k)) for k in range(4)] == [0, 1, 2, 3]
    assert spool.latest == 3
    assert ks(spool) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert ks(spool, 1) == [(2, 2), (3, 3)]
    assert [o for o, _ in spool.read(0, 2)] == [1, 2]
    got = next(iter(spool.read(-1, 0)))[1]
    assert got.schema == SCHEMA and got.equals(batch(0))
    assert (tmp_path / "s" / "00000000000000000002.arrow").exists()
    with pytest.raises(ValueError, match="beyond latest"):
        list(spool.read(0, 9))


def test_append_casts_and_reorders_columns(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    loose = pa.table({"t": pa.array([0], pa.timestamp("us", "UTC")), "name": ["x"], "k": [7]})
    loose = loose.set_column(2, "k", pa.array([7], pa.int32()))
    assert spool.append(loose) == 0
    _, got = next(iter(spool.read(-1, 0)))
    assert got.schema == SCHEMA and got.column("k").to_pylist() == [7]


def test_empty_table_is_not_appended(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert spool.append(batch(1, rows=0)) is None
    assert spool.latest == -1 and fmt.list_offsets(spool.directory) == []


@pytest.mark.parametrize(
    ("table", "field"),
    [
        (pa.table({"k": [1], "name": ["a"]}), "t"),
        (pa.table({"k": [1], "name": ["a"], "t": pa.array([0], pa.int64()), "x": [1]}), "x"),
        (pa.table({"k": ["one"], "name": ["a"], "t": pa.array([0], pa.timestamp("us"))}), "k"),
    ],
)
def test_schema_mismatch_refused_and_nothing_written(
    tmp_path: Path, table: pa.Table, field: str
) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    with pytest.raises(ValueError, match=repr(field)):
        spool.append(table, origin="a", seq=1)
    assert spool.latest == -1
    assert sorted(p.name for p in spool.directory.iterdir()) == ["readers", "schema.arrow"]
    assert spool.append(batch(1), origin="a", seq=1) == 0  # the refused seq was not consumed


def test_non_nullable_field_refuses_nulls(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False)])
    spool = Spool(tmp_path / "s", schema, fsync=False)
    with pytest.raises(ValueError, match="'k'"):
        spool.append(pa.table({"k": pa.array([1, None], pa.int64())}))


def test_dedup_by_origin_and_seq(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert spool.append(batch(1), origin="a", seq=1) == 0
    assert spool.append(batch(1), origin="a", seq=1) is None
    assert spool.append(batch(0), origin="a", seq=0) is None
    assert spool.append(batch(1), origin="b", seq=1) == 1
    assert spool.append(batch(2), origin="a", seq=2) == 2
    assert spool.append(batch(9)) == 3  # untagged batches are never deduplicated
    assert spool.append(batch(9)) == 4
    assert spool.highest_seq("a") == 2 and spool.highest_seq("zz") is None
    reopened = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert reopened.append(batch(2), origin="a", seq=2) is None
    assert reopened.append(batch(1), origin="b", seq=1) is None
    assert reopened.append(batch(3), origin="a", seq=3) == 5


def test_dedup_survives_trim_and_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for seq in range(3):
        spool.append(batch(seq), origin="a", seq=seq)
    spool.register_reader("q")
    fmt.write_reader_offset(spool.directory, "q", 2)
    assert spool.trim() == 3
    assert fmt.list_offsets(spool.directory) == []
    assert (spool.latest, spool.earliest) == (2, 3)
    reopened = Spool(tmp_path / "s", SCHEMA, fsync=False)
    assert (reopened.latest, reopened.earliest) == (2, 3)  # offsets never go backwards
    assert reopened.append(batch(2), origin="a", seq=2) is None
    assert reopened.append(batch(3), origin="a", seq=3) == 3


def test_concurrent_appends_get_consecutive_offsets(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA)
    seen: list[int] = []
    spool.add_listener(seen.append)

    def work(origin: str) -> None:
        for seq in range(25):
            spool.append(batch(seq), origin=origin, seq=seq)
            spool.append(batch(seq), origin=origin, seq=seq)  # a replay: dropped

    threads = [threading.Thread(target=work, args=(f"o{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert spool.latest == 99
    assert fmt.list_offsets(spool.directory) == list(range(100))
    assert sorted(seen) == list(range(100))


def test_listeners_called_after_append(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    calls: list[tuple[int, bool]] = []

    def listener(offset: int) -> None:
        # The batch must be readable by the time a listener hears of it.
        calls.append((offset, fmt.offset_path(spool.directory, offset).exists()))

    def broken(offset: int) -> None:
        raise RuntimeError("a listener bug")

    spool.add_listener(broken)
    spool.add_listener(listener)
    spool.append(batch(1), origin="a", seq=1)
    spool.append(batch(1), origin="a", seq=1)  # replay: no call
    spool.append(batch(2, rows=0))  # empty: no call
    spool.append(batch(3))
    assert calls == [(0, True), (1, True)]
    spool.remove_listener(listener)
    spool.append(batch(4))
    assert len(calls) == 2


def test_append_time_ns(tmp_path: Path) -> None:
    import time

    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    before = time.time_ns()
    spool.append(batch(1))
    assert before <= spool.append_time_ns(0) <= time.time_ns()
    assert Spool(tmp_path / "s", SCHEMA, fsync=False).append_time_ns(0) == spool.append_time_ns(0)
    with pytest.raises(TrimmedError):
        spool.append_time_ns(5)


def test_trim_respects_every_reader(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for k in range(10):
        spool.append(batch(k))
    assert spool.trim() == 0  # no readers: nothing is trimmed
    spool.register_reader("fast")
    spool.register_reader("slow")
    assert spool.committed("slow") == -1
    fmt.write_reader_offset(spool.directory, "fast", 8)
    fmt.write_reader_offset(spool.directory, "slow", 3)
    assert spool.trim() == 4
    assert spool.earliest == 4 and fmt.list_offsets(spool.directory)[0] == 4
    spool.register_reader("slow")  # registering again keeps the committed offset
    assert spool.committed("slow") == 3
    spool.unregister_reader("slow")
    with pytest.raises(KeyError, match="slow"):
        spool.committed("slow")
    assert spool.trim(retain=3) == 3  # fast committed 8, but the 3 newest (7..9) stay
    assert spool.earliest == 7
    assert spool.trim() == 2 and spool.earliest == 9
    with pytest.raises(TrimmedError, match="trimmed"):
        list(spool.read(5, 9))
    assert [o for o, _ in spool.read(5, 9, skip_trimmed=True)] == [9]
    with pytest.raises(ValueError, match="reader id"):
        spool.register_reader("../evil")


def test_trim_keeps_what_a_replica_lacks(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for k in range(10):
        spool.append(batch(k))
    spool.register_reader("query")
    fmt.write_reader_offset(spool.directory, "query", 9)
    assert spool.trim(keep_after=4) == 5  # the reader took all; a replica holds through 4
    assert spool.earliest == 5
    assert spool.trim(keep_after=-1) == 0  # one that holds nothing: nothing more goes
    assert spool.trim(max_age_s=0.0, keep_after=6) == 2  # 5 and 6 only
    assert spool.earliest == 7


def test_open_recovers_temp_files_and_unfinished_trim(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for k in range(4):
        spool.append(batch(k), origin="a", seq=k)
    d = spool.directory
    (d / f"{fmt.TMP_PREFIX}dead.arrow").write_bytes(b"half a batch")
    (d / "readers" / f"{fmt.TMP_PREFIX}x-q.offset").write_bytes(b"1")
    # A crash after the state file was written but before the files were deleted.
    (d / fmt.STATE_FILE).write_text(json.dumps({"trimmed_through": 1, "seqs": {"a": 1}}))
    reopened = Spool(d, SCHEMA, fsync=False)
    assert not list(d.glob(f"{fmt.TMP_PREFIX}*")) and not list((d / "readers").glob(".tmp*"))
    assert fmt.list_offsets(d) == [2, 3]
    assert (reopened.earliest, reopened.latest, reopened.highest_seq("a")) == (2, 3, 3)
    assert reopened.append(batch(4)) == 4


def test_reopen_with_other_schema_is_refused(tmp_path: Path) -> None:
    Spool(tmp_path / "s", SCHEMA, fsync=False)
    with pytest.raises(ValueError, match="schema"):
        Spool(tmp_path / "s", pa.schema([("k", pa.int32())]), fsync=False)


def test_too_many_rows_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("peer.storage.spool.MAX_ROWS_PER_FILE", 2)
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    with pytest.raises(ValueError, match="at most 2"):
        spool.append(batch(1, rows=3))


def test_spool_set_create_get_drop_reopen(tmp_path: Path) -> None:
    root = tmp_path / "spools"
    spools = SpoolSet(root, fsync=False)
    names = ["medusa://mit.edu/locator/people", "people", "..", "a/b c%"]
    for name in names:
        spools.create(name, SCHEMA).append(batch(1))
    assert spools.create("people", SCHEMA).latest == 0  # idempotent for the same schema
    with pytest.raises(ValueError, match="people"):
        spools.create("people", pa.schema([("k", pa.int32())]))
    # One spool directory per stream, right under root, whatever the name holds ('/', '..',
    # '%', a URI): none nested, nothing left beside them (no temporaries), none hidden (a
    # leading '.' is for temporaries, which a reopen deletes), nothing written outside root.
    entries = list(root.iterdir())
    assert all((p / fmt.STREAM_FILE).is_file() for p in entries), entries
    assert sorted(json.loads((p / fmt.STREAM_FILE).read_text())["stream"] for p in entries) == (
        sorted(names)
    )
    assert not [p.name for p in entries if p.name.startswith(".")]
    assert [p.name for p in tmp_path.iterdir()] == [root.name]
    with pytest.raises(KeyError, match="nope"):
        spools.get("nope")
    reopened = SpoolSet(root, fsync=False)
    assert reopened.streams() == sorted(names)
    people = reopened.get("medusa://mit.edu/locator/people")
    assert people.schema.equals(SCHEMA) and people.latest == 0
    reopened.drop("people")
    assert "people" not in reopened and not (root / "people").exists()
    with pytest.raises(KeyError, match="people"):
        reopened.drop("people")
    assert SpoolSet(root, fsync=False).streams() == sorted(set(names) - {"people"})


# --------------------------------------------------------------------------- crash safety

CHILD = """
import sys
from pathlib import Path
import pyarrow as pa
from peer.storage.spool import Spool
schema = pa.schema([("seq", pa.int64()), ("pad", pa.string())])
spool = Spool(Path(sys.argv[1]), schema)
seq = (spool.highest_seq("w") or 0) + 1
while True:
    rows = seq % 97 + 1
    spool.append(pa.table({"seq": [seq] * rows, "pad": ["x" * 64] * rows}, schema=schema),
                 origin="w", seq=seq)
    seq += 1
"""


def appended_beyond(directory: Path, seen: int) -> bool:
    return directory.exists() and len(fmt.list_offsets(directory)) > seen


@pytest.mark.slow
def test_kill_9_during_appends_leaves_only_whole_batches(tmp_path: Path) -> None:
    import random
    import signal
    import subprocess
    import sys
    import time

    directory = tmp_path / "s"
    rng = random.Random(1234)
    last_seq = 0
    for _ in range(8):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(directory)])
        try:
            # Kill only once this child has appended (it starts slower than it appends),
            wait_until_sync(
                functools.partial(appended_beyond, directory, last_seq),
                "the child appending",
                30,
                every_s=0.005,
            )
            # then at a random moment of its appends: the fault injected, not a wait.
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        spool = Spool(directory, pa.schema([("seq", pa.int64()), ("pad", pa.string())]))
        offsets = fmt.list_offsets(directory)
        assert offsets == list(range(len(offsets)))
        assert not list(directory.glob(f"{fmt.TMP_PREFIX}*"))
        seqs = []
        for _, table in spool.read(-1, spool.latest):
            (seq,) = set(table.column("seq").to_pylist())
            assert table.num_rows == seq % 97 + 1
            seqs.append(seq)
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > last_seq
        last_seq = len(seqs)


# --------------------------------------------------------------------------- model check


class SpoolModel(RuleBasedStateMachine):
    """Random appends, replays, commits, trims and reopens against a list-based model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="spool-model-"))
        self.spool = Spool(self.dir, SCHEMA, fsync=False)
        self.batches: dict[int, int] = {}  # offset -> k, for offsets still present
        self.latest = -1
        self.seqs: dict[str, int] = {}
        self.commits: dict[str, int] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(origin=st.sampled_from(["a", "b", None]), seq=st.integers(0, 12), rows=st.integers(0, 3))
    def append(self, origin: str | None, seq: int, rows: int) -> None:
        got = self.spool.append(batch(seq, rows), origin=origin, seq=seq)
        if rows == 0 or (origin is not None and seq <= self.seqs.get(origin, -1)):
            assert got is None
            return
        self.latest += 1
        assert got == self.latest
        self.batches[got] = seq
        if origin is not None:
            self.seqs[origin] = seq

    @rule(reader=st.sampled_from(["q1", "q2"]))
    def register(self, reader: str) -> None:
        self.spool.register_reader(reader)
        self.commits.setdefault(reader, -1)

    @rule(reader=st.sampled_from(["q1", "q2"]), data=st.data())
    def commit(self, reader: str, data: st.DataObject) -> None:
        if reader in self.commits:
            offset = data.draw(st.integers(self.commits[reader], max(self.latest, -1)))
            fmt.write_reader_offset(self.dir, reader, offset, fsync=False)
            self.commits[reader] = offset

    @rule(reader=st.sampled_from(["q1", "q2"]))
    def unregister(self, reader: str) -> None:
        self.spool.unregister_reader(reader)
        self.commits.pop(reader, None)

    @rule(retain=st.integers(0, 3))
    def trim(self, retain: int) -> None:
        deleted = self.spool.trim(retain)
        if not self.commits:
            assert deleted == 0
            return
        floor = min(min(self.commits.values()), self.latest - retain)
        doomed = [o for o in self.batches if o <= floor]
        assert deleted == len(doomed)
        for o in doomed:
            del self.batches[o]

    @rule()
    def reopen(self) -> None:
        self.spool = Spool(self.dir, SCHEMA, fsync=False)

    @invariant()
    def matches_model(self) -> None:
        assert self.spool.latest == self.latest
        assert self.spool.earliest == min(self.batches, default=self.latest + 1)
        got = {
            o: t.column("k")[0].as_py()
            for o, t in self.spool.read(-1, self.latest, skip_trimmed=True)
        }
        assert got == self.batches
        for origin, seq in self.seqs.items():
            assert self.spool.highest_seq(origin) == seq


SpoolModel.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
test_spool_model = SpoolModel.TestCase


def test_a_copy_made_of_a_pre_copy_and_the_rest_reads_as_the_source(tmp_path: Path) -> None:
    """A move's pre-copy (issue 28): the reader's backlog is copied while appends go on; the
    final export leaves those files out; the two merged are the spool a one-shot export
    makes, and a trim between the two leaves files the copy ignores."""
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    for k in range(6):
        spool.append(batch(k))
    spool.register_reader("frag")
    fmt.write_reader_offset(spool.directory, "frag", 1, fsync=False)  # read through 1
    merged = tmp_path / "merged"
    through, copied = spool.export_files(merged, after=spool.committed("frag"))
    assert through == 5 and copied > 0
    assert fmt.list_offsets(merged) == [2, 3, 4, 5]
    for k in range(6, 9):  # the fragment runs on: more batches, and it reads further
        spool.append(batch(k))
    fmt.write_reader_offset(spool.directory, "frag", 3, fsync=False)
    spool.trim()
    final = tmp_path / "final"
    spool.export(final, after=spool.committed("frag"), readers=["frag"], present=through)
    assert fmt.list_offsets(final) == [6, 7, 8]  # only what came after the pre-copy
    for path in final.rglob("*"):  # what the receiver's second extract does: add the rest
        if path.is_file():
            (merged / path.relative_to(final)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, merged / path.relative_to(final))
    whole = tmp_path / "whole"
    spool.export(whole, after=spool.committed("frag"), readers=["frag"])
    copy, reference = Spool(merged, SCHEMA, fsync=False), Spool(whole, SCHEMA, fsync=False)
    assert (copy.earliest, copy.latest) == (reference.earliest, reference.latest) == (4, 8)
    assert ks(copy, 3) == ks(reference, 3) == ks(spool, 3)
    assert copy.committed("frag") == 3
