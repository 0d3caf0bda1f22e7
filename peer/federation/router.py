"""One table from a peer-link message to the code that serves it, and the calls that send one.

Incoming frames are decoded once into typed messages (:func:`peer.protocol.link.decode`, and
:func:`peer.replication.link_messages.decode_replica` for replication's own ops) and
dispatched by their type; each room of the peer registers its handlers when the node wires the
peer together (the federation its own, moves ``move_*``, the brain ``offer``), so this module
imports none of them. A peer asking itself (a coordinator that is also a fragment's site)
dispatches the typed message directly, without encoding it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from overlay.link import Link, LinkError, LinkRemoteError
from overlay.node import OverlayError
from peer.errors import FedstreamError, InvalidInput, Unavailable, from_wire
from peer.protocol.link import Frame, Raw, Subscribe, decode
from peer.protocol.replies import TypedReply
from peer.replication.link_messages import (
    ControlHeartbeat,
    ControlJoin,
    RaftFrame,
    ReplicaExchange,
    decode_replica,
)
from peer.replication.ports import Handler, Message

log = logging.getLogger(__name__)

StreamHandler = Callable[[Subscribe], AsyncIterator[Frame]]


class LinkSender(Protocol):
    """What the router needs of the overlay to reach other peers."""

    @property
    def node_id(self) -> bytes: ...

    async def request(
        self, node_id: bytes, frame: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]: ...

    def open_stream(
        self, node_id: bytes, frame: dict[str, Any], *, credit: int = 16
    ) -> AsyncIterator[dict[str, Any]]: ...


class Router:
    """Serves peer-link requests by message type, and sends requests to other peers."""

    def __init__(self, overlay: LinkSender, participant: str) -> None:
        self.overlay = overlay
        self.participant = participant  # the sender of a request to ourselves
        self._handlers: dict[str, Handler] = {}
        self._stream: StreamHandler | None = None
        # Fault injection (the partition tests): peers this one neither reaches nor hears.
        self.cut_off: set[bytes] = set()

    @property
    def node_id(self) -> bytes:
        return self.overlay.node_id

    def register(self, op: str, handler: Handler) -> None:
        if op in self._handlers:
            raise ValueError(f"peer request {op!r} has a handler already")
        self._handlers[op] = handler

    def register_stream(self, handler: StreamHandler) -> None:
        self._stream = handler

    # incoming
    async def dispatch(self, message: Message, sender: str) -> Frame:
        op = message.op if isinstance(message, Raw) else message.OP
        handler = self._handlers.get(op)
        if handler is None:
            raise InvalidInput(f"this peer serves no {op!r} requests")
        reply = await handler(message, sender)
        return reply.to_wire() if isinstance(reply, TypedReply) else reply

    async def handle_link(self, link: Link, frame: Frame) -> Frame:
        """A request from another peer (overlay.node.PeerHandler). A message that names its
        sending node must name the node at the other end of the link (its certificate's)."""
        if link.remote_node_id in self.cut_off:
            raise Unavailable("partitioned from this peer (fault injection)")
        message = decode_message(frame)
        claimed = claimed_node(message)
        if claimed is not None and claimed != link.remote_node_id.hex():
            raise InvalidInput(f"{frame.get('op')}: the sender named is not this link's peer")
        return await self.dispatch(message, str(link.remote_participant))

    def stream_link(self, link: Link, frame: Frame) -> AsyncIterator[Frame]:
        request = Subscribe.from_wire(frame)
        if self._stream is None:
            raise InvalidInput("this peer serves no subscriptions")
        return self._stream(request)

    # outgoing
    async def ask(self, node_id: bytes, message: Message) -> Frame:
        """``message`` served by peer ``node_id``: here directly, or over a link."""
        if node_id == self.node_id:
            return await self.dispatch(message, self.participant)
        return await self.call(node_id, message)

    async def call(self, node_id: bytes, message: Message) -> Frame:
        """``message`` sent over a link to another peer; its errors come back as ours."""
        if node_id in self.cut_off:
            raise Unavailable(f"peer {node_id.hex()[:12]} unreachable (partitioned)")
        try:
            return await self.overlay.request(node_id, message.to_wire())
        except LinkRemoteError as exc:
            raise remote_error(exc) from None
        except (LinkError, OverlayError, OSError, TimeoutError) as exc:
            raise Unavailable(f"peer {node_id.hex()[:12]} unreachable: {exc}") from exc

    def open_stream(self, node_id: bytes, request: Subscribe) -> AsyncIterator[Frame]:
        if node_id in self.cut_off:
            raise Unavailable(f"peer {node_id.hex()[:12]} unreachable (partitioned)")
        return self.overlay.open_stream(node_id, request.to_wire())


def decode_message(frame: Frame) -> Message:
    """The typed request a peer's frame carries; InvalidInput for anything else."""
    message = decode_replica(frame)
    return decode(frame) if message is None else message


def claimed_node(message: Message) -> str | None:
    """The node id (hex) a message says it comes from, if it says so."""
    if isinstance(message, ReplicaExchange | RaftFrame):
        return message.sender
    if isinstance(message, ControlHeartbeat | ControlJoin):
        return message.node
    return None


def remote_error(exc: LinkRemoteError) -> FedstreamError:
    """The error another peer answered, rebuilt as the error class it named."""
    return from_wire({"code": exc.code, "message": exc.message, "details": exc.details})
