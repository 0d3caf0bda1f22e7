"""The peer's ledger of moved load: one JSON line per move, out of or into this peer.

Theory of operation
-------------------
DESIGN.md section 7: each peer keeps a ledger of the load units moved, at what price and
when, per contract, so that participants can settle what they owe each other. Entries are
appended to ``DATA_DIR/ledger.jsonl`` and fsynced before ``append`` returns, so a move the
ledger reports survives a crash. A crash in the middle of a write leaves at most a torn last
line, which ``load`` skips (with a warning) along with any line that is not an entry: the
ledger is the peer's own record, but it is never worth refusing to start over.

An entry is a flat map: ``t`` (unix time of the move), ``direction`` (``out`` or ``in``),
``fragment``, ``partner`` (participant), ``peer`` (the other peer's node id in hex, or None),
``contract``, ``load`` (cores), ``price`` (per core), ``pause_s`` (moves out: how long the
fragment did not run), ``bytes`` and ``precopy_bytes`` (moves out: what was sent while it was
stopped, and before, while it still ran), ``pause_steps`` (moves out: the pause step by step,
peer.move.sender), ``ok`` and, for a failed move, ``error``.

How long the partner has been running a fragment is not stored: :func:`with_durations`
derives it from the entries, up to the next move of the same fragment in the other direction
(it came back) or up to now.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import NotRequired, TypedDict, cast

__all__ = ["DIRECTIONS", "Ledger", "LedgerEntry", "with_durations"]

log = logging.getLogger(__name__)

DIRECTIONS = ("out", "in")
KEEP = 1000  # entries held in memory (the file keeps them all)
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "t": (int, float),
    "direction": str,
    "fragment": str,
    "ok": bool,
}


class LedgerEntry(TypedDict):
    """One line of the ledger (the module's docstring says what each key means).

    Only the first four keys are checked when the file is read; the others are as the brain
    wrote them. ``duration_s`` is never written: :func:`with_durations` adds it."""

    t: float
    direction: str  # one of DIRECTIONS
    fragment: str
    ok: bool
    partner: NotRequired[str]
    peer: NotRequired[str | None]
    contract: NotRequired[str]
    load: NotRequired[float]
    price: NotRequired[float]
    pause_s: NotRequired[float | None]
    bytes: NotRequired[int | None]  # sent during the pause
    precopy_bytes: NotRequired[int | None]  # sent before it, while the fragment ran
    pause_steps: NotRequired[dict[str, float]]  # stop_s, detach_s, export_s, send_s, install_s
    error: NotRequired[str]
    reason: NotRequired[str]  # why a fragment went to a peer of its own participant
    duration_s: NotRequired[float | None]


class Ledger:
    """Append-only JSON-lines file; the last ``keep`` entries are held in memory."""

    def __init__(self, path: Path, *, keep: int = KEEP) -> None:
        self.path = path
        self._entries: deque[LedgerEntry] = deque(maxlen=keep)
        self._lock = threading.Lock()  # appends come from worker threads

    def load(self) -> None:
        """Read the file (missing: an empty ledger). Blocking: call it off the event loop."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("ledger %s unreadable, starting an empty one in memory: %s", self.path, exc)
            return
        kept: list[LedgerEntry] = []
        for number, line in enumerate(lines, 1):
            entry = _parse(line)
            if entry is None:
                if line.strip():
                    log.warning("ledger %s: line %d is not an entry; skipped", self.path, number)
                continue
            kept.append(entry)
        with self._lock:
            self._entries.extend(kept)

    def append(self, entry: LedgerEntry) -> None:
        """Write one entry and fsync it. Blocking: call it off the event loop."""
        line = json.dumps(entry, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self._entries.append(entry.copy())

    def entries(self) -> list[LedgerEntry]:
        with self._lock:
            return [e.copy() for e in self._entries]


def _parse(line: str) -> LedgerEntry | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    for key, kind in _REQUIRED.items():
        if not isinstance(entry.get(key), kind):
            return None
    if isinstance(entry["t"], bool) or not math.isfinite(entry["t"]):
        return None
    if entry["direction"] not in DIRECTIONS:
        return None
    return cast(LedgerEntry, entry)


def with_durations(entries: Sequence[LedgerEntry], now: float) -> list[LedgerEntry]:
    """Each entry with ``duration_s``: for a successful move, how long the fragment has been
    where it went (until it moved back the other way, or until ``now``); None for a failure."""
    out: list[LedgerEntry] = []
    # Walking back from the newest entry: (fragment, direction) -> time of the next such move.
    next_move: dict[tuple[str, str], float] = {}
    for entry in reversed(entries):
        duration = None
        if entry.get("ok"):
            fragment, direction = entry["fragment"], entry["direction"]
            back = "in" if direction == "out" else "out"
            end = next_move.get((fragment, back), now)
            duration = round(max(0.0, end - float(entry["t"])), 3)
            next_move[(fragment, direction)] = float(entry["t"])
        shown = entry.copy()
        shown["duration_s"] = duration
        out.append(shown)
    out.reverse()
    return out
