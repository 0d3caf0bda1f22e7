"""Disk faults and corrupt spools: an error for the request or the stream, never for the peer.

Faults are injected by replacing ``os.write``, ``os.fsync``, ``os.rename`` and ``os.replace``
(ENOSPC, EIO); corrupt spools are made by truncating, deleting or overwriting their files.
No JVM, no sockets.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

from peer.cli.doctor import _spools as doctor_spools
from peer.errors import FedstreamError, NotFound, Unavailable
from peer.federation.mirror import MIRROR_PREFIX, RETRY_MAX_S, Mirrors
from peer.protocol.link import MirrorAppend
from peer.site import LocalSite, SiteConfig
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool, SpoolSet
from peer.storage.spool_format import SpoolCorrupt, SpoolFault, SpoolQuarantined, scan_spools
from peer.testing import ManualClock, all_tasks_blocked
from peer.timing import wait_until

SCHEMA = pa.schema([("x", pa.int64())])


def table(*xs: int) -> pa.Table:
    return pa.table({"x": pa.array(xs, pa.int64())})


def xs(spool: Spool) -> list[int]:
    return [x for _, t in spool.read(spool.earliest - 1, spool.latest) for x in t["x"].to_pylist()]


def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def fail_when(
    monkeypatch: pytest.MonkeyPatch, name: str, code: int, when: Callable[..., bool]
) -> list[int]:
    """Make ``os.<name>`` raise ``code`` for the calls ``when(*args)`` picks; counts them."""
    real = getattr(os, name)
    failed: list[int] = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        if when(*args):
            failed.append(1)
            raise oserror(code)
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, patched)
    return failed


def is_dir_fd(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- appends


@pytest.mark.parametrize(
    ("call", "code", "when"),
    [
        ("write", errno.ENOSPC, lambda *a: True),
        ("fsync", errno.EIO, lambda fd: not is_dir_fd(fd)),
        ("rename", errno.EIO, lambda *a: True),
        ("fsync", errno.EIO, is_dir_fd),  # the directory fsync after the rename
    ],
    ids=["write-ENOSPC", "data-fsync-EIO", "rename-EIO", "dir-fsync-EIO"],
)
def test_a_failed_append_keeps_nothing_and_the_spool_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    code: int,
    when: Callable[..., bool],
) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, name="sensors")
    assert spool.append(table(1), origin="p", seq=1) == 0
    heard: list[int] = []
    spool.add_listener(heard.append)
    failed = fail_when(monkeypatch, call, code, when)
    with pytest.raises(SpoolFault, match="stream sensors") as caught:
        spool.append(table(2), origin="p", seq=2)
    assert failed, "the fault was not hit"
    assert caught.value.details["errno"] == code and caught.value.retriable
    monkeypatch.undo()
    # nothing visible, nothing remembered, nobody told
    assert fmt.list_offsets(spool.directory) == [0]
    assert not list(spool.directory.glob(f"{fmt.TMP_PREFIX}*"))
    assert (spool.latest, spool.highest_seq("p"), heard) == (0, 1, [])
    # the same batch again (a client's retry) is taken, at the offset the failure did not use
    assert spool.append(table(2), origin="p", seq=2) == 1
    assert xs(spool) == [1, 2] and heard == [1]
    assert xs(Spool(tmp_path / "s", SCHEMA)) == [1, 2]


def test_an_undo_that_fails_too_stops_appends_until_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, name="sensors")
    fail_when(monkeypatch, "fsync", errno.EIO, is_dir_fd)
    real_rename = os.rename
    renames: list[tuple[Any, Any]] = []

    def rename(src: Any, dst: Any) -> None:
        renames.append((src, dst))
        if len(renames) > 1:  # the rename into place passes; its undo fails
            raise oserror(errno.EIO)
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(SpoolFault, match="directory fsync"):
        spool.append(table(1))
    assert len(renames) == 2
    monkeypatch.undo()
    with pytest.raises(SpoolFault, match="restart the peer"):
        spool.append(table(2))
    assert spool.latest == -1  # the stray file is not served
    assert xs(Spool(tmp_path / "s", SCHEMA)) == [1]  # after a restart it is an ordinary batch


def test_a_failed_trim_state_write_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path / "s", SCHEMA)
    for i in range(3):
        spool.append(table(i))
    spool.register_reader("q")
    fmt.write_reader_offset(spool.directory, "q", 2)
    fail_when(monkeypatch, "replace", errno.ENOSPC, lambda src, dst: True)
    with pytest.raises(OSError, match="No space"):
        spool.trim()
    monkeypatch.undo()
    assert fmt.list_offsets(spool.directory) == [0, 1, 2] and spool.earliest == 0
    assert spool.trim() == 3


# --------------------------------------------------------------------------- reads


def test_a_read_that_meets_a_missing_middle_file_names_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, name="sensors")
    for i in range(4):
        spool.append(table(i))
    fmt.offset_path(spool.directory, 2).unlink()
    for skip in (False, True):
        got: list[int] = []
        with pytest.raises(SpoolCorrupt, match=r"sensors.*00000000000000000002\.arrow is missing"):
            got.extend(o for o, _ in spool.read(-1, 3, skip_trimmed=skip))
        assert got == [0, 1]  # read() is lazy: the batches before the gap came first
    assert [o for o, _ in spool.read(-1, 1)] == [0, 1]
    with pytest.raises(SpoolCorrupt, match="is missing") as caught:
        spool.read_file_bytes(2)
    assert caught.value.details["file"].endswith("00000000000000000002.arrow")


def test_a_read_of_a_truncated_file_names_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", SCHEMA, name="sensors")
    spool.append(table(1))
    path = fmt.offset_path(spool.directory, 0)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(SpoolCorrupt, match="unreadable"):
        list(spool.read(-1, 0))


# --------------------------------------------------------------------------- quarantine


def _truncate_newest(d: Path) -> None:
    path = fmt.offset_path(d, 2)
    path.write_bytes(path.read_bytes()[:-30])


def _truncate_middle(d: Path) -> None:
    fmt.offset_path(d, 1).write_bytes(b"")


def _lose_middle(d: Path) -> None:
    fmt.offset_path(d, 1).unlink()


def _lose_first(d: Path) -> None:  # nothing was trimmed, yet offset 0 is gone
    fmt.offset_path(d, 0).unlink()


def _break_schema(d: Path) -> None:
    (d / fmt.SCHEMA_FILE).write_bytes(b"ARROW1 but not really")


def _lose_schema(d: Path) -> None:
    (d / fmt.SCHEMA_FILE).unlink()


def _break_stream_file(d: Path) -> None:
    (d / fmt.STREAM_FILE).write_text("{not json")


def _break_state(d: Path) -> None:
    (d / fmt.STATE_FILE).write_text('{"trimmed_through": "x"}')


def _break_reader(d: Path) -> None:
    (d / fmt.READERS_DIR / "q.offset").write_text("seven")


def _other_schema_file(d: Path) -> None:
    other = pa.table({"y": pa.array(["a"])})
    fmt.offset_path(d, 2).write_bytes(fmt.file_bytes(other))


CORRUPTIONS = {
    "truncated newest file": (_truncate_newest, "00000000000000000002.arrow", True),
    "empty middle file": (_truncate_middle, "00000000000000000001.arrow", False),
    "missing middle file": (_lose_middle, "00000000000000000001.arrow", False),
    "missing first file": (_lose_first, "00000000000000000000.arrow", False),
    "broken schema file": (_break_schema, "schema.arrow", False),
    "missing schema file": (_lose_schema, "schema.arrow", False),
    "broken stream file": (_break_stream_file, "stream.json", False),
    "broken state file": (_break_state, "spool-state.json", False),
    "broken reader offset": (_break_reader, "q.offset", False),
    "file of another schema": (_other_schema_file, "00000000000000000002.arrow", True),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupt_spool_is_quarantined_and_the_others_open(tmp_path: Path, kind: str) -> None:
    damage, named, newest = CORRUPTIONS[kind]
    spools = SpoolSet(tmp_path, fsync=False)
    for name in ("bad", "good"):
        spool = spools.create(name, SCHEMA)
        for i in range(3):
            spool.append(table(i))
    spools.get("bad").register_reader("q")
    bad_dir = spools.get("bad").directory
    damage(bad_dir)
    before = snapshot(bad_dir)

    reopened = SpoolSet(tmp_path, fsync=False)

    assert reopened.streams() == ["good"] and "bad" not in reopened
    assert xs(reopened.get("good")) == [0, 1, 2]
    assert reopened.get("good").append(table(3)) == 3
    (found,) = reopened.quarantined()
    assert found.stream == "bad" and found.directory == bad_dir
    assert found.file.name == named and named in found.reason
    assert found.newest == newest
    assert (str(found.file) in found.fix) == newest and str(bad_dir) in found.fix
    requests: list[Callable[[], object]] = [
        lambda: reopened.get("bad"),
        lambda: reopened.create("bad", SCHEMA),
        lambda: reopened.adopt("bad", tmp_path / "elsewhere"),
    ]
    for request in requests:
        with pytest.raises(SpoolQuarantined, match=f"stream bad is quarantined.*{named}") as err:
            request()
        assert err.value.details == {"stream": "bad", "file": str(found.file)}
        assert isinstance(err.value, KeyError)  # loops over spools skip it like a missing one
    assert snapshot(bad_dir) == before  # kept on disk exactly as it was
    assert [q.to_dict() for q in scan_spools(tmp_path)] == [found.to_dict()]


def test_scan_changes_nothing_and_agrees_with_opening(tmp_path: Path) -> None:
    spools = SpoolSet(tmp_path, fsync=False)
    spool = spools.create("s", SCHEMA)
    for i in range(3):
        spool.append(table(i))
    (spool.directory / f"{fmt.TMP_PREFIX}leftover.arrow").write_bytes(b"half")
    assert scan_spools(tmp_path) == [] and scan_spools(tmp_path / "absent") == []
    _lose_middle(spool.directory)
    before = snapshot(tmp_path)
    (found,) = scan_spools(tmp_path)
    assert snapshot(tmp_path) == before  # the leftover is still there: scanning is read-only
    assert SpoolSet(tmp_path, fsync=False).quarantined() == [found]


def test_moving_the_truncated_newest_file_away_is_a_fix(tmp_path: Path) -> None:
    spools = SpoolSet(tmp_path, fsync=False)
    spool = spools.create("s", SCHEMA)
    for i in range(3):
        spool.append(table(i), origin="p", seq=i)
    _truncate_newest(spool.directory)
    (found,) = SpoolSet(tmp_path, fsync=False).quarantined()
    found.file.rename(tmp_path.parent / "moved-away.arrow")
    healed = SpoolSet(tmp_path, fsync=False).get("s")
    assert (xs(healed), healed.highest_seq("p")) == ([0, 1], 1)


# --------------------------------------------------------------------------- the peer


PERSON = {"name": "person", "fields": [{"name": "id", "type": "long"}]}


def test_a_peer_with_a_truncated_spool_file_starts_and_serves_the_others(tmp_path: Path) -> None:
    async def first_life() -> Path:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        await site.create_schema(PERSON)
        for stream in ("bad", "good"):
            await site.create_stream(stream, "person")
            for i in range(3):
                await site.push(stream, {"columns": {"id": [i]}}, None, None)
        directory = site.spools.get("bad").directory
        await site.close()
        return directory

    bad_dir = asyncio.run(first_life())
    newest = fmt.offset_path(bad_dir, 2)
    newest.write_bytes(newest.read_bytes()[:-17])

    async def second_life() -> None:
        site = LocalSite(SiteConfig(data_dir=tmp_path))  # starts
        try:
            reply = await site.push("good", {"columns": {"id": [7]}}, None, None)
            assert reply["offset"] == 3
            status = await site.status()
            by_name = {s["name"]: s for s in status["streams"]}
            assert by_name["good"]["latest_offset"] == 3
            assert by_name["bad"]["latest_offset"] is None
            assert "00000000000000000002.arrow" in by_name["bad"]["quarantined"]
            (q,) = status["quarantined"]
            assert q["stream"] == "bad" and q["file"] == str(newest) and str(newest) in q["fix"]
            with pytest.raises(FedstreamError, match="stream bad is quarantined") as caught:
                await site.push("bad", {"columns": {"id": [8]}}, None, None)
            assert caught.value.to_wire()["details"]["file"] == str(newest)
            with pytest.raises(FedstreamError, match="stream bad is quarantined"):
                await anext(site.subscribe("bad", "earliest"))
            with pytest.raises(FedstreamError, match="stream bad is quarantined"):
                site.lookup_here("bad")
            subscription = site.subscribe("good", "earliest")
            assert (await anext(subscription))["ready"]
            assert (await anext(subscription))["columns"] == {"id": [0]}
            await subscription.aclose()  # type: ignore[attr-defined]
        finally:
            await site.close()

    asyncio.run(second_life())


class FakeEngine:
    """Records the queries it is asked to run (no Spark)."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.executors = None  # a local master's engine: no executors to watch

    async def run_query(self, checked: Any, _incarnation: str, **_kw: Any) -> Any:
        self.ran.append(checked.query.name)
        return _kw.get("placement")

    async def describe(self, names: list[str]) -> dict[str, dict[str, Any]]:
        return {}

    async def close(self) -> None:
        pass


def _filter(name: str, source: str) -> dict[str, Any]:
    box = {"name": "f", "type": "filter", "inputs": [source], "outputs": [f"{name}_out"]}
    return {"name": name, "boxes": [{**box, "params": {"expression.0": "id > 0"}}]}


def test_queries_on_a_quarantined_stream_do_not_resume_and_say_why(tmp_path: Path) -> None:
    async def first_life() -> Path:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        await site.create_schema(PERSON)
        for stream in ("bad", "good"):
            await site.create_stream(stream, "person")
            await site.push(stream, {"columns": {"id": [1]}}, None, None)
            await site.create_query(_filter(f"on_{stream}", stream))
            site.catalog.set_status(f"on_{stream}", "RUNNING")
        directory = site.spools.get("bad").directory
        await site.close()
        return directory

    _break_schema(asyncio.run(first_life()))

    async def second_life() -> None:
        engine = FakeEngine()
        site = LocalSite(SiteConfig(data_dir=tmp_path), engine=cast(Any, engine))
        try:
            await site.resume_queries()
            assert engine.ran == ["on_good"]
            assert site.query_errors["on_bad"].startswith("stream bad is quarantined")
            status = await site.status()
            errors = {q["name"]: q.get("error") for q in status["queries"]}
            assert errors["on_good"] is None and "schema.arrow" in errors["on_bad"]
        finally:
            site.engine = None
            await site.close()

    asyncio.run(second_life())


def test_doctor_names_the_quarantined_spool_and_the_fix(tmp_path: Path) -> None:
    check = doctor_spools(tmp_path)
    assert "0 spool(s)" in check()  # no spool directory yet
    spools = SpoolSet(tmp_path / "spool", fsync=False)
    for name in ("a", "b"):
        spools.create(name, SCHEMA).append(table(1))
    assert check() == f"2 spool(s) in {tmp_path / 'spool'} open cleanly"
    _break_schema(spools.get("b").directory)
    with pytest.raises(RuntimeError) as caught:
        check()
    text = str(caught.value)
    assert "1 spool(s) will be quarantined" in text
    assert "stream b" in text and "schema.arrow" in text
    assert f"fix: move the directory {spools.get('b').directory}" in text


# --------------------------------------------------------------------------- subscribers


def test_a_subscriber_is_told_the_first_offset_it_missed(tmp_path: Path) -> None:
    async def go() -> None:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        try:
            await site.create_schema(PERSON)
            await site.create_stream("s", "person")
            spool = site.spools.get("s")
            subscription = site.subscribe_here("s", "earliest")
            assert (await anext(subscription))["after"] == -1
            for i in range(4):
                await site.push("s", {"columns": {"id": [i]}}, None, None)
            assert spool.trim(max_age_s=0) == 4  # retention passed before it read them
            with pytest.raises(NotFound, match="first missing offset 0") as caught:
                async with asyncio.timeout(5):  # a skipping subscriber would wait here
                    await anext(subscription)
            assert caught.value.details == {"stream": "s", "first_missing": 0, "earliest": 4}
            # resuming from an offset no longer kept: told at once, before READY
            with pytest.raises(NotFound, match="first missing offset 2") as caught:
                await anext(site.subscribe_here("s", "after:1"))
            assert caught.value.details == {"stream": "s", "first_missing": 2, "earliest": 4}
            fresh = site.subscribe_here("s", "earliest")  # what is kept is served
            assert (await anext(fresh))["after"] == 3
            await site.push("s", {"columns": {"id": [9]}}, None, None)
            assert (await anext(fresh)) == {"offset": 4, "columns": {"id": [9]}}
            await fresh.aclose()  # type: ignore[attr-defined]
        finally:
            await site.close()

    asyncio.run(go())


# --------------------------------------------------------------------------- mirrors


class Receiver:
    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    async def call(self, _target: bytes, message: MirrorAppend) -> dict[str, Any]:
        for seq, body, _status in message.batches:
            t = pa.ipc.open_stream(body).read_all()
            self.spool.append(t, origin=message.origin, seq=seq)
        return {"last": message.batches[-1][0]}


TARGET = bytes(range(20))


def test_a_full_disk_on_the_ack_write_does_not_end_the_mirrors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sender = SpoolSet(tmp_path / "a", fsync=False)
    source = sender.create("s", SCHEMA)
    replica = Spool(tmp_path / "b" / "s", SCHEMA, fsync=False)
    for i in range(5):
        source.append(table(i))
    reader = MIRROR_PREFIX + TARGET.hex()
    refusals = 3
    real_write = fmt.write_reader_offset

    def full_disk(directory: Path, reader_id: str, offset: int, *, fsync: bool = True) -> None:
        nonlocal refusals
        if reader_id == reader and offset >= 0 and refusals:
            refusals -= 1
            raise oserror(errno.ENOSPC)
        real_write(directory, reader_id, offset, fsync=fsync)

    monkeypatch.setattr("peer.federation.mirror.write_reader_offset", full_disk)
    clock = ManualClock()

    def acknowledged(through: int) -> bool:
        clock.advance(RETRY_MAX_S)  # time passes only while the test waits: no pause lasts
        return fmt.read_reader_offset(source.directory, reader) >= through

    async def go() -> None:
        mirrors = Mirrors(sender, bytes(20), Receiver(replica).call, clock=clock)
        runner = asyncio.create_task(mirrors.run())
        await all_tasks_blocked()  # its task group is open
        mirrors.start("s", TARGET)
        await wait_until(lambda: acknowledged(4), "offset 4 acknowledged", 10, every_s=0.01)
        source.append(table(5))  # and it carries on
        await wait_until(lambda: acknowledged(5), "offset 5 acknowledged", 10, every_s=0.01)
        assert not runner.done()  # the task group (and so the peer) lives
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="peer.federation.mirror"):
        asyncio.run(go())
    assert refusals == 0
    assert "cannot record acknowledged offset" in caplog.text
    assert xs(replica) == [0, 1, 2, 3, 4, 5]  # resends were dropped as replays


def test_a_missing_spool_file_pauses_its_mirror_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sender = SpoolSet(tmp_path / "a", fsync=False)
    broken, fine = sender.create("broken", SCHEMA), sender.create("fine", SCHEMA)
    replicas = {n: Spool(tmp_path / "b" / n, SCHEMA, fsync=False) for n in ("broken", "fine")}
    for i in range(3):
        broken.append(table(i))
        fine.append(table(i))
    fmt.offset_path(broken.directory, 1).unlink()
    clock = ManualClock()

    async def send(target: bytes, message: MirrorAppend) -> dict[str, Any]:
        return await Receiver(replicas[message.stream]).call(target, message)

    async def go() -> None:
        mirrors = Mirrors(sender, bytes(20), send, clock=clock)
        runner = asyncio.create_task(mirrors.run())
        await all_tasks_blocked()  # its task group is open
        mirrors.start("broken", TARGET)
        mirrors.start("fine", TARGET)
        await wait_until(lambda: replicas["fine"].latest >= 2, "fine mirrored", 10, every_s=0.01)
        for _ in range(3):  # the broken one pauses on the clock, tries again, pauses again
            await wait_until(lambda: clock.sleepers, "the broken mirror's pause", 10, every_s=0.01)
            clock.advance(RETRY_MAX_S)
        await wait_until(lambda: clock.sleepers, "the broken mirror's pause", 10, every_s=0.01)
        assert not runner.done()
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="peer.federation.mirror"):
        asyncio.run(go())
    assert caplog.text.count("00000000000000000001.arrow is missing") >= 4  # it kept trying
    assert xs(replicas["fine"]) == [0, 1, 2] and replicas["broken"].latest == -1


def test_fault_errors_travel_with_their_codes() -> None:
    fault = fmt.write_fault("s", "writing", oserror(errno.ENOSPC))
    assert isinstance(fault, Unavailable) and fault.to_wire()["code"] == "unavailable"
    assert fault.details == {"stream": "s", "errno": errno.ENOSPC}
    corrupt = SpoolCorrupt("bad", stream="s", file=Path("/x"))
    assert corrupt.to_wire() == {
        "code": "conflict",
        "message": "bad",
        "details": {"stream": "s", "file": "/x"},
    }
