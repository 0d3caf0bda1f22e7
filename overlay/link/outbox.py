"""What a link has to write: its calls in flight and its one bounded outbox.

Theory of operation
-------------------
Every frame of a link goes through its one bounded outbox and one writer task; producers wait
for room, and the writer waits for the socket (``FrameStream.send``). A remote that does not
read stalls this link only.

A :class:`Call` follows one ``req`` or ``open`` of ours into the outbox (``queued``), onto the
socket (``sent``) and to its ``rep``/``end``. A caller that gives up before its frame was
written costs the remote nothing (the writer drops the frame); after that, it costs a
``cancel``. A stream's call hands what arrives for it to its :class:`ItemSink` (the receiving
:class:`~overlay.link.connection.LinkStream`), which this module knows only by that port.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from overlay.link.events import Body
from overlay.link.protocol import LinkError, NotSent

__all__ = ["Call", "ItemSink", "Out", "Outbox"]


class ItemSink(Protocol):
    """Where the items and the end of one of our streams go."""

    def on_item(self, body: Body) -> None: ...

    def on_end(self, error: LinkError | None) -> None: ...


@dataclass(eq=False)
class Call:
    """A req or open of ours, from the moment it holds a slot until its rep/end (or the end
    of the link). ``queued``: in the outbox; ``sent``: written; ``abandoned``: caller gone."""

    id: int
    slot: asyncio.Semaphore
    stream: ItemSink | None = None  # None: a request
    future: asyncio.Future[Body] | None = None  # a request's, once queued
    queued: bool = False
    sent: bool = False
    abandoned: bool = False


@dataclass(eq=False)
class Out:
    data: bytes
    call: Call | None = None


class Outbox:
    """Frames for the writer: control frames (credit, cancel) first, then data frames in
    order. Holds at most ``capacity`` data frames; ``put`` waits for room (backpressure)."""

    def __init__(self, capacity: int) -> None:
        self._data: deque[Out] = deque()
        self._control: deque[Callable[[], bytes | None]] = deque()
        self._capacity = capacity
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed_reason: str | None = None

    async def put(self, out: Out) -> None:
        while len(self._data) >= self._capacity and self._closed_reason is None:
            self._writable.clear()
            await self._writable.wait()
        if self._closed_reason is not None:
            raise NotSent(self._closed_reason)
        self._data.append(out)
        if out.call is not None:
            out.call.queued = True
        self._readable.set()

    def put_control(self, make: Callable[[], bytes | None]) -> None:
        """Queue a control frame, made only when the writer gets to it (None: nothing)."""
        if self._closed_reason is None:
            self._control.append(make)
            self._readable.set()

    async def get(self) -> Out | Callable[[], bytes | None] | None:
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
