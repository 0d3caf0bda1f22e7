"""A directory as a zip and back (peer.storage.bundle): round trips, and hostile archives that
must be refused with a ValueError before the target directory is touched."""

from __future__ import annotations

import io
import os
import stat
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.storage import bundle as bundle_module
from peer.storage.bundle import bundle, unbundle

REGULAR = (stat.S_IFREG | 0o644) << 16


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by relative name, with its bytes."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir())


def make_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def archive(
    *entries: tuple[str | zipfile.ZipInfo, bytes], compression: int = zipfile.ZIP_STORED
) -> bytes:
    """A zip of ``entries``; a bare name is a regular file, a ZipInfo is taken as given."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # duplicate names, on purpose
        with zipfile.ZipFile(out, "w", compression=compression) as made:
            for entry, data in entries:
                if isinstance(entry, str):
                    entry = zipfile.ZipInfo(entry)
                    entry.external_attr = REGULAR
                    entry.compress_type = compression
                made.writestr(entry, data)
    return out.getvalue()


def renamed(data: bytes, placeholder: bytes, name: bytes) -> bytes:
    """``data`` with a member name rewritten in the local header and the central directory
    (for names zipfile will not write, such as one holding a NUL)."""
    assert len(placeholder) == len(name) and data.count(placeholder) == 2
    return data.replace(placeholder, name)


ORIGINAL = {"keep.txt": b"old contents", "sub/deeper/state.bin": b"\x00\x01\x02"}


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """An existing directory that a refused archive must leave exactly as it is."""
    directory = tmp_path / "checkpoint"
    make_tree(directory, ORIGINAL)
    return directory


def assert_refused(data: bytes, target: Path, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        unbundle(data, target)
    assert snapshot(target) == ORIGINAL
    assert siblings(target) == ["checkpoint"]


# --------------------------------------------------------------------------- round trips


def test_a_nested_directory_round_trips(tmp_path: Path) -> None:
    files = {
        "metadata": b'{"id": "x"}',
        "offsets/0": b"v1\n{}\n",
        "offsets/1": b"",
        "state/0/1/1.delta": os.urandom(70_000),
        "sources/0/0": b"\xff" * 1000,
    }
    source = tmp_path / "source"
    make_tree(source, files)
    (source / "empty-dir").mkdir()
    restored = tmp_path / "restored"
    unbundle(bundle(source), restored)
    assert snapshot(restored) == files
    assert snapshot(source) == files  # bundling does not change the source


def test_a_bundle_names_files_relative_and_sorted(tmp_path: Path) -> None:
    make_tree(tmp_path / "s", {"b": b"2", "a/z": b"1", "a/b": b"0"})
    with zipfile.ZipFile(io.BytesIO(bundle(tmp_path / "s"))) as made:
        assert made.namelist() == ["a/b", "a/z", "b"]


def test_a_missing_directory_bundles_to_an_empty_directory(tmp_path: Path) -> None:
    data = bundle(tmp_path / "absent")
    restored = tmp_path / "restored"
    unbundle(data, restored)
    assert restored.is_dir()
    assert list(restored.iterdir()) == []


def test_an_empty_bundle_empties_an_existing_directory(target: Path, tmp_path: Path) -> None:
    unbundle(bundle(tmp_path / "absent"), target)
    assert target.is_dir()
    assert list(target.iterdir()) == []
    assert siblings(target) == ["checkpoint"]


def test_unbundle_replaces_an_existing_directory_entirely(target: Path, tmp_path: Path) -> None:
    source = tmp_path / "elsewhere" / "source"
    make_tree(source, {"new.txt": b"new", "sub/other": b"x"})
    unbundle(bundle(source), target)
    assert snapshot(target) == {"new.txt": b"new", "sub/other": b"x"}
    assert not (target / "sub" / "deeper").exists()
    assert siblings(target) == ["checkpoint", "elsewhere"]


def test_unbundle_clears_leftovers_of_an_interrupted_one(target: Path, tmp_path: Path) -> None:
    make_tree(tmp_path / "checkpoint.incoming", {"half": b"written"})
    make_tree(tmp_path / "checkpoint.old", {"stale": b"x"})
    unbundle(archive(("f", b"1")), target)
    assert snapshot(target) == {"f": b"1"}
    assert siblings(target) == ["checkpoint"]


def test_unbundle_makes_missing_parents(tmp_path: Path) -> None:
    restored = tmp_path / "a" / "b" / "checkpoint"
    unbundle(archive(("x/y", b"z")), restored)
    assert snapshot(restored) == {"x/y": b"z"}


def test_symlinks_in_the_source_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_tree(outside, {"secret": b"not for replicas", "dir/inner": b"nor this"})
    source = tmp_path / "source"
    make_tree(source, {"real": b"r"})
    (source / "to-file").symlink_to(outside / "secret")
    (source / "to-dir").symlink_to(outside / "dir", target_is_directory=True)
    (source / "dangling").symlink_to(tmp_path / "nowhere")
    with zipfile.ZipFile(io.BytesIO(bundle(source))) as made:
        assert made.namelist() == ["real"]
    restored = tmp_path / "restored"
    unbundle(bundle(source), restored)
    assert snapshot(restored) == {"real": b"r"}
    assert not any(p.is_symlink() for p in restored.rglob("*"))


# --------------------------------------------------------------------------- hostile archives


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_random_bytes_are_not_a_zip(target: Path, data: bytes) -> None:
    with pytest.raises(ValueError, match="checkpoint bundle"):
        unbundle(data, target)
    assert snapshot(target) == ORIGINAL
    assert siblings(target) == ["checkpoint"]


def test_a_truncated_archive_is_not_a_zip(target: Path) -> None:
    assert_refused(archive(("f", b"x" * 100))[:-10], target, "not a zip archive")


@pytest.mark.parametrize(
    "name",
    [
        "../escape",
        "a/../../escape",
        "a/..",
        "..",
        "/etc/passwd",
        "/abs",
        "a\\..\\..\\escape",
        "a\\b",
        "a//b",
        "//host/share",
        "./a",
        "a/./b",
        ".",
    ],
)
def test_a_name_outside_the_directory_is_refused(target: Path, name: str) -> None:
    assert_refused(archive(("fine", b"1"), (name, b"2")), target, "outside it")


def test_an_empty_name_is_refused(target: Path) -> None:
    assert_refused(archive(("", b"2")), target, "outside it")


@pytest.mark.parametrize("name", [b"a\x00b", b"\x00ab", b"ab\x00"])
def test_a_name_with_a_nul_is_refused(target: Path, name: bytes) -> None:
    data = renamed(archive(("fine", b"1"), ("a_b", b"2")), b"a_b", name)
    assert_refused(data, target, r"outside it: .*\\x00")


@pytest.mark.parametrize("attr", [0, (stat.S_IFDIR | 0o755) << 16 | 0x10])
def test_a_directory_entry_is_refused(target: Path, attr: int) -> None:
    entry = zipfile.ZipInfo("sub/")
    entry.external_attr = attr
    assert_refused(archive(("fine", b"1"), (entry, b"")), target, "not a regular file")


def test_a_directory_mode_without_a_slash_is_refused(target: Path) -> None:
    entry = zipfile.ZipInfo("sub")
    entry.external_attr = (stat.S_IFDIR | 0o755) << 16
    assert_refused(archive((entry, b"")), target, "'sub' is not a regular file")


@pytest.mark.parametrize("kind", [stat.S_IFLNK, stat.S_IFIFO, stat.S_IFCHR, stat.S_IFSOCK])
def test_a_link_or_special_file_is_refused(target: Path, kind: int) -> None:
    entry = zipfile.ZipInfo("link")
    entry.external_attr = (kind | 0o777) << 16
    data = archive(("fine", b"1"), (entry, b"../../../etc/passwd"))
    assert_refused(data, target, "'link' is not a regular file")


@pytest.mark.parametrize(
    "names",
    [["a", "a"], ["a", "a/b"], ["a/b", "a"], ["x/a", "x/a/b/c"], ["x/a/b/c", "x/a"]],
)
def test_a_name_twice_or_as_file_and_directory_is_refused(target: Path, names: list[str]) -> None:
    data = archive(*((name, name.encode()) for name in names))
    assert_refused(data, target, "twice")


def test_too_many_files_are_refused(
    target: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_FILES", 3)
    unbundle(archive(*((f"f{i}", b"") for i in range(3))), tmp_path_factory.mktemp("three"))
    data = archive(*((f"f{i}", b"") for i in range(4)))
    assert_refused(data, target, "holds 4 files; at most 3")


def test_too_many_unpacked_bytes_are_refused(
    target: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_BYTES", 10)
    unbundle(archive(("a", b"12345"), ("b", b"12345")), tmp_path_factory.mktemp("ten"))
    data = archive(("a", b"12345"), ("b", b"123456"), compression=zipfile.ZIP_DEFLATED)
    assert_refused(data, target, "more than 10 bytes")


def test_a_member_larger_than_it_declares_unpacks_only_what_it_declares(
    target: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The limit is on declared sizes; a member cannot unpack to more than its declared size
    # (its CRC then fails): a small header on a deflate bomb is still refused.
    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_BYTES", 100)
    data = bytearray(archive(("bomb", b"\x00" * 100_000), compression=zipfile.ZIP_DEFLATED))
    for header in (b"PK\x03\x04", b"PK\x01\x02"):
        at = data.find(header)
        size_at = at + (22 if header == b"PK\x03\x04" else 24)
        data[size_at : size_at + 4] = (50).to_bytes(4, "little")
    assert_refused(bytes(data), target, "damaged")


def test_a_corrupted_member_is_refused(target: Path) -> None:
    payload = b"the state of batch 7"
    data = bytearray(archive(("fine", b"1"), ("state", payload)))
    at = data.find(payload)
    assert at > 0 and data.count(payload) == 1
    data[at + 3] ^= 0xFF
    assert_refused(bytes(data), target, "damaged.*CRC")


def test_corrupted_deflate_data_is_refused(target: Path) -> None:
    data = bytearray(archive(("state", os.urandom(3000)), compression=zipfile.ZIP_DEFLATED))
    start = data.find(b"PK\x03\x04") + 30 + len("state")
    data[start : start + 8] = b"\xff" * 8  # an invalid deflate block header
    assert_refused(bytes(data), target, "damaged")


def test_an_encrypted_member_is_refused(target: Path) -> None:
    data = bytearray(archive(("secret", b"x")))
    data[data.find(b"PK\x03\x04") + 6] |= 0x1
    data[data.find(b"PK\x01\x02") + 8] |= 0x1
    assert_refused(bytes(data), target, "'secret' is encrypted")


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA, 99])
def test_a_member_compressed_otherwise_is_refused(target: Path, method: int) -> None:
    data = bytearray(archive(("packed", b"x" * 50)))
    data[data.find(b"PK\x03\x04") + 8 : data.find(b"PK\x03\x04") + 10] = method.to_bytes(
        2, "little"
    )
    central = data.find(b"PK\x01\x02")
    data[central + 10 : central + 12] = method.to_bytes(2, "little")
    assert_refused(bytes(data), target, "'packed' is compressed with method")


def test_a_later_zip_version_is_refused(target: Path) -> None:
    data = bytearray(archive(("f", b"1")))
    data[data.find(b"PK\x01\x02") + 6] = 64  # needs version 6.4 to extract
    assert_refused(bytes(data), target, "not a zip archive: zip file version 6.4")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_damaged_bundle_unpacks_whole_or_is_refused(data: st.DataObject) -> None:
    """Bytes of a real bundle overwritten anywhere: unbundle either succeeds with regular files
    only or raises a ValueError naming the bundle and leaves the target as it was."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        make_tree(root / "source", {"offsets/0": b"v1\n{}\n", "state/1.delta": b"s" * 200})
        good = bytearray(bundle(root / "source"))
        flips = data.draw(
            st.lists(
                st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)),
                min_size=1,
                max_size=4,
            )
        )
        for at, value in flips:
            good[at] = value
        target = root / "checkpoint"
        make_tree(target, ORIGINAL)
        try:
            unbundle(bytes(good), target)
        except ValueError as exc:
            assert str(exc).startswith("checkpoint bundle"), exc
            assert snapshot(target) == ORIGINAL
        else:
            assert all(p.is_file() or p.is_dir() for p in target.rglob("*"))
            assert not any(p.is_symlink() for p in target.rglob("*"))
        assert sorted(p.name for p in root.iterdir()) == ["checkpoint", "source"]
