"""The on-disk format of a spool (see :mod:`peer.storage.spool` for the theory of operation).

These helpers define the files a spool directory holds: one Arrow IPC file per batch named by
its offset, the schema file, the state file written by trimming, and one offset file per
registered reader. The Spark source (:mod:`peer.engine.source`) runs in Spark's Python workers
and reads and commits through this module alone: it must never open a ``Spool`` itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa

log = logging.getLogger(__name__)

SUFFIX = ".arrow"
TMP_PREFIX = ".tmp-"
STATE_FILE = "spool-state.json"
SCHEMA_FILE = "schema.arrow"
READERS_DIR = "readers"
STREAM_FILE = "stream.json"
# __seq = offset * 2**24 + row index (see peer.engine.source): a file must hold fewer rows.
MAX_ROWS_PER_FILE = (1 << 24) - 1

META_ORIGIN = b"fedstream.origin"
META_SEQ = b"fedstream.seq"
META_ROWS = b"fedstream.rows"
META_APPEND_NS = b"fedstream.append_ns"

_OFFSET_NAME = re.compile(r"^(\d{20})\.arrow$")
_READER_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")

Listener = Callable[[int], None]


class TrimmedError(LookupError):
    """Asked for spool data that trimming has already deleted."""


# --------------------------------------------------------------------------- on-disk format


def offset_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SUFFIX}"


def list_offsets(directory: Path) -> list[int]:
    """Offsets of the complete files present, ascending (temporary files are ignored)."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            m = _OFFSET_NAME.match(entry.name)
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
    if not _READER_ID.match(reader_id):
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


def stream_dirname(stream: str) -> str:
    """A filesystem-safe, reversible directory name for a stream name (which may be a URI)."""
    # quote() leaves '.' alone; escaping it too rules out '.', '..' and hidden names.
    return quote(stream, safe="").replace(".", "%2E")
