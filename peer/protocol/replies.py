"""The ``result`` of each client API request's ``ok`` reply, as typed values; no I/O.

Theory of operation
-------------------
docs/protocol.md, section 3, lists what each operation answers. Each kind of result is a frozen
dataclass named after its request (:class:`PushReply` answers
:class:`~peer.protocol.api.Push`): the fields a caller relies on are typed attributes, and the
fields the protocol lets a peer add ("result maps may carry more fields than listed") are kept
in ``extra``, so nothing a newer peer says is lost on the way through.

The peer's services return these; the API server puts ``to_wire()`` in the ``ok`` frame
(:class:`~peer.protocol.api.Ok`), and the client decodes the result with the ``from_wire`` of
the request's reply kind (:func:`decode_result`). ``from_wire`` checks a result from outside
and raises :class:`~overlay.errors.RemoteProtocolError` naming the first wrong field, as a
reply that breaks the protocol always has (a request from outside, the other way, is an
:class:`~peer.errors.InvalidInput` naming the argument).

The wire bytes do not change: ``to_wire`` writes the typed fields in their declared order and
then ``extra``, which is the order the peer has always written them in; a result decoded from
a frame remembers the frame's key order (``order``), so a decoded result encodes back to the
same bytes whatever order the frame had (a relayed reply is byte-identical).

A reply also reads as a read-only map of its wire fields (``reply["count"]``, ``dict(reply)``,
equality with a dict): the dict form the client returned before replies were typed. It is
deprecated and stays for one release; use the attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

from overlay.errors import RemoteProtocolError

__all__ = [
    "INT",
    "LOOKUP_KINDS",
    "OPT_STR",
    "STR",
    "CreateQueryReply",
    "CreateSchemaReply",
    "CreateSqlReply",
    "CreateStreamReply",
    "FieldSpec",
    "HelloReply",
    "LookupReply",
    "PushReply",
    "Reply",
    "SetQueryStatusReply",
    "StatusReply",
    "SubscribeReply",
    "TypedReply",
    "UnsubscribeReply",
    "decode_result",
    "extra_field",
    "field_specs",
    "order_field",
]

LOOKUP_KINDS = ("schema", "stream", "query", "participant")

Frame: TypeAlias = dict[str, Any]
R = TypeVar("R", bound="TypedReply")

_NIL = type(None)
_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    dict: "a map",
    list: "an array",
    int: "an integer",
    bool: "a boolean",
    float: "a number",
    _NIL: "nil",
}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one typed field of a result reads on the wire."""

    kinds: tuple[type, ...]  # msgpack types it may have (``type(None)``: may be nil)
    required: bool = True  # False: absent when None (never nil on the wire)


class TypedReply(Mapping[str, Any]):
    """The machinery every result kind shares: encode, decode with checks, the map view."""

    __slots__ = ()
    op: ClassVar[str]
    specs: ClassVar[dict[str, FieldSpec]]

    extra: Mapping[str, Any]
    order: tuple[str, ...]

    if TYPE_CHECKING:  # (each kind's dataclass makes its own)

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def to_wire(self) -> Frame:
        """The ``result`` map of the ``ok`` frame."""
        out: Frame = {}
        for name, spec in self.specs.items():
            value = getattr(self, name)
            if value is not None or spec.required:
                out[name] = value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        if self.order and list(out) != list(self.order):
            ordered = {key: out[key] for key in self.order if key in out}
            out = ordered | out
        return out

    @classmethod
    def from_wire(cls: type[R], result: object) -> R:
        """The result from a server's ``ok`` frame; RemoteProtocolError naming the first
        field that is missing or of the wrong type."""
        if not isinstance(result, dict):
            raise RemoteProtocolError(f"{cls.op} reply: the result must be a map")
        values: dict[str, Any] = {}
        for name, spec in cls.specs.items():
            values[name] = _checked(cls.op, result, name, spec)
        extra = {key: value for key, value in result.items() if key not in cls.specs}
        reply = cls(**values, extra=extra, order=tuple(result))
        reply.validate()
        return reply

    def validate(self) -> None:
        """Checks beyond the fields' types (a kind overrides it)."""

    def __eq__(self, other: object) -> bool:
        """Equal to a reply of the same kind, or (the deprecated dict form) to a map, with
        the same wire fields; the order of the fields does not matter."""
        if isinstance(other, TypedReply):
            return type(other) is type(self) and other.to_wire() == self.to_wire()
        if isinstance(other, Mapping):
            return self.to_wire() == dict(other)
        return NotImplemented

    # the deprecated dict form: a read-only map of the wire fields
    def __getitem__(self, key: str) -> Any:
        return self.to_wire()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_wire())

    def __len__(self) -> int:
        return len(self.to_wire())


def _checked(op: str, result: Mapping[str, Any], name: str, spec: FieldSpec) -> Any:
    if name not in result:
        if spec.required:
            raise RemoteProtocolError(f"{op} reply: missing field {name!r}")
        return None
    value = result[name]
    kinds = spec.kinds if spec.required else (*spec.kinds, _NIL)
    if not any(_is(value, kind) for kind in kinds):
        wanted = " or ".join(_TYPE_NAMES.get(kind, kind.__name__) for kind in spec.kinds)
        raise RemoteProtocolError(
            f"{op} reply: field {name!r} must be {wanted}, not {type(value).__name__}"
        )
    return value


def _is(value: object, kind: type) -> bool:
    if kind is int:  # a bool is not a count
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:  # a number: msgpack gives an int for 3.0 written by some clients
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind)


def field_specs(**specs: FieldSpec) -> dict[str, FieldSpec]:
    """A kind's typed fields, in their wire order (a kind's ``specs``)."""
    return specs


STR = FieldSpec((str,))
INT = FieldSpec((int,))
OPT_STR = FieldSpec((str,), required=False)


def extra_field() -> Any:
    """A kind's ``extra``: the fields of its result beyond the typed ones."""
    return field(default_factory=dict)


def order_field() -> Any:
    """A kind's ``order``: the key order of the frame it was decoded from (not compared)."""
    return field(default=(), compare=False, repr=False)


@dataclass(frozen=True, slots=True, eq=False)
class HelloReply(TypedReply):
    """What the server is: its name, protocol version and frame limit (and, on a TLS
    connection, the participant the client's certificate proves)."""

    op: ClassVar[str] = "hello"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(
        server=STR,
        version=INT,
        max_frame_bytes=FieldSpec((int,), required=False),
        participant=OPT_STR,
    )
    server: str
    version: int
    max_frame_bytes: int | None = None  # None: the server did not say (the default applies)
    participant: str | None = None
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()

    def validate(self) -> None:
        if self.max_frame_bytes is not None and self.max_frame_bytes < 1:
            raise RemoteProtocolError(
                "hello reply: field 'max_frame_bytes' must be a positive integer, not "
                f"{self.max_frame_bytes}"
            )


@dataclass(frozen=True, slots=True, eq=False)
class CreateSchemaReply(TypedReply):
    """The schema now known under ``schema``, with its field names."""

    op: ClassVar[str] = "create_schema"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(schema=STR, fields=FieldSpec((list,)))
    schema: str
    fields: list[str]
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class CreateStreamReply(TypedReply):
    """The stream and its schema; in a federation, ``host`` (the node holding it, hex) and,
    for a replicated stream, its placement in ``extra`` (``replicas``, ``primary``, ...)."""

    op: ClassVar[str] = "create_stream"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(stream=STR, schema=STR, host=OPT_STR)
    stream: str
    schema: str
    host: str | None = None
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class CreateQueryReply(TypedReply):
    """The query entered (status ``SETUP``); ``extra`` has e.g. its inputs and outputs, or its
    fragments in a federation."""

    op: ClassVar[str] = "create_query"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(query=STR, status=STR)
    query: str
    status: str
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class CreateSqlReply(TypedReply):
    """A SQL script created: the source ``streams`` it declared (created, or found identical),
    its ``queries`` in order (a query of several stages is several), whether they were
    ``started``, and the compiler's ``warnings`` (unbounded state, ignored options)."""

    op: ClassVar[str] = "create_sql"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(
        streams=FieldSpec((list,)),
        queries=FieldSpec((list,)),
        started=FieldSpec((bool,)),
        warnings=FieldSpec((list,)),
    )
    streams: list[str]
    queries: list[str]
    started: bool
    warnings: list[str]
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()

    def validate(self) -> None:
        for name in ("streams", "queries", "warnings"):
            if not all(isinstance(item, str) for item in getattr(self, name)):
                raise RemoteProtocolError(f"create_sql reply: field {name!r} must hold strings")


@dataclass(frozen=True, slots=True, eq=False)
class SetQueryStatusReply(TypedReply):
    """The query's status now."""

    op: ClassVar[str] = "set_query_status"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(query=STR, status=STR)
    query: str
    status: str
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class PushReply(TypedReply):
    """A batch durably stored: ``count`` tuples at log position ``offset`` (None with
    ``duplicate``: a repeated producer/seq, not stored again, or an empty batch)."""

    op: ClassVar[str] = "push"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(
        stream=STR, count=INT, offset=FieldSpec((int, _NIL)), duplicate=FieldSpec((bool,))
    )
    stream: str
    count: int
    offset: int | None
    duplicate: bool
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()

    @property
    def forwarded(self) -> bool:
        """Whether the peer asked carried the batch to the stream's host."""
        return bool(self.extra.get("forwarded", False))

    def validate(self) -> None:
        if self.count < 0:
            raise RemoteProtocolError(f"push reply: field 'count' is negative ({self.count})")


@dataclass(frozen=True, slots=True, eq=False)
class SubscribeReply(TypedReply):
    """Subscription ``subscription`` to ``stream`` is live."""

    op: ClassVar[str] = "subscribe"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(subscription=INT, stream=STR)
    subscription: int
    stream: str
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class UnsubscribeReply(TypedReply):
    """Subscription ``subscription`` is gone (its last batch came before this reply)."""

    op: ClassVar[str] = "unsubscribe"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(subscription=INT)
    subscription: int
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class LookupReply(TypedReply):
    """What the catalog knows about ``name``: a ``kind`` (one of :data:`LOOKUP_KINDS` today;
    a newer peer may know more kinds) and, in
    ``extra``, what docs/protocol.md lists for that kind (``schema``, ``latest_offset``,
    ``responsible``, ``status``, ``fragments``, ``public_key``, ...)."""

    op: ClassVar[str] = "lookup"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(kind=STR, name=STR, host=OPT_STR)
    kind: str
    name: str
    host: str | None = None  # the node holding it (hex), in a federation
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


@dataclass(frozen=True, slots=True, eq=False)
class StatusReply(TypedReply):
    """A peer's status, for people and dashboards: the fields every peer gives are typed;
    ``extra`` has the rest (``overlay``, ``hosted``, ``replication``, ...)."""

    op: ClassVar[str] = "status"
    specs: ClassVar[dict[str, FieldSpec]] = field_specs(
        peer=STR,
        pid=INT,
        uptime_s=FieldSpec((float,)),
        engine=STR,
        data_dir=OPT_STR,
        streams=FieldSpec((list,)),
        queries=FieldSpec((list,)),
    )
    peer: str
    pid: int
    uptime_s: float
    engine: str
    data_dir: str | None  # (None: not said)
    streams: list[dict[str, Any]]
    queries: list[dict[str, Any]]
    extra: Mapping[str, Any] = extra_field()
    order: tuple[str, ...] = order_field()


Reply: TypeAlias = (
    HelloReply
    | CreateSchemaReply
    | CreateStreamReply
    | CreateQueryReply
    | CreateSqlReply
    | SetQueryStatusReply
    | PushReply
    | SubscribeReply
    | UnsubscribeReply
    | LookupReply
    | StatusReply
)

_BY_OP: dict[str, type[Reply]] = {
    cls.op: cls
    for cls in (
        HelloReply,
        CreateSchemaReply,
        CreateStreamReply,
        CreateQueryReply,
        CreateSqlReply,
        SetQueryStatusReply,
        PushReply,
        SubscribeReply,
        UnsubscribeReply,
        LookupReply,
        StatusReply,
    )
}


def decode_result(op: str, result: object) -> Reply:
    """The typed result of an ``ok`` reply to a request of operation ``op``."""
    cls = _BY_OP.get(op)
    if cls is None:
        raise RemoteProtocolError(f"an ok reply to {op!r}, which has no reply kind")
    return cls.from_wire(result)
