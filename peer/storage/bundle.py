"""A directory as one blob and back: how a fragment's Spark checkpoint travels to the replicas
of its streams (peer.replication.fragment_failover).

``bundle`` packs every regular file under a directory into a zip archive (deflated, names
relative, sorted). ``unbundle`` checks an archive before it writes anything (names relative,
without ``..``, each once, no links or special files, stored or deflated and not encrypted,
within the size limits) and then replaces the target directory with its contents through a
temporary sibling and a rename, so a crash leaves the old directory or the new one, never
half of each. An archive from another peer is untrusted input: anything wrong is a
``ValueError`` that names it.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

__all__ = ["MAX_BUNDLE_BYTES", "MAX_BUNDLE_FILES", "bundle", "listing", "member", "unbundle"]

MAX_BUNDLE_FILES = 20_000
MAX_BUNDLE_BYTES = 512 * 1024 * 1024  # unpacked


def listing(directory: Path) -> list[Path]:
    """The regular files under ``directory`` (none if it does not exist), sorted; no links."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def bundle(directory: Path, files: list[Path] | None = None) -> bytes:
    """The regular files under ``directory`` as a zip archive: those of ``listing`` now, or
    ``files`` (a listing taken earlier: of a directory whose files are written once, as
    Spark's checkpoints are, that is the directory as it was then, less any file deleted
    since)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path in listing(directory) if files is None else files:
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # removed meanwhile (Spark drops old versions)
                continue
            info = zipfile.ZipInfo(path.relative_to(directory).as_posix())
            info.external_attr = (stat.S_IFREG | 0o644) << 16  # a regular file
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data, compresslevel=1)
    return out.getvalue()


def _checked_names(archive: zipfile.ZipFile) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    infos = archive.infolist()
    if len(infos) > MAX_BUNDLE_FILES:
        raise ValueError(f"checkpoint bundle holds {len(infos)} files; at most {MAX_BUNDLE_FILES}")
    total = 0
    checked = []
    files: set[PurePosixPath] = set()
    parents: set[PurePosixPath] = set()
    for info in infos:
        name = PurePosixPath(info.filename)
        mode = info.external_attr >> 16
        if info.filename.endswith("/") or (mode and not stat.S_ISREG(mode)):
            raise ValueError(f"checkpoint bundle entry {info.filename!r} is not a regular file")
        # zipfile cuts a name at a NUL (filename); orig_filename is the name as stored
        if (
            not info.filename
            or "\\" in info.filename
            or "\x00" in info.orig_filename
            or name.is_absolute()
            or any(part in ("", ".", "..") for part in info.filename.split("/"))
        ):
            raise ValueError(f"checkpoint bundle names a file outside it: {info.orig_filename!r}")
        if name in files or name in parents or not files.isdisjoint(name.parents):
            raise ValueError(
                f"checkpoint bundle names {info.filename!r} twice, or as a file and a directory"
            )
        if info.flag_bits & 0x1:
            raise ValueError(f"checkpoint bundle entry {info.filename!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ValueError(
                f"checkpoint bundle entry {info.filename!r} is compressed with method "
                f"{info.compress_type}; only stored or deflated"
            )
        files.add(name)
        parents.update(name.parents)
        total += info.file_size
        if total > MAX_BUNDLE_BYTES:
            raise ValueError(f"checkpoint bundle unpacks to more than {MAX_BUNDLE_BYTES} bytes")
        checked.append((info, name))
    return checked


def member(data: bytes, name: str, *, limit: int = 1 << 20) -> bytes | None:
    """The file ``name`` (a relative path, as ``bundle`` wrote it) of the archive ``data``,
    None if it holds none; ValueError if the archive is damaged or the file is over
    ``limit`` bytes."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            try:
                info = archive.getinfo(name)
            except KeyError:
                return None
            if info.file_size > limit:
                raise ValueError(f"checkpoint bundle: {name} is {info.file_size} bytes")
            return archive.read(info)
    except (zipfile.BadZipFile, EOFError, NotImplementedError, zlib.error) as exc:
        raise ValueError(f"checkpoint bundle is damaged: {exc}") from None


def unbundle(data: bytes, directory: Path) -> None:
    """Replace ``directory`` with the files of the archive ``data`` (see the module notes)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, NotImplementedError) as exc:
        raise ValueError(f"checkpoint bundle is not a zip archive: {exc}") from None
    with archive:
        entries = _checked_names(archive)
        staging = directory.with_name(directory.name + ".incoming")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for info, name in entries:
                target = staging.joinpath(*name.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                    sink.flush()
                    os.fsync(sink.fileno())
        except (zipfile.BadZipFile, EOFError, NotImplementedError, ValueError, zlib.error) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ValueError(f"checkpoint bundle is damaged: {exc}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
