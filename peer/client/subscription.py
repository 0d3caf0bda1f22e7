"""A subscription of the client: an async iterator of batches, with credit-based flow control.

The peer sends at most ``credit`` batch frames that the application has not yet taken (the
connection's state machine, :class:`~peer.protocol.api_connection.ClientConnection`, counts
them and says when to give credit back), so a slow consumer never makes the client's reader
block, and replies to other requests keep flowing. A subscription knows its client only
through the :class:`SubscriptionPort` it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator
from typing import Any, Protocol

from peer.client.payload import Batch
from peer.errors import FedstreamError, NotFound, Unavailable
from peer.protocol.api import Credit, Request, Subscribe, Unsubscribe
from peer.protocol.replies import Reply, SubscribeReply

__all__ = ["Subscription", "SubscriptionPort"]


class SubscriptionPort(Protocol):
    """What a subscription needs of the connection it belongs to."""

    async def request(
        self, request: Request, *, on_ok: Callable[[Reply], None] | None = None
    ) -> Reply:
        """Send ``request`` and return its result; ``on_ok`` runs in the reader before it
        reads the frame after the reply."""
        ...

    async def send(self, message: Credit) -> None: ...

    def taken(self, sid: int) -> Credit | None:
        """The application took a batch of ``sid``: the credit to give back now, if any."""
        ...

    def attach(self, sid: int, subscription: Subscription) -> None:
        """Route the batches and the end of subscription ``sid`` to ``subscription``."""
        ...

    def detach(self, sid: int) -> None: ...


class Subscription:
    """An async iterator of :class:`Batch` (from :meth:`Client.subscribe`).

    ``await client.subscribe(...)`` returns it once the peer has accepted it (so nothing pushed
    after that is missed); ``async for batch in client.subscribe(...)`` subscribes on the
    first iteration. ``aclose()`` (or leaving ``async with``) unsubscribes. Iteration ends
    when the peer ends the subscription; it raises the peer's error if it failed, and
    :class:`~peer.errors.Unavailable` if the connection was lost.
    """

    def __init__(
        self, port: SubscriptionPort, stream: str, start: str, credit: int, tentative: bool = False
    ) -> None:
        self.stream = stream
        self.start = start
        self.tentative = tentative
        self.sid: int | None = None
        self._port = port
        self._credit = credit
        self._opened = False
        self._queue: asyncio.Queue[Batch | FedstreamError | None] = asyncio.Queue()
        self._finished = False  # the peer ended it, or the connection is gone
        self._closed = False  # the application is done with it

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self._open().__await__()

    async def _open(self) -> Subscription:
        if self._opened:
            return self
        self._opened = True
        try:
            request = Subscribe(self.stream, self.start, self._credit, self.tentative)
            await self._port.request(request, on_ok=self._register)
        except BaseException:
            self._closed = True
            raise
        return self

    def _register(self, reply: Reply) -> None:
        # Runs in the client's reader, before it reads the frame after the reply: no batch
        # can arrive before the subscription is known. (The connection's state machine has
        # decoded it as a SubscribeReply, with its integer subscription.)
        assert isinstance(reply, SubscribeReply)
        sid = reply.subscription
        self.sid = sid
        self._port.attach(sid, self)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Batch:
        if not self._opened:
            await self._open()
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, FedstreamError):
            self._closed = True
            raise item
        assert self.sid is not None
        credit = self._port.taken(self.sid)
        if credit is not None and not self._finished:
            await self._grant(credit)
        return item

    async def next_batch(self, timeout_s: float) -> Batch | None:
        """The next batch, or None if none arrives within ``timeout_s`` or the subscription
        has ended."""
        try:
            async with asyncio.timeout(timeout_s):
                return await anext(self)
        except (TimeoutError, StopAsyncIteration):
            return None

    async def aclose(self) -> None:
        """Unsubscribe (no more batches are delivered after this returns)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished and self.sid is not None:
            self._finished = True
            self._port.detach(self.sid)
            # NotFound: it ended on its own; Unavailable: the connection is gone. Either way
            # there is nothing left to undo.
            with contextlib.suppress(NotFound, Unavailable):
                await self._port.request(Unsubscribe(self.sid))

    async def __aenter__(self) -> Subscription:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _grant(self, credit: Credit) -> None:
        # If the connection is gone the reader has seen (or will see) it and ends us.
        with contextlib.suppress(Unavailable):
            await self._port.send(credit)

    def deliver(self, batch: Batch) -> None:
        """A batch frame arrived, within the credit (the client's reader calls this)."""
        self._queue.put_nowait(batch)

    def finish(self, error: FedstreamError | None) -> None:
        """The peer ended the subscription (with ``error`` if it failed), or the connection
        is gone."""
        if not self._finished:
            self._finished = True
            self._queue.put_nowait(error)
