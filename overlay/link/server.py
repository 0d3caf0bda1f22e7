"""The accepting side of peer links: a TCP port whose connections become links.

Theory of operation
-------------------
The server listens through :class:`~overlay.transport.Listener`, which accepts each socket,
wraps it in TLS from its first byte and logs a refused handshake with its reason. For each
connection the server then reads who the certificate proves
(:func:`~overlay.tls.peer_identity`), waits for the client's ``hello`` and answers with its
own, or with ``refused`` and the reason when the hello does not match the certificate. Each
of these steps is bounded by ``handshake_timeout_s``. The link then runs in the listener's
task until either side closes it. A connection beyond ``max_links`` (handshaking or running)
is closed before its TLS handshake, which the client takes as a failure worth retrying.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from overlay.errors import RemoteProtocolError
from overlay.identity import IdentityError, NodeIdentity, TrustStore
from overlay.link.connection import Link, LinkHandler, Traffic
from overlay.link.protocol import CLOSE_WAIT_S, LinkRefused, LinkSettings, check_hello, hello
from overlay.stream import FrameStream
from overlay.tls import TlsContexts, peer_identity
from overlay.transport import Listener
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
        limits: LinkSettings | None = None,
    ) -> None:
        """``limits`` gives the budget, timeouts and per-address slots of
        :class:`LinkSettings` (its other fields are taken from the arguments)."""
        self.identity = identity
        self.trust = trust
        self.handler = handler
        self.host = host
        self.tls = tls or TlsContexts(identity, trust)
        self.max_links = max_links
        settings = self.settings = replace(
            limits or LinkSettings(),
            max_frame_bytes=max_frame_bytes,
            max_in_flight=max_in_flight,
            max_streams=max_streams,
            outbox_frames=outbox_frames,
            handshake_timeout_s=handshake_timeout_s,
            close_timeout_s=close_timeout_s,
        )
        self._listener = Listener(
            self._serve,
            host,
            port,
            name="peer links",
            logger=log,
            tls=lambda: self.tls.server,
            identify=self._identify,
            max_connections=max_links,
            max_per_address=settings.max_per_address,
            evict_idle_s=settings.evict_idle_s,
            max_frame_bytes=max_frame_bytes,
            budget=settings.budget,
            frame_timeout_s=settings.frame_timeout_s,
            handshake_timeout_s=handshake_timeout_s,
            close_timeout_s=close_timeout_s,
        )
        self.refusals = self._listener.refusals  # TLS and hello refusals, counted together
        self._links: set[Link] = set()
        self._closed_traffic = Traffic()

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def links(self) -> frozenset[Link]:
        """The links currently running."""
        return frozenset(self._links)

    def traffic(self) -> tuple[int, int]:
        """Bytes (sent, received) over every link this server has accepted."""
        return self._closed_traffic.totals(self._links)

    async def start(self) -> None:
        await self._listener.start()  # builds the TLS context: a broken trust store fails here
        log.info("peer links: listening on %s:%d", self.host, self.port)

    async def close(self) -> None:
        """Stop listening, close every link and wait for them (bounded)."""
        await self._listener.close()
        log.info("peer links: stopped listening on %s", self.host)

    async def __aenter__(self) -> LinkServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _serve(self, stream: FrameStream) -> None:
        link = await self._accept(stream)
        if link is None:
            return
        self._links.add(link)
        try:
            log.info("%s: accepted", link)
            await link.run()
        finally:
            self._links.discard(link)
            self._closed_traffic.close(link)

    def _identify(self, stream: FrameStream) -> str | None:
        """The participant a peer's certificate proves (the per-participant limit)."""
        if stream.ssl_object is None:
            return None
        return peer_identity(stream.ssl_object, self.trust).participant

    async def _accept(self, stream: FrameStream) -> Link | None:
        """The link, once the client's hello matches its certificate; None (reason logged)
        if it does not."""
        settings = self.settings
        where = stream.peer
        try:
            async with asyncio.timeout(settings.handshake_timeout_s):
                if stream.ssl_object is None:
                    raise IdentityError("the connection carries no TLS")
                remote = peer_identity(stream.ssl_object, self.trust)
                try:
                    limits = check_hello(await stream.recv(), remote, where)
                except LinkRefused as exc:
                    self.refusals.warning("peer links: refused %s: %s", where, exc)
                    await stream.send({"type": "refused", "reason": str(exc), "retriable": False})
                    await stream.aclose(CLOSE_WAIT_S)
                    return None
                await stream.send(hello(self.identity, settings))
        except IdentityError as exc:
            self.refusals.warning("peer links: refused %s: %s", where, exc.reason)
        except TimeoutError:
            log.info("peer links: %s did not send its hello in time", where)
        except (OSError, RemoteProtocolError) as exc:
            log.info("peer links: handshake with %s failed: %r", where, exc)
        else:
            return Link(stream, remote, limits, self.handler, settings, address=where)
        await stream.aclose(CLOSE_WAIT_S)
        return None
