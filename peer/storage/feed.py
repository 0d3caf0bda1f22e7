"""What a subscriber reads of a spool, as wire items (``peer.site.LocalSite.subscribe_here``).

A stable batch is ``{"offset", "columns"}``, as ever. Tentative results (issue 16,
``peer.model.tentative``) carry ``"status": "tentative"``, and an undo entry is
``{"offset", "columns": {}, "undo": FIRST}``: it takes back every tentative tuple from offset
FIRST on. A reader that is not tentative gets the stable batches only; the server filters
the same way by the subscription's ``tentative`` flag, so a relay may pass everything on.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from peer.errors import NotFound
from peer.model.tentative import TENTATIVE, UNDO, visible_to
from peer.model.tuples import batch_to_wire
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.storage.spool_format import entry_mark


def open_tentative(spool: Spool) -> int | None:
    """The first tentative offset of ``spool`` since its last undo (what an undo appended
    now must name), None if there is none: read from file footers, newest first."""
    first = None
    for offset in range(spool.latest, spool.earliest - 1, -1):
        try:
            status, _undo = entry_mark(fmt.file_metadata(fmt.offset_path(spool.directory, offset)))
        except (OSError, ValueError, pa.ArrowException):
            break  # trimmed meanwhile: nothing older is kept
        if status == UNDO:
            break
        if status == TENTATIVE:
            first = offset
    return first


def wire_entries(spool: Spool, start: int, end: int, tentative: bool) -> list[dict[str, Any]]:
    """The entries ``start < o <= end`` a (``tentative``) subscriber sees, as wire items
    (TrimmedError rather than a silent gap)."""
    items: list[dict[str, Any]] = []
    for offset, status, undo, table in spool.read_entries(start, end):
        if not visible_to(status, tentative):
            continue
        if status == UNDO:
            items.append({"offset": offset, "columns": {}, "undo": undo})
        elif status == TENTATIVE:
            items.append({"offset": offset, **batch_to_wire(table), "status": TENTATIVE})
        else:
            items.append({"offset": offset, **batch_to_wire(table)})
    return items


def after_offset(start: str) -> int | None:
    if not start.startswith("after:"):
        return None
    try:
        value = int(start[6:])
    except ValueError:
        return None
    return value if value >= -1 else None


def trimmed_gap(stream: str, first_missing: int, earliest: int) -> NotFound:
    """The error of a subscriber whose next batch (``first_missing``) was trimmed."""
    return NotFound(
        f"stream {stream}: offsets {first_missing}..{earliest - 1} were trimmed before this "
        f"subscriber read them (first missing offset {first_missing}; the earliest kept is "
        f"{earliest}); subscribe again to go on from there",
        stream=stream,
        first_missing=first_missing,
        earliest=earliest,
    )
