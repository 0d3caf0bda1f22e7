"""What the API server needs from a peer: the :class:`PeerService` port.

The server calls the peer only through this Protocol (the real ``Peer`` implements it), so the
server knows nothing of storage, engine or federation, and its tests run on a fake.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from peer.protocol.api import READY
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateStreamReply,
    LookupReply,
    PushReply,
    SetQueryStatusReply,
    StatusReply,
)

__all__ = ["CLIENT", "READY", "AnnouncedBatches", "ClientRef", "PeerService"]


@dataclass(frozen=True, slots=True)
class ClientRef:
    """Who a request comes from, for per-client quotas: its connection (``host:port``) and
    its address (the participant its TLS certificate proves, else the remote host)."""

    connection: str
    address: str


CLIENT: ContextVar[ClientRef | None] = ContextVar("fedstream_api_client", default=None)
"""The client whose connection is being served: set by the API server for everything one
connection runs (its requests and subscriptions), read where a quota applies."""


class AnnouncedBatches:
    """Wraps an async iterator of batches that first yields :data:`READY` once its start
    position is fixed (maybe on another peer): the server replies to ``subscribe`` only then,
    so a client may push right after the reply and see what it pushed."""

    announces_ready = True

    def __init__(self, batches: AsyncIterator[dict[str, Any]]) -> None:
        self._batches = batches

    def __aiter__(self) -> AnnouncedBatches:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._batches.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._batches, "aclose", None)
        if aclose is not None:
            await aclose()


class PeerService(Protocol):
    """What the API server needs from a peer (the real ``Peer`` implements it).

    Methods return the typed results of :mod:`peer.protocol.replies` (the server sends their
    ``to_wire()``), and raise :class:`~peer.errors.FedstreamError` subclasses for anything
    the caller got wrong; the server passes those to the client with their code. They may be
    cancelled (the client went away) and must leave no half-done change behind when they are.
    """

    async def create_schema(self, schema: str | dict[str, Any]) -> CreateSchemaReply: ...

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> CreateStreamReply: ...

    async def create_query(self, query: str | dict[str, Any]) -> CreateQueryReply: ...

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply: ...

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> PushReply:
        """``payload`` is exactly one of ``{"columns": {...}}``, ``{"rows": [...]}``,
        ``{"arrow": bytes}``."""
        ...

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        """Batches ``{"offset": int, "columns": {name: [values]}}`` of ``stream`` from ``start``
        (``"latest"`` or ``"earliest"``); ``offset`` is the batch's position in the stream's
        log (increasing).

        The server replies ``ok`` once the iterator has run to its first real wait, and a
        client may push right after that reply. So check the arguments (raise NotFound etc.)
        and fix the start position either when called or in an async generator's body before
        its first ``await`` that actually suspends; an error raised there becomes the reply.
        A slow client simply stops pulling: keep the position, buffer nothing unbounded.
        """
        ...

    async def lookup(self, name: str) -> LookupReply: ...

    async def status(self) -> StatusReply: ...
