"""The durable record of moves, so that a crash at any step leaves exactly one running copy.

A move is a two-phase commit whose decision is taken by the receiver Q, once:

- the sender P writes an :class:`Intent` before it stops the fragment (phase ``stopping``)
  and rewrites it before it sends ``move_install`` (phase ``installing``). Before that
  request is sent Q cannot install, so a sender that fails or restarts in phase ``stopping``
  undoes the move and runs the fragment again itself. In phase ``installing`` P is *in
  doubt*: it keeps the fragment stopped and asks Q (``move_resolve``) until Q answers;
- Q writes an :class:`Outcome` for each move it hears of: ``installed`` after it has landed
  the fragment (before it runs it), or ``aborted`` when asked to resolve a move it has not
  installed. An outcome is final: an install after an abort is refused, and a resolve after
  an install answers ``installed``. P then commits (lets go, sends Q its inputs) or undoes.

Each move of a fragment carries an epoch one above the epoch at which it last arrived at its
sender (``Outcome.epoch`` of an install); Q refuses a move whose epoch is not above the epoch
at which the fragment last arrived at Q, and any request of a move it has decided on, so a
stale or replayed move cannot bring back a copy.

Records are small JSON files under ``DATA_DIR/move-journal``, written to a temporary name,
fsynced and renamed (:func:`~peer.storage.spool_format.atomic_write`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from peer.storage.spool_format import atomic_write, fsync_dir

log = logging.getLogger(__name__)

JOURNAL_DIR = "move-journal"
MOVE_ID = re.compile(r"[0-9a-f]{32}")

Phase = Literal["stopping", "installing"]
Decision = Literal["installed", "aborted"]


@dataclass
class Intent:
    """The sender's record of a move under way (what undoing or committing it needs)."""

    id: str
    fragment: str
    target: str  # node id, hex
    incarnation: str
    epoch: int
    phase: Phase = "stopping"
    replica_inputs: list[str] = field(default_factory=list)
    hosted_inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    readers: dict[str, list[str]] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # inputs hosted here, hosted here after
    # replica inputs whose host stopped mirroring here: stream -> [host hex, last acked]
    detached: dict[str, tuple[str, int]] = field(default_factory=dict)
    lane: bool = False  # a member of the shared lane (held in the lane, not stopped)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Intent:
        return cls(
            id=str(raw["id"]),
            fragment=str(raw["fragment"]),
            target=str(raw["target"]),
            incarnation=str(raw["incarnation"]),
            epoch=int(raw["epoch"]),
            phase="installing" if raw.get("phase") == "installing" else "stopping",
            replica_inputs=[str(s) for s in raw.get("replica_inputs", [])],
            hosted_inputs=[str(s) for s in raw.get("hosted_inputs", [])],
            outputs=[str(s) for s in raw.get("outputs", [])],
            readers={str(k): [str(r) for r in v] for k, v in raw.get("readers", {}).items()},
            kept=[str(s) for s in raw.get("kept", [])],
            detached={str(k): (str(v[0]), int(v[1])) for k, v in raw.get("detached", {}).items()},
            lane=raw.get("lane") is True,
        )


@dataclass(frozen=True)
class Outcome:
    """The receiver's final word on one move."""

    id: str
    fragment: str
    epoch: int
    decision: Decision
    sender: str  # the participant that moved it


class Journal:
    """Intents (sender side), arrivals and outcomes (receiver side) of one peer."""

    def __init__(self, data_dir: Path, *, fsync: bool = True) -> None:
        self.directory = data_dir / JOURNAL_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync

    def _write(self, name: str, record: dict[str, Any]) -> None:
        atomic_write(self.directory / name, json.dumps(record).encode(), fsync=self.fsync)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()
            if self.fsync:
                fsync_dir(self.directory)

    def _read(self, prefix: str) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.directory.glob(f"{prefix}-*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:  # a torn record cannot exist (atomic writes)
                log.error("unreadable move record %s: %s", path.name, exc)
        return out

    # the sender's intents
    def write_intent(self, intent: Intent) -> None:
        self._write(f"out-{intent.id}.json", asdict(intent))

    def drop_intent(self, move_id: str) -> None:
        self._remove(f"out-{move_id}.json")

    def intents(self) -> list[Intent]:
        out = []
        for raw in self._read("out"):
            try:
                out.append(Intent.from_dict(raw))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                log.error("malformed move intent %r: %s", raw, exc)
        return out

    def fragments_in_doubt(self) -> set[str]:
        """Fragments a move of which is unfinished here: not to be resumed before it is."""
        return {intent.fragment for intent in self.intents()}

    # the receiver's arrivals (landing under way) and outcomes
    def write_arrival(self, move_id: str, manifest: dict[str, Any]) -> None:
        self._write(f"in-{move_id}.json", manifest)

    def drop_arrival(self, move_id: str) -> None:
        self._remove(f"in-{move_id}.json")

    def arrivals(self) -> list[dict[str, Any]]:
        return [m for m in self._read("in") if isinstance(m, dict) and "id" in m]

    def decide(self, outcome: Outcome) -> None:
        self._write(f"done-{outcome.id}.json", asdict(outcome))

    def outcome(self, move_id: str) -> Outcome | None:
        if not MOVE_ID.fullmatch(move_id):
            return None
        try:
            raw = json.loads((self.directory / f"done-{move_id}.json").read_text())
        except FileNotFoundError:
            return None
        return Outcome(
            str(raw["id"]),
            str(raw["fragment"]),
            int(raw["epoch"]),
            "installed" if raw["decision"] == "installed" else "aborted",
            str(raw.get("sender", "")),
        )

    def last_epoch(self, fragment: str) -> int:
        """The epoch at which ``fragment`` last arrived here (0: it never did). A move
        aborted here does not count: its sender tries again with the same epoch."""
        done = [r for r in self._read("done") if r.get("decision") == "installed"]
        epochs = [int(raw.get("epoch", 0)) for raw in done if raw.get("fragment") == fragment]
        return max(epochs, default=0)
