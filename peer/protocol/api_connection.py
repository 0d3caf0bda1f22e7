"""The client API connection as two sans-IO state machines: :class:`ServerConnection` and
:class:`ClientConnection`. No asyncio, no I/O.

Theory of operation
-------------------
A driver (``peer.server.connection``, ``peer.client.connection``) owns the frame stream and the
tasks; the state machine owns the rules of docs/protocol.md that span more than one frame. The
driver hands it each decoded frame, ``receive(frame)`` (``None``: the other side closed), and
gets back exactly one typed event; to write, it hands over a typed message, ``send(...)``, and
gets the encoded frame, which it must write before anything it sends later. A message the
rules do not allow now raises :class:`~overlay.errors.LocalProtocolError` and changes nothing;
a frame the other side should not have sent raises :class:`~overlay.errors.RemoteProtocolError`
(and nothing else, whatever the frame holds: tests/unit/test_api_connection.py fuzzes this).

What is tracked:

* *request ids*: the client numbers its requests (unique on a :class:`ClientConnection`, and
  across the connections of one client when they share ``ids``); the server counts, per id,
  the requests it owes a reply. It reads no further while ``max_in_flight`` are owed
  (:attr:`ServerConnection.reading_paused`), so a request is in flight until its reply frame
  has been made, and a driver makes it only when it can queue it at once.
* *the handshake*: ``hello`` is optional and may come at any time; the server answers it from
  :attr:`ServerConnection.hello_result`, and the client takes the frame limit it names for
  every later request (:attr:`ClientConnection.max_frame_bytes`).
* *subscriptions and their credit*: on the server a subscription is *opening* from
  :meth:`~ServerConnection.open_subscription` until its ``ok`` (:class:`Subscribed`) is sent,
  then *live*; batch frames (:class:`BatchPart`) only while live, each taking one unit of
  credit, and no more after its ``end``/``error`` or once dropped. On the client it is open from
  the ``ok`` to its ``subscribe`` until its ``end``/``error`` arrives or the client sends
  ``unsubscribe``; arrivals count against the credit it asked for
  (:class:`~overlay.transport.ReceiveWindow`) and :meth:`ClientConnection.taken` gives taken
  batches back as ``credit`` once half the window has been taken.
* *closing*: see the table.

State transition table
----------------------
This is the one place the rules are written; each row names the method that applies it.

Server connection (``state``)::

    OPEN     receive(None)                  -> CLOSING   the client closed its side
    OPEN     receive raises / broken(exc)   -> CLOSING   a protocol error: farewell owed
    CLOSING  finish() -> farewell or None   -> CLOSED    owed replies flushed by the driver
    OPEN         receive(frame), open_subscription, send(any message below); but while
                 reading_paused (max_in_flight replies owed) receive raises LocalProtocolError
    CLOSING      send(any message below); open_subscription raises Unavailable
    CLOSED       nothing (LocalProtocolError)

Server request id ``i`` (a frame with an integer id is owed exactly one reply)::

    receive(request i)  -> owed     RequestReceived(i, ...) or BadRequest(i, ...)
    owed  send(Ok(i) | ErrorReply(i) | Subscribed(i, s) | Unsubscribed(i, s)) -> answered
    (a frame without an integer id is answered by ErrorReply(None, ...), owed by nobody)

Server subscription ``s``::

    open_subscription(i, Subscribe)       -> OPENING   counts toward max_subscriptions
    OPENING  send(Subscribed(i, s))       -> LIVE      its request i answered
    LIVE     send(BatchPart(s)): needs credit (None: unlimited), takes one unit
    LIVE     receive(credit s n)             credit += n, capped at MAX_CREDIT
    LIVE     send(End(s) | ErrorReply(None, subscription=s)) -> gone
    OPENING|LIVE  drop_subscription(s)    -> gone      (unsubscribed, cancelled: no last frame)
    gone     send(Unsubscribed(i, s)) allowed: its reply comes after its last batch

Client connection::

    OPEN     receive(error frame with neither id nor subscription) -> CLOSING (Farewell)
    any      receive(None) | close() | receive raises             -> CLOSED
    OPEN         send_request, send_credit
    CLOSING, CLOSED  send_request/send_credit raise LocalProtocolError

Client request ``i``: send_request -> in flight -> answered by receive(ok|error i) (Replied,
RequestFailed) or forgotten by abandon(i) (a late reply is Ignored). The ``ok`` to a hello
sets ``server_info`` and ``max_frame_bytes``; the ``ok`` to a subscribe opens its subscription.

Client subscription ``s``: opened by the ``ok`` to its subscribe; receive(batch s) counts one
arrival (beyond the credit: RemoteProtocolError); receive(end|error s) ends it
(SubscriptionEnded); send_request(Unsubscribe(s)) forgets it. Frames for a subscription the
client does not know are Ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TypeGuard

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.transport import CreditError, ReceiveWindow
from overlay.wire import DEFAULT_MAX_FRAME_BYTES, encode_frame
from peer.errors import FedstreamError, InvalidInput, NotFound, Unavailable
from peer.protocol.api import (
    MAX_CREDIT,
    PROTOCOL_VERSION,
    BatchFrame,
    Columns,
    Credit,
    End,
    ErrorReply,
    Frame,
    Ok,
    Request,
    Subscribe,
    Unsubscribe,
    batch_frames,
    decode_request,
    error_from_wire,
    protocol_error,
    request_id,
)
from peer.protocol.api_events import (
    BadCredit,
    BadRequest,
    BatchPart,
    BatchReceived,
    ClientEvent,
    ConnectionClosed,
    CreditGranted,
    Farewell,
    Ignored,
    RawRequest,
    Replied,
    RequestFailed,
    RequestReceived,
    ServerEvent,
    ServerMessage,
    Subscribed,
    SubscriptionEnded,
    Unsubscribed,
)
from peer.protocol.replies import HelloReply, SubscribeReply, decode_result

__all__ = ["ClientConnection", "ServerConnection", "State"]


class State(Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# -- the server -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Outgoing:
    """A subscription on the server's side."""

    request: int  # the id of the subscribe request that opened it
    stream: str
    credit: int | None  # batch frames it may still send; None: no flow control
    live: bool = False  # its ``ok`` has been sent


class ServerConnection:
    """The server's side of one client connection (see the module notes).

    ``participant`` is who the client's TLS certificate proves it is (None without TLS).
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 16,
        max_subscriptions: int = 64,
        participant: str | None = None,
    ) -> None:
        if max_in_flight < 1 or max_subscriptions < 0:
            raise ValueError("max_in_flight must be at least 1, max_subscriptions at least 0")
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_subscriptions = max_subscriptions
        self.participant = participant
        self.state = State.OPEN
        self._owed: dict[int, int] = {}  # request id -> replies owed (a client may reuse one)
        self._in_flight = 0
        self._subscriptions: dict[int, _Outgoing] = {}
        self._sids = itertools.count(1)
        self._farewell: str | None = None

    @property
    def in_flight(self) -> int:
        """Requests received and not yet answered."""
        return self._in_flight

    @property
    def reading_paused(self) -> bool:
        """Whether the driver must stop reading until a reply is sent (backpressure)."""
        return self._in_flight >= self.max_in_flight

    @property
    def subscriptions(self) -> int:
        """Subscriptions opening or live."""
        return len(self._subscriptions)

    @property
    def hello_result(self) -> HelloReply:
        return HelloReply("fedstream", PROTOCOL_VERSION, self.max_frame_bytes, self.participant)

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, frame: Frame | None) -> ServerEvent:
        """The event a frame from the client carries (None: the client closed its side)."""
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"a frame received on a {self.state.value} connection")
        if self.reading_paused:
            raise LocalProtocolError(
                f"a frame received with {self._in_flight} requests unanswered: read no further"
            )
        if frame is None:
            self.state = State.CLOSING
            return ConnectionClosed()
        try:
            return self._receive(frame)
        except RemoteProtocolError as exc:
            self.broken(exc)
            raise

    def _receive(self, frame: Frame) -> ServerEvent:
        if not isinstance(frame.get("type"), str):
            raise RemoteProtocolError("a frame needs a str 'type'")
        if frame["type"] == "credit":
            try:
                credit = Credit.from_wire(frame)
            except InvalidInput as exc:
                return BadCredit(exc)
            sub = self._subscriptions.get(credit.subscription)
            if sub is None:  # it has just ended: nothing to do
                return Ignored(f"credit for subscription {credit.subscription}, which is gone")
            if sub.credit is not None:
                sub.credit += min(credit.batches, MAX_CREDIT - sub.credit)
            return CreditGranted(credit.subscription, credit.batches)
        try:
            rid = request_id(frame)
        except InvalidInput as exc:
            return BadRequest(None, exc)
        self._owed[rid] = self._owed.get(rid, 0) + 1
        self._in_flight += 1
        try:
            return RequestReceived(rid, decode_request(frame))
        except InvalidInput as exc:
            return BadRequest(rid, exc)

    def broken(self, exc: RemoteProtocolError) -> None:
        """The client broke the protocol (here or in the framing below): stop reading, answer
        what is owed, then say why (:meth:`finish`)."""
        if self.state is State.OPEN:
            self.state = State.CLOSING
            self._farewell = str(exc)

    def finish(self) -> bytes | None:
        """Close: the ``protocol`` error frame to send last if the client broke the protocol."""
        if self.state is not State.CLOSING:
            raise LocalProtocolError(f"finish on a {self.state.value} connection")
        self.state = State.CLOSED
        return None if self._farewell is None else protocol_error(self._farewell)

    # -- subscriptions -----------------------------------------------------------------------

    def check_subscribe(self, request: Subscribe) -> None:
        """Whether a subscription may be opened now: Unavailable while closing, InvalidInput
        beyond ``max_subscriptions``."""
        stream = request.stream
        if self.state is not State.OPEN:
            raise Unavailable(f"subscribe to {stream!r}: the connection is closing", stream=stream)
        if len(self._subscriptions) >= self.max_subscriptions:
            raise InvalidInput(
                f"subscribe to {stream!r}: this connection already has "
                f"{len(self._subscriptions)} subscriptions (max {self.max_subscriptions})",
                stream=stream,
            )

    def open_subscription(self, rid: int, request: Subscribe) -> int:
        """Open a subscription for subscribe request ``rid``; its id. Batches wait for its
        reply (:class:`Subscribed`)."""
        self.check_subscribe(request)
        if rid not in self._owed:
            raise LocalProtocolError(f"subscribe: no request {rid} is waiting for a reply")
        credit = None if request.credit is None else min(request.credit, MAX_CREDIT)
        sid = next(self._sids)
        self._subscriptions[sid] = _Outgoing(rid, request.stream, credit)
        return sid

    def check_unsubscribe(self, sid: int) -> None:
        """NotFound unless subscription ``sid`` is live."""
        sub = self._subscriptions.get(sid)
        if sub is None or not sub.live:
            raise NotFound(f"no subscription {sid} on this connection", subscription=sid)

    def drop_subscription(self, sid: int) -> None:
        """The driver stopped subscription ``sid`` without a last frame (unsubscribed,
        cancelled, or failed before its reply); nothing if it has ended already."""
        self._subscriptions.pop(sid, None)

    def credit(self, sid: int) -> int | None:
        """The batch frames subscription ``sid`` may still send (None: no flow control)."""
        sub = self._subscriptions.get(sid)
        if sub is None:
            raise LocalProtocolError(f"credit of subscription {sid}, which is gone")
        return sub.credit

    def may_send_batch(self, sid: int) -> bool:
        """Whether subscription ``sid`` is live and has credit for one more batch frame."""
        sub = self._subscriptions.get(sid)
        return sub is not None and sub.live and sub.credit != 0

    def batch(
        self,
        sid: int,
        offset: int,
        columns: Columns,
        status: str | None = None,
        undo: int | None = None,
    ) -> list[BatchPart]:
        """A batch of live subscription ``sid`` as the frames to send, one unit of credit
        each: several if it does not fit in one (InvalidInput if one tuple does not)."""
        sub = self._live(sid, "batch")
        frames = batch_frames(
            sid,
            sub.stream,
            offset,
            columns,
            max_frame_bytes=self.max_frame_bytes,
            status=status,
            undo=undo,
        )
        return [BatchPart(sid, data) for data in frames]

    def _live(self, sid: int, what: str) -> _Outgoing:
        sub = self._subscriptions.get(sid)
        if sub is None or not sub.live:
            state = "gone" if sub is None else "not yet answered"
            raise LocalProtocolError(f"{what} for subscription {sid}, which is {state}")
        return sub

    # -- sending -----------------------------------------------------------------------------

    def send(self, message: ServerMessage) -> bytes:
        """The frame to write for ``message``; LocalProtocolError (nothing changed) if it may
        not be sent now or does not fit in a frame."""
        if self.state is State.CLOSED:
            raise LocalProtocolError("the connection is closed")
        match message:
            case BatchPart(subscription=sid, data=data):
                sub = self._live(sid, "a batch frame")
                if sub.credit == 0:
                    raise LocalProtocolError(f"subscription {sid} has no credit for a batch")
                if sub.credit is not None:
                    sub.credit -= 1
                return data
            case End(subscription=sid) | ErrorReply(id=None, subscription=int(sid)):
                self._live(sid, "the end")
                data = self._encode(message)
                del self._subscriptions[sid]
                return data
            case ErrorReply(id=None, subscription=None):
                return self._encode(message)  # owed by nobody: a notice, or the farewell
            case Ok(id=rid) | ErrorReply(id=int(rid), subscription=None) | Unsubscribed(id=rid):
                self._owing(rid)
                if (
                    isinstance(message, Unsubscribed)
                    and message.subscription in self._subscriptions
                ):
                    raise LocalProtocolError(
                        f"unsubscribe reply before subscription {message.subscription} is gone"
                    )
                data = self._encode(message)
                self._answered(rid)
                return data
            case Subscribed(id=rid, subscription=sid):
                self._owing(rid)
                opening = self._subscriptions.get(sid)
                if opening is None or opening.live or opening.request != rid:
                    raise LocalProtocolError(f"subscription {sid} is not opening for request {rid}")
                data = self._encode(message)
                opening.live = True
                self._answered(rid)
                return data
        raise LocalProtocolError(f"{message!r} is not a message a server sends")

    def _owing(self, rid: int) -> None:
        if rid not in self._owed:
            raise LocalProtocolError(f"a reply to request {rid}, which is owed none")

    def _answered(self, rid: int) -> None:
        owed = self._owed.pop(rid) - 1
        if owed:
            self._owed[rid] = owed
        self._in_flight -= 1

    def _encode(self, message: Ok | ErrorReply | End | Subscribed | Unsubscribed) -> bytes:
        return encode_frame(message.to_wire(), max_frame_bytes=self.max_frame_bytes)


# -- the client -------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class _Incoming:
    """A subscription on the client's side."""

    credit: int | None  # what its subscribe asked for
    window: ReceiveWindow | None


class ClientConnection:
    """The client's side of one connection (see the module notes).

    ``ids`` numbers the requests; a client that reconnects passes the same iterator to each
    new connection, so that an id is never reused by one client.
    """

    def __init__(self, *, ids: Iterator[int] | None = None) -> None:
        self.state = State.OPEN
        self.server_info: HelloReply | None = None
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES  # until the hello reply names it
        self._ids = itertools.count(1) if ids is None else ids
        self._in_flight: dict[int, Request | RawRequest] = {}
        self._subscriptions: dict[int, _Incoming] = {}

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    # -- sending -----------------------------------------------------------------------------

    def send_request(self, request: Request | RawRequest) -> tuple[int, bytes]:
        """A new request id and the frame to write; LocalProtocolError if the connection is
        closing, or if the frame is larger than the server takes."""
        self._check_open()
        rid = next(self._ids)
        data = encode_frame(request.to_wire(rid), max_frame_bytes=self.max_frame_bytes)
        self._in_flight[rid] = request
        if isinstance(request, Unsubscribe):  # what still comes for it concerns nobody
            self._subscriptions.pop(request.subscription, None)
        return rid, data

    def send_credit(self, credit: Credit) -> bytes:
        """The frame granting ``credit``; credit for a subscription that has just ended is
        allowed (the server ignores it)."""
        self._check_open()
        return encode_frame(credit.to_wire(), max_frame_bytes=self.max_frame_bytes)

    def abandon(self, rid: int) -> None:
        """The caller stopped waiting for request ``rid``: its reply, if it comes, is Ignored."""
        self._in_flight.pop(rid, None)

    def taken(self, sid: int) -> Credit | None:
        """The application took one batch of subscription ``sid``: the credit to send now, if
        any (none for a subscription without flow control, or one that has ended)."""
        sub = self._subscriptions.get(sid)
        if sub is None or sub.window is None:
            return None
        grant = sub.window.taken()
        return Credit(sid, grant) if grant else None

    def close(self) -> None:
        """This side closed the connection."""
        self.state = State.CLOSED

    def _check_open(self) -> None:
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"the connection is {self.state.value}")

    # -- receiving ---------------------------------------------------------------------------

    def receive(self, frame: Frame | None) -> ClientEvent:
        """The event a frame from the server carries (None: the server closed the connection)."""
        if self.state is State.CLOSED:
            raise LocalProtocolError("a frame received on a closed connection")
        if frame is None:
            self.state = State.CLOSED
            return ConnectionClosed()
        try:
            return self._receive(frame)
        except RemoteProtocolError:
            self.state = State.CLOSED
            raise

    def _receive(self, frame: Frame) -> ClientEvent:
        kind = frame.get("type")
        if not isinstance(kind, str):
            raise RemoteProtocolError("a frame needs a str 'type'")
        if kind == "batch":  # (the most frequent frame first)
            return self._batch(BatchFrame.from_wire(frame))
        rid, sid = frame.get("id"), frame.get("subscription")
        if kind in ("ok", "error") and _is_int(rid):
            return self._reply(kind, rid, frame)
        if kind in ("end", "error") and _is_int(sid):
            if self._subscriptions.pop(sid, None) is None:
                return Ignored(f"{kind} of subscription {sid}, which is not open")
            return SubscriptionEnded(sid, _error(frame) if kind == "error" else None)
        if kind == "error":
            code, message = frame.get("code"), frame.get("message")
            self.state = State.CLOSING
            return Farewell(code if isinstance(code, str) else None, str(message))
        return Ignored(f"a {kind} frame")

    def _reply(self, kind: str, rid: int, frame: Frame) -> ClientEvent:
        request = self._in_flight.get(rid)
        if request is None:
            return Ignored(f"reply to request {rid} that nobody waits for")
        if kind == "error":
            error = _error(frame)
            del self._in_flight[rid]
            return RequestFailed(rid, error)
        result = Ok.from_wire(frame).result
        if isinstance(request, RawRequest):  # (a test's hand-made request: its bare result)
            del self._in_flight[rid]
            return Replied(rid, result)
        reply = decode_result(request.op, result)
        if isinstance(reply, HelloReply):
            self._hello(reply)
        elif isinstance(request, Subscribe) and isinstance(reply, SubscribeReply):
            self._subscribed(request, reply)
        del self._in_flight[rid]
        return Replied(rid, reply)

    def _hello(self, reply: HelloReply) -> None:
        limit = reply.max_frame_bytes
        self.server_info = reply
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES if limit is None else limit

    def _subscribed(self, request: Subscribe, reply: SubscribeReply) -> None:
        sid = reply.subscription
        if sid in self._subscriptions:
            raise RemoteProtocolError(f"subscribe reply names subscription {sid}, already open")
        credit = request.credit
        # (a server keeps at most MAX_CREDIT of a larger credit: it never sends more than asked)
        window = (
            None if credit is None else ReceiveWindow(credit, max_credit=max(credit, MAX_CREDIT))
        )
        self._subscriptions[sid] = _Incoming(credit, window)

    def _batch(self, batch: BatchFrame) -> ClientEvent:
        sub = self._subscriptions.get(batch.subscription)
        if sub is None:
            return Ignored(f"batch of subscription {batch.subscription}, which is not open")
        if sub.window is not None:
            try:
                sub.window.arrived()
            except CreditError as exc:
                raise RemoteProtocolError(
                    f"peer sent more batches than the credit of {sub.credit}"
                ) from exc
        return BatchReceived(batch)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _error(frame: Frame) -> FedstreamError:
    try:
        return error_from_wire(frame)
    except TypeError as exc:  # details that collide with the error's own arguments
        raise RemoteProtocolError(f"error frame with invalid details: {exc}") from exc
