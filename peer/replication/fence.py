"""A replica's durable fence and epoch history, kept beside its spool.

Theory of operation
-------------------
A replica of a replicated stream (docs/replication.md) keeps two things besides its log: the
highest epoch it has seen (its *fence*: appends from lower epochs are refused) and its epoch
history (which epoch wrote which stretch of the log, :mod:`peer.replication.core.history`). Both
live in one small JSON file in the spool directory, ``replica-state.json``, rewritten whole
by every change: written to a temporary name, fsynced, renamed over the old one, and the
directory fsynced. Whatever instant a process dies at, the file holds the old state or the new
one, and a change is durable before the call that makes it returns (the driver performs the
cores' ``SaveEpoch`` / ``SaveHistory`` effects with :meth:`ReplicaState.save_epoch` and
:meth:`ReplicaState.save_history`, each durable before the next effect). A failed write
raises :class:`~peer.storage.spool_format.SpoolFault` and changes nothing, on disk or in
memory.

The fence never goes down, and the history holds no epoch above it (``SaveEpoch`` always
comes first). A history entry is saved *before* the write that needs it and *after* the
truncation that causes it, so a crash in between leaves entries that start beyond the log
end + 1, which own no offset: :meth:`ReplicaState.load` drops them, and refuses
(:class:`~peer.storage.spool_format.SpoolCorrupt`, naming the file) a file that does not
parse or a history that :func:`peer.replication.core.history.check_history` refuses for the log
beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

from peer.replication.core.history import EpochStart, History, check_history, last_epoch, truncated
from peer.storage import spool_format as fmt

__all__ = ["REPLICA_STATE_FILE", "ReplicaState"]

REPLICA_STATE_FILE = fmt.REPLICA_STATE_FILE


def _physical_end(directory: Path) -> int:
    """The last offset the spool in ``directory`` holds (-1 when empty)."""
    present = fmt.list_offsets(directory)
    return present[-1] if present else fmt.trimmed_through(directory)


class ReplicaState:
    """The fence and epoch history of one replica; build it with :meth:`load`."""

    def __init__(self, directory: Path, epoch: int, history: History, *, fsync: bool) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self._epoch = epoch
        self._history = history

    @staticmethod
    def exists(directory: Path) -> bool:
        """Whether the spool directory ``directory`` holds a saved replica state."""
        return (Path(directory) / REPLICA_STATE_FILE).exists()

    @property
    def path(self) -> Path:
        return self.directory / REPLICA_STATE_FILE

    @property
    def epoch(self) -> int:
        """The highest epoch this replica has seen (0: none yet)."""
        return self._epoch

    @property
    def history(self) -> History:
        return self._history

    @classmethod
    def load(
        cls, directory: Path, *, log_end: int | None = None, fsync: bool = True
    ) -> ReplicaState:
        """The state saved in the spool directory ``directory`` (epoch 0 and an empty history
        when there is none), checked against the log there (``log_end``: by default read from
        the directory's files). SpoolCorrupt names the file if it is not a state this class
        writes."""
        directory = Path(directory)
        path = directory / REPLICA_STATE_FILE
        end = _physical_end(directory) if log_end is None else log_end
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(directory, 0, (), fsync=fsync)
        except OSError as exc:
            raise _corrupt(directory, f"cannot be read ({exc.strerror or exc})") from None
        try:
            data = json.loads(raw)
            epoch = data["epoch"]
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"epoch {epoch!r} is not an int >= 0")
            entries = [EpochStart(*pair) for pair in data["history"]]
            # Entries beyond end + 1 own nothing: a crash after a truncation left them.
            history = check_history(truncated(tuple(entries), end + 1), end)
            if last_epoch(history) > epoch:
                raise ValueError(f"the history holds epoch {last_epoch(history)} > {epoch}")
        except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise _corrupt(
                directory, f"is not a replica state ({type(exc).__name__}: {exc})"
            ) from None
        return cls(directory, epoch, history, fsync=fsync)

    def save_epoch(self, epoch: int) -> None:
        """Record durably that this replica has seen ``epoch`` (a fence never goes down:
        ValueError). Nothing is written when it is the epoch saved already."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < self._epoch:
            raise ValueError(
                f"{self.path}: the fence is at epoch {self._epoch}; it cannot become {epoch!r}"
            )
        if epoch != self._epoch:
            self._write(epoch, self._history)

    def save_history(self, history: History) -> None:
        """Replace the epoch history durably. ValueError if its entries are out of order or
        it holds an epoch above the fence (save the epoch first)."""
        history = tuple(history)
        if not all(isinstance(entry, EpochStart) for entry in history):
            raise ValueError(f"{self.path}: a history holds EpochStart entries only")
        # Ordered as check_history wants, for the shortest log that can hold it.
        history = check_history(history, history[-1].start - 1 if history else -1)
        if last_epoch(history) > self._epoch:
            raise ValueError(
                f"{self.path}: the history holds epoch {last_epoch(history)}, above the fence "
                f"at epoch {self._epoch}: save the epoch first"
            )
        if history != self._history:
            self._write(self._epoch, history)

    def _write(self, epoch: int, history: History) -> None:
        data = {"epoch": epoch, "history": [[e.epoch, e.start] for e in history]}
        try:
            fmt.atomic_write(self.path, json.dumps(data).encode(), fsync=self.fsync)
        except OSError as exc:
            stream = fmt.stream_name_of(self.directory)
            raise fmt.SpoolFault(
                f"stream {stream}: the replica state {self.path} was not saved "
                f"({exc.strerror or exc}); the replica keeps its old state",
                stream=stream,
                errno=exc.errno,
            ) from exc
        self._epoch, self._history = epoch, history


def _corrupt(directory: Path, what: str) -> fmt.SpoolCorrupt:
    stream = fmt.stream_name_of(directory)
    path = directory / REPLICA_STATE_FILE
    return fmt.SpoolCorrupt(
        f"stream {stream}: replica state file {path} {what}", stream=stream, file=path
    )
