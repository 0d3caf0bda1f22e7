"""Pairwise contracts between participants: a TOML file signed by both parties.

Theory of operation. A contract names two participants and their raw Ed25519 public keys, a
price per unit of load (fixed, a range, or a nominal price within a range), the box types each
party accepts from the other, a validity period and an id. Each party signs the *canonical
bytes*: a line format holding every field but the signatures, fixed here and in
docs/contracts.md so that ``openssl pkeyutl -verify -rawin`` can check a signature without this
project. The TOML layout is free (key order, spacing, comments); only the canonical bytes are
signed, so a reformatted file still verifies and a changed value does not.

Parsing is strict and bounded: a file larger than ``MAX_FILE_BYTES``, an unknown or missing
field, a value of the wrong type or outside its bounds is refused with ``ContractError``, and a
hostile file never raises anything else. This module is pure: no asyncio, no I/O beyond
``load``/``dump``.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import tomli_w
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contracts.keys import NAME

__all__ = [
    "ANY",
    "BOX_TYPES",
    "DOMAIN",
    "Contract",
    "ContractError",
    "Party",
    "canonical_bytes",
    "covers",
    "create",
    "dump",
    "dumps",
    "format_time",
    "load",
    "loads",
    "price_range",
    "sign",
    "verify",
]

DOMAIN = "fedstream-contract-v1"
FORMAT_VERSION = 1
BOX_TYPES = ("filter", "map", "union", "aggregate", "join", "bsort")
ANY = "any"
MAX_FILE_BYTES = 64 * 1024
MAX_PRICE = 1e12

# Each matched whole (fullmatch): ``$`` would let a trailing newline through.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HEX_KEY = re.compile(r"[0-9a-f]{64}")
_HEX_SIG = re.compile(r"[0-9a-f]{128}")
_NAME_RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
_TOP_FIELDS = {"version", "id", "not_before", "not_after", "price", "min_price", "max_price"}
_PARTY_FIELDS = {"name", "public_key", "accepts", "signature"}
_REQUIRED_TOP = {"version", "id", "not_before", "not_after", "participant"}
_REQUIRED_PARTY = {"name", "public_key", "accepts"}


class ContractError(ValueError):
    """A contract is malformed, invalid now, or not signed as it must be.

    ``reason`` is one of: ``malformed``, ``self-contract``, ``not-yet-valid``, ``expired``,
    ``unsigned``, ``altered``, ``wrong-key``, ``unreadable``, ``not-a-party``, ``duplicate``.
    The message names the contract and the participant it is about.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Party:
    """One participant of a contract: ``accepts`` are the box types it runs for the other."""

    name: str
    public_key: bytes
    accepts: tuple[str, ...]
    signature: bytes | None = None


@dataclass(frozen=True)
class Contract:
    id: str
    parties: tuple[Party, Party]
    not_before: datetime
    not_after: datetime
    price: float | None = None
    min_price: float | None = None
    max_price: float | None = None
    source: str | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, str]:
        return self.parties[0].name, self.parties[1].name

    def party(self, name: str) -> Party | None:
        return next((p for p in self.parties if p.name == name), None)

    def other(self, name: str) -> Party | None:
        """The party that is not ``name`` (None if ``name`` is not a party)."""
        a, b = self.parties
        return b if a.name == name else a if b.name == name else None

    @property
    def label(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return f"contract {self.id}{where}"


# -- building and checking ---------------------------------------------------------------------


def create(
    a: str,
    a_key: bytes,
    b: str,
    b_key: bytes,
    *,
    price: float | None = None,
    min_price: float | None = None,
    max_price: float | None = None,
    a_accepts: Sequence[str] = (ANY,),
    b_accepts: Sequence[str] = (ANY,),
    not_before: datetime | None = None,
    days: float = 30.0,
    not_after: datetime | None = None,
    contract_id: str | None = None,
) -> Contract:
    """An unsigned contract between ``a`` and ``b`` (raw 32-byte public keys).

    ``a_accepts`` are the box types ``a`` accepts from ``b`` and vice versa. The validity period
    starts at ``not_before`` (default: now, to the second) and lasts ``days`` unless
    ``not_after`` is given.
    """
    start = (not_before or datetime.now(UTC)).replace(microsecond=0)
    if not_after is None:
        if not (isinstance(days, int | float) and math.isfinite(days) and days > 0):
            raise ContractError("malformed", f"validity of {days!r} days must be positive")
        try:
            not_after = start + timedelta(days=days)
        except OverflowError as exc:
            raise ContractError("malformed", f"validity of {days!r} days is too long") from exc
    contract = Contract(
        id=contract_id if contract_id is not None else secrets.token_hex(16),
        parties=(
            Party(a, a_key, _accepts(a_accepts, a)),
            Party(b, b_key, _accepts(b_accepts, b)),
        ),
        not_before=start,
        not_after=not_after.replace(microsecond=0),
        price=_price_or_none(price, "price"),
        min_price=_price_or_none(min_price, "min_price"),
        max_price=_price_or_none(max_price, "max_price"),
    )
    _check(contract)
    return contract


def _fail(where: str, message: str) -> ContractError:
    return ContractError("malformed", f"{where}: malformed: {message}")


def _shown(items: set[str]) -> str:
    """Names from a hostile file, fit for a message: escaped by repr, and bounded."""
    text = repr(sorted(items))
    return text if len(text) <= 120 else text[:117] + "..."


def _accepts(kinds: Sequence[str], who: str) -> tuple[str, ...]:
    if isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
        raise _fail(f"participant {who}", "accepts must be a list of box types")
    unique = set(kinds)
    if len(unique) != len(kinds) or not unique:
        raise _fail(f"participant {who}", "accepts must list each box type once, at least one")
    unknown = unique - {*BOX_TYPES, ANY}
    if unknown:
        raise _fail(
            f"participant {who}",
            f"unknown box types {_shown(unknown)} in accepts; "
            f"use {', '.join(BOX_TYPES)} or {ANY!r}",
        )
    if ANY in unique and len(unique) > 1:
        raise _fail(f"participant {who}", f"{ANY!r} in accepts must stand alone")
    return tuple(sorted(unique))


def _price_or_none(value: object, name: str) -> float | None:
    if value is None:
        return None
    # bool is an int; a huge int would overflow float(): check both before converting.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(name, f"must be a number, not {type(value).__name__}")
    if isinstance(value, int) and not -MAX_PRICE <= value <= MAX_PRICE:
        raise _fail(name, f"must be at most {MAX_PRICE:g}")
    number = float(value)
    if not math.isfinite(number) or math.copysign(1.0, number) < 0 or number > MAX_PRICE:
        raise _fail(name, f"must be a finite number from 0 to {MAX_PRICE:g}, not {value!r}")
    return number


def _check(c: Contract) -> None:
    """Structural checks shared by create, loads and verify (no signatures, no clock)."""
    shown = c.id if isinstance(c.id, str) and _ID.fullmatch(c.id) else repr(c.id)[:64]
    where = f"contract {shown}" + (f" ({c.source})" if c.source else "")
    if not isinstance(c.id, str) or not _ID.fullmatch(c.id):
        raise _fail(where, f"id must be {_NAME_RULE}")
    for p in c.parties:
        if not isinstance(p.name, str) or not NAME.fullmatch(p.name):
            raise _fail(where, f"participant name {repr(p.name)[:80]} is not valid ({_NAME_RULE})")
        if not isinstance(p.public_key, bytes) or len(p.public_key) != 32:
            raise _fail(where, f"participant {p.name}: public key must be 32 raw bytes")
        if p.signature is not None and (
            not isinstance(p.signature, bytes) or len(p.signature) != 64
        ):
            raise _fail(where, f"participant {p.name}: signature must be 64 raw bytes")
        if _accepts(p.accepts, p.name) != p.accepts:
            raise _fail(where, f"participant {p.name}: accepts must be sorted")
    a, b = c.parties
    if a.name == b.name or a.public_key == b.public_key:
        same = "name" if a.name == b.name else "public key"
        raise ContractError(
            "self-contract",
            f"{where}: self-contract: both parties have the same {same} "
            f"({a.name} and {b.name}); a contract binds two different participants",
        )
    for stamp in (c.not_before, c.not_after):
        if not isinstance(stamp, datetime) or stamp.utcoffset() != timedelta(0):
            raise _fail(where, "not_before and not_after must be UTC times (ending in Z)")
        if stamp.microsecond:
            raise _fail(where, "not_before and not_after must be whole seconds")
    if c.not_before >= c.not_after:
        raise _fail(where, "not_before must be earlier than not_after")
    if (c.min_price is None) != (c.max_price is None):
        raise _fail(where, "min_price and max_price come together")
    if c.price is None and c.min_price is None:
        raise _fail(where, "give a price, or min_price and max_price, or all three")
    if c.min_price is not None and c.max_price is not None:
        if c.min_price > c.max_price:
            raise _fail(where, "min_price must not exceed max_price")
        if c.price is not None and not c.min_price <= c.price <= c.max_price:
            raise _fail(where, "price must lie between min_price and max_price")


def price_range(contract: Contract) -> tuple[float, float]:
    """The contracted (lowest, highest) price per unit of load; a fixed price is both."""
    if contract.min_price is not None and contract.max_price is not None:
        return contract.min_price, contract.max_price
    assert contract.price is not None  # _check guarantees one of the two forms
    return contract.price, contract.price


def covers(contract: Contract, from_participant: str, box_type: str) -> bool:
    """Whether ``from_participant`` may hand a ``box_type`` box to the other party."""
    if box_type not in BOX_TYPES:
        raise ValueError(f"unknown box type {box_type!r}; expected one of {', '.join(BOX_TYPES)}")
    if contract.party(from_participant) is None:
        return False
    taker = contract.other(from_participant)
    return taker is not None and (ANY in taker.accepts or box_type in taker.accepts)


# -- canonical bytes and signatures ------------------------------------------------------------


def _decimal(x: float) -> str:
    """Shortest round-tripping decimal, positional (no exponent), at least one fraction digit."""
    text = format(Decimal(repr(x)), "f")
    return text if "." in text else text + ".0"


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC to the second, '2026-06-01T00:00:00Z' (strftime drops a year's zeros)."""
    return t.astimezone(UTC).replace(tzinfo=None, microsecond=0).isoformat() + "Z"


def canonical_bytes(contract: Contract) -> bytes:
    """What each party signs: ASCII lines, each ending in LF (docs/contracts.md)."""
    _check(contract)
    lines = [
        DOMAIN,
        f"id={contract.id}",
        f"not_before={format_time(contract.not_before)}",
        f"not_after={format_time(contract.not_after)}",
    ]
    for name in ("price", "min_price", "max_price"):
        value = getattr(contract, name)
        if value is not None:
            lines.append(f"{name}={_decimal(value)}")
    for p in contract.parties:
        lines.append(f"participant={p.name} {p.public_key.hex()} {','.join(p.accepts)}")
    return ("\n".join(lines) + "\n").encode("ascii")


def _raw(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign(contract: Contract, private_key: Ed25519PrivateKey) -> Contract:
    """The contract with the signature of the party ``private_key`` belongs to added."""
    _check(contract)
    mine = _raw(private_key)
    parties = list(contract.parties)
    for i, p in enumerate(parties):
        if p.public_key == mine:
            parties[i] = replace(p, signature=private_key.sign(canonical_bytes(contract)))
            return replace(contract, parties=(parties[0], parties[1]))
    raise ContractError(
        "wrong-key",
        f"{contract.label}: wrong key: the signing key is neither {contract.names[0]}'s nor "
        f"{contract.names[1]}'s public key in the contract",
    )


def _signed_by(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def verify(
    contract: Contract, now: datetime, *, known_keys: Mapping[str, bytes] | None = None
) -> None:
    """Raise ``ContractError`` unless the contract is well formed, valid at ``now`` and signed
    by both parties over its canonical bytes.

    ``known_keys`` (participant name -> raw public key) are keys trusted from elsewhere (your
    own, a trust directory): a party whose key in the contract differs is refused, since anyone
    can write a contract that puts their own key under someone else's name.
    """
    if now.utcoffset() is None:
        raise ValueError("now must be an aware datetime (UTC)")
    _check(contract)
    label = contract.label
    keys = known_keys or {}
    for p in contract.parties:
        known = keys.get(p.name)
        if known is not None and known != p.public_key:
            raise ContractError(
                "wrong-key",
                f"{label}: wrong key: participant {p.name}'s key in the contract "
                f"({p.public_key.hex()[:16]}...) is not its known key ({known.hex()[:16]}...)",
            )
        owner = next((n for n, k in keys.items() if k == p.public_key and n != p.name), None)
        if owner is not None:
            raise ContractError(
                "wrong-key",
                f"{label}: wrong key: participant {p.name}'s key in the contract "
                f"({p.public_key.hex()[:16]}...) is participant {owner}'s known key",
            )
    if now < contract.not_before:
        raise ContractError(
            "not-yet-valid",
            f"{label} between {' and '.join(contract.names)} is not yet valid: "
            f"it starts at {format_time(contract.not_before)}",
        )
    if now >= contract.not_after:
        raise ContractError(
            "expired",
            f"{label} between {' and '.join(contract.names)} expired at "
            f"{format_time(contract.not_after)}",
        )
    unsigned = [p.name for p in contract.parties if p.signature is None]
    if unsigned:
        signed = [p.name for p in contract.parties if p.signature is not None]
        by = f"signed by {signed[0]} only" if signed else "signed by neither party"
        raise ContractError(
            "unsigned",
            f"{label}: not signed by both parties: {by}; {' and '.join(unsigned)} must sign it "
            "(`peer contract sign FILE --key KEYFILE`)",
        )
    message = canonical_bytes(contract)
    for p in contract.parties:
        assert p.signature is not None
        if _signed_by(p.public_key, p.signature, message):
            continue
        other = contract.other(p.name)
        assert other is not None
        if _signed_by(other.public_key, p.signature, message):
            raise ContractError(
                "wrong-key",
                f"{label}: wrong key: the signature under participant {p.name} was made with "
                f"{other.name}'s key, not {p.name}'s",
            )
        raise ContractError(
            "altered",
            f"{label}: participant {p.name}'s signature does not match the contract: it was "
            f"altered after {p.name} signed it, or signed with a key other than {p.name}'s",
        )


# -- the TOML file -----------------------------------------------------------------------------


class _Zulu(datetime):
    """tomli_w writes ``str(datetime)``, '2026-06-01 00:00:00+00:00'; this writes the usual
    RFC 3339 form, '2026-06-01T00:00:00Z' (both are TOML and parse to the same time)."""

    def __str__(self) -> str:
        return format_time(self)

    @classmethod
    def of(cls, t: datetime) -> _Zulu:
        return cls.combine(t.date(), t.timetz())


def dumps(contract: Contract) -> str:
    """The contract as TOML (the layout of docs/contracts.md)."""
    top: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "id": contract.id,
        "not_before": _Zulu.of(contract.not_before),
        "not_after": _Zulu.of(contract.not_after),
    }
    for name in ("price", "min_price", "max_price"):
        if getattr(contract, name) is not None:
            top[name] = getattr(contract, name)
    parties = []
    for p in contract.parties:
        table: dict[str, Any] = {
            "name": p.name,
            "public_key": p.public_key.hex(),
            "accepts": list(p.accepts),
        }
        if p.signature is not None:
            table["signature"] = p.signature.hex()
        parties.append(table)
    top["participant"] = parties
    header = "# fedstream contract (docs/contracts.md); sign with `peer contract sign`\n"
    return header + tomli_w.dumps(top)


def dump(contract: Contract, path: Path) -> None:
    """Write the contract to ``path`` atomically (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(dumps(contract), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path) -> Contract:
    """Read and parse a contract file (at most ``MAX_FILE_BYTES``); no signature checks."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ContractError("unreadable", f"contract file {path}: {exc.strerror or exc}") from exc
    return loads(data, source=str(path))


def loads(data: bytes, *, source: str = "<contract>") -> Contract:
    """Parse a contract from TOML bytes; anything but a well-formed contract is refused."""
    if len(data) > MAX_FILE_BYTES:
        raise _fail(source, f"larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _fail(source, "not UTF-8 text") from exc
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        raise _fail(source, f"not TOML: {exc}") from exc
    return _from_doc(doc, source)


def _from_doc(doc: dict[str, Any], source: str) -> Contract:
    contract_id = doc.get("id")
    # Only a well-formed id or name goes into a message: no escapes from hostile files.
    valid_id = isinstance(contract_id, str) and _ID.fullmatch(contract_id)
    where = f"contract {contract_id} ({source})" if valid_id else source
    keys = set(doc)
    if missing := _REQUIRED_TOP - keys:
        raise _fail(where, f"missing fields {sorted(missing)}")
    if extra := keys - _TOP_FIELDS - {"participant"}:
        raise _fail(where, f"unknown fields {_shown(extra)}")
    if type(doc["version"]) is not int or doc["version"] != FORMAT_VERSION:
        raise _fail(where, f"version must be {FORMAT_VERSION}")
    if not isinstance(contract_id, str):
        raise _fail(where, "id must be a string")
    raw_parties = doc["participant"]
    if not isinstance(raw_parties, list) or len(raw_parties) != 2:
        raise _fail(where, "there must be exactly two [[participant]] tables")
    parties = (_party(raw_parties[0], where), _party(raw_parties[1], where))
    for name in ("not_before", "not_after"):
        if not isinstance(doc[name], datetime):
            raise _fail(where, f"{name} must be a TOML date-time in UTC, e.g. 2025-06-01T00:00:00Z")
    contract = Contract(
        id=contract_id,
        parties=parties,
        not_before=doc["not_before"],
        not_after=doc["not_after"],
        price=_price_or_none(doc.get("price"), f"{where}: price"),
        min_price=_price_or_none(doc.get("min_price"), f"{where}: min_price"),
        max_price=_price_or_none(doc.get("max_price"), f"{where}: max_price"),
        source=source,
    )
    _check(contract)
    return contract


def _party(raw: object, where: str) -> Party:
    if not isinstance(raw, dict):
        raise _fail(where, "each [[participant]] must be a table")
    name = raw.get("name")
    who = (
        f"{where}: participant {name}" if isinstance(name, str) and NAME.fullmatch(name) else where
    )
    if missing := _REQUIRED_PARTY - set(raw):
        raise _fail(who, f"missing fields {sorted(missing)}")
    if extra := set(raw) - _PARTY_FIELDS:
        raise _fail(who, f"unknown fields {_shown(extra)}")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise _fail(where, f"participant name {repr(name)[:80]} is not valid ({_NAME_RULE})")
    key = raw["public_key"]
    if not isinstance(key, str) or not _HEX_KEY.fullmatch(key):
        raise _fail(who, "public_key must be 64 lowercase hex digits (raw Ed25519 key)")
    signature = raw.get("signature")
    if signature is not None and (
        not isinstance(signature, str) or not _HEX_SIG.fullmatch(signature)
    ):
        raise _fail(who, "signature must be 128 lowercase hex digits (raw Ed25519 signature)")
    accepts = raw["accepts"]
    if not isinstance(accepts, list) or len(accepts) > len(BOX_TYPES) + 1:
        raise _fail(who, "accepts must be a list of box types")
    return Party(
        name=name,
        public_key=bytes.fromhex(key),
        accepts=_accepts(accepts, name),
        signature=None if signature is None else bytes.fromhex(signature),
    )
