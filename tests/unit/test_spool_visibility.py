"""The spool as a replicated log: ``encode``, and readers held at the acknowledged end.

Real spools in temporary directories; Hypothesis drives a model of appends, holds, trims,
truncations and reopens. No JVM, no sockets.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from peer.storage import spool as spool_module
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import SpoolCorrupt, SpoolFault

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string())])


def batch(k: int, rows: int = 2) -> pa.Table:
    return pa.table({"k": pa.array([k] * rows, pa.int64()), "name": [f"n{k}"] * rows})


def filled(tmp_path: Path, n: int, **kwargs: bool) -> Spool:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=kwargs.get("fsync", False), name="sensors")
    for k in range(n):
        spool.append(batch(k), origin="p", seq=k)
    return spool


def ks(spool: Spool) -> list[int]:
    return [t.column("k")[0].as_py() for _, t in spool.read(spool.earliest - 1, spool.latest)]


# --------------------------------------------------------------------------- encode


def test_encode_gives_the_bytes_append_writes_and_writes_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False, name="sensors", clock_ns=lambda: 1_234_567)
    spool.append(batch(0), origin="p", seq=0)
    loose = pa.table({"name": ["a", "b"], "k": pa.array([7, 8], pa.int32())})  # cast, reordered
    before = sorted(p.name for p in spool.directory.iterdir())
    data = spool.encode(loose, origin="p", seq=5)
    assert sorted(p.name for p in spool.directory.iterdir()) == before
    assert (spool.log_end, spool.highest_seq("p")) == (0, 0)
    assert spool.append(loose, origin="p", seq=5) == 1
    assert fmt.offset_path(spool.directory, 1).read_bytes() == data
    meta = pa.ipc.open_file(pa.BufferReader(data)).schema.metadata
    assert meta[fmt.META_ROWS] == b"2" and meta[fmt.META_APPEND_NS] == b"1234567"
    assert (meta[fmt.META_ORIGIN], meta[fmt.META_SEQ]) == (b"p", b"5")
    untagged = pa.ipc.open_file(pa.BufferReader(spool.encode(batch(1)))).schema.metadata
    assert fmt.META_ORIGIN not in untagged and fmt.META_SEQ not in untagged


def test_a_primary_stores_what_it_encodes_with_append_file(tmp_path: Path) -> None:
    primary = filled(tmp_path, 2)
    data = primary.encode(batch(9), origin="q", seq=3)
    assert primary.append_file(primary.log_end + 1, data) == 2
    assert primary.highest_seq("q") == 3  # the tag joins the replay memory
    memory = primary.seqs()
    assert memory == {"p": 1, "q": 3}
    memory["q"] = 0  # a copy
    assert primary.seqs()["q"] == 3
    assert primary.append(batch(9), origin="q", seq=3) is None
    follower = Spool(tmp_path / "f", SCHEMA, fsync=False)
    for offset in range(3):
        follower.append_file(offset, primary.read_file_bytes(offset))
    assert ks(follower) == ks(primary) == [0, 1, 9]


def test_encode_refuses_what_append_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = filled(tmp_path, 0)
    with pytest.raises(ValueError, match="'name' is missing"):
        spool.encode(pa.table({"k": [1]}))
    with pytest.raises(ValueError, match="'x' is not in the stream's schema"):
        spool.encode(batch(1).append_column("x", pa.array([1, 2])))
    with pytest.raises(ValueError, match="sensors: a batch without rows"):
        spool.encode(batch(1, rows=0))
    assert spool.append(batch(1, rows=0)) is None  # append skips it instead
    monkeypatch.setattr(spool_module, "MAX_ROWS_PER_FILE", 3)
    for call in (spool.encode, spool.append):
        with pytest.raises(ValueError, match="a batch holds 4 rows; at most 3"):
            call(batch(1, rows=4))
    assert fmt.list_offsets(spool.directory) == []


# --------------------------------------------------------------------------- hold


def test_a_spool_without_a_hold_reads_to_its_log_end(tmp_path: Path) -> None:
    spool = filled(tmp_path, 3)
    assert (spool.latest, spool.log_end, spool.visible_bound) == (2, 2, None)
    assert fmt.read_watermark(spool.directory) is None
    assert not (spool.directory / fmt.WATERMARK_FILE).exists()


def test_readers_see_up_to_the_hold_and_listeners_hear_as_it_rises(tmp_path: Path) -> None:
    spool = filled(tmp_path, 0)
    heard: list[int] = []
    spool.add_listener(heard.append)
    spool.hold(-1)
    for k in range(5):
        assert spool.append(batch(k)) == k
    assert (spool.latest, spool.log_end, heard) == (-1, 4, [])
    assert fmt.read_watermark(spool.directory) == -1
    spool.hold(2)
    assert (spool.latest, heard, ks(spool)) == (2, [0, 1, 2], [0, 1, 2])
    assert fmt.read_watermark(spool.directory) == 2
    with pytest.raises(ValueError, match="offset 4 is beyond latest 2"):
        list(spool.read(-1, 4))
    spool.hold(1)  # lowered (not what a driver does): hidden again, nobody told twice
    assert spool.latest == 1
    spool.hold(3)
    assert heard == [0, 1, 2, 3]
    spool.hold(None)  # the bound lifted: everything, and the file gone
    assert (spool.latest, heard, spool.visible_bound) == (4, [0, 1, 2, 3, 4], None)
    assert fmt.read_watermark(spool.directory) is None
    assert spool.append(batch(5)) == 5 and heard[-1] == 5


def test_a_bound_above_the_log_end_tells_of_each_append_at_once(tmp_path: Path) -> None:
    spool = filled(tmp_path, 1)
    heard: list[int] = []
    spool.add_listener(heard.append)
    spool.hold(3)  # a follower behind the acknowledged end
    assert spool.latest == 0 and heard == []
    for k in (1, 2, 3, 4):
        spool.append(batch(k))
    assert heard == [1, 2, 3] and spool.latest == 3


def test_trim_and_backlog_stay_below_the_visible_end(tmp_path: Path) -> None:
    spool = filled(tmp_path, 6)
    spool.hold(2)
    spool.register_reader("q")
    assert spool.backlog() == fmt.backlog(spool.directory) == 3  # 0..2, not 0..5
    fmt.write_reader_offset(spool.directory, "q", 5, fsync=False)  # a reader ahead: a bug
    assert spool.trim() == 3 and spool.earliest == 3
    spool.unregister_reader("q")
    aged = filled(tmp_path / "aged", 4)
    aged.hold(1)
    assert aged.trim(max_age_s=0.0) == 2  # old enough, but 2 and 3 are not acknowledged
    assert aged.earliest == 2 and aged.log_end == 3
    aged.hold(-1)  # below the trimmed end: taken as it (those were seen)
    assert aged.latest == 1 and fmt.read_watermark(aged.directory) == 1


def test_truncation_keeps_what_readers_may_have_seen(tmp_path: Path) -> None:
    spool = filled(tmp_path, 6)
    heard: list[int] = []
    spool.add_listener(heard.append)
    spool.hold(3)
    with pytest.raises(ValueError, match="sensors: cannot truncate after 2: offsets through 3"):
        spool.truncate_after(2)
    assert spool.truncate_after(3) == 2  # the unacknowledged tail goes
    assert (spool.log_end, spool.latest, spool.highest_seq("p")) == (3, 3, 3)
    spool.hold(5)
    assert spool.append(batch(40)) == 4 and heard == [4]  # offset 4 again, told again


def test_truncation_below_a_raised_bound_that_was_never_reached(tmp_path: Path) -> None:
    spool = filled(tmp_path, 4)
    spool.hold(10)  # latest is 3: that is what readers may have seen
    with pytest.raises(ValueError, match="offsets through 3"):
        spool.truncate_after(2)
    spool.hold(1)
    assert spool.truncate_after(1) == 2


@pytest.mark.parametrize("bad", [-2, True, 1.0, "3"])
def test_hold_refuses_what_is_not_an_offset(tmp_path: Path, bad: object) -> None:
    spool = filled(tmp_path, 1)
    with pytest.raises(ValueError, match="sensors: hold takes an offset >= -1 or None"):
        spool.hold(bad)  # type: ignore[arg-type]
    assert spool.visible_bound is None


def test_the_bound_survives_a_reopen_and_an_unreadable_file_hides_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = filled(tmp_path, 5, fsync=True)
    spool.hold(2)
    reopened = Spool(spool.directory, SCHEMA)
    assert (reopened.latest, reopened.log_end, reopened.visible_bound) == (2, 4, 2)
    heard: list[int] = []
    reopened.add_listener(heard.append)
    reopened.hold(3)
    assert heard == [3]
    reopened.register_reader("q")
    fmt.write_reader_offset(reopened.directory, "q", 0)
    reopened.trim()
    (spool.directory / fmt.WATERMARK_FILE).write_bytes(b"")  # what a crash may leave
    with pytest.raises(SpoolCorrupt, match=f"watermark file .*{fmt.WATERMARK_FILE}"):
        fmt.read_watermark(spool.directory)
    third = Spool(spool.directory, SCHEMA)
    assert (third.latest, third.log_end) == (0, 4)  # nothing past the trimmed end
    assert "watermark file" in caplog.text
    assert fmt.read_watermark(spool.directory) == 0  # rewritten for Spark's readers


@pytest.mark.parametrize("call", ["replace", "pwrite"], ids=["creating", "rewriting"])
def test_a_failed_watermark_write_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    spool = filled(tmp_path, 0)
    heard: list[int] = []
    spool.add_listener(heard.append)
    if call == "pwrite":
        spool.hold(-1)  # the file exists: the next hold rewrites it in place
    for k in range(4):
        spool.append(batch(k))
    before = spool.latest, fmt.read_watermark(spool.directory)

    def failing(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, call, failing)
    with pytest.raises(SpoolFault, match="sensors: the watermark file"):
        spool.hold(1)
    monkeypatch.undo()
    assert (spool.latest, fmt.read_watermark(spool.directory)) == before
    told_before = [] if call == "pwrite" else [0, 1, 2, 3]  # (appended without a bound)
    assert heard == told_before
    spool.hold(2)
    assert spool.latest == 2 and fmt.read_watermark(spool.directory) == 2
    assert heard == ([0, 1, 2] if call == "pwrite" else told_before)


def test_the_watermark_file_is_rewritten_in_place_and_a_torn_one_is_refused(
    tmp_path: Path,
) -> None:
    spool = filled(tmp_path, 12)
    spool.hold(-1)
    path = spool.directory / fmt.WATERMARK_FILE
    inode = path.stat().st_ino
    for visible in (0, 9, 10, 11, 3):
        spool.hold(visible)
        assert fmt.read_watermark(spool.directory) == visible
    assert path.stat().st_ino == inode and len(path.read_bytes()) == 30
    good = fmt.watermark_record(11)
    torn = fmt.watermark_record(9)[:19] + good[19:]  # part of one write, part of the next
    for bad in (torn, b"", b"11\n", good.replace(b"11", b"12")):
        path.write_bytes(bad)
        with pytest.raises(SpoolCorrupt, match="watermark file"):
            fmt.read_watermark(spool.directory)
    spool.hold(None)
    assert not path.exists()


def test_readers_of_the_file_never_see_a_torn_or_falling_bound(tmp_path: Path) -> None:
    spool = filled(tmp_path, 1)
    spool.hold(-1)
    last = 3000
    seen: list[int] = []
    stop = threading.Event()

    def reader() -> None:  # as Spark's processes read it, while the peer rewrites it
        while not stop.is_set():
            seen.append(fmt.read_watermark(spool.directory) or 0)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for visible in range(last + 1):
            spool.hold(visible)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and len(seen) > 10
    bad = [(i, seen[i - 1], seen[i]) for i in range(1, len(seen)) if seen[i] < seen[i - 1]]
    assert bad == [] and seen[-1] <= last


def test_an_unchanged_hold_touches_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = filled(tmp_path, 3)
    spool.hold(1)
    opened: list[object] = []
    real = os.open

    def counting(*args: object, **kwargs: object) -> int:
        opened.append(args[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting)
    for _ in range(50):
        spool.hold(1)
    assert opened == []
    spool.hold(2)
    assert len(opened) == 1


def test_concurrent_appends_and_holds_tell_every_offset_once(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, fsync=False)
    heard: list[int] = []
    lock = threading.Lock()

    def listener(offset: int) -> None:
        assert offset <= spool.latest  # never told of an offset readers may not see
        with lock:
            heard.append(offset)

    spool.add_listener(listener)
    spool.hold(-1)
    done = threading.Event()

    def appender() -> None:
        for k in range(200):
            spool.append(batch(k))
        done.set()

    def acknowledger() -> None:
        while not done.is_set():
            spool.hold(max(-1, spool.log_end - 3))
        spool.hold(spool.log_end)

    threads = [threading.Thread(target=appender), threading.Thread(target=acknowledger)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert sorted(heard) == list(range(200))


# --------------------------------------------------------------------------- model


class HeldSpoolModel(RuleBasedStateMachine):
    """Appends, holds, trims, truncations and reopens of one spool, against a model of its
    log and the readers' bound: readers never see past it, listeners hear of each visible
    offset once (again after a truncation took it), Spark's watermark file agrees."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="spool-held-"))
        self.spool = Spool(self.dir / "s", SCHEMA, fsync=False)
        self.log: list[int] = []  # k of each offset
        self.bound: int | None = None
        self.trimmed = -1
        self.told = -1  # the last offset listeners heard of
        self.heard: list[int] = []
        self.expected: list[int] = []
        self.spool.add_listener(self.heard.append)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def visible(self) -> int:
        end = len(self.log) - 1
        return end if self.bound is None else min(end, self.bound)

    def catch_up(self) -> None:
        self.expected += range(self.told + 1, self.visible() + 1)
        self.told = max(self.told, self.visible())

    @rule()
    def append(self) -> None:
        k = len(self.log) * 10
        assert self.spool.append(batch(k)) == len(self.log)
        self.log.append(k)
        self.catch_up()

    @rule(visible=st.none() | st.integers(-1, 12))
    def hold(self, visible: int | None) -> None:
        self.spool.hold(visible)
        self.bound = None if visible is None else max(visible, self.trimmed)
        self.catch_up()

    @rule(retain=st.integers(0, 3))
    def trim(self, retain: int) -> None:
        self.spool.trim(retain, max_age_s=0.0)
        self.trimmed = max(self.trimmed, self.visible() - retain)

    @precondition(lambda self: self.log)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        end = len(self.log) - 1
        after = data.draw(st.integers(-1, end), label="truncate after")
        held = self.visible() if self.bound is not None else -1
        if after < end and after < max(self.trimmed, held):
            with pytest.raises(ValueError, match="cannot truncate"):
                self.spool.truncate_after(after)
            return
        assert self.spool.truncate_after(after) == end - after
        del self.log[after + 1 :]
        self.told = min(self.told, len(self.log) - 1)

    @rule()
    def reopen(self) -> None:
        self.spool = Spool(self.dir / "s", SCHEMA, fsync=False)
        self.spool.add_listener(self.heard.append)
        self.told = self.visible()  # an open tells nobody

    @invariant()
    def agrees(self) -> None:
        s = self.spool
        assert (s.log_end, s.latest, s.visible_bound) == (
            len(self.log) - 1,
            self.visible(),
            self.bound,
        )
        assert fmt.read_watermark(s.directory) == self.bound
        assert s.earliest == self.trimmed + 1
        assert ks(s) == self.log[self.trimmed + 1 : self.visible() + 1]
        assert self.heard == self.expected


HeldSpoolModel.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_held_spool_model = HeldSpoolModel.TestCase
