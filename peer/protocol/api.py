"""The client API's messages as typed values, to and from wire frames; no I/O.

Theory of operation
-------------------
docs/protocol.md is the reference. A client sends *requests* (a frame with ``type`` naming the
operation and an integer ``id``) and ``credit`` frames; the server answers each request with
exactly one ``ok`` or ``error`` carrying the same id, and sends a subscription's ``batch``
frames and then its ``end`` (or an ``error`` naming the subscription).

Each request is a frozen dataclass whose ``from_wire`` checks a frame from a client with the
messages clients have always seen; :func:`request_id` and :func:`decode_request` (which picks
the class by ``type``) come first: an id that is not an integer
is an :class:`~peer.errors.InvalidInput` to be answered with id ``None``; an unknown operation
or a missing or mistyped argument is one to be answered with the request's id, naming the
argument. ``to_wire(rid)`` gives the frame a client sends. Replies go the other way: the server
encodes them (``to_wire``), and the client decodes them with the ``from_wire`` of each kind,
which raise :class:`~overlay.errors.RemoteProtocolError` for a frame that breaks the protocol.

:func:`batch_frames` cuts a batch that does not fit in one frame into parts by rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from overlay.errors import RemoteProtocolError
from overlay.wire import HEADER_BYTES, MESSAGE_CHARS, clip, encode_frame
from peer.errors import FedstreamError, InvalidInput, from_wire
from peer.protocol.producer import check_producer

__all__ = [
    "BATCH_ENCODINGS",
    "MAX_CREDIT",
    "PROTOCOL_VERSION",
    "QUERY_STATUSES",
    "READY",
    "START_POSITIONS",
    "BatchFrame",
    "CreateQuery",
    "CreateSchema",
    "CreateSql",
    "CreateStream",
    "Credit",
    "End",
    "ErrorReply",
    "Hello",
    "Lookup",
    "Ok",
    "Push",
    "Request",
    "SetQueryStatus",
    "Status",
    "Subscribe",
    "Unsubscribe",
    "batch_frames",
    "decode_request",
    "error_from_wire",
    "request_id",
]

PROTOCOL_VERSION = 1
QUERY_STATUSES = ("SETUP", "RUNNING", "STOPPED", "DELETED")
START_POSITIONS = ("latest", "earliest")
BATCH_ENCODINGS = ("columns", "rows", "arrow")
MAX_CREDIT = 1 << 20  # a subscription's unused credit stops here (a client may grant past it)
# What a peer's subscription iterator yields first, once its start position is fixed (maybe on
# another peer): the server sends the ``subscribe`` reply only then (peer.server).
READY: dict[str, Any] = {"ready": True}

Frame: TypeAlias = dict[str, Any]
Columns: TypeAlias = dict[str, list[Any]]

_PART_FIELDS_BYTES = 32  # room for "part"/"parts" in a split batch frame
_UNLIMITED = 2**32 - 1


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    op: ClassVar[str] = "hello"
    client: str
    version: int | None = None

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, client=self.client, version=self.version)

    @classmethod
    def from_wire(cls, frame: Frame) -> Hello:
        client = _arg(frame, "client", str)
        version = _arg(frame, "version", int, required=False)
        if version is not None and version != PROTOCOL_VERSION:
            raise InvalidInput(
                f"hello: protocol version {version} is not supported (this peer speaks "
                f"{PROTOCOL_VERSION})",
                argument="version",
            )
        return cls(client, version)


@dataclass(frozen=True, slots=True)
class CreateSchema:
    op: ClassVar[str] = "create_schema"
    schema: str | dict[str, Any]

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, schema=self.schema)

    @classmethod
    def from_wire(cls, frame: Frame) -> CreateSchema:
        return cls(_arg(frame, "schema", str, dict))


@dataclass(frozen=True, slots=True)
class CreateStream:
    op: ClassVar[str] = "create_stream"
    name: str
    schema: str
    replicas: int | None = None  # how many peers hold it (default: the peer's --replicas)

    def to_wire(self, rid: int) -> Frame:
        extra = {} if self.replicas is None else {"replicas": self.replicas}
        return _request(self.op, rid, name=self.name, schema=self.schema, **extra)

    @classmethod
    def from_wire(cls, frame: Frame) -> CreateStream:
        replicas = _arg(frame, "replicas", int, required=False)
        if replicas is not None and not 1 <= replicas <= 16:
            raise InvalidInput(
                "create_stream: replicas must be between 1 and 16", argument="replicas"
            )
        return cls(_arg(frame, "name", str), _arg(frame, "schema", str), replicas)


@dataclass(frozen=True, slots=True)
class CreateQuery:
    op: ClassVar[str] = "create_query"
    query: str | dict[str, Any]

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, query=self.query)

    @classmethod
    def from_wire(cls, frame: Frame) -> CreateQuery:
        return cls(_arg(frame, "query", str, dict))


@dataclass(frozen=True, slots=True)
class CreateSql:
    """A SQL script (docs/sql.md) for the peer to compile and create: its streams, then its
    queries in order, each started before the next when ``start``. ``name`` names an INSERT
    without CREATE QUERY; ``namespace`` prefixes every stream and query the script names."""

    op: ClassVar[str] = "create_sql"
    sql: str
    name: str = "query"
    start: bool = False
    namespace: str = ""

    def to_wire(self, rid: int) -> Frame:
        extra: dict[str, Any] = {}
        if self.start:
            extra["start"] = True
        if self.namespace:
            extra["namespace"] = self.namespace
        return _request(self.op, rid, sql=self.sql, name=self.name, **extra)

    @classmethod
    def from_wire(cls, frame: Frame) -> CreateSql:
        sql = _arg(frame, "sql", str)
        name = _arg(frame, "name", str, required=False) or "query"
        start = bool(_arg(frame, "start", bool, required=False))
        namespace = _arg(frame, "namespace", str, required=False) or ""
        for arg, value in (("name", name), ("namespace", namespace)):
            if len(value) > MAX_NAME_ARG_CHARS:
                raise InvalidInput(
                    f"create_sql: argument {arg!r} is too long ({len(value)} characters; a "
                    f"name has at most {MAX_NAME_ARG_CHARS})",
                    op=cls.op,
                    argument=arg,
                )
        return cls(sql, name, start, namespace)


@dataclass(frozen=True, slots=True)
class SetQueryStatus:
    op: ClassVar[str] = "set_query_status"
    name: str
    status: str  # upper case once decoded; a client may send any case

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, name=self.name, status=self.status)

    @classmethod
    def from_wire(cls, frame: Frame) -> SetQueryStatus:
        name = _arg(frame, "name", str)
        status = _arg(frame, "status", str).upper()
        if status not in QUERY_STATUSES:
            raise InvalidInput(
                f"set_query_status: status must be one of {', '.join(QUERY_STATUSES)}, "
                f"not {frame['status']!r}",
                argument="status",
            )
        return cls(name, status)


@dataclass(frozen=True, slots=True)
class Push:
    """``payload`` is exactly one of ``{"columns": {...}}``, ``{"rows": [...]}``,
    ``{"arrow": bytes}``."""

    op: ClassVar[str] = "push"
    stream: str
    payload: dict[str, Any]
    producer: str | None = None
    seq: int | None = None

    def to_wire(self, rid: int) -> Frame:
        frame = _request(self.op, rid, stream=self.stream)
        frame.update(self.payload)
        if self.producer is not None:
            frame["producer"] = self.producer
        if self.seq is not None:
            frame["seq"] = self.seq
        return frame

    @classmethod
    def from_wire(cls, frame: Frame) -> Push:
        stream = _arg(frame, "stream", str)
        given = [key for key in BATCH_ENCODINGS if frame.get(key) is not None]
        if len(given) != 1:
            raise InvalidInput(
                f"push to {stream!r}: give exactly one of 'columns', 'rows', 'arrow' "
                f"(got {', '.join(given) or 'none'})",
                stream=stream,
            )
        encoding = given[0]
        data = _arg(frame, encoding, {"columns": dict, "rows": list, "arrow": bytes}[encoding])
        if encoding == "columns":
            for name, values in data.items():
                if not isinstance(values, list):
                    raise InvalidInput(
                        f"push to {stream!r}: column {name!r} must be an array",
                        stream=stream,
                        field=name,
                    )
        elif encoding == "rows":
            for i, row in enumerate(data):
                if not isinstance(row, dict):
                    raise InvalidInput(
                        f"push to {stream!r}: row {i} must be a map", stream=stream, row=i
                    )
        producer = check_producer(_arg(frame, "producer", str, required=False))
        seq = _arg(frame, "seq", int, required=False)
        if seq is not None and seq < 0:
            raise InvalidInput("push: 'seq' must not be negative", argument="seq")
        return cls(stream, {encoding: data}, producer, seq)


@dataclass(frozen=True, slots=True)
class Subscribe:
    op: ClassVar[str] = "subscribe"
    stream: str
    start: str = "latest"
    credit: int | None = None  # None: no credit-based flow control
    tentative: bool = False  # also tentative results and undos (issue 16)

    def to_wire(self, rid: int) -> Frame:
        extra = {"tentative": True} if self.tentative else {}
        return _request(
            self.op, rid, stream=self.stream, start=self.start, credit=self.credit, **extra
        )

    @classmethod
    def from_wire(cls, frame: Frame) -> Subscribe:
        stream = _arg(frame, "stream", str)
        start = _arg(frame, "start", str, required=False) or "latest"
        if start not in START_POSITIONS:
            raise InvalidInput(
                f"subscribe: start must be 'latest' or 'earliest', not {start!r}",
                argument="start",
            )
        credit = _arg(frame, "credit", int, required=False)
        if credit is not None and credit < 1:
            raise InvalidInput("subscribe: 'credit' must be at least 1", argument="credit")
        tentative = _arg(frame, "tentative", bool, required=False)
        return cls(stream, start, credit, bool(tentative))


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    op: ClassVar[str] = "unsubscribe"
    subscription: int

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, subscription=self.subscription)

    @classmethod
    def from_wire(cls, frame: Frame) -> Unsubscribe:
        return cls(_arg(frame, "subscription", int))


@dataclass(frozen=True, slots=True)
class Lookup:
    op: ClassVar[str] = "lookup"
    name: str

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid, name=self.name)

    @classmethod
    def from_wire(cls, frame: Frame) -> Lookup:
        return cls(_arg(frame, "name", str))


@dataclass(frozen=True, slots=True)
class Status:
    op: ClassVar[str] = "status"

    def to_wire(self, rid: int) -> Frame:
        return _request(self.op, rid)

    @classmethod
    def from_wire(cls, frame: Frame) -> Status:
        return cls()


Request: TypeAlias = (
    Hello
    | CreateSchema
    | CreateStream
    | CreateQuery
    | CreateSql
    | SetQueryStatus
    | Push
    | Subscribe
    | Unsubscribe
    | Lookup
    | Status
)


@dataclass(frozen=True, slots=True)
class Credit:
    """The client grants ``batches`` more batch frames to a subscription (no reply)."""

    subscription: int
    batches: int

    def to_wire(self) -> Frame:
        return {"type": "credit", "subscription": self.subscription, "batches": self.batches}

    @classmethod
    def from_wire(cls, frame: Frame) -> Credit:
        subscription = _arg(frame, "subscription", int)
        # The error names the subscription in its message and details only: an error frame's
        # own "subscription" field would say that the subscription has ended.
        try:
            batches = _arg(frame, "batches", int)
        except InvalidInput as exc:
            raise InvalidInput(
                f"credit for subscription {subscription}: {exc.message}",
                **exc.details,
                subscription=subscription,
            ) from None
        if batches < 1:
            raise InvalidInput(
                f"credit for subscription {subscription}: 'batches' must be at least 1",
                argument="batches",
                subscription=subscription,
            )
        return cls(subscription, batches)


def _request(op: str, rid: int, **args: Any) -> Frame:
    return {"type": op, "id": rid, **args}


def request_id(frame: Frame) -> int:
    """The id of a request frame; InvalidInput (to be answered with id None) if it has none."""
    rid = frame.get("id")
    if not _is_int(rid):
        op = frame["type"]
        raise InvalidInput(f"{op}: a request needs an integer 'id'", op=op)
    assert isinstance(rid, int)
    return rid


def decode_request(frame: Frame) -> Request:
    """The request a frame from a client carries; InvalidInput naming what is wrong."""
    op = frame["type"]
    decode = _DECODERS.get(op)
    if decode is None:
        raise InvalidInput(f"unknown op {op!r}", op=op)
    return decode(frame)


_DECODERS: dict[str, Callable[[Frame], Request]] = {
    cls.op: cls.from_wire
    for cls in (
        Hello,
        CreateSchema,
        CreateStream,
        CreateQuery,
        CreateSql,
        SetQueryStatus,
        Push,
        Subscribe,
        Unsubscribe,
        Lookup,
        Status,
    )
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TYPE_NAMES = {str: "a string", dict: "a map", list: "an array", bytes: "binary", int: "an integer"}
_TYPE_NAMES[bool] = "a boolean"


_NAME_ARGS = frozenset({"name", "stream"})
MAX_NAME_ARG_CHARS = 1024  # names are at most 256 characters (peer.model.schema)


def _arg(frame: Frame, name: str, *kinds: type, required: bool = True) -> Any:
    """``frame[name]`` checked against ``kinds``; InvalidInput naming the argument if not."""
    op = frame["type"]
    value = frame.get(name)
    if value is None:
        if required:
            raise InvalidInput(f"{op}: missing argument {name!r}", op=op, argument=name)
        return None
    ok = any(_is_int(value) if kind is int else isinstance(value, kind) for kind in kinds)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(kind, kind.__name__) for kind in kinds)
        raise InvalidInput(
            f"{op}: argument {name!r} must be {wanted}, not {type(value).__name__}",
            op=op,
            argument=name,
        )
    if isinstance(value, str) and required and not value:
        raise InvalidInput(f"{op}: argument {name!r} must not be empty", op=op, argument=name)
    if name in _NAME_ARGS and isinstance(value, str) and len(value) > MAX_NAME_ARG_CHARS:
        raise InvalidInput(  # refused before any work on it (hashing, lookups, messages)
            f"{op}: argument {name!r} is too long ({len(value)} characters; a name has at "
            f"most {MAX_NAME_ARG_CHARS})",
            op=op,
            argument=name,
        )
    return value


# -- replies and subscription frames ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    id: int
    result: dict[str, Any]

    def to_wire(self) -> Frame:
        return {"type": "ok", "id": self.id, "result": self.result}

    @classmethod
    def from_wire(cls, frame: Frame) -> Ok:
        rid, result = frame.get("id"), frame.get("result")
        if not isinstance(rid, int) or not isinstance(result, dict):
            raise RemoteProtocolError(f"reply to request {rid} has no result map")
        return cls(rid, result)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An ``error``: the reply to request ``id``, the end of ``subscription``, or (neither)
    the last word before the server closes the connection."""

    id: int | None
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    subscription: int | None = None

    @classmethod
    def of(
        cls, rid: int | None, exc: FedstreamError, *, subscription: int | None = None
    ) -> ErrorReply:
        return cls(rid, exc.code, exc.message, exc.details, subscription)

    @classmethod
    def internal(cls, rid: int | None, *, subscription: int | None = None) -> ErrorReply:
        message = "internal error in the peer (its log has the details)"
        return cls(rid, "internal", message, {}, subscription)

    def to_wire(self) -> Frame:
        frame: Frame = {"type": "error", "id": self.id}
        if self.subscription is not None:
            frame["subscription"] = self.subscription
        # whatever the error echoes (a name, an argument) is cut to size: the reply must fit
        frame.update(
            code=self.code,
            message=clip(self.message, chars=MESSAGE_CHARS),
            details=clip(self.details),
        )
        return frame


def error_from_wire(frame: Mapping[str, Any]) -> FedstreamError:
    """The :mod:`peer.errors` class of an ``error`` frame's code; a code this side has no
    class for (``internal``, ``protocol``) is kept on the base class."""
    err = from_wire(dict(frame))
    code = frame.get("code")
    if isinstance(code, str) and err.code != code:
        err.code = code
    return err


@dataclass(frozen=True, slots=True)
class BatchFrame:
    """One batch of a subscription, or part ``part`` of ``parts`` of one too big for a frame."""

    subscription: int
    stream: str
    offset: int
    columns: Columns
    part: int = 0
    parts: int = 1
    status: str | None = None  # "tentative" on a tentative result (absent: stable)
    undo: int | None = None  # an undo: the first tentative offset it takes back

    def to_wire(self) -> Frame:
        frame: Frame = {
            "type": "batch",
            "subscription": self.subscription,
            "stream": self.stream,
            "offset": self.offset,
        }
        if self.parts != 1:
            frame.update(part=self.part, parts=self.parts)
        if self.status is not None:
            frame["status"] = self.status
        if self.undo is not None:
            frame["undo"] = self.undo
        frame["columns"] = self.columns
        return frame

    @classmethod
    def from_wire(cls, frame: Frame) -> BatchFrame:
        sid, offset, stream, columns = (
            frame.get(k) for k in ("subscription", "offset", "stream", "columns")
        )
        part, parts = frame.get("part", 0), frame.get("parts", 1)
        status, undo = frame.get("status"), frame.get("undo")
        if not (
            isinstance(sid, int)
            and isinstance(offset, int)
            and isinstance(stream, str)
            and isinstance(columns, dict)
            and isinstance(part, int)
            and isinstance(parts, int)
        ):
            raise RemoteProtocolError("batch frame lacks subscription/offset/stream/columns")
        if not (status is None or status in ("stable", "tentative")):
            raise RemoteProtocolError(f"batch frame with unknown status {status!r}")
        if not (undo is None or (isinstance(undo, int) and not isinstance(undo, bool))):
            raise RemoteProtocolError(f"batch frame with an undo that is not an offset: {undo!r}")
        return cls(sid, stream, offset, columns, part, parts, status, undo)


@dataclass(frozen=True, slots=True)
class End:
    """A subscription ended: its stream has no more batches for it."""

    subscription: int
    stream: str

    def to_wire(self) -> Frame:
        return {"type": "end", "subscription": self.subscription, "stream": self.stream}


def protocol_error(message: str) -> bytes:
    """The ``error`` frame for a client that broke the framing rules (sent, then closed)."""
    return encode_frame(ErrorReply(None, "protocol", message).to_wire(), max_frame_bytes=_UNLIMITED)


def batch_frames(
    subscription: int,
    stream: str,
    offset: int,
    columns: Columns,
    *,
    max_frame_bytes: int,
    status: str | None = None,
    undo: int | None = None,
) -> list[bytes]:
    """One batch as encoded frames: several (``part`` i of ``parts``) if it does not fit in
    one. InvalidInput if a single tuple is larger than the frame limit."""
    whole = BatchFrame(subscription, stream, offset, columns, status=status, undo=undo)
    encoded = encode_frame(whole.to_wire(), max_frame_bytes=_UNLIMITED)
    if _fits(encoded, max_frame_bytes):  # the usual case: encoded once
        return [encoded]
    pieces = _fitting(whole, columns, max_frame_bytes)
    return [
        encode_frame(
            BatchFrame(subscription, stream, offset, piece, i, len(pieces), status).to_wire(),
            max_frame_bytes=_UNLIMITED,
        )
        for i, piece in enumerate(pieces)
    ]


def _fits(encoded: bytes, max_frame_bytes: int) -> bool:
    """Whether a frame fits the limit with room left for part numbers."""
    return len(encoded) - HEADER_BYTES + _PART_FIELDS_BYTES <= max_frame_bytes


def _fitting(whole: BatchFrame, columns: Columns, max_frame_bytes: int) -> list[Columns]:
    """``columns`` halved by rows until each half fits in a frame (with room for part
    numbers)."""
    frame = BatchFrame(whole.subscription, whole.stream, whole.offset, columns)
    if _fits(encode_frame(frame.to_wire(), max_frame_bytes=_UNLIMITED), max_frame_bytes):
        return [columns]
    rows = len(next(iter(columns.values()), []))
    if rows <= 1:
        raise InvalidInput(
            f"a tuple of stream {whole.stream!r} at offset {whole.offset} is larger than "
            f"the frame limit of {max_frame_bytes} bytes",
            stream=whole.stream,
            offset=whole.offset,
        )
    half = rows // 2
    head = {name: values[:half] for name, values in columns.items()}
    tail = {name: values[half:] for name, values in columns.items()}
    return _fitting(whole, head, max_frame_bytes) + _fitting(whole, tail, max_frame_bytes)
