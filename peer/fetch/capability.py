"""Read capabilities for spool fetches: minted by the peer's planner, checked by its server.

Theory of operation
-------------------
On a Spark cluster the executors that read a query's input are on other hosts and cannot open
the peer's spool files; they fetch them from the peer's fetch server (:mod:`peer.fetch.server`).
What an executor may fetch is decided where the micro-batch is planned: the source's
``partitions()`` runs in a Python process that Spark's driver starts on the peer's own host,
which reads the peer's *fetch key* from the data directory and signs, for each partition, a
capability::

    token = signature (64 bytes, Ed25519) || body
    body  = msgpack [VERSION, key id (8 bytes), spool directory, first, last, expires_ms]

signed over ``DOMAIN || body``. It allows reading files ``first..last`` (inclusive) of that one
spool until ``expires_ms`` (Unix milliseconds); executors carry it as opaque bytes and never
check it. The server verifies it (:meth:`CapabilityCheck.check`) before it opens anything and
refuses, with a reason naming what is wrong, a token that does not parse, one made with
another peer's key, one whose signature does not verify, one for another spool, an offset
outside its range, or one past its expiry. Minting and checking take the time from the
caller (an injected clock), and both run on the peer's host, so expiry compares one clock with
itself: no skew between hosts to allow for.

Why a key of its own (``DATA_DIR/keys/fetch.key``, mode 0600) rather than the participant's
or the node's key: the planner is a process Spark starts, with Spark's logging and error
reporting, so the key it reads should grant as little as possible. A leaked fetch key lets
its holder read this peer's spool files and nothing else (no catalog record, contract, peer
link or TLS identity of the participant), and deleting the file and restarting the peer
revokes every capability it ever signed. The same key is the fetch server's TLS key (see
:mod:`peer.fetch.tls`); ``DOMAIN`` keeps the two uses apart (a TLS 1.3 CertificateVerify
signs 64 spaces first, a certificate signs DER starting with ``0x30``).

This module is pure: no asyncio, no Spark, no sockets; its only I/O is reading and writing
the key file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contracts import keys
from peer.errors import Unauthorized

__all__ = [
    "DEFAULT_TTL_S",
    "MAX_TOKEN_BYTES",
    "Capability",
    "CapabilityCheck",
    "CapabilityRefused",
    "FetchKey",
    "fetch_key_path",
    "key_id_of",
]

VERSION = 1
DOMAIN = b"fedstream fetch capability v1\x00"
SIGNATURE_BYTES = 64
KEY_ID_BYTES = 8
MAX_TOKEN_BYTES = 4096  # a spool path of up to ~4000 bytes: anything longer is not ours
MAX_OFFSET = 2**63 - 1
DEFAULT_TTL_S = 900.0  # long enough for a task retried on another executor, short enough to die
KEY_NAME = "fetch"

Clock = Callable[[], float]


class CapabilityRefused(Unauthorized):
    """A capability the server will not honour; ``reason`` is one of ``malformed``,
    ``other-key``, ``forged``, ``wrong-spool``, ``out-of-range``, ``expired``."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(f"read capability refused ({reason}): {message}", reason=reason, **details)
        self.reason = reason


def key_id_of(public: bytes) -> bytes:
    """The first 8 bytes of the SHA-256 of a raw Ed25519 public key."""
    return hashlib.sha256(public).digest()[:KEY_ID_BYTES]


def fetch_key_path(data_dir: Path) -> Path:
    return data_dir / "keys" / f"{KEY_NAME}.key"


@dataclass(frozen=True)
class Capability:
    """What a token allows: files ``first..last`` of ``spool`` until ``expires_ms``."""

    key_id: bytes
    spool: str
    first: int
    last: int
    expires_ms: int

    def body(self) -> bytes:
        fields = [VERSION, self.key_id, self.spool, self.first, self.last, self.expires_ms]
        packed: bytes = msgpack.packb(fields, use_bin_type=True)
        return packed

    @classmethod
    def from_body(cls, body: bytes) -> Capability:
        """The capability a body states; CapabilityRefused ``malformed`` if it is not one."""
        try:
            fields = msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                max_bin_len=KEY_ID_BYTES,
                max_str_len=MAX_TOKEN_BYTES,
                max_array_len=6,
                max_map_len=0,
                max_ext_len=0,
            )
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise CapabilityRefused("malformed", f"its body does not decode ({exc})") from None
        if not isinstance(fields, list) or len(fields) != 6:
            raise CapabilityRefused("malformed", "its body is not a 6-field array")
        version, key_id, spool, first, last, expires_ms = fields
        if version != VERSION:
            raise CapabilityRefused("malformed", f"version {version!r}, expected {VERSION}")
        if not isinstance(key_id, bytes) or len(key_id) != KEY_ID_BYTES:
            raise CapabilityRefused("malformed", "its key id is not 8 bytes")
        if not isinstance(spool, str) or not spool:
            raise CapabilityRefused("malformed", "its spool is not a non-empty string")
        for name, value in (("first", first), ("last", last), ("expires_ms", expires_ms)):
            if type(value) is not int or not 0 <= value <= MAX_OFFSET:
                raise CapabilityRefused("malformed", f"{name} {value!r} is not an offset")
        if last < first:
            raise CapabilityRefused("malformed", f"its range {first}..{last} is empty")
        return cls(key_id, spool, first, last, expires_ms)


def _split(token: object) -> tuple[bytes, bytes]:
    if not isinstance(token, bytes):
        raise CapabilityRefused("malformed", f"a token is bytes, not {type(token).__name__}")
    if not SIGNATURE_BYTES < len(token) <= MAX_TOKEN_BYTES:
        raise CapabilityRefused(
            "malformed", f"{len(token)} bytes, not {SIGNATURE_BYTES + 1}..{MAX_TOKEN_BYTES}"
        )
    return token[:SIGNATURE_BYTES], token[SIGNATURE_BYTES:]


class FetchKey:
    """The peer's fetch key: signs capabilities (the planner) and is the fetch server's TLS
    key. Never pickled, never logged."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.key_id = key_id_of(self.public)

    @classmethod
    def generate(cls) -> FetchKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> FetchKey:
        """The key in ``path``; ValueError (naming the file) if it is missing or not a key."""
        try:
            return cls(keys.load_private(path))
        except keys.KeyError_ as exc:
            raise ValueError(f"the peer's fetch key: {exc}") from exc

    @classmethod
    def load_or_create(cls, data_dir: Path) -> FetchKey:
        """``DATA_DIR/keys/fetch.key`` (mode 0600 in a 0700 directory), made on first use."""
        path = fetch_key_path(data_dir)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path.parent, 0o700)
            keys.generate(KEY_NAME, path.parent)
        return cls.load(path)

    def mint(self, spool: str, first: int, last: int, *, now: float, ttl_s: float) -> bytes:
        """A token for files ``first..last`` of ``spool``, valid ``ttl_s`` from ``now``."""
        if not 0 <= first <= last:
            raise ValueError(f"a capability needs 0 <= first <= last, not {first}..{last}")
        if ttl_s <= 0:
            raise ValueError(f"a capability's ttl_s must be positive, not {ttl_s}")
        expires_ms = int((now + ttl_s) * 1000)
        body = Capability(self.key_id, spool, first, last, expires_ms).body()
        token = self.private.sign(DOMAIN + body) + body
        if len(token) > MAX_TOKEN_BYTES:
            raise ValueError(f"spool path too long for a capability: {spool[:80]!r}...")
        return token

    def __reduce__(self) -> Any:
        raise TypeError("the fetch key is not pickled (executors carry tokens, not keys)")

    def __repr__(self) -> str:
        return f"FetchKey(id={self.key_id.hex()})"


class CapabilityCheck:
    """Verifies tokens against one public key (the server's side)."""

    def __init__(self, public: bytes) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(public)
        self.key_id = key_id_of(public)

    def check(self, token: object, *, spool: str, offset: int, now: float) -> Capability:
        """The capability in ``token`` if it allows reading file ``offset`` of ``spool`` at
        ``now``; else CapabilityRefused naming the first thing wrong."""
        signature, body = _split(token)
        stated = Capability.from_body(body)  # not yet trusted: only picks the message
        if stated.key_id != self.key_id:
            raise CapabilityRefused(
                "other-key",
                f"it was signed by fetch key {stated.key_id.hex()}, this peer's is "
                f"{self.key_id.hex()} (a token of another peer, or of this peer before its "
                "fetch key changed)",
            )
        try:
            self._key.verify(signature, DOMAIN + body)
        except InvalidSignature:
            raise CapabilityRefused("forged", "its signature does not verify") from None
        if stated.spool != spool:
            raise CapabilityRefused(
                "wrong-spool", f"it is for spool {stated.spool!r}, not {spool!r}", spool=spool
            )
        if not stated.first <= offset <= stated.last:
            raise CapabilityRefused(
                "out-of-range",
                f"offset {offset} is outside its range {stated.first}..{stated.last}",
                offset=offset,
            )
        now_ms = int(now * 1000)
        if now_ms >= stated.expires_ms:
            raise CapabilityRefused(
                "expired", f"it expired {(now_ms - stated.expires_ms) / 1000:.3f} s ago"
            )
        return stated
