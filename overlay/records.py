"""Signed, versioned DHT records (BEP 44 mutable items, the fedstream way): pure, no I/O.

Theory of operation
-------------------
Every value the catalog DHT carries is one *record*: a key, an opaque value, the Ed25519
public key of its owner, a sequence number, an expiry and the owner's signature. Storing
nodes and readers check every record they see (:func:`decode`, then :func:`verify`, then the
caller's :data:`Policy`), so a node can neither forge nor roll back another owner's record;
what it can still do is withhold one, which node admission (overlay.dht) makes hard.

Wire form (what the DHT stores and sends, as one msgpack ``bin``-typed value)::

    msgpack map, in this order and with msgpack's shortest encodings (msgpack-python's
    ``packb`` of a dict in that order):
        "k"   str   the key, ASCII, ``namespace:name``, at most 256 bytes
        "v"   bin   the value
        "o"   bin   the owner's raw Ed25519 public key (32 bytes)
        "s"   uint  the sequence number (0 .. 2**64 - 1)
        "e"   uint  the expiry, unix seconds
        "sig" bin   the signature (64 bytes)

An expiry may lie at most :data:`MAX_EXPIRY_S` (48 h) after now, plus :data:`MAX_CLOCK_SKEW_S`
for a signer whose clock runs ahead. The whole record is at most :data:`MAX_RECORD_BYTES`
bytes; :func:`decode` refuses any other shape, any extra byte and any non-shortest encoding,
so one record has exactly one byte form.

Signed bytes (what ``sig`` signs; a third party checks it with ``cryptography`` and
``msgpack`` alone)::

    DOMAIN + msgpack.packb([k, v, o, s, e])     # DOMAIN = b"fedstream/dht-record/v1\\0"

i.e. the 23 bytes ``fedstream/dht-record/v1`` and a NUL (24 bytes), then a msgpack array
of five items: ``k`` as a str, ``v`` and ``o`` as bin, ``s`` and ``e`` as unsigned ints, each
in msgpack's shortest form. ``Ed25519PublicKey.from_public_bytes(o).verify(sig, signed)``
must succeed.
The DHT key of a record is ``sha1(k.encode())``, which is what ``kademlia.utils.digest(k)``
gives, so records live where the stock library would look for ``k``.

Replacement (:func:`supersedes`) follows BEP 44: a higher sequence replaces, the same record
again only refreshes, anything else is refused; the first owner of a key stays its owner,
except in a *lease* namespace (``place:``) where another owner may take over a record that
has expired. Readers (:func:`select`) keep the owner that most replies agree on (or the one
they pinned) and take its highest sequence.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "DOMAIN",
    "LEASE_NAMESPACES",
    "MAX_CLOCK_SKEW_S",
    "MAX_EXPIRY_S",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "DhtError",
    "Policy",
    "Record",
    "RecordError",
    "all_of",
    "allow_all",
    "decode",
    "dht_key",
    "encode",
    "is_lease",
    "select",
    "self_certifying_peer_policy",
    "sign_record",
    "signed_bytes",
    "supersedes",
    "verify",
]

DOMAIN = b"fedstream/dht-record/v1\0"
MAX_RECORD_BYTES = 7600
MAX_KEY_BYTES = 256
MAX_EXPIRY_S = 48 * 3600
# A record signed on a clock a little ahead of ours may end a little after now + 48 h.
MAX_CLOCK_SKEW_S = 300
LEASE_NAMESPACES = frozenset({"place"})

_FIELDS = ("k", "v", "o", "s", "e", "sig")
_OWNER_BYTES = 32
_SIG_BYTES = 64
_UINT64_MAX = 2**64 - 1
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*:[\x21-\x7e]+")


class DhtError(Exception):
    """Base of the DHT layer's errors; ``retriable`` says whether trying again may help."""

    retriable = False


class RecordError(DhtError):
    """A record is malformed, unverifiable or not allowed; ``reason`` is a short category
    (stable, fit for a counter), the message adds what exactly is wrong."""

    retriable = False

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Record:
    """One signed DHT record (see the module docstring for the meaning of each field)."""

    key: str
    value: bytes
    owner: bytes
    seq: int
    expiry: int
    sig: bytes

    @property
    def namespace(self) -> str:
        return self.key.partition(":")[0]


Policy = Callable[[Record], str | None]
"""Who may sign what: returns the reason to refuse a (well-formed, signed) record, or None."""


def allow_all(record: Record) -> str | None:
    """The policy that refuses nothing (first-owner pinning still applies at storing nodes)."""
    return None


def self_certifying_peer_policy(record: Record) -> str | None:
    """``peer:<hex id>`` records must be signed by the key whose SHA-1 is that id."""
    namespace, _, name = record.key.partition(":")
    if namespace == "peer" and name != hashlib.sha1(record.owner).hexdigest():
        return "peer record not signed by the key of its id"
    return None


def all_of(*policies: Policy) -> Policy:
    """A policy that refuses what any of ``policies`` refuses (the first reason wins)."""

    def check(record: Record) -> str | None:
        for policy in policies:
            reason = policy(record)
            if reason is not None:
                return reason
        return None

    return check


def is_lease(key: str) -> bool:
    """Whether ``key`` lives in a lease namespace (owner may change once a record expired)."""
    return key.partition(":")[0] in LEASE_NAMESPACES


def dht_key(key: str) -> bytes:
    """The 20-byte DHT key of ``key`` (equal to ``kademlia.utils.digest(key)``)."""
    return hashlib.sha1(key.encode()).digest()


def signed_bytes(record: Record) -> bytes:
    """The exact bytes the owner signs (see the module docstring)."""
    packed: bytes = msgpack.packb(
        [record.key, record.value, record.owner, record.seq, record.expiry]
    )
    return DOMAIN + packed


def sign_record(
    key: str, value: bytes, private_key: Ed25519PrivateKey, seq: int, expiry: int
) -> Record:
    """A record for ``key`` signed by ``private_key``. Raises :class:`RecordError` if a field
    is out of range or the record would exceed :data:`MAX_RECORD_BYTES`."""
    owner = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    unsigned = Record(key, value, owner, seq, expiry, bytes(_SIG_BYTES))
    _check_fields(unsigned)
    record = Record(key, value, owner, seq, expiry, private_key.sign(signed_bytes(unsigned)))
    size = len(encode(record))
    if size > MAX_RECORD_BYTES:
        raise RecordError(
            "record too large", f"{key}: {size} bytes, at most {MAX_RECORD_BYTES} (value too big)"
        )
    return record


def encode(record: Record) -> bytes:
    """The wire form of ``record`` (its one valid byte form)."""
    packed: bytes = msgpack.packb(
        {
            "k": record.key,
            "v": record.value,
            "o": record.owner,
            "s": record.seq,
            "e": record.expiry,
            "sig": record.sig,
        }
    )
    return packed


def decode(raw: bytes) -> Record:
    """Parse the wire form strictly. Raises :class:`RecordError` (and nothing else) for any
    input that is not exactly one well-formed record in its canonical encoding. Does not check
    the signature, the key's DHT location or the expiry: that is :func:`verify`'s job."""
    if not isinstance(raw, bytes | bytearray):
        raise RecordError("malformed record", f"a record is bytes, not {type(raw).__name__}")
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError("record too large", f"{len(raw)} bytes, at most {MAX_RECORD_BYTES}")
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        object_pairs_hook=_no_repeats,
        max_buffer_size=MAX_RECORD_BYTES,
        max_str_len=MAX_KEY_BYTES,
        max_bin_len=MAX_RECORD_BYTES,
        max_array_len=0,
        max_map_len=len(_FIELDS),
        max_ext_len=0,
    )
    try:
        unpacker.feed(raw)
        obj = unpacker.unpack()
        consumed = unpacker.tell()
    except Exception as exc:  # msgpack raises ValueError, OutOfData, FormatError, StackError ...
        raise RecordError("malformed record", f"not one msgpack value: {exc!r}") from exc
    if consumed != len(raw):
        raise RecordError("malformed record", f"{len(raw) - consumed} bytes after the record")
    if not isinstance(obj, dict):
        raise RecordError("malformed record", f"a msgpack {type(obj).__name__}, not a map")
    if sorted(obj) != sorted(_FIELDS):
        raise RecordError("malformed record", f"fields {sorted(obj)!r}, not {list(_FIELDS)!r}")
    record = Record(*(obj[name] for name in _FIELDS))
    _check_fields(record)
    if encode(record) != bytes(raw):
        raise RecordError("malformed record", "not in its canonical encoding")
    return record


def verify(record: Record, dkey: bytes | None, now: float) -> None:
    """Check that ``record`` is stored under ``dkey`` (skipped when None), has not expired, ends
    at most :data:`MAX_EXPIRY_S` (plus clock skew) after ``now``, and is signed by its owner.
    Raises :class:`RecordError`; the caller's policy is a separate step."""
    if dkey is not None and dkey != dht_key(record.key):
        raise RecordError("wrong dht key", f"{record.key} is not stored under {dkey.hex()}")
    if record.expiry <= now:
        raise RecordError("expired", f"{record.key} expired at {record.expiry}")
    if record.expiry > now + MAX_EXPIRY_S + MAX_CLOCK_SKEW_S:
        raise RecordError(
            "expiry too far ahead", f"{record.key} ends more than {MAX_EXPIRY_S} s from now"
        )
    try:
        Ed25519PublicKey.from_public_bytes(record.owner).verify(record.sig, signed_bytes(record))
    except (InvalidSignature, ValueError) as exc:
        raise RecordError("bad signature", f"{record.key} is not signed by its owner") from exc


def supersedes(new: Record, old: Record, now: float) -> str | None:
    """Why ``new`` may not replace the stored ``old`` (same key), or None if it may.

    None is also the answer for the very same record again: that only refreshes the stored
    copy (the caller compares ``new == old`` to tell a refresh from a replacement).
    """
    if new.key != old.key:
        return "different key"
    if new.owner != old.owner:
        if is_lease(new.key) and old.expiry <= now:
            return None  # the lease ran out: anyone the policy allows may take it
        return "owner pinned"
    if new.seq > old.seq:
        return None
    if new.seq == old.seq:
        return None if new == old else "sequence conflict"
    return "stale sequence"


def select(records: Iterable[Record], pinned_owner: bytes | None) -> Record | None:
    """The record a reader should believe among verified ``records`` (one per reply).

    With ``pinned_owner`` only that owner's records count. Otherwise the owner seen in most
    replies wins; on a tie, the owner seen first. Among the chosen owner's records the highest
    sequence wins (on a tie, the one seen first).
    """
    candidates = [r for r in records if pinned_owner is None or r.owner == pinned_owner]
    if not candidates:
        return None
    if pinned_owner is None:
        votes = Counter(r.owner for r in candidates)  # keeps first-seen order
        owner = max(votes, key=votes.__getitem__)
        candidates = [r for r in candidates if r.owner == owner]
    return max(candidates, key=lambda r: r.seq)


def _check_fields(record: Record) -> None:
    key = record.key
    if not isinstance(key, str):
        raise RecordError("bad key", f"a key is a str, not {type(key).__name__}")
    for name, field in (("value", record.value), ("owner", record.owner), ("sig", record.sig)):
        if not isinstance(field, bytes):
            raise RecordError("malformed record", f"{name} is {type(field).__name__}, not bytes")
    for name, number in (("sequence", record.seq), ("expiry", record.expiry)):
        if type(number) is not int:
            raise RecordError("malformed record", f"{name} is {type(number).__name__}, not int")
    if not key.isascii() or len(key) > MAX_KEY_BYTES or not _KEY_RE.fullmatch(key):
        raise RecordError(
            "bad key",
            f"{key[:64]!r} is not an ASCII 'namespace:name' of at most {MAX_KEY_BYTES} bytes",
        )
    if len(record.owner) != _OWNER_BYTES:
        raise RecordError("malformed record", f"owner key is {len(record.owner)} bytes, not 32")
    if len(record.sig) != _SIG_BYTES:
        raise RecordError("malformed record", f"signature is {len(record.sig)} bytes, not 64")
    if not 0 <= record.seq <= _UINT64_MAX:
        raise RecordError("malformed record", "sequence is not a uint64")
    if not 0 <= record.expiry <= _UINT64_MAX:
        raise RecordError("malformed record", "expiry is not a uint64")


def _no_repeats(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("a map repeats a key")
    return result
