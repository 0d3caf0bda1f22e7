"""One client connection of the API server: the asyncio driver of its state machine.

Theory of operation
-------------------
The rules of the connection (request ids and replies, the in-flight limit, subscriptions and
their credit, closing) are :class:`~peer.protocol.api_connection.ServerConnection`'s, a sans-IO
state machine; this module runs it. A connection runs as one task that owns an
``asyncio.TaskGroup``; everything the connection does lives in that group, so closing the
connection (or the server) cancels all of it:

* the *read loop* (the group's body) reads frames, hands each to the state machine and acts on
  the event it gets back: a request starts a task; ``credit`` wakes its subscription; a frame
  answered by nobody in particular (a request without an id, a malformed ``credit``) is
  answered at once. While the state machine says ``reading_paused`` (``max_in_flight``
  requests unanswered) the loop stops reading, and the transport pushes back on the client.
* request tasks call the :class:`~peer.server.service.PeerService` and send the reply;
* subscription tasks (*pumps*) pull batches from the service's iterator and send ``batch``
  frames, each once the state machine has credit for it (if the client asked for credit-based
  flow control), waking on ``credit`` events;
* the *writer* task is the only one that writes to the stream. Everything sent goes through
  the *outbox*, bounded: a sender first waits for room, then has the state machine make the
  frame and queues it at once, so what the state machine counts as sent is always queued. A
  client that does not read stalls only its own connection: its subscriptions stop pulling
  (the service keeps their position), then its requests, then its read loop.

A request's reply is always queued before any ``batch`` frame of the subscription it creates,
and an ``unsubscribe`` reply after the last ``batch`` frame of that subscription (the state
machine refuses either order otherwise), so clients may rely on that order.

Errors: a :class:`~peer.errors.FedstreamError` from the service becomes an ``error`` frame with
its code; any other exception becomes code ``internal`` (logged with its traceback, not shown
to the client). A frame that breaks the framing rules (:class:`RemoteProtocolError`) gets one
``error`` frame with code ``protocol`` and ``id`` null, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.stream import IdleTimeout
from overlay.transport import FrameStream
from peer.errors import FedstreamError, Unavailable
from peer.protocol.api import (
    CreateQuery,
    CreateSchema,
    CreateSql,
    CreateStream,
    End,
    ErrorReply,
    Hello,
    Lookup,
    Ok,
    Push,
    Request,
    SetQueryStatus,
    Status,
    Subscribe,
    Unsubscribe,
)
from peer.protocol.api_connection import ServerConnection
from peer.protocol.api_events import (
    BadCredit,
    BadRequest,
    BatchPart,
    ConnectionClosed,
    CreditGranted,
    Ignored,
    RequestReceived,
    ServerMessage,
    Subscribed,
    Unsubscribed,
)
from peer.protocol.replies import Reply
from peer.server.service import CLIENT, READY, ClientRef, PeerService
from peer.server.sql_scripts import SqlScripts

__all__ = ["ApiConnection", "ConnectionSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionSettings:
    """The limits of each connection of one server."""

    max_frame_bytes: int
    max_in_flight: int
    max_subscriptions: int
    outbox_frames: int
    close_timeout_s: float
    ready_timeout_s: float
    idle_timeout_s: float | None = None  # nothing in flight, no frame: the connection closes


@dataclass(eq=False)
class _Pump:
    """The task and wake-ups of one subscription."""

    sid: int
    stream: str
    tentative: bool = False  # it takes tentative results and undos too (issue 16)
    credit: asyncio.Event = field(default_factory=asyncio.Event)  # set on each credit event
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    early: bool = True  # the subscribe request has not yet decided its reply
    early_error: Exception | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)


class _Outbox:
    """The frames waiting for the writer, at most ``size``. :meth:`put` first takes a place in
    the queue, then makes the frame, with no wait in between: a frame is never made (and
    counted as sent by the state machine) and then lost to a cancelled wait."""

    def __init__(self, size: int) -> None:
        # each place holds its frame, or nothing if making it failed
        self._places: asyncio.Queue[list[bytes] | None] = asyncio.Queue(size)

    async def put(self, make: Callable[[], bytes]) -> None:
        place: list[bytes] = []
        await self._places.put(place)
        place.append(make())

    async def close(self) -> None:
        await self._places.put(None)

    async def get(self) -> bytes | None:
        """The next frame to write; None once closed."""
        while (place := await self._places.get()) is not None:
            if place:
                return place[0]
        return None


class ApiConnection:
    """Serves one client's frame stream until it closes; see the module notes.

    ``participant`` is who the client's TLS certificate proves it is (None without TLS);
    ``scripts`` serves ``create_sql`` (the server's, shared by its connections).
    """

    def __init__(
        self,
        service: PeerService,
        stream: FrameStream,
        settings: ConnectionSettings,
        scripts: SqlScripts,
        participant: str | None = None,
    ) -> None:
        self.participant = participant
        self._service = service
        self._scripts = scripts
        self._stream = stream
        self._settings = settings
        self._conn = ServerConnection(
            max_frame_bytes=settings.max_frame_bytes,
            max_in_flight=settings.max_in_flight,
            max_subscriptions=settings.max_subscriptions,
            participant=participant,
        )
        self._outbox = _Outbox(settings.outbox_frames)
        self._answered = asyncio.Event()  # set on each reply: reading may resume
        self._requests: set[asyncio.Task[None]] = set()
        self._pumps: dict[int, _Pump] = {}
        self._tg: asyncio.TaskGroup | None = None

    async def run(self) -> None:
        # every task of this connection (requests, pumps) inherits who its client is
        host = self._stream.peer.rpartition(":")[0] or self._stream.peer
        CLIENT.set(ClientRef(self._stream.peer, self.participant or host))
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                writer = tg.create_task(self._write_loop())
                await self._read_loop(tg)
                await self._wind_down(writer)
        except* OSError as group:
            log.debug("API connection %s lost: %r", self._stream.peer, group.exceptions[0])

    # -- reading ---------------------------------------------------------------------------

    async def _read_loop(self, tg: asyncio.TaskGroup) -> None:
        """Hand frames to the state machine until EOF or a protocol error."""
        conn = self._conn
        while True:
            while conn.reading_paused:  # all slots busy: stop reading (backpressure)
                self._answered.clear()
                await self._answered.wait()
            try:
                idle_s = self._settings.idle_timeout_s
                event = conn.receive(await self._stream.recv(idle_timeout_s=idle_s))
            except IdleTimeout:
                if self._requests or self._pumps:
                    continue  # a subscriber may say nothing for hours: not idle
                log.info(
                    "API connection %s idle for %s s (idle_timeout_s); closing it",
                    self._stream.peer,
                    self._settings.idle_timeout_s,
                )
                return
            except RemoteProtocolError as exc:
                log.info(
                    "API connection %s sent an invalid frame; closing it: %s",
                    self._stream.peer,
                    exc,
                )
                conn.broken(exc)
                return
            match event:
                case RequestReceived() | BadRequest(id=int()):
                    task = tg.create_task(self._serve_request(event))
                    self._requests.add(task)
                    task.add_done_callback(self._requests.discard)
                case BadRequest(error=error) | BadCredit(error=error):
                    await self._send_error(ErrorReply.of(None, error))
                case CreditGranted(subscription=sid):
                    pump = self._pumps.get(sid)
                    if pump is not None:
                        pump.credit.set()
                case Ignored():
                    pass
                case ConnectionClosed():
                    return

    async def _wind_down(self, writer: asyncio.Task[None]) -> None:
        """The client is gone or misbehaved: stop producing, flush what is owed, stop."""
        self._cancel_subscriptions()
        try:
            async with asyncio.timeout(self._settings.close_timeout_s):
                if self._requests:
                    await asyncio.wait(set(self._requests))
                last_words = self._conn.finish()
                if last_words is not None:
                    await self._outbox.put(lambda: last_words)
                await self._outbox.close()
                await writer
        except TimeoutError:
            log.debug("API connection %s did not wind down in time", self._stream.peer)
            for task in self._requests:
                task.cancel()
            writer.cancel()

    def _cancel_subscriptions(self) -> None:
        for pump in self._pumps.values():
            if pump.task is not None:
                pump.task.cancel()

    # -- writing ---------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while (data := await self._outbox.get()) is not None:
            await self._stream.send_encoded(data)

    async def _send(self, message: ServerMessage) -> None:
        """Queue ``message`` once the outbox has room (LocalProtocolError: nothing queued)."""
        await self._outbox.put(lambda: self._conn.send(message))
        if not isinstance(message, BatchPart):  # a reply, maybe: the read loop may go on
            self._answered.set()

    async def _send_error(self, reply: ErrorReply) -> None:
        try:
            await self._send(reply)
        except LocalProtocolError:
            log.exception("error reply %s cannot be encoded", reply.code)
            await self._send(ErrorReply.internal(reply.id, subscription=reply.subscription))

    # -- requests --------------------------------------------------------------------------

    async def _serve_request(self, event: RequestReceived | BadRequest) -> None:
        rid = event.id
        assert rid is not None
        try:
            if isinstance(event, BadRequest):
                raise event.error
            request = event.request
            if isinstance(request, Subscribe):
                await self._subscribe(rid, request)
            elif isinstance(request, Unsubscribe):
                await self._unsubscribe(rid, request.subscription)
            else:
                reply = await self._call(request)
                await self._send(Ok(rid, reply.to_wire()))
        except FedstreamError as exc:
            await self._send_error(ErrorReply.of(rid, exc))
        except Exception:
            op = event.request.op if isinstance(event, RequestReceived) else "?"
            log.exception("API request %s (id %s) from %s failed", op, rid, self._stream.peer)
            await self._send(ErrorReply.internal(rid))

    async def _call(self, request: Request) -> Reply:
        """The one dispatch table: each request to the service method that answers it."""
        service = self._service
        match request:
            case Hello(client=client):
                log.debug("API client %r on %s", client, self._stream.peer)
                return self._conn.hello_result
            case CreateSchema(schema=schema):
                return await service.create_schema(schema)
            case CreateStream(name=name, schema=schema, replicas=replicas):
                return await service.create_stream(name, schema, replicas)
            case CreateQuery(query=query):
                return await service.create_query(query)
            case CreateSql():
                return await self._scripts.create(request)
            case SetQueryStatus(name=name, status=status):
                return await service.set_query_status(name, status)
            case Push():
                return await service.push(
                    request.stream, request.payload, request.producer, request.seq
                )
            case Lookup(name=name):
                return await service.lookup(name)
            case Status():
                return await service.status()
            case Subscribe() | Unsubscribe():
                raise AssertionError("served by _subscribe and _unsubscribe")

    async def _subscribe(self, rid: int, request: Subscribe) -> None:
        """Open the subscription, start its pump, reply once its start position is fixed."""
        assert self._tg is not None
        stream = request.stream
        self._conn.check_subscribe(request)
        batches = self._service.subscribe(stream, request.start)
        sid = self._conn.open_subscription(rid, request)
        pump = self._pumps[sid] = _Pump(sid, stream, request.tentative)
        task = pump.task = self._tg.create_task(self._pump(pump, batches))
        try:
            await self._started(pump, stream, getattr(batches, "announces_ready", False))
        except BaseException:
            task.cancel()
            raise
        pump.early = False
        if pump.early_error is not None:  # (its pump has ended: its iterator is being closed)
            raise pump.early_error
        if task.done():  # cancelled as the connection winds down: say it is closing
            self._conn.check_subscribe(request)
        try:
            await self._send(Subscribed(rid, sid, stream))
        except BaseException:
            task.cancel()
            raise
        pump.replied.set()  # only now may it send batches: they follow this reply

    async def _started(self, pump: _Pump, stream: str, announces_ready: bool) -> None:
        """Wait until the subscription's start position is fixed, or it has failed."""
        if not announces_ready:
            # One turn of the loop lets the iterator run to its first real wait: a lazy one (an
            # async generator) raises NotFound etc. there, and that becomes the reply.
            await asyncio.sleep(0)
            return
        # it yields READY once its start position is fixed, maybe on another peer
        ready_s = self._settings.ready_timeout_s
        try:
            async with asyncio.timeout(ready_s):
                await pump.started.wait()
        except TimeoutError:
            raise Unavailable(
                f"subscribe to {stream!r}: no start position within "
                f"{ready_s:.0f} s (the stream's host is not answering)",
                stream=stream,
            ) from None

    async def _unsubscribe(self, rid: int, sid: int) -> None:
        self._conn.check_unsubscribe(sid)
        task = self._pumps[sid].task
        assert task is not None
        task.cancel()
        await asyncio.wait({task})  # its last batch frame is queued before our reply
        await self._send(Unsubscribed(rid, sid))

    # -- subscriptions ---------------------------------------------------------------------

    async def _pump(self, pump: _Pump, batches: AsyncIterator[dict[str, Any]]) -> None:
        """Forward one subscription's batches; ends with an ``end`` or ``error`` frame unless
        cancelled (unsubscribe or connection closing).

        The iterator is started at once, so that a lazy one (an async generator) checks its
        arguments and fixes its start position now; batches wait for the ``subscribe`` reply.
        """
        sid, conn = pump.sid, self._conn
        last: ServerMessage
        try:
            try:
                async for batch in batches:
                    if batch is READY or batch.get("ready"):
                        pump.started.set()
                        continue
                    pump.started.set()
                    status, undo = batch.get("status"), batch.get("undo")
                    if (status is not None or undo is not None) and not pump.tentative:
                        continue  # a tentative result or an undo: a stable reader waits
                    await pump.replied.wait()
                    parts = conn.batch(sid, batch["offset"], batch["columns"], status, undo)
                    for part in parts:
                        while not conn.may_send_batch(sid):  # no credit: wait for some
                            pump.credit.clear()
                            await pump.credit.wait()
                        await self._send(part)
                last = End(sid, pump.stream)
            except Exception as exc:
                if pump.early:  # the subscribe request is still running: it becomes its reply
                    pump.early_error = exc
                    pump.started.set()
                    return
                if isinstance(exc, FedstreamError):
                    last = ErrorReply.of(None, exc, subscription=sid)
                else:
                    log.exception(
                        "subscription %d to %r on %s failed", sid, pump.stream, self._stream.peer
                    )
                    last = ErrorReply.internal(None, subscription=sid)
            finally:
                pump.started.set()
                aclose = getattr(batches, "aclose", None)
                if aclose is not None:
                    try:
                        await aclose()
                    except Exception:
                        log.exception("closing subscription %d to %r failed", sid, pump.stream)
            await pump.replied.wait()
            if isinstance(last, ErrorReply):
                await self._send_error(last)
            else:
                await self._send(last)
        finally:
            conn.drop_subscription(sid)
            del self._pumps[sid]
