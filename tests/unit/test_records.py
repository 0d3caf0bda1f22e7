"""overlay.records: the signed record codec, verification, replacement and selection rules."""

from __future__ import annotations

import contextlib
import hashlib
import time

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kademlia.utils import digest

from overlay.records import (
    DOMAIN,
    MAX_EXPIRY_S,
    MAX_RECORD_BYTES,
    Record,
    RecordError,
    all_of,
    allow_all,
    decode,
    dht_key,
    encode,
    select,
    self_certifying_peer_policy,
    sign_record,
    supersedes,
    verify,
)

NOW = 1_700_000_000.0
EXPIRY = int(NOW) + 3600
ALICE = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
MALLORY = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def raw_pub(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def rec(
    key: str = "stream:clicks",
    value: bytes = b"v1",
    seq: int = 1,
    signer: Ed25519PrivateKey = ALICE,
    expiry: int = EXPIRY,
) -> Record:
    return sign_record(key, value, signer, seq, expiry)


# -- codec ------------------------------------------------------------------------------------


def test_round_trip_and_exact_bytes() -> None:
    record = rec(value=b"\x00\xff" * 10, seq=2**64 - 1)
    raw = encode(record)
    assert decode(raw) == record
    # The wire form is a plain msgpack map another implementation can read.
    assert msgpack.unpackb(raw) == {
        "k": "stream:clicks",
        "v": record.value,
        "o": raw_pub(ALICE),
        "s": 2**64 - 1,
        "e": EXPIRY,
        "sig": record.sig,
    }
    # The signature checks with cryptography and msgpack alone, as documented.
    Ed25519PublicKey.from_public_bytes(record.owner).verify(
        record.sig,
        DOMAIN + msgpack.packb([record.key, record.value, record.owner, record.seq, record.expiry]),
    )
    assert DOMAIN == b"fedstream/dht-record/v1\x00"


def test_dht_key_is_the_librarys_digest() -> None:
    assert (
        dht_key("stream:clicks")
        == digest("stream:clicks")
        == hashlib.sha1(b"stream:clicks").digest()
    )


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "malformed record"),
        (b"\xc1", "malformed record"),
        (msgpack.packb([1, 2, 3]), "malformed record"),
        (msgpack.packb({"k": "a:b"}), "malformed record"),
        (b"\x00" * (MAX_RECORD_BYTES + 1), "record too large"),
    ],
)
def test_decode_refuses_junk(raw: bytes, reason: str) -> None:
    with pytest.raises(RecordError) as info:
        decode(raw)
    assert info.value.reason == reason


def _fields(record: Record) -> dict[str, object]:
    return {
        "k": record.key,
        "v": record.value,
        "o": record.owner,
        "s": record.seq,
        "e": record.expiry,
        "sig": record.sig,
    }


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"k": b"stream:clicks"}, "key is a str, not bytes"),
        ({"v": "text"}, "value is str"),
        ({"o": b"short"}, "owner key is 5 bytes"),
        ({"s": True}, "sequence is bool"),
        ({"s": -1}, "sequence is not a uint64"),
        ({"e": 1.5}, "expiry is float"),
        ({"sig": b"x" * 63}, "signature is 63 bytes"),
        ({"k": "NoNamespace"}, "not an ASCII 'namespace:name'"),
        ({"k": "stream:has space"}, "not an ASCII 'namespace:name'"),
        ({"k": "stream:" + "x" * 300}, "malformed record"),
        ({"extra": 1}, "max_map_len"),
    ],
)
def test_decode_names_what_is_wrong(change: dict[str, object], words: str) -> None:
    fields = _fields(rec()) | change
    with pytest.raises(RecordError, match=words):
        decode(msgpack.packb(fields))


def test_decode_refuses_missing_field_trailing_bytes_and_other_encodings() -> None:
    fields = _fields(rec())
    del fields["sig"]
    with pytest.raises(RecordError, match="fields"):
        decode(msgpack.packb(fields))
    raw = encode(rec())
    with pytest.raises(RecordError, match="1 bytes after"):
        decode(raw + b"\x00")
    # Same content, fields in another order: not the canonical form.
    reordered = dict(reversed(list(_fields(rec()).items())))
    with pytest.raises(RecordError, match="canonical"):
        decode(msgpack.packb(reordered))
    # A repeated key.
    body = msgpack.packb(_fields(rec()))
    repeated = b"\x87" + body[1:] + msgpack.packb("s") + msgpack.packb(9)
    with pytest.raises(RecordError, match="malformed"):
        decode(repeated)


def test_sign_record_refuses_bad_input() -> None:
    with pytest.raises(RecordError, match="too large"):
        rec(value=b"x" * MAX_RECORD_BYTES)
    with pytest.raises(RecordError, match="bad key"):
        rec(key="nocolon")
    with pytest.raises(RecordError, match="not bytes"):
        sign_record("a:b", "text", ALICE, 1, EXPIRY)  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="uint64"):
        rec(seq=2**64)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=MAX_RECORD_BYTES + 16))
def test_decode_raises_only_record_error_on_arbitrary_bytes(data: bytes) -> None:
    with contextlib.suppress(RecordError):
        decode(data)


_any_field = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=20),
    st.integers(-(2**63), 2**64 - 1),
    st.booleans(),
    st.floats(),
    st.none(),
    st.lists(st.integers(0, 1000), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.dictionaries(
        st.sampled_from(["k", "v", "o", "s", "e", "sig", "x"]), _any_field, max_size=7
    )
)
def test_decode_raises_only_record_error_on_record_shaped_maps(fields: dict[str, object]) -> None:
    with contextlib.suppress(RecordError):
        decode(msgpack.packb(fields))


_VALID = encode(rec(value=b"payload" * 5))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    at=st.integers(0, len(_VALID) - 1),
    cut=st.integers(0, len(_VALID)),
    insert=st.binary(max_size=8),
    mode=st.sampled_from(["flip", "truncate", "insert", "replace"]),
    bit=st.integers(0, 7),
)
def test_mutated_records_decode_or_raise_record_error(
    at: int, cut: int, insert: bytes, mode: str, bit: int
) -> None:
    data = bytearray(_VALID)
    if mode == "flip":
        data[at] ^= 1 << bit
    elif mode == "truncate":
        data = data[:cut]
    elif mode == "insert":
        data[at:at] = insert
    else:
        data[at : at + len(insert)] = insert
    try:
        record = decode(bytes(data))
    except RecordError:
        return
    if bytes(data) != _VALID:
        # Whatever still parses must fail verification: every byte is signed or structural.
        with pytest.raises(RecordError):
            verify(record, dht_key("stream:clicks"), NOW)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.from_regex(r"[a-z][a-z0-9]{0,8}:[!-~]{1,40}", fullmatch=True),
    value=st.binary(max_size=512),
    seq=st.integers(0, 2**64 - 1),
    lifetime=st.integers(1, MAX_EXPIRY_S),
)
def test_round_trip_verifies(key: str, value: bytes, seq: int, lifetime: int) -> None:
    record = sign_record(key, value, ALICE, seq, int(NOW) + lifetime)
    assert decode(encode(record)) == record
    verify(decode(encode(record)), dht_key(key), NOW)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_flipped_bit_fails(data: st.DataObject) -> None:
    raw = bytearray(_VALID)
    index = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[index // 8] ^= 1 << (index % 8)
    with pytest.raises(RecordError):
        verify(decode(bytes(raw)), dht_key("stream:clicks"), NOW)


# -- verify -----------------------------------------------------------------------------------


def test_verify_checks_key_expiry_and_signature() -> None:
    record = rec()
    verify(record, dht_key(record.key), NOW)
    verify(record, None, NOW)
    with pytest.raises(RecordError, match="wrong dht key"):
        verify(record, dht_key("stream:other"), NOW)
    with pytest.raises(RecordError, match="expired"):
        verify(record, None, EXPIRY)
    with pytest.raises(RecordError, match="too far ahead"):
        verify(rec(expiry=int(NOW) + MAX_EXPIRY_S + 3600), None, NOW)
    forged = Record(record.key, b"evil", record.owner, record.seq, record.expiry, record.sig)
    with pytest.raises(RecordError, match="bad signature") as info:
        verify(forged, None, NOW)
    assert info.value.reason == "bad signature"
    assert not info.value.retriable
    not_a_key = Record(record.key, b"v1", b"\xff" * 32, 1, EXPIRY, record.sig)
    with pytest.raises(RecordError, match="bad signature"):
        verify(not_a_key, None, NOW)


# -- replacement ------------------------------------------------------------------------------


def test_supersedes() -> None:
    v1, v2 = rec(seq=1), rec(value=b"v2", seq=2)
    assert supersedes(v2, v1, NOW) is None
    assert supersedes(v1, v2, NOW) == "stale sequence"
    assert supersedes(v1, v1, NOW) is None  # a refresh
    assert supersedes(rec(value=b"other", seq=1), v1, NOW) == "sequence conflict"
    theirs = rec(value=b"x", seq=99, signer=MALLORY)
    assert supersedes(theirs, v1, NOW) == "owner pinned"
    assert supersedes(theirs, v1, EXPIRY + 1) == "owner pinned"  # expiry does not unpin
    assert supersedes(rec(key="stream:other"), v1, NOW) == "different key"


def test_lease_namespace_changes_owner_only_after_expiry() -> None:
    held = rec(key="place:clicks", seq=50)
    taker = rec(key="place:clicks", seq=1, signer=MALLORY, expiry=EXPIRY + 60)
    assert supersedes(taker, held, NOW) == "owner pinned"
    assert supersedes(taker, held, EXPIRY) is None


# -- selection --------------------------------------------------------------------------------


def test_select_highest_seq_of_majority_or_pinned_owner() -> None:
    v1, v2, v3 = rec(seq=1), rec(value=b"2", seq=2), rec(value=b"3", seq=3)
    forged = rec(value=b"evil", seq=10**9, signer=MALLORY)
    assert select([], None) is None
    assert select([v1, v3, v2], None) == v3  # newest, not most common
    assert select([v1, v1, v1, v2], None) == v2
    assert select([forged, v1, v2], None) == v2  # ALICE is in two replies of three
    assert select([forged, v1], None) == forged  # a tie: the first seen owner
    assert select([forged, v1], raw_pub(ALICE)) == v1
    assert select([forged], raw_pub(ALICE)) is None


# -- policies ---------------------------------------------------------------------------------


def test_policies() -> None:
    own_id = hashlib.sha1(raw_pub(ALICE)).hexdigest()
    assert allow_all(rec()) is None
    assert self_certifying_peer_policy(rec(key=f"peer:{own_id}")) is None
    assert self_certifying_peer_policy(rec(key=f"peer:{own_id}", signer=MALLORY)) is not None
    assert self_certifying_peer_policy(rec(key="stream:x", signer=MALLORY)) is None
    no_streams = all_of(allow_all, lambda r: "no" if r.key.startswith("stream:") else None)
    assert no_streams(rec()) == "no"
    assert no_streams(rec(key="schema:x")) is None


def test_real_clock_record_verifies() -> None:
    now = time.time()
    verify(rec(expiry=int(now) + 60), None, now)
