"""Peer links over real loopback sockets with real TLS: requests both ways, backpressure,
credit-based streams, refusals (trust, identity), bad frames, idle and broken links.

Every wait is bounded (``within``), nothing asserts on timing, and every server and pool is
closed by the test that opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from overlay.identity import IdentityError, NodeIdentity, TrustStore
from overlay.link import (
    Link,
    LinkPool,
    LinkRefused,
    LinkRemoteError,
    LinkServer,
    LinkTimeout,
    LinkUnavailable,
)
from overlay.tls import (
    TlsContexts,
    anchor_name,
    build_context,
    client_cert_context,
    peer_participant,
    server_context,
)
from overlay.transport import FrameStream
from peer.testing import wait_until

T = TypeVar("T")

ACME = NodeIdentity.create("acme", Ed25519PrivateKey.generate())
MIT = NodeIdentity.create("mit.edu", Ed25519PrivateKey.generate())
EVIL = NodeIdentity.create("evil", Ed25519PrivateKey.generate())


def federation(*members: NodeIdentity) -> TrustStore:
    trust = TrustStore()
    for member in members:
        trust.add(member.participant, member.participant_pub)
    return trust


_loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def event_loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test runs on asyncio's loop and on uvloop (the one peers use)."""
    global _loop_factory
    if request.param == "uvloop":
        _loop_factory = pytest.importorskip("uvloop").new_event_loop
    yield request.param
    _loop_factory = None


def run(main: Callable[[], Coroutine[Any, Any, None]], timeout_s: float = 15.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout_s):
            await main()

    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        runner.run(bounded())


async def within(aw: Awaitable[T], timeout_s: float = 5.0) -> T:
    async with asyncio.timeout(timeout_s):
        return await aw


class Refusal(Exception):
    """An error the way the peer's errors look (code, retriable, to_wire)."""

    code = "not_found"
    retriable = True

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "details": {"stream": "people"}}


@dataclass
class Handler:
    """Echo, fail, block, call back; streams that count and record what they produced."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    active: int = 0
    peak: int = 0
    produced: int = 0
    cancelled: list[str] = field(default_factory=list)
    seen_participants: set[str] = field(default_factory=set)

    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        self.seen_participants.add(link.remote_participant)
        op = frame["type"]
        if op == "echo":
            return {"echo": frame["x"], "by": link.remote_participant}
        if op == "fail":
            raise Refusal("stream 'people' does not exist")
        if op == "crash":
            raise ValueError("a bug")
        if op == "call_back":  # ask the caller something over the same link
            reply = await link.request({"type": "echo", "x": frame["x"]}, timeout_s=5)
            return {"relayed": reply}
        if op == "block":
            self.active += 1
            self.peak = max(self.peak, self.active)
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append("block")
                raise
            finally:
                self.active -= 1
            return {"released": frame.get("n")}
        raise Refusal(f"unknown op {op}")

    async def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            for i in range(frame.get("n", 1 << 30)):
                if frame.get("fail_at") == i:
                    raise Refusal("the stream broke")
                self.produced += 1
                yield {"i": i, "pad": b"x" * frame.get("pad", 0)}
        except GeneratorExit:
            self.cancelled.append("stream")
            raise


@contextlib.asynccontextmanager
async def serving(
    identity: NodeIdentity = ACME,
    trust: TrustStore | None = None,
    handler: Handler | None = None,
    **kw: Any,
) -> AsyncIterator[tuple[LinkServer, Handler]]:
    handler = handler or Handler()
    server = LinkServer(identity, trust or federation(ACME, MIT), handler, **kw)
    await within(server.start())
    try:
        yield server, handler
    finally:
        await within(server.close(), 10)


@contextlib.asynccontextmanager
async def pool_of(
    identity: NodeIdentity = MIT, trust: TrustStore | None = None, **kw: Any
) -> AsyncIterator[LinkPool]:
    pool = LinkPool(identity, trust or federation(ACME, MIT), **kw)
    await within(pool.start())
    try:
        yield pool
    finally:
        await within(pool.close(), 10)


def addr(server: LinkServer) -> tuple[str, int]:
    return ("127.0.0.1", server.port)


# -- requests ---------------------------------------------------------------------------------


def test_requests_both_directions() -> None:
    async def main() -> None:
        client_handler = Handler()
        async with serving() as (server, _), pool_of(handler=client_handler) as pool:
            reply = await pool.request(addr(server), {"type": "echo", "x": [1, "a"]}, timeout_s=5)
            assert reply == {"echo": [1, "a"], "by": "mit.edu"}
            # the server asks the client back over the same link, while serving its request
            relayed = await pool.request(addr(server), {"type": "call_back", "x": 7}, timeout_s=5)
            assert relayed == {"relayed": {"echo": 7, "by": "acme"}}
            link = await pool.link(addr(server), node_id=ACME.node_id, timeout_s=5)
            assert (link.remote_node_id, link.remote_participant) == (ACME.node_id, "acme")
            (server_side,) = server.links
            assert (server_side.remote_node_id, server_side.remote_participant) == (
                MIT.node_id,
                "mit.edu",
            )
            assert len(pool.links) == 1  # one link, reused
            for side in (link, server_side):  # small frames (credit) must not wait for Nagle
                sock = side._stream._writer.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    run(main)


def test_error_replies() -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            with pytest.raises(LinkRemoteError) as refused:
                await pool.request(addr(server), {"type": "fail"}, timeout_s=5)
            err = refused.value
            assert (err.code, err.retriable, err.details) == (
                "not_found",
                True,
                {"stream": "people"},
            )
            assert err.message == "stream 'people' does not exist"
            with pytest.raises(LinkRemoteError) as crashed:
                await pool.request(addr(server), {"type": "crash"}, timeout_s=5)
            assert crashed.value.code == "internal" and not crashed.value.retriable
            assert "a bug" not in crashed.value.message  # details stay in the server's log
            # a link that opened no server side answers 'unsupported'
            link = await pool.link(addr(server), timeout_s=5)
            server_side = next(iter(server.links))
            with pytest.raises(LinkRemoteError) as unsupported:
                await server_side.request({"type": "echo", "x": 1}, timeout_s=5)
            assert unsupported.value.code == "unsupported"
            assert not link.closed

    run(main)


def test_many_concurrent_requests_are_bounded_by_max_in_flight() -> None:
    async def main() -> None:
        async with serving(max_in_flight=8) as (server, handler), pool_of() as pool:
            where = addr(server)
            echoes = await within(
                asyncio.gather(
                    *(
                        pool.request(where, {"type": "echo", "x": i}, timeout_s=10)
                        for i in range(300)
                    )
                )
            )
            assert [e["echo"] for e in echoes] == list(range(300))
            assert len(server.links) == 1  # the first 300 callers shared one new link

            # 40 requests that block: the server never runs more than 8 (the lower limit of
            # the two hellos); the others wait at the caller, then all complete.
            blocked = [
                asyncio.create_task(pool.request(where, {"type": "block", "n": i}, timeout_s=10))
                for i in range(40)
            ]
            await wait_until(lambda: handler.active == 8, "handler.active == 8", 5.0, every_s=0.01)
            await asyncio.sleep(0.2)
            assert handler.active == 8 and handler.peak == 8
            handler.gate.set()
            results = await within(asyncio.gather(*blocked))
            assert sorted(r["released"] for r in results) == list(range(40))
            assert handler.peak == 8

    run(main)


def test_timed_out_request_is_cancelled_on_the_remote_and_frees_its_slot() -> None:
    async def main() -> None:
        async with serving(max_in_flight=1) as (server, handler), pool_of() as pool:
            where = addr(server)
            # the link first: on a loaded machine its handshake alone may outlast 0.3 s, and a
            # request that never reached the remote has nothing there to cancel
            await pool.link(where, timeout_s=5)
            with pytest.raises(LinkTimeout):
                await pool.request(where, {"type": "block"}, timeout_s=0.3)
            await wait_until(
                lambda: handler.cancelled == ["block"],
                "handler.cancelled == ['block']",
                5.0,
                every_s=0.01,
            )
            # the only slot came back with the 'cancelled' reply: the link works on
            assert (await pool.request(where, {"type": "echo", "x": 1}, timeout_s=5))["echo"] == 1

    run(main)


# -- streams ----------------------------------------------------------------------------------


def test_stream_credit_bounds_a_slow_receiver_and_loses_nothing() -> None:
    async def main() -> None:
        credit, total = 8, 500
        async with serving() as (server, handler), pool_of() as pool:
            link = await pool.link(addr(server), timeout_s=5)
            async with link.open_stream({"type": "count", "n": total}, credit=credit) as items:
                first = [await within(anext(items)) for _ in range(3)]
                # The receiver stops consuming. The producer may run ahead by the credit
                # only: 3 taken, credit given back in halves (4 at a time) -> 3 - 3 % 4 + 8.
                await wait_until(
                    lambda: handler.produced >= credit,
                    "handler.produced >= credit",
                    5.0,
                    every_s=0.01,
                )
                await asyncio.sleep(0.3)
                assert handler.produced == credit
                # ... and it stays bounded however long the receiver waits
                await asyncio.sleep(0.2)
                assert handler.produced == credit
                rest = [item async for item in items]
            assert [item["i"] for item in first + rest] == list(range(total))
            assert handler.produced == total

    run(main)


def test_stream_backpressure_with_large_items_keeps_memory_bounded() -> None:
    async def main() -> None:
        pad = 256 * 1024  # several socket buffers' worth per item
        async with serving() as (server, handler), pool_of() as pool:
            link = await pool.link(addr(server), timeout_s=5)
            async with link.open_stream({"type": "count", "n": 40, "pad": pad}, credit=2) as items:
                await within(anext(items))
                await asyncio.sleep(0.3)
                assert handler.produced <= 1 + 2
                count = 1 + len([item async for item in items])
            assert count == 40 == handler.produced

    run(main)


def test_a_receiver_that_stops_reading_its_socket_stalls_the_producer() -> None:
    """With more credit than items, only the outbox bound and TCP push back on the sender."""

    async def main() -> None:
        total, pad = 1000, 64 * 1024
        async with serving(outbox_frames=8) as (server, handler):
            stream, _ = await raw_client(server, TlsContexts(MIT, federation(ACME, MIT)).client)
            await stream.send(hello_of(MIT))
            assert (await within(stream.recv()) or {}).get("type") == "hello"
            body = {"type": "count", "n": total, "pad": pad}
            await stream.send({"type": "open", "id": 1, "body": body, "credit": 1 << 16})
            await wait_until(
                lambda: handler.produced > 8, "handler.produced > 8", 5.0, every_s=0.01
            )
            await asyncio.sleep(0.5)  # not reading: socket buffers and the outbox fill up
            stalled_at = handler.produced
            assert stalled_at < total / 2  # 64 MiB were asked for; a few MiB are in flight
            got = []
            while (frame := await within(stream.recv())) is not None and frame["type"] == "item":
                got.append(frame["body"]["i"])
            assert frame is not None and frame == {"type": "end", "id": 1}
            assert got == list(range(total))
            await stream.aclose()

    run(main)


def test_closing_a_stream_cancels_it_on_the_remote() -> None:
    async def main() -> None:
        async with serving(max_streams=2) as (server, handler), pool_of() as pool:
            link = await pool.link(addr(server), timeout_s=5)
            for round_ in range(1, 6):  # more rounds than stream slots: closing frees them
                async with link.open_stream({"type": "forever"}, credit=4) as items:
                    got = [(await within(anext(items)))["i"] for _ in range(3)]
                    assert got == [0, 1, 2]
                await wait_until(
                    lambda: handler.cancelled.count("stream") == round_,  # noqa: B023
                    "handler.cancelled.count('stream') == round_",
                    5.0,
                    every_s=0.01,
                )
            assert (await link.request({"type": "echo", "x": 2}, timeout_s=5))["echo"] == 2

    run(main)


def test_a_failing_stream_delivers_what_it_produced_then_the_error() -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            link = await pool.link(addr(server), timeout_s=5)
            got = []
            with pytest.raises(LinkRemoteError) as failed:
                async with link.open_stream({"type": "count", "n": 10, "fail_at": 5}) as items:
                    async for item in items:
                        got.append(item["i"])
            assert got == [0, 1, 2, 3, 4] and failed.value.code == "not_found"

    run(main)


# -- who gets in ------------------------------------------------------------------------------


def test_untrusted_participant_is_refused_at_the_handshake(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as trusted:
            where = addr(server)
            # evil trusts acme, so it accepts the server; the server does not trust evil
            async with pool_of(EVIL, federation(EVIL, ACME)) as stranger:
                with pytest.raises(LinkRefused, match="does not trust participant 'evil'"):
                    await stranger.request(where, {"type": "echo", "x": 1}, timeout_s=5)
                reply = await trusted.request(where, {"type": "echo", "x": 2}, timeout_s=5)
                assert reply["echo"] == 2
            # the other way round: a server of a participant we do not trust
            async with serving(EVIL, federation(EVIL, MIT)) as (evil_server, _):
                with pytest.raises(LinkRefused, match="TLS handshake"):
                    await trusted.request(addr(evil_server), {"type": "echo"}, timeout_s=5)
            assert (await trusted.request(where, {"type": "echo", "x": 3}, timeout_s=5))[
                "echo"
            ] == 3
            assert all(link.remote_participant != "evil" for link in server.links)

    with caplog.at_level(logging.WARNING, logger="overlay.link"):
        run(main)
    assert "refused 127.0.0.1" in caplog.text and "at the TLS handshake" in caplog.text


def test_a_trust_store_change_lets_a_new_participant_in() -> None:
    async def main() -> None:
        trust = federation(ACME)
        async with serving(trust=trust) as (server, _), pool_of() as pool:
            with pytest.raises(LinkRefused):
                await pool.request(addr(server), {"type": "echo", "x": 1}, timeout_s=5)
            trust.add(MIT.participant, MIT.participant_pub)  # e.g. a contract was signed
            assert (await pool.request(addr(server), {"type": "echo", "x": 1}, timeout_s=5))[
                "echo"
            ] == 1

    run(main)


def forged_client_context(
    *, issuer_of: NodeIdentity, signer: Ed25519PrivateKey, cn: str
) -> ssl.SSLContext:
    node_key = Ed25519PrivateKey.generate()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(anchor_name(issuer_of.participant, issuer_of.participant_pub))
        .public_key(node_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .sign(signer, None)
    )
    return build_context(server=False, trust=federation(ACME, MIT), cert=cert, key=node_key)


async def raw_client(
    server: LinkServer, ctx: ssl.SSLContext
) -> tuple[FrameStream, asyncio.StreamWriter]:
    reader, writer = await within(asyncio.open_connection("127.0.0.1", server.port, ssl=ctx))
    return FrameStream(reader, writer, max_frame_bytes=1 << 20), writer


def test_forged_certificates_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            # evil signs a certificate under acme's issuer name
            ctx = forged_client_context(issuer_of=ACME, signer=EVIL.participant_key, cn="x")
            stream, _ = await raw_client(server, ctx)
            await stream.send({"type": "hello"})
            assert await within(stream.recv()) is None  # dropped
            await stream.aclose()
            # acme really signs it, but the certificate names another node than its key
            ctx = forged_client_context(
                issuer_of=ACME, signer=ACME.participant_key, cn=MIT.node_id.hex()
            )
            stream, _ = await raw_client(server, ctx)
            await stream.send({"type": "hello"})
            assert await within(stream.recv()) is None
            await stream.aclose()
            assert await pool.request(addr(server), {"type": "echo", "x": 1}, timeout_s=5)
            assert [link.remote_participant for link in server.links] == ["mit.edu"]

    with caplog.at_level(logging.WARNING, logger="overlay.link"):
        run(main)
    assert "at the TLS handshake" in caplog.text  # the forged signature: OpenSSL refused it
    assert "names node" in caplog.text  # the wrong node id: our check after the handshake


def test_api_client_certificate_names_its_participant() -> None:
    """The client port's TLS: a client holding only a participant key (no node) is known by
    its participant; a stranger's key gets nowhere."""

    async def main() -> None:
        trust = federation(ACME, MIT)
        seen: list[tuple[str, bytes] | str] = []

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                seen.append(peer_participant(writer.get_extra_info("ssl_object"), trust))
            except IdentityError as exc:
                seen.append(exc.reason)
            writer.close()

        server = await asyncio.start_server(
            on_client, "127.0.0.1", 0, ssl=server_context(ACME, trust)
        )
        port = server.sockets[0].getsockname()[1]
        try:
            ctx = client_cert_context("mit.edu", MIT.participant_key, federation(ACME))
            _, writer = await within(asyncio.open_connection("127.0.0.1", port, ssl=ctx))
            await wait_until(lambda: len(seen) == 1, "len(seen) == 1", 5.0, every_s=0.01)
            assert seen == [("mit.edu", MIT.participant_pub)]
            writer.close()
            # evil's client certificate never gets past the server's handshake
            ctx = client_cert_context("evil", EVIL.participant_key, federation(ACME))
            reader, writer = await within(asyncio.open_connection("127.0.0.1", port, ssl=ctx))
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                assert await within(reader.read()) == b""
            writer.close()
            assert len(seen) == 1
        finally:
            server.close()
            await within(server.wait_closed())

    run(main)


def hello_of(identity: NodeIdentity, **changes: Any) -> dict[str, Any]:
    hello = {
        "type": "hello",
        "version": 1,
        "node_id": identity.node_id,
        "participant": identity.participant,
        "max_in_flight": 4,
        "max_streams": 4,
    }
    return {**hello, **changes}


def test_a_node_claiming_another_node_id_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            # the pool expects another node at that address
            with pytest.raises(LinkRefused, match="not the expected node"):
                await pool.request(
                    addr(server), {"type": "echo", "x": 1}, node_id=MIT.node_id, timeout_s=5
                )
            # a client whose hello claims acme's node id over mit's certificate
            stream, _ = await raw_client(server, TlsContexts(MIT, federation(ACME, MIT)).client)
            await stream.send(hello_of(MIT, node_id=ACME.node_id))
            refusal = await within(stream.recv())
            assert refusal is not None and refusal["type"] == "refused"
            assert "which its certificate does not prove" in refusal["reason"]
            assert await within(stream.recv()) is None
            await stream.aclose()
            reply = await pool.request(
                addr(server), {"type": "echo", "x": 2}, node_id=ACME.node_id, timeout_s=5
            )
            assert reply["echo"] == 2

    with caplog.at_level(logging.WARNING, logger="overlay.link"):
        run(main)
    assert "which its certificate does not prove" in caplog.text


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"version": 2}, "speaks link protocol version 2"),
        ({"participant": "acme"}, "claims participant 'acme'"),
        ({"max_in_flight": 0}, "without valid limits"),
        ({"type": "req", "id": 1, "body": {}}, "did not start with a hello"),
    ],
)
def test_a_bad_hello_is_refused(changes: dict[str, Any], reason: str) -> None:
    async def main() -> None:
        async with serving() as (server, _):
            stream, _ = await raw_client(server, TlsContexts(MIT, federation(ACME, MIT)).client)
            await stream.send(hello_of(MIT, **changes))
            refusal = await within(stream.recv())
            assert refusal is not None and refusal["type"] == "refused"
            assert reason in refusal["reason"] and refusal["retriable"] is False
            await stream.aclose()
            assert not server.links

    run(main)


def test_a_full_server_turns_links_away_as_retriable() -> None:
    async def main() -> None:
        async with serving(max_links=1) as (server, _), pool_of() as first:
            where = addr(server)
            assert await first.request(where, {"type": "echo", "x": 1}, timeout_s=5)
            async with pool_of() as second:
                with pytest.raises(LinkUnavailable) as turned_away:
                    await second.request(where, {"type": "echo", "x": 2}, timeout_s=5)
                assert turned_away.value.retriable
                await within(first.close())
                await wait_until(lambda: not server.links, "not server.links", 5.0, every_s=0.01)
                assert await second.request(where, {"type": "echo", "x": 3}, timeout_s=5)

    run(main)


@pytest.mark.parametrize(
    "bad",
    [
        b"\x00\x00\x00\x03\xc1\xc1\xc1",  # not msgpack
        b"\xff\xff\xff\xff",  # longer than the frame limit
    ],
)
def test_a_malformed_frame_closes_only_that_link(bad: bytes) -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            where = addr(server)
            assert await pool.request(where, {"type": "echo", "x": 1}, timeout_s=5)
            stream, writer = await raw_client(
                server, TlsContexts(MIT, federation(ACME, MIT)).client
            )
            await stream.send(hello_of(MIT))
            assert (await within(stream.recv()) or {}).get("type") == "hello"
            await wait_until(
                lambda: len(server.links) == 2, "len(server.links) == 2", 5.0, every_s=0.01
            )
            writer.write(bad)
            await writer.drain()
            assert await within(stream.recv()) is None  # the server closed this link ...
            await stream.aclose()
            await wait_until(
                lambda: len(server.links) == 1, "len(server.links) == 1", 5.0, every_s=0.01
            )
            # ... and only this one
            assert await pool.request(where, {"type": "echo", "x": 2}, timeout_s=5)
            assert len(pool.links) == 1

    run(main)


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "rep", "id": 99, "body": {}},  # a reply to nothing
        {"type": "req", "id": "1", "body": {}},  # id not an int
        {"type": "req", "id": 1},  # no body
        {"type": "credit", "id": 1, "n": 1 << 40},
        {"type": "teleport"},
    ],
)
def test_a_frame_breaking_the_link_protocol_closes_only_that_link(frame: dict[str, Any]) -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of() as pool:
            stream, _ = await raw_client(server, TlsContexts(MIT, federation(ACME, MIT)).client)
            await stream.send(hello_of(MIT))
            assert (await within(stream.recv()) or {}).get("type") == "hello"
            if frame["type"] == "credit":  # credit for an open stream, beyond any limit
                await stream.send({"type": "open", "id": 1, "body": {"type": "x"}, "credit": 0})
            await stream.send(frame)
            while (got := await within(stream.recv())) is not None:
                assert got["type"] == "end"  # the stream's end may come first
            await stream.aclose()
            assert await pool.request(addr(server), {"type": "echo", "x": 2}, timeout_s=5)

    run(main)


def test_more_requests_than_announced_closes_the_link() -> None:
    async def main() -> None:
        async with serving(max_in_flight=2) as (server, handler):
            stream, _ = await raw_client(server, TlsContexts(MIT, federation(ACME, MIT)).client)
            await stream.send(hello_of(MIT))
            assert (await within(stream.recv()) or {})["max_in_flight"] == 2
            for rid in (1, 2, 3):
                await stream.send({"type": "req", "id": rid, "body": {"type": "block"}})
            assert await within(stream.recv()) is None
            await stream.aclose()
            await wait_until(
                lambda: handler.cancelled.count("block") == 2,
                "handler.cancelled.count('block') == 2",
                5.0,
                every_s=0.01,
            )

    run(main)


# -- link lifecycle ---------------------------------------------------------------------------


def test_idle_link_is_closed_and_reopened_transparently() -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of(idle_timeout_s=0.2) as pool:
            where = addr(server)
            first = await pool.link(where, timeout_s=5)
            await pool.request(where, {"type": "echo", "x": 1}, timeout_s=5)
            await wait_until(
                lambda: not pool.links and not server.links,
                "not pool.links and not server.links",
                5.0,
                every_s=0.01,
            )
            assert first.closed
            assert (await pool.request(where, {"type": "echo", "x": 2}, timeout_s=5))["echo"] == 2
            assert pool.links[where] is not first

    run(main)


def test_busy_links_are_not_idle() -> None:
    async def main() -> None:
        async with serving() as (server, _), pool_of(idle_timeout_s=0.1) as pool:
            link = await pool.link(addr(server), timeout_s=5)
            async with link.open_stream({"type": "count", "n": 3}, credit=1) as items:
                assert (await within(anext(items)))["i"] == 0
                await asyncio.sleep(0.4)  # several idle periods with a stream open
                assert not link.closed
                assert [i["i"] async for i in items] == [1, 2]

    run(main)


def test_broken_link_is_reopened_on_next_use() -> None:
    async def main() -> None:
        async with pool_of() as pool:
            async with serving() as (server, _):
                port = server.port
                where = addr(server)
                assert await pool.request(where, {"type": "echo", "x": 1}, timeout_s=5)
            await wait_until(lambda: not pool.links, "not pool.links", 5.0, every_s=0.01)
            with pytest.raises(LinkUnavailable):
                await pool.request(where, {"type": "echo", "x": 1}, timeout_s=5)
            async with serving(port=port) as (again, _):
                assert await pool.request(where, {"type": "echo", "x": 2}, timeout_s=5)
                assert again.port == port

    run(main)


def test_pool_keeps_at_most_max_links() -> None:
    async def main() -> None:
        async with (
            serving() as (a, _),
            serving() as (b, _),
            pool_of(max_links=1) as pool,
        ):
            for _ in range(3):
                for server in (a, b):
                    reply = await pool.request(addr(server), {"type": "echo", "x": 1}, timeout_s=5)
                    assert reply["echo"] == 1
                    assert list(pool.links) == [addr(server)]

    run(main)


def test_server_close_ends_everything_within_a_bounded_time() -> None:
    async def main() -> None:
        async with pool_of() as pool:
            async with serving() as (server, handler):
                where = addr(server)
                link = await pool.link(where, timeout_s=5)
                pending = asyncio.create_task(link.request({"type": "block"}, timeout_s=30))
                items = link.open_stream({"type": "forever"}, credit=2)
                assert (await within(anext(items)))["i"] == 0
                await wait_until(
                    lambda: handler.active == 1, "handler.active == 1", 5.0, every_s=0.01
                )
                await within(server.close(), 5)
                assert not server.links
            with pytest.raises(LinkUnavailable):
                await within(pending)
            with pytest.raises(LinkUnavailable):
                while True:
                    await within(anext(items))
            await items.aclose()
            assert handler.cancelled.count("block") == 1 and "stream" in handler.cancelled
            await wait_until(
                lambda: link.closed and not pool.links,
                "link.closed and not pool.links",
                5.0,
                every_s=0.01,
            )

    run(main)
