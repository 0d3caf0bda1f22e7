"""Participant keys: Ed25519 key pairs in PEM files (private key mode 0600, never logged)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

# Matched whole (fullmatch): ``$`` would let a trailing newline through.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class KeyError_(ValueError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise KeyError_(
            f"participant name {name!r} must be 1-128 characters of letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return name


def generate(name: str, directory: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write DIR/NAME.key (PKCS#8 PEM, 0600) and DIR/NAME.pub (SubjectPublicKeyInfo PEM)."""
    check_name(name)
    directory.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (key_path, pub_path):
        if path.is_symlink():  # a dangling one too: the key would land where it points
            raise KeyError_(f"{path} is a symbolic link; refusing to write a key through it")
    if not overwrite and (key_path.exists() or pub_path.exists()):
        raise KeyError_(f"{key_path} or {pub_path} already exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(key_path, private, 0o600, overwrite=overwrite)
    os.chmod(key_path, 0o600)
    _write(pub_path, public, 0o644, overwrite=overwrite)
    return key_path, pub_path


def _write(path: Path, data: bytes, mode: int, *, overwrite: bool) -> None:
    # O_NOFOLLOW: a link put there after the check above is refused, not followed.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        raise KeyError_(f"cannot write {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyError_(f"cannot read private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"{path} is not an Ed25519 private key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise KeyError_(f"cannot read public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyError_(f"{path} is not an Ed25519 public key")
    return key
