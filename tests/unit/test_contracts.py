"""Contracts: the file format, canonical bytes, signatures, every refusal, and the book."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import contract as ct
from contracts.book import ContractBook
from contracts.contract import Contract, ContractError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
NOW = datetime(2026, 7, 1, tzinfo=UTC)
A_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
B_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64)))
C_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(64, 96)))


def raw(key: Ed25519PrivateKey) -> bytes:
    from overlay.identity import raw_public

    return raw_public(key)


def make(a: str = "acme", b: str = "mit.edu", **kw: Any) -> Contract:
    kw.setdefault("price", 2.5)
    kw.setdefault("not_before", datetime(2026, 6, 1, tzinfo=UTC))
    kw.setdefault("not_after", datetime(2026, 12, 1, tzinfo=UTC))
    kw.setdefault("contract_id", "c1")
    a_key = kw.pop("a_key", raw(A_KEY))
    b_key = kw.pop("b_key", raw(B_KEY))
    return ct.create(a, a_key, b, b_key, **kw)


def signed(**kw: Any) -> Contract:
    return ct.sign(ct.sign(make(**kw), A_KEY), B_KEY)


def refusal(contract: Contract, now: datetime = NOW, **kw: Any) -> ContractError:
    with pytest.raises(ContractError) as info:
        ct.verify(contract, now, **kw)
    return info.value


def parse_error(text: str) -> ContractError:
    with pytest.raises(ContractError) as info:
        ct.loads(text.encode())
    return info.value


# -- round trip and canonical bytes ------------------------------------------------------------


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    contract = signed(min_price=2, max_price=3.5, price=None, a_accepts=["map", "filter"])
    ct.dump(contract, tmp_path / "c.toml")
    back = ct.load(tmp_path / "c.toml")
    assert back == contract
    assert back.source == str(tmp_path / "c.toml")
    assert back.parties[0].accepts == ("filter", "map")
    ct.verify(back, NOW)
    assert list(tmp_path.iterdir()) == [tmp_path / "c.toml"]  # no temporary file left


def test_the_file_uses_rfc3339_utc_times() -> None:
    text = ct.dumps(make())
    assert "not_before = 2026-06-01T00:00:00Z\n" in text
    assert "not_after = 2026-12-01T00:00:00Z\n" in text


def test_layout_does_not_matter_but_values_do() -> None:
    contract = signed(a_accepts=["map", "filter"])
    a, b = contract.parties
    assert a.signature is not None and b.signature is not None
    reordered = f"""
[[participant]]
accepts = ["map", "filter"]   # another order, same set
signature = "{a.signature.hex()}"
public_key = "{a.public_key.hex()}"
name = "acme"
[[participant]]
name = "mit.edu"
public_key = "{b.public_key.hex()}"
accepts = ["any"]
signature = "{b.signature.hex()}"
"""
    head = 'price = 2.5\nnot_after = 2026-12-01T00:00:00+00:00\nid = "c1"\n'
    head += "version = 1\nnot_before = 2026-06-01T00:00:00Z\n"
    ct.verify(ct.loads((head + reordered).encode()), NOW)
    cheaper = head.replace("price = 2.5", "price = 2")
    assert refusal(ct.loads((cheaper + reordered).encode())).reason == "altered"


def test_integer_and_float_prices_are_the_same_value() -> None:
    assert ct.canonical_bytes(make(price=2)) == ct.canonical_bytes(make(price=2.0))


def test_canonical_bytes_exactly() -> None:
    contract = make(
        min_price=2,
        max_price=3.5,
        price=None,
        a_accepts=["map", "filter"],
        contract_id="3f1c9a0e5b7d42c8a6e0f1b2c3d4e5f6",
    )
    assert ct.canonical_bytes(contract) == (
        b"fedstream-contract-v1\n"
        b"id=3f1c9a0e5b7d42c8a6e0f1b2c3d4e5f6\n"
        b"not_before=2026-06-01T00:00:00Z\n"
        b"not_after=2026-12-01T00:00:00Z\n"
        b"min_price=2.0\n"
        b"max_price=3.5\n"
        b"participant=acme 03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
        b" filter,map\n"
        b"participant=mit.edu 29acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd7"
        b" any\n"
    )


@pytest.mark.parametrize(
    ("price", "text"),
    [(2.5, "2.5"), (3, "3.0"), (0.00001, "0.00001"), (1e11, "100000000000.0"), (0, "0.0")],
)
def test_prices_are_written_without_exponent(price: float, text: str) -> None:
    assert f"\nprice={text}\n".encode() in ct.canonical_bytes(make(price=price))


def test_canonical_bytes_leave_signatures_out() -> None:
    assert ct.canonical_bytes(make()) == ct.canonical_bytes(signed())


def test_the_example_in_the_docs_verifies_and_its_canonical_bytes_are_the_docs() -> None:
    text = DOCS.read_text()
    example = re.search(r"```toml\n(.*?)```", text, re.S)
    canonical = re.search(r"```\n(fedstream-contract-v1\nid=\w.*?)```", text, re.S)
    assert example and canonical
    contract = ct.loads(example.group(1).encode())
    ct.verify(contract, NOW)
    assert ct.canonical_bytes(contract) == canonical.group(1).encode()


# -- signing -----------------------------------------------------------------------------------


def test_sign_adds_the_signature_of_the_key_owner_only() -> None:
    half = ct.sign(make(), B_KEY)
    assert half.parties[0].signature is None
    assert half.parties[1].signature is not None


def test_sign_refuses_a_key_of_neither_party() -> None:
    with pytest.raises(ContractError, match="wrong key") as info:
        ct.sign(make(), C_KEY)
    assert info.value.reason == "wrong-key"
    assert "contract c1" in info.value.message


# -- every refusal -----------------------------------------------------------------------------


def test_valid_from_not_before_until_just_before_not_after() -> None:
    contract = signed()
    ct.verify(contract, contract.not_before)
    ct.verify(contract, contract.not_after - timedelta(seconds=1))


def test_expired() -> None:
    contract = signed()
    error = refusal(contract, contract.not_after)
    assert error.reason == "expired"
    assert "contract c1 between acme and mit.edu expired at 2026-12-01T00:00:00Z" in str(error)


def test_not_yet_valid() -> None:
    error = refusal(signed(), datetime(2026, 5, 31, 23, 59, 59, tzinfo=UTC))
    assert error.reason == "not-yet-valid"
    assert "starts at 2026-06-01T00:00:00Z" in str(error)


def test_signed_by_one_party_only() -> None:
    error = refusal(ct.sign(make(), A_KEY))
    assert error.reason == "unsigned"
    assert "signed by acme only; mit.edu must sign it" in str(error)
    assert "signed by neither party" in str(refusal(make()))


def test_altered_after_signing() -> None:
    good = signed()
    forged = Contract(**{**good.__dict__, "price": 0.5})
    error = refusal(forged)
    assert error.reason == "altered"
    assert "participant acme's signature does not match" in str(error)


def test_signed_with_the_other_partys_key() -> None:
    contract = make()
    by_b = ct.sign(contract, B_KEY).parties[1].signature
    a, b = contract.parties
    forged = Contract(
        **{**contract.__dict__, "parties": (a.__class__(**{**a.__dict__, "signature": by_b}), b)}
    )
    forged = ct.sign(forged, B_KEY)
    error = refusal(forged)
    assert error.reason == "wrong-key"
    assert "made with mit.edu's key, not acme's" in str(error)


def test_a_party_key_other_than_the_known_one() -> None:
    # C signs a contract that says "acme" with C's key: self-consistent, but not acme's key.
    forged = ct.sign(ct.sign(make(a_key=raw(C_KEY)), C_KEY), B_KEY)
    ct.verify(forged, NOW)
    error = refusal(forged, known_keys={"acme": raw(A_KEY)})
    assert error.reason == "wrong-key"
    assert "participant acme's key in the contract" in str(error)


@pytest.mark.parametrize("same", ["name", "key"])
def test_self_contract(same: str) -> None:
    with pytest.raises(ContractError) as info:
        if same == "name":
            make(b="acme")
        else:
            make(b_key=raw(A_KEY))
    assert info.value.reason == "self-contract"
    assert f"same {'name' if same == 'name' else 'public key'}" in info.value.message


def test_verify_needs_an_aware_now() -> None:
    with pytest.raises(ValueError, match="aware"):
        ct.verify(signed(), datetime(2026, 7, 1))


def good_doc() -> dict[str, Any]:
    contract = signed()
    doc: dict[str, Any] = {
        "version": 1,
        "id": contract.id,
        "not_before": contract.not_before,
        "not_after": contract.not_after,
        "price": contract.price,
        "participant": [
            {
                "name": p.name,
                "public_key": p.public_key.hex(),
                "accepts": list(p.accepts),
                "signature": (p.signature or b"").hex(),
            }
            for p in contract.parties
        ],
    }
    return doc


def with_change(path: tuple[Any, ...], value: Any) -> str:
    doc = good_doc()
    target = doc
    for part in path[:-1]:
        target = target[part]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return tomli_w.dumps(doc)


DELETE = object()


def test_the_unchanged_doc_is_valid() -> None:
    ct.verify(ct.loads(tomli_w.dumps(good_doc()).encode()), NOW)


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        (("version",), DELETE, "missing fields ['version']"),
        (("id",), DELETE, "missing fields ['id']"),
        (("participant",), DELETE, "missing fields ['participant']"),
        (("participant", 0, "public_key"), DELETE, "participant acme: malformed: missing"),
        (("owner",), "me", "unknown fields ['owner']"),
        (("participant", 1, "note"), "hi", "unknown fields ['note']"),
        (("version",), 2, "version must be 1"),
        (("version",), True, "version must be 1"),
        (("version",), 1.0, "version must be 1"),
        (("id",), 7, "id must be a string"),
        (("id",), "", "id must be"),
        (("id",), "a b", "id must be"),
        (("not_before",), "2026-06-01T00:00:00Z", "not_before must be a TOML date-time"),
        (("not_before",), datetime(2026, 6, 1), "must be UTC"),
        (
            ("not_before",),
            datetime(2026, 6, 1, 2, tzinfo=timezone(timedelta(hours=2))),
            "must be UTC",
        ),
        (("not_before",), datetime(2026, 6, 1, 0, 0, 0, 5, tzinfo=UTC), "whole seconds"),
        (("not_after",), datetime(2026, 6, 1, tzinfo=UTC), "earlier than not_after"),
        (("price",), "2.5", "must be a number"),
        (("price",), True, "must be a number"),
        (("price",), -1, "from 0 to"),
        (("price",), -0.0, "from 0 to"),
        (("price",), float("nan"), "finite"),
        (("price",), float("inf"), "finite"),
        (("price",), 10**400, "at most"),
        (("price",), DELETE, "give a price"),
        (("min_price",), 1, "min_price and max_price come together"),
        (("participant",), [], "exactly two"),
        (("participant", 0), "acme", "must be a table"),
        (("participant", 0, "name"), "bad name", "'bad name' is not valid"),
        (("participant", 0, "name"), "mit.edu", "self-contract"),
        (("participant", 0, "public_key"), "AB" * 32, "lowercase hex"),
        (("participant", 0, "public_key"), "ab" * 31, "lowercase hex"),
        (("participant", 0, "signature"), "ab" * 63, "128 lowercase hex"),
        (("participant", 0, "signature"), 5, "128 lowercase hex"),
        (("participant", 0, "accepts"), "any", "list of box types"),
        (("participant", 0, "accepts"), [], "at least one"),
        (("participant", 0, "accepts"), ["map", "map"], "each box type once"),
        (("participant", 0, "accepts"), ["map", "sql"], "unknown box types ['sql']"),
        (("participant", 0, "accepts"), ["any", "map"], "must stand alone"),
        (("participant", 0, "accepts"), [1], "list of box types"),
    ],
)
def test_malformed(path: tuple[Any, ...], value: Any, words: str) -> None:
    error = parse_error(with_change(path, value))
    assert words in error.message
    assert error.reason == ("self-contract" if words == "self-contract" else "malformed")


def test_three_participants_and_range_errors() -> None:
    doc = good_doc()
    doc["participant"].append(dict(doc["participant"][0], name="third"))
    assert "exactly two" in parse_error(tomli_w.dumps(doc)).message
    doc = good_doc()
    del doc["price"]
    for fields, words in [
        ({"min_price": 3, "max_price": 2}, "must not exceed"),
        ({"price": 5, "min_price": 2, "max_price": 3}, "between min_price and max_price"),
    ]:
        assert words in parse_error(tomli_w.dumps({**doc, **fields})).message


def test_not_toml_not_utf8_too_large(tmp_path: Path) -> None:
    assert "not TOML" in parse_error("price = = 2").message
    with pytest.raises(ContractError, match="not UTF-8"):
        ct.loads(b"\xff\xfe")
    with pytest.raises(ContractError, match="larger than"):
        ct.loads(b"#" * (ct.MAX_FILE_BYTES + 1))
    with pytest.raises(ContractError, match=r"missing\.toml") as info:
        ct.load(tmp_path / "missing.toml")
    assert info.value.reason == "unreadable"


def test_messages_never_echo_hostile_names() -> None:
    error = parse_error(with_change(("id",), "\x1b[31mred"))
    assert "\x1b" not in error.message


# -- hostile files -----------------------------------------------------------------------------


def _parse_or_refuse(data: bytes) -> None:
    try:
        contract = ct.loads(data)
    except ContractError:
        return
    ct.canonical_bytes(contract)  # whatever parses is usable
    with contextlib.suppress(ContractError):
        ct.verify(contract, NOW)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_hostile_bytes(data: bytes) -> None:
    _parse_or_refuse(data)


toml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=140)
    | st.datetimes(timezones=st.none() | st.timezones())
    | st.sampled_from(["any", "map", "acme", "mit.edu", "ab" * 32, "ab" * 64, "c1"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)
paths = st.sampled_from(
    [
        ("version",),
        ("id",),
        ("not_before",),
        ("not_after",),
        ("price",),
        ("min_price",),
        ("max_price",),
        ("participant",),
        ("participant", 0),
        ("participant", 1, "name"),
        ("participant", 0, "public_key"),
        ("participant", 1, "signature"),
        ("participant", 0, "accepts"),
        ("extra",),
    ]
)


def _clean(value: Any) -> Any:
    # tomli_w has no null; a None drops the field instead.
    if isinstance(value, list):
        return [_clean(v) for v in value if v is not None]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    return value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(paths, toml_values), min_size=1, max_size=4))
def test_hostile_fields(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    doc = good_doc()
    for path, value in changes:
        target: Any = doc
        try:
            for part in path[:-1]:
                target = target[part]
            if value is None:
                del target[path[-1]]
            else:
                target[path[-1]] = _clean(value)
        except (KeyError, IndexError, TypeError):
            continue
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):
        return  # not expressible in TOML (tomli_w refuses it)
    _parse_or_refuse(text.encode())


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="[]{}=\",.\n #abcxyz0123:-TZ'", max_size=400))
def test_hostile_toml_syntax(text: str) -> None:
    _parse_or_refuse(text.encode())


def test_deep_nesting_is_refused() -> None:
    data = b"x = " + b"[" * 30_000 + b"]" * 30_000
    with pytest.raises(ContractError):
        ct.loads(data)


# -- covers and price_range --------------------------------------------------------------------


def test_covers_reads_what_the_other_party_accepts() -> None:
    contract = make(a_accepts=["join"], b_accepts=["filter", "map"])
    assert ct.covers(contract, "acme", "map")  # mit.edu runs maps for acme
    assert not ct.covers(contract, "acme", "join")
    assert ct.covers(contract, "mit.edu", "join")  # acme runs joins for mit.edu
    assert not ct.covers(contract, "mit.edu", "map")
    assert not ct.covers(contract, "stranger", "map")
    anything = make()
    assert all(ct.covers(anything, "acme", kind) for kind in ct.BOX_TYPES)
    with pytest.raises(ValueError, match="unknown box type"):
        ct.covers(contract, "acme", "sql")


def test_price_range() -> None:
    assert ct.price_range(make(price=2.5)) == (2.5, 2.5)
    assert ct.price_range(make(price=None, min_price=1, max_price=4)) == (1.0, 4.0)
    assert ct.price_range(make(price=2, min_price=1, max_price=4)) == (1.0, 4.0)


def test_create_checks_its_arguments() -> None:
    with pytest.raises(ContractError, match="days must be positive"):
        make(not_after=None, days=0)
    with pytest.raises(ContractError, match="give a price"):
        make(price=None)
    with pytest.raises(ContractError, match="unknown box types"):
        make(a_accepts=["select"])
    start = datetime.now(UTC)
    fresh = ct.create("acme", raw(A_KEY), "mit.edu", raw(B_KEY), price=1, days=2)
    assert len(fresh.id) == 32
    assert fresh.not_after - fresh.not_before == timedelta(days=2)
    assert start - timedelta(seconds=1) <= fresh.not_before <= start + timedelta(seconds=1)


# -- the book ----------------------------------------------------------------------------------


def write(directory: Path, name: str, contract: Contract) -> None:
    ct.dump(contract, directory / name)


def test_book_keeps_valid_contracts_of_mine_and_says_why_others_are_refused(
    tmp_path: Path,
) -> None:
    d_key = Ed25519PrivateKey.from_private_bytes(bytes(range(96, 128)))
    write(tmp_path, "01-mit.toml", signed(contract_id="mit", price=3))
    write(
        tmp_path,
        "02-eth.toml",
        ct.sign(ct.sign(make(b="eth", b_key=raw(C_KEY), contract_id="eth", price=1), A_KEY), C_KEY),
    )
    write(tmp_path, "03-mit-cheap.toml", signed(contract_id="mit-cheap", price=2))
    write(tmp_path, "04-expired.toml", signed(contract_id="old", not_after=NOW))
    half = ct.sign(make(contract_id="half"), A_KEY)
    write(tmp_path, "05-half.toml", half)
    (tmp_path / "06-tampered.toml").write_text(
        ct.dumps(signed(contract_id="tampered")).replace("price = 2.5", "price = 0.1")
    )
    write(
        tmp_path,
        "07-others.toml",
        ct.sign(
            ct.sign(make(a="eth", a_key=raw(C_KEY), b="mit.edu", contract_id="others"), C_KEY),
            B_KEY,
        ),
    )
    (tmp_path / "08-junk.toml").write_text("this is not [toml")
    write(tmp_path, "09-dup.toml", signed(contract_id="mit", price=9))
    # someone else's key under mit.edu's name, self-consistently signed
    forged = make(b_key=raw(d_key), contract_id="forged")
    write(tmp_path, "10-forged.toml", ct.sign(ct.sign(forged, A_KEY), d_key))
    (tmp_path / "notes.txt").write_text("not a contract file")

    book = ContractBook.load_dir(tmp_path, "acme", NOW, known_keys={"acme": raw(A_KEY)})

    assert [c.id for c in book.contracts] == ["mit", "eth", "mit-cheap"]
    assert {r.path.name: r.reason for r in book.refused} == {
        "04-expired.toml": "expired",
        "05-half.toml": "unsigned",
        "06-tampered.toml": "altered",
        "07-others.toml": "not-a-party",
        "08-junk.toml": "malformed",
        "09-dup.toml": "duplicate",
        "10-forged.toml": "wrong-key",
    }
    assert all("contract" in str(r.error) or "toml" in str(r.error) for r in book.refused)
    assert book.partners() == ["eth", "mit.edu"]
    assert [c.id for c in book.contracts_with("mit.edu")] == ["mit-cheap", "mit"]
    assert book.contracts_with("acme") == []
    assert book.contracts_with("nobody") == []
    assert book.public_keys() == {"mit.edu": raw(B_KEY), "eth": raw(C_KEY)}


def test_book_refuses_a_forged_key_for_me(tmp_path: Path) -> None:
    mine = ct.sign(ct.sign(make(a_key=raw(C_KEY)), C_KEY), B_KEY)
    write(tmp_path, "c.toml", mine)
    book = ContractBook.load_dir(tmp_path, "acme", NOW, known_keys={"acme": raw(A_KEY)})
    assert book.contracts == ()
    assert book.refused[0].reason == "wrong-key"
    assert book.public_keys() == {}


def test_book_of_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="does not exist"):
        ContractBook.load_dir(tmp_path / "none", "acme", NOW)
    assert ContractBook.load_dir(tmp_path, "acme", NOW).contracts == ()
