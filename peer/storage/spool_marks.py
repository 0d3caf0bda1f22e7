"""The marks of tentative results on spool files (issue 16; see :mod:`peer.model.tentative`).

A tentative batch's file carries ``fedstream.status = tentative`` in its schema metadata; an
undo entry is a file without rows whose metadata names the first tentative offset it takes
back (``fedstream.undo``). A file without either is stable, so every spool written before
tentative results existed reads as it did. Imported by the Spark source's workers: pure.
"""

from __future__ import annotations

from peer.model.tentative import STABLE, TENTATIVE, UNDO

META_STATUS = b"fedstream.status"
META_UNDO = b"fedstream.undo"
# A heartbeat file (only in a tentative fork's copy of a missing input: peer.engine.tentative).
META_HEARTBEAT = b"fedstream.heartbeat"


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
