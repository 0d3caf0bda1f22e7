"""What a tentative fork reads of an input that is itself tentative (a chain of fragments).

A fragment downstream of a tentative one gets tentative entries and undos in its input log
(``peer.model.tentative``; mirrors carry them). Its stable query reads the stable entries
only, so it waits; its fork must read the tentative ones too, but never one that an undo has
taken back. The fork therefore reads a *copy* of such an input, which
:func:`feed_copy` writes and extends: every entry at its own offset (the Spark source walks
offsets without gaps), a stable entry as it is, a tentative entry that no undo has taken back
as a stable one (so the fork's source reads it), and an undo or an undone tentative entry as
an empty file. An undo that arrives while the fork runs stops the copy: the fork is then
corrected (its own results taken back) and forked again from the stable checkpoint.

:class:`InputLog` follows one input's log from its files' footers: the newest stable offset
(what the missing-input detection counts as progress), whether tentative entries are open
(written since the last undo), and how many undos it has seen.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from peer.model.tentative import STABLE, TENTATIVE, UNDO
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import entry_mark


@dataclass
class InputLog:
    """One input log as far as it has been looked at."""

    seen: int | None = None  # entries looked at through this offset (None: not yet)
    stable_end: int = -1  # the newest stable offset
    open_from: int | None = None  # the first tentative offset since the last undo
    undos: int = 0

    def scan(self, spool: Spool) -> None:
        """Take in the entries appended since the last look (from their footers)."""
        latest = spool.latest
        first = spool.earliest if self.seen is None else max(self.seen + 1, spool.earliest)
        if self.seen is None:
            self.stable_end = spool.earliest - 1
        for offset in range(first, latest + 1):
            status = _status(spool.directory, offset)
            if status == STABLE:
                self.stable_end = offset
            elif status == TENTATIVE:
                if self.open_from is None:
                    self.open_from = offset
            elif status == UNDO:
                self.open_from = None
                self.undos += 1
        self.seen = max(latest, self.seen if self.seen is not None else -1)


def _status(directory: Path, offset: int) -> str | None:
    try:
        return entry_mark(fmt.file_metadata(fmt.offset_path(directory, offset)))[0]
    except (OSError, ValueError, pa.ArrowException):
        return None  # trimmed meanwhile: read as nothing


def start_copy(spool: Spool, dest: Path, after: int) -> None:
    """An empty spool directory in ``dest`` whose next entry is ``after + 1``."""
    fmt.copy_spool(spool.directory, dest, after, after, [], {}, fsync=False)


def feed_copy(spool: Spool, dest: Path, after: int, *, first: bool) -> tuple[int, bool]:
    """Write ``spool``'s entries after ``after`` into the copy ``dest`` (see the module
    notes); returns the last offset written and whether an undo came (on the ``first`` fill
    an undo only means that what it took back is left out). Stops before an undo when not
    ``first``."""
    latest = spool.latest
    offsets = range(after + 1, latest + 1)
    statuses = {o: _status(spool.directory, o) for o in offsets}
    last_undo = max((o for o, s in statuses.items() if s == UNDO), default=-1)
    written = after
    for offset in offsets:
        status = statuses[offset]
        if status == UNDO and not first:
            return written, True
        keep = status == STABLE or (status == TENTATIVE and offset > last_undo)
        table = None
        if keep:
            with contextlib.suppress(OSError, pa.ArrowException):
                table = fmt.read_file(fmt.offset_path(spool.directory, offset))
        if table is None:
            table = spool.schema.empty_table()
        meta = {
            fmt.META_ROWS: str(table.num_rows).encode(),
            fmt.META_APPEND_NS: str(time.time_ns()).encode(),
        }
        data = fmt.file_bytes(table.replace_schema_metadata(meta))
        fmt.atomic_write(fmt.offset_path(dest, offset), data, fsync=False)
        written = offset
    return written, False
