"""Tentative results and their correction in a stream's log (Borealis' DPC), as pure logic.

Theory of operation
-------------------
A query with an availability bound that misses an input for longer than the bound goes on
with the inputs it has and writes *tentative* results; once the input is back it takes them
back and writes the stable ones (Delay, Process and Correct). All of it lands in the one log
of each result stream, numbered by the same offsets as ever:

- a **stable** entry is a batch of the failure-free result;
- a **tentative** entry is a batch that may be wrong (computed without a missing input);
- an **undo** entry takes back every tentative entry from offset ``first`` on (``first`` is
  the offset of the first tentative entry since the previous undo): the stable entries
  that follow hold the corrected results.

Stable entries are never taken back, so the stable entries alone, in offset order, are the
failure-free result whatever came in between (the property ``tests/unit/test_tentative.py``
checks for any interleaving). Three kinds of readers follow from that:

- a *stable* reader (a subscriber without ``tentative``, the Spark source of a downstream
  query, a mirror) skips tentative and undo entries: :func:`visible_to` says which it sees;
- a *tentative* reader (``peer subscribe --tentative``) sees every entry and applies undos:
  :class:`TentativeView` is what it holds at any moment;
- the *writer* of a result log (the fragment runner) remembers the first tentative offset it
  wrote and names it in the undo: :class:`UndoMark`.

Nothing here does I/O; the spool stores the marks (``peer.storage``), the server filters by
them, and the engine room decides when a fragment is tentative.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

STABLE = "stable"
TENTATIVE = "tentative"
UNDO = "undo"
STATUSES = (STABLE, TENTATIVE, UNDO)


@dataclass(frozen=True)
class Entry:
    """One entry of a result log as a reader meets it."""

    offset: int
    status: str = STABLE
    rows: tuple[Any, ...] = ()
    undo: int | None = None  # an undo entry: the first tentative offset it takes back

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"entry {self.offset}: unknown status {self.status!r}")
        if (self.status == UNDO) != (self.undo is not None):
            raise ValueError(f"entry {self.offset}: an undo entry, and only one, names an offset")
        if self.undo is not None and not 0 <= self.undo < self.offset:
            raise ValueError(
                f"entry {self.offset}: an undo names an earlier offset, not {self.undo}"
            )


def visible_to(status: str, tentative: bool) -> bool:
    """Whether a reader sees an entry of ``status``: every reader sees stable entries, only
    a tentative reader sees tentative ones and undos."""
    return status == STABLE or tentative


def stable_rows(entries: Iterable[Entry]) -> list[Any]:
    """What a stable reader holds after ``entries``: the rows of the stable entries."""
    return [
        row for e in sorted(entries, key=lambda e: e.offset) if e.status == STABLE for row in e.rows
    ]


@dataclass
class TentativeView:
    """What a tentative reader holds: every stable row, and the tentative rows no undo has
    taken back yet, in offset order. Feed it entries in offset order."""

    entries: list[Entry] = field(default_factory=list)
    undone: int = 0  # tentative rows taken back so far

    def apply(self, entry: Entry) -> None:
        if self.entries and entry.offset <= self.entries[-1].offset:
            raise ValueError(f"entry {entry.offset} after {self.entries[-1].offset}: out of order")
        if entry.status == UNDO:
            assert entry.undo is not None
            kept: list[Entry] = []
            for e in self.entries:
                if e.status == TENTATIVE and e.offset >= entry.undo:
                    self.undone += len(e.rows)
                else:
                    kept.append(e)
            self.entries = kept
            return
        self.entries.append(entry)

    def rows(self) -> list[Any]:
        return [row for e in self.entries for row in e.rows]

    def tentative_rows(self) -> list[Any]:
        return [row for e in self.entries if e.status == TENTATIVE for row in e.rows]


@dataclass
class UndoMark:
    """The writer's memory of a result log: the first tentative offset not yet taken back."""

    first: int | None = None

    def wrote(self, offset: int, status: str) -> None:
        if status == TENTATIVE and self.first is None:
            self.first = offset

    def take(self) -> int | None:
        """The offset an undo must name now (None: nothing tentative to take back)."""
        first, self.first = self.first, None
        return first

    @classmethod
    def recovered(cls, entries: Sequence[tuple[int, str, int | None]]) -> UndoMark:
        """The mark after a restart, from the log's (offset, status, undo) in offset order."""
        mark = cls()
        for offset, status, _undo in entries:
            if status == UNDO:
                mark.first = None
            else:
                mark.wrote(offset, status)
        return mark
