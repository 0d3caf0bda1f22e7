"""What the replication room needs of the rest of the peer, as small Protocols (its ports).

The room's drivers reach other peers and the catalog only through these: the federation's
router and catalog records satisfy them, and the composition root hands them in when it builds
the room, so the room imports nothing of :mod:`peer.federation` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeAlias

from peer.model.schema import Schema
from peer.protocol.link import Frame, Request
from peer.protocol.replies import TypedReply
from peer.replication.link_messages import ReplicaRequest

__all__ = ["Handler", "Links", "Message", "Records"]

Message: TypeAlias = Request | ReplicaRequest  # every typed request a peer link carries
# (message, sender participant) -> reply: typed (sent as its to_wire()), or a map (other rooms')
Handler = Callable[[Any, str], Awaitable[Frame | TypedReply]]


class Links(Protocol):
    """The peer links as the room uses them: who this peer is, handlers for its requests, and
    requests to other peers (``ask`` serves one addressed to this peer here directly)."""

    @property
    def node_id(self) -> bytes: ...

    def register(self, op: str, handler: Handler) -> None: ...

    async def ask(self, node_id: bytes, message: Message) -> Frame: ...

    async def call(self, node_id: bytes, message: Message) -> Frame: ...


class Records(Protocol):
    """The federation's catalog records that replication reads and writes."""

    async def stream_schema(self, stream: str) -> Schema: ...

    async def publish(self, key: str, value: dict[str, Any]) -> None: ...

    async def publish_stream(
        self, stream: str, schema: Schema, derived_from: str | None
    ) -> None: ...
