"""One process per data directory: ``peer join`` holds an exclusive lock on its directory
while it runs, so that a second peer started on the same directory (a script run twice, a
supervisor that restarts a peer that is still up) stops at once with a clear error instead of
writing the same spools, catalog and checkpoints as the first.

The lock is ``flock`` on ``DATA_DIR/peer.lock``, which holds the holder's pid for the error
message. The kernel releases it when the process ends, however it ends (a peer killed -9
restarts on its directory at once), and it is not inherited by the processes a peer starts
(its Spark JVM, launched peers): Python opens files non-inheritable.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from peer.errors import Conflict

__all__ = ["LOCK_FILE", "DataDirLock", "hold"]

LOCK_FILE = "peer.lock"


class DataDirLock:
    """A held data directory; :meth:`release` lets it go (or the process's end does)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def hold(data_dir: Path) -> DataDirLock:
    """Lock ``data_dir`` (made if missing) for this process; Conflict, naming the holder's
    pid, if another process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise Conflict(
            f"data directory {data_dir} is in use by another peer (pid {holder}): stop it "
            "first, or give this one another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return DataDirLock(fd, path)
