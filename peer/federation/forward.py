"""Any-node push and subscribe: a request for a stream hosted elsewhere, carried to its host.

Theory of operation
-------------------
* A push to a peer that does not host its stream is validated there (a bad batch is refused
  before anything travels), then forwarded as Arrow IPC to the host, which acknowledges only
  after its own fsync; only then is the client acknowledged. An Arrow body travels as the
  client sent it (the host decodes and bounds it once more itself: it trusts no peer's
  bytes); only rows or columns are encoded here. Forwarded batches carry an event id
  ``(origin, seq)``: the client's, or one of this peer's *forwarding slots* (one origin per
  slot and process, one batch in flight per slot), so a retry after a lost reply is dropped
  by the host's spool instead of appended twice. Slots are made as concurrent pushes need
  them, up to as many as a link carries requests at once (``MAX_FORWARD_SLOTS``), so the
  slots never keep a link's pipeline shallower than the link itself does.
* A subscription on a peer that does not host the stream is relayed from the host over a
  credit-controlled link stream, so a slow subscriber slows only its own relay. When the
  stream moves to another peer (its producing fragment moved, with the same offsets), the
  relay carries on there after the last offset it delivered. Each relay takes a place in the
  client's :class:`~peer.federation.quota.RelayQuota`, so that no client can take every
  stream of a link.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from overlay.link import LinkError, LinkRemoteError
from overlay.node import OverlayError
from peer.errors import TupleError, Unavailable
from peer.federation.hosting import Hosting
from peer.federation.quota import RelayQuota
from peer.federation.router import Router, remote_error
from peer.model.schema import Schema
from peer.model.tuples import arrow_bytes, batch_from_wire
from peer.protocol.link import Frame, PushBatch, Subscribe
from peer.protocol.replies import PushReply
from peer.server.service import CLIENT
from peer.site import LocalSite
from peer.timing import MONOTONIC, Backoff, Clock

MAX_FORWARD_SLOTS = 32  # a link's default max_in_flight (overlay.link.protocol.LinkSettings)
FORWARD_DEADLINE_S = 30.0
# soon at first (a failover names a new primary within a heartbeat), then less often
HOST_BACKOFF = Backoff(0.05, 0.5)
# An Arrow body this small that declares no more than this once decompressed is checked on the
# event loop (tens of microseconds for a thousand rows: less than the hop to a worker thread).
INLINE_CHECK_BYTES = 128 * 1024


async def checked_body(
    schema: Schema, payload: dict[str, Any], *, stream: str, max_bytes: int
) -> bytes:
    """Validate a pushed batch against ``schema`` and return the Arrow IPC bytes to forward:
    an Arrow body as the client sent it, rows or columns encoded once. TupleError (naming the
    field or limit) for a bad batch."""
    body = payload.get("arrow") if len(payload) == 1 else None
    if isinstance(body, bytearray | memoryview):
        body = bytes(body)
    if isinstance(body, bytes) and len(body) <= INLINE_CHECK_BYTES:
        bound = min(max_bytes, INLINE_CHECK_BYTES)
        try:
            batch_from_wire(schema, payload, stream=stream, max_bytes=bound)
            return body
        except TupleError as exc:
            # Declared larger than the inline bound (compressed): decoded in a worker thread,
            # held to the real limit there. Anything else is the answer.
            if exc.details.get("limit") != "max_push_bytes" or bound == max_bytes:
                raise
    table = await asyncio.to_thread(
        batch_from_wire, schema, payload, stream=stream, max_bytes=max_bytes
    )
    return body if isinstance(body, bytes) else arrow_bytes(table)


class Forwarder:
    def __init__(
        self,
        router: Router,
        hosting: Hosting,
        site: LocalSite,
        incarnation: int,
        quota: RelayQuota | None = None,
        *,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.quota = quota or RelayQuota()
        self.clock = clock  # the forwarding deadlines and the waits between tries
        self.router = router
        self.hosting = hosting
        self.site = site
        self.forwarded = 0
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        self._slot_seq: list[int] = []  # the last seq sent per slot; its length: slots made
        self._origin = f"fwd:{router.node_id.hex()[:16]}:{incarnation}"

    async def push(
        self, stream: str, body: bytes, producer: str | None, seq: int | None
    ) -> PushReply:
        """Send a validated batch (Arrow IPC) to the stream's host; return once the host has
        fsynced."""
        slot: int | None = None
        if producer is None:
            slot = await self._slot()
            self._slot_seq[slot] += 1
            producer, seq = f"{self._origin}:{slot}", self._slot_seq[slot]
        try:
            return await self._forward(PushBatch(stream, body, producer, seq))
        finally:
            if slot is not None:
                self._slots.put_nowait(slot)

    async def _slot(self) -> int:
        """A free forwarding slot: a new one while fewer than MAX_FORWARD_SLOTS exist."""
        if self._slots.empty() and len(self._slot_seq) < MAX_FORWARD_SLOTS:
            self._slot_seq.append(0)
            return len(self._slot_seq) - 1
        return await self._slots.get()

    async def _forward(self, batch: PushBatch) -> PushReply:
        deadline = self.clock() + FORWARD_DEADLINE_S
        fresh = False
        tries = 0
        while True:
            host = await self.hosting.host_of(batch.stream, fresh=fresh)
            if host == self.router.node_id:
                if batch.stream not in self.hosting.hosted and not self.hosting.replicated(
                    batch.stream
                ):
                    # responsible for a source stream whose host is gone: take it over, as a
                    # push another peer forwards here does (peer.federation.requests)
                    await self.hosting.take_over(batch.stream)
                return await self.site.push_here(
                    batch.stream, {"arrow": batch.arrow}, batch.producer, batch.seq
                )
            try:
                reply = await self.router.call(host, batch)
                self.forwarded += 1
                return PushReply.from_wire(reply)  # (the host's site answered it)
            except Unavailable as exc:
                if self.clock() >= deadline:
                    raise Unavailable(
                        f"push to {batch.stream}: its host {host.hex()[:12]} stayed unreachable "
                        f"for {FORWARD_DEADLINE_S:.0f} s ({exc.message})",
                        stream=batch.stream,
                    ) from exc
                fresh = True
                tries += 1
                await self.clock.sleep(HOST_BACKOFF.delay_s(tries))

    async def relay(self, stream: str, start: str) -> AsyncIterator[Frame]:
        """A subscription served by the stream's host, here or over a link."""
        ready = False
        last: int | None = None
        deadline: float | None = None
        while True:
            host = await self.hosting.host_of(stream, fresh=deadline is not None)
            begin = start if last is None else f"after:{last}"
            try:
                async for item in self._relay_once(host, stream, begin):
                    if item.get("ready"):
                        if last is None and isinstance(item.get("after"), int):
                            last = item["after"]  # where the host started us
                        if ready:
                            continue
                        ready = True
                    elif isinstance(item.get("offset"), int):
                        last = item["offset"]
                    deadline = None
                    yield item
                return
            except Unavailable as exc:
                if not (exc.details.get("moved") or stream in self.hosting.moved_streams):
                    raise
                if deadline is None:
                    deadline = self.clock() + FORWARD_DEADLINE_S
                elif self.clock() > deadline:
                    raise
                await self.clock.sleep(0.2)

    async def _relay_once(self, host: bytes, stream: str, start: str) -> AsyncIterator[Frame]:
        if host == self.router.node_id:
            if stream not in self.hosting.hosted:
                raise Unavailable(f"stream {stream} is moving", stream=stream, moved=True)
            async for item in self.site.subscribe_here(stream, start):
                yield item
            return
        try:
            with self.quota.hold(CLIENT.get(), host, stream):  # one link stream per relay
                async for item in self.router.open_stream(host, Subscribe(stream, start)):
                    yield item
        except LinkRemoteError as exc:
            raise remote_error(exc) from None
        except (LinkError, OverlayError, OSError) as exc:
            raise Unavailable(
                f"subscription to {stream}: its host {host.hex()[:12]} is unreachable ({exc})",
                stream=stream,
            ) from exc

    def serve(self, request: Subscribe) -> AsyncIterator[Frame]:
        """A relayed subscription another peer asks of us, for a stream we host."""
        stream = request.stream
        if stream not in self.hosting.hosted:
            raise Unavailable(
                f"this peer does not host stream {stream}",
                stream=stream,
                moved=stream in self.hosting.moved_streams,
            )
        return self.site.subscribe_here(stream, request.start)
