"""Where a peer's Spark checkpoints and state live: its data directory, or ``--checkpoint-dir``.

By default a peer keeps them in ``DATA_DIR/checkpoints``. On a cluster the executors write
state too, so they must live on storage every host mounts at the same path (NFS and the
like): ``--checkpoint-dir /shared/dir`` or ``file:///shared/dir``. Several peers may share
one such directory, so each takes a directory of its own beneath it, named once
(``HOST-XXXXXXXX``) and recorded in ``DATA_DIR/checkpoint-home.json``: a peer restarted on
the same data directory finds its checkpoints again, also when started without the option,
and a restart with a different ``--checkpoint-dir`` is refused (its fragments' state is in
the first). Moves, replicated fragments and tentative forks copy checkpoints with the local
file system, which works unchanged on such a mount. ``hdfs://`` and other Hadoop file
systems are refused for now, for that reason (docs/operations.md).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["RECORD", "CheckpointDirError", "CheckpointHome", "parse_checkpoint_uri", "resolve"]

RECORD = "checkpoint-home.json"


class CheckpointDirError(ValueError):
    """A ``--checkpoint-dir`` this peer cannot use, with what to do instead."""


def parse_checkpoint_uri(text: str) -> Path:
    """The local path of ``text`` (a plain path or ``file://``), or CheckpointDirError."""
    parts = urlsplit(text)
    if parts.scheme in ("", "file") and not (parts.scheme == "" and "://" in text):
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise CheckpointDirError(
                    f"--checkpoint-dir {text}: a file:// URI names a path on this host "
                    "(file:///shared/dir), not a host"
                )
            path = Path(unquote(parts.path))
        else:
            path = Path(text)
        if not str(path).strip():
            raise CheckpointDirError("--checkpoint-dir: give a directory")
        return path.absolute()
    raise CheckpointDirError(
        f"--checkpoint-dir {text}: {parts.scheme}:// is not supported yet: moves, replicated "
        "fragments and tentative forks copy checkpoints through the local file system. "
        "Mount the storage on every host at the same path (NFS; HDFS through its NFS "
        "gateway) and give that path (docs/operations.md, 'Running a peer on a Spark "
        "cluster')"
    )


@dataclass(frozen=True)
class CheckpointHome:
    """The directory a peer's checkpoints go in, and the base it shares with other peers."""

    root: Path
    base: Path | None  # None: the data directory's own


def resolve(data_dir: Path, uri: str | None) -> CheckpointHome:
    """This peer's checkpoint directory for ``--checkpoint-dir uri`` (None: not given),
    made and recorded on first use; CheckpointDirError when it cannot be used."""
    record = data_dir / RECORD
    known = _read(record)
    if uri is None:
        if known is None:
            return CheckpointHome(data_dir / "checkpoints", None)
        base, name = known
        return CheckpointHome(base / name / "checkpoints", base)
    base = parse_checkpoint_uri(uri)
    if known is not None and known[0] != base:
        raise CheckpointDirError(
            f"--checkpoint-dir {uri}: this peer's checkpoints are in {known[0]} (recorded "
            f"in {record}): start it with --checkpoint-dir {known[0]}"
        )
    if known is None and any((data_dir / "checkpoints").glob("*")):
        raise CheckpointDirError(
            f"--checkpoint-dir {uri}: this peer has checkpoints in {data_dir / 'checkpoints'} "
            "already; start it without --checkpoint-dir, or on a new data directory"
        )
    name = known[1] if known is not None else f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    root = base / name / "checkpoints"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointDirError(
            f"--checkpoint-dir {uri}: cannot make {root} ({exc.strerror}): is the shared "
            "directory mounted and writable?"
        ) from exc
    if known is None:
        data_dir.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(".tmp")
        partial.write_text(json.dumps({"base": str(base), "name": name}))
        os.replace(partial, record)
    return CheckpointHome(root, base)


def _read(record: Path) -> tuple[Path, str] | None:
    try:
        data = json.loads(record.read_text())
        return Path(data["base"]), str(data["name"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointDirError(f"{record} cannot be read ({exc}): fix or remove it") from exc
