"""Peer links: long-lived mutual-TLS connections carrying requests and credit-based streams.

Theory of operation
-------------------
A link is one TCP connection between two peers, upgraded to TLS 1.3 with node certificates
issued by participant keys (:mod:`overlay.tls`), then carrying :mod:`overlay.wire` frames. Right
after the handshake the client sends a ``hello`` and the server answers with its own (or with
``refused`` and a reason). Each hello names the sender's node id and participant, which must be
the ones its TLS certificate proves, and its limits. From then on the link is symmetric: either
side may send requests and open streams, and serves the other's with its :class:`LinkHandler`.

The handshake frames, then the others (``id`` is chosen by the side sending ``req``/``open``)::

    hello   {version, node_id, participant, max_in_flight, max_streams}
    refused {reason, retriable}  the server's answer instead of its hello
    req    {id, body}            a request; answered by exactly one rep
    rep    {id, body} | {id, error: {code, message, retriable, details}}
    open   {id, body, credit}    a stream; answered by items, then exactly one end
    item   {id, body}            one item; the sender spends one unit of credit
    credit {id, n}               the receiver grants n more items
    end    {id} | {id, error}
    cancel {id}                  the caller gave up on a req or open; its rep/end still comes

Flow control and memory bounds:

* *requests*: at most ``max_in_flight`` (the lower of both sides' hello values) requests of
  one side are outstanding; further callers wait for a slot. A slot is freed by the ``rep``,
  so a caller that gives up sends ``cancel`` and the slot stays taken until the rep comes.
  A peer that sends more than it announced breaks the protocol.
* *streams*: at most ``max_streams`` open streams per side, same rule with ``end``. The
  sender pulls the next item from its producer only when it has credit, so a receiver that
  stops consuming stops the producer after ``credit`` items; the receiver's queue never holds
  more than the credit it granted. Credit comes back as the consumer takes items.
* *sending*: every frame goes through one bounded outbox and one writer task; producers wait
  for room, and the writer waits for the socket (``FrameStream.send``). A remote that does not
  read stalls this link only.
* *reading* never blocks on anything but the socket (replies, items and credits are handed
  over without waiting), so two peers calling each other cannot deadlock.

A frame that breaks these rules closes that link (logged with the reason); every pending call
on it fails with :class:`LinkUnavailable`. All tasks of a link live in its ``TaskGroup``; the
server and the pool each own one ``TaskGroup`` holding their links.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from overlay.errors import RemoteProtocolError
from overlay.identity import IdentityError, NodeIdentity, TrustStore
from overlay.stream import FrameStream
from overlay.tls import PeerIdentity, TlsContexts, peer_identity
from overlay.wire import DEFAULT_MAX_FRAME_BYTES, encode_frame

__all__ = [
    "LINK_VERSION",
    "Link",
    "LinkError",
    "LinkHandler",
    "LinkPool",
    "LinkRefused",
    "LinkRemoteError",
    "LinkServer",
    "LinkSettings",
    "LinkStream",
    "LinkTimeout",
    "LinkUnavailable",
]

log = logging.getLogger(__name__)

LINK_VERSION = 1
MAX_CREDIT = 1 << 16
_MAX_LIMIT = 1 << 16
_CLOSE_WAIT_S = 1.0
_T = TypeVar("_T")


# -- errors -----------------------------------------------------------------------------------


class LinkError(Exception):
    """Base of the link errors; ``code`` and ``to_wire`` let a handler pass one on."""

    code = "link"
    retriable = False

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "details": {}}


class LinkRefused(LinkError):
    """The other side is not who it must be, or does not accept us (identity, trust, version)."""

    code = "refused"


class LinkUnavailable(LinkError):
    """The link could not be opened or broke (connect failed, closed, invalid frames)."""

    code = "unavailable"
    retriable = True


class LinkTimeout(LinkUnavailable):
    """No answer in time (the request may or may not have been carried out)."""

    code = "timeout"


class _NotSent(LinkUnavailable):
    """The link broke before the request left this peer: safe to retry on a new link."""


class _CancelledByCaller(Exception):
    """The remote sent ``cancel`` for what we were serving."""


class LinkRemoteError(LinkError):
    """The remote handler refused or failed the request."""

    def __init__(
        self, code: str, message: str, retriable: bool, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retriable = retriable
        self.details = details or {}

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


# -- the handler and the settings -------------------------------------------------------------


class LinkHandler(Protocol):
    """Serves what the other side of a link asks (the peer implements it).

    ``handle`` answers a request; ``stream`` produces the items of a stream (an async
    generator, pulled only while the receiver has credit). An exception with a str ``code``
    and ``to_wire()`` becomes an error with that code (and its ``retriable``); any other
    becomes code ``internal``. Both may be cancelled (caller gone, link closed).
    """

    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


class _Unsupported(LinkError):
    code = "unsupported"


class _NoHandler:
    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        raise _Unsupported("this peer serves no requests on links it opened")

    def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        raise _Unsupported("this peer serves no streams on links it opened")


@dataclass(frozen=True)
class LinkSettings:
    """Limits and timeouts of the links of one server or pool."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 32
    max_streams: int = 64
    outbox_frames: int = 64
    handshake_timeout_s: float = 10.0
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_streams", "outbox_frames"):
            if not 1 <= getattr(self, name) <= _MAX_LIMIT:
                raise ValueError(f"{name} must be in 1..{_MAX_LIMIT}")


# -- one link ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Call:
    """A req or open of ours, from the moment it holds a slot until its rep/end (or the end
    of the link). ``queued``: in the outbox; ``sent``: written; ``abandoned``: caller gone."""

    id: int
    slot: asyncio.Semaphore
    stream: LinkStream | None = None  # None: a request
    future: asyncio.Future[dict[str, Any]] | None = None  # a request's, once queued
    queued: bool = False
    sent: bool = False
    abandoned: bool = False


@dataclass(eq=False)
class _Served:
    """A req or open of the remote that we are running."""

    id: int
    is_stream: bool
    credit: int = 0
    credit_added: asyncio.Event = field(default_factory=asyncio.Event)
    scope: asyncio.Timeout | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _Out:
    data: bytes
    call: _Call | None = None


class _Outbox:
    """Frames for the writer: control frames (credit, cancel) first, then data frames in
    order. Holds at most ``capacity`` data frames; ``put`` waits for room (backpressure)."""

    def __init__(self, capacity: int) -> None:
        self._data: deque[_Out] = deque()
        self._control: deque[Callable[[], bytes | None]] = deque()
        self._capacity = capacity
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed_reason: str | None = None

    async def put(self, out: _Out) -> None:
        while len(self._data) >= self._capacity and self._closed_reason is None:
            self._writable.clear()
            await self._writable.wait()
        if self._closed_reason is not None:
            raise _NotSent(self._closed_reason)
        self._data.append(out)
        if out.call is not None:
            out.call.queued = True
        self._readable.set()

    def put_control(self, make: Callable[[], bytes | None]) -> None:
        if self._closed_reason is None:
            self._control.append(make)
            self._readable.set()

    async def get(self) -> _Out | Callable[[], bytes | None] | None:
        """The next thing to write, or None once closed."""
        while not self._control and not self._data and self._closed_reason is None:
            self._readable.clear()
            await self._readable.wait()
        if self._closed_reason is not None:
            return None
        if self._control:
            return self._control.popleft()
        self._writable.set()
        return self._data.popleft()

    def close(self, reason: str) -> None:
        self._closed_reason = reason
        self._data.clear()
        self._control.clear()
        self._readable.set()
        self._writable.set()


def _error_payload(exc: BaseException, where: str) -> dict[str, Any]:
    code = getattr(exc, "code", None)
    to_wire = getattr(exc, "to_wire", None)
    if isinstance(code, str) and callable(to_wire):
        try:
            wire = to_wire()
        except Exception:
            wire = {}
        message = wire.get("message") if isinstance(wire, dict) else None
        details = wire.get("details") if isinstance(wire, dict) else None
        return {
            "code": code,
            "message": message if isinstance(message, str) else str(exc),
            "retriable": bool(getattr(exc, "retriable", False)),
            "details": details if isinstance(details, dict) else {},
        }
    log.error("%s failed", where, exc_info=exc)
    return _internal(where)


def _internal(where: str) -> dict[str, Any]:
    return {
        "code": "internal",
        "message": f"internal error in the remote peer ({where}; its log has the details)",
        "retriable": False,
        "details": {},
    }


def _remote_error(error: Any) -> LinkRemoteError:
    if not isinstance(error, dict):
        raise RemoteProtocolError("an error must be a map")
    code, message = error.get("code"), error.get("message")
    details = error.get("details")
    return LinkRemoteError(
        code if isinstance(code, str) else "error",
        message if isinstance(message, str) else "error",
        error.get("retriable") is True,
        details if isinstance(details, dict) else {},
    )


def _field(frame: dict[str, Any], name: str, kind: type) -> Any:
    value = frame.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RemoteProtocolError(f"{frame['type']} frame needs a {kind.__name__} {name!r}")
    return value


def _op(frame: Mapping[str, Any]) -> str:
    op = frame.get("type", frame.get("op"))
    return op if isinstance(op, str) else "?"


class Link:
    """One running peer link; see the module notes. Made by :class:`LinkServer` and
    :class:`LinkPool`, which run it (:meth:`run`) in their task group."""

    def __init__(
        self,
        stream: FrameStream,
        remote: PeerIdentity,
        remote_limits: tuple[int, int],
        handler: LinkHandler,
        settings: LinkSettings,
        *,
        address: str,
    ) -> None:
        self.remote_node_id = remote.node_id
        self.remote_node_pub = remote.node_pub
        self.remote_participant = remote.participant
        self.remote_participant_pub = remote.participant_pub
        self.address = address
        self._stream = stream
        self._handler = handler
        self._settings = settings
        self._ids = itertools.count(1)
        self._request_slots = asyncio.Semaphore(min(settings.max_in_flight, remote_limits[0]))
        self._stream_slots = asyncio.Semaphore(min(settings.max_streams, remote_limits[1]))
        self._calls: dict[int, _Call] = {}
        self._served: dict[int, _Served] = {}
        self._served_requests = 0
        self._served_streams = 0
        self._outbox = _Outbox(settings.outbox_frames)
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._closing = asyncio.Event()
        self._closed = asyncio.Event()
        self._reason: str | None = None
        self._last_active = asyncio.get_running_loop().time()

    def __repr__(self) -> str:
        return (
            f"peer link to {self.remote_participant}/{self.remote_node_id.hex()[:12]} "
            f"at {self.address}"
        )

    @property
    def closed(self) -> bool:
        return self._reason is not None

    def idle_s(self) -> float:
        """Seconds since anything was in flight on this link (0 while something is)."""
        if self._calls or self._served:
            return 0.0
        return asyncio.get_running_loop().time() - self._last_active

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Read, write and serve until the link closes; returns once everything has stopped."""
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self._spawn(self._read_loop())
                self._spawn(self._write_loop())
                await self._closing.wait()
                for task in list(self._tasks):
                    task.cancel()
        except* Exception as group:  # a bug: this link ends, the server or pool goes on
            log.error("%s failed", self, exc_info=group)
        finally:
            self._shut(f"{self} was closed")
            await self._stream.aclose(self._settings.close_timeout_s)
            self._closed.set()

    async def close(self) -> None:
        """Close the link (pending calls fail with LinkUnavailable) and wait for it, bounded."""
        self._shut(f"{self} was closed by this peer")
        try:
            async with asyncio.timeout(self._settings.close_timeout_s + _CLOSE_WAIT_S):
                await self._closed.wait()
        except TimeoutError:
            log.warning("%s did not close in time", self)

    def _shut(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        self._outbox.close(reason)
        for call in list(self._calls.values()):
            error = LinkUnavailable(reason) if call.sent else _NotSent(reason)
            self._finish(call, error=error)
        self._closing.set()

    def _spawn(self, coro: Any) -> None:
        assert self._tg is not None
        task = self._tg.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- calling the other side ----------------------------------------------------------------

    async def request(self, frame: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and return the reply's body. Waits for a slot when ``max_in_flight``
        requests are outstanding. Raises :class:`LinkRemoteError` (the handler failed it),
        :class:`LinkTimeout`, :class:`LinkUnavailable`."""
        rid = next(self._ids)
        data = encode_frame(
            {"type": "req", "id": rid, "body": dict(frame)},
            max_frame_bytes=self._settings.max_frame_bytes,
        )
        loop = asyncio.get_running_loop()
        call: _Call | None = None
        try:
            async with asyncio.timeout(timeout_s):
                call = await self._new_call(rid, self._request_slots)
                await self._outbox.put(_Out(data, call))
                call.future = loop.create_future()  # before the writer can send it
                return await call.future
        except TimeoutError as exc:
            raise LinkTimeout(f"{self}: no reply to {_op(frame)!r} within {timeout_s} s") from exc
        finally:
            if call is not None:
                self._abandon(call)

    def open_stream(
        self, frame: Mapping[str, Any], *, credit: int = 16, timeout_s: float = 30.0
    ) -> LinkStream:
        """A stream of items the remote's handler produces; see :class:`LinkStream`."""
        return LinkStream(self, frame, credit, timeout_s)

    async def _new_call(
        self, cid: int, slots: asyncio.Semaphore, stream: LinkStream | None = None
    ) -> _Call:
        if self._reason is not None:
            raise _NotSent(self._reason)
        await slots.acquire()
        if self._reason is not None:
            slots.release()
            raise _NotSent(self._reason)
        call = _Call(cid, slots, stream)
        self._calls[cid] = call
        self._last_active = asyncio.get_running_loop().time()
        return call

    def _finish(
        self,
        call: _Call,
        *,
        body: dict[str, Any] | None = None,
        error: LinkError | None = None,
    ) -> None:
        """The call is over: free its slot, hand over the result (if anyone still waits)."""
        if self._calls.pop(call.id, None) is None:
            return
        call.slot.release()
        self._last_active = asyncio.get_running_loop().time()
        if call.future is not None and not call.future.done() and not call.abandoned:
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(body or {})
        if call.stream is not None:
            call.stream._end(error)

    def _abandon(self, call: _Call) -> None:
        """The caller is gone (done, timed out, cancelled): make sure the call ends."""
        if call.id not in self._calls or call.abandoned:
            return
        call.abandoned = True
        if not call.queued:
            self._finish(call, error=_NotSent("abandoned"))
        elif call.sent:
            data = encode_frame({"type": "cancel", "id": call.id})
            self._outbox.put_control(lambda: data)
        # else: still in the outbox; the writer drops it and finishes the call

    # -- reading ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while (frame := await self._stream.recv()) is not None:
                self._dispatch(frame)
            self._shut(f"{self} was closed by the remote peer")
        except RemoteProtocolError as exc:
            log.warning("%s sent an invalid frame; closing the link: %s", self, exc)
            self._shut(f"{self} sent an invalid frame: {exc}")
        except OSError as exc:
            self._shut(f"{self} broke: {exc!r}")

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "req" or kind == "open":
            self._on_call(frame, is_stream=kind == "open")
            return
        fid = _field(frame, "id", int)
        if kind in ("rep", "end", "item"):
            call = self._calls.get(fid)
            if call is None:
                raise RemoteProtocolError(f"{kind} frame for id {fid}, which is not open")
            if (kind == "rep") != (call.stream is None):
                raise RemoteProtocolError(f"{kind} frame for id {fid} of the wrong kind")
            if kind == "item":
                if call.stream is not None and not call.abandoned:
                    call.stream._item(_field(frame, "body", dict))
            elif "error" in frame:
                self._finish(call, error=_remote_error(frame["error"]))
            else:
                body = _field(frame, "body", dict) if kind == "rep" else None
                self._finish(call, body=body)
        elif kind == "credit":
            n = _field(frame, "n", int)
            served = self._served.get(fid)
            if served is not None:  # else it has just ended: the credit crossed its end
                if not served.is_stream or not 1 <= n <= MAX_CREDIT - served.credit:
                    raise RemoteProtocolError(f"credit of {n} for id {fid} is not allowed")
                served.credit += n
                served.credit_added.set()
        elif kind == "cancel":
            served = self._served.get(fid)
            if served is not None and not served.cancelled:
                served.cancelled = True
                if served.scope is not None:
                    served.scope.reschedule(asyncio.get_running_loop().time())
        else:
            raise RemoteProtocolError(f"unexpected {kind!r} frame on a peer link")

    def _on_call(self, frame: dict[str, Any], *, is_stream: bool) -> None:
        fid = _field(frame, "id", int)
        body = _field(frame, "body", dict)
        if fid in self._served:
            raise RemoteProtocolError(f"id {fid} is already in use")
        if self._reason is not None:
            return
        served = _Served(fid, is_stream)
        if is_stream:
            credit = _field(frame, "credit", int)
            if not 0 <= credit <= MAX_CREDIT:
                raise RemoteProtocolError(f"credit {credit} is out of range")
            if self._served_streams >= self._settings.max_streams:
                raise RemoteProtocolError(f"more than {self._settings.max_streams} open streams")
            served.credit = credit
            self._served_streams += 1
            self._served[fid] = served
            self._spawn(self._serve_stream(served, body))
        else:
            if self._served_requests >= self._settings.max_in_flight:
                raise RemoteProtocolError(f"more than {self._settings.max_in_flight} requests")
            self._served_requests += 1
            self._served[fid] = served
            self._spawn(self._serve_request(served, body))
        self._last_active = asyncio.get_running_loop().time()

    # -- serving the other side ----------------------------------------------------------------

    def _encode(self, frame: dict[str, Any], where: str) -> bytes:
        try:
            return encode_frame(frame, max_frame_bytes=self._settings.max_frame_bytes)
        except Exception as exc:
            log.error("%s: %s produced a frame that cannot be sent", self, where, exc_info=exc)
            return encode_frame(
                {"type": frame["type"], "id": frame["id"], "error": _internal(where)}
            )

    async def _cancellable(self, served: _Served, work: Awaitable[_T]) -> _T:
        """Await ``work`` in a scope that a ``cancel`` from the remote can end: the caller
        gave up, so ``work`` is cancelled and :class:`_CancelledByCaller` raised instead."""
        scope = asyncio.timeout(None)
        try:
            async with scope:
                served.scope = scope
                if served.cancelled:
                    scope.reschedule(-1)
                return await work
        except TimeoutError as exc:
            if served.cancelled and scope.expired():
                raise _CancelledByCaller from exc
            raise
        finally:
            served.scope = None  # from here on a cancel has nothing left to stop

    def _failure(self, exc: Exception, where: str) -> dict[str, Any]:
        if isinstance(exc, _CancelledByCaller):
            message = f"{where} was cancelled by the caller"
            return {"code": "cancelled", "message": message, "retriable": False, "details": {}}
        return _error_payload(exc, where)

    async def _serve_request(self, served: _Served, body: dict[str, Any]) -> None:
        where = f"request {_op(body)!r} from {self.remote_participant}"
        reply: dict[str, Any] = {"type": "rep", "id": served.id}
        try:
            try:
                result = await self._cancellable(served, self._handler.handle(self, body))
                if not isinstance(result, dict):
                    raise TypeError(f"the handler returned a {type(result).__name__}, not a dict")
                reply["body"] = result
            except Exception as exc:
                reply["error"] = self._failure(exc, where)
            await self._outbox.put(_Out(self._encode(reply, where)))
        except LinkUnavailable:
            pass  # the link is closing; nobody waits for this reply any more
        finally:
            del self._served[served.id]
            self._served_requests -= 1
            self._last_active = asyncio.get_running_loop().time()

    async def _serve_stream(self, served: _Served, body: dict[str, Any]) -> None:
        where = f"stream {_op(body)!r} for {self.remote_participant}"
        end: dict[str, Any] = {"type": "end", "id": served.id}
        try:
            try:
                await self._cancellable(served, self._produce(served, body, where))
            except Exception as exc:
                end["error"] = self._failure(exc, where)
            await self._outbox.put(_Out(self._encode(end, where)))
        except LinkUnavailable:
            pass
        finally:
            del self._served[served.id]
            self._served_streams -= 1
            self._last_active = asyncio.get_running_loop().time()

    async def _produce(self, served: _Served, body: dict[str, Any], where: str) -> None:
        items = self._handler.stream(self, body)
        try:
            while True:
                # Credit first, then the next item: a stalled receiver stalls the producer.
                while served.credit <= 0:
                    served.credit_added.clear()
                    await served.credit_added.wait()
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return
                served.credit -= 1
                frame = {"type": "item", "id": served.id, "body": item}
                try:
                    data = encode_frame(frame, max_frame_bytes=self._settings.max_frame_bytes)
                except Exception as exc:
                    raise TypeError(f"{where} produced an item that cannot be sent") from exc
                await self._outbox.put(_Out(data))
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    # -- writing ------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while (out := await self._outbox.get()) is not None:
                if isinstance(out, _Out):
                    call = out.call
                    if call is not None:
                        if call.abandoned:
                            self._finish(call, error=_NotSent("abandoned"))
                            continue
                        call.sent = True
                    data: bytes | None = out.data
                else:
                    data = out()
                if data is not None:
                    await self._stream.send_encoded(data)
        except OSError as exc:
            self._shut(f"{self} broke: {exc!r}")


class LinkStream:
    """The receiving end of a stream: an async iterator of item bodies.

    Use ``async with link.open_stream(frame) as items: async for item in items: ...`` (or call
    :meth:`aclose`): closing it early cancels the stream on the remote. ``credit`` is how
    many items may be on their way or waiting here at most; credit is given back as items are
    taken, in batches of half of it. Raises :class:`LinkRemoteError` if the producer failed,
    :class:`LinkUnavailable` if the link broke; items that arrived before are still returned.
    """

    def __init__(self, link: Link, frame: Mapping[str, Any], credit: int, timeout_s: float) -> None:
        if not 1 <= credit <= MAX_CREDIT:
            raise ValueError(f"credit must be in 1..{MAX_CREDIT}")
        self._link = link
        self._frame = dict(frame)
        self._window = credit
        self._timeout_s = timeout_s
        self._call: _Call | None = None
        self._items: deque[dict[str, Any]] = deque()
        self._unused = credit  # granted and not yet used by the sender
        self._to_grant = 0  # taken by the consumer, not yet given back
        self._pending_grant = 0  # given back, not yet written in a credit frame
        self._grant_scheduled = False
        self._arrived = asyncio.Event()
        self._ended = False
        self._error: LinkError | None = None
        self._closed = False

    async def __aenter__(self) -> LinkStream:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> LinkStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._call is None and not self._closed:
            await self._open()
        while not self._items and not self._ended and not self._closed:
            self._arrived.clear()
            await self._arrived.wait()
        if self._items:
            item = self._items.popleft()
            self._give_back(1)
            return item
        if self._error is not None and not self._closed:
            raise self._error
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop receiving; the remote producer is cancelled if it still runs."""
        self._closed = True
        self._items.clear()
        if self._call is not None:
            self._link._abandon(self._call)

    async def _open(self) -> None:
        link = self._link
        cid = next(link._ids)
        frame = {"type": "open", "id": cid, "body": self._frame, "credit": self._window}
        data = encode_frame(frame, max_frame_bytes=link._settings.max_frame_bytes)
        try:
            async with asyncio.timeout(self._timeout_s):
                call = await link._new_call(cid, link._stream_slots, self)
                self._call = call
                await link._outbox.put(_Out(data, call))
        except TimeoutError as exc:
            if self._call is not None:
                link._abandon(self._call)
            raise LinkTimeout(
                f"{link}: stream {_op(self._frame)!r} not opened within {self._timeout_s} s"
            ) from exc
        except BaseException:
            if self._call is not None:
                link._abandon(self._call)
            raise

    def _item(self, body: dict[str, Any]) -> None:
        if self._closed:
            return
        if self._unused <= 0:
            raise RemoteProtocolError("an item beyond the credit granted to its stream")
        self._unused -= 1
        self._items.append(body)
        self._arrived.set()

    def _end(self, error: LinkError | None) -> None:
        self._ended = True
        self._error = error
        self._arrived.set()

    def _give_back(self, n: int) -> None:
        # Invariant: queued items + credit unused by the sender + _to_grant == window.
        self._to_grant += n
        if self._to_grant < max(1, self._window // 2) or self._ended or self._call is None:
            return
        self._unused += self._to_grant
        self._pending_grant += self._to_grant
        self._to_grant = 0
        if not self._grant_scheduled:
            self._grant_scheduled = True
            self._link._outbox.put_control(self._credit_frame)

    def _credit_frame(self) -> bytes | None:
        self._grant_scheduled = False
        n, self._pending_grant = self._pending_grant, 0
        if n <= 0 or self._ended or self._closed or self._call is None:
            return None
        return encode_frame({"type": "credit", "id": self._call.id, "n": n})


# -- opening links ----------------------------------------------------------------------------


def _hello(identity: NodeIdentity, settings: LinkSettings) -> dict[str, Any]:
    return {
        "type": "hello",
        "version": LINK_VERSION,
        "node_id": identity.node_id,
        "participant": identity.participant,
        "max_in_flight": settings.max_in_flight,
        "max_streams": settings.max_streams,
    }


def _check_hello(frame: dict[str, Any] | None, remote: PeerIdentity, where: str) -> tuple[int, int]:
    """The remote's limits, if its hello matches what its certificate proves."""
    who = f"peer {where} ({remote.participant}, node {remote.node_id.hex()})"
    if frame is None or frame.get("type") != "hello":
        raise LinkRefused(f"{who} did not start with a hello")
    if frame.get("version") != LINK_VERSION:
        raise LinkRefused(
            f"{who} speaks link protocol version {frame.get('version')!r}, not {LINK_VERSION}"
        )
    claimed = frame.get("node_id")
    if claimed != remote.node_id:
        shown = claimed.hex() if isinstance(claimed, bytes) else repr(claimed)
        raise LinkRefused(f"{who} claims to be node {shown}, which its certificate does not prove")
    if frame.get("participant") != remote.participant:
        raise LinkRefused(f"{who} claims participant {frame.get('participant')!r}")
    in_flight, streams = frame.get("max_in_flight"), frame.get("max_streams")
    for value in (in_flight, streams):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LinkRefused(f"{who} sent a hello without valid limits")
    assert isinstance(in_flight, int) and isinstance(streams, int)
    return min(in_flight, _MAX_LIMIT), min(streams, _MAX_LIMIT)


def _tls_reason(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate was refused ({exc.verify_message})"
    return exc.reason or str(exc)


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
            reader, writer = await asyncio.open_connection(host, port, ssl=tls.client)
    except ssl.SSLCertVerificationError as exc:
        raise LinkRefused(f"peer {where} refused at the TLS handshake: {_tls_reason(exc)}") from exc
    except ssl.SSLError as exc:  # e.g. EOF: the server dropped us (full, closing)
        raise LinkUnavailable(f"peer {where}: TLS handshake failed: {_tls_reason(exc)}") from exc
    except TimeoutError as exc:
        raise LinkTimeout(f"peer {where}: no TLS handshake within the time allowed") from exc
    except OSError as exc:
        raise LinkUnavailable(f"cannot connect to peer {where}: {exc}") from exc
    stream = FrameStream(reader, writer, max_frame_bytes=settings.max_frame_bytes)
    try:
        async with asyncio.timeout(settings.handshake_timeout_s):
            try:
                remote = peer_identity(writer.get_extra_info("ssl_object"), trust)
            except IdentityError as exc:
                raise LinkRefused(f"peer {where} refused: {exc.reason}") from exc
            await stream.send(_hello(identity, settings))
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
            limits = _check_hello(frame, remote, where)
    except BaseException as exc:
        await stream.aclose(_CLOSE_WAIT_S)
        if isinstance(exc, TimeoutError):
            raise LinkTimeout(f"peer {where}: no hello within the time allowed") from exc
        if isinstance(exc, RemoteProtocolError):
            raise LinkRefused(f"peer {where} does not speak the link protocol: {exc}") from exc
        if isinstance(exc, OSError):
            raise LinkUnavailable(f"peer {where} broke the handshake: {exc!r}") from exc
        raise
    return Link(stream, remote, limits, handler, settings, address=where)


def _peername(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)


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
    ) -> None:
        if max_links < 1:
            raise ValueError("max_links must be at least 1")
        self.identity = identity
        self.trust = trust
        self.handler: LinkHandler = handler or _NoHandler()
        self.tls = tls or TlsContexts(identity, trust)
        self.max_links = max_links
        self.idle_timeout_s = idle_timeout_s
        self.settings = LinkSettings(
            max_frame_bytes,
            max_in_flight,
            max_streams,
            outbox_frames,
            handshake_timeout_s,
            close_timeout_s,
        )
        self._group = _Group(f"link pool of {identity.participant}", close_timeout_s)
        self._links: dict[tuple[str, int], Link] = {}
        self._opening: dict[tuple[str, int], _Opening] = {}
        self._changed = asyncio.Event()

    @property
    def links(self) -> dict[tuple[str, int], Link]:
        """The links currently open, by remote address (a copy)."""
        return dict(self._links)

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
    ) -> dict[str, Any]:
        """:meth:`Link.request` over the link to ``address`` (opened if needed). With
        ``node_id``, the remote must be that node (else :class:`LinkRefused`). A request
        that never left this peer because its link had just broken is retried once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (1, 2):
            link = await self.link(address, node_id=node_id, timeout_s=deadline - loop.time())
            try:
                return await link.request(frame, max(0.0, deadline - loop.time()))
            except _NotSent:
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
                await link._stream.aclose(_CLOSE_WAIT_S)  # never ran: nothing else to stop
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


class _Group:
    """A TaskGroup run by a supervisor task, so that objects with ``start``/``close`` (the
    server, the pool) can hold one: children are spawned into it; ``close`` cancels them and
    waits, bounded. Children must not raise (links log their own failures)."""

    def __init__(self, name: str, close_timeout_s: float) -> None:
        self._name = name
        self._close_timeout_s = close_timeout_s
        self._tg: asyncio.TaskGroup | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    async def start(self) -> None:
        if self._supervisor is None:
            self._supervisor = asyncio.create_task(self._supervise(), name=self._name)
            await self._ready.wait()

    async def _supervise(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self._ready.set()
            await self._stop.wait()
            for task in list(self._tasks):
                task.cancel()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` in the group; False (and ``coro`` closed) if the group is closing."""
        if self._tg is None or self.closing:
            coro.close()
            return False
        task = self._tg.create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _guarded(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception:  # a bug in one child must not end its siblings
            log.exception("%s: a task failed", self._name)

    async def close(self) -> None:
        self.closing = True
        self._stop.set()
        if self._supervisor is None:
            return
        try:
            async with asyncio.timeout(self._close_timeout_s + _CLOSE_WAIT_S):
                await asyncio.shield(self._supervisor)
        except TimeoutError:
            log.warning("%s: tasks still running after %.1f s", self._name, self._close_timeout_s)
            self._supervisor.cancel()
            await asyncio.wait([self._supervisor], timeout=self._close_timeout_s)
