"""Read capabilities (peer.fetch.capability): what a token allows, and every refusal with its
reason. Time comes from the caller (a ManualClock); no sockets."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.fetch.capability import (
    DOMAIN,
    Capability,
    CapabilityCheck,
    CapabilityRefused,
    FetchKey,
    fetch_key_path,
)
from peer.testing.manual_clock import ManualClock

KEY = FetchKey.generate()
OTHER = FetchKey.generate()
CHECK = CapabilityCheck(KEY.public)
SPOOL = "/data/spools/s1"
NOW = 1_700_000_000.0
TTL_S = 60.0

spools = st.text(st.characters(codec="utf-8"), min_size=1, max_size=200)
offsets = st.integers(0, 2**40)


def refusal(token: object, *, spool: str = SPOOL, offset: int = 5, now: float = NOW) -> str:
    with pytest.raises(CapabilityRefused) as caught:
        CHECK.check(token, spool=spool, offset=offset, now=now)
    assert caught.value.code == "unauthorized"
    assert caught.value.reason in caught.value.message
    return caught.value.reason


@given(spool=spools, first=offsets, length=st.integers(0, 1000), at=st.integers(0, 1000))
def test_a_minted_token_allows_each_file_of_its_range_until_it_expires(
    spool: str, first: int, length: int, at: int
) -> None:
    clock = ManualClock(NOW)
    token = KEY.mint(spool, first, first + length, now=clock(), ttl_s=TTL_S)
    offset = first + min(at, length)
    allowed = CHECK.check(token, spool=spool, offset=offset, now=clock.advance(TTL_S - 0.002))
    assert (allowed.spool, allowed.first, allowed.last) == (spool, first, first + length)
    clock.advance(0.002)
    with pytest.raises(CapabilityRefused, match="expired") as caught:
        CHECK.check(token, spool=spool, offset=offset, now=clock())
    assert caught.value.reason == "expired"


@given(index=st.integers(0, 63), flip=st.integers(1, 255))
def test_a_token_with_any_signature_byte_changed_is_forged(index: int, flip: int) -> None:
    token = bytearray(KEY.mint(SPOOL, 0, 9, now=NOW, ttl_s=TTL_S))
    token[index] ^= flip
    assert refusal(bytes(token)) == "forged"


@given(data=st.data())
def test_a_token_with_any_body_byte_changed_is_refused(data: st.DataObject) -> None:
    token = bytearray(KEY.mint(SPOOL, 0, 9, now=NOW, ttl_s=TTL_S))
    index = data.draw(st.integers(64, len(token) - 1))
    token[index] ^= data.draw(st.integers(1, 255))
    assert refusal(bytes(token)) in {"malformed", "other-key", "forged"}


def test_a_body_rewritten_and_signed_by_another_key_is_forged() -> None:
    """An attacker with their own key claims ours (key id) and a wider range."""
    body = Capability(KEY.key_id, SPOOL, 0, 2**40, int((NOW + 3600) * 1000)).body()
    token = OTHER.private.sign(DOMAIN + body) + body
    assert refusal(token) == "forged"


def test_a_signature_without_the_domain_tag_is_forged() -> None:
    body = Capability(KEY.key_id, SPOOL, 0, 9, int((NOW + 60) * 1000)).body()
    assert refusal(KEY.private.sign(body) + body) == "forged"


@given(spool=spools, offset=offsets)
def test_a_token_of_another_peer_is_refused_naming_both_keys(spool: str, offset: int) -> None:
    token = OTHER.mint(spool, offset, offset, now=NOW, ttl_s=TTL_S)
    with pytest.raises(CapabilityRefused) as caught:
        CHECK.check(token, spool=spool, offset=offset, now=NOW)
    assert caught.value.reason == "other-key"
    assert OTHER.key_id.hex() in caught.value.message
    assert KEY.key_id.hex() in caught.value.message


@given(spool=spools, other=spools)
def test_a_token_for_another_spool_is_refused(spool: str, other: str) -> None:
    token = KEY.mint(spool, 0, 9, now=NOW, ttl_s=TTL_S)
    if other == spool:
        assert CHECK.check(token, spool=other, offset=3, now=NOW).spool == spool
    else:
        assert refusal(token, spool=other, offset=3) == "wrong-spool"


@given(
    first=offsets, length=st.integers(0, 100), outside=st.integers(1, 2**20), above=st.booleans()
)
def test_an_offset_outside_the_range_is_refused(
    first: int, length: int, outside: int, above: bool
) -> None:
    token = KEY.mint(SPOOL, first, first + length, now=NOW, ttl_s=TTL_S)
    offset = first + length + outside if above else first - outside
    if offset < 0:
        offset = first + length + outside
    assert refusal(token, offset=offset) == "out-of-range"


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(token=st.one_of(st.binary(max_size=5000), st.text(max_size=50), st.integers(), st.none()))
def test_malformed_tokens_are_refused_and_nothing_else_is_raised(token: object) -> None:
    assert refusal(token) in {"malformed", "other-key", "forged"}


@pytest.mark.parametrize(
    "fields",
    [
        [2, KEY.key_id, SPOOL, 0, 9, 10**15],  # another version
        [1, KEY.key_id[:4], SPOOL, 0, 9, 10**15],  # a short key id
        [1, KEY.key_id, "", 0, 9, 10**15],  # no spool
        [1, KEY.key_id, SPOOL, -1, 9, 10**15],  # a negative offset
        [1, KEY.key_id, SPOOL, 9, 0, 10**15],  # an empty range
        [1, KEY.key_id, SPOOL, 0, 9, 1.5e15],  # a float expiry
        [1, KEY.key_id, SPOOL, True, 9, 10**15],  # a bool offset
        [1, KEY.key_id, SPOOL, 0, 9],  # a field missing
        {"v": 1},  # not an array
    ],
)
def test_well_signed_bodies_of_the_wrong_shape_are_malformed(fields: object) -> None:
    body = msgpack.packb(fields, use_bin_type=True)
    assert refusal(KEY.private.sign(DOMAIN + body) + body) == "malformed"


def test_minting_refuses_empty_ranges_and_lifetimes() -> None:
    with pytest.raises(ValueError, match="first <= last"):
        KEY.mint(SPOOL, 5, 4, now=NOW, ttl_s=TTL_S)
    with pytest.raises(ValueError, match="ttl_s"):
        KEY.mint(SPOOL, 0, 4, now=NOW, ttl_s=0)
    with pytest.raises(ValueError, match="too long"):
        KEY.mint("/" + "x" * 5000, 0, 4, now=NOW, ttl_s=TTL_S)


def test_the_fetch_key_is_made_once_private_and_never_pickled(tmp_path: Path) -> None:
    made = FetchKey.load_or_create(tmp_path)
    path = fetch_key_path(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    again = FetchKey.load_or_create(tmp_path)
    assert again.public == made.public  # a restart keeps the key: its capabilities stay valid
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(made)
    assert made.key_id.hex() in repr(made) and "private" not in repr(made).lower()


def test_a_missing_or_broken_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fetch key"):
        FetchKey.load(tmp_path / "nothing.key")
    broken = tmp_path / "broken.key"
    broken.write_text("not a key")
    with pytest.raises(ValueError, match=r"broken\.key"):
        FetchKey.load(broken)
