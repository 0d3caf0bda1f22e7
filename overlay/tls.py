"""Mutual TLS 1.3 whose certificates are bound to participant keys.

Theory of operation
-------------------
A peer trusts *participants* (public keys in its :class:`~overlay.identity.TrustStore`), not
certificate authorities, and it holds only their public keys. To let OpenSSL do the checking,
each trusted participant becomes a *trust anchor*: an X.509 CA certificate whose subject
public key is the participant's key and whose subject name is derived from it::

    CN=fedstream participant <name (cut to 64 characters)>, O=<participant fingerprint>

The fingerprint (sha256 of the key, 32 hex digits) makes names of different keys differ even
if the names do not. Nobody can sign that certificate with the participant's private key, so
it is signed by a throwaway key and *issued by* a fixed, distinct name. The contexts set
``VERIFY_X509_PARTIAL_CHAIN``, under which OpenSSL accepts any certificate of its trust store
as the end of a chain and never checks the anchor's own signature; all the anchor contributes
is its name and its public key, which is exactly what we trust. (Without the flag OpenSSL
looks for the throwaway issuer and refuses every chain; an anchor whose issuer equals its
subject also works, since OpenSSL skips self-signatures of anchors, but then it sends the
anchor along with every certificate and an untrusted peer is reported as "self-signed
certificate in chain". tests/integration/test_links.py checks both outcomes that matter: a
trusted participant's node gets in, an untrusted one's does not, even when it forges the
issuer name of a trusted participant.)

A node's own TLS certificate has subject ``CN=<node id hex>``, the node public key, the
issuer name of its participant's anchor, and is signed by the participant's private key at
start (short validity, renewed by :class:`TlsContexts`). The TLS 1.3 handshake thus proves
both that the peer holds the node key (CertificateVerify) and that a trusted participant
vouched for it (chain to the anchor). :func:`peer_identity` re-checks the certificate with
``cryptography`` after the handshake and derives the node id from its key, so the CN cannot
lie. API clients present an ephemeral key with a certificate signed by their participant key
(:func:`client_cert_context`); :func:`peer_participant` identifies them.

Python's ``ssl`` loads certificates only from files: the chain and the key (encrypted with a
random one-time password) go through a private temporary directory that is removed at once.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import secrets
import ssl
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from overlay.identity import (
    IdentityError,
    NodeIdentity,
    TrustStore,
    node_id_of,
    participant_fingerprint,
    raw_public,
)

__all__ = [
    "DEFAULT_TLS_CERT_VALID_S",
    "PeerIdentity",
    "TlsContexts",
    "anchor_certificate",
    "anchor_name",
    "build_context",
    "client_cert_context",
    "client_context",
    "issue_tls_cert",
    "load_cert_chain",
    "peer_identity",
    "peer_participant",
    "server_context",
    "verify_node_tls_cert",
    "verify_tls_cert",
]

DEFAULT_TLS_CERT_VALID_S = 2 * 24 * 3600
CLOCK_SKEW_S = 300
_MAX_CN = 64  # X.509's upper bound for a common name
_ANCHOR_ISSUER = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedstream unsigned anchor")])
_THROWAWAY_KEY = Ed25519PrivateKey.generate()  # signs anchors; the signature is never checked


class PeerIdentity(NamedTuple):
    """Who is at the other end of a TLS connection, as proven by its certificate."""

    node_id: bytes
    node_pub: bytes
    participant: str
    participant_pub: bytes


def anchor_name(participant: str, participant_pub: bytes) -> x509.Name:
    """The X.509 name of a participant's trust anchor (the issuer of its peers' certs)."""
    return x509.Name(
        [
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"fedstream participant {participant}"[:_MAX_CN]
            ),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, participant_fingerprint(participant_pub)),
        ]
    )


@functools.lru_cache(maxsize=1024)
def anchor_certificate(participant: str, participant_pub: bytes) -> str:
    """The PEM of a participant's trust anchor (cached: rebuilding contexts stays cheap)."""
    public = Ed25519PublicKey.from_public_bytes(participant_pub)
    cert = (
        x509.CertificateBuilder()
        .subject_name(anchor_name(participant, participant_pub))
        .issuer_name(_ANCHOR_ISSUER)
        .public_key(public)
        .serial_number(int.from_bytes(participant_pub[:16], "big") >> 1 or 1)
        .not_valid_before(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(dt.datetime(9999, 12, 31, tzinfo=dt.UTC))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(_THROWAWAY_KEY, None)
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def issue_tls_cert(
    subject_cn: str,
    subject_key: Ed25519PublicKey,
    participant: str,
    participant_key: Ed25519PrivateKey,
    valid_s: float,
    *,
    now: float | None = None,
) -> x509.Certificate:
    """A leaf certificate for ``subject_key``, issued and signed by the participant."""
    issued = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
    participant_pub = participant_key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(anchor_name(participant, raw_public(participant_pub)))
        .public_key(subject_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(issued - dt.timedelta(seconds=CLOCK_SKEW_S))
        .not_valid_after(issued + dt.timedelta(seconds=valid_s))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(participant_pub), critical=False
        )
        .sign(participant_key, None)
    )


def build_context(
    *,
    server: bool,
    trust: TrustStore,
    cert: x509.Certificate,
    key: Ed25519PrivateKey,
) -> ssl.SSLContext:
    """A TLS 1.3 context that presents ``cert`` (for ``key``) and accepts only peers whose
    certificates chain to the anchors of ``trust``. The other constructors use this one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # peers are named by node id and participant, checked by us
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if server:
        # No resumption: every connection shows a certificate checked against today's trust.
        ctx.num_tickets = 0
    anchors = [anchor_certificate(name, pub) for name, pub in trust.participants().items()]
    if not anchors:
        raise IdentityError("the trust store is empty: no peer could ever be accepted")
    ctx.load_verify_locations(cadata="".join(anchors))
    load_cert_chain(ctx, cert, key)
    return ctx


def load_cert_chain(ctx: ssl.SSLContext, cert: x509.Certificate, key: Ed25519PrivateKey) -> None:
    """Make ``ctx`` present ``cert`` for ``key`` (through a private temporary file: Python's
    ``ssl`` loads certificates from files only; see the module notes)."""
    password = secrets.token_hex(16).encode("ascii")
    with tempfile.TemporaryDirectory(prefix="fedstream-tls-") as tmp:
        path = Path(tmp) / "chain.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(cert.public_bytes(serialization.Encoding.PEM))
            out.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.BestAvailableEncryption(password),
                )
            )
        ctx.load_cert_chain(path, password=password)


def _node_cert(identity: NodeIdentity, valid_s: float) -> x509.Certificate:
    return issue_tls_cert(
        identity.node_id.hex(),
        identity.node_key.public_key(),
        identity.participant,
        identity.participant_key,
        valid_s,
    )


def server_context(
    identity: NodeIdentity, trust: TrustStore, *, valid_s: float = DEFAULT_TLS_CERT_VALID_S
) -> ssl.SSLContext:
    """A server context: presents this node's cert, requires a client cert of a trusted
    participant (peers and API clients alike)."""
    return build_context(
        server=True, trust=trust, cert=_node_cert(identity, valid_s), key=identity.node_key
    )


def client_context(
    identity: NodeIdentity, trust: TrustStore, *, valid_s: float = DEFAULT_TLS_CERT_VALID_S
) -> ssl.SSLContext:
    """A client context for peer links: presents this node's cert, requires a server cert of
    a trusted participant."""
    return build_context(
        server=False, trust=trust, cert=_node_cert(identity, valid_s), key=identity.node_key
    )


def client_cert_context(
    participant: str,
    participant_key: Ed25519PrivateKey,
    trust: TrustStore,
    *,
    valid_s: float = 3600,
) -> ssl.SSLContext:
    """A client context for an API client acting for ``participant``: it presents an
    ephemeral key whose certificate the participant key signs, and accepts servers of the
    participants in ``trust``."""
    ephemeral = Ed25519PrivateKey.generate()
    cert = issue_tls_cert(
        f"fedstream client {secrets.token_hex(8)}",
        ephemeral.public_key(),
        participant,
        participant_key,
        valid_s,
    )
    return build_context(server=False, trust=trust, cert=cert, key=ephemeral)


class TlsContexts:
    """This node's current server and client contexts.

    Contexts are built lazily and rebuilt when the trust store changes (a participant added at
    runtime counts for new connections) or when half of the node certificate's validity has
    passed. :meth:`rebuild` forces it. Existing connections keep the context they began with.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        trust: TrustStore,
        *,
        cert_valid_s: float = DEFAULT_TLS_CERT_VALID_S,
    ) -> None:
        self.identity = identity
        self.trust = trust
        self.cert_valid_s = cert_valid_s
        self._server: ssl.SSLContext | None = None
        self._client: ssl.SSLContext | None = None
        self._built_version = -1
        self._renew_at = 0.0

    def rebuild(self) -> None:
        cert = _node_cert(self.identity, self.cert_valid_s)
        key = self.identity.node_key
        self._server = build_context(server=True, trust=self.trust, cert=cert, key=key)
        self._client = build_context(server=False, trust=self.trust, cert=cert, key=key)
        self._built_version = self.trust.version
        self._renew_at = time.time() + self.cert_valid_s / 2

    def _fresh(self) -> None:
        if self._built_version != self.trust.version or time.time() >= self._renew_at:
            self.rebuild()

    @property
    def server(self) -> ssl.SSLContext:
        self._fresh()
        assert self._server is not None
        return self._server

    @property
    def client(self) -> ssl.SSLContext:
        self._fresh()
        assert self._client is not None
        return self._client


# -- after the handshake ----------------------------------------------------------------------


def verify_tls_cert(
    der: bytes, trust: TrustStore, now: float | None = None
) -> tuple[x509.Certificate, str, bytes]:
    """Check that a DER certificate was issued and signed by a trusted participant and is
    valid now; returns it with the participant's name and raw key. Raises IdentityError."""
    try:
        cert = x509.load_der_x509_certificate(der)
        issuer = cert.issuer
        orgs = issuer.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        fingerprint = orgs[0].value if len(orgs) == 1 else None
        found = trust.by_fingerprint(fingerprint) if isinstance(fingerprint, str) else None
        if found is None or issuer != anchor_name(*found):
            raise IdentityError(f"peer certificate issuer {issuer.rfc4514_string()} is not trusted")
        name, participant_pub = found
        try:
            Ed25519PublicKey.from_public_bytes(participant_pub).verify(
                cert.signature, cert.tbs_certificate_bytes
            )
        except InvalidSignature as exc:
            raise IdentityError(
                f"peer certificate claims participant {name!r} but is not signed by its key"
            ) from exc
        moment = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
        if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
            raise IdentityError(f"peer certificate of participant {name!r} is not valid now")
    except IdentityError:
        raise
    except Exception as exc:
        # Hostile DER: cryptography raises ValueError, InvalidVersion, UnsupportedAlgorithm...
        # and parses lazily, so they may come from any attribute; all mean the same here.
        raise IdentityError(f"peer certificate does not parse: {exc!r}") from exc
    return cert, name, participant_pub


def verify_node_tls_cert(der: bytes, trust: TrustStore, now: float | None = None) -> PeerIdentity:
    """:func:`verify_tls_cert`, and the subject must be the node named by its own key."""
    cert, name, participant_pub = verify_tls_cert(der, trust, now)
    try:
        key = cert.public_key()
        cns = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    except Exception as exc:  # as in verify_tls_cert: hostile bytes, many exception types
        raise IdentityError(f"peer certificate of participant {name!r} does not parse") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise IdentityError(f"peer certificate of participant {name!r} has no Ed25519 node key")
    node_pub = raw_public(key)
    node_id = node_id_of(node_pub)
    if cns != [node_id.hex()]:
        raise IdentityError(
            f"peer certificate of participant {name!r} names node {cns} but its key is node "
            f"{node_id.hex()}'s"
        )
    return PeerIdentity(node_id, node_pub, name, participant_pub)


def _peer_der(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> bytes:
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise IdentityError("the peer presented no certificate")
    return der


def peer_identity(ssl_object: ssl.SSLObject | ssl.SSLSocket, trust: TrustStore) -> PeerIdentity:
    """The node at the other end of a finished handshake (a peer link)."""
    return verify_node_tls_cert(_peer_der(ssl_object), trust)


def peer_participant(
    ssl_object: ssl.SSLObject | ssl.SSLSocket, trust: TrustStore
) -> tuple[str, bytes]:
    """The participant at the other end of a finished handshake (an API client or a peer)."""
    _cert, name, participant_pub = verify_tls_cert(_peer_der(ssl_object), trust)
    return name, participant_pub
