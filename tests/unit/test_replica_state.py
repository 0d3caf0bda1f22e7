"""A replica's fence and epoch history, saved beside its spool: durable, checked, crash-safe.

Faults are injected by replacing ``os.write``, ``os.fsync`` and ``os.replace``; corrupt files
are written by hand. No JVM, no sockets.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from peer.replication.core import SaveEpoch, SaveHistory, Truncate, WriteEntry
from peer.replication.core.history import EpochStart, check_history
from peer.replication.fence import REPLICA_STATE_FILE, ReplicaState
from peer.replication.log import ReplicatedLog, StreamLog
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import SpoolCorrupt, SpoolFault

SCHEMA = pa.schema([("x", pa.int64())])


def spool_with(tmp_path: Path, n: int) -> Spool:
    spool = Spool(tmp_path / "sensors", SCHEMA, fsync=False)
    for x in range(n):
        spool.append(pa.table({"x": pa.array([x], pa.int64())}))
    return spool


def test_a_new_replica_has_epoch_0_and_an_empty_history(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, 0)
    state = ReplicaState.load(spool.directory)
    assert (state.epoch, state.history) == (0, ())
    assert not ReplicaState.exists(spool.directory)
    state.save_epoch(1)
    assert ReplicaState.exists(spool.directory)


def test_the_fence_and_history_survive_a_reload(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, 6)
    state = ReplicaState.load(spool.directory)
    state.save_epoch(2)
    history = (EpochStart(1, 0), EpochStart(2, 4))
    state.save_history(history)
    state.save_epoch(3)
    again = ReplicaState.load(spool.directory)
    assert (again.epoch, again.history) == (3, history)
    assert isinstance(again.history, tuple)
    # the spool opens beside it, and ignores it
    assert Spool(spool.directory, SCHEMA, fsync=False).latest == 5


def test_the_fence_never_goes_down_and_the_history_never_passes_it(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, 3)
    state = ReplicaState.load(spool.directory)
    state.save_epoch(4)
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="the fence is at epoch 4"):
            state.save_epoch(bad)
    with pytest.raises(ValueError, match="above the fence at epoch 4: save the epoch first"):
        state.save_history((EpochStart(5, 0),))
    with pytest.raises(ValueError, match="out of order"):
        state.save_history((EpochStart(2, 0), EpochStart(1, 1)))
    with pytest.raises(ValueError, match="EpochStart entries only"):
        state.save_history(((1, 0),))  # type: ignore[arg-type]
    assert (state.epoch, state.history) == (4, ())
    assert ReplicaState.load(spool.directory).history == ()


def test_unchanged_saves_write_nothing(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, 1)
    state = ReplicaState.load(spool.directory)
    state.save_epoch(1)
    state.save_history((EpochStart(1, 0),))
    path = spool.directory / REPLICA_STATE_FILE
    path.write_text(json.dumps({"epoch": 1, "history": [[1, 0]], "mark": 1}))
    state.save_epoch(1)
    state.save_history((EpochStart(1, 0),))
    assert "mark" in path.read_text()  # not rewritten


def _write(directory: Path, content: Any) -> Path:
    path = directory / REPLICA_STATE_FILE
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "JSONDecodeError"),
        ('{"epoch": 2', "JSONDecodeError"),
        ([1, 2], "TypeError"),
        ({"history": []}, "KeyError"),
        ({"epoch": "2", "history": []}, "epoch '2' is not an int"),
        ({"epoch": -1, "history": []}, "epoch -1 is not an int"),
        ({"epoch": 2, "history": [[1]]}, "TypeError"),
        ({"epoch": 2, "history": [[0, 0]]}, "epoch must be an int >= 1"),
        ({"epoch": 2, "history": [[2, 0], [1, 3]]}, "out of order"),  # check_history's
        ({"epoch": 2, "history": [[1, 2]]}, "starts at 2, but the log holds offset 0"),
        ({"epoch": 1, "history": [[1, 0], [2, 3]]}, "holds epoch 2 > 1"),
    ],
)
def test_a_corrupt_state_file_is_refused_naming_it(tmp_path: Path, content: Any, says: str) -> None:
    spool = spool_with(tmp_path, 5)
    path = _write(spool.directory, content)
    with pytest.raises(SpoolCorrupt, match=says) as caught:
        ReplicaState.load(spool.directory)
    assert caught.value.file == path
    assert str(path) in caught.value.message and "stream sensors" in caught.value.message


def test_the_history_is_checked_against_the_log_beside_it(tmp_path: Path) -> None:
    spool = spool_with(tmp_path, 0)
    _write(spool.directory, {"epoch": 2, "history": [[1, 3]]})
    with pytest.raises(ValueError):  # what load must refuse, by check_history's own rule
        check_history((EpochStart(1, 3),), 2)
    # on an empty log an epoch that starts beyond it owns nothing: a crash left it; dropped
    assert ReplicaState.load(spool.directory).history == ()
    with pytest.raises(SpoolCorrupt, match="starts at 3"):
        ReplicaState.load(spool.directory, log_end=2)


def test_a_crash_between_a_truncation_and_its_history_save_leaves_an_empty_epoch(
    tmp_path: Path,
) -> None:
    spool = spool_with(tmp_path, 10)
    state = ReplicaState.load(spool.directory)
    state.save_epoch(3)
    state.save_history((EpochStart(1, 0), EpochStart(2, 4), EpochStart(3, 8)))
    spool.truncate_after(5)  # ... and the process dies before it saves the cut history
    again = ReplicaState.load(spool.directory)
    assert again.history == (EpochStart(1, 0), EpochStart(2, 4))  # (3, 8) owned 8..9 only
    assert again.epoch == 3
    # a primary's epoch that starts at the log end + 1 (it wrote nothing yet) is kept
    state.save_history((EpochStart(1, 0), EpochStart(2, 4), EpochStart(3, 6)))
    assert ReplicaState.load(spool.directory).history[-1] == EpochStart(3, 6)


def _is_dir(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


@pytest.mark.parametrize(
    ("call", "when"),
    [
        ("open", lambda path, mode: "w" in mode),  # a full disk: the temporary file
        ("fsync", lambda fd: not _is_dir(fd)),
        ("replace", lambda *a: True),
    ],
    ids=["create", "file-fsync", "rename"],
)
def test_a_failed_save_leaves_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, when: Callable[..., bool]
) -> None:
    spool = Spool(tmp_path / "sensors", SCHEMA)
    spool.append(pa.table({"x": pa.array([1], pa.int64())}))
    state = ReplicaState.load(spool.directory)
    state.save_epoch(2)
    state.save_history((EpochStart(2, 0),))
    before = (spool.directory / REPLICA_STATE_FILE).read_bytes()
    where: Any = fmt if call == "open" else os  # (the builtin open, as spool_format sees it)
    real = getattr(where, call, open)
    failed: list[int] = []

    def patched(*args: Any, **kwargs: Any) -> Any:
        if when(*args):
            failed.append(1)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args, **kwargs)

    monkeypatch.setattr(where, call, patched, raising=False)
    with pytest.raises(SpoolFault, match=r"stream sensors: the replica state .* was not saved"):
        state.save_epoch(3)
    with pytest.raises(SpoolFault):
        state.save_history(())
    monkeypatch.undo()
    assert failed
    assert (state.epoch, state.history) == (2, (EpochStart(2, 0),))  # memory unchanged
    assert (spool.directory / REPLICA_STATE_FILE).read_bytes() == before
    reloaded = ReplicaState.load(Spool(spool.directory, SCHEMA).directory)  # leftovers go
    assert (reloaded.epoch, reloaded.history) == (2, (EpochStart(2, 0),))
    assert not list(spool.directory.glob(f"{fmt.TMP_PREFIX}*"))
    state.save_epoch(3)
    assert ReplicaState.load(spool.directory).epoch == 3


def test_saves_are_fsynced_file_then_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path / "sensors", SCHEMA)
    state = ReplicaState.load(spool.directory)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if _is_dir(fd) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    state.save_epoch(1)
    assert synced == ["file", "dir"]


def test_a_spool_is_a_stream_log_and_a_replicated_log_composes_it_with_its_fence(
    tmp_path: Path,
) -> None:
    primary = spool_with(tmp_path / "primary", 2)
    replica = Spool(tmp_path / "replica" / "sensors", SCHEMA, fsync=False)
    face: StreamLog = replica  # mypy checks the Protocol; the rest of the peer sees only this
    log = ReplicatedLog(replica, ReplicaState.load(replica.directory))
    log.perform(
        (
            SaveEpoch(2),
            SaveHistory((EpochStart(2, 0),)),
            WriteEntry(0, 2, primary.read_file_bytes(0)),
            WriteEntry(1, 2, primary.read_file_bytes(1)),
            Truncate(0),
        )
    )
    assert (log.epoch, log.history, log.log_end) == (2, (EpochStart(2, 0),), 0)
    assert replica.read_file_bytes(0) == primary.read_file_bytes(0)
    assert [t.column("x").to_pylist() for _, t in face.read(-1, face.latest)] == [[0]]
    again = ReplicaState.load(replica.directory, log_end=0)
    assert (again.epoch, again.history) == (2, (EpochStart(2, 0),))
