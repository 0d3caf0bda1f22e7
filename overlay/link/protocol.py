"""The peer-link protocol without I/O: the hello exchange, limits and errors.

Theory of operation
-------------------
A link opens with the hellos; the frames after them are the events of
:mod:`overlay.link.events`::

    hello   {version, node_id, participant, max_in_flight, max_streams}
    refused {reason, retriable}  the server's answer instead of its hello

A ``hello`` carries the sender's limits; each side keeps the lower of its own and the remote's
(a remote's is capped at ``2**16``). :func:`check_hello` refuses a hello that does not name the
node and participant the sender's TLS certificate proves.

Errors cross the link as :class:`~overlay.link.events.WireError`: :func:`error_payload` makes
one of the exception a handler raised, and the caller's side raises it as
:class:`LinkRemoteError`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from overlay.identity import NodeIdentity
from overlay.link.events import WireError
from overlay.tls import PeerIdentity
from overlay.wire import DEFAULT_BUDGET, DEFAULT_MAX_FRAME_BYTES, MESSAGE_CHARS, DecodeBudget, clip

__all__ = [
    "CLOSE_WAIT_S",
    "LINK_VERSION",
    "MAX_CREDIT",
    "CancelledByCaller",
    "LinkError",
    "LinkRefused",
    "LinkRemoteError",
    "LinkSettings",
    "LinkTimeout",
    "LinkUnavailable",
    "NotSent",
    "cancelled_error",
    "check_hello",
    "error_payload",
    "hello",
    "internal_error",
    "op_of",
    "remote_error",
]

log = logging.getLogger(__name__)

LINK_VERSION = 1
MAX_CREDIT = 1 << 16  # unused credit of one stream, at most (docs/protocol.md 9.4)
_MAX_LIMIT = 1 << 16
CLOSE_WAIT_S = 1.0


# -- errors -----------------------------------------------------------------------------------


class LinkError(Exception):
    """Base of the link errors; ``code`` and ``to_wire`` let a handler pass one on."""

    code = "link"
    retriable = False

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "details": {}}


class LinkRefused(LinkError):
    """The other side is not who it must be, or does not accept us (identity, trust, version)."""

    code = "refused"


class LinkUnavailable(LinkError):
    """The link could not be opened or broke (connect failed, closed, invalid frames)."""

    code = "unavailable"
    retriable = True


class LinkTimeout(LinkUnavailable):
    """No answer in time (the request may or may not have been carried out)."""

    code = "timeout"


class NotSent(LinkUnavailable):
    """The link broke before the request left this peer: safe to retry on a new link."""


class CancelledByCaller(Exception):
    """The remote sent ``cancel`` for what we were serving."""


class LinkRemoteError(LinkError):
    """The remote handler refused or failed the request."""

    def __init__(
        self, code: str, message: str, retriable: bool, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retriable = retriable
        self.details = details or {}

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


# -- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSettings:
    """Limits and timeouts of the links of one server or pool (docs/protocol.md, "Limits").

    ``budget``: what one frame may decode to; ``frame_timeout_s``: a frame begun must be
    complete within it; ``idle_timeout_s``: a link with nothing in flight and no frame for
    that long is closed; ``max_per_address`` and ``evict_idle_s``: the server's connection
    slots per remote host, and how long a connection must have been idle to be evicted for
    a newcomer (:mod:`overlay.admission`).
    """

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 32
    max_streams: int = 64
    outbox_frames: int = 64
    handshake_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    budget: DecodeBudget | None = DEFAULT_BUDGET
    frame_timeout_s: float | None = 60.0
    idle_timeout_s: float | None = 300.0
    max_per_address: int = 64
    evict_idle_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_streams", "outbox_frames"):
            if not 1 <= getattr(self, name) <= _MAX_LIMIT:
                raise ValueError(f"{name} must be in 1..{_MAX_LIMIT}")


# -- the handshake ----------------------------------------------------------------------------


def hello(identity: NodeIdentity, settings: LinkSettings) -> dict[str, Any]:
    return {
        "type": "hello",
        "version": LINK_VERSION,
        "node_id": identity.node_id,
        "participant": identity.participant,
        "max_in_flight": settings.max_in_flight,
        "max_streams": settings.max_streams,
    }


def check_hello(frame: dict[str, Any] | None, remote: PeerIdentity, where: str) -> tuple[int, int]:
    """The remote's limits, if its hello matches what its certificate proves."""
    who = f"peer {where} ({remote.participant}, node {remote.node_id.hex()})"
    if frame is None or frame.get("type") != "hello":
        raise LinkRefused(f"{who} did not start with a hello")
    if frame.get("version") != LINK_VERSION:
        raise LinkRefused(
            f"{who} speaks link protocol version {frame.get('version')!r}, not {LINK_VERSION}"
        )
    claimed = frame.get("node_id")
    if claimed != remote.node_id:
        shown = claimed.hex() if isinstance(claimed, bytes) else repr(claimed)
        raise LinkRefused(f"{who} claims to be node {shown}, which its certificate does not prove")
    if frame.get("participant") != remote.participant:
        raise LinkRefused(f"{who} claims participant {frame.get('participant')!r}")
    in_flight, streams = frame.get("max_in_flight"), frame.get("max_streams")
    for value in (in_flight, streams):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LinkRefused(f"{who} sent a hello without valid limits")
    assert isinstance(in_flight, int) and isinstance(streams, int)
    return min(in_flight, _MAX_LIMIT), min(streams, _MAX_LIMIT)


# -- errors on the wire -----------------------------------------------------------------------


def error_payload(exc: BaseException, where: str) -> WireError:
    """What the remote is told of an exception a handler raised: an exception with a str
    ``code`` and ``to_wire()`` passes on its code, message, details and ``retriable``; any
    other is a bug here, logged, and the remote hears only ``internal``."""
    code = getattr(exc, "code", None)
    to_wire = getattr(exc, "to_wire", None)
    if isinstance(code, str) and callable(to_wire):
        try:
            wire = to_wire()
        except Exception:
            wire = {}
        message = wire.get("message") if isinstance(wire, dict) else None
        details = wire.get("details") if isinstance(wire, dict) else None
        # what an error echoes (a name, an argument) is cut to size: the reply must fit
        return WireError(
            code,
            clip(message if isinstance(message, str) else str(exc), chars=MESSAGE_CHARS),
            bool(getattr(exc, "retriable", False)),
            clip(details) if isinstance(details, dict) else {},
        )
    log.error("%s failed", where, exc_info=exc)
    return internal_error(where)


def internal_error(where: str) -> WireError:
    return WireError(
        "internal", f"internal error in the remote peer ({where}; its log has the details)"
    )


def cancelled_error(where: str) -> WireError:
    return WireError("cancelled", f"{where} was cancelled by the caller")


def remote_error(error: WireError) -> LinkRemoteError:
    return LinkRemoteError(error.code, error.message, error.retriable, error.details)


def op_of(frame: Mapping[str, Any]) -> str:
    """The operation a body names, for messages (``type``, or the older ``op``)."""
    op = frame.get("type", frame.get("op"))
    return op if isinstance(op, str) else "?"
