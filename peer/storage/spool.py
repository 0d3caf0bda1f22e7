"""The spool: a durable, append-only log of one stream on a peer, read by offset.

Theory of operation
-------------------
A spool is a directory. Each appended batch becomes one Arrow IPC *file* named by its offset
(``00000000000000000042.arrow``); offsets are consecutive integers from 0. An append writes the
batch to a temporary name in the same directory and fsyncs it, then - under the spool's lock,
so that files appear in offset order - picks the next offset, renames the file into place and
fsyncs the directory. A rename is atomic, so whatever instant a process dies at, a reader
sees either the whole batch or nothing of it; leftover temporary files are removed on open.

Each file's schema metadata carries the batch's origin tag ``(origin, seq)``, its row count
(so the Spark source can bound micro-batches from the footer alone) and the append wall-clock
time. Replays are dropped: an append whose ``seq`` is not above the highest seq seen for its
origin writes nothing. Those highest seqs are rebuilt from file metadata on open; trimming
deletes files, so before it does, it records the seqs and the trimmed offset in
``spool-state.json`` (written atomically). Offsets therefore never go backwards, even when
every file has been trimmed.

Disk faults answer the request, never the peer: an append that meets an OSError (ENOSPC, EIO)
raises :class:`SpoolFault` and keeps nothing. If the directory fsync after the rename fails,
the rename is undone before the lock is released, so no later append or reader takes the
offset for granted (a Spark reader that looked in that instant finds the file gone and fails
its batch). Should even the undo fail, the spool refuses appends until the peer restarts.

A replicated stream's log is its spool (driven by :mod:`peer.replication.log`). Its primary appends
a batch (``Spool.encode`` gives the file bytes, ``append_file`` stores them at the next offset) and
sends the same bytes to its followers, which store them at the same offset (``read_file_bytes`` /
``append_file``), so offsets, the duplicate filter and Spark checkpoints mean the same on every
replica. A follower drops a divergent tail with ``truncate_after``, newest file first, each removal
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

A spool whose files are not what it wrote (a truncated footer, an unreadable schema or state
file, a file missing in the middle) does not open: :class:`SpoolSet` *quarantines* it (keeps
it on disk, serves it to nobody, names the file in every refusal) and opens the others.

Readers are Spark streaming queries in *another* process. Each registered reader owns
``readers/<id>.offset``; the Spark source rewrites it atomically on every commit. ``trim``
deletes only what every registered reader has committed, never above ``latest``.

The on-disk format (file names, metadata, reader offset files) lives in
:mod:`peer.storage.spool_format`, which the Spark source uses without opening a ``Spool``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa

from peer.model.tentative import STABLE
from peer.storage import spool_format as fmt
from peer.storage.spool_format import entry_mark, mark_metadata

log = logging.getLogger(__name__)
MAX_ROWS_PER_FILE = fmt.MAX_ROWS_PER_FILE
ClockNs = Callable[[], int]  # wall time in nanoseconds since the epoch, as time.time_ns


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


# --------------------------------------------------------------------------- Spool


class Spool:
    """One stream's durable log. Thread-safe; owned by exactly one process."""

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        *,
        fsync: bool = True,
        name: str | None = None,
        clock_ns: ClockNs = time.time_ns,
    ) -> None:
        """Open (or create) the spool in ``directory``; ``name`` is its stream's, for errors
        (by default read from the directory name); ``clock_ns`` stamps appends and ages
        retention (wall time in ns; tests pass ``ManualClock.time_ns``). SpoolCorrupt names a
        bad file."""
        self.directory = Path(directory)
        self.name = name if name is not None else fmt.stream_name_of(self.directory)
        self.schema = schema.remove_metadata()
        self.fsync = fsync
        self.clock_ns = clock_ns
        self._lock = threading.Lock()
        self._hold_lock = threading.Lock()
        self._listeners: list[fmt.Listener] = []
        self._broken: str | None = None  # why appends are refused until a restart
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / fmt.READERS_DIR).mkdir(exist_ok=True)
        self._check_schema_file()
        fmt.remove_temporaries(self.directory)
        fmt.remove_temporaries(self.directory / fmt.READERS_DIR)
        layout = fmt.read_layout(self.directory, self.schema, self.name)
        # A crash between writing the state file and deleting the files: finish that trim.
        for offset in layout.stale:
            fmt.offset_path(self.directory, offset).unlink()
        self._trimmed = layout.trimmed
        self._base_seqs = layout.base_seqs  # replay memory of the trimmed files
        self._tags = {o: info.tag for o, info in layout.files.items() if info.tag is not None}
        self._append_ns = {o: info.append_ns for o, info in layout.files.items()}
        self._seqs = self._merged_seqs()
        self._end = layout.offsets[-1] if layout.offsets else self._trimmed
        self._earliest = self._trimmed + 1
        self._visible: int | None = None
        self._told = self._end  # what listeners heard of (an open tells nobody)
        self._reopen_hold()

    def _reopen_hold(self) -> None:
        """Take up the readers' bound the watermark file recorded (not fsynced: after a crash
        it may be older, i.e. lower, which is safe; unreadable: nothing past the trimmed)."""
        try:
            visible = fmt.read_watermark(self.directory)
        except fmt.SpoolCorrupt as exc:
            log.warning("%s; readers see nothing new until the stream's driver holds again", exc)
            visible = self._trimmed
        if visible is not None:
            self.hold(visible)  # (rewrites the file)
            self._told = self.latest

    def _merged_seqs(self) -> dict[str, int]:
        seqs = dict(self._base_seqs)
        for origin, seq in self._tags.values():
            seqs[origin] = max(seqs.get(origin, -1), seq)
        return seqs

    def _check_schema_file(self) -> None:
        path = self.directory / fmt.SCHEMA_FILE
        if path.exists():
            stored = fmt.read_schema_file(self.directory, self.name)
            if not stored.equals(self.schema):
                raise ValueError(
                    f"spool {self.directory} holds schema {stored}, not the given {self.schema}"
                )
            return
        fmt.atomic_write(path, fmt.file_bytes(self.schema.empty_table()), fsync=self.fsync)

    # ----------------------------------------------------------------------- writing

    def append(
        self,
        table: pa.Table,
        *,
        origin: str | None = None,
        seq: int | None = None,
        status: str = STABLE,
        undo: int | None = None,
    ) -> int | None:
        """Durably append one batch (a tentative result, or an ``undo`` entry without rows:
        peer.model.tentative); its new offset, or None if empty or a replay. SpoolFault
        when the disk refuses (nothing is kept)."""
        columns = fmt.conform(table, self.schema)  # before anything touches the disk
        if table.num_rows == 0 and undo is None:
            return None
        tag = _tag(origin, seq)
        self._check_rows(table.num_rows)
        if tag is not None and self._is_replay(*tag):
            return None
        append_ns = self.clock_ns()
        data = self._encode(columns, table.num_rows, tag, append_ns, mark_metadata(status, undo))
        return self._store(data, append_ns, tag, offset=None)

    def encode(
        self, table: pa.Table, *, origin: str | None = None, seq: int | None = None
    ) -> bytes:
        """The exact file bytes ``append`` would write for this batch now (conformed to the
        schema, with its rows, append time and tag), writing nothing: a primary stores them
        with ``append_file`` and sends them to its followers. ValueError as for ``append``,
        and for a batch without rows (which ``append`` skips)."""
        columns = fmt.conform(table, self.schema)
        if table.num_rows == 0:
            raise ValueError(f"stream {self.name}: a batch without rows has no spool file")
        self._check_rows(table.num_rows)
        return self._encode(columns, table.num_rows, _tag(origin, seq), self.clock_ns())

    def _check_rows(self, rows: int) -> None:
        if rows > MAX_ROWS_PER_FILE:
            raise ValueError(f"a batch holds {rows} rows; at most {MAX_ROWS_PER_FILE} per append")

    def _encode(
        self,
        columns: list[pa.ChunkedArray],
        rows: int,
        tag: tuple[str, int] | None,
        ns: int,
        mark: dict[bytes, bytes] | None = None,
    ) -> bytes:
        meta = {fmt.META_ROWS: str(rows).encode(), fmt.META_APPEND_NS: str(ns).encode()}
        meta.update(mark or {})
        if tag is not None:
            meta[fmt.META_ORIGIN] = tag[0].encode()
            meta[fmt.META_SEQ] = str(tag[1]).encode()
        batch = pa.Table.from_arrays(columns, schema=self.schema.with_metadata(meta))
        return fmt.file_bytes(batch)

    def _store(
        self, data: bytes, append_ns: int, tag: tuple[str, int] | None, *, offset: int | None
    ) -> int | None:
        """Write ``data`` as the next file (at ``offset`` if given: no replay check then)."""
        if self._broken is not None:
            raise fmt.SpoolFault(
                f"stream {self.name}: the spool refuses appends since a failed write could not "
                f"be undone ({self._broken}); restart the peer",
                stream=self.name,
            )
        # The expensive part (write + fsync of the data) runs outside the lock, so that
        # concurrent appenders overlap their I/O; only naming the file is serialised.
        tmp = self.directory / f"{fmt.TMP_PREFIX}{uuid.uuid4().hex}{fmt.SUFFIX}"
        try:
            fmt.write_new_file(tmp, data, fsync=self.fsync, stream=self.name)
            with self._lock:
                if offset is None:
                    if tag is not None and self._is_replay(*tag):
                        return None  # a concurrent duplicate won the race; finally removes tmp
                    at = self._end + 1
                else:
                    self._check_next(offset)
                    at = offset
                self._publish(tmp, at)
                self._end = at
                self._append_ns[at] = append_ns
                if tag is not None:
                    self._tags[at] = tag
                    self._seqs[tag[0]] = max(self._seqs.get(tag[0], -1), tag[1])
                now = visible_end(at, self._visible)  # listeners hear of visible offsets only
                uncovered = range(self._told + 1, now + 1)
                self._told = max(self._told, now)
                listeners = list(self._listeners)
        finally:
            with contextlib.suppress(OSError):  # a leftover is removed on the next open
                tmp.unlink()
        tell(self.directory, listeners, uncovered)
        return at

    def _publish(self, tmp: Path, offset: int) -> None:
        """Rename ``tmp`` into place as ``offset`` and make that durable (under the lock);
        if the directory fsync fails, the file is taken away again before anyone may count
        on it."""
        final = fmt.offset_path(self.directory, offset)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            raise fmt.write_fault(self.name, "naming the spool file", exc) from exc
        if not self.fsync:
            return
        try:
            fmt.fsync_dir(self.directory)
        except OSError as exc:
            try:
                os.rename(final, tmp)  # the caller's finally removes tmp
            except OSError as undo:
                self._broken = f"{final} stayed after a failed fsync: {undo.strerror or undo}"
                log.error("spool %s: %s", self.directory, self._broken)
            with contextlib.suppress(OSError):  # best effort: the undo made durable too
                fmt.fsync_dir(self.directory)
            what = "the directory fsync after naming the spool file"
            raise fmt.write_fault(self.name, what, exc) from exc

    def _is_replay(self, origin: str, seq: int) -> bool:
        return seq <= self._seqs.get(origin, -1)

    def aligned(self) -> bool:
        """Whether this replica numbers its batches as its host does: the last batch came
        from a mirror and its sequence (the host's offset) is its offset here. A replica
        made by a move is; one started on a host that had trimmed is not."""
        with self._lock:
            return any(
                origin.startswith("m:") and seq == self._end for origin, seq in self._seqs.items()
            )

    def highest_seq(self, origin: str) -> int | None:
        with self._lock:
            return self._seqs.get(origin)

    def seqs(self) -> dict[str, int]:
        """The highest seq per origin this log holds or trimmed (a copy): its replay memory."""
        with self._lock:
            return dict(self._seqs)

    # ----------------------------------------------------------------------- reading

    @property
    def latest(self) -> int:
        """The last offset readers may see: the log end, or less under a :meth:`hold`."""
        return visible_end(self._end, self._visible)

    @property
    def earliest(self) -> int:
        """First offset still present (``latest + 1`` when everything was trimmed)."""
        return self._earliest

    def read(
        self, start: int, end: int, *, skip_trimmed: bool = False
    ) -> Iterator[tuple[int, pa.Table]]:
        """Stable batches with offsets ``start < o <= end``, in order (``end`` at most
        ``latest``): what a reader that is not tentative sees."""
        for offset, status, _undo, table in self.read_entries(start, end, skip_trimmed):
            if status == STABLE:
                yield offset, table

    def read_entries(
        self, start: int, end: int, skip_trimmed: bool = False
    ) -> Iterator[tuple[int, str, int | None, pa.Table]]:
        """Every entry ``start < o <= end`` as (offset, status, undo offset, batch)."""
        with self._lock:
            latest, earliest = self.latest, self._earliest
        if end > latest:
            raise ValueError(f"spool {self.directory}: offset {end} is beyond latest {latest}")
        first = start + 1
        if first < earliest:
            if not skip_trimmed:
                raise fmt.TrimmedError(
                    f"spool {self.directory}: offsets {first}..{min(end, earliest - 1)} "
                    "were trimmed"
                )
            first = earliest
        for offset in range(first, end + 1):
            try:
                table = fmt.read_file(fmt.offset_path(self.directory, offset))
            except FileNotFoundError:
                error = self._missing(offset)
                if skip_trimmed and isinstance(error, fmt.TrimmedError):
                    continue  # trimmed while we iterated
                raise error from None
            except (OSError, pa.ArrowException) as exc:  # ArrowInvalid: a truncated file
                raise fmt.unreadable_file_error(self.name, self.directory, offset, exc) from None
            status, undo = entry_mark(table.schema.metadata)
            yield offset, status, undo, table.replace_schema_metadata(None)

    def _missing(self, offset: int) -> Exception:
        """The error for a file not found at ``offset``: trimmed, truncated, or lost."""
        with self._lock:
            earliest, latest = self._earliest, self._end
        return fmt.missing_file_error(self.name, self.directory, offset, earliest, latest)

    def append_time_ns(self, offset: int) -> int:
        with self._lock:
            try:
                return self._append_ns[offset]
            except KeyError:
                raise fmt.TrimmedError(f"spool {self.directory}: no offset {offset}") from None

    # ----------------------------------------------------------------------- readers & trim

    def register_reader(self, reader_id: str) -> None:
        path = fmt.reader_path(self.directory, reader_id)
        if not path.exists():
            fmt.write_reader_offset(self.directory, reader_id, -1, fsync=self.fsync)

    def unregister_reader(self, reader_id: str) -> None:
        """Forget a reader. Stop its streaming query first, or its next commit re-registers it."""
        path = fmt.reader_path(self.directory, reader_id)
        for leftover in (path, path.with_suffix(".taken")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        self.pause_reader(reader_id, False)

    def backlog(self) -> int:
        """Batches the slowest registered reader has not committed yet."""
        floors = []
        for reader_id in self.readers():
            path = fmt.reader_path(self.directory, reader_id)
            if path.with_suffix(".paused").exists():
                continue
            with contextlib.suppress(KeyError, ValueError):
                floors.append(max(self.committed(reader_id), fmt.taken_offset(path)))
        return max(0, self.latest - min(floors)) if floors else 0

    def pause_reader(self, reader_id: str, paused: bool = True) -> None:
        """A paused reader (a stopped query) still keeps its data from being trimmed, but no
        longer counts for backpressure."""
        marker = fmt.reader_path(self.directory, reader_id).with_suffix(".paused")
        if paused:
            marker.touch()
        else:
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()

    def readers(self) -> list[str]:
        return sorted(p.stem for p in (self.directory / fmt.READERS_DIR).glob("*.offset"))

    def committed(self, reader_id: str) -> int:
        return fmt.read_reader_offset(self.directory, reader_id)

    def trim(
        self, retain: int = 0, *, max_age_s: float | None = None, keep_after: int | None = None
    ) -> int:
        """Delete files every registered reader has committed, but keep the ``retain`` newest
        (of those readers may see: never above ``latest``).

        A spool no reader is registered on (a result stream, the input of a deleted query)
        keeps everything unless ``max_age_s`` is given: then files appended longer ago than
        that go. A registered reader always holds back what it has not committed.
        ``keep_after``: nothing above this offset goes (what a replica still lacks).
        Returns the number of files deleted.
        """
        floors = []
        for reader_id in self.readers():
            with contextlib.suppress(KeyError):  # unregistered meanwhile
                floors.append(self.committed(reader_id))
        if not floors:
            if max_age_s is None:
                return 0
            floors.append(self._aged_out(self.clock_ns() - int(max_age_s * 1e9)))
        with self._lock:
            floor = min(min(floors), self.latest - max(retain, 0))
            if keep_after is not None:
                floor = min(floor, keep_after)
            if floor < self._earliest:
                return 0
            # Record the seqs and the floor first: once files go, they are the only memory of
            # what was appended, and a crash from here on is finished by the next open.
            doomed = range(self._earliest, floor + 1)
            base = dict(self._base_seqs)
            for origin, seq in (self._tags[o] for o in doomed if o in self._tags):
                base[origin] = max(base.get(origin, -1), seq)
            self._write_state(max(self._trimmed, floor), base)
            self._earliest = floor + 1
            for offset in doomed:
                self._append_ns.pop(offset, None)
                self._tags.pop(offset, None)
        for offset in doomed:
            with contextlib.suppress(FileNotFoundError):
                fmt.offset_path(self.directory, offset).unlink()
        return len(doomed)

    def _write_state(self, trimmed: int, base_seqs: dict[str, int]) -> None:
        """Record what trimming deletes (before it does): through where, and the highest seq
        per origin among the deleted files. Callers hold the lock."""
        state = {"trimmed_through": trimmed, "seqs": base_seqs}
        fmt.atomic_write(
            self.directory / fmt.STATE_FILE, json.dumps(state).encode(), fsync=self.fsync
        )
        self._trimmed, self._base_seqs = trimmed, base_seqs

    # ----------------------------------------------------------------------- moving

    def export(
        self,
        dest: Path,
        *,
        after: int,
        through: int | None = None,
        readers: list[str] | None = None,
        seqs: dict[str, int] | None = None,
        present: int = -1,
    ) -> int:
        """Write a copy of this spool to the new directory ``dest`` for another peer
        (``copy_spool``): the files in ``(after, through]`` (to the latest by default) but
        those up to ``present`` (sent before: :meth:`export_files`), the given readers (all
        by default), the replay memory plus ``seqs``. Returns ``through``."""
        with self._lock:
            through = self._end if through is None else min(through, self._end)
            after = max(after, self._earliest - 1)
            memory = dict(self._seqs)
        for origin, seq in (seqs or {}).items():
            memory[origin] = max(memory.get(origin, -1), seq)
        readers = self.readers() if readers is None else readers
        fmt.copy_spool(
            self.directory,
            dest,
            after,
            through,
            readers,
            memory,
            fsync=self.fsync,
            present=present,
        )
        return through

    def export_files(self, dest: Path, *, after: int) -> tuple[int, int]:
        """Copy this spool's batch files after offset ``after`` (from the earliest at most)
        to the latest into ``dest``, while appends go on; (the latest offset copied, bytes)."""
        with self._lock:
            through = self._end
            after = max(after, self._earliest - 1)
        return through, fmt.copy_files(self.directory, dest, after, through)

    # ----------------------------------------------------------------------- listeners

    def _aged_out(self, cutoff_ns: int) -> int:
        """The newest offset appended at or before ``cutoff_ns`` (appends are in time order)."""
        with self._lock:
            floor = self._earliest - 1
            for offset in range(self._earliest, self.latest + 1):
                stamp = self._append_ns.get(offset)
                if stamp is None or stamp > cutoff_ns:
                    break
                floor = offset
            return floor

    def add_listener(self, callback: fmt.Listener) -> None:
        """Call ``callback(offset)`` once an appended offset is visible to readers (on the
        appending thread, or on the one whose :meth:`hold` uncovered it)."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: fmt.Listener) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    # ----------------------------------------------------------------------- as a replicated log

    @property
    def log_end(self) -> int:
        """The last offset this replica holds (-1 for an empty log), visible or not."""
        return self._end

    def append_file(self, offset: int, data: bytes) -> int:
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

    def _check_next(self, offset: int) -> None:
        if offset != self._end + 1:
            raise ValueError(
                f"stream {self.name}: a file for offset {offset} cannot be stored here: "
                f"the next offset is {self._end + 1}"
            )

    def read_file_bytes(self, offset: int) -> bytes:
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

    def read_entry(self, offset: int) -> tuple[bytes, tuple[str, int] | None]:
        """The file at ``offset`` as ``read_file_bytes`` gives it, and its event id
        (origin, seq) from the replay memory (None if it has none): what a primary ships."""
        data = self.read_file_bytes(offset)
        with self._lock:
            return data, self._tags.get(offset)

    def hold(self, visible: int | None) -> None:
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
    def visible_bound(self) -> int | None:
        """The bound set by :meth:`hold` (None: readers see the log end)."""
        return self._visible

    def truncate_after(self, offset: int) -> int:
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

    def trimmed_state(self) -> tuple[int, dict[str, int]]:
        """(trimmed through, the replay memory of the trimmed files): what a new replica is
        seeded with before it takes the files after it (:meth:`seed`)."""
        with self._lock:
            return self._trimmed, dict(self._base_seqs)

    def seed(self, through: int, seqs: dict[str, int]) -> None:
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


def _tag(origin: str | None, seq: int | None) -> tuple[str, int] | None:
    return (str(origin), int(seq)) if origin is not None and seq is not None else None


class SpoolSet:
    """Every spool of a peer, one directory each under ``root``; reopened on construction.
    A spool that does not open is quarantined (see the module docstring)."""

    def __init__(self, root: Path, *, fsync: bool = True, clock_ns: ClockNs = time.time_ns) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.clock_ns = clock_ns  # every spool's clock (Spool)
        self._lock = threading.Lock()
        self._spools: dict[str, Spool] = {}
        self._quarantined: dict[str, fmt.Quarantine] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(fmt.TMP_PREFIX):  # a crashed create or drop
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if not (entry / fmt.STREAM_FILE).exists():
                continue
            try:
                stream = fmt.read_stream_file(entry)
                schema = fmt.read_schema_file(entry, stream)
                self._spools[stream] = Spool(
                    entry, schema, fsync=fsync, name=stream, clock_ns=clock_ns
                )
            except fmt.OPEN_ERRORS as exc:
                found = fmt.quarantine(entry, exc)
                log.error("%s: quarantined; to fix it, %s", found.reason, found.fix)
                self._quarantined[found.stream] = found

    def quarantined(self) -> list[fmt.Quarantine]:
        """The spools that did not open, by stream name."""
        with self._lock:
            return [self._quarantined[s] for s in sorted(self._quarantined)]

    def quarantine_of(self, stream: str) -> fmt.Quarantine | None:
        with self._lock:
            return self._quarantined.get(stream)

    def _refuse_quarantined(self, stream: str) -> None:
        found = self._quarantined.get(stream)
        if found is not None:
            raise found.error()

    def create(self, stream: str, schema: pa.Schema) -> Spool:
        """Create the spool of ``stream``; idempotent for the same schema."""
        with self._lock:
            self._refuse_quarantined(stream)
            existing = self._spools.get(stream)
            if existing is not None:
                if not existing.schema.equals(schema.remove_metadata()):
                    raise ValueError(f"stream {stream!r} already has a spool with another schema")
                return existing
            name = fmt.stream_dirname(stream)
            if len(name) > 240:
                raise ValueError(f"stream name {stream!r} is too long for a spool directory")
            # Build the directory under a temporary name and rename it: a crash never leaves
            # a spool without its schema or name.
            tmp = self.root / f"{fmt.TMP_PREFIX}{uuid.uuid4().hex}"
            tmp.mkdir()
            Spool(tmp, schema, fsync=self.fsync, name=stream, clock_ns=self.clock_ns)
            fmt.atomic_write(
                tmp / fmt.STREAM_FILE, json.dumps({"stream": stream}).encode(), fsync=False
            )
            final = self.root / name
            os.rename(tmp, final)
            if self.fsync:
                fmt.fsync_dir(self.root)
            spool = Spool(final, schema, fsync=self.fsync, name=stream, clock_ns=self.clock_ns)
            self._spools[stream] = spool
            return spool

    def adopt(self, stream: str, directory: Path) -> Spool:
        """Take in a spool exported by another peer (``Spool.export``) as ``stream``'s."""
        with self._lock:
            self._refuse_quarantined(stream)
            if stream in self._spools:
                raise ValueError(f"stream {stream!r} already has a spool here")
            fmt.atomic_write(
                directory / fmt.STREAM_FILE, json.dumps({"stream": stream}).encode(), fsync=False
            )
            final = self.root / fmt.stream_dirname(stream)
            os.rename(directory, final)
            if self.fsync:
                fmt.fsync_dir(self.root)
            spool = Spool(
                final,
                fmt.read_schema_file(final, stream),
                fsync=self.fsync,
                name=stream,
                clock_ns=self.clock_ns,
            )
            self._spools[stream] = spool
            return spool

    def get(self, stream: str) -> Spool:
        """The spool of ``stream``: KeyError if there is none, SpoolQuarantined (a KeyError
        too) naming the bad file if it is quarantined."""
        with self._lock:
            spool = self._spools.get(stream)
            if spool is not None:
                return spool
            self._refuse_quarantined(stream)
        raise KeyError(f"no spool for stream {stream!r}")

    def __contains__(self, stream: object) -> bool:
        """Whether ``stream`` has a spool that is served (a quarantined one is not)."""
        with self._lock:
            return stream in self._spools

    def drop(self, stream: str) -> None:
        with self._lock:
            spool = self._spools.pop(stream, None)
            if spool is None:
                raise KeyError(f"no spool for stream {stream!r}")
            # Rename first so that a crash mid-delete leaves a temporary, not half a spool.
            doomed = self.root / f"{fmt.TMP_PREFIX}{uuid.uuid4().hex}"
            os.rename(spool.directory, doomed)
            if self.fsync:
                fmt.fsync_dir(self.root)
        shutil.rmtree(doomed, ignore_errors=True)

    def streams(self) -> list[str]:
        """The streams whose spools are served (quarantined ones are not listed)."""
        with self._lock:
            return sorted(self._spools)
