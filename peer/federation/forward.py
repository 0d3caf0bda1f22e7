"""Any-node push and subscribe: a request for a stream hosted elsewhere, carried to its host.

Theory of operation
-------------------
* A push to a peer that does not host its stream is validated there (a bad batch is refused
  before anything travels), then forwarded as Arrow IPC to the host, which acknowledges only
  after its own fsync; only then is the client acknowledged. Forwarded batches carry an event
  id ``(origin, seq)``: the client's, or one of this peer's *forwarding slots* (one origin per
  slot and process, one batch in flight per slot), so a retry after a lost reply is dropped
  by the host's spool instead of appended twice.
* A subscription on a peer that does not host the stream is relayed from the host over a
  credit-controlled link stream, so a slow subscriber slows only its own relay. When the
  stream moves to another peer (its producing fragment moved, with the same offsets), the
  relay carries on there after the last offset it delivered. Each relay takes a place in the
  client's :class:`~peer.federation.quota.RelayQuota`, so that no client can take every
  stream of a link.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa

from overlay.link import LinkError, LinkRemoteError
from overlay.node import OverlayError
from peer.errors import Unavailable
from peer.federation.hosting import Hosting
from peer.federation.quota import RelayQuota
from peer.federation.router import Router, remote_error
from peer.model.tuples import arrow_bytes
from peer.protocol.link import Frame, PushBatch, Subscribe
from peer.server.service import CLIENT
from peer.site import LocalSite

FORWARD_SLOTS = 8
FORWARD_DEADLINE_S = 30.0


class Forwarder:
    def __init__(
        self,
        router: Router,
        hosting: Hosting,
        site: LocalSite,
        incarnation: int,
        quota: RelayQuota | None = None,
    ) -> None:
        self.quota = quota or RelayQuota()
        self.router = router
        self.hosting = hosting
        self.site = site
        self.forwarded = 0
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        self._slot_seq = [0] * FORWARD_SLOTS
        for slot in range(FORWARD_SLOTS):
            self._slots.put_nowait(slot)
        self._origin = f"fwd:{router.node_id.hex()[:16]}:{incarnation}"

    async def push(
        self, stream: str, table: pa.Table, producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        """Send a validated batch to the stream's host; return once the host has fsynced."""
        body = arrow_bytes(table)
        slot: int | None = None
        if producer is None:
            slot = await self._slots.get()
            self._slot_seq[slot] += 1
            producer, seq = f"{self._origin}:{slot}", self._slot_seq[slot]
        try:
            return await self._forward(PushBatch(stream, body, producer, seq))
        finally:
            if slot is not None:
                self._slots.put_nowait(slot)

    async def _forward(self, batch: PushBatch) -> dict[str, Any]:
        deadline = time.monotonic() + FORWARD_DEADLINE_S
        fresh = False
        tries = 0
        while True:
            host = await self.hosting.host_of(batch.stream, fresh=fresh)
            if host == self.router.node_id:
                return await self.site.push_here(
                    batch.stream, {"arrow": batch.arrow}, batch.producer, batch.seq
                )
            try:
                reply = await self.router.call(host, batch)
                self.forwarded += 1
                return reply
            except Unavailable as exc:
                if time.monotonic() >= deadline:
                    raise Unavailable(
                        f"push to {batch.stream}: its host {host.hex()[:12]} stayed unreachable "
                        f"for {FORWARD_DEADLINE_S:.0f} s ({exc.message})",
                        stream=batch.stream,
                    ) from exc
                fresh = True
                # soon at first (a failover names a new primary within a heartbeat), then
                # less often: 0.05 s doubling to 0.5 s
                await asyncio.sleep(min(0.5, 0.05 * 2**tries))
                tries += 1

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
                    deadline = time.monotonic() + FORWARD_DEADLINE_S
                elif time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

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
