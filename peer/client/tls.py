"""The client's side of mutual TLS: its certificate, and whom it accepts as the peer.

A client acting as a participant presents a short-lived certificate signed by that
participant's key (made anew for each connection), and accepts only a peer whose node
certificate is issued by a participant it trusts: its own, or one whose ``NAME.pub`` is in its
trust directory. Imported only by clients that use TLS (it pulls in cryptography).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from contracts.keys import KeyError_, load_private
from overlay.identity import IdentityError, TrustStore
from overlay.tls import client_cert_context, peer_identity
from peer.errors import InvalidInput, Unauthorized

__all__ = ["participant_context", "server_participant"]


def participant_context(
    participant: str, key_path: Path, trust_dir: Path | None
) -> tuple[ssl.SSLContext, TrustStore]:
    """A TLS context presenting a fresh certificate of ``participant``, and the trust store
    the peer's certificate is checked against; InvalidInput if the key or the trust directory
    cannot be used."""
    try:
        key = load_private(key_path)
        trust = TrustStore()
        trust.add(participant, key.public_key())
        if trust_dir is not None:
            if not trust_dir.is_dir():
                raise IdentityError(f"trust directory {trust_dir} does not exist")
            trust.load_dir(trust_dir)
        context = client_cert_context(participant, key, trust)
    except (KeyError_, IdentityError) as exc:
        raise InvalidInput(
            f"cannot act as participant {participant!r} with key {key_path}: {exc}",
            participant=participant,
        ) from exc
    return context, trust


def server_participant(tls: ssl.SSLObject | None, trust: TrustStore, address: str) -> str:
    """The participant whose node certificate the peer at ``address`` presented;
    Unauthorized if this client does not accept it."""
    try:
        if tls is None:
            raise IdentityError("the connection carries no TLS")
        return peer_identity(tls, trust).participant
    except IdentityError as exc:
        raise Unauthorized(f"refusing peer {address}: {exc.reason}", peer=address) from exc
