"""The events and messages of a client API connection (frozen dataclasses; no I/O).

:mod:`peer.protocol.api_connection`'s state machines speak in these: ``receive(frame)`` gives
one *event* (what the other side's frame means: :data:`ServerEvent` on the server,
:data:`ClientEvent` on the client), and ``send`` takes a *message* (:data:`ServerMessage` on
the server: :mod:`peer.protocol.api`'s replies and ``end``, plus :class:`Subscribed`,
:class:`Unsubscribed` and :class:`BatchPart`, which the server's rules single out; requests
and ``credit`` on the client, with :class:`RawRequest` for what a typed request cannot say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from peer.errors import FedstreamError, InvalidInput
from peer.protocol.api import BatchFrame, End, ErrorReply, Frame, Ok, Request
from peer.protocol.replies import Reply, SubscribeReply, UnsubscribeReply

__all__ = [
    "BadCredit",
    "BadRequest",
    "BatchPart",
    "BatchReceived",
    "ClientEvent",
    "ConnectionClosed",
    "CreditGranted",
    "Farewell",
    "Ignored",
    "RawRequest",
    "Replied",
    "RequestFailed",
    "RequestReceived",
    "ServerEvent",
    "ServerMessage",
    "Subscribed",
    "SubscriptionEnded",
    "Unsubscribed",
]

# -- both sides -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The other side closed the connection (end of stream)."""


@dataclass(frozen=True, slots=True)
class Ignored:
    """A frame that asks nothing of anyone (e.g. a reply to a request given up on)."""

    reason: str


# -- the server: what a client's frame means ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """Answer it with exactly one reply of this ``id`` (``Subscribed`` for a subscribe)."""

    id: int
    request: Request


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request that does not decode: answer ``ErrorReply.of(id, error)`` (an ``id`` of None
    is owed by nobody: answer it at once, it holds no place among those in flight)."""

    id: int | None
    error: InvalidInput


@dataclass(frozen=True, slots=True)
class CreditGranted:
    """The client gave ``subscription`` more credit (already counted): wake its sender."""

    subscription: int
    batches: int


@dataclass(frozen=True, slots=True)
class BadCredit:
    """A malformed ``credit`` frame: answer ``ErrorReply.of(None, error)``."""

    error: InvalidInput


ServerEvent: TypeAlias = (
    RequestReceived | BadRequest | CreditGranted | BadCredit | ConnectionClosed | Ignored
)


# -- the server: what it sends besides peer.protocol.api's replies and end --------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The ``ok`` reply to subscribe request ``id``: subscription ``subscription`` is live."""

    id: int
    subscription: int
    stream: str

    def to_wire(self) -> Frame:
        return Ok(self.id, SubscribeReply(self.subscription, self.stream).to_wire()).to_wire()


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """The ``ok`` reply to unsubscribe request ``id``, sent once the subscription is gone."""

    id: int
    subscription: int

    def to_wire(self) -> Frame:
        return Ok(self.id, UnsubscribeReply(self.subscription).to_wire()).to_wire()


@dataclass(frozen=True, slots=True)
class BatchPart:
    """One encoded ``batch`` frame of a subscription (from
    :meth:`~peer.protocol.api_connection.ServerConnection.batch`)."""

    subscription: int
    data: bytes


ServerMessage: TypeAlias = Ok | ErrorReply | Subscribed | Unsubscribed | BatchPart | End


# -- the client: what a server's frame means ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replied:
    """The ``ok`` reply to request ``id``: its typed result (:mod:`peer.protocol.replies`),
    or the bare result map for a :class:`RawRequest`."""

    id: int
    result: Reply | dict[str, Any]


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The ``error`` reply to request ``id``, as its :mod:`peer.errors` class."""

    id: int
    error: FedstreamError


@dataclass(frozen=True, slots=True)
class BatchReceived:
    """A ``batch`` frame of an open subscription (one arrival counted against its credit)."""

    batch: BatchFrame


@dataclass(frozen=True, slots=True)
class SubscriptionEnded:
    """The server ended ``subscription``: with ``end`` (``error`` None) or an ``error``."""

    subscription: int
    error: FedstreamError | None


@dataclass(frozen=True, slots=True)
class Farewell:
    """An ``error`` tied to no request or subscription: the server is closing the connection."""

    code: str | None
    message: str


ClientEvent: TypeAlias = (
    Replied
    | RequestFailed
    | BatchReceived
    | SubscriptionEnded
    | Farewell
    | ConnectionClosed
    | Ignored
)


# -- the client: what it sends besides peer.protocol.api's requests and credit ----------------


@dataclass(frozen=True, slots=True)
class RawRequest:
    """A request frame made by hand: what the typed requests cannot say (tests use it)."""

    op: str
    args: dict[str, Any]

    def to_wire(self, rid: int) -> Frame:
        return {"type": self.op, "id": rid, **self.args}
