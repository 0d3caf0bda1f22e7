"""Who a peer is: its participant, its node key, and the certificate that binds the two.

Theory of operation
-------------------
A *participant* is an organisation with a name and an Ed25519 key (contracts.keys). Each peer
process has its own *node key*, also Ed25519; its node id, the peer's place in the Kademlia id
space, is ``sha1(raw 32-byte node public key)``. Knowing the node key proves the node id.

The participant vouches for its node with a *node certificate*, one msgpack map::

    {"p": participant name, "pk": participant public key (32 B), "nk": node public key (32 B),
     "exp": expiry (unix seconds), "sig": Ed25519 signature by the participant key (64 B)}

``sig`` covers ``NODE_CERT_CONTEXT + msgpack([p, pk, nk, exp])``; the context string keeps the
signature from meaning anything in another protocol. A node certificate is worth something
only to a peer whose :class:`TrustStore` holds ``pk`` under the name ``p``: the trust store is
the federation as this peer sees it (its own participant, ``DATA_DIR/trust/*.pub``, and later
the partners of its contracts).

:func:`verify_node_cert` and :func:`verify_hello` read bytes from strangers: they either return
a checked value or raise :class:`IdentityError` saying what is wrong, never anything else.

This module is pure: no sockets, no asyncio. The TLS certificates built from the same keys
live in :mod:`overlay.tls`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contracts.keys import KeyError_, check_name, generate, load_private, load_public

__all__ = [
    "DEFAULT_CERT_VALID_S",
    "MAX_NODE_CERT_BYTES",
    "IdentityError",
    "NodeCert",
    "NodeIdentity",
    "TrustStore",
    "issue_node_cert",
    "node_id_of",
    "participant_fingerprint",
    "raw_public",
    "sign_hello",
    "verify_hello",
    "verify_node_cert",
]

NODE_CERT_CONTEXT = b"fedstream/node-cert/v1\0"
HELLO_CONTEXT = b"fedstream/node-hello/v1\0"
DEFAULT_CERT_VALID_S = 30 * 24 * 3600
# name (<= 128 B) + two keys + signature + int + map overhead, with room to spare
MAX_NODE_CERT_BYTES = 512
MAX_CHALLENGE_BYTES = 1024
_CERT_FIELDS = frozenset({"p", "pk", "nk", "exp", "sig"})
_IDENTITY_FILE_VERSION = 1


class IdentityError(Exception):
    """A certificate, key or identity is not acceptable; ``reason`` says why."""

    retriable = False

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def raw_public(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The raw 32 bytes of a public key (of the private key's public half)."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def node_id_of(node_pub: bytes) -> bytes:
    """The node id: sha1 of the raw node public key (20 bytes, the Kademlia id space)."""
    return hashlib.sha1(node_pub).digest()


def participant_fingerprint(participant_pub: bytes) -> str:
    """A short, collision-safe handle of a participant key: sha256 hex, first 32 digits."""
    return hashlib.sha256(participant_pub).hexdigest()[:32]


# -- node certificates ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeCert:
    """A verified node certificate."""

    participant: str
    participant_pub: bytes
    node_pub: bytes
    expires: int
    signature: bytes = field(repr=False)

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.node_pub)


def _signed_part(name: str, participant_pub: bytes, node_pub: bytes, expires: int) -> bytes:
    packed: bytes = msgpack.packb([name, participant_pub, node_pub, expires], use_bin_type=True)
    return NODE_CERT_CONTEXT + packed


def issue_node_cert(
    participant_name: str,
    participant_key: Ed25519PrivateKey,
    node_pub: bytes,
    valid_s: float,
    *,
    now: float | None = None,
) -> bytes:
    """A node certificate for ``node_pub``, signed by the participant, valid ``valid_s``."""
    check_name(participant_name)
    if len(node_pub) != 32:
        raise ValueError("node_pub must be a raw 32-byte Ed25519 public key")
    expires = int((time.time() if now is None else now) + valid_s)
    participant_pub = raw_public(participant_key)
    signature = participant_key.sign(
        _signed_part(participant_name, participant_pub, node_pub, expires)
    )
    cert = {"p": participant_name, "pk": participant_pub, "nk": node_pub, "exp": expires}
    raw: bytes = msgpack.packb({**cert, "sig": signature}, use_bin_type=True)
    return raw


def _decode_cert(raw: bytes) -> dict[str, Any]:
    if not isinstance(raw, bytes | bytearray):
        raise IdentityError(f"node certificate is a {type(raw).__name__}, not bytes")
    if len(raw) > MAX_NODE_CERT_BYTES:
        raise IdentityError(
            f"node certificate of {len(raw)} bytes exceeds the limit of {MAX_NODE_CERT_BYTES}"
        )
    try:
        value = msgpack.unpackb(
            bytes(raw),
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_NODE_CERT_BYTES,
            max_bin_len=MAX_NODE_CERT_BYTES,
            max_array_len=8,
            max_map_len=8,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises many types on hostile bytes; all mean "garbage"
        raise IdentityError(f"node certificate does not decode: {exc!r}") from exc
    if not isinstance(value, dict) or set(value) != _CERT_FIELDS:
        raise IdentityError(
            f"node certificate must be a map with exactly the fields {sorted(_CERT_FIELDS)}"
        )
    return value


def _check_fields(cert: dict[str, Any]) -> tuple[str, bytes, bytes, int, bytes]:
    name, pk, nk, exp, sig = (cert[k] for k in ("p", "pk", "nk", "exp", "sig"))
    if not isinstance(name, str):
        raise IdentityError("node certificate: 'p' (participant name) is not a string")
    try:
        check_name(name)
    except KeyError_ as exc:
        raise IdentityError(f"node certificate: {exc}") from exc
    for label, value, size in (("pk", pk, 32), ("nk", nk, 32), ("sig", sig, 64)):
        if not isinstance(value, bytes) or len(value) != size:
            raise IdentityError(f"node certificate: {label!r} must be {size} bytes")
    if not isinstance(exp, int) or isinstance(exp, bool) or not 0 <= exp < 2**63:
        raise IdentityError("node certificate: 'exp' must be a non-negative integer")
    return name, pk, nk, exp, sig


def _verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_node_cert(
    raw: bytes, trust: TrustStore, now: float, *, node_pub: bytes | None = None
) -> NodeCert:
    """Check a node certificate against the trust store; ``node_pub``, if given, must be the
    key it certifies. Raises :class:`IdentityError` (and nothing else) when it is not valid."""
    name, pk, nk, exp, sig = _check_fields(_decode_cert(raw))
    trusted_name = trust.name_of(pk)
    if trusted_name is None:
        raise IdentityError(f"participant {name!r} is not trusted by this peer")
    if trusted_name != name:
        raise IdentityError(
            f"node certificate names participant {name!r}, but its key is {trusted_name!r}'s"
        )
    if not _verify_signature(pk, sig, _signed_part(name, pk, nk, exp)):
        raise IdentityError(f"node certificate of participant {name!r} has a bad signature")
    if exp <= now:
        raise IdentityError(f"node certificate of participant {name!r} expired at {exp}")
    if node_pub is not None and node_pub != nk:
        raise IdentityError(
            f"node certificate of participant {name!r} is for node {node_id_of(nk).hex()}, "
            f"not {node_id_of(node_pub).hex()} (node key mismatch)"
        )
    return NodeCert(name, pk, nk, exp, sig)


# -- trust ------------------------------------------------------------------------------------


class TrustStore:
    """The participants this peer trusts: raw public key <-> name, one to one.

    ``version`` grows on every change, so holders of derived state (TLS contexts) know when
    to rebuild it.
    """

    def __init__(self) -> None:
        self._names: dict[bytes, str] = {}
        self._keys: dict[str, bytes] = {}
        self._fingerprints: dict[str, bytes] = {}
        self.version = 0

    def add(self, name: str, pubkey: bytes | Ed25519PublicKey) -> None:
        """Trust participant ``name`` with key ``pubkey``; refuses to rebind a name or a key."""
        try:
            check_name(name)
        except KeyError_ as exc:
            raise IdentityError(str(exc)) from exc
        raw = pubkey if isinstance(pubkey, bytes) else raw_public(pubkey)
        if len(raw) != 32:
            raise IdentityError(f"participant {name!r}: a public key must be 32 raw bytes")
        known = self._keys.get(name)
        if known == raw:
            return
        if known is not None:
            raise IdentityError(
                f"participant {name!r} is already trusted with key "
                f"{participant_fingerprint(known)}; refusing a second key "
                f"{participant_fingerprint(raw)}"
            )
        other = self._names.get(raw)
        if other is not None:
            raise IdentityError(
                f"key {participant_fingerprint(raw)} is already trusted as participant "
                f"{other!r}; refusing it as {name!r}"
            )
        self._keys[name] = raw
        self._names[raw] = name
        self._fingerprints[participant_fingerprint(raw)] = raw
        self.version += 1

    def load_dir(self, path: Path) -> list[str]:
        """Trust every ``*.pub`` (PEM) in ``path``, named by its file stem; returns the names."""
        names = []
        for pub_path in sorted(path.glob("*.pub")):
            try:
                key = load_public(pub_path)
                self.add(pub_path.stem, key)
            except (KeyError_, IdentityError) as exc:
                raise IdentityError(f"trust file {pub_path}: {exc}") from exc
            names.append(pub_path.stem)
        return names

    def is_trusted(self, pubkey: bytes) -> bool:
        return pubkey in self._names

    def name_of(self, pubkey: bytes) -> str | None:
        return self._names.get(pubkey)

    def key_of(self, name: str) -> bytes | None:
        return self._keys.get(name)

    def by_fingerprint(self, fingerprint: str) -> tuple[str, bytes] | None:
        """The (name, raw key) whose :func:`participant_fingerprint` this is, if trusted."""
        raw = self._fingerprints.get(fingerprint)
        return None if raw is None else (self._names[raw], raw)

    def participants(self) -> dict[str, bytes]:
        """Name -> raw public key, a copy."""
        return dict(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __repr__(self) -> str:
        return f"TrustStore({sorted(self._keys)})"


# -- this peer's identity ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NodeIdentity:
    """This peer: its participant (name, keys), its node key and id, and its node cert."""

    participant: str
    participant_key: Ed25519PrivateKey = field(repr=False)
    node_key: Ed25519PrivateKey = field(repr=False)
    cert: bytes = field(repr=False)
    data_dir: Path | None = None
    participant_pub: bytes = field(init=False)
    node_pub: bytes = field(init=False)
    node_id: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "participant_pub", raw_public(self.participant_key))
        object.__setattr__(self, "node_pub", raw_public(self.node_key))
        object.__setattr__(self, "node_id", node_id_of(self.node_pub))

    @classmethod
    def create(
        cls,
        participant: str,
        participant_key: Ed25519PrivateKey,
        node_key: Ed25519PrivateKey | None = None,
        *,
        data_dir: Path | None = None,
        cert_valid_s: float = DEFAULT_CERT_VALID_S,
        now: float | None = None,
    ) -> NodeIdentity:
        """An identity from keys in hand (a fresh node key if none is given)."""
        node_key = node_key or Ed25519PrivateKey.generate()
        cert = issue_node_cert(
            participant, participant_key, raw_public(node_key), cert_valid_s, now=now
        )
        return cls(participant, participant_key, node_key, cert, data_dir)

    @classmethod
    def load_or_create(
        cls,
        data_dir: Path,
        participant: str | None = None,
        participant_key_path: Path | None = None,
        *,
        cert_valid_s: float = DEFAULT_CERT_VALID_S,
        now: float | None = None,
    ) -> NodeIdentity:
        """The identity kept in ``DATA_DIR/keys``, made on first start (see the module notes).

        The node key (``keys/node.key``) is reused on restart, so the node id is stable. The
        participant key is ``participant_key_path`` (then ``participant`` names it), else
        ``keys/participant.key``, made on first start. ``keys/identity.json`` remembers the
        participant; a later start as another participant, or with another key, is refused.
        """
        if participant_key_path is not None and participant is None:
            raise IdentityError(
                f"a participant key ({participant_key_path}) needs the participant's name too"
            )
        if participant is not None:
            _checked_name(participant)
        keys_dir = data_dir / "keys"
        keys_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(keys_dir, 0o700)
        node_key = _load_or_generate(keys_dir, "node")
        recorded = _read_identity_file(keys_dir / "identity.json")

        if participant_key_path is not None:
            participant_key = _load_key(participant_key_path)
        elif recorded is None or (keys_dir / "participant.key").exists():
            participant_key = _load_or_generate(keys_dir, "participant")
        else:
            raise IdentityError(
                f"data dir {data_dir} belongs to participant {recorded[0]!r}, whose key is not "
                f"in {keys_dir}; start it with --participant {recorded[0]} --key FILE"
            )
        participant_pub = raw_public(participant_key)
        fingerprint = participant_fingerprint(participant_pub)
        if recorded is not None:
            recorded_name, recorded_pub = recorded
            if participant is not None and participant != recorded_name:
                raise IdentityError(
                    f"data dir {data_dir} belongs to participant {recorded_name!r}, not "
                    f"{participant!r}; use another data dir for {participant!r}"
                )
            if participant_pub != recorded_pub:
                raise IdentityError(
                    f"data dir {data_dir} belongs to participant {recorded_name!r} with key "
                    f"{participant_fingerprint(recorded_pub)}, but the key given is "
                    f"{fingerprint}; refusing to change a peer's participant key"
                )
            name = recorded_name
        else:
            name = participant or f"local-{fingerprint[:8]}"
            _write_identity_file(keys_dir / "identity.json", name, participant_pub)
        return cls.create(
            name, participant_key, node_key, data_dir=data_dir, cert_valid_s=cert_valid_s, now=now
        )

    def trust_store(self) -> TrustStore:
        """A trust store holding this peer's own participant and ``DATA_DIR/trust/*.pub``."""
        trust = TrustStore()
        trust.add(self.participant, self.participant_pub)
        if self.data_dir is not None and (self.data_dir / "trust").is_dir():
            trust.load_dir(self.data_dir / "trust")
        return trust


def _checked_name(name: str) -> str:
    try:
        return check_name(name)
    except KeyError_ as exc:
        raise IdentityError(str(exc)) from exc


def _load_key(path: Path) -> Ed25519PrivateKey:
    try:
        return load_private(path)
    except KeyError_ as exc:
        raise IdentityError(str(exc)) from exc


def _load_or_generate(keys_dir: Path, stem: str) -> Ed25519PrivateKey:
    key_path = keys_dir / f"{stem}.key"
    if not key_path.exists():
        # overwrite=True only replaces a stale .pub left without its key
        generate(stem, keys_dir, overwrite=True)
    return _load_key(key_path)


def _read_identity_file(path: Path) -> tuple[str, bytes] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        name = _checked_name(data["participant"])
        pub = bytes.fromhex(data["participant_pub"])
    except (OSError, ValueError, KeyError, TypeError, IdentityError) as exc:
        raise IdentityError(f"{path} is unreadable or damaged: {exc!r}") from exc
    if len(pub) != 32:
        raise IdentityError(f"{path}: participant_pub is not a 32-byte key")
    return name, pub


def _write_identity_file(path: Path, name: str, participant_pub: bytes) -> None:
    data = {
        "version": _IDENTITY_FILE_VERSION,
        "participant": name,
        "participant_pub": participant_pub.hex(),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


# -- signed hello (for transports without TLS, e.g. the DHT's UDP messages) -------------------


def _hello_message(challenge: bytes, extra: bytes) -> bytes:
    packed: bytes = msgpack.packb([challenge, extra], use_bin_type=True)
    return HELLO_CONTEXT + packed


def sign_hello(identity: NodeIdentity, challenge: bytes, extra: bytes = b"") -> dict[str, bytes]:
    """Proof that this node holds its node key, bound to the verifier's ``challenge``:
    ``{"cert": node cert, "sig": node-key signature of challenge and extra}``."""
    if len(challenge) > MAX_CHALLENGE_BYTES:
        raise ValueError(f"a challenge is at most {MAX_CHALLENGE_BYTES} bytes")
    return {"cert": identity.cert, "sig": identity.node_key.sign(_hello_message(challenge, extra))}


def verify_hello(
    hello: Mapping[str, object],
    challenge: bytes,
    trust: TrustStore,
    now: float,
    extra: bytes = b"",
) -> NodeCert:
    """Check a :func:`sign_hello` answer to our ``challenge``; returns the sender's node cert
    (its ``node_id`` is proven). Raises :class:`IdentityError` only."""
    if not isinstance(hello, Mapping):
        raise IdentityError(f"hello is a {type(hello).__name__}, not a map")
    raw, sig = hello.get("cert"), hello.get("sig")
    if not isinstance(raw, bytes) or not isinstance(sig, bytes) or len(sig) != 64:
        raise IdentityError("hello needs 'cert' bytes and a 64-byte 'sig'")
    cert = verify_node_cert(raw, trust, now)
    if not _verify_signature(cert.node_pub, sig, _hello_message(challenge, extra)):
        raise IdentityError(
            f"hello from node {cert.node_id.hex()} ({cert.participant!r}) has a bad signature"
        )
    return cert
