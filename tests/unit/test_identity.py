"""Node identity: node certificates, the trust store, identities kept in a data dir, signed
hellos, and the checks of TLS certificates (pure; no sockets)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import stat
import time
from pathlib import Path

import msgpack
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.keys import generate
from overlay.identity import (
    MAX_NODE_CERT_BYTES,
    IdentityError,
    NodeCert,
    NodeIdentity,
    TrustStore,
    issue_node_cert,
    node_id_of,
    raw_public,
    sign_hello,
    verify_hello,
    verify_node_cert,
)
from overlay.tls import (
    TlsContexts,
    anchor_name,
    issue_tls_cert,
    verify_node_tls_cert,
    verify_tls_cert,
)

NOW = 1_700_000_000.0
PARTICIPANT_KEY = Ed25519PrivateKey.generate()
NODE_KEY = Ed25519PrivateKey.generate()
ACME = raw_public(PARTICIPANT_KEY)
NODE = raw_public(NODE_KEY)


def trust_of(**participants: bytes) -> TrustStore:
    trust = TrustStore()
    for name, key in participants.items():
        trust.add(name, key)
    return trust


TRUST = trust_of(acme=ACME)


def cert(
    valid_s: float = 3600, *, name: str = "acme", key: Ed25519PrivateKey = PARTICIPANT_KEY
) -> bytes:
    return issue_node_cert(name, key, NODE, valid_s, now=NOW)


def repack(raw: bytes, **changes: object) -> bytes:
    fields = msgpack.unpackb(raw)
    fields.update(changes)
    packed: bytes = msgpack.packb(fields, use_bin_type=True)
    return packed


# -- node certificates ------------------------------------------------------------------------


def test_node_cert_round_trip() -> None:
    checked = verify_node_cert(cert(), TRUST, NOW + 10, node_pub=NODE)
    assert checked == NodeCert("acme", ACME, NODE, int(NOW) + 3600, checked.signature)
    assert checked.node_id == node_id_of(NODE) and len(checked.node_id) == 20
    assert len(cert()) < MAX_NODE_CERT_BYTES


@pytest.mark.parametrize(
    ("raw", "now", "reason"),
    [
        (b"\x00" * (MAX_NODE_CERT_BYTES + 1), NOW, "exceeds the limit"),
        (b"\xc1", NOW, "does not decode"),
        (msgpack.packb([1, 2]), NOW, "exactly the fields"),
        (repack(cert(), extra=1), NOW, "exactly the fields"),
        (cert(), NOW + 3600, "expired"),
        (repack(cert(), exp=int(NOW) + 7200), NOW, "bad signature"),
        (repack(cert(), sig=bytes(64)), NOW, "bad signature"),
        (repack(cert(), exp=True), NOW, "'exp'"),
        (repack(cert(), exp=-1), NOW, "'exp'"),
        (repack(cert(), nk=b"short"), NOW, "'nk' must be 32 bytes"),
        (repack(cert(), p="no spaces allowed"), NOW, "participant name"),
        (repack(cert(), p=7), NOW, "not a string"),
    ],
)
def test_bad_node_certs_say_what_is_wrong(raw: bytes, now: float, reason: str) -> None:
    with pytest.raises(IdentityError, match=reason):
        verify_node_cert(raw, TRUST, now)


def test_untrusted_participant_is_named() -> None:
    stranger = Ed25519PrivateKey.generate()
    with pytest.raises(IdentityError, match="participant 'evil' is not trusted"):
        verify_node_cert(cert(name="evil", key=stranger), TRUST, NOW)


def test_trusted_key_under_another_name_is_refused() -> None:
    with pytest.raises(IdentityError, match=r"names participant 'mit\.edu', but its key is 'acme'"):
        verify_node_cert(cert(name="mit.edu"), TRUST, NOW)


def test_node_key_mismatch() -> None:
    other = raw_public(Ed25519PrivateKey.generate())
    with pytest.raises(IdentityError, match="node key mismatch"):
        verify_node_cert(cert(), TRUST, NOW, node_pub=other)


def test_not_bytes() -> None:
    with pytest.raises(IdentityError, match="not bytes"):
        verify_node_cert("text", TRUST, NOW)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=MAX_NODE_CERT_BYTES + 8))
def test_hostile_bytes_raise_only_identity_error(raw: bytes) -> None:
    with contextlib.suppress(IdentityError):
        verify_node_cert(raw, TRUST, NOW)


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=80),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["p", "pk", "nk", "exp", "sig", "x"]), _values))
def test_hostile_maps_raise_only_identity_error(fields: dict[str, object]) -> None:
    with contextlib.suppress(IdentityError):
        verify_node_cert(msgpack.packb(fields, use_bin_type=True), TRUST, NOW)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_is_refused(position: int, flip: int) -> None:
    raw = bytearray(cert())
    raw[position % len(raw)] ^= flip
    with pytest.raises(IdentityError):
        verify_node_cert(bytes(raw), TRUST, NOW)


# -- trust store ------------------------------------------------------------------------------


def test_trust_store_binds_names_and_keys_one_to_one() -> None:
    trust = TrustStore()
    other = raw_public(Ed25519PrivateKey.generate())
    trust.add("acme", PARTICIPANT_KEY.public_key())
    trust.add("acme", ACME)  # the same binding again: no change
    assert trust.version == 1 and len(trust) == 1 and "acme" in trust
    assert trust.is_trusted(ACME) and trust.name_of(ACME) == "acme" and trust.key_of("acme") == ACME
    assert not trust.is_trusted(other) and trust.name_of(other) is None
    with pytest.raises(IdentityError, match="'acme' is already trusted with key"):
        trust.add("acme", other)
    with pytest.raises(IdentityError, match="already trusted as participant 'acme'"):
        trust.add("acme2", ACME)
    with pytest.raises(IdentityError, match="participant name"):
        trust.add("bad name", other)
    with pytest.raises(IdentityError, match="32 raw bytes"):
        trust.add("short", b"abc")
    trust.add("mit.edu", other)
    assert trust.participants() == {"acme": ACME, "mit.edu": other} and trust.version == 2


def test_load_dir(tmp_path: Path) -> None:
    generate("acme", tmp_path)
    generate("mit.edu", tmp_path)
    trust = TrustStore()
    assert trust.load_dir(tmp_path) == ["acme", "mit.edu"]
    assert sorted(trust.participants()) == ["acme", "mit.edu"]
    # the same name bound to another key elsewhere is refused, naming the file
    other = tmp_path / "other"
    generate("acme", other)
    with pytest.raises(IdentityError, match=r"acme\.pub.*'acme' is already trusted"):
        trust.load_dir(other)
    (other / "acme.pub").unlink()
    (other / "junk.pub").write_text("not a key")
    with pytest.raises(IdentityError, match=r"junk\.pub"):
        trust.load_dir(other)


# -- identity kept in a data dir --------------------------------------------------------------


def test_first_start_makes_keys_and_restart_reuses_them(tmp_path: Path) -> None:
    first = NodeIdentity.load_or_create(tmp_path)
    keys = tmp_path / "keys"
    assert stat.S_IMODE((keys / "node.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "participant.key").stat().st_mode) == 0o600
    assert first.participant.startswith("local-") and len(first.participant) == 14
    recorded = json.loads((keys / "identity.json").read_text())
    assert recorded["participant"] == first.participant
    assert first.node_id == node_id_of(first.node_pub)

    again = NodeIdentity.load_or_create(tmp_path)
    assert (again.node_id, again.participant, again.participant_pub) == (
        first.node_id,
        first.participant,
        first.participant_pub,
    )
    # naming the recorded participant explicitly is fine too
    assert NodeIdentity.load_or_create(tmp_path, first.participant).node_id == first.node_id
    trust = again.trust_store()
    checked = verify_node_cert(again.cert, trust, time.time())
    assert checked.participant == first.participant and checked.node_pub == again.node_pub
    assert "NodeIdentity(participant=" in repr(again) and "node_key" not in repr(again)


def test_restart_as_another_participant_is_refused(tmp_path: Path) -> None:
    NodeIdentity.load_or_create(tmp_path, "acme")
    with pytest.raises(IdentityError, match=r"belongs to participant 'acme', not 'mit\.edu'"):
        NodeIdentity.load_or_create(tmp_path, "mit.edu")
    generate("acme", tmp_path / "elsewhere")
    with pytest.raises(IdentityError, match="refusing to change a peer's participant key"):
        NodeIdentity.load_or_create(tmp_path, "acme", tmp_path / "elsewhere" / "acme.key")


def test_participant_key_file(tmp_path: Path) -> None:
    key_path, _ = generate("acme", tmp_path / "mine")
    data = tmp_path / "data"
    with pytest.raises(IdentityError, match="needs the participant's name"):
        NodeIdentity.load_or_create(data, None, key_path)
    ident = NodeIdentity.load_or_create(data, "acme", key_path)
    assert ident.participant == "acme" and not (data / "keys" / "participant.key").exists()
    assert NodeIdentity.load_or_create(data, "acme", key_path).node_id == ident.node_id
    with pytest.raises(IdentityError, match="start it with --participant acme --key FILE"):
        NodeIdentity.load_or_create(data)
    with pytest.raises(IdentityError, match="cannot read private key"):
        NodeIdentity.load_or_create(data, "acme", tmp_path / "missing.key")


def test_damaged_identity_file_is_refused(tmp_path: Path) -> None:
    NodeIdentity.load_or_create(tmp_path)
    (tmp_path / "keys" / "identity.json").write_text("{")
    with pytest.raises(IdentityError, match="unreadable or damaged"):
        NodeIdentity.load_or_create(tmp_path)


def test_trust_store_holds_self_and_trust_dir(tmp_path: Path) -> None:
    generate("mit.edu", tmp_path / "trust")
    (tmp_path / "trust" / "mit.edu.key").unlink()
    ident = NodeIdentity.load_or_create(tmp_path, "acme")
    assert sorted(ident.trust_store().participants()) == ["acme", "mit.edu"]


# -- signed hello -----------------------------------------------------------------------------


def test_signed_hello() -> None:
    ident = NodeIdentity.create("acme", PARTICIPANT_KEY, NODE_KEY, now=NOW)
    hello = sign_hello(ident, b"challenge", b"udp:1.2.3.4")
    assert verify_hello(hello, b"challenge", TRUST, NOW, b"udp:1.2.3.4").node_id == ident.node_id
    with pytest.raises(IdentityError, match="bad signature"):
        verify_hello(hello, b"another challenge", TRUST, NOW, b"udp:1.2.3.4")
    with pytest.raises(IdentityError, match="needs 'cert' bytes"):
        verify_hello({"cert": ident.cert}, b"challenge", TRUST, NOW)
    with pytest.raises(IdentityError, match="not trusted"):
        verify_hello(hello, b"challenge", TrustStore(), NOW, b"udp:1.2.3.4")


# -- TLS certificates (the checks peer_identity runs after a handshake) -----------------------


def der(c: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return c.public_bytes(serialization.Encoding.DER)


def node_tls_cert(participant_key: Ed25519PrivateKey = PARTICIPANT_KEY, **kw: object) -> bytes:
    cn = kw.pop("cn", node_id_of(NODE).hex())
    return der(
        issue_tls_cert(str(cn), NODE_KEY.public_key(), "acme", participant_key, 600, now=NOW)
    )


def test_node_tls_cert_identifies_node_and_participant() -> None:
    peer = verify_node_tls_cert(node_tls_cert(), TRUST, NOW)
    assert peer == (node_id_of(NODE), NODE, "acme", ACME)


def test_tls_cert_of_untrusted_participant_is_refused() -> None:
    with pytest.raises(IdentityError, match="is not trusted"):
        verify_node_tls_cert(node_tls_cert(Ed25519PrivateKey.generate()), TRUST, NOW)


def test_tls_cert_with_a_forged_issuer_name_is_refused() -> None:
    # The issuer name of a trusted participant, signed by somebody else's key.
    forger = Ed25519PrivateKey.generate()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id_of(NODE).hex())]))
        .issuer_name(anchor_name("acme", ACME))
        .public_key(NODE_KEY.public_key())
        .serial_number(1)
        .not_valid_before(dt.datetime.fromtimestamp(NOW - 60, dt.UTC))
        .not_valid_after(dt.datetime.fromtimestamp(NOW + 60, dt.UTC))
        .sign(forger, None)
    )
    with pytest.raises(IdentityError, match="not signed by its key"):
        verify_node_tls_cert(der(cert), TRUST, NOW)


def test_tls_cert_claiming_another_node_id_is_refused() -> None:
    with pytest.raises(IdentityError, match="names node"):
        verify_node_tls_cert(node_tls_cert(cn="00" * 20), TRUST, NOW)
    # an API client's certificate names no node, but its participant is known
    _, name, _ = verify_tls_cert(node_tls_cert(cn="fedstream client 1"), TRUST, NOW)
    assert name == "acme"


def test_expired_tls_cert_is_refused() -> None:
    with pytest.raises(IdentityError, match="not valid now"):
        verify_node_tls_cert(node_tls_cert(), TRUST, NOW + 3600)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_hostile_tls_cert_bytes_raise_only_identity_error(raw: bytes) -> None:
    with pytest.raises(IdentityError):
        verify_node_tls_cert(raw, TRUST, NOW)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=1, max_value=255))
def test_flipped_tls_cert_bytes_raise_only_identity_error(position: int, flip: int) -> None:
    raw = bytearray(node_tls_cert())
    raw[position % len(raw)] ^= flip
    with contextlib.suppress(IdentityError):
        verify_node_tls_cert(bytes(raw), TRUST, NOW)


def test_tls_contexts_follow_the_trust_store() -> None:
    ident = NodeIdentity.create("acme", PARTICIPANT_KEY, NODE_KEY)
    trust = trust_of(acme=ACME)
    contexts = TlsContexts(ident, trust)
    server = contexts.server
    assert contexts.server is server and contexts.client is contexts.client
    trust.add("mit.edu", raw_public(Ed25519PrivateKey.generate()))
    assert contexts.server is not server
    assert len(contexts.server.get_ca_certs()) == 2
