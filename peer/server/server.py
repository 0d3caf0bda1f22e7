"""The client API server of one peer: a listener whose connections serve the client API.

Theory of operation
-------------------
The server listens through :class:`~overlay.transport.Listener` (the socket and TLS code
shared with peer links) and runs each connection as an
:class:`~peer.server.connection.ApiConnection` on the peer's :class:`PeerService`.

On loopback the port is plain TCP; on any other address the peer gives the server its TLS
(:func:`api_server_tls`): the client must present a certificate issued by a participant of the
peer's trust store, and the connection remembers that participant (the ``hello`` reply names
it). A handshake that fails or does not finish within ``handshake_timeout_s`` closes that
connection only, with the reason logged. Slots are shared fairly: ``max_per_address``
connections per remote host, ``max_connections`` in all; a newcomer beyond either evicts the
connection idle longest (at least ``evict_idle_s``), else it gets an ``error`` frame saying so
(code ``unavailable``, retriable) and is closed. Frames are decoded under ``budget``; a frame
begun must be complete within ``frame_timeout_s``; a connection with nothing in flight and no
frame for ``idle_timeout_s`` is closed (docs/protocol.md, "Limits"). A ``create_sql`` script
is compiled within ``limits`` and ``sql_compile_timeout_s`` in the server's own compile threads
(:class:`~peer.server.sql_scripts.SqlScripts`).

Tests run the server on a :class:`~overlay.transport.MemoryNetwork` (``network=``), with no
socket.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from overlay.transport import FrameStream, Listener, MemoryNetwork, ServerTls
from overlay.wire import DEFAULT_BUDGET, DEFAULT_MAX_FRAME_BYTES, DecodeBudget, encode_frame
from peer.errors import Unavailable
from peer.model.limits import DEFAULT_LIMITS, ContentLimits
from peer.protocol.api import ErrorReply
from peer.server.connection import ApiConnection, ConnectionSettings
from peer.server.service import PeerService
from peer.server.sql_scripts import SqlScripts

if TYPE_CHECKING:  # overlay.tls pulls in cryptography: imported where TLS is used
    from overlay.identity import NodeIdentity, TrustStore

__all__ = ["ApiServer", "ServerTls", "api_server_tls", "is_loopback"]

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine: ``localhost``, 127.0.0.0/8 or ::1 (also as
    ``[::1]`` or IPv4-mapped). Other names and the wildcard addresses are not loopback."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])  # no IPv6 zone
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def api_server_tls(identity: NodeIdentity, trust: TrustStore) -> Callable[[], ssl.SSLContext]:
    """The TLS of an API port on a non-loopback address, for
    ``ApiServer(..., ssl=api_server_tls(identity, trust), trust=trust)``.

    The server presents this node's certificate, as on its peer links, and requires a client
    certificate issued by a participant in ``trust``. Each connection gets the current
    context: the node certificate is short-lived and renewed, and a participant trusted later
    counts from its next connection. Fails now (IdentityError) if ``trust`` is empty.
    """
    from overlay.tls import TlsContexts

    contexts = TlsContexts(identity, trust)
    _ = contexts.server  # built now, so a broken identity or trust store fails at start
    return lambda: contexts.server


class ApiServer:
    """Serves the client API of one peer on a TCP port.

    ``async with ApiServer(...)`` starts and closes it; or call :meth:`start` then
    :meth:`close`, or run :meth:`serve_forever` in a task group (cancelling it closes the
    server).

    With ``ssl`` (see :func:`api_server_tls`) every connection is mutual TLS: the client's
    certificate must be issued by a participant in ``trust``, which is required with it.
    """

    def __init__(
        self,
        service: PeerService,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        budget: DecodeBudget | None = DEFAULT_BUDGET,
        frame_timeout_s: float | None = 60.0,
        idle_timeout_s: float | None = 300.0,
        max_connections: int = 256,
        max_per_address: int = 64,
        evict_idle_s: float = 2.0,
        max_in_flight: int = 16,
        max_subscriptions: int = 64,
        outbox_frames: int = 64,
        close_timeout_s: float = 5.0,
        ready_timeout_s: float = 30.0,
        handshake_timeout_s: float = 10.0,
        limits: ContentLimits = DEFAULT_LIMITS,
        sql_compile_timeout_s: float = 10.0,
        ssl: ServerTls | None = None,
        trust: TrustStore | None = None,
        network: MemoryNetwork | None = None,
    ) -> None:
        if ssl is not None and trust is None:
            raise ValueError("an ApiServer with TLS needs the trust store to check clients with")
        self.service = service
        self.host = host
        self.max_connections = max_connections
        self.close_timeout_s = close_timeout_s
        self.trust = trust
        self.settings = ConnectionSettings(
            max_frame_bytes=max_frame_bytes,
            max_in_flight=max_in_flight,
            max_subscriptions=max_subscriptions,
            outbox_frames=outbox_frames,
            close_timeout_s=close_timeout_s,
            ready_timeout_s=ready_timeout_s,
            idle_timeout_s=idle_timeout_s,
        )
        self._listener = Listener(
            self._serve,
            host,
            port,
            name="API server",
            logger=log,
            tls=ssl,
            identify=self._identify,
            max_connections=max_connections,
            max_per_address=max_per_address,
            evict_idle_s=evict_idle_s,
            refuse=self._refuse,
            max_frame_bytes=max_frame_bytes,
            budget=budget,
            frame_timeout_s=frame_timeout_s,
            handshake_timeout_s=handshake_timeout_s,
            close_timeout_s=close_timeout_s,
            network=network,
        )
        self.scripts = SqlScripts(service, limits=limits, compile_timeout_s=sql_compile_timeout_s)
        self._closing = False
        self._closed = asyncio.Event()

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        try:
            return self._listener.port
        except RuntimeError:
            raise RuntimeError("ApiServer is not started") from None

    @property
    def connection_count(self) -> int:
        return self._listener.connection_count

    @property
    def uses_tls(self) -> bool:
        return self._listener.uses_tls

    async def start(self) -> None:
        await self._listener.start()  # a broken TLS setup fails here, not at the first client
        log.info(
            "API server listening on %s:%d (%s)",
            self.host,
            self.port,
            "TLS, participant certificates required" if self.uses_tls else "plain TCP",
        )

    async def serve_forever(self) -> None:
        """Serve until :meth:`close` is called or this task is cancelled."""
        await self.start()
        try:
            await self._closed.wait()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop listening, close every connection and wait for them (bounded)."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            await self._listener.close()
        finally:
            self.scripts.close()
            self._closed.set()
        log.info("API server on %s closed", self.host)

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _identify(self, stream: FrameStream) -> str | None:
        """The participant a TLS client's certificate proves (the per-participant limit)."""
        from overlay.tls import peer_participant

        if stream.ssl_object is None or self.trust is None:
            return None
        return peer_participant(stream.ssl_object, self.trust)[0]

    def _participant(self, stream: FrameStream) -> tuple[bool, str | None]:
        """Whether the client may go on, and the participant its certificate proves (None
        without TLS); a refusal is logged with its reason."""
        tls = stream.ssl_object
        if tls is None:
            return not self.uses_tls, None
        from overlay.identity import IdentityError
        from overlay.tls import peer_participant

        assert self.trust is not None
        try:
            participant, _pub = peer_participant(tls, self.trust)
        except IdentityError as exc:
            log.warning("API server: refused %s: %s", stream.peer, exc.reason)
        except Exception:
            log.exception("API server: cannot identify the client %s", stream.peer)
        else:
            log.info("API client %s is participant %r", stream.peer, participant)
            return True, participant
        return False, None

    async def _serve(self, stream: FrameStream) -> None:
        allowed, participant = self._participant(stream)
        if not allowed:
            return
        log.debug("API connection from %s", stream.peer)
        try:
            await ApiConnection(
                self.service, stream, self.settings, self.scripts, participant
            ).run()
        except Exception:
            log.exception("API connection %s failed", stream.peer)
        finally:
            log.debug("API connection %s closed", stream.peer)

    async def _refuse(self, stream: FrameStream) -> None:
        allowed, _participant = self._participant(stream)
        if not allowed:
            return
        log.warning(
            "API server refused %s: %d connections open",
            stream.peer,
            self.connection_count - 1,
        )
        host = stream.peer.rpartition(":")[0] or stream.peer
        why = self._listener.admission.full_for(host) or f"{self.max_connections} connections"
        refusal = Unavailable(f"peer has too many client connections ({why})")
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await stream.send_encoded(encode_frame(ErrorReply.of(None, refusal).to_wire()))
        except OSError:  # TimeoutError included: the refusal is best-effort
            pass
