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

Readers are Spark streaming queries in *another* process. Each registered reader owns
``readers/<id>.offset``; the Spark source rewrites it atomically on every commit. ``trim``
deletes only what every registered reader has committed.

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
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from peer.storage.spool_format import (
    MAX_ROWS_PER_FILE,
    META_APPEND_NS,
    META_ORIGIN,
    META_ROWS,
    META_SEQ,
    READERS_DIR,
    SCHEMA_FILE,
    STATE_FILE,
    STREAM_FILE,
    SUFFIX,
    TMP_PREFIX,
    Listener,
    TrimmedError,
    atomic_write,
    conform,
    file_metadata,
    fsync_dir,
    list_offsets,
    load_schema,
    load_state,
    offset_path,
    read_file,
    read_reader_offset,
    reader_path,
    remove_temporaries,
    stream_dirname,
    taken_offset,
    write_reader_offset,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- Spool


class Spool:
    """One stream's durable log. Thread-safe; owned by exactly one process."""

    def __init__(self, directory: Path, schema: pa.Schema, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.schema = schema.remove_metadata()
        self.fsync = fsync
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / READERS_DIR).mkdir(exist_ok=True)
        self._check_schema_file()
        remove_temporaries(self.directory)
        remove_temporaries(self.directory / READERS_DIR)
        self._trimmed, self._seqs = load_state(self.directory)
        self._append_ns: dict[int, int] = {}
        offsets = list_offsets(self.directory)
        # A crash between writing the state file and deleting the files: finish that trim.
        for offset in [o for o in offsets if o <= self._trimmed]:
            offset_path(self.directory, offset).unlink()
        offsets = [o for o in offsets if o > self._trimmed]
        for offset in offsets:
            meta = file_metadata(offset_path(self.directory, offset))
            self._append_ns[offset] = int(meta.get(META_APPEND_NS, b"0"))
            if META_ORIGIN in meta and META_SEQ in meta:
                origin = meta[META_ORIGIN].decode()
                self._seqs[origin] = max(self._seqs.get(origin, -1), int(meta[META_SEQ]))
        self._latest = max(offsets[-1] if offsets else -1, self._trimmed)
        self._earliest = offsets[0] if offsets else self._latest + 1

    def _check_schema_file(self) -> None:
        path = self.directory / SCHEMA_FILE
        if path.exists():
            stored = load_schema(self.directory)
            if not stored.equals(self.schema):
                raise ValueError(
                    f"spool {self.directory} holds schema {stored}, not the given {self.schema}"
                )
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, self.schema):
            pass
        atomic_write(path, sink.getvalue().to_pybytes(), fsync=self.fsync)

    # ----------------------------------------------------------------------- writing

    def append(
        self, table: pa.Table, *, origin: str | None = None, seq: int | None = None
    ) -> int | None:
        """Durably append one batch; its new offset, or None if empty or a replay."""
        columns = conform(table, self.schema)  # before anything touches the disk
        rows = table.num_rows
        if rows == 0:
            return None
        if rows > MAX_ROWS_PER_FILE:
            raise ValueError(f"a batch holds {rows} rows; at most {MAX_ROWS_PER_FILE} per append")
        tagged = origin is not None and seq is not None
        if tagged and self._is_replay(origin, seq):
            return None
        append_ns = time.time_ns()
        meta = {META_ROWS: str(rows).encode(), META_APPEND_NS: str(append_ns).encode()}
        if tagged:
            meta[META_ORIGIN] = str(origin).encode()
            meta[META_SEQ] = str(seq).encode()
        batch = pa.Table.from_arrays(columns, schema=self.schema.with_metadata(meta))
        # The expensive part (write + fsync of the data) runs outside the lock, so that
        # concurrent appenders overlap their I/O; only naming the file is serialised.
        tmp = self.directory / f"{TMP_PREFIX}{uuid.uuid4().hex}{SUFFIX}"
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as out:
                out.write_table(batch)
            if self.fsync:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            with self._lock:
                if tagged and self._is_replay(origin, seq):
                    return None  # a concurrent duplicate won the race; finally removes tmp
                offset = self._latest + 1
                os.rename(tmp, offset_path(self.directory, offset))
                if self.fsync:
                    fsync_dir(self.directory)
                self._latest = offset
                self._append_ns[offset] = append_ns
                if tagged:
                    assert origin is not None and seq is not None
                    self._seqs[origin] = seq
                listeners = list(self._listeners)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        for listener in listeners:
            try:
                listener(offset)
            except Exception:  # the batch is durable already; a bad listener must not undo that
                log.exception("spool listener failed for %s offset %d", self.directory, offset)
        return offset

    def _is_replay(self, origin: str | None, seq: int | None) -> bool:
        assert origin is not None and seq is not None
        return seq <= self._seqs.get(origin, -1)

    def aligned(self) -> bool:
        """Whether this replica numbers its batches as its host does: the last batch came
        from a mirror and its sequence (the host's offset) is its offset here. A replica
        made by a move is; one started on a host that had trimmed is not."""
        with self._lock:
            return any(
                origin.startswith("m:") and seq == self._latest
                for origin, seq in self._seqs.items()
            )

    def highest_seq(self, origin: str) -> int | None:
        with self._lock:
            return self._seqs.get(origin)

    # ----------------------------------------------------------------------- reading

    @property
    def latest(self) -> int:
        return self._latest

    @property
    def earliest(self) -> int:
        """First offset still present (``latest + 1`` when everything was trimmed)."""
        return self._earliest

    def read(
        self, start: int, end: int, *, skip_trimmed: bool = False
    ) -> Iterator[tuple[int, pa.Table]]:
        """Batches with offsets ``start < o <= end``, in order."""
        with self._lock:
            latest, earliest = self._latest, self._earliest
        if end > latest:
            raise ValueError(f"spool {self.directory}: offset {end} is beyond latest {latest}")
        first = start + 1
        if first < earliest:
            if not skip_trimmed:
                raise TrimmedError(
                    f"spool {self.directory}: offsets {first}..{min(end, earliest - 1)} "
                    "were trimmed"
                )
            first = earliest
        for offset in range(first, end + 1):
            try:
                table = read_file(offset_path(self.directory, offset))
            except FileNotFoundError:  # trimmed while we iterated
                if skip_trimmed:
                    continue
                raise TrimmedError(f"spool {self.directory}: offset {offset} was trimmed") from None
            yield offset, table.replace_schema_metadata(None)

    def append_time_ns(self, offset: int) -> int:
        with self._lock:
            try:
                return self._append_ns[offset]
            except KeyError:
                raise TrimmedError(f"spool {self.directory}: no offset {offset}") from None

    # ----------------------------------------------------------------------- readers & trim

    def register_reader(self, reader_id: str) -> None:
        path = reader_path(self.directory, reader_id)
        if not path.exists():
            write_reader_offset(self.directory, reader_id, -1, fsync=self.fsync)

    def unregister_reader(self, reader_id: str) -> None:
        """Forget a reader. Stop its streaming query first, or its next commit re-registers it."""
        path = reader_path(self.directory, reader_id)
        for leftover in (path, path.with_suffix(".taken")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        self.pause_reader(reader_id, False)

    def backlog(self) -> int:
        """Batches the slowest registered reader has not committed yet."""
        floors = []
        for reader_id in self.readers():
            path = reader_path(self.directory, reader_id)
            if path.with_suffix(".paused").exists():
                continue
            with contextlib.suppress(KeyError, ValueError):
                floors.append(max(self.committed(reader_id), taken_offset(path)))
        return max(0, self._latest - min(floors)) if floors else 0

    def pause_reader(self, reader_id: str, paused: bool = True) -> None:
        """A paused reader (a stopped query) still keeps its data from being trimmed, but no
        longer counts for backpressure."""
        marker = reader_path(self.directory, reader_id).with_suffix(".paused")
        if paused:
            marker.touch()
        else:
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()

    def readers(self) -> list[str]:
        return sorted(p.stem for p in (self.directory / READERS_DIR).glob("*.offset"))

    def committed(self, reader_id: str) -> int:
        return read_reader_offset(self.directory, reader_id)

    def trim(self, retain: int = 0, *, max_age_s: float | None = None) -> int:
        """Delete files every registered reader has committed, but keep the ``retain`` newest.

        A spool no reader is registered on (a result stream, the input of a deleted query)
        keeps everything unless ``max_age_s`` is given: then files appended longer ago than
        that go. A registered reader always holds back what it has not committed.
        Returns the number of files deleted.
        """
        floors = []
        for reader_id in self.readers():
            with contextlib.suppress(KeyError):  # unregistered meanwhile
                floors.append(self.committed(reader_id))
        if not floors:
            if max_age_s is None:
                return 0
            floors.append(self._aged_out(time.time_ns() - int(max_age_s * 1e9)))
        with self._lock:
            floor = min(min(floors), self._latest - max(retain, 0))
            if floor < self._earliest:
                return 0
            # Record the seqs and the floor first: once files go, they are the only memory of
            # what was appended, and a crash from here on is finished by the next open.
            self._trimmed = max(self._trimmed, floor)
            state = {"trimmed_through": self._trimmed, "seqs": self._seqs}
            atomic_write(self.directory / STATE_FILE, json.dumps(state).encode(), fsync=self.fsync)
            doomed = range(self._earliest, floor + 1)
            self._earliest = floor + 1
            for offset in doomed:
                self._append_ns.pop(offset, None)
        for offset in doomed:
            with contextlib.suppress(FileNotFoundError):
                offset_path(self.directory, offset).unlink()
        return len(doomed)

    # ----------------------------------------------------------------------- moving

    def export(
        self,
        dest: Path,
        *,
        after: int,
        through: int | None = None,
        readers: list[str] | None = None,
        seqs: dict[str, int] | None = None,
    ) -> int:
        """Write a copy of this spool to the new directory ``dest``, for another peer: the
        files with offsets in ``(after, through]`` (to the latest by default), the given
        readers' offset files (all by default), and a state file that keeps the offsets
        where they are (the copy's next append gets ``through + 1``) and the replay memory
        (highest seq per origin, plus ``seqs``). Returns ``through``. The files are
        immutable once written, so copying them while appends go on is safe."""
        with self._lock:
            through = self._latest if through is None else min(through, self._latest)
            after = max(after, self._earliest - 1)
            memory = dict(self._seqs)
        for origin, seq in (seqs or {}).items():
            memory[origin] = max(memory.get(origin, -1), seq)
        dest.mkdir(parents=True)
        (dest / READERS_DIR).mkdir()
        shutil.copy2(self.directory / SCHEMA_FILE, dest / SCHEMA_FILE)
        for offset in range(after + 1, through + 1):
            shutil.copy2(offset_path(self.directory, offset), offset_path(dest, offset))
        for reader_id in self.readers() if readers is None else readers:
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(reader_path(self.directory, reader_id), reader_path(dest, reader_id))
        # trimmed_through = after: the copy's latest is ``through`` even with no file in it
        state = {"trimmed_through": min(after, through), "seqs": memory}
        atomic_write(dest / STATE_FILE, json.dumps(state).encode(), fsync=self.fsync)
        return through

    # ----------------------------------------------------------------------- listeners

    def _aged_out(self, cutoff_ns: int) -> int:
        """The newest offset appended at or before ``cutoff_ns`` (appends are in time order)."""
        with self._lock:
            floor = self._earliest - 1
            for offset in range(self._earliest, self._latest + 1):
                stamp = self._append_ns.get(offset)
                if stamp is None or stamp > cutoff_ns:
                    break
                floor = offset
            return floor

    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(offset)`` after each append (on the appending thread)."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(callback)


class SpoolSet:
    """Every spool of a peer, one directory each under ``root``; reopened on construction."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._spools: dict[str, Spool] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(TMP_PREFIX):  # a crashed create or drop
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if not (entry / STREAM_FILE).exists():
                continue
            stream = json.loads((entry / STREAM_FILE).read_text())["stream"]
            self._spools[stream] = Spool(entry, load_schema(entry), fsync=fsync)

    def create(self, stream: str, schema: pa.Schema) -> Spool:
        """Create the spool of ``stream``; idempotent for the same schema."""
        with self._lock:
            existing = self._spools.get(stream)
            if existing is not None:
                if not existing.schema.equals(schema.remove_metadata()):
                    raise ValueError(f"stream {stream!r} already has a spool with another schema")
                return existing
            name = stream_dirname(stream)
            if len(name) > 240:
                raise ValueError(f"stream name {stream!r} is too long for a spool directory")
            # Build the directory under a temporary name and rename it: a crash never leaves
            # a spool without its schema or name.
            tmp = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            tmp.mkdir()
            Spool(tmp, schema, fsync=self.fsync)
            atomic_write(tmp / STREAM_FILE, json.dumps({"stream": stream}).encode(), fsync=False)
            final = self.root / name
            os.rename(tmp, final)
            if self.fsync:
                fsync_dir(self.root)
            spool = Spool(final, schema, fsync=self.fsync)
            self._spools[stream] = spool
            return spool

    def adopt(self, stream: str, directory: Path) -> Spool:
        """Take in a spool exported by another peer (``Spool.export``) as ``stream``'s."""
        with self._lock:
            if stream in self._spools:
                raise ValueError(f"stream {stream!r} already has a spool here")
            atomic_write(
                directory / STREAM_FILE, json.dumps({"stream": stream}).encode(), fsync=False
            )
            final = self.root / stream_dirname(stream)
            os.rename(directory, final)
            if self.fsync:
                fsync_dir(self.root)
            spool = Spool(final, load_schema(final), fsync=self.fsync)
            self._spools[stream] = spool
            return spool

    def get(self, stream: str) -> Spool:
        with self._lock:
            try:
                return self._spools[stream]
            except KeyError:
                raise KeyError(f"no spool for stream {stream!r}") from None

    def __contains__(self, stream: object) -> bool:
        with self._lock:
            return stream in self._spools

    def drop(self, stream: str) -> None:
        with self._lock:
            spool = self._spools.pop(stream, None)
            if spool is None:
                raise KeyError(f"no spool for stream {stream!r}")
            # Rename first so that a crash mid-delete leaves a temporary, not half a spool.
            doomed = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
            os.rename(spool.directory, doomed)
            if self.fsync:
                fsync_dir(self.root)
        shutil.rmtree(doomed, ignore_errors=True)

    def streams(self) -> list[str]:
        with self._lock:
            return sorted(self._spools)
