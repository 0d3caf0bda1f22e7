"""The client API server of one peer (wire format: docs/protocol.md).

Theory of operation
-------------------
Each accepted TCP connection is one :class:`_Connection`, run as one task that owns an
``asyncio.TaskGroup``; everything the connection does lives in that group, so closing the
connection (or the server) cancels all of it:

* the *read loop* (the group's body) decodes frames and starts one task per request. At most
  ``max_in_flight`` requests run at once per connection; when all slots are taken the read
  loop stops reading, and TCP pushes back on the client. ``credit`` frames are handled inline.
* request tasks call the :class:`PeerService` and put the encoded reply in the *outbox*;
* subscription tasks pull batches from the service's iterator and put ``batch`` frames in the
  outbox, each first taking one unit of the subscription's credit (if the client asked for
  credit-based flow control);
* the *writer* task is the only one that writes to the socket. The outbox is a bounded queue,
  so a client that does not read stalls only its own connection: its subscriptions stop
  pulling (the service keeps their position), then its requests, then its read loop. Other
  connections are untouched.

A request's reply is always queued before any ``batch`` frame of the subscription it creates,
and an ``unsubscribe`` reply after the last ``batch`` frame of that subscription, so clients
may rely on that order.

Transport: the server accepts sockets itself and hands each to the loop with
``connect_accepted_socket``, with TLS from the first byte when it has a TLS context (starting
TLS later can lose a ClientHello the stream has already read, as it always does on uvloop).
On loopback the port is plain TCP; on any other address the peer gives the server its TLS
(:func:`api_server_tls`): the client must present a certificate issued by a participant of the
peer's trust store, and the connection remembers that participant (the ``hello`` reply names
it). A handshake that fails or does not finish within ``handshake_timeout_s`` closes that
socket only, with the reason logged.

Errors: a :class:`~peer.errors.FedstreamError` from the service becomes an ``error`` frame with
its code; any other exception becomes code ``internal`` (logged with its traceback, not shown
to the client). A frame that breaks the framing rules (:class:`RemoteProtocolError`) gets one
``error`` frame with code ``protocol`` and ``id`` null, then that connection, and only that one,
is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.stream import FrameStream
from overlay.wire import DEFAULT_MAX_FRAME_BYTES, HEADER_BYTES, encode_frame
from peer.errors import FedstreamError, InvalidInput, NotFound, Unavailable

if TYPE_CHECKING:  # overlay.tls pulls in cryptography: imported where TLS is used
    from overlay.identity import NodeIdentity, TrustStore

__all__ = [
    "PROTOCOL_VERSION",
    "READY",
    "AnnouncedBatches",
    "ApiServer",
    "PeerService",
    "ServerTls",
    "api_server_tls",
    "is_loopback",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
QUERY_STATUSES = ("SETUP", "RUNNING", "STOPPED", "DELETED")
START_POSITIONS = ("latest", "earliest")
BATCH_ENCODINGS = ("columns", "rows", "arrow")
MAX_CREDIT = 1 << 20
# What a subscription iterator that ``announces_ready`` yields first, once its start position
# is fixed (see AnnouncedBatches): the ``subscribe`` reply waits for it.
READY: dict[str, Any] = {"ready": True}


class AnnouncedBatches:
    """Wraps an async iterator of batches that first yields :data:`READY` once its start
    position is fixed (maybe on another peer): the server replies to ``subscribe`` only then,
    so a client may push right after the reply and see what it pushed."""

    announces_ready = True

    def __init__(self, batches: AsyncIterator[dict[str, Any]]) -> None:
        self._batches = batches

    def __aiter__(self) -> AnnouncedBatches:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._batches.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._batches, "aclose", None)
        if aclose is not None:
            await aclose()


_PART_FIELDS_BYTES = 32  # room for "part"/"parts" in a split batch frame
_UNLIMITED = 2**32 - 1

ServerTls: TypeAlias = ssl.SSLContext | Callable[[], ssl.SSLContext]
"""An API server's TLS: a context, or a function giving the current one for each connection."""


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


def _tls_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate was refused ({exc.verify_message})"
    return exc.reason or str(exc)


class PeerService(Protocol):
    """What the API server needs from a peer (the real ``Peer`` implements it).

    Methods raise :class:`~peer.errors.FedstreamError` subclasses for anything the caller got
    wrong; the server passes those to the client with their code. They may be cancelled (the
    client went away) and must leave no half-done change behind when they are.
    """

    async def create_schema(self, schema: str | dict[str, Any]) -> dict[str, Any]: ...

    async def create_stream(self, name: str, schema: str) -> dict[str, Any]: ...

    async def create_query(self, query: str | dict[str, Any]) -> dict[str, Any]: ...

    async def set_query_status(self, name: str, status: str) -> dict[str, Any]: ...

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        """``payload`` is exactly one of ``{"columns": {...}}``, ``{"rows": [...]}``,
        ``{"arrow": bytes}``; returns e.g. ``{"stream", "count", "offset"}``."""
        ...

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        """Batches ``{"offset": int, "columns": {name: [values]}}`` of ``stream`` from ``start``
        (``"latest"`` or ``"earliest"``); ``offset`` is the batch's position in the stream's
        log (increasing).

        The server replies ``ok`` once the iterator has run to its first real wait, and a
        client may push right after that reply. So check the arguments (raise NotFound etc.)
        and fix the start position either when called or in an async generator's body before
        its first ``await`` that actually suspends; an error raised there becomes the reply.
        A slow client simply stops pulling: keep the position, buffer nothing unbounded.
        """
        ...

    async def lookup(self, name: str) -> dict[str, Any]: ...

    async def status(self) -> dict[str, Any]: ...


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
        max_connections: int = 256,
        max_in_flight: int = 16,
        max_subscriptions: int = 64,
        outbox_frames: int = 64,
        close_timeout_s: float = 5.0,
        ready_timeout_s: float = 30.0,
        handshake_timeout_s: float = 10.0,
        ssl: ServerTls | None = None,
        trust: TrustStore | None = None,
    ) -> None:
        if ssl is not None and trust is None:
            raise ValueError("an ApiServer with TLS needs the trust store to check clients with")
        self.service = service
        self.host = host
        self._requested_port = port
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.max_in_flight = max_in_flight
        self.max_subscriptions = max_subscriptions
        self.outbox_frames = outbox_frames
        self.close_timeout_s = close_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.trust = trust
        self._tls = ssl
        self._socket: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._port: int | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._closed = asyncio.Event()

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        if self._port is None:
            raise RuntimeError("ApiServer is not started")
        return self._port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def uses_tls(self) -> bool:
        return self._tls is not None

    async def start(self) -> None:
        if self._socket is not None:
            return
        self._tls_context()  # a broken TLS setup fails here, not at the first client
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host, self._requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _type, _proto, _name, address = infos[0]
        listening = socket.create_server(address[:2], family=family, backlog=128)
        listening.setblocking(False)
        self._socket = listening
        self._port = int(listening.getsockname()[1])
        self._acceptor = asyncio.create_task(self._accept_loop(listening))
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
            if self._acceptor is not None:
                self._acceptor.cancel()
                await asyncio.wait({self._acceptor})
            if self._socket is not None:
                self._socket.close()
            for task in self._connections:
                task.cancel()
            try:
                async with asyncio.timeout(self.close_timeout_s):
                    if self._connections:
                        await asyncio.wait(set(self._connections))
            except TimeoutError:
                log.warning(
                    "API server: %d connections still open after %.1f s",
                    len(self._connections),
                    self.close_timeout_s,
                )
        finally:
            self._closed.set()
        log.info("API server on %s:%s closed", self.host, self._requested_port)

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _tls_context(self) -> ssl.SSLContext | None:
        tls = self._tls
        return tls if tls is None or isinstance(tls, ssl.SSLContext) else tls()

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(listening)
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                log.warning("API server: accept failed: %r", exc)
                await asyncio.sleep(0.1)
                continue
            where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            full = len(self._connections) >= self.max_connections
            # The connection task is ours: close() cancels and awaits it.
            task = asyncio.create_task(self._serve_socket(conn, where, refuse=full))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _serve_socket(self, conn: socket.socket, where: str, *, refuse: bool) -> None:
        try:
            opened = await self._open(conn, where)
        except Exception:
            log.exception("API server: cannot set up the connection of %s", where)
            return
        if opened is None:
            return
        stream, participant = opened
        if refuse:
            await self._refuse(stream)
        else:
            await self._serve_connection(stream, participant)

    async def _open(self, conn: socket.socket, where: str) -> tuple[FrameStream, str | None] | None:
        """The accepted socket as a frame stream (after the TLS handshake, if any) and the
        client's participant; None (socket closed, reason logged) if the handshake fails."""
        loop = asyncio.get_running_loop()
        # Frames are whole messages: send each at once (asyncio sets this only on sockets
        # that report IPPROTO_TCP, which an accepted one does not).
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            context = self._tls_context()
            async with asyncio.timeout(self.handshake_timeout_s):
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, conn, ssl=context
                )
        except BaseException as exc:
            conn.close()  # the loop closed its transport, if it had made one
            if isinstance(exc, ssl.SSLError):
                log.warning(
                    "API server: refused %s at the TLS handshake: %s", where, _tls_reason(exc)
                )
            elif isinstance(exc, TimeoutError):
                log.info("API server: %s did not finish the TLS handshake in time", where)
            elif isinstance(exc, OSError):  # e.g. a client that refused our certificate
                log.info("API server: connection from %s lost at its start: %r", where, exc)
            else:
                raise
            return None
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        stream = FrameStream(reader, writer, max_frame_bytes=self.max_frame_bytes)
        if context is None:
            return stream, None
        from overlay.identity import IdentityError
        from overlay.tls import peer_participant

        assert self.trust is not None
        try:
            participant, _pub = peer_participant(writer.get_extra_info("ssl_object"), self.trust)
        except IdentityError as exc:
            log.warning("API server: refused %s: %s", where, exc.reason)
        except Exception:
            log.exception("API server: cannot identify the client %s", where)
        else:
            log.info("API client %s is participant %r", where, participant)
            return stream, participant
        await stream.aclose(timeout_s=min(1.0, self.close_timeout_s))
        return None

    async def _refuse(self, stream: FrameStream) -> None:
        log.warning(
            "API server refused %s: %d connections open", stream.peer, len(self._connections) - 1
        )
        refusal = Unavailable(f"peer has too many client connections (max {self.max_connections})")
        try:
            async with asyncio.timeout(self.close_timeout_s):
                await stream.send({"type": "error", "id": None, **refusal.to_wire()})
        except OSError:  # TimeoutError included: the refusal is best-effort
            pass
        finally:
            await stream.aclose(timeout_s=min(1.0, self.close_timeout_s))

    async def _serve_connection(self, stream: FrameStream, participant: str | None) -> None:
        log.debug("API connection from %s", stream.peer)
        try:
            await _Connection(self, stream, participant).run()
        except Exception:
            log.exception("API connection %s failed", stream.peer)
        finally:
            await stream.aclose(timeout_s=min(1.0, self.close_timeout_s))
            log.debug("API connection %s closed", stream.peer)


class _Credit:
    """How many more batch frames a subscription may send (None: no credit flow control)."""

    def __init__(self, initial: int | None) -> None:
        self._value = initial
        self._granted = asyncio.Event()

    async def take(self) -> None:
        if self._value is None:
            return
        while self._value <= 0:
            self._granted.clear()
            await self._granted.wait()
        self._value -= 1

    def grant(self, batches: int) -> None:
        if self._value is not None:
            self._value = min(self._value + batches, MAX_CREDIT)
            self._granted.set()


@dataclass(eq=False)
class _Subscription:
    sid: int
    stream: str
    credit: _Credit
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    early: bool = True  # the subscribe request has not yet decided its reply
    early_error: Exception | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TYPE_NAMES = {str: "a string", dict: "a map", list: "an array", bytes: "binary", int: "an integer"}


def _arg(frame: dict[str, Any], name: str, *kinds: type, required: bool = True) -> Any:
    """``frame[name]`` checked against ``kinds``; InvalidInput naming the argument if not."""
    op = frame["type"]
    value = frame.get(name)
    if value is None:
        if required:
            raise InvalidInput(f"{op}: missing argument {name!r}", op=op, argument=name)
        return None
    ok = any(_is_int(value) if kind is int else isinstance(value, kind) for kind in kinds)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(kind, kind.__name__) for kind in kinds)
        raise InvalidInput(
            f"{op}: argument {name!r} must be {wanted}, not {type(value).__name__}",
            op=op,
            argument=name,
        )
    if isinstance(value, str) and required and not value:
        raise InvalidInput(f"{op}: argument {name!r} must not be empty", op=op, argument=name)
    return value


def _internal_error(rid: int | None) -> dict[str, Any]:
    return {
        "type": "error",
        "id": rid,
        "code": "internal",
        "message": "internal error in the peer (its log has the details)",
        "details": {},
    }


class _Connection:
    def __init__(self, server: ApiServer, stream: FrameStream, participant: str | None) -> None:
        self._server = server
        self.participant = participant  # proven by the client's TLS certificate
        self._service = server.service
        self._stream = stream
        self._max_frame_bytes = server.max_frame_bytes
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue(server.outbox_frames)
        self._slots = asyncio.Semaphore(server.max_in_flight)
        self._requests: set[asyncio.Task[None]] = set()
        self._subscriptions: dict[int, _Subscription] = {}
        self._sids = itertools.count(1)
        self._tg: asyncio.TaskGroup | None = None
        self._winding_down = False
        self._ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "hello": self._op_hello,
            "create_schema": self._op_create_schema,
            "create_stream": self._op_create_stream,
            "create_query": self._op_create_query,
            "set_query_status": self._op_set_query_status,
            "push": self._op_push,
            "subscribe": self._op_subscribe,
            "unsubscribe": self._op_unsubscribe,
            "lookup": self._op_lookup,
            "status": self._op_status,
        }

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                writer = tg.create_task(self._write_loop())
                last_words = await self._read_loop(tg)
                await self._wind_down(writer, last_words)
        except* OSError as group:
            log.debug("API connection %s lost: %r", self._stream.peer, group.exceptions[0])

    # -- reading ---------------------------------------------------------------------------

    async def _read_loop(self, tg: asyncio.TaskGroup) -> bytes | None:
        """Dispatch frames until EOF (None) or a framing error (the error frame to send)."""
        while True:
            try:
                frame = await self._stream.recv()
            except RemoteProtocolError as exc:
                log.info(
                    "API connection %s sent an invalid frame; closing it: %s",
                    self._stream.peer,
                    exc,
                )
                wire: dict[str, Any] = {
                    "type": "error",
                    "id": None,
                    "code": "protocol",
                    "message": str(exc),
                    "details": {},
                }
                return encode_frame(wire, max_frame_bytes=_UNLIMITED)
            if frame is None:
                return None
            if frame["type"] == "credit":
                await self._on_credit(frame)
                continue
            await self._slots.acquire()  # all slots busy: stop reading (backpressure)
            task = tg.create_task(self._serve_request(frame))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _on_credit(self, frame: dict[str, Any]) -> None:
        try:
            sid = _arg(frame, "subscription", int)
            batches = _arg(frame, "batches", int)
            if batches < 1:
                raise InvalidInput("credit: 'batches' must be at least 1", argument="batches")
        except InvalidInput as exc:
            await self._outbox.put(self._encode_error(None, exc))
            return
        sub = self._subscriptions.get(sid)
        if sub is not None:  # else it has just ended: nothing to do
            sub.credit.grant(batches)

    async def _wind_down(self, writer: asyncio.Task[None], last_words: bytes | None) -> None:
        """The client is gone or misbehaved: stop producing, flush what is owed, stop."""
        self._winding_down = True
        self._cancel_subscriptions()
        try:
            async with asyncio.timeout(self._server.close_timeout_s):
                if self._requests:
                    await asyncio.wait(set(self._requests))
                if last_words is not None:
                    await self._outbox.put(last_words)
                await self._outbox.put(None)
                await writer
        except TimeoutError:
            log.debug("API connection %s did not wind down in time", self._stream.peer)
            for task in self._requests:
                task.cancel()
            writer.cancel()
        self._cancel_subscriptions()  # any a late subscribe request started

    def _cancel_subscriptions(self) -> None:
        for sub in self._subscriptions.values():
            if sub.task is not None:
                sub.task.cancel()

    # -- writing ---------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while (data := await self._outbox.get()) is not None:
            await self._stream.send_encoded(data)

    def _encode(self, frame: dict[str, Any]) -> bytes:
        return encode_frame(frame, max_frame_bytes=self._max_frame_bytes)

    def _encode_error(self, rid: int | None, exc: FedstreamError, **extra: Any) -> bytes:
        try:
            return self._encode({"type": "error", "id": rid, **extra, **exc.to_wire()})
        except LocalProtocolError:
            log.exception("error reply %s cannot be encoded", exc.code)
            return self._encode({**_internal_error(rid), **extra})

    # -- requests --------------------------------------------------------------------------

    async def _serve_request(self, frame: dict[str, Any]) -> None:
        op = frame["type"]
        rid = frame.get("id")
        result: dict[str, Any] | None = None
        try:
            if not _is_int(rid):
                rid = None
                raise InvalidInput(f"{op}: a request needs an integer 'id'", op=op)
            handler = self._ops.get(op)
            if handler is None:
                raise InvalidInput(f"unknown op {op!r}", op=op)
            result = await handler(frame)
            reply = self._encode({"type": "ok", "id": rid, "result": result})
        except FedstreamError as exc:
            reply = self._encode_error(rid, exc)
        except Exception:
            log.exception("API request %s (id %s) from %s failed", op, rid, self._stream.peer)
            reply = self._encode(_internal_error(rid))
        try:
            await self._outbox.put(reply)
        finally:
            self._slots.release()
        if op == "subscribe" and result is not None:
            # Only now may the subscription send batches: they must follow this reply.
            sub = self._subscriptions.get(result["subscription"])
            if sub is not None:
                sub.replied.set()

    async def _op_hello(self, frame: dict[str, Any]) -> dict[str, Any]:
        client = _arg(frame, "client", str)
        version = _arg(frame, "version", int, required=False)
        if version is not None and version != PROTOCOL_VERSION:
            raise InvalidInput(
                f"hello: protocol version {version} is not supported (this peer speaks "
                f"{PROTOCOL_VERSION})",
                argument="version",
            )
        log.debug("API client %r on %s", client, self._stream.peer)
        result: dict[str, Any] = {
            "server": "fedstream",
            "version": PROTOCOL_VERSION,
            "max_frame_bytes": self._max_frame_bytes,
        }
        if self.participant is not None:
            result["participant"] = self.participant
        return result

    async def _op_create_schema(self, frame: dict[str, Any]) -> dict[str, Any]:
        return await self._service.create_schema(_arg(frame, "schema", str, dict))

    async def _op_create_stream(self, frame: dict[str, Any]) -> dict[str, Any]:
        name = _arg(frame, "name", str)
        return await self._service.create_stream(name, _arg(frame, "schema", str))

    async def _op_create_query(self, frame: dict[str, Any]) -> dict[str, Any]:
        return await self._service.create_query(_arg(frame, "query", str, dict))

    async def _op_set_query_status(self, frame: dict[str, Any]) -> dict[str, Any]:
        name = _arg(frame, "name", str)
        status = _arg(frame, "status", str).upper()
        if status not in QUERY_STATUSES:
            raise InvalidInput(
                f"set_query_status: status must be one of {', '.join(QUERY_STATUSES)}, "
                f"not {frame['status']!r}",
                argument="status",
            )
        return await self._service.set_query_status(name, status)

    async def _op_push(self, frame: dict[str, Any]) -> dict[str, Any]:
        stream = _arg(frame, "stream", str)
        given = [key for key in BATCH_ENCODINGS if frame.get(key) is not None]
        if len(given) != 1:
            raise InvalidInput(
                f"push to {stream!r}: give exactly one of 'columns', 'rows', 'arrow' "
                f"(got {', '.join(given) or 'none'})",
                stream=stream,
            )
        encoding = given[0]
        data = _arg(frame, encoding, {"columns": dict, "rows": list, "arrow": bytes}[encoding])
        if encoding == "columns":
            for name, values in data.items():
                if not isinstance(values, list):
                    raise InvalidInput(
                        f"push to {stream!r}: column {name!r} must be an array",
                        stream=stream,
                        field=name,
                    )
        elif encoding == "rows":
            for i, row in enumerate(data):
                if not isinstance(row, dict):
                    raise InvalidInput(
                        f"push to {stream!r}: row {i} must be a map", stream=stream, row=i
                    )
        producer = _arg(frame, "producer", str, required=False)
        seq = _arg(frame, "seq", int, required=False)
        if seq is not None and seq < 0:
            raise InvalidInput("push: 'seq' must not be negative", argument="seq")
        return await self._service.push(stream, {encoding: data}, producer, seq)

    async def _op_subscribe(self, frame: dict[str, Any]) -> dict[str, Any]:
        assert self._tg is not None
        stream = _arg(frame, "stream", str)
        start = _arg(frame, "start", str, required=False) or "latest"
        if start not in START_POSITIONS:
            raise InvalidInput(
                f"subscribe: start must be 'latest' or 'earliest', not {start!r}",
                argument="start",
            )
        credit = _arg(frame, "credit", int, required=False)
        if credit is not None and credit < 1:
            raise InvalidInput("subscribe: 'credit' must be at least 1", argument="credit")
        if self._winding_down:
            raise Unavailable(f"subscribe to {stream!r}: the connection is closing", stream=stream)
        if len(self._subscriptions) >= self._server.max_subscriptions:
            raise InvalidInput(
                f"subscribe to {stream!r}: this connection already has "
                f"{len(self._subscriptions)} subscriptions (max {self._server.max_subscriptions})",
                stream=stream,
            )
        batches = self._service.subscribe(stream, start)
        sub = _Subscription(next(self._sids), stream, _Credit(credit))
        self._subscriptions[sub.sid] = sub
        sub.task = self._tg.create_task(self._pump(sub, batches))
        if getattr(batches, "announces_ready", False):
            # it yields READY once its start position is fixed, maybe on another peer
            try:
                async with asyncio.timeout(self._server.ready_timeout_s):
                    await sub.started.wait()
            except TimeoutError:
                sub.task.cancel()
                raise Unavailable(
                    f"subscribe to {stream!r}: no start position within "
                    f"{self._server.ready_timeout_s:.0f} s (the stream's host is not answering)",
                    stream=stream,
                ) from None
        else:
            # One turn of the loop lets the iterator run to its first real wait: a lazy one (an
            # async generator) raises NotFound etc. there, and that becomes this reply.
            await asyncio.sleep(0)
        sub.early = False
        if sub.early_error is not None:
            raise sub.early_error
        return {"subscription": sub.sid, "stream": stream}

    async def _op_unsubscribe(self, frame: dict[str, Any]) -> dict[str, Any]:
        sid = _arg(frame, "subscription", int)
        sub = self._subscriptions.get(sid)
        if sub is None or sub.task is None:
            raise NotFound(f"no subscription {sid} on this connection", subscription=sid)
        sub.task.cancel()
        await asyncio.wait({sub.task})  # its last batch frame is queued before our reply
        return {"subscription": sid}

    async def _op_lookup(self, frame: dict[str, Any]) -> dict[str, Any]:
        return await self._service.lookup(_arg(frame, "name", str))

    async def _op_status(self, frame: dict[str, Any]) -> dict[str, Any]:
        return await self._service.status()

    # -- subscriptions ---------------------------------------------------------------------

    async def _pump(self, sub: _Subscription, batches: AsyncIterator[dict[str, Any]]) -> None:
        """Forward one subscription's batches; ends with an ``end`` or ``error`` frame unless
        cancelled (unsubscribe or connection closing).

        The iterator is started at once, so that a lazy one (an async generator) checks its
        arguments and fixes its start position now; batches wait for the ``subscribe`` reply.
        """
        try:
            try:
                async for batch in batches:
                    if batch is READY or batch.get("ready"):
                        sub.started.set()
                        continue
                    sub.started.set()
                    await sub.replied.wait()
                    for data in self._batch_frames(sub, batch["offset"], batch["columns"]):
                        await sub.credit.take()
                        await self._outbox.put(data)
                last = self._encode({"type": "end", "subscription": sub.sid, "stream": sub.stream})
            except Exception as exc:
                if sub.early:  # the subscribe request is still running: it becomes its reply
                    sub.early_error = exc
                    sub.started.set()
                    return
                if isinstance(exc, FedstreamError):
                    last = self._encode_error(None, exc, subscription=sub.sid)
                else:
                    log.exception(
                        "subscription %d to %r on %s failed", sub.sid, sub.stream, self._stream.peer
                    )
                    last = self._encode({**_internal_error(None), "subscription": sub.sid})
            finally:
                sub.started.set()
                aclose = getattr(batches, "aclose", None)
                if aclose is not None:
                    try:
                        await aclose()
                    except Exception:
                        log.exception("closing subscription %d to %r failed", sub.sid, sub.stream)
            await sub.replied.wait()
            await self._outbox.put(last)
        finally:
            del self._subscriptions[sub.sid]

    def _batch_frames(
        self, sub: _Subscription, offset: int, columns: dict[str, list[Any]]
    ) -> list[bytes]:
        """One batch as frames: several (``part`` i of ``parts``) if it does not fit in one."""
        frame = {"type": "batch", "subscription": sub.sid, "stream": sub.stream, "offset": offset}
        whole = encode_frame({**frame, "columns": columns}, max_frame_bytes=_UNLIMITED)
        if self._fits(whole):  # the usual case: encoded once
            return [whole]
        pieces = self._fitting(sub, frame, columns)
        return [
            encode_frame(
                {**frame, "part": i, "parts": len(pieces), "columns": piece},
                max_frame_bytes=_UNLIMITED,
            )
            for i, piece in enumerate(pieces)
        ]

    def _fits(self, encoded: bytes) -> bool:
        """Whether a frame fits the limit with room left for part numbers."""
        return len(encoded) - HEADER_BYTES + _PART_FIELDS_BYTES <= self._max_frame_bytes

    def _fitting(
        self, sub: _Subscription, frame: dict[str, Any], columns: dict[str, list[Any]]
    ) -> list[dict[str, list[Any]]]:
        """``columns`` halved by rows until each half fits in a frame (with room for part
        numbers)."""
        if self._fits(encode_frame({**frame, "columns": columns}, max_frame_bytes=_UNLIMITED)):
            return [columns]
        rows = len(next(iter(columns.values()), []))
        if rows <= 1:
            raise InvalidInput(
                f"a tuple of stream {sub.stream!r} at offset {frame['offset']} is larger than "
                f"the frame limit of {self._max_frame_bytes} bytes",
                stream=sub.stream,
                offset=frame["offset"],
            )
        half = rows // 2
        head = {name: values[:half] for name, values in columns.items()}
        tail = {name: values[half:] for name, values in columns.items()}
        return self._fitting(sub, frame, head) + self._fitting(sub, frame, tail)
