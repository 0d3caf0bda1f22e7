"""What a move carries: the manifest, the tar of checkpoint and spools, and their checks.

The sender exports a fragment into a staging directory and packs it as one tar
(:func:`export_fragment`); the receiver checks every field of a manifest and of the install
request from another peer before it touches anything (:func:`check_manifest`,
:func:`check_install`), and unpacks with tarfile's ``data`` filter (no absolute paths, no links
out, no devices).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from peer.errors import InvalidInput
from peer.federation.mirror import MIRROR_PREFIX, ORIGIN_FILE
from peer.model.query import parse_query
from peer.model.schema import parse_schema
from peer.site import LocalSite
from peer.storage.catalog import QueryEntry
from peer.storage.spool_format import write_reader_offset

if TYPE_CHECKING:
    from peer.engine.lane import MemberCut

_READER = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
CHUNK_BYTES = 4 * 1024 * 1024
# a manifest's contract between peers of one participant: they need none (peer.elastic.balance)
SIBLING = ""
MAX_MOVE_BYTES = 8 * 1024**3
MAX_MOVE_FILES = 100_000
LANE_FILE = "lane.msgpack"  # a lane member's windows, in place of a checkpoint


@dataclass
class Incoming:
    """A move under way into this peer: its manifest, sender and the tar received so far."""

    manifest: dict[str, Any]
    sender: str
    path: Path
    size: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    touched: float = field(default_factory=time.monotonic)
    pre_size: int = 0  # the pre-copy's tar, sent while the fragment still ran (pre.tar)
    pre_digest: Any = field(default_factory=hashlib.sha256)
    pre_unpacked: bool = False  # checked and unpacked on ``move_precopied``: no more pre chunks

    @property
    def pre_path(self) -> Path:
        return self.path.parent / "pre.tar"


@dataclass(frozen=True)
class Packed:
    """A tar written for a move: its size and SHA-256 (what the target checks)."""

    size: int
    sha256: str


@dataclass(frozen=True)
class Sealed:
    """The final tar, and the reader offsets of the inputs the target holds already (stream
    -> reader -> offset): what ``move_install`` says besides the pre-copy."""

    tar: Packed
    offsets: dict[str, dict[str, int]]

    def install(self) -> dict[str, Any]:
        """The fields ``move_install`` carries for it (``check_install`` reads them)."""
        return {"size": self.tar.size, "sha256": self.tar.sha256, "offsets": self.offsets}


@dataclass(frozen=True)
class PreCopy:
    """The pre-copy's tar, and for each stream the offset through which its files are in it."""

    tar: Packed
    present: dict[str, int]


def export_precopy(
    site: LocalSite,
    stage: Path,
    manifest: dict[str, Any],
    readers: dict[str, list[str]],
) -> PreCopy:
    """The pre-copy (issue 28), taken while the fragment runs: the batch files of each input
    that travels that the fragment has yet to read, and of each result spool, as they are
    now, in the directories of the final tar; written as ``stage/pre.tar``. Returns its size
    and hash, and for each stream the offset through which its files are in it (the final
    export leaves those out: :func:`export_fragment`'s ``present``)."""
    spools = site.spools
    tree = stage / "tree"
    tree.mkdir(parents=True)
    present: dict[str, int] = {}
    for stream, info in manifest["inputs"].items():
        if info["mode"] != "copy":
            continue
        spool = spools.get(stream)
        floor = min((spool.committed(r) for r in readers.get(stream, [])), default=spool.latest)
        present[stream], _ = spool.export_files(tree / info["dir"], after=floor)
    for stream, info in manifest["outputs"].items():
        present[stream], _ = spools.get(stream).export_files(tree / info["dir"], after=-1)
    return PreCopy(_pack(tree, stage / "pre.tar"), present)


def _pack(tree: Path, tar_path: Path) -> Packed:
    with tarfile.open(tar_path, "w") as tar:
        tar.add(tree, arcname="tree")
    digest = hashlib.sha256()
    with tar_path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    shutil.rmtree(tree)
    return Packed(tar_path.stat().st_size, digest.hexdigest())


def export_fragment(
    site: LocalSite,
    stage: Path,
    manifest: dict[str, Any],
    entry: QueryEntry,
    readers: dict[str, list[str]],
    hosted_inputs: list[str],
    own_origin: dict[str, str],
    target: bytes,
    present: dict[str, int] | None = None,
    cut: MemberCut | None = None,
) -> Sealed:
    """Write the tar, ``stage/move.tar``. A stream's batch files through
    ``present[stream]`` are left out: the pre-copy carried them. A member of the shared lane
    (``cut``: where the lane held it) carries its windows instead of a checkpoint, and its
    position as the lane reader's offset in each input."""
    present = present or {}
    spools = site.spools
    assert site.engine is not None
    tree = stage / "tree"
    name = manifest["fragment"]
    if cut is None:
        shutil.copytree(site.engine.checkpoint_dir(name, entry.incarnation), tree / "checkpoint")
    else:
        tree.mkdir(parents=True, exist_ok=True)
        (tree / LANE_FILE).write_bytes(msgpack.packb({"window": cut.window}, use_bin_type=True))
    offsets: dict[str, dict[str, int]] = {}
    for stream, info in manifest["inputs"].items():
        spool = spools.get(stream)
        ids = readers.get(stream, [])
        if cut is None:
            committed = {r: spool.committed(r) for r in ids}
        else:  # the lane commits a batch late: the member's own position is the cut's
            committed = {cut.reader: cut.positions[stream]}
        if info["mode"] == "local":
            offsets[stream] = committed
            continue
        floor = min(committed.values(), default=spool.latest)
        seqs = {}
        through = spool.latest
        if stream in hosted_inputs:
            # P mirrors it to Q from L on, under P's origin, once Q runs the fragment
            seqs = {own_origin[stream]: through}
            write_reader_offset(
                spool.directory, MIRROR_PREFIX + target.hex(), through, fsync=spool.fsync
            )
        spool.export(
            tree / info["dir"],
            after=floor,
            through=through,
            readers=ids,
            seqs=seqs,
            present=present.get(stream, -1),
        )
        if cut is not None:
            write_reader_offset(tree / info["dir"], cut.reader, committed[cut.reader])
    for stream, info in manifest["outputs"].items():
        spool = spools.get(stream)
        mirror_readers = [r for r in spool.readers() if r.startswith(MIRROR_PREFIX)]
        spool.export(
            tree / info["dir"], after=-1, readers=mirror_readers, present=present.get(stream, -1)
        )
        (tree / info["dir"] / ORIGIN_FILE).write_text(own_origin[stream])
    return Sealed(_pack(tree, stage / "move.tar"), offsets)


def append_chunk(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def extract(tar_path: Path, where: Path) -> None:
    """Unpack a move's tar, counted as it is read: a plain tar (the sender never compresses
    it, so a gzip bomb is not even opened) whose members declare no more bytes in all than
    the tar holds (sparse members cannot inflate either) and no more than MAX_MOVE_FILES
    members; each header is checked before its data is written. InvalidInput names the
    bound."""
    limit = tar_path.stat().st_size
    with tar_path.open("rb") as f:
        head = f.read(6)
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")):
        raise InvalidInput("move tar is compressed; a move carries a plain tar only")
    total = count = 0
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for member in tar:
                count += 1
                total += max(0, member.size)
                if count > MAX_MOVE_FILES:
                    raise InvalidInput(f"move tar holds more than {MAX_MOVE_FILES} members")
                if total > limit:
                    raise InvalidInput(
                        f"move tar unpacks to more than its own {limit} bytes (a move's tar is "
                        "uncompressed: its contents are bounded by its size)"
                    )
                tar.extract(member, where, filter="data")  # no absolute paths, links out
    except tarfile.FilterError as exc:  # a path out of the directory, a link out, a device
        raise InvalidInput(f"move tar member refused: {exc}") from None
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidInput(f"move tar is not a plain (uncompressed) tar archive: {exc}") from None


def check_manifest(manifest: Any) -> dict[str, Any]:
    """The manifest, type-checked; InvalidInput names the first thing wrong."""
    if not isinstance(manifest, dict):
        raise InvalidInput("move_begin: manifest must be a map")

    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidInput(f"move_begin: manifest field {key!r} is missing or mistyped")
        return value

    for key in ("id", "fragment", "incarnation", "contract", "from_node"):
        need(key, str)
    if not all(c in "0123456789abcdef" for c in manifest["id"]) or len(manifest["id"]) != 32:
        raise InvalidInput("move_begin: id must be 32 hex digits")
    epoch = need("epoch", int)
    if not 1 <= epoch < 2**62:
        raise InvalidInput("move_begin: epoch must be a positive integer")
    for key in ("load", "price"):
        value = need(key, (int, float))
        if not (value >= 0 and value < float("inf")):
            raise InvalidInput(f"move_begin: {key} must be finite and >= 0")
    need("definition", dict)
    parsed = parse_query(manifest["definition"])
    if parsed.name != manifest["fragment"]:
        raise InvalidInput("move_begin: the definition is not the fragment's")
    types = need("box_types", list)
    if sorted({b.type for b in parsed.boxes}) != types:
        raise InvalidInput("move_begin: box_types do not match the definition")
    if not isinstance(manifest.get("lane", False), bool):
        raise InvalidInput("move_begin: manifest field 'lane' must be true or false")
    for key in ("inputs", "outputs"):
        streams = need(key, dict)
        for stream, info in streams.items():
            if not isinstance(stream, str) or not isinstance(info, dict):
                raise InvalidInput(f"move_begin: {key} must map stream names to maps")
            directory = info.get("dir")
            if not isinstance(directory, str) or not directory.isalnum():
                raise InvalidInput(f"move_begin: {key}.{stream}.dir must be a plain name")
            parse_schema(info.get("schema") or {})
            if key == "inputs" and not isinstance(info.get("source"), str):
                raise InvalidInput(f"move_begin: inputs.{stream}.source must be a node id")
            if key == "inputs" and info.get("mode") not in ("copy", "local"):
                raise InvalidInput(f"move_begin: inputs.{stream}.mode must be copy or local")
    return manifest


def check_pre(pre: Any, incoming: Incoming, op: str) -> None:
    """The pre-copy's size and hash, as ``op`` announces them, are what arrived."""
    size, digest = (pre.get("size"), pre.get("sha256")) if isinstance(pre, dict) else (0, 0)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise InvalidInput(f"{op}: the pre-copy's size must be a positive byte count")
    if not isinstance(digest, str):
        raise InvalidInput(f"{op}: the pre-copy's sha256 must be a hex string")
    if size != incoming.pre_size or digest != incoming.pre_digest.hexdigest():
        raise InvalidInput(f"{op}: the pre-copy does not match the announced hash")


def check_install(frame: dict[str, Any], incoming: Incoming) -> dict[str, Any]:
    """size, sha256, reader offsets and held offsets of a ``move_install``; InvalidInput if
    mistyped."""
    size, digest, offsets = frame.get("size"), frame.get("sha256"), frame.get("offsets")
    holds = frame.get("holds")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_MOVE_BYTES:
        raise InvalidInput("move_install: size must be a positive byte count")
    if not isinstance(digest, str):
        raise InvalidInput("move_install: sha256 must be a hex string")
    if not isinstance(offsets, dict):
        raise InvalidInput("move_install: offsets must be a map")
    local = {s for s, i in incoming.manifest["inputs"].items() if i["mode"] == "local"}
    if set(offsets) != local:
        raise InvalidInput("move_install: offsets must name exactly the inputs held here")
    if (
        not isinstance(holds, dict)
        or set(holds) != local
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in holds.values())
    ):
        raise InvalidInput("move_install: holds must map each input held here to an offset")
    pre = frame.get("pre")
    if pre is not None:
        check_pre(pre, incoming, "move_install")
    for stream, readers in offsets.items():
        if not isinstance(readers, dict) or not all(
            isinstance(r, str)
            and _READER.fullmatch(r)
            and isinstance(o, int)
            and not isinstance(o, bool)
            and o >= -1
            for r, o in readers.items()
        ):
            raise InvalidInput(f"move_install: offsets.{stream} must map reader ids to offsets")
    return {"size": size, "sha256": digest, "offsets": offsets, "holds": holds, "pre": pre}
