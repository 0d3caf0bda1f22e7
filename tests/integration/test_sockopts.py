"""Every TCP connection a peer opens or accepts gives up on data left unacknowledged for
UNACKED_TIMEOUT_S (TCP_USER_TIMEOUT), so a link across a healed partition is opened anew
instead of waiting out TCP's doubling retransmission timeout (real loopback sockets)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from overlay.sockopts import UNACKED_TIMEOUT_S
from overlay.transport import TCP

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "TCP_USER_TIMEOUT"), reason="TCP_USER_TIMEOUT is Linux's"
)


def test_a_connection_opened_by_the_transport_gives_up_on_unacknowledged_data() -> None:
    async def main() -> tuple[int, int]:
        accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

        async def serve(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await accepted.put(w)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10):
            stream = await TCP.connect("127.0.0.1", port)
            theirs = await accepted.get()
        sock = stream._writer.get_extra_info("socket")
        mine = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
        nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        await stream.aclose(1.0)
        theirs.close()
        server.close()
        await server.wait_closed()
        return mine, nodelay

    user_timeout_ms, nodelay = asyncio.run(main())
    assert user_timeout_ms == int(UNACKED_TIMEOUT_S * 1000)
    assert nodelay == 1
