"""The client API's view of a peer: whichever of its parts serves requests as it starts.

A peer starting has nothing to serve (requests are refused, retriably); once its site is open
the site serves them, and once the overlay has joined, the federation does. The observer, if
any, is told of every push and refusal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from peer.errors import FedstreamError, Unavailable
from peer.protocol import replies
from peer.server import AnnouncedBatches, PeerService
from peer.timing import MONOTONIC, Clock

if TYPE_CHECKING:
    from peer.observe import Observer

R = TypeVar("R")


class ClientService:
    """The client API's view of the peer: the site of a lone peer, the federation once the
    overlay has joined. Subscriptions announce their start position (peer.server)."""

    def __init__(self, clock: Clock = MONOTONIC, observer: Observer | None = None) -> None:
        self.clock = clock  # times a push for the metrics
        self.target: PeerService | None = None
        self.observer = observer  # told of pushes and refusals

    def serve(self, target: PeerService) -> None:
        """From now on, requests go to ``target`` (the site once it is open, then the
        federation once the overlay has joined); before the first, they are refused."""
        self.target = target

    async def _counted(self, call: Awaitable[R]) -> R:
        """``call``'s reply; a refusal is counted by its code (the metrics) and raised."""
        try:
            return await call
        except FedstreamError as exc:
            if self.observer is not None:
                self.observer.refused(exc.code)
            raise

    def _to(self) -> PeerService:
        if self.target is None:
            raise Unavailable("the peer is starting; retry")
        return self.target

    async def create_schema(self, schema: str | dict[str, Any]) -> replies.CreateSchemaReply:
        return await self._counted(self._to().create_schema(schema))

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> replies.CreateStreamReply:
        return await self._counted(self._to().create_stream(name, schema, replicas))

    async def create_query(self, query: str | dict[str, Any]) -> replies.CreateQueryReply:
        return await self._counted(self._to().create_query(query))

    async def set_query_status(self, name: str, status: str) -> replies.SetQueryStatusReply:
        return await self._counted(self._to().set_query_status(name, status))

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> replies.PushReply:
        started = self.clock()
        reply = await self._counted(self._to().push(stream, payload, producer, seq))
        if self.observer is not None:
            self.observer.pushed(stream, reply.count, self.clock() - started)
        return reply

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        return AnnouncedBatches(self._to().subscribe(stream, start))

    async def lookup(self, name: str) -> replies.LookupReply:
        return await self._counted(self._to().lookup(name))

    async def status(self) -> replies.StatusReply:
        return await self._to().status()
