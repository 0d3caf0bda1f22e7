"""The spool as a replicated log: a replica's side of :class:`peer.storage.spool.Spool`.

Theory of operation
-------------------
A replicated stream's log is its spool. Its primary appends a batch (``Spool.encode`` gives
the file bytes, ``append_file`` stores them at the next offset) and sends the same bytes to
its followers, which store them at the same offset (``read_file_bytes`` / ``append_file``), so
offsets, the duplicate filter and Spark checkpoints mean the same on every replica. A
follower drops a divergent tail with ``truncate_after``, newest file first, each removal
fsynced, so that a crash leaves a whole, shorter log; the replay memory of trimmed files (the
state file) is kept apart from that of the files present, so a truncation forgets exactly
what it removed.

Two ends: ``log_end`` is the last offset the replica holds (what appends and truncations
work with); ``latest`` is the last one its readers may see. A batch is acknowledged once
enough replicas hold it, and an unacknowledged tail can be cut after a failover, so readers
must not see past the acknowledged end. ``hold(visible)`` bounds them: ``latest`` is then
``min(log_end, visible)``, ``read`` refuses beyond it, listeners hear of an offset only once
it is visible (``hold`` tells them about the offsets it uncovers), and trimming stays below
it. ``hold(None)`` (the default of a spool) lifts the bound: a stream that is not replicated
reads to its log end. The bound is also written to the spool's watermark file, which Spark's
processes read (``spool_format.read_watermark``). ``hold`` runs on every acknowledgement, so
the file is cheap to update: created once (fsynced, renamed into place), then rewritten in
place, not fsynced, as a fixed-width offset with its CRC-32 (a reader that meets a torn
rewrite reads again). After a crash the file holds the bound or an older, lower one (or fails
its CRC, and the spool opens with nothing visible past what was trimmed) until the stream's
driver holds again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from peer.storage import spool_format as fmt

__all__ = ["ReplicaLog", "tell", "visible_end", "write_watermark"]

log = logging.getLogger(__name__)


def write_watermark(
    directory: Path, visible: int | None, *, stream: str, create: bool, fsync: bool
) -> None:
    """Write the watermark file (``spool_format.watermark_record``); None removes it. An
    existing file (``create`` false) is rewritten in place, not fsynced: its owner
    re-establishes the bound after a crash, and a torn or stale file errs low. A new one is
    written under a temporary name and renamed into place, fsynced if told, so that a bound
    once set survives a crash. One writer at a time."""
    path = directory / fmt.WATERMARK_FILE
    try:
        if visible is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        record = fmt.watermark_record(visible)
        if not create:
            try:
                fd = os.open(path, os.O_WRONLY)
            except FileNotFoundError:  # removed behind our back: create it again
                create = True
            else:
                try:
                    os.pwrite(fd, record, 0)
                finally:
                    os.close(fd)
        if create:
            fmt.atomic_write(path, record, fsync=fsync)
    except OSError as exc:
        raise fmt.SpoolFault(
            f"stream {stream}: the watermark file {path} was not written ({exc.strerror or exc})",
            stream=stream,
            errno=exc.errno,
        ) from exc


class _Log(Protocol):
    """What :class:`ReplicaLog` uses of the spool it is mixed into."""

    directory: Path
    name: str
    schema: pa.Schema
    fsync: bool
    _lock: threading.Lock
    _hold_lock: threading.Lock
    _listeners: list[fmt.Listener]
    _end: int  # the log end: the last offset held
    _visible: int | None  # the readers' bound (None: none)
    _told: int  # the last offset listeners were told about
    _trimmed: int
    _earliest: int
    _append_ns: dict[int, int]
    _tags: dict[int, tuple[str, int]]
    _seqs: dict[str, int]
    _base_seqs: dict[str, int]

    def _write_state(self, trimmed: int, base_seqs: dict[str, int]) -> None: ...

    def _store(
        self, data: bytes, append_ns: int, tag: tuple[str, int] | None, *, offset: int | None
    ) -> int | None: ...

    def _check_next(self, offset: int) -> None: ...

    def _merged_seqs(self) -> dict[str, int]: ...

    def _missing(self, offset: int) -> Exception: ...

    def readers(self) -> list[str]: ...

    def committed(self, reader_id: str) -> int: ...


def visible_end(end: int, visible: int | None) -> int:
    """The last offset readers may see of a log ending at ``end`` under the bound ``visible``."""
    return end if visible is None else min(end, visible)


def tell(directory: Path, listeners: list[fmt.Listener], offsets: range) -> None:
    """Call every listener for every offset (on this thread); a failing listener is logged."""
    if not listeners:
        return
    for offset in offsets:
        for listener in listeners:
            try:
                listener(offset)
            except Exception:  # the batch is durable already; a bad listener must not undo that
                log.exception("spool listener failed for %s offset %d", directory, offset)


class ReplicaLog:
    """The replica-side methods of a spool (mixed into :class:`peer.storage.spool.Spool`)."""

    @property
    def log_end(self: _Log) -> int:
        """The last offset this replica holds (-1 for an empty log), visible or not."""
        return self._end

    def append_file(self: _Log, offset: int, data: bytes) -> int:
        """Store a spool file written by this stream's primary, byte for byte, at ``offset``,
        which must be ``log_end + 1``. The bytes must be one whole spool file of this schema
        (ValueError says what is wrong); their tag joins the replay memory as it is (the
        primary dropped the replays). SpoolFault when the disk refuses."""
        try:
            info = fmt.check_file_bytes(data, self.schema)
        except ValueError as exc:
            raise ValueError(f"stream {self.name}: offset {offset}: {exc}") from None
        self._check_next(offset)  # early, before the write; _store checks again
        self._store(data, info.append_ns, info.tag, offset=offset)  # (no replay check)
        return offset

    def _check_next(self: _Log, offset: int) -> None:
        if offset != self._end + 1:
            raise ValueError(
                f"stream {self.name}: a file for offset {offset} cannot be stored here: "
                f"the next offset is {self._end + 1}"
            )

    def read_file_bytes(self: _Log, offset: int) -> bytes:
        """The exact bytes of the file at ``offset``, visible or not (for a replica:
        ``append_file``)."""
        with self._lock:
            end, earliest = self._end, self._earliest
        if not 0 <= offset <= end:
            raise ValueError(f"spool {self.directory}: no offset {offset} (latest is {end})")
        if offset < earliest:
            raise fmt.TrimmedError(f"spool {self.directory}: offset {offset} was trimmed")
        try:
            return fmt.offset_path(self.directory, offset).read_bytes()
        except FileNotFoundError:
            raise self._missing(offset) from None
        except OSError as exc:
            raise fmt.unreadable_file_error(self.name, self.directory, offset, exc) from None

    def read_entry(self: _Log, offset: int) -> tuple[bytes, tuple[str, int] | None]:
        """The file at ``offset`` as ``read_file_bytes`` gives it, and its event id
        (origin, seq) from the replay memory (None if it has none): what a primary ships."""
        data = ReplicaLog.read_file_bytes(self, offset)
        with self._lock:
            return data, self._tags.get(offset)

    def hold(self: _Log, visible: int | None) -> None:
        """Let readers see offsets up to ``visible`` only (None: up to the log end). Meant to
        rise (the acknowledged end); a bound below what was trimmed is taken as the trimmed
        end (those offsets were visible already). Listeners hear of the offsets it uncovers.
        Cheap when the bound is unchanged; SpoolFault if the watermark file cannot be
        written (nothing changes then)."""
        if visible is not None and (
            isinstance(visible, bool) or not isinstance(visible, int) or visible < -1
        ):
            raise ValueError(
                f"stream {self.name}: hold takes an offset >= -1 or None, not {visible!r}"
            )
        with self._hold_lock:  # one writer of the watermark file, in the order of the calls
            if visible is not None:
                visible = max(visible, self._trimmed)
            if visible == self._visible:
                return
            create = self._visible is None  # (the file is there exactly while a bound is)
            write_watermark(
                self.directory, visible, stream=self.name, create=create, fsync=self.fsync
            )
            with self._lock:
                self._visible = visible
                now = visible_end(self._end, visible)
                uncovered = range(self._told + 1, now + 1)
                self._told = max(self._told, now)
                listeners = list(self._listeners)
        tell(self.directory, listeners, uncovered)

    @property
    def visible_bound(self: _Log) -> int | None:
        """The bound set by :meth:`hold` (None: readers see the log end)."""
        return self._visible

    def truncate_after(self: _Log, offset: int) -> int:
        """Drop the files above ``offset`` (a tail the primary of a later epoch does not
        have), newest first, each removal made durable before the next, so that a crash
        leaves a whole, shorter log; the replay memory forgets their tags. Refused
        (ValueError) below what was trimmed, what a registered reader committed, or (under a
        :meth:`hold`) what readers may have seen. Returns the number of files dropped."""
        with self._lock:
            if offset >= self._end:
                return 0
            if offset < self._trimmed:
                raise ValueError(
                    f"stream {self.name}: cannot truncate after {offset}: offsets through "
                    f"{self._trimmed} were trimmed already"
                )
            shown = visible_end(self._end, self._visible)
            if self._visible is not None and offset < shown:
                raise ValueError(
                    f"stream {self.name}: cannot truncate after {offset}: offsets through "
                    f"{shown} are acknowledged (visible to readers)"
                )
            for reader_id in self.readers():
                with contextlib.suppress(KeyError):  # unregistered meanwhile
                    committed = self.committed(reader_id)
                    if committed > offset:
                        raise ValueError(
                            f"stream {self.name}: cannot truncate after {offset}: reader "
                            f"{reader_id!r} has committed offset {committed}"
                        )
            dropped = self._end - offset
            try:
                while self._end > offset:
                    with contextlib.suppress(FileNotFoundError):  # a crashed truncation
                        fmt.offset_path(self.directory, self._end).unlink()
                    self._append_ns.pop(self._end, None)
                    self._tags.pop(self._end, None)
                    self._end -= 1  # gone from view, whether or not durable yet
                    self._told = min(self._told, self._end)
                    if self.fsync:
                        fmt.fsync_dir(self.directory)
            except OSError as exc:
                raise fmt.SpoolFault(
                    f"stream {self.name}: truncating after {offset} stopped at offset "
                    f"{self._end} ({exc.strerror or exc})",
                    stream=self.name,
                ) from exc
            finally:
                self._seqs = self._merged_seqs()
        return dropped

    def trimmed_state(self: _Log) -> tuple[int, dict[str, int]]:
        """(trimmed through, the replay memory of the trimmed files): what a new replica is
        seeded with before it takes the files after it (:meth:`seed`)."""
        with self._lock:
            return self._trimmed, dict(self._base_seqs)

    def seed(self: _Log, through: int, seqs: dict[str, int]) -> None:
        """Start this log after ``through``, which its primary trimmed already, with the
        replay memory ``seqs`` of what it trimmed: a new replica takes the files after it.
        The files held here (a prefix of the primary's log, all at or below ``through``) go;
        recorded first, like a trim, so a crash leaves the seeded log. ValueError if this log
        holds anything above ``through``."""
        with self._lock:
            if self._end > through:
                raise ValueError(
                    f"stream {self.name}: cannot seed through {through}: the log holds "
                    f"offsets through {self._end}"
                )
            if self._end == through and self._trimmed == through:
                return
            doomed = range(self._earliest, self._end + 1)
            base = dict(self._base_seqs)
            for origin, seq in [*seqs.items(), *(self._tags[o] for o in doomed if o in self._tags)]:
                base[origin] = max(base.get(origin, -1), seq)
            self._write_state(through, base)
            for offset in doomed:
                self._append_ns.pop(offset, None)
                self._tags.pop(offset, None)
            self._earliest = through + 1
            self._end = through
            self._told = max(self._told, through)
            self._seqs = self._merged_seqs()
        for offset in doomed:
            with contextlib.suppress(FileNotFoundError):
                fmt.offset_path(self.directory, offset).unlink()
