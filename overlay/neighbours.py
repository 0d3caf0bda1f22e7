"""The neighbours a node remembers across restarts: a small JSON file, never pickle."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["load_neighbours", "save_neighbours"]

MAX_NEIGHBOURS = 32


def load_neighbours(path: Path) -> list[tuple[str, int]]:
    """The overlay addresses saved at ``path`` (none if it is missing or unreadable)."""
    try:
        raw = json.loads(path.read_text())
        return [(str(h), int(p)) for h, p in raw.get("neighbours", [])][:MAX_NEIGHBOURS]
    except (OSError, ValueError, TypeError, AttributeError):
        return []


def save_neighbours(path: Path, addresses: Sequence[tuple[str, int]]) -> None:
    """Save ``addresses`` atomically; an empty list keeps the last one rather than forget
    everyone."""
    if not addresses:
        return
    data = json.dumps({"neighbours": [list(a) for a in addresses[:MAX_NEIGHBOURS]]})
    with contextlib.suppress(OSError):
        path.with_suffix(".tmp").write_text(data)
        path.with_suffix(".tmp").replace(path)
