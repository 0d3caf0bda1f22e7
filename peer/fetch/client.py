"""The executor's side of a spool fetch: one connection to the peer, one file at a time.

Spark calls the source's ``read()`` as a plain generator in a Python worker, so
:class:`SpoolFetcher` is synchronous to its caller and runs the project's asyncio transport
(:data:`overlay.transport.TCP`, frames of :mod:`overlay.wire`) on an event loop of its own.
It connects with TLS and no certificate authority, checks the server's pin before it sends
anything (:mod:`peer.fetch.tls` says why that is sound), then asks for files one by one; each
reply is put together by :class:`~peer.fetch.protocol.FileAssembler`. Every wait is bounded
by ``timeout_s``. A refusal raises the peer's error as the peer worded it (an expired or
forged capability: :class:`~peer.errors.Unauthorized`; a trimmed file:
:class:`~peer.errors.NotFound` with ``details["reason"] == "trimmed"``); a lost connection, a
wrong pin or a broken reply raises :class:`FetchFailed` naming the peer's address.
"""

from __future__ import annotations

import asyncio
import ssl
from types import TracebackType

from overlay.errors import ProtocolError
from overlay.transport import TCP, FrameStream, Network
from peer.errors import Unavailable
from peer.fetch.protocol import (
    MAX_REPLY_FRAME_BYTES,
    FetchRequest,
    FetchTicket,
    FileAssembler,
    pin_of,
)

__all__ = ["DEFAULT_TIMEOUT_S", "FetchFailed", "SpoolFetcher", "client_context"]

DEFAULT_TIMEOUT_S = 60.0
MAX_FILE_BYTES = 2**40  # a sanity bound on a file header's size; chunks are bounded anyway


class FetchFailed(Unavailable):
    """The fetch server could not be reached or broke the protocol (worth retrying: Spark
    retries the task)."""


def client_context() -> ssl.SSLContext:
    """TLS 1.3 without certificate authorities: the server is recognised by its pin."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the pin is checked right after the handshake
    return ctx


class SpoolFetcher:
    """Fetches files of the spool a ticket names; use as a context manager (or :meth:`close`).

    ``network`` with ``tls=False`` (tests) replaces TCP and TLS (then no pin is checked)."""

    def __init__(
        self,
        ticket: FetchTicket,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        network: Network = TCP,
        tls: bool = True,
    ) -> None:
        self.ticket = ticket
        self.timeout_s = timeout_s
        self._network = network
        self._tls = tls
        self._loop: asyncio.AbstractEventLoop | None = None  # made by the first fetch()
        self._stream: FrameStream | None = None
        self.fetched_bytes = 0

    def __enter__(self) -> SpoolFetcher:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def fetch(self, offset: int) -> bytes:
        """The bytes of file ``offset`` as the peer stores them."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.fetch_async(offset))

    async def fetch_async(self, offset: int) -> bytes:
        """:meth:`fetch` for a caller already on an event loop (tests with a memory network).

        A connection kept from an earlier file may have been closed by the server meanwhile
        (its ``idle_timeout_s`` passes while Spark works through that file's rows): if it
        ends before any reply, the request is asked once more on a new connection."""
        where = self.ticket.address
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._stream is not None:
                    data = await self._ask(self._stream, offset)
                    if data is not None:
                        return data
                    await self._drop()  # closed while idle: once more, on a new connection
                data = await self._ask(await self._connected(), offset)
                if data is None:
                    raise FetchFailed(f"fetch server {where} closed the connection", peer=where)
                return data
        except TimeoutError:
            await self._drop()
            raise FetchFailed(
                f"fetch server {where}: no file {offset} within {self.timeout_s:g} s", peer=where
            ) from None
        except (OSError, ProtocolError) as exc:
            await self._drop()
            raise FetchFailed(f"fetch server {where}: {exc!r}", peer=where) from exc

    async def _ask(self, stream: FrameStream, offset: int) -> bytes | None:
        """File ``offset`` over ``stream``; None if the stream ended before any reply."""
        request = FetchRequest(self.ticket.spool, offset, self.ticket.capability)
        reply = FileAssembler(offset, max_size=MAX_FILE_BYTES)
        answered = False
        try:
            await stream.send(request.to_wire())
            while True:
                frame = await stream.recv()
                if frame is None:
                    if answered:
                        raise FetchFailed(
                            f"fetch server {self.ticket.address} closed the connection in the "
                            f"middle of file {offset}",
                            peer=self.ticket.address,
                        )
                    return None
                answered = True
                data = reply.receive(frame)
                if data is not None:
                    self.fetched_bytes += len(data)
                    return data
        except ConnectionError:
            if answered:
                raise
            return None

    async def _connected(self) -> FrameStream:
        if self._stream is not None:
            return self._stream
        host, port = self.ticket.host_port
        context = client_context() if self._tls else None
        stream = await self._network.connect(
            host, port, tls=context, max_frame_bytes=MAX_REPLY_FRAME_BYTES
        )
        if context is not None:
            tls = stream.ssl_object
            der = tls.getpeercert(binary_form=True) if tls is not None else None
            if not der or pin_of(der) != self.ticket.pin:
                await stream.aclose(1.0)
                raise FetchFailed(
                    f"fetch server {self.ticket.address} is not the peer that planned this "
                    f"read: its certificate does not match pin {self.ticket.pin[:16]}...",
                    peer=self.ticket.address,
                )
        self._stream = stream
        return stream

    async def aclose(self) -> None:
        """Close the connection (for a caller on its own event loop)."""
        await self._drop()

    async def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose(1.0)

    def close(self) -> None:
        """Close the connection and the event loop of :meth:`fetch`."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run_until_complete(self._drop())
        finally:
            loop.close()
