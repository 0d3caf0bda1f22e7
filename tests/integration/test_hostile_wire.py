"""Regression corpus of hostile frames and connections (issue 12, the wire and connection part).

Each case attacks a real peer (``Peer`` in a thread, real sockets, no engine) or a real link
server (TLS with participant keys), asserts that the attack is refused with an error naming the
limit (or absorbed), and, while the attack runs, that a concurrent client's ``hello`` is
answered within 1 s and that the process grows by less than 300 MB.

The concurrent client is a plain blocking socket in a thread of its own (:class:`HelloProbe`),
so that its timings do not depend on any event loop of the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from overlay.tls import TlsContexts
from overlay.wire import DecodeBudget
from peer.node import PeerConfig
from peer.testing import PeerThread, wait_until
from peer.testing.probe import HelloProbe, connect, frame_bytes, read_frame
from tests.integration.test_links import (
    ACME,
    MIT,
    addr,
    federation,
    hello_of,
    pool_of,
    raw_client,
    run,
    serving,
    within,
)

pytestmark = [pytest.mark.timeout(300)]

MB = 1024 * 1024
RSS_LIMIT_BYTES = 300 * MB
HELLO_LIMIT_S = 1.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@contextlib.contextmanager
def a_peer(tmp_path: Path, **settings: Any) -> Iterator[PeerThread]:
    config = PeerConfig(
        data_dir=tmp_path / "peer", port=0, engine=False, overlay=False, fsync=False, **settings
    )
    with PeerThread(config) as peer:
        yield peer


@contextlib.contextmanager
def watched(port: int) -> Iterator[HelloProbe]:
    """The attack runs in the block; afterwards the probe and the RSS are checked."""
    before = rss_bytes()
    with HelloProbe(port) as probe:
        time.sleep(0.2)
        yield probe
        time.sleep(0.2)
    grown = rss_bytes() - before
    assert probe.answers > 0 and not probe.failures, probe.failures[:3]
    assert probe.slowest_s < HELLO_LIMIT_S, f"hello took {probe.slowest_s:.2f} s"
    assert grown < RSS_LIMIT_BYTES, f"grew by {grown / MB:.0f} MB"


def hostile_exchange(port: int, data: bytes) -> dict[str, Any] | None:
    """Send ``data`` on a new connection; the server's answer, then it must close."""
    with connect(port, timeout_s=30) as sock:
        with contextlib.suppress(OSError):  # the server may close before reading it all
            sock.sendall(data)
        reply = read_frame(sock)
        assert read_frame(sock) is None  # and then it closed the connection
        return reply


# -- the client API -----------------------------------------------------------------------------


def test_an_array_of_67_million_empty_maps_is_refused_at_its_header(tmp_path: Path) -> None:
    n = 64 * MB - 32
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    data = struct.pack(">I", len(body)) + body
    with a_peer(tmp_path) as peer, watched(peer.port):
        started = time.perf_counter()
        reply = hostile_exchange(peer.port, data)
        assert reply is not None and reply["code"] == "protocol"
        assert "max_container_len" in reply["message"]
        assert time.perf_counter() - started < 30


def test_many_arrays_of_empty_maps_are_refused_at_the_budget(tmp_path: Path) -> None:
    arrays = 60
    one = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\xdc" + arrays.to_bytes(2, "big") + one * arrays
    data = struct.pack(">I", len(body)) + body
    with a_peer(tmp_path) as peer, watched(peer.port):
        reply = hostile_exchange(peer.port, data)
        assert reply is not None and reply["code"] == "protocol"
        assert "max_decoded_bytes" in reply["message"] or "max_elements" in reply["message"]


def test_deep_nesting_is_refused_naming_max_depth(tmp_path: Path) -> None:
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\x91" * 900 + b"\xc0"
    with a_peer(tmp_path) as peer, watched(peer.port):
        reply = hostile_exchange(peer.port, struct.pack(">I", len(body)) + body)
        assert reply is not None and "max_depth" in reply["message"]


def test_a_budget_set_in_the_config_applies(tmp_path: Path) -> None:
    frame = frame_bytes({"type": "push", "id": 1, "stream": "s", "columns": {"x": [1] * 50}})
    with a_peer(tmp_path, max_frame_elements=40) as peer, watched(peer.port):
        reply = hostile_exchange(peer.port, frame)
        assert reply is not None and "more than 40 elements (max_elements)" in reply["message"]


def test_a_frame_half_sent_for_too_long_is_dropped(tmp_path: Path) -> None:
    with a_peer(tmp_path, frame_timeout_s=1.0) as peer, watched(peer.port):
        socks = [connect(peer.port) for _ in range(8)]
        for sock in socks:  # each announces 60 MB and sends a little of it
            sock.sendall(struct.pack(">I", 60 * MB) + b"\x82" + b"\x00" * 4096)
        started = time.perf_counter()
        for sock in socks:
            reply = read_frame(sock)
            assert reply is not None and "frame_timeout_s" in reply["message"]
            assert read_frame(sock) is None
            sock.close()
        assert time.perf_counter() - started < 10


def test_large_frames_sent_slowly_together_hold_a_bounded_amount(tmp_path: Path) -> None:
    # 8 connections each send 48 MB of a 60 MB frame and stall: the first two take the
    # 128 MiB budget of large frames in progress, the others are not read until there is room.
    size, sent = 60 * MB, 48 * MB
    chunk = struct.pack(">I", size) + b"\x82" + bytes(sent)
    with a_peer(tmp_path, frame_timeout_s=4.0) as peer, watched(peer.port):
        before = rss_bytes()
        socks = [connect(peer.port, timeout_s=30) for _ in range(8)]

        def stall(sock: Any) -> None:
            with contextlib.suppress(OSError):  # dropped by the server meanwhile
                sock.sendall(chunk)

        senders = [threading.Thread(target=stall, args=(s,), daemon=True) for s in socks]
        for t in senders:
            t.start()
        peak = before
        deadline = time.perf_counter() + 3.0
        while time.perf_counter() < deadline:  # while the frames are held
            peak = max(peak, rss_bytes())
            time.sleep(0.05)
        assert peak - before < 200 * MB, f"held {(peak - before) / MB:.0f} MB"
        for sock in socks:
            reply = read_frame(sock)
            assert reply is not None and "frame_timeout_s" in reply["message"]
            sock.close()
        for t in senders:
            t.join(10)


def test_an_idle_connection_is_closed(tmp_path: Path) -> None:
    with (
        a_peer(tmp_path, api_idle_timeout_s=1.0) as peer,
        watched(peer.port),
        connect(peer.port) as idle,
    ):
        idle.sendall(frame_bytes({"type": "hello", "id": 1, "client": "idle"}))
        assert (read_frame(idle) or {}).get("type") == "ok"
        started = time.perf_counter()
        assert read_frame(idle) is None  # closed by the server, not by us
        assert 0.9 < time.perf_counter() - started < 10


def test_idle_connections_cannot_lock_others_out(tmp_path: Path) -> None:
    # 256 connections that say nothing fill the server; newcomers evict the longest idle.
    with a_peer(tmp_path, evict_idle_s=0.5, max_connections_per_address=300) as peer:
        hogs = [connect(peer.port) for _ in range(256)]
        try:
            time.sleep(1.0)
            with watched(peer.port) as probe:
                time.sleep(0.5)
            assert probe.answers > 0
            api = peer.peer.api
            assert api is not None and api._listener.admission.evictions >= 1
            hogs[0].settimeout(5)
            assert read_frame(hogs[0]) is None  # the longest idle made room
        finally:
            for hog in hogs:
                hog.close()


def test_one_address_holds_at_most_its_share(tmp_path: Path) -> None:
    with a_peer(tmp_path, max_connections_per_address=4, evict_idle_s=60) as peer:
        first = [connect(peer.port) for _ in range(4)]
        try:
            for sock in first:
                sock.sendall(frame_bytes({"type": "hello", "id": 1, "client": "x"}))
                assert (read_frame(sock) or {}).get("type") == "ok"
            with connect(peer.port) as fifth:
                reply = read_frame(fifth)
                assert reply is not None and reply["code"] == "unavailable"
                assert "max_per_address" in reply["message"]
        finally:
            for sock in first:
                sock.close()


def test_a_lookup_of_a_40_mb_name_is_refused_in_a_small_reply(tmp_path: Path) -> None:
    name = "n" * (40 * MB)
    data = frame_bytes({"type": "lookup", "id": 7, "name": name})
    with a_peer(tmp_path) as peer, watched(peer.port), connect(peer.port, timeout_s=30) as sock:
        sock.sendall(data)
        reply = read_frame(sock)
        assert reply is not None and reply["id"] == 7 and reply["type"] == "error"
        assert len(msgpack.packb(reply)) < 64 * 1024
        assert f"({len(name)} characters" in str(reply)
        sock.sendall(frame_bytes({"type": "hello", "id": 8, "client": "same"}))
        assert (read_frame(sock) or {}).get("id") == 8  # the connection goes on


# -- peer links ---------------------------------------------------------------------------------


def test_a_link_frame_over_budget_closes_only_that_link() -> None:
    budgeted = DecodeBudget(max_elements=1000)

    async def main() -> None:
        from overlay.link.protocol import LinkSettings

        async with (
            serving(limits=LinkSettings(budget=budgeted)) as (server, _),
            pool_of() as pool,
        ):
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
            writer.write(frame_bytes({"type": "req", "id": 1, "body": {"m": [{}] * 5000}}))
            await writer.drain()
            assert await within(stream.recv()) is None
            await stream.aclose()
            await wait_until(
                lambda: len(server.links) == 1, "len(server.links) == 1", 5.0, every_s=0.01
            )
            assert await pool.request(where, {"type": "echo", "x": 2}, timeout_s=5)

    run(main)


def test_unauthenticated_connections_cannot_keep_a_peer_off_a_link_port() -> None:
    async def main() -> None:
        from overlay.link.protocol import LinkSettings

        limits = LinkSettings(evict_idle_s=0.3, max_per_address=300)
        async with serving(max_links=64, limits=limits) as (server, _), pool_of() as pool:
            hogs = [
                await asyncio.open_connection("127.0.0.1", server.port) for _ in range(64)
            ]  # TCP only, no TLS handshake
            await asyncio.sleep(0.5)
            assert await pool.request(addr(server), {"type": "echo", "x": 1}, timeout_s=5)
            for _reader, writer in hogs:
                writer.close()

    run(main, timeout_s=30)


def test_a_half_sent_link_frame_is_dropped_in_time() -> None:
    async def main() -> None:
        from overlay.link.protocol import LinkSettings

        async with serving(limits=LinkSettings(frame_timeout_s=0.5)) as (server, _):
            stream, writer = await raw_client(
                server, TlsContexts(MIT, federation(ACME, MIT)).client
            )
            await stream.send(hello_of(MIT))
            assert (await within(stream.recv()) or {}).get("type") == "hello"
            writer.write(struct.pack(">I", 1000) + b"\x81")
            await writer.drain()
            assert await within(stream.recv(), 5) is None
            await stream.aclose()
            await wait_until(lambda: not server.links, "not server.links", 5.0, every_s=0.01)

    run(main)


# -- the DHT after a stall --------------------------------------------------------------------


def test_a_contact_declared_dead_is_restored_when_it_comes_back() -> None:
    # After a stall both peers declared each other dead (depart) and had 0 DHT contacts left;
    # gossip's "alive" (welcome_back) must give them back (issue 12).
    from tests.integration.test_dht import addr as dht_addr
    from tests.integration.test_dht import network
    from tests.integration.test_dht import run as dht_run

    async def main() -> None:
        async with network(2) as net:
            a, b = net.servers
            await wait_until(
                lambda: a.routing_size() == 1 and b.routing_size() == 1,
                "a.routing_size() == 1 and b.routing_size() == 1",
                5.0,
                every_s=0.01,
            )
            assert a.protocol is not None and b.protocol is not None
            a.protocol.depart(b.node.id)
            b.protocol.depart(a.node.id)
            assert a.routing_size() == 0 and b.routing_size() == 0
            a.protocol.welcome_back(b.node.id)  # the contact it had
            b.protocol.welcome_back(a.node.id, dht_addr(a))  # or the member's address
            await wait_until(
                lambda: a.routing_size() == 1 and b.routing_size() == 1,
                "a.routing_size() == 1 and b.routing_size() == 1",
                5.0,
                every_s=0.01,
            )

    dht_run(main)
