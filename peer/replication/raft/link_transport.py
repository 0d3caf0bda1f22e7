"""pysyncobj's transport over the peer's own links: frames out by a callable, frames in by
:meth:`LinkTransport.deliver`.

Theory of operation
-------------------
pysyncobj runs Raft on one thread of its own (the *tick thread*, ``autoTick``): every tick it
runs elections and replication, calls the ``addOnTickCallback`` callbacks, and then waits in
its poller (``SyncObj._poller``) for at most ``autoTickPeriod``. Its own ``TCPTransport`` is
thread-safe because every socket event is dispatched by that poller, on that thread. This
transport keeps the same rule with no socket: :meth:`LinkTransport.deliver` (any thread, e.g.
the peer's asyncio loop) only appends ``(src, bytes)`` to a bounded queue and writes one byte
to a wake pipe registered in the poller; the poller then calls :meth:`_drain` on the tick
thread, which decodes each frame and hands it to pysyncobj. The queue is also drained by a tick
callback, so nothing waits on a lost wake-up.

Node ids are the peers' node ids (strings); nodes are plain :class:`pysyncobj.node.Node`.
Outgoing messages (pysyncobj's dicts) are msgpack maps, sent by ``send(node_id, frame)``, which
must not block and returns ``False`` when the peer is known unreachable. Every incoming frame is
checked by :func:`decode_message` against the message types pysyncobj 0.3.17 sends (the
``_FIELDS`` table), tuples are rebuilt where pysyncobj compares or unpacks them, and the log
entries it carries, which pysyncobj pickles, are first read by an unpickler that knows only the
two globals pysyncobj's entries use (:func:`check_log_command`). A frame that fails, or that comes
from a node that is not a current member, is dropped with a log line; nothing raises into the
caller of ``deliver``. Chunked entries (``transmission``) are refused: pysyncobj uses them only
for one entry of ``appendEntriesBatchSizeBytes`` or more, and the control plane's entries are
far smaller (peer.replication.raft.codec bounds them), so the one path where pysyncobj would
unpickle an unchecked blob from the network is closed.

Connections. pysyncobj asks its transport for two things: ``onNodeConnected`` /
``onNodeDisconnected``, which decide (a) whom a leader sends ``append_entries`` to (it skips
disconnected nodes and restarts a snapshot transfer after a reconnect), and (b) whether a
follower may start an election at all (only when connected to someone, so an isolated node
does not keep raising its term and disturb the cluster when it returns). So "connected" here
means *heard from lately over a link that works*:

- a member is reported connected when a frame from it arrives, or a send to it succeeds while
  it was heard from within ``conf.connectionTimeout`` (new members get that long as grace);
- it is reported disconnected when a send to it fails, or nothing came from it for
  ``conf.connectionTimeout``;
- since followers do not talk to each other in Raft and pysyncobj sends nothing to a
  disconnected node, the transport sends its own ``hello`` frame to every member it has sent
  nothing to for ``conf.connectionRetryTime``; a ``hello`` only tells the receiver the sender is
  alive. Every working link therefore carries a frame at least that often each way.

``addNode`` / ``dropNode`` (dynamic membership) add and forget members; :meth:`destroy` closes
the wake pipe. All state except the inbox is touched on the tick thread only.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
from pysyncobj.node import Node
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport

from peer.errors import InvalidInput

__all__ = [
    "HELLO",
    "MAX_INBOX",
    "LinkTransport",
    "MessageError",
    "SendFn",
    "TransportFactory",
    "check_log_command",
    "decode_message",
    "encode_message",
]

log = logging.getLogger(__name__)

SendFn = Callable[[str, bytes], bool]
"""``send(node_id, frame) -> bool``: hand a frame to the peer link; never blocks; False when
the peer is known unreachable."""

HELLO = "hello"
"""The transport's own frame type (a liveness probe, never shown to pysyncobj)."""

MAX_INBOX = 10_000
"""Frames queued by :meth:`LinkTransport.deliver` and not yet drained; more are dropped."""

_MAX_INT = 2**63 - 1


class MessageError(InvalidInput):
    """A frame is not a message pysyncobj sends; the text names what is wrong."""


# ------------------------------------------------------------------------------ checks


def _nat(field: str, value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise MessageError(f"{field} must be an int in [0, 2**63), not {value!r:.80}")
    return value


def _opt_nat(field: str, value: object) -> object:
    return None if value is None else _nat(field, value)


def _flag(field: str, value: object) -> object:
    if not isinstance(value, bool):
        raise MessageError(f"{field} must be a bool, not {value!r:.80}")
    return value


def _blob(field: str, value: object) -> object:
    if not isinstance(value, bytes):
        raise MessageError(f"{field} must be bytes, not {type(value).__name__}")
    return value


def _command(field: str, value: object) -> object:
    check_log_command(_blob(field, value))  # type: ignore[arg-type]
    return value


def _entries(field: str, value: object) -> object:
    if not isinstance(value, list):
        raise MessageError(f"{field} must be a list, not {type(value).__name__}")
    entries = []
    for i, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) != 3:
            raise MessageError(f"{field}[{i}] must be [command, index, term], not {entry!r:.80}")
        command, index, term = entry
        _command(f"{field}[{i}].command", command)
        _nat(f"{field}[{i}].index", index)
        _nat(f"{field}[{i}].term", term)
        entries.append((command, index, term))  # pysyncobj compares entries as tuples
    return entries


def _serialized(field: str, value: object) -> object:
    # A snapshot chunk: (bytes, is_first, is_last); None while the sender is still dumping.
    # pysyncobj's sender puts False there when reading its dump failed, which its receiver
    # cannot unpack: it means "no chunk" as None does.
    if value is None or value is False:
        return None
    if not isinstance(value, list) or len(value) != 3:
        raise MessageError(f"{field} must be [data, is_first, is_last], not {value!r:.80}")
    data, first, last = value
    _blob(f"{field}.data", data)
    _flag(f"{field}.is_first", first)
    _flag(f"{field}.is_last", last)
    return (data, first, last)


def _refuse_chunks(field: str, value: object) -> object:
    raise MessageError(f"{field}: chunked entries are not used by the control plane")


_Check = Callable[[str, object], object]

# type -> field -> (check, required): every message pysyncobj 0.3.17 sends (syncobj.py).
_FIELDS: dict[str, dict[str, tuple[_Check, bool]]] = {
    HELLO: {},
    "request_vote": {
        "term": (_nat, True),
        "last_log_index": (_nat, True),
        "last_log_term": (_nat, True),
    },
    "response_vote": {"term": (_nat, True)},
    "timeout_now": {"term": (_nat, True)},
    "append_entries": {
        "term": (_nat, True),
        "commit_index": (_nat, True),
        "prevLogIdx": (_opt_nat, False),
        "prevLogTerm": (_opt_nat, False),
        "entries": (_entries, False),
        "serialized": (_serialized, False),
        "transmission": (_refuse_chunks, False),
        "data": (_refuse_chunks, False),
    },
    "next_node_idx": {
        "next_node_idx": (_nat, True),
        "reset": (_flag, True),
        "success": (_flag, True),
    },
    "apply_command": {"command": (_command, True), "request_id": (_nat, False)},
    "apply_command_response": {
        "request_id": (_nat, True),
        "error": (_nat, False),
        "log_idx": (_nat, False),
        "log_term": (_nat, False),
    },
}


def _str_keyed_map(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise MessageError("a map repeats a key")
    for key in result:
        if not isinstance(key, str):
            raise MessageError(f"a map key is {type(key).__name__}, not str")
    return result


def encode_message(message: Mapping[str, Any]) -> bytes:
    """One pysyncobj message (a dict of ints, bools, bytes, strs, lists, tuples) as msgpack."""
    frame: bytes = msgpack.packb(dict(message), use_bin_type=True)
    return frame


def decode_message(data: bytes) -> dict[str, Any]:
    """Decode and check one frame; raise :class:`MessageError` naming what is wrong."""
    if not isinstance(data, bytes):
        raise MessageError(f"a frame must be bytes, not {type(data).__name__}")
    try:
        message = msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, object_pairs_hook=_str_keyed_map
        )
    except MessageError:
        raise
    except Exception as exc:
        raise MessageError(f"not a msgpack frame: {exc}") from exc
    if not isinstance(message, dict):
        raise MessageError(f"a frame must be a map, not {type(message).__name__}")
    kind = message.get("type")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise MessageError(f"unknown message type {kind!r:.80}")
    for key in message:
        if key != "type" and key not in fields:
            raise MessageError(f"{kind}: unexpected field {key!r:.80}")
    for key, (check, required) in fields.items():
        if key in message:
            message[key] = check(f"{kind}.{key}", message[key])
        elif required:
            raise MessageError(f"{kind}: missing field {key!r}")
    if kind == "append_entries" and ("prevLogIdx" in message) != ("prevLogTerm" in message):
        raise MessageError("append_entries: prevLogIdx and prevLogTerm go together")
    answered = "error" in message or ("log_idx" in message and "log_term" in message)
    if kind == "apply_command_response" and not answered:
        raise MessageError("apply_command_response: log_idx and log_term, or error")
    return message


# ------------------------------------------------------------------- pysyncobj's log entries

_REGULAR, _NO_OP, _MEMBERSHIP, _VERSION = 0, 1, 2, 3


class _EntryUnpickler(pickle.Unpickler):
    """Knows only what pysyncobj's own entries pickle: bytes (protocol 2 rebuilds them with
    ``_codecs.encode``) and its ``Node`` (in membership changes)."""

    _ALLOWED = {("_codecs", "encode"), ("pysyncobj.node", "Node")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise MessageError(f"a log entry refers to {module}.{name}")
        return super().find_class(module, name)


def check_log_command(command: bytes) -> None:
    """Check one Raft log entry pysyncobj would apply: a type byte, then (but for no-ops) a
    pickle of the shape pysyncobj writes for that type, read without running any other code."""
    if not command:
        raise MessageError("a log entry is empty")
    kind, body = command[0], command[1:]
    if kind == _NO_OP:
        if body:
            raise MessageError("a no-op log entry has a body")
        return
    if kind not in (_REGULAR, _MEMBERSHIP, _VERSION):
        raise MessageError(f"a log entry has the unknown type {kind}")
    try:
        value = _EntryUnpickler(io.BytesIO(body)).load()
    except MessageError:
        raise
    except Exception as exc:
        raise MessageError(f"a log entry does not unpickle: {exc!r:.120}") from exc
    if kind == _REGULAR:
        ok = (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], int)
            and isinstance(value[1], tuple)
            and all(isinstance(arg, bytes) for arg in value[1])
        )
    elif kind == _MEMBERSHIP:
        ok = (
            isinstance(value, list)
            and len(value) == 3
            and value[0] in ("add", "rem")
            and isinstance(value[1], str)
            and isinstance(value[2], Node)
            and value[2].id == value[1]
        )
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        raise MessageError(f"a log entry of type {kind} has the wrong shape: {value!r:.80}")


# ------------------------------------------------------------------------------ transport


@dataclass
class _Member:
    node: Node
    heard: float  # last frame from it (or when it became a member)
    sent: float  # last send attempted to it
    link_up: bool = False  # the last send succeeded, or a frame came since the last failure
    reported: bool = False  # what pysyncobj was last told


class LinkTransport(Transport):  # type: ignore[misc]
    """A pysyncobj ``Transport`` over ``send`` and :meth:`deliver` (see the module docstring).

    pysyncobj constructs it as ``transportClass(syncObj, selfNode, otherNodes)``; pass a
    :class:`TransportFactory` as ``transportClass`` to supply ``send``."""

    def __init__(self, syncObj: Any, selfNode: Node, otherNodes: Iterable[Node], send: SendFn):
        super().__init__(syncObj, selfNode, otherNodes)
        self._sync = syncObj
        self._self_id = str(selfNode.id)
        self._send_link = send
        self._members: dict[str, _Member] = {}
        self._inbox: collections.deque[tuple[str, bytes]] = collections.deque()
        self._wake_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = syncObj._poller
        self._poller.subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ)
        syncObj.addOnTickCallback(self._on_tick)
        for node in otherNodes:
            self.addNode(node)

    # -------------------------------------------------------------- any thread

    def deliver(self, src: str, data: bytes) -> None:
        """A frame from peer ``src``; callable from any thread, never raises, never blocks."""
        if len(self._inbox) >= MAX_INBOX:
            log.warning("raft: inbox full (%d frames), dropped a frame from %.12s", MAX_INBOX, src)
            return
        self._inbox.append((src, data))
        self.wake()

    def wake(self) -> None:
        """Make the tick thread's poller return now (any thread)."""
        with self._wake_lock:
            if self._wake_w < 0:
                return
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                os.write(self._wake_w, b"!")

    # -------------------------------------------------------------- tick thread

    def _on_wake(self, descr: int, event: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._drain()

    def _drain(self) -> None:
        while self._inbox:
            src, data = self._inbox.popleft()
            member = self._members.get(src) if isinstance(src, str) else None
            if member is None:
                log.info("raft: dropped a frame from %r: not a member", src)
                continue
            try:
                message = decode_message(data)
            except MessageError as exc:
                log.warning("raft: dropped a frame from %.12s: %s", src, exc)
                continue
            member.heard = time.monotonic()
            member.link_up = True
            self._report(member)
            if message["type"] == HELLO:
                continue
            try:
                self._onMessageReceived(member.node, message)
            except Exception:  # pysyncobj failed on a checked message: keep the others
                log.exception("raft: pysyncobj failed on %s from %.12s", message["type"], src)

    def _on_tick(self) -> None:
        self._drain()
        now = time.monotonic()
        probe_after = self._sync.conf.connectionRetryTime
        for member in list(self._members.values()):
            if now - member.sent >= probe_after:
                self._send_frame(member, encode_message({"type": HELLO}))
            self._report(member)

    def _connected(self, member: _Member) -> bool:
        silent = time.monotonic() - member.heard > self._sync.conf.connectionTimeout
        return member.link_up and not silent

    def _report(self, member: _Member) -> None:
        connected = self._connected(member)
        if connected == member.reported:
            return
        member.reported = connected
        if connected:
            self._onNodeConnected(member.node)
        else:
            self._onNodeDisconnected(member.node)

    def _send_frame(self, member: _Member, frame: bytes) -> bool:
        member.sent = time.monotonic()
        try:
            ok = bool(self._send_link(str(member.node.id), frame))
        except Exception:
            log.exception("raft: send to %.12s raised", member.node.id)
            ok = False
        member.link_up = ok
        self._report(member)
        return ok

    # ------------------------------------------------------- pysyncobj's Transport

    def send(self, node: Node, message: Any) -> bool:
        member = self._members.get(str(node.id))
        if member is None:
            return False
        try:
            frame = encode_message(message)
        except Exception:
            log.exception("raft: cannot encode %r", message.get("type"))
            return False
        return self._send_frame(member, frame)

    def addNode(self, node: Node) -> None:
        node_id = str(node.id)
        if node_id == self._self_id or node_id in self._members:
            return
        now = time.monotonic()
        self._members[node_id] = _Member(node=node, heard=now, sent=float("-inf"))

    def dropNode(self, node: Node) -> None:
        member = self._members.pop(str(node.id), None)
        if member is not None and member.reported:
            self._onNodeDisconnected(member.node)

    def destroy(self) -> None:
        self._sync.removeOnTickCallback(self._on_tick)
        self._poller.unsubscribe(self._wake_r)
        with self._wake_lock:
            os.close(self._wake_w)
            os.close(self._wake_r)
            self._wake_w = self._wake_r = -1
        self._members.clear()
        self._inbox.clear()
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)

    # ---------------------------------------------------------------- inspection

    def connected(self) -> tuple[str, ...]:
        """The members pysyncobj was last told are connected (a snapshot; any thread)."""
        return tuple(sorted(i for i, m in list(self._members.items()) if m.reported))


class TransportFactory:
    """``transportClass`` for ``SyncObj``: builds the :class:`LinkTransport` with ``send`` and
    keeps it in :attr:`transport` for the owner to call :meth:`LinkTransport.deliver` on."""

    def __init__(self, send: SendFn) -> None:
        self._send = send
        self.transport: LinkTransport | None = None

    def __call__(self, syncObj: Any, selfNode: Node, otherNodes: Iterable[Node]) -> LinkTransport:
        self.transport = LinkTransport(syncObj, selfNode, otherNodes, self._send)
        return self.transport
