"""One process per data directory (peer.storage.datadir): the lock, its refusal, its release."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from peer.errors import Conflict
from peer.storage.datadir import LOCK_FILE, hold


def test_a_held_directory_is_refused_naming_it_and_the_holder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = hold(data)  # made if missing
    assert (data / LOCK_FILE).read_text() == str(os.getpid())
    with pytest.raises(Conflict) as refused:  # a second open of the file: another holder
        hold(data)
    assert str(data) in refused.value.message and f"pid {os.getpid()}" in refused.value.message
    first.release()
    first.release()  # idempotent
    again = hold(data)  # free once released
    again.release()


def test_directories_are_held_apart(tmp_path: Path) -> None:
    a, b = hold(tmp_path / "a"), hold(tmp_path / "b")
    a.release()
    b.release()
