"""What every ``peer`` command shares: usage errors, addresses, and how to reach a peer.

A client command finds its peer through ``--peer`` (else ``$PEER_ADDR``, else
``127.0.0.1:7700``) and speaks TLS when given a participant and its key (``--participant``
and ``--key``, else ``$PEER_PARTICIPANT`` and ``$PEER_KEY``), trusting the public keys in
``--trust`` (else ``$PEER_TRUST``) besides its own participant's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TypedDict

DEFAULT_PEER = "127.0.0.1:7700"


class UsageError(Exception):
    """Options that do not fit together or cannot be read: exit 2, with the message."""


def parse_addr(text: str, *, what: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{what} {text!r} must be HOST:PORT, e.g. 127.0.0.1:7700")
    return host.strip("[]"), int(port)


def add_client_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a peer."""
    p.add_argument("--peer", help=f"HOST:PORT of a peer (default $PEER_ADDR or {DEFAULT_PEER})")
    p.add_argument("--timeout", type=float, default=60.0, help="request timeout, seconds")
    p.add_argument(
        "--participant",
        help="connect with TLS as this participant (with --key), as a peer whose API port "
        "is not on loopback requires (default $PEER_PARTICIPANT)",
    )
    p.add_argument("--key", help="the participant's private key file (default $PEER_KEY)")
    p.add_argument(
        "--trust",
        metavar="DIR",
        help="public keys (NAME.pub) of participants whose peers to accept, besides your "
        "own (default $PEER_TRUST)",
    )
    return p


def peer_addr(args: argparse.Namespace) -> tuple[str, int]:
    return parse_addr(args.peer or os.environ.get("PEER_ADDR") or DEFAULT_PEER, what="--peer")


class ClientTls(TypedDict):
    """The TLS arguments of ``peer.client.Client``."""

    participant: str | None
    key_path: Path | None
    trust_dir: Path | None


def client_tls(args: argparse.Namespace) -> ClientTls:
    """--participant, --key, --trust (else $PEER_PARTICIPANT, $PEER_KEY, $PEER_TRUST) as
    Client arguments: with a participant key the client speaks TLS."""
    participant = args.participant or os.environ.get("PEER_PARTICIPANT") or None
    key = args.key or os.environ.get("PEER_KEY") or None
    trust = args.trust or os.environ.get("PEER_TRUST") or None
    if (participant is None) != (key is None):
        raise UsageError(
            "--participant and --key go together (the key is that participant's; "
            "or set both PEER_PARTICIPANT and PEER_KEY)"
        )
    if trust is not None and key is None:
        raise UsageError("--trust is for TLS: give --participant and --key too")
    return {
        "participant": participant,
        "key_path": Path(key) if key else None,
        "trust_dir": Path(trust) if trust else None,
    }
