"""What every ``peer`` command shares: usage errors, addresses, and how to reach a peer.

A client command finds its peer through ``--peer`` (else ``$PEER_ADDR``, else
``127.0.0.1:7700``): one HOST:PORT, or several separated by commas, tried in turn (the
command talks to the first that answers; ``push`` moves on to the next when its connection
is lost). It speaks TLS when given a participant and its key (``--participant``
and ``--key``, else ``$PEER_PARTICIPANT`` and ``$PEER_KEY``), trusting the public keys in
``--trust`` (else ``$PEER_TRUST``) besides its own participant's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TypedDict

DEFAULT_PEER = "127.0.0.1:7700"


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default after its help, unless the help speaks of it already or
    there is none to show (no value, a flag that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, [], argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def use_defaults_formatter(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every sub-parser below it :class:`DefaultsHelpFormatter`."""
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                use_defaults_formatter(child)


class UsageError(Exception):
    """Options that do not fit together or cannot be read: exit 2, with the message."""


def parse_addr(text: str, *, what: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{what} {text!r} must be HOST:PORT, e.g. 127.0.0.1:7700")
    return host.strip("[]"), int(port)


def parse_addrs(text: str, *, what: str = "address") -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]``, in order, each address once."""
    addresses: list[tuple[str, int]] = []
    for part in text.split(","):
        if not part.strip():
            raise UsageError(
                f"{what} {text!r} has an empty entry: give HOST:PORT or HOST:PORT,HOST:PORT"
            )
        address = parse_addr(part.strip(), what=what)
        if address not in addresses:
            addresses.append(address)
    return addresses


# More than the peer's longest wait before it answers (30 s: a backlogged stream, a stream
# host being found; peer.client.connection.SERVER_LONGEST_WAIT_S), so that a slow answer is
# not taken for a lost one.
DEFAULT_TIMEOUT_S = 60.0


def add_client_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a peer."""
    p.add_argument(
        "--peer",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the peer to talk to, or several tried in turn: the first that answers "
        f"(default $PEER_ADDR or {DEFAULT_PEER})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"request timeout, seconds (default {DEFAULT_TIMEOUT_S:g}: more than the "
        "30 s a peer may wait before it answers)",
    )
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


def peer_addrs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """--peer, else $PEER_ADDR, else 127.0.0.1:7700, as the list of addresses to try."""
    if args.peer:
        return parse_addrs(args.peer, what="--peer")
    env = os.environ.get("PEER_ADDR")
    if env:
        return parse_addrs(env, what="PEER_ADDR")
    return parse_addrs(DEFAULT_PEER, what="--peer")


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
