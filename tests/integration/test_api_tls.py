"""The client API over mutual TLS: real loopback sockets, with TLS forced on (the server is
given a TLS context even on 127.0.0.1), on both asyncio's loop and uvloop. No JVM: the service
is test_api's in-memory fake. (The checks that need no socket are tests/unit/test_api_tls.py.)

The federation: the server is a peer of participant ``acme``, which trusts ``acme`` and
``mit.edu``; ``evil`` has a key nobody trusts. Clients trust their own participant and the
``acme.pub`` in ``trust_dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from peer.cli import main
from peer.client import Client
from peer.errors import Unauthorized, Unavailable
from peer.server import ApiServer, api_server_tls
from peer.testing import wait_until
from tests.unit.test_api import FakePeer, with_people
from tests.unit.test_api_tls import Federation, make_federation, no_certificate_context

TEST_TIMEOUT_S = 20
Run = Callable[[Callable[[], Awaitable[None]]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Run a test's body on a fresh loop of either kind, bounded by TEST_TIMEOUT_S."""

    def runner(body: Callable[[], Awaitable[None]]) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(TEST_TIMEOUT_S):
                await body()

        if request.param == "uvloop":
            uvloop.run(bounded())
        else:
            asyncio.run(bounded())

    return runner


@pytest.fixture
def fed(tmp_path: Path) -> Federation:
    return make_federation(tmp_path)


@contextlib.asynccontextmanager
async def tls_serving(fed: Federation, **options: Any) -> AsyncIterator[ApiServer]:
    server = ApiServer(
        FakePeer(),
        "127.0.0.1",
        0,
        ssl=api_server_tls(fed.server, fed.trust),
        trust=fed.trust,
        **options,
    )
    await server.start()
    try:
        yield server
    finally:
        async with asyncio.timeout(10):
            await server.close()


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("peer.server")
        and r.levelno == logging.WARNING
        and "refused" in r.getMessage()
    ]


# -- the good path ----------------------------------------------------------------------------


def test_trusted_participant_works_end_to_end(
    run: Run, fed: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="peer.server")

    async def body() -> None:
        async with tls_serving(fed) as server, fed.client(server, "mit.edu") as client:
            assert server.uses_tls
            assert client.uses_tls
            assert client.server_info is not None
            assert client.server_info.participant == "mit.edu"  # who the server says we are
            assert client.server_participant == "acme"  # who its certificate says it is
            await with_people(client)
            sub = await client.subscribe("people")
            reply = await client.push("people", [{"name": "ann", "id": 1}])
            assert reply["count"] == 1
            batch = await sub.next_batch(5)
            assert batch is not None and batch.rows() == [{"name": "ann", "id": 1}]
            assert [s["name"] for s in (await client.status()).streams] == ["people"]
            assert (await client.lookup_object("people"))["kind"] == "stream"

    run(body)
    assert any("is participant 'mit.edu'" in r.getMessage() for r in caplog.records)


def test_own_participant_needs_no_trust_dir(run: Run, fed: Federation) -> None:
    async def body() -> None:
        async with (
            tls_serving(fed) as server,
            fed.client(server, "acme", trust_dir=None) as client,
        ):
            assert client.server_info is not None
            assert client.server_info.participant == "acme"
            assert (await client.status())["peer"] == "fake"

    run(body)


def test_plain_server_still_plain(run: Run) -> None:
    async def body() -> None:
        async with ApiServer(FakePeer(), "127.0.0.1", 0) as server:
            assert not server.uses_tls
            async with Client("127.0.0.1", server.port, timeout_s=5) as client:
                assert client.server_info is not None
                assert "participant" not in client.server_info.to_wire()
                assert client.server_participant is None
                assert (await client.status())["peer"] == "fake"

    run(body)


def test_tls_client_of_a_plain_server_says_so(run: Run, fed: Federation) -> None:
    async def body() -> None:
        async with ApiServer(FakePeer(), "127.0.0.1", 0) as server:
            with pytest.raises(Unavailable, match="does it serve TLS"):
                await fed.client(server, "mit.edu").connect()
            async with Client("127.0.0.1", server.port, timeout_s=5) as plain:
                assert (await plain.status())["peer"] == "fake"

    run(body)


# -- refusals ---------------------------------------------------------------------------------


def test_client_without_certificate_is_refused(
    run: Run, fed: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with tls_serving(fed) as server:
            anonymous = Client("127.0.0.1", server.port, timeout_s=5, ssl=no_certificate_context())
            with pytest.raises(Unauthorized, match="does not trust the client certificate"):
                await anonymous.connect()
            plain = Client("127.0.0.1", server.port, timeout_s=5)
            with pytest.raises(Unavailable, match="requires TLS"):
                await plain.connect()
            await wait_until(
                lambda: server.connection_count == 0,
                "server.connection_count == 0",
                5.0,
                every_s=0.01,
            )

    run(body)
    assert len(refusals(caplog)) == 2


def test_untrusted_participant_is_refused(
    run: Run, fed: Federation, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with tls_serving(fed) as server:
            with pytest.raises(Unauthorized, match="does not trust participant 'evil'"):
                await fed.client(server, "evil").connect()
            # A trusted name does not help without that participant's key.
            impostor = fed.client(server, "mit.edu", key_path=fed.keys / "evil.key")
            with pytest.raises(Unauthorized, match=r"participant 'mit\.edu' \(or this key of it\)"):
                await impostor.connect()

    run(body)
    assert len(refusals(caplog)) == 2


def test_client_refuses_a_server_it_does_not_trust(
    run: Run, fed: Federation, tmp_path: Path
) -> None:
    nobody = tmp_path / "trust-nobody"
    nobody.mkdir()

    async def body() -> None:
        async with tls_serving(fed) as server:
            # mit.edu trusts only itself here, and the server is acme's.
            client = fed.client(server, "mit.edu", trust_dir=nobody)
            with pytest.raises(Unauthorized, match="not issued by a participant this client"):
                await client.connect()
            await wait_until(
                lambda: server.connection_count == 0,
                "server.connection_count == 0",
                5.0,
                every_s=0.01,
            )  # and the server lets go

    run(body)


def test_server_keeps_serving_the_good_client_after_bad_ones(
    run: Run, fed: Federation, tmp_path: Path
) -> None:
    nobody = tmp_path / "trust-nobody"
    nobody.mkdir()

    async def body() -> None:
        async with (
            tls_serving(fed, handshake_timeout_s=0.5) as server,
            fed.client(server, "mit.edu") as good,
        ):
            await with_people(good)
            sub = await good.subscribe("people")
            # Raw sockets: one never starts its handshake (dropped when its time is up), one
            # sends bytes that are not TLS.
            silent = await asyncio.open_connection("127.0.0.1", server.port)
            junk = await asyncio.open_connection("127.0.0.1", server.port)
            junk[1].write(b"GET / HTTP/1.0\r\n\r\n")
            bad = [
                Client("127.0.0.1", server.port, timeout_s=5, ssl=no_certificate_context()),
                Client("127.0.0.1", server.port, timeout_s=5),
                fed.client(server, "evil"),
                fed.client(server, "mit.edu", trust_dir=nobody),
            ]
            for client in bad:
                with pytest.raises((Unauthorized, Unavailable)):
                    await client.connect()
            for reader, writer in (silent, junk):
                async with asyncio.timeout(5):
                    with contextlib.suppress(ConnectionError):
                        assert await reader.read() == b""
                writer.close()
            await wait_until(
                lambda: server.connection_count == 1,
                "server.connection_count == 1",
                5.0,
                every_s=0.01,
            )
            await good.push("people", {"name": ["bob"], "id": [2]})
            batch = await sub.next_batch(5)
            assert batch is not None and batch.rows() == [{"name": "bob", "id": 2}]
            async with fed.client(server, "acme", trust_dir=None) as another:
                assert [s["name"] for s in (await another.status()).streams] == ["people"]

    run(body)


def test_too_many_connections_are_refused_over_tls_too(run: Run, fed: Federation) -> None:
    async def body() -> None:
        async with (
            tls_serving(fed, max_connections=1) as server,
            fed.client(server, "mit.edu") as first,
        ):
            with pytest.raises(Unavailable, match="too many client connections"):
                await fed.client(server, "mit.edu").connect()
            assert (await first.status())["peer"] == "fake"

    run(body)


# -- the command line -------------------------------------------------------------------------


@contextlib.contextmanager
def server_thread(fed: Federation) -> Iterator[int]:
    """A TLS API server on its own loop and thread (the CLI runs its own loop); its port."""
    ready = threading.Event()
    stop: list[Callable[[], object]] = []
    port: list[int] = []
    failed: list[BaseException] = []

    async def serve() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(stopped.set))
        async with tls_serving(fed) as server:
            port.append(server.port)
            ready.set()
            async with asyncio.timeout(TEST_TIMEOUT_S):
                await stopped.wait()

    def target() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            failed.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=target, name="api-tls-server")
    thread.start()
    try:
        assert ready.wait(TEST_TIMEOUT_S) and port, failed
        yield port[0]
    finally:
        if stop:
            stop[0]()
        thread.join(TEST_TIMEOUT_S)
        assert not thread.is_alive() and not failed, failed


def test_cli_connects_with_a_participant_key(
    fed: Federation, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("PEER_PARTICIPANT", "PEER_KEY", "PEER_TRUST", "PEER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    with server_thread(fed) as port:
        peer = ["--peer", f"127.0.0.1:{port}", "--timeout", "5"]
        key = ["--participant", "mit.edu", "--key", str(fed.keys / "mit.edu.key")]
        assert main(["status", "--json", *peer, *key, "--trust", str(fed.trust_dir)]) == 0
        assert json.loads(capsys.readouterr().out)["peer"] == "fake"

        assert main(["status", "--json", *peer]) == 2
        assert "requires TLS" in capsys.readouterr().err

        evil = ["--participant", "evil", "--key", str(fed.keys / "evil.key")]
        monkeypatch.setenv("PEER_TRUST", str(fed.trust_dir))
        assert main(["status", "--json", *peer, *evil]) == 1
        assert "does not trust participant 'evil'" in capsys.readouterr().err
