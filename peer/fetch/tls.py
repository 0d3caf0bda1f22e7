"""The fetch server's TLS: a certificate made from the fetch key, pinned by the executors.

Executors hold no participant key and trust no certificate authority, so the participant
scheme of :mod:`overlay.tls` (mutual TLS, chains to participant anchors) does not fit them.
Instead the fetch server presents a self-signed certificate of the peer's fetch key
(:mod:`peer.fetch.capability`), and every partition carries the SHA-256 of that certificate's
DER bytes (its *pin*, :func:`peer.fetch.protocol.pin_of`). The client checks the pin right after
the handshake and before it sends a capability: TLS 1.3's CertificateVerify has proven that
the server holds the private key of the certificate it showed, so a matching pin means it is
this peer's fetch server, and a man in the middle never sees a token. Ed25519 signatures are
deterministic and every field below is derived from the key, so the certificate (and its pin)
is the same bytes at every start of the peer until its fetch key changes; its validity period
means nothing (the pin is what is trusted) and spans all dates.

The server asks for no client certificate: a request's authority is its capability.
"""

from __future__ import annotations

import datetime as dt
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from overlay.tls import load_cert_chain
from peer.fetch.capability import FetchKey
from peer.fetch.protocol import pin_of

__all__ = ["server_certificate", "server_context"]


def server_certificate(key: FetchKey) -> x509.Certificate:
    """The fetch server's certificate: the same bytes for the same key (see the notes)."""
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"fedstream fetch {key.key_id.hex()}")]
    )
    public = key.private.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(int.from_bytes(key.key_id, "big") >> 1 or 1)
        .not_valid_before(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(dt.datetime(9999, 12, 31, tzinfo=dt.UTC))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key.private, None)
    )


def server_context(key: FetchKey) -> tuple[ssl.SSLContext, str]:
    """A TLS 1.3 server context presenting the fetch key's certificate, and its pin."""
    cert = server_certificate(key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_NONE  # executors are anonymous; capabilities authorise
    ctx.num_tickets = 0
    load_cert_chain(ctx, cert, key.private)
    return ctx, pin_of(cert.public_bytes(serialization.Encoding.DER))
