"""One client connection of the API server: its requests, subscriptions and outbox.

Theory of operation
-------------------
A connection runs as one task that owns an ``asyncio.TaskGroup``; everything the connection
does lives in that group, so closing the connection (or the server) cancels all of it:

* the *read loop* (the group's body) reads frames and starts one task per request. At most
  ``max_in_flight`` requests run at once; when all slots are taken the read loop stops
  reading, and the transport pushes back on the client. ``credit`` frames are handled inline.
* request tasks decode their frame into a typed request (:mod:`peer.protocol.api`), call the
  :class:`~peer.server.service.PeerService` and put the encoded reply in the *outbox*;
* subscription tasks pull batches from the service's iterator and put ``batch`` frames in the
  outbox, each first taking one unit of the subscription's credit window (if the client asked
  for credit-based flow control: :class:`~overlay.transport.CreditWindow`);
* the *writer* task is the only one that writes to the stream. The outbox is a bounded queue,
  so a client that does not read stalls only its own connection: its subscriptions stop
  pulling (the service keeps their position), then its requests, then its read loop.

A request's reply is always queued before any ``batch`` frame of the subscription it creates,
and an ``unsubscribe`` reply after the last ``batch`` frame of that subscription, so clients
may rely on that order.

Errors: a :class:`~peer.errors.FedstreamError` from the service becomes an ``error`` frame with
its code; any other exception becomes code ``internal`` (logged with its traceback, not shown
to the client). A frame that breaks the framing rules (:class:`RemoteProtocolError`) gets one
``error`` frame with code ``protocol`` and ``id`` null, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.transport import CreditWindow, FrameStream
from overlay.wire import encode_frame
from peer.errors import FedstreamError, InvalidInput, NotFound, Unavailable
from peer.protocol.api import (
    MAX_CREDIT,
    PROTOCOL_VERSION,
    CreateQuery,
    CreateSchema,
    CreateStream,
    Credit,
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
    batch_frames,
    decode_request,
    protocol_error,
    request_id,
)
from peer.server.service import READY, PeerService

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


@dataclass(eq=False)
class _Subscription:
    sid: int
    stream: str
    credit: CreditWindow
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    early: bool = True  # the subscribe request has not yet decided its reply
    early_error: Exception | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)


class ApiConnection:
    """Serves one client's frame stream until it closes; see the module notes.

    ``participant`` is who the client's TLS certificate proves it is (None without TLS).
    """

    def __init__(
        self,
        service: PeerService,
        stream: FrameStream,
        settings: ConnectionSettings,
        participant: str | None = None,
    ) -> None:
        self.participant = participant
        self._service = service
        self._stream = stream
        self._settings = settings
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue(settings.outbox_frames)
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._requests: set[asyncio.Task[None]] = set()
        self._subscriptions: dict[int, _Subscription] = {}
        self._sids = itertools.count(1)
        self._tg: asyncio.TaskGroup | None = None
        self._winding_down = False

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
                return protocol_error(str(exc))
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
            credit = Credit.from_wire(frame)
        except InvalidInput as exc:
            await self._outbox.put(self._encode_error(ErrorReply.of(None, exc)))
            return
        sub = self._subscriptions.get(credit.subscription)
        if sub is not None:  # else it has just ended: nothing to do
            sub.credit.grant_capped(credit.batches)

    async def _wind_down(self, writer: asyncio.Task[None], last_words: bytes | None) -> None:
        """The client is gone or misbehaved: stop producing, flush what is owed, stop."""
        self._winding_down = True
        self._cancel_subscriptions()
        try:
            async with asyncio.timeout(self._settings.close_timeout_s):
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

    def _encode(self, reply: Ok | End | ErrorReply) -> bytes:
        return encode_frame(reply.to_wire(), max_frame_bytes=self._settings.max_frame_bytes)

    def _encode_error(self, reply: ErrorReply) -> bytes:
        try:
            return self._encode(reply)
        except LocalProtocolError:
            log.exception("error reply %s cannot be encoded", reply.code)
            internal = ErrorReply.internal(reply.id, subscription=reply.subscription)
            return self._encode(internal)

    # -- requests --------------------------------------------------------------------------

    async def _serve_request(self, frame: dict[str, Any]) -> None:
        op = frame["type"]
        rid: int | None = None
        subscribed: _Subscription | None = None
        try:
            rid = request_id(frame)
            request = decode_request(frame)
            if isinstance(request, Subscribe):
                subscribed = await self._subscribe(request)
                result = {"subscription": subscribed.sid, "stream": request.stream}
            else:
                result = await self._call(request)
            reply = self._encode(Ok(rid, result))
        except FedstreamError as exc:
            reply = self._encode_error(ErrorReply.of(rid, exc))
        except Exception:
            log.exception("API request %s (id %s) from %s failed", op, rid, self._stream.peer)
            reply = self._encode(ErrorReply.internal(rid))
        try:
            await self._outbox.put(reply)
        finally:
            self._slots.release()
        if subscribed is not None:
            subscribed.replied.set()  # only now may it send batches: they follow this reply

    async def _call(self, request: Request) -> dict[str, Any]:
        """The one dispatch table: each request to the service method that answers it."""
        service = self._service
        match request:
            case Hello():
                return self._hello(request)
            case CreateSchema(schema=schema):
                return await service.create_schema(schema)
            case CreateStream(name=name, schema=schema):
                return await service.create_stream(name, schema)
            case CreateQuery(query=query):
                return await service.create_query(query)
            case SetQueryStatus(name=name, status=status):
                return await service.set_query_status(name, status)
            case Push():
                return await service.push(
                    request.stream, request.payload, request.producer, request.seq
                )
            case Unsubscribe(subscription=sid):
                return await self._unsubscribe(sid)
            case Lookup(name=name):
                return await service.lookup(name)
            case Status():
                return await service.status()
            case Subscribe():
                raise AssertionError("subscribe is served by _subscribe")

    def _hello(self, hello: Hello) -> dict[str, Any]:
        log.debug("API client %r on %s", hello.client, self._stream.peer)
        result: dict[str, Any] = {
            "server": "fedstream",
            "version": PROTOCOL_VERSION,
            "max_frame_bytes": self._settings.max_frame_bytes,
        }
        if self.participant is not None:
            result["participant"] = self.participant
        return result

    async def _subscribe(self, request: Subscribe) -> _Subscription:
        assert self._tg is not None
        stream = request.stream
        if self._winding_down:
            raise Unavailable(f"subscribe to {stream!r}: the connection is closing", stream=stream)
        limit = self._settings.max_subscriptions
        if len(self._subscriptions) >= limit:
            raise InvalidInput(
                f"subscribe to {stream!r}: this connection already has "
                f"{len(self._subscriptions)} subscriptions (max {limit})",
                stream=stream,
            )
        batches = self._service.subscribe(stream, request.start)
        credit = None if request.credit is None else min(request.credit, MAX_CREDIT)
        window = CreditWindow(credit, max_credit=MAX_CREDIT)
        sub = _Subscription(next(self._sids), stream, window)
        self._subscriptions[sub.sid] = sub
        sub.task = self._tg.create_task(self._pump(sub, batches))
        if getattr(batches, "announces_ready", False):
            # it yields READY once its start position is fixed, maybe on another peer
            ready_s = self._settings.ready_timeout_s
            try:
                async with asyncio.timeout(ready_s):
                    await sub.started.wait()
            except TimeoutError:
                sub.task.cancel()
                raise Unavailable(
                    f"subscribe to {stream!r}: no start position within "
                    f"{ready_s:.0f} s (the stream's host is not answering)",
                    stream=stream,
                ) from None
        else:
            # One turn of the loop lets the iterator run to its first real wait: a lazy one (an
            # async generator) raises NotFound etc. there, and that becomes this reply.
            await asyncio.sleep(0)
        sub.early = False
        if sub.early_error is not None:
            raise sub.early_error
        return sub

    async def _unsubscribe(self, sid: int) -> dict[str, Any]:
        sub = self._subscriptions.get(sid)
        if sub is None or sub.task is None:
            raise NotFound(f"no subscription {sid} on this connection", subscription=sid)
        sub.task.cancel()
        await asyncio.wait({sub.task})  # its last batch frame is queued before our reply
        return {"subscription": sid}

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
                    frames = batch_frames(
                        sub.sid,
                        sub.stream,
                        batch["offset"],
                        batch["columns"],
                        max_frame_bytes=self._settings.max_frame_bytes,
                    )
                    for data in frames:
                        await sub.credit.take()
                        await self._outbox.put(data)
                last = self._encode(End(sub.sid, sub.stream))
            except Exception as exc:
                if sub.early:  # the subscribe request is still running: it becomes its reply
                    sub.early_error = exc
                    sub.started.set()
                    return
                if isinstance(exc, FedstreamError):
                    last = self._encode_error(ErrorReply.of(None, exc, subscription=sub.sid))
                else:
                    log.exception(
                        "subscription %d to %r on %s failed", sub.sid, sub.stream, self._stream.peer
                    )
                    last = self._encode(ErrorReply.internal(None, subscription=sub.sid))
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
