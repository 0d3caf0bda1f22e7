"""The frames of a running peer link as typed events, to and from wire maps; no I/O.

Theory of operation
-------------------
After the hellos (:mod:`overlay.link.protocol`), each frame is one of these events. ``id`` is
chosen by the side sending ``req``/``open``; the other frames name an id the other side
chose::

    Request  req    {id, body}             answered by exactly one rep
    Reply    rep    {id, body} | {id, error}
    Open     open   {id, body, credit}     answered by items, then exactly one end
    Item     item   {id, body}             one item; the sender spends one unit of credit
    Credit   credit {id, n}                the receiver grants n more items
    End      end    {id} | {id, error}
    Cancel   cancel {id}                   the caller gave up; its rep/end still comes

:func:`parse_event` checks the shape of a frame that came from the remote (field types, the
``error`` map) and raises :class:`~overlay.errors.RemoteProtocolError` naming what is wrong;
whether the id is open, of the right kind, and within the limits is the connection's business
(:mod:`overlay.link.connection`). ``to_wire`` gives the map that travels, exactly as peers
have always sent it. An ``error`` is ``{code, message, retriable, details}``
(:class:`WireError`); a receiver takes a non-str code or message as ``"error"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from overlay.errors import RemoteProtocolError

__all__ = [
    "Body",
    "Cancel",
    "Credit",
    "End",
    "Item",
    "LinkEvent",
    "Open",
    "Reply",
    "Request",
    "WireError",
    "parse_event",
]

Body: TypeAlias = dict[str, Any]
"""A request's, reply's or item's payload: a map the link carries without looking inside."""


@dataclass(frozen=True, slots=True)
class WireError:
    code: str
    message: str
    retriable: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "retriable": self.retriable,
            "details": self.details,
        }

    @classmethod
    def from_wire(cls, error: object) -> WireError:
        if not isinstance(error, dict):
            raise RemoteProtocolError("an error must be a map")
        code, message, details = error.get("code"), error.get("message"), error.get("details")
        return cls(
            code if isinstance(code, str) else "error",
            message if isinstance(message, str) else "error",
            error.get("retriable") is True,
            details if isinstance(details, dict) else {},
        )


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    body: Body

    def to_wire(self) -> dict[str, Any]:
        return {"type": "req", "id": self.id, "body": self.body}


@dataclass(frozen=True, slots=True)
class Reply:
    """A request's answer: its ``body``, or the ``error`` its handler failed with."""

    id: int
    body: Body | None = None
    error: WireError | None = None

    def to_wire(self) -> dict[str, Any]:
        if self.error is not None:
            return {"type": "rep", "id": self.id, "error": self.error.to_wire()}
        return {"type": "rep", "id": self.id, "body": self.body or {}}


@dataclass(frozen=True, slots=True)
class Open:
    id: int
    body: Body
    credit: int

    def to_wire(self) -> dict[str, Any]:
        return {"type": "open", "id": self.id, "body": self.body, "credit": self.credit}


@dataclass(frozen=True, slots=True)
class Item:
    id: int
    body: Body

    def to_wire(self) -> dict[str, Any]:
        return {"type": "item", "id": self.id, "body": self.body}


@dataclass(frozen=True, slots=True)
class Credit:
    id: int
    n: int

    def to_wire(self) -> dict[str, Any]:
        return {"type": "credit", "id": self.id, "n": self.n}


@dataclass(frozen=True, slots=True)
class End:
    """A stream's end: complete, or with the ``error`` its producer failed with."""

    id: int
    error: WireError | None = None

    def to_wire(self) -> dict[str, Any]:
        if self.error is not None:
            return {"type": "end", "id": self.id, "error": self.error.to_wire()}
        return {"type": "end", "id": self.id}


@dataclass(frozen=True, slots=True)
class Cancel:
    id: int

    def to_wire(self) -> dict[str, Any]:
        return {"type": "cancel", "id": self.id}


LinkEvent: TypeAlias = Request | Reply | Open | Item | Credit | End | Cancel


def parse_event(frame: dict[str, Any]) -> LinkEvent:
    """The event a frame from the remote carries (RemoteProtocolError if it is malformed)."""
    kind = frame["type"]
    if kind not in _KINDS:
        raise RemoteProtocolError(f"unexpected {kind!r} frame on a peer link")
    fid = _field(frame, "id", int)
    if kind == "req":
        return Request(fid, _field(frame, "body", dict))
    if kind == "open":
        return Open(fid, _field(frame, "body", dict), _field(frame, "credit", int))
    if kind == "item":
        return Item(fid, _field(frame, "body", dict))
    if kind == "credit":
        return Credit(fid, _field(frame, "n", int))
    if kind == "cancel":
        return Cancel(fid)
    error = WireError.from_wire(frame["error"]) if "error" in frame else None
    if kind == "end":
        return End(fid, error)
    return Reply(fid, None if error is not None else _field(frame, "body", dict), error)


_KINDS = frozenset({"req", "rep", "open", "item", "credit", "end", "cancel"})


def _field(frame: dict[str, Any], name: str, kind: type) -> Any:
    value = frame.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RemoteProtocolError(f"{frame['type']} frame needs a {kind.__name__} {name!r}")
    return value
