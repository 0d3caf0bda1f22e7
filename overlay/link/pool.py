"""The opening side of peer links: a pool of them, one per remote address.

Theory of operation
-------------------
:func:`_open_link` connects (:data:`overlay.transport.TCP`), completes the TLS handshake,
checks who the server's certificate proves (:func:`~overlay.tls.peer_identity`), sends our
``hello`` and waits for the server's.
A server whose certificate we refuse, or that refuses us (before or with its hello), is
:class:`LinkRefused`; a server that cannot be reached, or drops us during the TLS handshake
(it is full or closing), is :class:`LinkUnavailable`, worth trying again.

:class:`LinkPool` keeps one link per remote address; callers for an address that is being
opened wait for that one opening (:class:`_Opening`) instead of opening another. The pool's
links run in its :class:`~overlay.transport.Nursery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from overlay.errors import RemoteProtocolError
from overlay.identity import IdentityError, NodeIdentity, TrustStore
from overlay.link.connection import Link, LinkHandler, Traffic
from overlay.link.events import Body
from overlay.link.protocol import (
    CLOSE_WAIT_S,
    LinkError,
    LinkRefused,
    LinkSettings,
    LinkTimeout,
    LinkUnavailable,
    NotSent,
    check_hello,
    hello,
)
from overlay.tls import TlsContexts, peer_identity
from overlay.transport import TCP, Nursery, tls_reason
from overlay.wire import DEFAULT_MAX_FRAME_BYTES

__all__ = ["LinkPool"]

log = logging.getLogger(__name__)


class _Unsupported(LinkError):
    code = "unsupported"


class _NoHandler:
    async def handle(self, link: Link, frame: Body) -> Body:
        raise _Unsupported("this peer serves no requests on links it opened")

    def stream(self, link: Link, frame: Body) -> AsyncIterator[Body]:
        raise _Unsupported("this peer serves no streams on links it opened")


async def _open_link(
    address: tuple[str, int],
    identity: NodeIdentity,
    trust: TrustStore,
    tls: TlsContexts,
    handler: LinkHandler,
    settings: LinkSettings,
) -> Link:
    """Connect, handshake and exchange hellos; the link is returned not yet running."""
    host, port = address
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(settings.handshake_timeout_s):
            stream = await TCP.connect(
                host, port, tls=tls.client, max_frame_bytes=settings.max_frame_bytes
            )
    except ssl.SSLCertVerificationError as exc:
        raise LinkRefused(f"peer {where} refused at the TLS handshake: {tls_reason(exc)}") from exc
    except ssl.SSLError as exc:  # e.g. EOF: the server dropped us (full, closing)
        raise LinkUnavailable(f"peer {where}: TLS handshake failed: {tls_reason(exc)}") from exc
    except TimeoutError as exc:
        raise LinkTimeout(f"peer {where}: no TLS handshake within the time allowed") from exc
    except OSError as exc:
        raise LinkUnavailable(f"cannot connect to peer {where}: {exc}") from exc
    stream.set_limits(settings.budget, settings.frame_timeout_s)
    try:
        async with asyncio.timeout(settings.handshake_timeout_s):
            try:
                if stream.ssl_object is None:
                    raise IdentityError("the connection carries no TLS")
                remote = peer_identity(stream.ssl_object, trust)
            except IdentityError as exc:
                raise LinkRefused(f"peer {where} refused: {exc.reason}") from exc
            await stream.send(hello(identity, settings))
            try:
                frame = await stream.recv()
            except (ssl.SSLError, ConnectionResetError):
                frame = None
            if frame is None:
                # TLS 1.3 checks the client's certificate after the client has finished its
                # handshake, and asyncio drops the connection without sending the alert.
                raise LinkRefused(
                    f"peer {where} ({remote.participant}) closed the link before its hello: "
                    f"it most likely does not trust participant {identity.participant!r}"
                )
            if frame["type"] == "refused":
                reason = frame.get("reason")
                error = LinkUnavailable if frame.get("retriable") is True else LinkRefused
                raise error(f"peer {where} refused the link: {reason}")
            limits = check_hello(frame, remote, where)
    except BaseException as exc:
        await stream.aclose(CLOSE_WAIT_S)
        if isinstance(exc, TimeoutError):
            raise LinkTimeout(f"peer {where}: no hello within the time allowed") from exc
        if isinstance(exc, RemoteProtocolError):
            raise LinkRefused(f"peer {where} does not speak the link protocol: {exc}") from exc
        if isinstance(exc, OSError):
            raise LinkUnavailable(f"peer {where} broke the handshake: {exc!r}") from exc
        raise
    return Link(stream, remote, limits, handler, settings, address=where)


class LinkPool:
    """This peer's outgoing links: one per remote address, opened on demand and reused.

    At most ``max_links`` links; when full, the longest-idle one is closed to make room (a
    caller waits while all are busy). A link idle for ``idle_timeout_s`` is closed; a closed
    or broken link is replaced on the next use. ``handler`` serves what remotes ask over the
    links this pool opened (by default: nothing).
    """

    def __init__(
        self,
        identity: NodeIdentity,
        trust: TrustStore,
        handler: LinkHandler | None = None,
        *,
        tls: TlsContexts | None = None,
        max_links: int = 64,
        idle_timeout_s: float = 60.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 32,
        max_streams: int = 64,
        outbox_frames: int = 64,
        handshake_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        limits: LinkSettings | None = None,
    ) -> None:
        if max_links < 1:
            raise ValueError("max_links must be at least 1")
        self.identity = identity
        self.trust = trust
        self.handler: LinkHandler = handler or _NoHandler()
        self.tls = tls or TlsContexts(identity, trust)
        self.max_links = max_links
        self.idle_timeout_s = idle_timeout_s
        self.settings = replace(
            limits or LinkSettings(),
            max_frame_bytes=max_frame_bytes,
            max_in_flight=max_in_flight,
            max_streams=max_streams,
            outbox_frames=outbox_frames,
            handshake_timeout_s=handshake_timeout_s,
            close_timeout_s=close_timeout_s,
        )
        self._group = Nursery(f"link pool of {identity.participant}", close_timeout_s)
        self._links: dict[tuple[str, int], Link] = {}
        self._opening: dict[tuple[str, int], _Opening] = {}
        self._changed = asyncio.Event()
        self._closed_traffic = Traffic()

    @property
    def links(self) -> dict[tuple[str, int], Link]:
        """The links currently open, by remote address (a copy)."""
        return dict(self._links)

    def traffic(self) -> tuple[int, int]:
        """Bytes (sent, received) over every link this pool has opened."""
        return self._closed_traffic.totals(self._links.values())

    async def start(self) -> None:
        await self._group.start()
        self._group.spawn(self._reap_idle())

    async def close(self) -> None:
        """Close every link (pending calls fail) and wait for them (bounded)."""
        await self._group.close()

    async def __aenter__(self) -> LinkPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def request(
        self,
        address: tuple[str, int],
        frame: Mapping[str, Any],
        *,
        node_id: bytes | None = None,
        timeout_s: float,
    ) -> Body:
        """:meth:`Link.request` over the link to ``address`` (opened if needed). With
        ``node_id``, the remote must be that node (else :class:`LinkRefused`). A request
        that never left this peer because its link had just broken is retried once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (1, 2):
            link = await self.link(address, node_id=node_id, timeout_s=deadline - loop.time())
            try:
                return await link.request(frame, max(0.0, deadline - loop.time()))
            except NotSent:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def link(
        self, address: tuple[str, int], *, node_id: bytes | None = None, timeout_s: float
    ) -> Link:
        """The running link to ``address``, opened if there is none."""
        key = (address[0], int(address[1]))
        try:
            async with asyncio.timeout(timeout_s):
                link = await self._get(key)
        except TimeoutError as exc:
            raise LinkTimeout(f"no link to peer {key[0]}:{key[1]} within {timeout_s} s") from exc
        if node_id is not None and link.remote_node_id != node_id:
            raise LinkRefused(
                f"peer {link.address} is node {link.remote_node_id.hex()} of participant "
                f"{link.remote_participant!r}, not the expected node {node_id.hex()}"
            )
        return link

    async def _get(self, key: tuple[str, int]) -> Link:
        while True:
            if self._group.closing:
                raise LinkUnavailable("the link pool is closed")
            link = self._links.get(key)
            if link is not None and not link.closed:
                return link
            opening = self._opening.get(key)
            if opening is None:
                return await self._open(key)
            await opening.done.wait()
            if opening.error is not None:
                raise type(opening.error)(str(opening.error)) from opening.error
            # else it succeeded (loop to take it) or its opener gave up (loop to try again)

    async def _open(self, key: tuple[str, int]) -> Link:
        opening = _Opening()
        self._opening[key] = opening
        try:
            await self._make_room()
            link = await _open_link(
                key, self.identity, self.trust, self.tls, self.handler, self.settings
            )
            if not self._group.spawn(self._run_link(key, link)):
                await link.abort()
                raise LinkUnavailable("the link pool is closed")
            self._links[key] = link
            log.info("%s: opened", link)
            return link
        except LinkError as exc:
            opening.error = exc
            raise
        finally:
            del self._opening[key]
            opening.done.set()

    async def _make_room(self) -> None:
        while True:
            live = [link for link in self._links.values() if not link.closed]
            if len(live) + len(self._opening) <= self.max_links:
                return
            idle = [link for link in live if link.idle_s() > 0]
            if idle:
                await max(idle, key=lambda link: link.idle_s()).close()
                continue
            # Every link is busy. Links do not report becoming idle, so look again shortly
            # (the caller's timeout bounds the wait); a link that closes wakes us at once.
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._changed.wait()

    async def _run_link(self, key: tuple[str, int], link: Link) -> None:
        try:
            await link.run()
        finally:
            if self._links.get(key) is link:
                del self._links[key]
            self._closed_traffic.close(link)
            self._changed.set()

    async def _reap_idle(self) -> None:
        interval = max(0.01, min(self.idle_timeout_s / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            for link in list(self._links.values()):
                if link.idle_s() >= self.idle_timeout_s:
                    log.debug("%s: idle for %.1f s, closing it", link, link.idle_s())
                    await link.close()


@dataclass(eq=False)
class _Opening:
    """A link being opened: later callers for the same address wait for it."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: LinkError | None = None
