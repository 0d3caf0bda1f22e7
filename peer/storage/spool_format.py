"""The on-disk format of a spool (see :mod:`peer.storage.spool` for the theory of operation).

These helpers define the files a spool directory holds: one Arrow IPC file per batch named by
its offset, the schema file, the state file written by trimming, one offset file per
registered reader, and the watermark file of a replicated stream (the highest offset its
readers may see: ``Spool.hold``). The Spark source (:mod:`peer.engine.source`) runs in
Spark's Python workers and reads and commits through this module alone: it must never open a
``Spool`` itself.

:func:`read_layout` reads a whole spool directory without changing it and names the first
file that is not what a spool writes (:class:`SpoolCorrupt`): the spool opens with it, and
``peer doctor`` checks a data directory with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa

from peer.errors import Conflict, Unavailable
from peer.model.tentative import STABLE, TENTATIVE, UNDO

log = logging.getLogger(__name__)

SUFFIX = ".arrow"
TMP_PREFIX = ".tmp-"
STATE_FILE = "spool-state.json"
SCHEMA_FILE = "schema.arrow"
READERS_DIR = "readers"
STREAM_FILE = "stream.json"
WATERMARK_FILE = "watermark"  # the highest offset readers may see (Spool.hold)
REPLICA_STATE_FILE = "replica-state.json"  # a replica's fence (peer.replication.fence)
# A tuple's place in a spool as one int, the column ``__seq`` the engine's source adds:
# offset << SEQ_SHIFT | row index (see peer.engine.source), so a file must hold fewer rows.
SEQ_COLUMN = "__seq"
SEQ_SHIFT = 24
MAX_ROWS_PER_FILE = (1 << SEQ_SHIFT) - 1


def lineage_seq(k: int) -> str:
    """The hidden column holding the ``__seq`` of root ``k`` of a result (an engine query
    compiled with lineage: a join's two input tuples, left first; peer.replication.standby)."""
    return f"__lineage{k}_seq"


def is_lineage(column: str) -> bool:
    """Whether ``column`` is a :func:`lineage_seq` column."""
    return column.startswith("__lineage") and column.endswith("_seq")


META_ORIGIN = b"fedstream.origin"
META_SEQ = b"fedstream.seq"
META_ROWS = b"fedstream.rows"
META_APPEND_NS = b"fedstream.append_ns"
# The marks of tentative results (issue 16; see peer.model.tentative): a tentative batch's file
# carries ``fedstream.status = tentative``; an undo entry is a file without rows whose metadata
# names the first tentative offset it takes back (``fedstream.undo``). A file without either is
# stable, so every spool written before tentative results existed reads as it did.
META_STATUS = b"fedstream.status"
META_UNDO = b"fedstream.undo"
# A heartbeat file (only in a tentative fork's copy of a missing input: peer.engine.forks).
META_HEARTBEAT = b"fedstream.heartbeat"

_OFFSET_NAME = re.compile(r"(\d{20})\.arrow")  # matched whole (fullmatch), as _READER_ID
_READER_ID = re.compile(r"[A-Za-z0-9_.\-]{1,200}")

Listener = Callable[[int], None]


class TrimmedError(LookupError):
    """Asked for spool data that trimming has already deleted."""


class SpoolFault(Unavailable):
    """The disk refused a write (ENOSPC, EIO, ...). Nothing of the request was kept, and the
    peer goes on; the same request may succeed once the disk has room again."""


class SpoolCorrupt(Conflict):
    """A spool file is not what a spool writes: unreadable (a truncated footer), of another
    schema, or missing in the middle of the log. ``file`` names it; ``newest`` says that it
    is the newest batch file, so that moving that one file away leaves a whole spool."""

    def __init__(self, message: str, *, stream: str, file: Path, newest: bool = False) -> None:
        super().__init__(message, stream=stream, file=str(file))
        self.file = Path(file)
        self.newest = newest


class SpoolQuarantined(Conflict, KeyError):
    """A request on a stream whose spool was quarantined when the peer started (a
    :class:`KeyError` too, as for a stream without a spool: loops over spools skip it)."""

    def __str__(self) -> str:
        return self.message


def entry_mark(meta: dict[bytes, bytes] | None) -> tuple[str, int | None]:
    """A file's status (stable, tentative or undo) and, for an undo, the offset it names;
    ValueError for a mark no spool writes."""
    if not meta:
        return STABLE, None
    if META_UNDO in meta:
        undo = int(meta[META_UNDO])
        if undo < 0:
            raise ValueError(f"an undo names offset {undo}")
        return UNDO, undo
    status = meta.get(META_STATUS, STABLE.encode()).decode()
    if status not in (STABLE, TENTATIVE):
        raise ValueError(f"unknown status {status!r}")
    return status, None


def mark_metadata(status: str, undo: int | None) -> dict[bytes, bytes]:
    """The metadata entries :func:`entry_mark` reads back."""
    if undo is not None:
        return {META_UNDO: str(undo).encode()}
    return {} if status == STABLE else {META_STATUS: status.encode()}


# --------------------------------------------------------------------------- on-disk format


def offset_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SUFFIX}"


def list_offsets(directory: Path) -> list[int]:
    """Offsets of the complete files present, ascending (temporary files are ignored)."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            m = _OFFSET_NAME.fullmatch(entry.name)
            if m:
                found.append(int(m.group(1)))
    found.sort()
    return found


def file_metadata(path: Path) -> dict[bytes, bytes]:
    """The schema metadata of one spool file, read from its footer only."""
    with pa.memory_map(str(path)) as source:
        return dict(pa.ipc.open_file(source).schema.metadata or {})


def file_rows(path: Path) -> int:
    meta = file_metadata(path)
    if META_ROWS in meta:
        return int(meta[META_ROWS])
    with pa.memory_map(str(path)) as source:  # a file written by hand: count the batches
        reader = pa.ipc.open_file(source)
        return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))


def read_file(path: Path) -> pa.Table:
    # read_all copies nothing: the table keeps the mapping alive, also after an unlink.
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def file_bytes(table: pa.Table) -> bytes:
    """``table`` as the bytes of one spool file (an Arrow IPC file)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as out:
        out.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


@dataclass(frozen=True)
class FileInfo:
    """What a spool keeps in memory about one of its files, read from its footer."""

    rows: int
    append_ns: int
    tag: tuple[str, int] | None  # (origin, seq) of a tagged batch
    status: str = STABLE
    undo: int | None = None  # an undo entry: the first tentative offset it takes back


def file_info(meta: dict[bytes, bytes]) -> FileInfo:
    """The spool metadata of a file's schema; ValueError names a malformed entry."""
    try:
        rows = int(meta.get(META_ROWS, b"-1"))
        append_ns = int(meta.get(META_APPEND_NS, b"0"))
        tag = None
        if META_ORIGIN in meta or META_SEQ in meta:
            tag = (meta[META_ORIGIN].decode(), int(meta[META_SEQ]))
        status, undo = entry_mark(meta)
    except (KeyError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"malformed spool metadata ({type(exc).__name__}: {exc})") from None
    return FileInfo(rows, append_ns, tag, status, undo)


def check_file_bytes(data: bytes, schema: pa.Schema) -> FileInfo:
    """Check that ``data`` is one whole spool file of ``schema`` (a replica stores its
    primary's bytes as they are); ValueError says what is wrong with it."""
    try:
        reader = pa.ipc.open_file(pa.BufferReader(data))
        table = reader.read_all()
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
        raise ValueError(f"not a whole Arrow IPC file ({exc})") from None
    if not table.schema.remove_metadata().equals(schema.remove_metadata()):
        raise ValueError(f"the file holds schema {table.schema.remove_metadata()}, not {schema}")
    info = file_info(dict(reader.schema.metadata or {}))
    if info.status == UNDO and table.num_rows == 0:
        return info  # an undo entry holds no rows
    if not 0 < table.num_rows <= MAX_ROWS_PER_FILE:
        raise ValueError(f"the file holds {table.num_rows} rows (1..{MAX_ROWS_PER_FILE} allowed)")
    if info.rows not in (-1, table.num_rows):
        raise ValueError(f"the file says it holds {info.rows} rows but holds {table.num_rows}")
    if info.tag is not None and info.tag[1] < 0:
        raise ValueError(f"the file's seq {info.tag[1]} is negative")
    for f in schema:
        if not f.nullable and table.column(f.name).null_count:
            raise ValueError(f"field {f.name!r} holds a null but is not nullable")
    return info


def trimmed_through(directory: Path) -> int:
    """Highest offset that trimming deleted (-1 if none), from the state file."""
    return load_state(directory)[0]


def backlog(directory: Path) -> int:
    """How many batches of the spool in ``directory`` its slowest registered reader has not
    committed (0 without readers). Reads only file names and the small offset files."""
    offsets = []
    for path in (directory / READERS_DIR).glob("*.offset"):
        if path.with_suffix(".paused").exists():
            continue  # a stopped query: it holds its data back from trimming, not its writers
        with contextlib.suppress(OSError, ValueError):
            offsets.append(max(int(path.read_text().strip()), taken_offset(path)))
    if not offsets:
        return 0
    present = list_offsets(directory)
    latest = present[-1] if present else trimmed_through(directory)
    visible = read_watermark(directory)  # never below what was trimmed (Spool.hold)
    if visible is not None:
        latest = min(latest, visible)
    return max(0, latest - min(offsets))


def taken_offset(offset_path: Path) -> int:
    try:
        return int(offset_path.with_suffix(".taken").read_text().strip())
    except (OSError, ValueError):
        return -1


def write_taken(directory: Path, reader_id: str, offset: int) -> None:
    """Record that ``reader_id`` has taken (planned a batch up to) ``offset``: it counts for
    backpressure at once, while its commit (what trimming waits for) comes a batch later."""
    path = reader_path(directory, reader_id).with_suffix(".taken")
    atomic_write(path, str(offset).encode(), fsync=False)


def reader_path(directory: Path, reader_id: str) -> Path:
    if not _READER_ID.fullmatch(reader_id):
        raise ValueError(f"invalid spool reader id {reader_id!r} (letters, digits, _ . - only)")
    return directory / READERS_DIR / f"{reader_id}.offset"


def read_reader_offset(directory: Path, reader_id: str) -> int:
    path = reader_path(directory, reader_id)
    try:
        return int(path.read_text().strip())
    except FileNotFoundError:
        raise KeyError(f"reader {reader_id!r} is not registered on spool {directory}") from None


def write_reader_offset(
    directory: Path, reader_id: str, offset: int, *, fsync: bool = True
) -> None:
    """Atomically record that ``reader_id`` has durably consumed every file <= ``offset``."""
    path = reader_path(directory, reader_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, f"{offset}\n".encode(), fsync=fsync)


def watermark_record(visible: int) -> bytes:
    """The watermark file's content: a fixed-width offset and its CRC-32, so that its owner
    rewrites it in place (no rename: ~4 us, not ~130) and a torn read is recognised."""
    digits = b"%020d" % visible
    return b"%s %08x\n" % (digits, zlib.crc32(digits))


def read_watermark(directory: Path) -> int | None:
    """The highest offset readers of the spool in ``directory`` may see (``Spool.hold``), or
    None: no bound (no file). A read torn by a concurrent rewrite is retried; SpoolCorrupt
    names the file if it holds no offset."""
    path = Path(directory) / WATERMARK_FILE
    for attempt in range(5):
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        digits, _, crc = raw.rstrip(b"\n").partition(b" ")
        if crc == b"%08x" % zlib.crc32(digits) and re.fullmatch(rb"-0*1|\d+", digits):
            return int(digits)
        time.sleep(0.001 * attempt)
    stream = stream_name_of(directory)
    raise SpoolCorrupt(
        f"stream {stream}: watermark file {path} is unreadable ({raw[:40]!r})",
        stream=stream,
        file=path,
    )


def write_new_file(path: Path, data: bytes, *, fsync: bool, stream: str) -> None:
    """Create ``path`` (it must not exist) holding ``data``, fsynced unless told not to;
    SpoolFault (for ``stream``) when the disk refuses."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_fault(stream, "writing the spool file", exc) from exc


def write_fault(stream: str, what: str, exc: OSError) -> SpoolFault:
    return SpoolFault(
        f"stream {stream}: the batch was not stored: {what} failed "
        f"({exc.strerror or exc}); nothing of it was kept",
        stream=stream,
        errno=exc.errno,
    )


def copy_spool(
    source: Path,
    dest: Path,
    after: int,
    through: int,
    readers: list[str],
    seqs: dict[str, int],
    *,
    fsync: bool,
    present: int = -1,
) -> None:
    """Write to the new directory ``dest`` a spool holding ``source``'s files in
    ``(after, through]``, the offset files of ``readers``, and a state file that keeps the
    offsets where they are (its next append gets ``through + 1``) with replay memory ``seqs``.
    Files are immutable once written, so copying them while appends go on is safe. The files
    at offsets up to ``present`` are left out: the copy's reader has them already (a move's
    pre-copy, :func:`copy_files`)."""
    dest.mkdir(parents=True)
    (dest / READERS_DIR).mkdir()
    shutil.copy2(source / SCHEMA_FILE, dest / SCHEMA_FILE)
    for offset in range(max(after, present) + 1, through + 1):
        shutil.copy2(offset_path(source, offset), offset_path(dest, offset))
    for reader_id in readers:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(reader_path(source, reader_id), reader_path(dest, reader_id))
    # trimmed_through = after: the copy's latest is ``through`` even with no file in it
    state = {"trimmed_through": min(after, through), "seqs": seqs}
    atomic_write(dest / STATE_FILE, json.dumps(state).encode(), fsync=fsync)


def copy_files(source: Path, dest: Path, after: int, through: int) -> int:
    """Copy ``source``'s batch files in ``(after, through]`` into ``dest`` (made if needed),
    skipping those trimmed meanwhile (a copy needs none below the source's earliest); the
    bytes copied. The first part of a move sent while its fragment runs: the rest goes with
    :func:`copy_spool` and ``present = through``."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for offset in range(after + 1, through + 1):
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(offset_path(source, offset), offset_path(dest, offset))
            copied += offset_path(dest, offset).stat().st_size
    return copied


def missing_file_error(
    stream: str, directory: Path, offset: int, earliest: int, latest: int
) -> Exception:
    """The error for a batch file not found at ``offset`` of a spool that holds
    ``earliest..latest``: trimmed, truncated away, or lost."""
    if offset < earliest:
        return TrimmedError(f"spool {directory}: offset {offset} was trimmed")
    if offset > latest:
        return ValueError(f"spool {directory}: offset {offset} was truncated away")
    path = offset_path(directory, offset)
    return SpoolCorrupt(
        f"stream {stream}: spool file {path} is missing (offsets {earliest}..{latest} "
        "should all be there): its batch is lost on this peer",
        stream=stream,
        file=path,
    )


def unreadable_file_error(
    stream: str, directory: Path, offset: int, exc: Exception
) -> SpoolCorrupt:
    path = offset_path(directory, offset)
    return SpoolCorrupt(
        f"stream {stream}: spool file {path} is unreadable ({exc})", stream=stream, file=path
    )


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    tmp = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_state(directory: Path) -> tuple[int, dict[str, int]]:
    """(trimmed_through, highest seq per origin) as the last trim recorded them."""
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except FileNotFoundError:
        return -1, {}
    seqs = {str(k): int(v) for k, v in state.get("seqs", {}).items()}
    return int(state.get("trimmed_through", -1)), seqs


def remove_temporaries(directory: Path) -> None:
    # Only the owning process writes here (readers/ belongs to the Spark source), so any
    # temporary file present at open time is a leftover of a crash.
    for path in directory.glob(f"{TMP_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def conform(table: pa.Table, schema: pa.Schema) -> list[pa.ChunkedArray]:
    """The table's columns in ``schema``'s order and types; ValueError names the bad field."""
    names = set(table.column_names)
    extra = [n for n in table.column_names if n not in schema.names]
    if extra:
        raise ValueError(f"field {extra[0]!r} is not in the stream's schema")
    columns = []
    for field in schema:
        if field.name not in names:
            raise ValueError(f"field {field.name!r} is missing")
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise ValueError(
                    f"field {field.name!r}: cannot convert {column.type} to {field.type}: {e}"
                ) from e
        if not field.nullable and column.null_count:
            raise ValueError(f"field {field.name!r} holds a null but is not nullable")
        columns.append(column)
    return columns


def load_schema(directory: Path) -> pa.Schema:
    with pa.memory_map(str(Path(directory) / SCHEMA_FILE)) as source:
        return pa.ipc.open_file(source).schema


def stream_name_of(directory: Path) -> str:
    """The stream a spool directory belongs to, from its name (the stream file says the
    same; this works when that file is unreadable)."""
    return unquote(Path(directory).name)


def read_stream_file(directory: Path) -> str:
    """The stream named by a spool directory's stream file; SpoolCorrupt if unreadable."""
    path = Path(directory) / STREAM_FILE
    try:
        stream = json.loads(path.read_text())["stream"]
        if not isinstance(stream, str):
            raise TypeError(f"stream is {type(stream).__name__}, not a string")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        name = stream_name_of(directory)
        raise SpoolCorrupt(
            f"stream {name}: spool file {path} is unreadable ({type(exc).__name__}: {exc})",
            stream=name,
            file=path,
        ) from None
    return stream


def read_schema_file(directory: Path, stream: str) -> pa.Schema:
    """The schema a spool directory was created with; SpoolCorrupt if unreadable."""
    try:
        return load_schema(directory)
    except (OSError, pa.ArrowException) as exc:  # ArrowInvalid: truncated or not Arrow
        path = Path(directory) / SCHEMA_FILE
        raise SpoolCorrupt(
            f"stream {stream}: spool schema file {path} is unreadable ({exc})",
            stream=stream,
            file=path,
        ) from None


@dataclass
class Layout:
    """What a spool directory holds, as :func:`read_layout` found it."""

    trimmed: int  # trimmed_through of the state file (-1: nothing trimmed)
    base_seqs: dict[str, int]  # highest seq per origin among the trimmed files
    offsets: list[int]  # files after ``trimmed``: consecutive, from trimmed + 1
    stale: list[int]  # files a crashed trim left behind
    files: dict[int, FileInfo]  # what the footer of each file in ``offsets`` says


def read_layout(directory: Path, schema: pa.Schema, stream: str) -> Layout:
    """Read a spool directory without changing anything (temporary files and the files an
    unfinished trim left are ignored). SpoolCorrupt names the first file that is not what a
    spool writes: a state or reader offset file that does not parse, a batch file whose
    footer is unreadable or whose schema is not ``schema``, a batch file missing before the
    newest one."""
    state_path = directory / STATE_FILE
    try:
        trimmed, base_seqs = load_state(directory)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise SpoolCorrupt(
            f"stream {stream}: spool state file {state_path} is unreadable ({exc})",
            stream=stream,
            file=state_path,
        ) from None
    present = list_offsets(directory)
    offsets = [o for o in present if o > trimmed]
    layout = Layout(trimmed, base_seqs, offsets, [o for o in present if o <= trimmed], {})
    expected = range(trimmed + 1, trimmed + 1 + len(offsets))
    if offsets != list(expected):
        have = set(offsets)
        missing = next(o for o in range(trimmed + 1, offsets[-1]) if o not in have)
        raise SpoolCorrupt(
            f"stream {stream}: spool file {offset_path(directory, missing)} is missing "
            f"(the spool holds offsets up to {offsets[-1]}, trimmed through {trimmed})",
            stream=stream,
            file=offset_path(directory, missing),
        )
    wanted = schema.remove_metadata()
    for offset in offsets:
        path = offset_path(directory, offset)
        try:
            with pa.memory_map(str(path)) as source:
                found = pa.ipc.open_file(source).schema
            if not found.remove_metadata().equals(wanted):
                raise ValueError(f"it holds schema {found.remove_metadata()}, not {wanted}")
            layout.files[offset] = file_info(dict(found.metadata or {}))
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SpoolCorrupt(
                f"stream {stream}: spool file {path} is unreadable or truncated ({exc})",
                stream=stream,
                file=path,
                newest=offset == offsets[-1],
            ) from None
    for path in sorted((directory / READERS_DIR).glob("*.offset")):
        try:
            int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            raise SpoolCorrupt(
                f"stream {stream}: reader offset file {path} is unreadable ({exc})",
                stream=stream,
                file=path,
            ) from None
    return layout


def stream_dirname(stream: str) -> str:
    """A filesystem-safe, reversible directory name for a stream name (which may be a URI)."""
    # quote() leaves '.' alone; escaping it too rules out '.', '..' and hidden names.
    return quote(stream, safe="").replace(".", "%2E")


# --------------------------------------------------------------------------- quarantine

# What opening a spool directory may raise besides SpoolCorrupt (a file of unexpected form).
OPEN_ERRORS = (SpoolCorrupt, OSError, ValueError, LookupError, TypeError, pa.ArrowException)


@dataclass(frozen=True)
class Quarantine:
    """A spool that did not open: kept on disk as it is, served to nobody."""

    stream: str
    directory: Path
    file: Path  # the first bad file (or the directory, when no file is to blame)
    reason: str
    newest: bool = False  # the bad file is the newest batch file

    @property
    def fix(self) -> str:
        whole = (
            f"move the directory {self.directory} out of {self.directory.parent} (keep it: it "
            f"holds the stream's data) and restart the peer; stream {self.stream} then starts "
            "empty on this peer"
        )
        if not self.newest:
            return whole
        return (
            f"move the file {self.file} out of {self.directory} and restart the peer (its "
            f"batch is lost on this peer, the older ones are kept), or {whole}"
        )

    def error(self) -> SpoolQuarantined:
        return SpoolQuarantined(
            f"stream {self.stream} is quarantined on this peer (not served): {self.reason}",
            stream=self.stream,
            file=str(self.file),
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "stream": self.stream,
            "directory": str(self.directory),
            "file": str(self.file),
            "reason": self.reason,
            "fix": self.fix,
        }


def quarantine(directory: Path, exc: Exception) -> Quarantine:
    """The quarantine of the spool in ``directory`` that failed to open with ``exc``."""
    if isinstance(exc, SpoolCorrupt):
        stream = str(exc.details.get("stream", stream_name_of(directory)))
        return Quarantine(stream, directory, exc.file, exc.message, exc.newest)
    stream = stream_name_of(directory)
    reason = f"stream {stream}: spool {directory} does not open ({type(exc).__name__}: {exc})"
    return Quarantine(stream, directory, directory, reason)


def scan_spools(root: Path) -> list[Quarantine]:
    """The spools under ``root`` (a peer's spool directory) that would be quarantined when
    the peer starts; reads only, changes nothing (``peer doctor``)."""
    found: list[Quarantine] = []
    if not root.is_dir():
        return found
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(TMP_PREFIX) or not (entry / STREAM_FILE).exists():
            continue
        try:
            stream = read_stream_file(entry)
            read_layout(entry, read_schema_file(entry, stream), stream)
        except OPEN_ERRORS as exc:
            found.append(quarantine(entry, exc))
    return found
