"""Typed messages between peers: what one peer asks of another over a peer link.

Each request is a frozen dataclass with its wire ``op`` name, ``to_wire()`` (the msgpack map
that travels, exactly as peers have always sent it) and ``from_wire(frame)``, which checks
every field of a frame that came from another peer and raises :class:`~peer.errors.InvalidInput`
naming the first field that is wrong. Nothing here does I/O: the federation's router decodes an
incoming frame with :func:`decode` and hands the typed message to one handler; a peer asking
itself (a coordinator that is also a fragment's site) passes the message object directly.

Requests of other rooms ride the same links with their own decoders: moves (``move_*``,
checked by :mod:`peer.move.receiver`) and offers (``offer``, checked by :mod:`peer.brain`)
are carried here as :class:`Raw` frames; replication's messages are typed in its own room
(:mod:`peer.replication.link_messages`), and the federation's router decodes those ops there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from peer.errors import InvalidInput
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.schema import Schema, parse_schema
from peer.model.tentative import STABLE, STATUSES
from peer.protocol.producer import check_producer

Frame: TypeAlias = dict[str, Any]
NODE_ID_BYTES = 20


def _str(frame: Frame, key: str) -> str:
    value = frame.get(key)
    if not isinstance(value, str):
        raise InvalidInput(f"peer request: {key!r} must be a string")
    return value


def _opt_str(frame: Frame, key: str) -> str | None:
    value = frame.get(key)
    return value if isinstance(value, str) else None


def _node(frame: Frame, key: str) -> bytes:
    value = _str(frame, key)
    try:
        node = bytes.fromhex(value)
    except ValueError:
        node = b""
    if len(node) != NODE_ID_BYTES:
        raise InvalidInput(f"peer request: {key!r} must be a node id (40 hex digits)")
    return node


def _offset(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < -1:
        raise InvalidInput(f"{what}: after must be an offset (an integer >= -1)")
    return value


@dataclass(frozen=True)
class PushBatch:
    """A validated batch forwarded to the stream's host (Arrow IPC bytes)."""

    OP: ClassVar[str] = "push"
    stream: str
    arrow: bytes
    producer: str | None
    seq: int | None

    def to_wire(self) -> Frame:
        return {
            "op": self.OP,
            "stream": self.stream,
            "arrow": self.arrow,
            "producer": self.producer,
            "seq": self.seq,
        }

    @classmethod
    def from_wire(cls, frame: Frame) -> PushBatch:
        stream = _str(frame, "stream")
        arrow = frame.get("arrow")
        if not isinstance(arrow, bytes):
            raise InvalidInput("push: arrow must be bytes")
        seq = frame.get("seq")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
            raise InvalidInput("push: seq must be an integer", stream=stream)
        return cls(stream, arrow, check_producer(_opt_str(frame, "producer")), seq)


@dataclass(frozen=True)
class HostStream:
    """Become the host of a new source stream (the creating peer chose us)."""

    OP: ClassVar[str] = "host_stream"
    stream: str
    schema: Schema

    def to_wire(self) -> Frame:
        return {"op": self.OP, "stream": self.stream, "schema": self.schema.to_dict()}

    @classmethod
    def from_wire(cls, frame: Frame) -> HostStream:
        return cls(_str(frame, "stream"), parse_schema(frame.get("schema") or {}))


@dataclass(frozen=True)
class Lookup:
    OP: ClassVar[str] = "lookup"
    name: str

    def to_wire(self) -> Frame:
        return {"op": self.OP, "name": self.name}

    @classmethod
    def from_wire(cls, frame: Frame) -> Lookup:
        return cls(_str(frame, "name"))


@dataclass(frozen=True)
class FragmentInput:
    """An input stream of a fragment: its schema and the node id (hex) of its host."""

    schema: Schema
    host: str


@dataclass(frozen=True)
class InstallFragment:
    """Phase 1 of a distributed query at one fragment's site (see peer.federation.coordinator)."""

    OP: ClassVar[str] = "install_fragment"
    query: str
    fragment: str
    definition: Query
    inputs: dict[str, FragmentInput] = field(default_factory=dict)

    def to_wire(self) -> Frame:
        return {
            "op": self.OP,
            "query": self.query,
            "fragment": self.fragment,
            "definition": query_to_dict(self.definition),
            "inputs": {
                s: {"schema": i.schema.to_dict(), "host": i.host} for s, i in self.inputs.items()
            },
        }

    @classmethod
    def from_wire(cls, frame: Frame) -> InstallFragment:
        inputs = frame.get("inputs")
        if not isinstance(inputs, dict):
            raise InvalidInput("install_fragment: inputs must be a map")
        checked: dict[str, FragmentInput] = {}
        for stream, info in inputs.items():
            if not isinstance(stream, str) or not isinstance(info, dict):
                raise InvalidInput("install_fragment: inputs must map stream names to maps")
            checked[stream] = FragmentInput(
                parse_schema(info.get("schema") or {}), str(info.get("host", ""))
            )
        raw = frame.get("definition")
        if not isinstance(raw, dict):
            raise InvalidInput("install_fragment: definition must be a map (a JSON query)")
        definition = parse_query(raw)
        return cls(
            _opt_str(frame, "query") or definition.name,
            _opt_str(frame, "fragment") or definition.name,
            definition,
            checked,
        )


@dataclass(frozen=True)
class FragmentStatus:
    """A distributed query's status change, for one fragment at its site."""

    OP: ClassVar[str] = "fragment_status"
    fragment: str
    status: str

    def to_wire(self) -> Frame:
        return {"op": self.OP, "fragment": self.fragment, "status": self.status}

    @classmethod
    def from_wire(cls, frame: Frame) -> FragmentStatus:
        return cls(_str(frame, "fragment"), _str(frame, "status"))


@dataclass(frozen=True)
class StartMirror:
    """Mirror ``stream`` (hosted by the receiver) to node ``to``, after offset ``after``."""

    OP: ClassVar[str] = "mirror"
    stream: str
    to: bytes
    after: int | None = None

    def to_wire(self) -> Frame:
        frame: Frame = {"op": self.OP, "stream": self.stream, "to": self.to.hex()}
        if self.after is not None:
            frame["after"] = self.after
        return frame

    @classmethod
    def from_wire(cls, frame: Frame) -> StartMirror:
        return cls(_str(frame, "stream"), _node(frame, "to"), _offset(frame.get("after"), "mirror"))


@dataclass(frozen=True)
class StopMirror:
    """Stop mirroring ``stream`` to node ``to``; the reply says what it acknowledged."""

    OP: ClassVar[str] = "unmirror"
    stream: str
    to: bytes

    def to_wire(self) -> Frame:
        return {"op": self.OP, "stream": self.stream, "to": self.to.hex()}

    @classmethod
    def from_wire(cls, frame: Frame) -> StopMirror:
        return cls(_str(frame, "stream"), _node(frame, "to"))


@dataclass(frozen=True)
class MirrorAppend:
    """Mirrored batches of ``stream``: (offset at the sender = seq, Arrow IPC bytes, status).

    ``status`` is ``stable``, ``tentative`` (a tentative result) or ``undo`` (an entry
    without rows taking back the tentative entries since the previous undo:
    peer.model.tentative); on the wire a stable batch is ``[offset, bytes]`` and the others
    ``[offset, bytes, status]``."""

    OP: ClassVar[str] = "mirror_append"
    stream: str
    origin: str
    batches: tuple[tuple[int, bytes, str], ...]

    def to_wire(self) -> Frame:
        return {
            "op": self.OP,
            "stream": self.stream,
            "origin": self.origin,
            "batches": [
                [offset, body] if status == STABLE else [offset, body, status]
                for offset, body, status in self.batches
            ],
        }

    @classmethod
    def from_wire(cls, frame: Frame) -> MirrorAppend:
        stream, origin = _str(frame, "stream"), _str(frame, "origin")
        raw = frame.get("batches")
        if not isinstance(raw, list) or not raw:
            raise InvalidInput("mirror_append: batches must be a non-empty list")
        out = []
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) not in (2, 3)
                or not isinstance(item[0], int)
                or not isinstance(item[1], bytes)
                or (len(item) == 3 and item[2] not in STATUSES)
            ):
                raise InvalidInput(
                    "mirror_append: each batch is [offset, arrow bytes] or "
                    f"[offset, arrow bytes, status] (status one of {', '.join(STATUSES)})"
                )
            out.append((item[0], item[1], item[2] if len(item) == 3 else STABLE))
        return cls(stream, origin, tuple(out))


@dataclass(frozen=True)
class ObservePeer:
    """What the receiver shows on a dashboard (:mod:`peer.observe`): its status and its
    newest samples; with ``history``, every sample it keeps (minutes of them)."""

    OP: ClassVar[str] = "observe"
    history: bool = False

    def to_wire(self) -> Frame:
        return {"op": self.OP, "history": self.history}

    @classmethod
    def from_wire(cls, frame: Frame) -> ObservePeer:
        history = frame.get("history", False)
        if not isinstance(history, bool):
            raise InvalidInput("observe: history must be true or false")
        return cls(history)


@dataclass(frozen=True)
class Subscribe:
    """A relayed subscription (a link stream, not a request)."""

    OP: ClassVar[str] = "subscribe"
    stream: str
    start: str

    def to_wire(self) -> Frame:
        return {"op": self.OP, "stream": self.stream, "start": self.start}

    @classmethod
    def from_wire(cls, frame: Frame) -> Subscribe:
        if frame.get("op") != cls.OP:
            raise InvalidInput(f"unknown peer stream {frame.get('op')!r}")
        return cls(_str(frame, "stream"), _str(frame, "start"))


@dataclass(frozen=True)
class Raw:
    """A request another room decodes itself (``move_*``, ``offer``)."""

    op: str
    frame: Frame

    def to_wire(self) -> Frame:
        return {**self.frame, "op": self.op}


Request: TypeAlias = (
    PushBatch
    | HostStream
    | Lookup
    | InstallFragment
    | FragmentStatus
    | StartMirror
    | StopMirror
    | MirrorAppend
    | ObservePeer
    | Raw
)

TYPED: dict[str, Any] = {
    cls.OP: cls
    for cls in (
        PushBatch,
        HostStream,
        Lookup,
        InstallFragment,
        FragmentStatus,
        StartMirror,
        StopMirror,
        MirrorAppend,
        ObservePeer,
    )
}
RAW_OPS = ("offer",)
RAW_PREFIXES = ("move_",)


def decode(frame: Frame) -> Request:
    """The typed request a peer's frame carries; InvalidInput for anything else."""
    op = frame.get("op")
    if isinstance(op, str):
        cls = TYPED.get(op)
        if cls is not None:
            request: Request = cls.from_wire(frame)
            return request
        if op in RAW_OPS or op.startswith(RAW_PREFIXES):
            return Raw(op, frame)
    raise InvalidInput(f"unknown peer request {op!r}")
