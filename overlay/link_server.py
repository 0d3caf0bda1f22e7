"""The accepting side of peer links: a TCP port whose connections become links.

Theory of operation
-------------------
The server accepts each socket itself and has the loop wrap it in TLS from its first byte
(:meth:`LinkServer._accept_loop` says why), then reads who the certificate proves
(:func:`~overlay.tls.peer_identity`), waits for the client's ``hello`` and answers with its
own, or with ``refused`` and the reason when the hello does not match the certificate. Each
of these steps is bounded by ``handshake_timeout_s``. The link then runs in the server's task
group until either side closes it. A connection beyond ``max_links`` (handshaking or running)
is closed before its TLS handshake, which the client takes as a failure worth retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

from overlay.errors import RemoteProtocolError
from overlay.identity import IdentityError, NodeIdentity, TrustStore
from overlay.link_connection import Link, LinkHandler
from overlay.link_pool import _Group
from overlay.link_protocol import (
    _CLOSE_WAIT_S,
    LinkRefused,
    LinkSettings,
    _check_hello,
    _hello,
    _tls_reason,
)
from overlay.stream import FrameStream
from overlay.tls import TlsContexts, peer_identity
from overlay.wire import DEFAULT_MAX_FRAME_BYTES

__all__ = ["LinkServer"]

log = logging.getLogger(__name__)


class LinkServer:
    """Accepts peer links on a TCP port and serves them with ``handler``.

    ``await start()`` / ``await close()``, or ``async with``. A connection whose certificate
    is not from a trusted participant, or whose hello does not match its certificate, is
    refused and logged with the reason; the server keeps serving everyone else.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        trust: TrustStore,
        handler: LinkHandler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: TlsContexts | None = None,
        max_links: int = 256,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 32,
        max_streams: int = 64,
        outbox_frames: int = 64,
        handshake_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
    ) -> None:
        self.identity = identity
        self.trust = trust
        self.handler = handler
        self.host = host
        self._requested_port = port
        self.tls = tls or TlsContexts(identity, trust)
        self.max_links = max_links
        self.settings = LinkSettings(
            max_frame_bytes,
            max_in_flight,
            max_streams,
            outbox_frames,
            handshake_timeout_s,
            close_timeout_s,
        )
        self._group = _Group(f"link server of {identity.participant}", close_timeout_s)
        self._socket: socket.socket | None = None
        self._port: int | None = None
        self._links: set[Link] = set()
        self._connections = 0

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LinkServer is not started")
        return self._port

    @property
    def links(self) -> frozenset[Link]:
        """The links currently running."""
        return frozenset(self._links)

    async def start(self) -> None:
        if self._socket is not None:
            return
        _ = self.tls.server  # build the context now: a broken trust store fails here
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host, self._requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _type, _proto, _name, address = infos[0]
        self._socket = socket.create_server(address[:2], family=family, backlog=128)
        self._socket.setblocking(False)
        self._port = int(self._socket.getsockname()[1])
        await self._group.start()
        self._group.spawn(self._accept_loop(self._socket))
        log.info("peer links: listening on %s:%d", self.host, self._port)

    async def close(self) -> None:
        """Stop listening, close every link and wait for them (bounded)."""
        await self._group.close()
        if self._socket is not None:
            self._socket.close()
        log.info("peer links: stopped listening on %s:%s", self.host, self._port)

    async def __aenter__(self) -> LinkServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _accept_loop(self, listening: socket.socket) -> None:
        # We accept sockets ourselves and let the loop wrap each in TLS from its first byte:
        # asyncio.start_server + StreamWriter.start_tls loses a ClientHello that the stream
        # read before the upgrade (it always does on uvloop), and start_server(ssl=...) keeps
        # handshake failures to itself, while a refusal must be logged with its reason.
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listening)
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                log.warning("peer links: accept failed: %r", exc)
                await asyncio.sleep(0.1)
                continue
            where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            if self._connections >= self.max_links or not self._group.spawn(
                self._serve_connection(conn, where)
            ):
                log.warning("peer links: refused %s (%d links open)", where, self._connections)
                conn.close()

    async def _serve_connection(self, conn: socket.socket, where: str) -> None:
        self._connections += 1
        try:
            link = await self._accept(conn, where)
            if link is None:
                return
            self._links.add(link)
            try:
                log.info("%s: accepted", link)
                await link.run()
            finally:
                self._links.discard(link)
        finally:
            self._connections -= 1

    async def _accept(self, conn: socket.socket, where: str) -> Link | None:
        loop = asyncio.get_running_loop()
        settings = self.settings
        # Frames are whole messages: send each at once. (asyncio sets this only on sockets
        # whose proto is IPPROTO_TCP, which an accepted socket does not report; without it,
        # Nagle and delayed ACKs hold back small frames such as credit by ~40 ms.)
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            async with asyncio.timeout(settings.handshake_timeout_s):
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, conn, ssl=self.tls.server
                )
        except BaseException as exc:
            conn.close()  # the loop closed its transport, if it had made one
            if isinstance(exc, ssl.SSLError):
                reason = _tls_reason(exc)
                log.warning("peer links: refused %s at the TLS handshake: %s", where, reason)
            elif isinstance(exc, TimeoutError):
                log.info("peer links: %s did not finish the TLS handshake in time", where)
            elif isinstance(exc, OSError):
                log.info("peer links: TLS handshake with %s failed: %r", where, exc)
            else:
                raise
            return None
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        stream = FrameStream(reader, writer, max_frame_bytes=settings.max_frame_bytes)
        try:
            async with asyncio.timeout(settings.handshake_timeout_s):
                remote = peer_identity(writer.get_extra_info("ssl_object"), self.trust)
                try:
                    limits = _check_hello(await stream.recv(), remote, where)
                except LinkRefused as exc:
                    log.warning("peer links: refused %s: %s", where, exc)
                    await stream.send({"type": "refused", "reason": str(exc), "retriable": False})
                    await stream.aclose(_CLOSE_WAIT_S)
                    return None
                await stream.send(_hello(self.identity, settings))
        except IdentityError as exc:
            log.warning("peer links: refused %s: %s", where, exc.reason)
        except TimeoutError:
            log.info("peer links: %s did not send its hello in time", where)
        except (OSError, RemoteProtocolError) as exc:
            log.info("peer links: handshake with %s failed: %r", where, exc)
        else:
            return Link(stream, remote, limits, self.handler, settings, address=where)
        await stream.aclose(_CLOSE_WAIT_S)
        return None
