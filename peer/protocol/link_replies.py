"""The replies of the peer-link requests that only peers send, as typed values; no I/O.

A peer answers each request of :mod:`peer.protocol.link` with one map. Where that request has
a client API twin, the reply is the twin's (:mod:`peer.protocol.replies`): a forwarded push
is answered with a :class:`~peer.protocol.replies.PushReply`, a ``lookup`` with a
:class:`~peer.protocol.replies.LookupReply`, an installed fragment with a
:class:`~peer.protocol.replies.CreateQueryReply`, a fragment's status change with a
:class:`~peer.protocol.replies.SetQueryStatusReply`. The requests about hosting and mirroring
have their replies here. They share the machinery of :class:`~peer.protocol.replies.TypedReply`:
``to_wire()`` is the map peers have always sent (the federation's router encodes a handler's
reply with it), and ``from_wire`` checks one from another peer, naming the first wrong field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from peer.protocol.replies import (
    INT,
    STR,
    FieldSpec,
    TypedReply,
    extra_field,
    field_specs,
    order_field,
)

__all__ = ["HostStreamReply", "MirrorAppendReply", "MirrorStartReply", "MirrorStopReply"]


@dataclass(frozen=True, slots=True, eq=False)
class HostStreamReply(TypedReply):
    """Peer ``host`` (node id, hex) holds ``stream`` now; ``replicated``: as a replica of a
    replicated stream, its role set by the control plane (absent for a plain stream)."""

    op: ClassVar[str] = "host_stream"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(
        stream=STR, host=STR, replicated=FieldSpec((bool,), required=False)
    )
    stream: str
    host: str
    replicated: bool | None = None
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class MirrorStartReply(TypedReply):
    """The host of ``stream`` mirrors it to node ``to`` (hex) from now on."""

    op: ClassVar[str] = "start_mirror"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(stream=STR, to=STR)
    stream: str
    to: str
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class MirrorStopReply(TypedReply):
    """The host of ``stream`` mirrors it to ``to`` no more; ``acked``: the last offset that
    mirror acknowledged."""

    op: ClassVar[str] = "stop_mirror"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(stream=STR, to=STR, acked=INT)
    stream: str
    to: str
    acked: int
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class MirrorAppendReply(TypedReply):
    """A mirror stored a run of batches of ``stream`` through the origin's seq ``last``;
    ``kept``: how many were new (a replay keeps none)."""

    op: ClassVar[str] = "mirror_append"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(stream=STR, last=INT, kept=INT)
    stream: str
    last: int
    kept: int
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()
