"""One running peer link: requests and credit-based streams in both directions.

Theory of operation
-------------------
:class:`~overlay.link.server.LinkServer` and :class:`~overlay.link.pool.LinkPool` make a
:class:`Link` once the hellos are exchanged; :meth:`Link.run` then reads, writes and serves
until the link closes. Each frame read is parsed into an event (:mod:`overlay.link.events`)
and checked against what is open here. Flow control and memory bounds:

* *requests*: at most ``max_in_flight`` (the lower of both sides' hello values) requests of
  one side are outstanding; further callers wait for a slot. A slot is freed by the ``rep``,
  so a caller that gives up sends ``cancel`` and the slot stays taken until the rep comes.
  A peer that sends more than it announced breaks the protocol.
* *streams*: at most ``max_streams`` open streams per side, same rule with ``end``. The
  sender pulls the next item from its producer only when it has credit, so a receiver that
  stops consuming stops the producer after ``credit`` items; the receiver's queue never holds
  more than the credit it granted. Credit comes back as the consumer takes items (the credit
  windows of :mod:`overlay.transport`, shared with the client API).
* *sending*: through one bounded outbox and one writer task (:mod:`overlay.link.outbox`).
* *reading* never blocks on anything but the socket (replies, items and credits are handed
  over without waiting), so two peers calling each other cannot deadlock.

A frame that breaks these rules closes that link (logged with the reason); every pending call
on it fails with :class:`LinkUnavailable`. All tasks of a link live in its ``TaskGroup``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from overlay.errors import RemoteProtocolError
from overlay.link.events import (
    Body,
    Cancel,
    Credit,
    End,
    Item,
    LinkEvent,
    Open,
    Reply,
    Request,
    WireError,
    parse_event,
)
from overlay.link.outbox import Call, Out, Outbox
from overlay.link.protocol import (
    CLOSE_WAIT_S,
    MAX_CREDIT,
    CancelledByCaller,
    LinkError,
    LinkSettings,
    LinkTimeout,
    LinkUnavailable,
    NotSent,
    cancelled_error,
    error_payload,
    internal_error,
    op_of,
    remote_error,
)
from overlay.link.traffic import Traffic
from overlay.stream import IdleTimeout
from overlay.tls import PeerIdentity
from overlay.transport import CreditError, CreditWindow, FrameStream, ReceiveWindow
from overlay.wire import encode_frame

__all__ = ["Link", "LinkHandler", "LinkStream", "Traffic"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class LinkHandler(Protocol):
    """Serves what the other side of a link asks (the peer implements it).

    ``handle`` answers a request; ``stream`` produces the items of a stream (an async
    generator, pulled only while the receiver has credit). An exception with a str ``code``
    and ``to_wire()`` becomes an error with that code (and its ``retriable``); any other
    becomes code ``internal``. Both may be cancelled (caller gone, link closed).
    """

    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]: ...

    def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


# -- one link ---------------------------------------------------------------------------------


@dataclass(eq=False)
class _Served:
    """A req or open of the remote that we are running (a stream's with its credit)."""

    id: int
    window: CreditWindow | None = None  # None: a request
    scope: asyncio.Timeout | None = None
    cancelled: bool = False


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
        self._calls: dict[int, Call] = {}
        self._served: dict[int, _Served] = {}
        self._served_requests = 0
        self._served_streams = 0
        self._outbox = Outbox(settings.outbox_frames)
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

    @property
    def traffic(self) -> tuple[int, int]:
        """Bytes (sent, received) over this link's connection so far, handshake included."""
        return self._stream.sent_bytes, self._stream.received_bytes

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
            async with asyncio.timeout(self._settings.close_timeout_s + CLOSE_WAIT_S):
                await self._closed.wait()
        except TimeoutError:
            log.warning("%s did not close in time", self)

    async def abort(self) -> None:
        """Close a link that never ran (nothing else to stop)."""
        self._shut(f"{self} was closed before it ran")
        await self._stream.aclose(CLOSE_WAIT_S)

    def _shut(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        self._outbox.close(reason)
        for call in list(self._calls.values()):
            error = LinkUnavailable(reason) if call.sent else NotSent(reason)
            self._finish(call, error=error)
        self._closing.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._tg is not None
        task = self._tg.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- calling the other side ----------------------------------------------------------------

    async def request(self, frame: Mapping[str, Any], timeout_s: float) -> Body:
        """Send a request and return the reply's body. Waits for a slot when ``max_in_flight``
        requests are outstanding. Raises :class:`LinkRemoteError` (the handler failed it),
        :class:`LinkTimeout`, :class:`LinkUnavailable`."""
        rid = next(self._ids)
        data = encode_frame(
            Request(rid, dict(frame)).to_wire(), max_frame_bytes=self._settings.max_frame_bytes
        )
        loop = asyncio.get_running_loop()
        call: Call | None = None
        try:
            async with asyncio.timeout(timeout_s):
                call = await self._new_call(rid, self._request_slots)
                await self._outbox.put(Out(data, call))
                call.future = loop.create_future()  # before the writer can send it
                return await call.future
        except TimeoutError as exc:
            raise LinkTimeout(f"{self}: no reply to {op_of(frame)!r} within {timeout_s} s") from exc
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
    ) -> Call:
        if self._reason is not None:
            raise NotSent(self._reason)
        await slots.acquire()
        if self._reason is not None:
            slots.release()
            raise NotSent(self._reason)
        call = Call(cid, slots, stream)
        self._calls[cid] = call
        self._last_active = asyncio.get_running_loop().time()
        return call

    def _finish(
        self, call: Call, *, body: Body | None = None, error: LinkError | None = None
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
            call.stream.on_end(error)

    def _abandon(self, call: Call) -> None:
        """The caller is gone (done, timed out, cancelled): make sure the call ends."""
        if call.id not in self._calls or call.abandoned:
            return
        call.abandoned = True
        if not call.queued:
            self._finish(call, error=NotSent("abandoned"))
        elif call.sent:
            data = encode_frame(Cancel(call.id).to_wire())
            self._outbox.put_control(lambda: data)
        # else: still in the outbox; the writer drops it and finishes the call

    # -- reading ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        idle_s = self._settings.idle_timeout_s
        try:
            while True:
                try:
                    frame = await self._stream.recv(idle_timeout_s=idle_s)
                except IdleTimeout:
                    if self.idle_s() == 0:
                        continue  # something is in flight: waiting for it is not idleness
                    self._shut(f"{self} was idle for {idle_s:g} s (idle_timeout_s)")
                    return
                if frame is None:
                    break
                self._dispatch(parse_event(frame))
            self._shut(f"{self} was closed by the remote peer")
        except RemoteProtocolError as exc:
            log.warning("%s sent an invalid frame; closing the link: %s", self, exc)
            self._shut(f"{self} sent an invalid frame: {exc}")
        except OSError as exc:
            self._shut(f"{self} broke: {exc!r}")

    def _dispatch(self, event: LinkEvent) -> None:
        """One event from the remote, checked against what is open here."""
        match event:
            case Request() | Open():
                self._on_call(event)
            case Reply(id=fid) | End(id=fid) | Item(id=fid):
                kind = type(event).__name__.lower()
                call = self._calls.get(fid)
                if call is None:
                    raise RemoteProtocolError(f"{kind} frame for id {fid}, which is not open")
                if isinstance(event, Reply) != (call.stream is None):
                    raise RemoteProtocolError(f"{kind} frame for id {fid} of the wrong kind")
                if isinstance(event, Item):
                    if call.stream is not None and not call.abandoned:
                        call.stream.on_item(event.body)
                elif event.error is not None:
                    self._finish(call, error=remote_error(event.error))
                else:
                    self._finish(call, body=event.body if isinstance(event, Reply) else None)
            case Credit(id=fid, n=n):
                served = self._served.get(fid)
                if served is not None:  # else it has just ended: the credit crossed its end
                    try:
                        if served.window is None:
                            raise CreditError("not a stream")
                        served.window.grant(n)
                    except CreditError as exc:
                        raise RemoteProtocolError(
                            f"credit of {n} for id {fid} is not allowed"
                        ) from exc
            case Cancel(id=fid):
                served = self._served.get(fid)
                if served is not None and not served.cancelled:
                    served.cancelled = True
                    if served.scope is not None:
                        served.scope.reschedule(asyncio.get_running_loop().time())

    def _on_call(self, event: Request | Open) -> None:
        if event.id in self._served:
            raise RemoteProtocolError(f"id {event.id} is already in use")
        if self._reason is not None:
            return
        if isinstance(event, Open):
            try:
                window = CreditWindow(event.credit, max_credit=MAX_CREDIT)
            except CreditError as exc:
                raise RemoteProtocolError(f"credit {event.credit} is out of range") from exc
            if self._served_streams >= self._settings.max_streams:
                raise RemoteProtocolError(f"more than {self._settings.max_streams} open streams")
            served = _Served(event.id, window)
            self._served_streams += 1
            self._served[event.id] = served
            self._spawn(self._serve_stream(served, window, event.body))
        else:
            if self._served_requests >= self._settings.max_in_flight:
                raise RemoteProtocolError(f"more than {self._settings.max_in_flight} requests")
            served = _Served(event.id)
            self._served_requests += 1
            self._served[event.id] = served
            self._spawn(self._serve_request(served, event.body))
        self._last_active = asyncio.get_running_loop().time()

    # -- serving the other side ----------------------------------------------------------------

    def _encode(self, answer: Reply | End, where: str) -> bytes:
        try:
            return encode_frame(answer.to_wire(), max_frame_bytes=self._settings.max_frame_bytes)
        except Exception as exc:
            log.error("%s: %s produced a frame that cannot be sent", self, where, exc_info=exc)
            error = internal_error(where)
            failed = (
                Reply(answer.id, error=error)
                if isinstance(answer, Reply)
                else End(answer.id, error)
            )
            return encode_frame(failed.to_wire())

    async def _cancellable(self, served: _Served, work: Awaitable[_T]) -> _T:
        """Await ``work`` in a scope that a ``cancel`` from the remote can end: the caller
        gave up, so ``work`` is cancelled and :class:`CancelledByCaller` raised instead."""
        scope = asyncio.timeout(None)
        try:
            async with scope:
                served.scope = scope
                if served.cancelled:
                    scope.reschedule(-1)
                return await work
        except TimeoutError as exc:
            if served.cancelled and scope.expired():
                raise CancelledByCaller from exc
            raise
        finally:
            served.scope = None  # from here on a cancel has nothing left to stop

    def _failure(self, exc: Exception, where: str) -> WireError:
        if isinstance(exc, CancelledByCaller):
            return cancelled_error(where)
        return error_payload(exc, where)

    async def _serve_request(self, served: _Served, body: Body) -> None:
        where = f"request {op_of(body)!r} from {self.remote_participant}"
        try:
            try:
                result = await self._cancellable(served, self._handler.handle(self, body))
                if not isinstance(result, dict):
                    raise TypeError(f"the handler returned a {type(result).__name__}, not a dict")
                reply = Reply(served.id, body=result)
            except Exception as exc:
                reply = Reply(served.id, error=self._failure(exc, where))
            await self._outbox.put(Out(self._encode(reply, where)))
        except LinkUnavailable:
            pass  # the link is closing; nobody waits for this reply any more
        finally:
            del self._served[served.id]
            self._served_requests -= 1
            self._last_active = asyncio.get_running_loop().time()

    async def _serve_stream(self, served: _Served, window: CreditWindow, body: Body) -> None:
        where = f"stream {op_of(body)!r} for {self.remote_participant}"
        try:
            try:
                await self._cancellable(served, self._produce(served.id, window, body, where))
                end = End(served.id)
            except Exception as exc:
                end = End(served.id, self._failure(exc, where))
            await self._outbox.put(Out(self._encode(end, where)))
        except LinkUnavailable:
            pass
        finally:
            del self._served[served.id]
            self._served_streams -= 1
            self._last_active = asyncio.get_running_loop().time()

    async def _produce(self, sid: int, window: CreditWindow, body: Body, where: str) -> None:
        items = self._handler.stream(self, body)
        try:
            while True:
                # Credit first, then the next item: a stalled receiver stalls the producer.
                await window.take()
                try:
                    item = await anext(items)
                except StopAsyncIteration:
                    return
                try:
                    data = encode_frame(
                        Item(sid, item).to_wire(), max_frame_bytes=self._settings.max_frame_bytes
                    )
                except Exception as exc:
                    raise TypeError(f"{where} produced an item that cannot be sent") from exc
                await self._outbox.put(Out(data))
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    # -- writing ------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while (out := await self._outbox.get()) is not None:
                if isinstance(out, Out):
                    call = out.call
                    if call is not None:
                        if call.abandoned:
                            self._finish(call, error=NotSent("abandoned"))
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
    taken, once half of it has been. Raises :class:`LinkRemoteError` if the producer failed,
    :class:`LinkUnavailable` if the link broke; items that arrived before are still returned.
    """

    def __init__(self, link: Link, frame: Mapping[str, Any], credit: int, timeout_s: float) -> None:
        self._window = ReceiveWindow(credit, max_credit=MAX_CREDIT)  # ValueError if out of range
        self._link = link
        self._frame = dict(frame)
        self._timeout_s = timeout_s
        self._call: Call | None = None
        self._items: deque[Body] = deque()
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

    async def __anext__(self) -> Body:
        if self._call is None and not self._closed:
            await self._open()
        while not self._items and not self._ended and not self._closed:
            self._arrived.clear()
            await self._arrived.wait()
        if self._items:
            item = self._items.popleft()
            self._give_back()
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
        frame = Open(cid, self._frame, self._window.window).to_wire()
        data = encode_frame(frame, max_frame_bytes=link._settings.max_frame_bytes)
        try:
            async with asyncio.timeout(self._timeout_s):
                call = await link._new_call(cid, link._stream_slots, self)
                self._call = call
                await link._outbox.put(Out(data, call))
        except TimeoutError as exc:
            if self._call is not None:
                link._abandon(self._call)
            raise LinkTimeout(
                f"{link}: stream {op_of(self._frame)!r} not opened within {self._timeout_s} s"
            ) from exc
        except BaseException:
            if self._call is not None:
                link._abandon(self._call)
            raise

    def on_item(self, body: Body) -> None:
        if self._closed:
            return
        try:
            self._window.arrived()
        except CreditError as exc:
            raise RemoteProtocolError("an item beyond the credit granted to its stream") from exc
        self._items.append(body)
        self._arrived.set()

    def on_end(self, error: LinkError | None) -> None:
        self._ended = True
        self._error = error
        self._arrived.set()

    def _give_back(self) -> None:
        n = self._window.taken()
        if n == 0 or self._ended or self._call is None:
            return
        self._pending_grant += n
        if not self._grant_scheduled:
            self._grant_scheduled = True
            self._link._outbox.put_control(self._credit_frame)

    def _credit_frame(self) -> bytes | None:
        self._grant_scheduled = False
        n, self._pending_grant = self._pending_grant, 0
        if n <= 0 or self._ended or self._closed or self._call is None:
            return None
        return encode_frame(Credit(self._call.id, n).to_wire())
