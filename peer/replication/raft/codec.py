"""The control plane's bytes: a command as one Raft log entry, a stream's state as a plain
list, and the snapshot dump's checks (docs/replication.md).

A command travels as a msgpack map, the only bytes of ours in the Raft log; a ``CreateStream``
without an anchor leaves ``anchor`` out of its map (older voters know no such field). The
snapshot dump (:mod:`peer.replication.raft.machine` writes and reads it through pysyncobj's
``serializer`` seam) holds the streams as plain lists. Every decoder checks each field of what
it reads and raises :class:`~peer.errors.InvalidInput` naming the first wrong one. Pure: no
threads, no files, no clock.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import msgpack

from peer.errors import InvalidInput
from peer.replication.control import (
    BurstState,
    ClaimBurst,
    Command,
    ControlState,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    PlanBurst,
    SetReplicas,
    SetStandby,
    ShrinkIsr,
    StreamState,
)

__all__ = [
    "DUMP_FORMAT",
    "MAX_COMMAND_BYTES",
    "burst_from_wire",
    "burst_to_wire",
    "check_node_id",
    "command_from_wire",
    "command_to_wire",
    "dump_entry",
    "dump_list",
    "state_from_streams",
    "stream_from_wire",
    "stream_to_wire",
    "wire_int",
]

MAX_COMMAND_BYTES = 16 * 1024
"""The largest encoded command (far below pysyncobj's 64 KiB entry batch, so entries are never
sent in chunks; the transport refuses chunks)."""

DUMP_FORMAT = "fedstream-control/1"
_MAX_INT = 2**63 - 1
_NODE_ID = re.compile(r"[0-9a-f]{40}")

# ------------------------------------------------------------------------------ commands

_COMMANDS: dict[str, type[Command]] = {
    "create_stream": CreateStream,
    "drop_stream": DropStream,
    "elect": Elect,
    "shrink_isr": ShrinkIsr,
    "expand_isr": ExpandIsr,
    "set_replicas": SetReplicas,
    "set_standby": SetStandby,
    "claim_burst": ClaimBurst,
    "plan_burst": PlanBurst,
}
_TYPE_OF: dict[type[Any], str] = {cls: name for name, cls in _COMMANDS.items()}
_STR_FIELDS = {"name", "primary", "node", "participant"}
_INT_FIELDS = {"epoch", "version", "min_insync", "term", "minimum", "maximum"}
# absent from the wire form when None (as older voters wrote): field -> its type
_OPTIONAL_FIELDS: dict[str, type] = {"anchor": str, "wanted": int, "standby": str}


def wire_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -_MAX_INT <= value <= _MAX_INT:
        raise InvalidInput(f"{what} must be an int of at most 63 bits, not {value!r:.80}")
    return value


def _wire_str(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, not {type(value).__name__}")
    return value


def _wire_strs(what: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a list of str, not {type(value).__name__}")
    return tuple(_wire_str(f"{what}[{i}]", item) for i, item in enumerate(value))


def command_to_wire(command: Command) -> bytes:
    """A control-plane command as the bytes of one Raft log entry (a msgpack map)."""
    kind = _TYPE_OF.get(type(command))
    if kind is None:
        raise InvalidInput(f"not a control-plane command: {command!r:.80}")
    body: dict[str, Any] = {"type": kind}
    for field in dataclasses.fields(command):
        value = getattr(command, field.name)
        if value is None and field.name in _OPTIONAL_FIELDS:
            continue
        body[field.name] = list(value) if isinstance(value, tuple) else value
    frame: bytes = msgpack.packb(body, use_bin_type=True)
    if len(frame) > MAX_COMMAND_BYTES:
        raise InvalidInput(f"{kind} is {len(frame)} bytes encoded; at most {MAX_COMMAND_BYTES}")
    return frame


def command_from_wire(data: bytes) -> Command:
    """The command in one log entry; :class:`InvalidInput` names the first wrong field."""
    if not isinstance(data, bytes):
        raise InvalidInput(f"a command must be bytes, not {type(data).__name__}")
    if len(data) > MAX_COMMAND_BYTES:
        raise InvalidInput(f"a command is {len(data)} bytes; at most {MAX_COMMAND_BYTES}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:
        raise InvalidInput(f"a command is not msgpack: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidInput(f"a command must be a map, not {type(body).__name__}")
    kind = body.get("type")
    cls = _COMMANDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidInput(f"unknown command type {kind!r:.80}")
    names = {field.name for field in dataclasses.fields(cls)}
    extra = sorted(str(key) for key in body if key != "type" and key not in names)
    if extra:
        raise InvalidInput(f"{kind}: unexpected field {extra[0]!r:.80}")
    kwargs: dict[str, Any] = {}
    for name in sorted(names):
        if name in _OPTIONAL_FIELDS:
            value = body.get(name)
            read = _wire_str if _OPTIONAL_FIELDS[name] is str else wire_int
            kwargs[name] = None if value is None else read(f"{kind}.{name}", value)
            continue
        if name not in body:
            raise InvalidInput(f"{kind}: missing field {name!r}")
        value, what = body[name], f"{kind}.{name}"
        if name in _STR_FIELDS:
            kwargs[name] = _wire_str(what, value)
        elif name in _INT_FIELDS:
            kwargs[name] = wire_int(what, value)
        else:
            kwargs[name] = _wire_strs(what, value)
    try:
        command: Command = cls(**kwargs)
    except ValueError as exc:
        raise InvalidInput(f"{kind}: {exc}") from exc
    return command


# ------------------------------------------------------------------ state in plain form


def stream_to_wire(stream: StreamState) -> list[Any]:
    """One stream's state as a plain list (msgpack-able): name, epoch, primary, replicas,
    in_sync, min_insync, version, and the anchor as an 8th element if there is one (so an
    unanchored stream keeps the 7-element form older voters read), the replicas asked
    for as a 9th if the stream has fewer, and the standby as a 10th if it has one (the
    elements before then nil where there is none)."""
    wire = [
        stream.name,
        stream.epoch,
        stream.primary,
        list(stream.replicas),
        list(stream.in_sync),
        stream.min_insync,
        stream.version,
    ]
    extra = [stream.anchor, stream.wanted, stream.standby]
    while extra and extra[-1] is None:
        extra.pop()
    wire.extend(extra)
    return wire


def stream_from_wire(value: object) -> StreamState:
    """The inverse of :func:`stream_to_wire` (7 elements, 8 with the anchor, which may be
    nil, 9 with the replicas asked for, 10 with the standby), checking the invariants of the
    state."""
    if not isinstance(value, list) or len(value) not in (7, 8, 9, 10):
        raise InvalidInput(f"a stream state must be a list of 7 to 10, not {value!r:.80}")
    name = _wire_str("stream.name", value[0])
    epoch = wire_int(f"stream {name!r} epoch", value[1])
    primary = _wire_str(f"stream {name!r} primary", value[2])
    replicas = _wire_strs(f"stream {name!r} replicas", value[3])
    in_sync = _wire_strs(f"stream {name!r} in_sync", value[4])
    min_insync = wire_int(f"stream {name!r} min_insync", value[5])
    version = wire_int(f"stream {name!r} version", value[6])
    if not name or epoch < 1 or min_insync < 1 or version < 1:
        raise InvalidInput(f"stream {name!r}: empty name, or epoch/min_insync/version below 1")
    if not replicas or len(set(replicas)) != len(replicas):
        raise InvalidInput(f"stream {name!r}: replicas must be distinct and not empty")
    if primary not in in_sync or not set(in_sync) <= set(replicas):
        raise InvalidInput(f"stream {name!r}: the primary must be in sync, the ISR in replicas")
    anchor: str | None = None
    if len(value) >= 8 and value[7] is not None:
        anchor = _wire_str(f"stream {name!r} anchor", value[7])
        if anchor in ("", name):
            raise InvalidInput(f"stream {name!r}: the anchor must name another stream")
    wanted: int | None = None
    if len(value) >= 9 and value[8] is not None:
        wanted = wire_int(f"stream {name!r} wanted", value[8])
        if wanted < 1:
            raise InvalidInput(f"stream {name!r}: the replicas asked for must be at least 1")
    standby: str | None = None
    if len(value) == 10 and value[9] is not None:
        standby = _wire_str(f"stream {name!r} standby", value[9])
        if standby == primary or standby not in in_sync:
            raise InvalidInput(
                f"stream {name!r}: the standby must be an ISR member other than the primary"
            )
    return StreamState(
        name, epoch, primary, replicas, in_sync, min_insync, version, anchor, wanted, standby
    )


def burst_to_wire(burst: BurstState) -> list[Any]:
    """A participant's burst state as a plain list: participant, leader, term, minimum,
    maximum, launched, version."""
    return [
        burst.participant, burst.leader, burst.term, burst.minimum, burst.maximum,
        list(burst.launched), burst.version,
    ]  # fmt: skip


def burst_from_wire(value: object) -> BurstState:
    """The inverse of :func:`burst_to_wire`, checking every field."""
    if not isinstance(value, list) or len(value) != 7:
        raise InvalidInput(f"a burst state must be a list of 7, not {value!r:.80}")
    participant = _wire_str("burst.participant", value[0])
    what = f"burst {participant!r}"
    leader = _wire_str(f"{what} leader", value[1])
    term = wire_int(f"{what} term", value[2])
    minimum = wire_int(f"{what} minimum", value[3])
    maximum = wire_int(f"{what} maximum", value[4])
    launched = _wire_strs(f"{what} launched", value[5])
    version = wire_int(f"{what} version", value[6])
    if not participant or not leader or term < 1 or version < 1:
        raise InvalidInput(f"{what}: empty participant or leader, or term/version below 1")
    if not 1 <= minimum <= maximum or len(launched) > maximum - 1:
        raise InvalidInput(f"{what}: bounds {minimum}:{maximum} or {len(launched)} launched")
    if not all(launched) or len(set(launched)) != len(launched):
        raise InvalidInput(f"{what}: launched names must be distinct and not empty")
    return BurstState(participant, leader, term, minimum, maximum, launched, version)


def state_from_streams(
    streams: Sequence[StreamState], applied: int, bursts: Sequence[BurstState] = ()
) -> ControlState:
    """A ControlState holding exactly ``streams`` and ``bursts`` (a snapshot read back)."""
    return ControlState.restore(streams, applied, bursts)


def check_node_id(what: str, node_id: object) -> str:
    if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
        raise InvalidInput(f"{what} must be a node id (40 lowercase hex digits), not {node_id!r}")
    return node_id


# ------------------------------------------------------------------------------ dumps


def dump_list(path: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(f"{path}: expected a list, not {type(value).__name__}")
    return value


def dump_entry(path: str, value: object) -> tuple[bytes, int, int]:
    entry = dump_list(path, value)
    if len(entry) != 3 or not isinstance(entry[0], bytes):
        raise InvalidInput(f"{path}: a log entry must be [command, index, term]")
    return entry[0], wire_int(f"{path}: index", entry[1]), wire_int(f"{path}: term", entry[2])
