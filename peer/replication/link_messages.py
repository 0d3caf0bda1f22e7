"""Typed peer-link messages of replication and of the control plane (docs/replication.md).

Replication rides one request, :class:`ReplicaExchange`: the primary of a stream sends a
follower, in order, the messages the replication core gave it for that follower (appends,
probes, answers to its questions); the follower hands each to its core and answers with the
list of messages its core sends back (its log end, or a question about an epoch's end). One
exchange in flight per follower and stream keeps the order, and batches whatever queued up
meanwhile.

The control plane's requests go to voters: :class:`ControlHeartbeat` (every peer, a few times
a second: "I live, and these are my log ends"; the answer carries the state of the streams the
peer replicates), :class:`ControlSubmit` (a command for the Raft log; its wire form is checked
by :mod:`peer.replication.raft`, which owns the commands' encoding), :class:`ControlJoin` (a new
voter asks to be admitted), :class:`ControlRead` (one
stream's state) and :class:`RaftFrame` (one message of the Raft library between voters).

Every ``from_wire`` checks each field of a frame from another peer and raises
:class:`~peer.errors.InvalidInput` naming what is wrong; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from peer.errors import InvalidInput
from peer.replication.control import StreamState
from peer.replication.core import (
    AppendReply,
    EpochEnd,
    EpochEndReply,
    EpochStart,
    Probe,
    Refusal,
    ReplicaAppend,
    Seed,
)

Frame: TypeAlias = dict[str, Any]
ReplicationMessage: TypeAlias = (
    ReplicaAppend | Probe | Seed | AppendReply | EpochEnd | EpochEndReply
)
MAX_MESSAGES = 4096  # per exchange
MAX_SEED_ORIGINS = 100_000  # producers (and epochs) a seed may name
MAX_STREAMS = 100_000  # log ends per heartbeat


def _field(frame: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = frame.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInput(f"{what}: {key!r} is missing or of the wrong type")
    return value


def _opt(frame: Mapping[str, Any], key: str, kind: type, what: str) -> Any:
    value = frame.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise InvalidInput(f"{what}: {key!r} must be a {kind.__name__} or nil")
    return value


def _node_hex(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) != 40:
        raise InvalidInput(f"{what}: a node id must be 40 hex digits")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise InvalidInput(f"{what}: a node id must be 40 hex digits") from None
    return value


# --------------------------------------------------------------------------- replication


def message_to_wire(message: ReplicationMessage) -> Frame:
    """One replication message as a msgpack map."""
    if isinstance(message, ReplicaAppend):
        return {
            "t": "append",
            "epoch": message.epoch,
            "offset": message.offset,
            "entry_epoch": message.entry_epoch,
            "body": message.body,
            "origin": message.origin,
            "seq": message.seq,
        }
    if isinstance(message, Probe):
        return {"t": "probe", "epoch": message.epoch}
    if isinstance(message, Seed):
        return {
            "t": "seed",
            "epoch": message.epoch,
            "through": message.through,
            "seqs": [[origin, seq] for origin, seq in message.seqs],
            "history": [[e.epoch, e.start] for e in message.history],
        }
    if isinstance(message, AppendReply):
        refused = None if message.refused is None else message.refused.value
        return {
            "t": "reply",
            "epoch": message.epoch,
            "node": message.node,
            "log_end": message.log_end,
            "refused": refused,
        }
    if isinstance(message, EpochEnd):
        return {
            "t": "epoch_end",
            "epoch": message.epoch,
            "node": message.node,
            "last_epoch": message.last_epoch,
        }
    return {
        "t": "epoch_end_reply",
        "epoch": message.epoch,
        "last_epoch": message.last_epoch,
        "end": message.end,
    }


def message_from_wire(stream: str, frame: object) -> ReplicationMessage:
    """The replication message of ``frame`` (for ``stream``); InvalidInput if malformed."""
    what = f"replica message of {stream}"
    if not isinstance(frame, dict):
        raise InvalidInput(f"{what}: must be a map")
    kind = frame.get("t")
    try:
        if kind == "append":
            return ReplicaAppend(
                stream,
                _field(frame, "epoch", int, what),
                _field(frame, "offset", int, what),
                _field(frame, "entry_epoch", int, what),
                _field(frame, "body", bytes, what),
                _opt(frame, "origin", str, what),
                _opt(frame, "seq", int, what),
            )
        if kind == "probe":
            return Probe(stream, _field(frame, "epoch", int, what))
        if kind == "seed":
            seqs = _field(frame, "seqs", list, what)
            history = _field(frame, "history", list, what)
            if len(seqs) > MAX_SEED_ORIGINS or len(history) > MAX_SEED_ORIGINS:
                raise InvalidInput(f"{what}: a seed carries at most {MAX_SEED_ORIGINS} entries")
            if not all(isinstance(p, list) and len(p) == 2 for p in seqs + history):
                raise InvalidInput(f"{what}: seqs and history must be lists of pairs")
            return Seed(
                stream,
                _field(frame, "epoch", int, what),
                _field(frame, "through", int, what),
                tuple((o, q) for o, q in seqs),
                tuple(EpochStart(e, start) for e, start in history),
            )
        if kind == "reply":
            refused = _opt(frame, "refused", str, what)
            return AppendReply(
                stream,
                _field(frame, "epoch", int, what),
                _field(frame, "node", str, what),
                _field(frame, "log_end", int, what),
                None if refused is None else Refusal(refused),
            )
        if kind == "epoch_end":
            return EpochEnd(
                stream,
                _field(frame, "epoch", int, what),
                _field(frame, "node", str, what),
                _field(frame, "last_epoch", int, what),
            )
        if kind == "epoch_end_reply":
            return EpochEndReply(
                stream,
                _field(frame, "epoch", int, what),
                _field(frame, "last_epoch", int, what),
                _field(frame, "end", int, what),
            )
    except ValueError as exc:  # the messages check their own fields (and Refusal its value)
        raise InvalidInput(f"{what}: {exc}") from None
    raise InvalidInput(f"{what}: unknown kind {kind!r}")


@dataclass(frozen=True)
class ReplicaExchange:
    """Replication messages of ``stream`` from peer ``sender`` (hex node id), in order."""

    OP: ClassVar[str] = "replica"
    stream: str
    sender: str
    messages: tuple[ReplicationMessage, ...]

    def to_wire(self) -> Frame:
        return {
            "op": self.OP,
            "stream": self.stream,
            "sender": self.sender,
            **messages_to_wire(self.messages),
        }

    @classmethod
    def from_wire(cls, frame: Frame) -> ReplicaExchange:
        stream = _field(frame, "stream", str, "replica")
        sender = _node_hex(frame.get("sender"), "replica: sender")
        return cls(stream, sender, messages_from_wire(stream, frame.get("messages")))


def messages_from_wire(stream: str, raw: object) -> tuple[ReplicationMessage, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
        raise InvalidInput(f"replica messages of {stream}: a list of at most {MAX_MESSAGES}")
    return tuple(message_from_wire(stream, item) for item in raw)


def messages_to_wire(messages: Sequence[ReplicationMessage]) -> Frame:
    return {"messages": [message_to_wire(m) for m in messages]}


# --------------------------------------------------------------------------- control plane


def state_to_wire(state: StreamState) -> Frame:
    """One stream's state; ``anchor`` only if it has one, ``wanted`` (the replicas asked for)
    only if it has fewer, ``standby`` only if it has one (older peers ignore the keys)."""
    frame: Frame = {
        "name": state.name,
        "epoch": state.epoch,
        "primary": state.primary,
        "replicas": list(state.replicas),
        "in_sync": list(state.in_sync),
        "min_insync": state.min_insync,
        "version": state.version,
    }
    if state.anchor is not None:
        frame["anchor"] = state.anchor
    if state.wanted is not None:
        frame["wanted"] = state.wanted
    if state.standby is not None:
        frame["standby"] = state.standby
    return frame


def state_from_wire(frame: object) -> StreamState:
    what = "stream state"
    if not isinstance(frame, dict):
        raise InvalidInput(f"{what}: must be a map")
    replicas = _field(frame, "replicas", list, what)
    in_sync = _field(frame, "in_sync", list, what)
    state = StreamState(
        _field(frame, "name", str, what),
        _field(frame, "epoch", int, what),
        _node_hex(frame.get("primary"), f"{what}: primary"),
        tuple(_node_hex(n, f"{what}: replicas") for n in replicas),
        tuple(_node_hex(n, f"{what}: in_sync") for n in in_sync),
        _field(frame, "min_insync", int, what),
        _field(frame, "version", int, what),
        _opt(frame, "anchor", str, what),  # absent (older voters) or nil: not anchored
        _opt(frame, "wanted", int, what),  # absent or nil: as many as it has
        _opt(frame, "standby", str, what),  # absent or nil: none
    )
    if state.standby is not None and (
        state.standby == state.primary or state.standby not in state.in_sync
    ):
        raise InvalidInput(f"{what} of {state.name}: the standby must be an ISR member")
    if state.wanted is not None and state.wanted < 1:
        raise InvalidInput(f"{what} of {state.name}: wanted must be at least 1")
    if state.anchor is not None and state.anchor in ("", state.name):
        raise InvalidInput(f"{what} of {state.name}: the anchor must name another stream")
    if state.epoch < 1 or state.version < 0 or state.min_insync < 1:
        raise InvalidInput(f"{what} of {state.name}: epoch, version or min_insync out of range")
    if state.primary not in state.replicas or not set(state.in_sync) <= set(state.replicas):
        raise InvalidInput(f"{what} of {state.name}: primary and ISR must be replicas")
    return state


@dataclass(frozen=True)
class ControlHeartbeat:
    """Peer -> voter: ``node`` lives; ``log_ends`` of the streams it replicates."""

    OP: ClassVar[str] = "control_heartbeat"
    node: str
    log_ends: Mapping[str, int]

    def to_wire(self) -> Frame:
        return {"op": self.OP, "node": self.node, "log_ends": dict(self.log_ends)}

    @classmethod
    def from_wire(cls, frame: Frame) -> ControlHeartbeat:
        node = _node_hex(frame.get("node"), "control_heartbeat: node")
        raw = frame.get("log_ends")
        if not isinstance(raw, dict) or len(raw) > MAX_STREAMS:
            raise InvalidInput("control_heartbeat: log_ends must be a map of stream -> offset")
        for key, value in raw.items():
            if not isinstance(key, str) or not isinstance(value, int) or value < -1:
                raise InvalidInput("control_heartbeat: log_ends must be a map of stream -> offset")
        return cls(node, dict(raw))


@dataclass(frozen=True)
class ControlSubmit:
    """Peer -> voter: append ``command`` (its wire form, bytes that peer.replication.raft encodes
    and checks) to the Raft log."""

    OP: ClassVar[str] = "control_submit"
    command: bytes

    def to_wire(self) -> Frame:
        return {"op": self.OP, "command": self.command}

    @classmethod
    def from_wire(cls, frame: Frame) -> ControlSubmit:
        return cls(_field(frame, "command", bytes, "control_submit"))


@dataclass(frozen=True)
class ControlJoin:
    """Peer -> voter: admit ``node`` (the asking peer itself) as a voter. ``volunteer``: it
    asks for an open seat (declined when the seats are taken); without it, it was forced into
    a seat (``peer join --voter``) and is admitted whatever the count. ``volunteer`` is sent
    only when true, so an older voter reads the frame as before."""

    OP: ClassVar[str] = "control_join"
    node: str
    volunteer: bool = False

    def to_wire(self) -> Frame:
        extra = {"volunteer": True} if self.volunteer else {}
        return {"op": self.OP, "node": self.node, **extra}

    @classmethod
    def from_wire(cls, frame: Frame) -> ControlJoin:
        volunteer = frame.get("volunteer", False)
        if not isinstance(volunteer, bool):
            raise InvalidInput("control_join: volunteer must be a boolean")
        return cls(_node_hex(frame.get("node"), "control_join: node"), volunteer)


@dataclass(frozen=True)
class ControlRead:
    """Peer -> voter: the control plane's state of ``stream`` (and who the voters are); with
    ``burst``, also that participant's burst state (an elastic participant's leader)."""

    OP: ClassVar[str] = "control_read"
    stream: str
    burst: str | None = None

    def to_wire(self) -> Frame:
        burst = {} if self.burst is None else {"burst": self.burst}
        return {"op": self.OP, "stream": self.stream, **burst}

    @classmethod
    def from_wire(cls, frame: Frame) -> ControlRead:
        return cls(
            _field(frame, "stream", str, "control_read"),
            _opt(frame, "burst", str, "control_read"),
        )


@dataclass(frozen=True)
class RaftFrame:
    """Voter -> voter: one message of the Raft library (bytes it encoded itself)."""

    OP: ClassVar[str] = "raft"
    sender: str
    data: bytes

    def to_wire(self) -> Frame:
        return {"op": self.OP, "sender": self.sender, "data": self.data}

    @classmethod
    def from_wire(cls, frame: Frame) -> RaftFrame:
        sender = _node_hex(frame.get("sender"), "raft: sender")
        return cls(sender, _field(frame, "data", bytes, "raft"))


ReplicaRequest: TypeAlias = (
    ReplicaExchange | ControlHeartbeat | ControlSubmit | ControlJoin | ControlRead | RaftFrame
)
REPLICA_TYPES: dict[str, Any] = {
    cls.OP: cls
    for cls in (
        ReplicaExchange,
        ControlHeartbeat,
        ControlSubmit,
        ControlJoin,
        ControlRead,
        RaftFrame,
    )
}


def decode_replica(frame: Frame) -> ReplicaRequest | None:
    """The replication message ``frame`` carries, or None if its op is not one of ours
    (InvalidInput if it is ours but wrong)."""
    op = frame.get("op")
    cls = REPLICA_TYPES.get(op) if isinstance(op, str) else None
    if cls is None:
        return None
    message: ReplicaRequest = cls.from_wire(frame)
    return message
