"""The client API's TLS set-up without sockets: argument checks, which hosts are loopback,
the command line's TLS options. (The handshakes themselves, over real sockets, are
tests/integration/test_api_tls.py.)
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contracts.keys import generate, load_private
from overlay.identity import IdentityError, NodeIdentity, TrustStore
from peer.cli import build_parser
from peer.client import Client
from peer.errors import InvalidInput
from peer.server import ApiServer, api_server_tls, is_loopback
from tests.unit.test_api import FakePeer

TEST_TIMEOUT_S = 20


@dataclass
class Federation:
    server: NodeIdentity  # the peer serving the API, of participant acme
    trust: TrustStore  # the server's: acme and mit.edu
    keys: Path  # NAME.key and NAME.pub of acme, mit.edu, evil
    trust_dir: Path  # acme.pub: whom clients trust besides themselves

    def client(self, server: ApiServer, participant: str, **options: Any) -> Client:
        options.setdefault("trust_dir", self.trust_dir)
        options.setdefault("key_path", self.keys / f"{participant}.key")
        return Client("127.0.0.1", server.port, timeout_s=5, participant=participant, **options)


def make_federation(tmp_path: Path) -> Federation:
    keys = tmp_path / "keys"
    for name in ("acme", "mit.edu", "evil"):
        generate(name, keys)
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    shutil.copy(keys / "acme.pub", trust_dir / "acme.pub")
    server = NodeIdentity.create("acme", load_private(keys / "acme.key"))
    trust = TrustStore()
    for name in ("acme", "mit.edu"):
        trust.add(name, load_private(keys / f"{name}.key").public_key())
    return Federation(server, trust, keys, trust_dir)


@pytest.fixture
def fed(tmp_path: Path) -> Federation:
    return make_federation(tmp_path)


def no_certificate_context() -> ssl.SSLContext:
    """A TLS client that would talk to anyone and shows no certificate of its own."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# -- set-up errors ----------------------------------------------------------------------------


def test_tls_needs_a_trust_store(fed: Federation) -> None:
    with pytest.raises(ValueError, match="trust store"):
        ApiServer(FakePeer(), "127.0.0.1", 0, ssl=api_server_tls(fed.server, fed.trust))
    with pytest.raises(IdentityError, match="empty"):
        api_server_tls(fed.server, TrustStore())


def test_client_arguments_are_checked(fed: Federation, tmp_path: Path) -> None:
    key = fed.keys / "mit.edu.key"
    with pytest.raises(ValueError, match="go together"):
        Client(participant="mit.edu")
    with pytest.raises(ValueError, match="go together"):
        Client(key_path=key)
    with pytest.raises(ValueError, match="trust_dir"):
        Client(trust_dir=fed.trust_dir)
    with pytest.raises(ValueError, match="either ssl"):
        Client(participant="mit.edu", key_path=key, ssl=no_certificate_context())

    async def connect(client: Client) -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            await client.connect()

    missing_key = Client(participant="mit.edu", key_path=tmp_path / "nope.key")
    with pytest.raises(InvalidInput, match=r"nope\.key"):
        asyncio.run(connect(missing_key))
    missing_dir = Client(participant="mit.edu", key_path=key, trust_dir=tmp_path / "nope")
    with pytest.raises(InvalidInput, match=r"trust directory \S+/nope does not exist"):
        asyncio.run(connect(missing_dir))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("192.168.1.20", False),
        ("fe80::1", False),
        ("::ffff:10.0.0.1", False),
        ("128.0.0.1", False),
        ("example.org", False),
        ("localhost.example.org", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# -- the command line -------------------------------------------------------------------------


def test_cli_tls_options_and_environment(fed: Federation, monkeypatch: pytest.MonkeyPatch) -> None:
    from peer.cli.options import UsageError
    from peer.cli.options import client_tls as _client_tls

    parser = build_parser()
    for name in ("PEER_PARTICIPANT", "PEER_KEY", "PEER_TRUST"):
        monkeypatch.delenv(name, raising=False)
    assert _client_tls(parser.parse_args(["status"])) == {
        "participant": None,
        "key_path": None,
        "trust_dir": None,
    }
    args = parser.parse_args(["lookup", "x", "--participant", "a", "--key", "k", "--trust", "t"])
    assert _client_tls(args) == {"participant": "a", "key_path": Path("k"), "trust_dir": Path("t")}
    monkeypatch.setenv("PEER_PARTICIPANT", "b")
    monkeypatch.setenv("PEER_KEY", "kb")
    monkeypatch.setenv("PEER_TRUST", "tb")
    assert _client_tls(parser.parse_args(["status"])) == {
        "participant": "b",
        "key_path": Path("kb"),
        "trust_dir": Path("tb"),
    }
    monkeypatch.delenv("PEER_KEY")
    with pytest.raises(UsageError, match="--participant and --key go together"):
        _client_tls(parser.parse_args(["status"]))
    monkeypatch.delenv("PEER_PARTICIPANT")
    with pytest.raises(UsageError, match="--trust is for TLS"):
        _client_tls(parser.parse_args(["status"]))
