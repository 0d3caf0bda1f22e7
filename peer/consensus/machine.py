"""The control plane's Raft driver: :class:`ControlMachine`, a pysyncobj ``SyncObj`` whose
replicated state is a :class:`~peer.control.ControlState`.

Theory of operation
-------------------
Each voter peer runs one ``ControlMachine``. pysyncobj (Raft) runs on its own thread (the tick
thread) and talks to the other voters through :class:`~peer.consensus.transport.LinkTransport`:
frames go out by the ``send`` callable the peer gives, and come in by :meth:`deliver`.

Commands. :meth:`ControlMachine.submit` encodes a command with :func:`command_to_wire` (a
msgpack map, the only bytes of ours in the Raft log) and calls the one ``@replicated`` method,
``_apply_frame``, with it. pysyncobj forwards it to the leader, which appends it to the log;
once committed, every voter (the submitter included) runs ``_apply_frame`` in log order on its
tick thread: it decodes the frame with :func:`command_from_wire` and applies it to its
``ControlState`` (deterministic, so every voter reaches the same state), then tells the
``on_applied`` listeners. The submitter's future resolves with that :class:`Applied`, or fails
with :class:`~peer.errors.Unavailable` (retriable) when there is no leader, the leader changed
before the entry committed, or no answer came within ``submit_timeout`` (then the command may
still be applied later: commands are conditional on an epoch or version, so a retry is safe).
A ``CreateStream`` without an anchor leaves ``anchor`` out of its map (older voters know no
such field).

Snapshots. pysyncobj compacts its log by dumping the state machine, and sends the dump to a
voter too far behind. By default it pickles the object's attributes; here its ``serializer`` /
``deserializer`` seam writes a msgpack file instead (``_write_dump`` / ``_read_dump``): the
streams as plain lists (:func:`stream_to_wire`), plus the two log entries and the member list
pysyncobj needs. A dump read back (at start, or sent by the leader) is checked field by field,
replaces the state at once and is announced to the ``on_restored`` listeners. That seam
requires a dump file, so without ``journal_dir`` the dump lives in a private temporary
directory, removed by :meth:`close`.

Durability. With ``journal_dir``, pysyncobj's file journal keeps the log, term and vote, and the
commit index (saved about once a second); a restarted voter replays its journal up to that
index on its first tick, before it hears from anyone, so it restarts with the state it had
(``on_applied`` listeners see the replayed commands again).

Membership. ``dynamicMembershipChange`` is on: :meth:`add_voter` / :meth:`remove_voter` commit
a change through the log (one at a time; pysyncobj refuses a second while one is pending). A new
voter starts with the whole new voter list and catches up from the leader.

Threads. pysyncobj's tick thread stops when the thread that built the machine ends, so build it
on a long-lived thread (the peer's main thread). Reads (:meth:`snapshot`, :meth:`stream`) take a
lock and may come from any thread; listeners run on the tick thread and must not block it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import Node

from peer.consensus.transport import SendFn, TransportFactory
from peer.control import (
    Applied,
    Command,
    ControlState,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    SetReplicas,
    ShrinkIsr,
    StreamState,
)
from peer.errors import InvalidInput, Unavailable

__all__ = [
    "DUMP_FORMAT",
    "MAX_COMMAND_BYTES",
    "ControlMachine",
    "RaftTimings",
    "command_from_wire",
    "command_to_wire",
    "state_from_streams",
    "stream_from_wire",
    "stream_to_wire",
]

log = logging.getLogger(__name__)

MAX_COMMAND_BYTES = 16 * 1024
"""The largest encoded command (far below pysyncobj's 64 KiB entry batch, so entries are never
sent in chunks; the transport refuses chunks)."""

DUMP_FORMAT = "fedstream-control/1"
_MAX_INT = 2**63 - 1
_NODE_ID = re.compile(r"[0-9a-f]{40}")
T = TypeVar("T")

# ------------------------------------------------------------------------------ commands

_COMMANDS: dict[str, type[Command]] = {
    "create_stream": CreateStream,
    "drop_stream": DropStream,
    "elect": Elect,
    "shrink_isr": ShrinkIsr,
    "expand_isr": ExpandIsr,
    "set_replicas": SetReplicas,
}
_TYPE_OF: dict[type[Any], str] = {cls: name for name, cls in _COMMANDS.items()}
_STR_FIELDS = {"name", "primary", "node"}
_INT_FIELDS = {"epoch", "version", "min_insync"}
_OPTIONAL_FIELDS = {"anchor"}  # absent from the wire form when None (as older voters wrote)


def _wire_int(what: str, value: object) -> int:
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
            kwargs[name] = None if value is None else _wire_str(f"{kind}.{name}", value)
            continue
        if name not in body:
            raise InvalidInput(f"{kind}: missing field {name!r}")
        value, what = body[name], f"{kind}.{name}"
        if name in _STR_FIELDS:
            kwargs[name] = _wire_str(what, value)
        elif name in _INT_FIELDS:
            kwargs[name] = _wire_int(what, value)
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
    unanchored stream keeps the 7-element form older voters read)."""
    wire = [
        stream.name,
        stream.epoch,
        stream.primary,
        list(stream.replicas),
        list(stream.in_sync),
        stream.min_insync,
        stream.version,
    ]
    if stream.anchor is not None:
        wire.append(stream.anchor)
    return wire


def stream_from_wire(value: object) -> StreamState:
    """The inverse of :func:`stream_to_wire` (7 elements, or 8 with the anchor, which may be
    nil), checking the invariants of the state."""
    if not isinstance(value, list) or len(value) not in (7, 8):
        raise InvalidInput(f"a stream state must be a list of 7 or 8, not {value!r:.80}")
    name = _wire_str("stream.name", value[0])
    epoch = _wire_int(f"stream {name!r} epoch", value[1])
    primary = _wire_str(f"stream {name!r} primary", value[2])
    replicas = _wire_strs(f"stream {name!r} replicas", value[3])
    in_sync = _wire_strs(f"stream {name!r} in_sync", value[4])
    min_insync = _wire_int(f"stream {name!r} min_insync", value[5])
    version = _wire_int(f"stream {name!r} version", value[6])
    if not name or epoch < 1 or min_insync < 1 or version < 1:
        raise InvalidInput(f"stream {name!r}: empty name, or epoch/min_insync/version below 1")
    if not replicas or len(set(replicas)) != len(replicas):
        raise InvalidInput(f"stream {name!r}: replicas must be distinct and not empty")
    if primary not in in_sync or not set(in_sync) <= set(replicas):
        raise InvalidInput(f"stream {name!r}: the primary must be in sync, the ISR in replicas")
    anchor: str | None = None
    if len(value) == 8 and value[7] is not None:
        anchor = _wire_str(f"stream {name!r} anchor", value[7])
        if anchor in ("", name):
            raise InvalidInput(f"stream {name!r}: the anchor must name another stream")
    return StreamState(name, epoch, primary, replicas, in_sync, min_insync, version, anchor)


def state_from_streams(streams: Sequence[StreamState], applied: int) -> ControlState:
    """A ControlState holding exactly ``streams`` (a snapshot read back)."""
    return ControlState.restore(streams, applied)


# ------------------------------------------------------------------------------ timings


@dataclass(frozen=True)
class RaftTimings:
    """pysyncobj's clocks, in seconds. The defaults elect a new leader within about one
    second of the old one going silent (docs/replication.md: failover under 3 s)."""

    raft_min_timeout: float = 0.4  # election timeout, drawn in [min, max]
    raft_max_timeout: float = 0.9
    append_entries_period: float = 0.05  # leader heartbeat
    leader_fallback_timeout: float = 1.5  # a leader unheard by a majority steps down
    tick_period: float = 0.05  # the tick thread's longest wait
    probe_period: float = 0.25  # the transport's hello to a member it sent nothing to
    silence_timeout: float = 1.0  # a member unheard this long is disconnected
    submit_timeout: float = 5.0  # a submitted command's future fails after this
    close_timeout: float = 5.0  # close() waits this long for the tick thread
    compaction_entries: int = 5000  # compact the log after this many entries...
    compaction_period: float = 300.0  # ...or this long

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"RaftTimings.{field.name} must be a number > 0, not {value!r}")
        rules = [
            (self.raft_min_timeout > 3 * self.append_entries_period, "raft_min_timeout > 3 x"),
            (self.raft_max_timeout > self.raft_min_timeout, "raft_max_timeout > raft_min_timeout"),
            (self.leader_fallback_timeout > self.append_entries_period, "leader_fallback >"),
            (self.silence_timeout >= self.raft_max_timeout, "silence_timeout >= raft_max"),
            (self.probe_period < self.silence_timeout, "probe_period < silence_timeout"),
            (self.compaction_entries >= 2, "compaction_entries >= 2"),
        ]
        for ok, rule in rules:
            if not ok:
                raise ValueError(f"RaftTimings: {rule} does not hold in {self}")

    def conf(self, **more: Any) -> Any:
        """The pysyncobj ``SyncObjConf`` of these timings (plus ``more``)."""
        return SyncObjConf(
            raftMinTimeout=self.raft_min_timeout,
            raftMaxTimeout=self.raft_max_timeout,
            appendEntriesPeriod=self.append_entries_period,
            leaderFallbackTimeout=self.leader_fallback_timeout,
            autoTickPeriod=self.tick_period,
            connectionRetryTime=self.probe_period,
            connectionTimeout=self.silence_timeout,
            logCompactionMinEntries=self.compaction_entries,
            logCompactionMinTime=self.compaction_period,
            **more,
        )


_FAILURES = {
    FAIL_REASON.QUEUE_FULL: "the command queue is full",
    FAIL_REASON.MISSING_LEADER: "there is no leader",
    FAIL_REASON.DISCARDED: "a new leader discarded it",
    FAIL_REASON.NOT_LEADER: "the leader changed (outcome unknown)",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before it committed (outcome unknown)",
    FAIL_REASON.REQUEST_DENIED: "the leader refused it (a membership change is pending)",
    FAIL_REASON.UNKNOWN_OUTCOME: "its outcome is unknown",
}


def _check_node_id(what: str, node_id: object) -> str:
    if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
        raise InvalidInput(f"{what} must be a node id (40 lowercase hex digits), not {node_id!r}")
    return node_id


# ------------------------------------------------------------------------------ machine


class ControlMachine(SyncObj):  # type: ignore[misc]
    """One voter of the control plane (see the module docstring)."""

    def __init__(
        self,
        self_id: str,
        voters: Sequence[str],
        send: SendFn,
        *,
        journal_dir: Path | None = None,
        timings: RaftTimings = RaftTimings(),
    ) -> None:
        _check_node_id("self_id", self_id)
        ids = [_check_node_id("voters[]", v) for v in voters]
        if self_id not in ids or len(set(ids)) != len(ids):
            raise InvalidInput(f"voters must list {self_id} once, and no voter twice: {ids}")
        self._control = ControlState()
        self._control_lock = threading.Lock()
        self._applied_listeners: list[Callable[[Applied], None]] = []
        self._restored_listeners: list[Callable[[tuple[StreamState, ...]], None]] = []
        self._pending: dict[Future[Any], float] = {}
        self._closed = False
        self._timings = timings
        self._factory = TransportFactory(send)
        self._tmpdir: str | None = None
        self._tick_thread: threading.Thread | None = None
        if journal_dir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="fedstream-raft-")
            journal, dump = None, os.path.join(self._tmpdir, "raft.dump")
        else:
            journal_dir.mkdir(parents=True, exist_ok=True)
            journal, dump = str(journal_dir / "raft.journal"), str(journal_dir / "raft.dump")
        conf = timings.conf(
            dynamicMembershipChange=True,
            commandsWaitLeader=False,
            journalFile=journal,
            fullDumpFile=dump,
            serializer=self._write_dump,
            deserializer=self._read_dump,
            useFork=False,
        )
        others = [Node(v) for v in ids if v != self_id]
        super().__init__(
            Node(self_id), others, conf=conf, nodeClass=Node, transportClass=self._factory
        )
        self.addOnTickCallback(self._expire)

    # ----------------------------------------------------------------- links

    def deliver(self, src: str, data: bytes) -> None:
        """A frame from voter ``src`` (any thread; never raises)."""
        transport = self._factory.transport
        if transport is not None:
            transport.deliver(src, data)

    def connected(self) -> tuple[str, ...]:
        """The voters this one currently counts as connected."""
        transport = self._factory.transport
        return () if transport is None else transport.connected()

    # ----------------------------------------------------------------- writes

    def submit(self, command: Command, *, timeout: float | None = None) -> Future[Applied]:
        """Replicate ``command``; the future holds its :class:`Applied` once committed and
        applied here, or fails with :class:`Unavailable` (retriable)."""
        frame = command_to_wire(command)
        future: Future[Applied] = Future()
        if self._watch(future, timeout):
            self._apply_frame(frame, callback=lambda res, err: self._settle(future, res, err))
            self._wake()
        return future

    def add_voter(self, node_id: str, *, timeout: float | None = None) -> Future[None]:
        """Make ``node_id`` a voter (done at once if it is one)."""
        _check_node_id("add_voter", node_id)
        future: Future[None] = Future()
        if node_id in self.voters():
            future.set_result(None)
        elif self._watch(future, timeout):
            done = lambda res, err: self._settle(future, None, err)  # noqa: E731
            self.addNodeToCluster(Node(node_id), callback=done)
            self._wake()
        return future

    def remove_voter(self, node_id: str, *, timeout: float | None = None) -> Future[None]:
        """Remove voter ``node_id`` (done at once if it is none); ask another voter to remove
        this one."""
        _check_node_id("remove_voter", node_id)
        if node_id == str(self.selfNode.id):
            raise InvalidInput(f"voter {node_id} cannot remove itself; ask another voter")
        future: Future[None] = Future()
        if node_id not in self.voters():
            future.set_result(None)
        elif self._watch(future, timeout):
            done = lambda res, err: self._settle(future, None, err)  # noqa: E731
            self.removeNodeFromCluster(Node(node_id), callback=done)
            self._wake()
        return future

    # ----------------------------------------------------------------- reads

    def snapshot(self) -> tuple[StreamState, ...]:
        with self._control_lock:
            return self._control.snapshot()

    def stream(self, name: str) -> StreamState | None:
        with self._control_lock:
            return self._control.stream(name)

    def applied_count(self) -> int:
        """Commands applied here (no-ops included), as ControlState counts them."""
        with self._control_lock:
            return self._control.applied

    def is_leader(self) -> bool:
        """Whether this voter thinks it leads (an isolated old leader may, briefly)."""
        return bool(self._isLeader())

    def leader(self) -> str | None:
        node = self._getLeader()
        return None if node is None else str(node.id)

    def voters(self) -> tuple[str, ...]:
        return tuple(sorted({str(self.selfNode.id)} | {str(n.id) for n in self.otherNodes}))

    # ------------------------------------------------------------- listeners

    def on_applied(self, callback: Callable[[Applied], None]) -> None:
        """Call ``callback(applied)`` on the tick thread after each command is applied."""
        self._applied_listeners.append(callback)

    def on_restored(self, callback: Callable[[tuple[StreamState, ...]], None]) -> None:
        """Call ``callback(streams)`` on the tick thread when a snapshot replaces the state."""
        self._restored_listeners.append(callback)

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Stop Raft here and wait (at most ``close_timeout``) for the tick thread to end."""
        with self._control_lock:
            if self._closed:
                return
            self._closed = True
        self.destroy()
        self._wake()
        deadline = time.monotonic() + self._timings.close_timeout
        if threading.current_thread() is not self._tick_thread:
            while self.tick_thread_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.tick_thread_alive():
            log.warning("raft: the tick thread of %s did not stop in time", self.selfNode.id)
        with self._control_lock:
            pending, self._pending = list(self._pending), {}
        for future in pending:
            self._fail(future, Unavailable("the control-plane voter is closed"))
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # ----------------------------------------------------- replicated method

    @replicated  # type: ignore[untyped-decorator]
    def _apply_frame(self, frame: bytes) -> Applied | None:
        try:
            command = command_from_wire(frame)
        except InvalidInput as exc:  # same on every voter: skipped everywhere
            log.error("raft: skipped a log entry that is not a command: %s", exc)
            return None
        with self._control_lock:
            applied = self._control.apply(command)
        for listener in list(self._applied_listeners):
            try:
                listener(applied)
            except Exception:
                log.exception("raft: an on_applied listener failed")
        return applied

    # ------------------------------------------------------------- futures

    def _wake(self) -> None:
        transport = self._factory.transport
        if transport is not None:
            transport.wake()

    def _watch(self, future: Future[Any], timeout: float | None) -> bool:
        wait = self._timings.submit_timeout if timeout is None else timeout
        with self._control_lock:
            if not self._closed:
                self._pending[future] = time.monotonic() + wait
                return True
        self._fail(future, Unavailable("the control-plane voter is closed"))
        return False

    def _settle(self, future: Future[Any], result: Any, err: int) -> None:
        with self._control_lock:
            self._pending.pop(future, None)
        if err != FAIL_REASON.SUCCESS:
            reason = _FAILURES.get(err, f"pysyncobj failure {err}")
            self._fail(future, Unavailable(f"control plane: {reason}", reason=err))
            return
        with contextlib.suppress(InvalidStateError):  # timed out already
            future.set_result(result)

    @staticmethod
    def _fail(future: Future[Any], error: Exception) -> None:
        with contextlib.suppress(InvalidStateError):
            future.set_exception(error)

    def _expire(self) -> None:
        self._tick_thread = threading.current_thread()
        now = time.monotonic()
        with self._control_lock:
            expired = [f for f, deadline in self._pending.items() if deadline <= now]
            for future in expired:
                del self._pending[future]
        for future in expired:
            message = "control plane: no answer in time (the command may still be applied)"
            self._fail(future, Unavailable(message))

    # ------------------------------------------------------------- snapshots

    def _write_dump(self, path: str, raft: tuple[Any, Any, Any]) -> None:
        last, prev, cluster = raft
        with self._control_lock:
            streams = [stream_to_wire(s) for s in self._control.snapshot()]
            applied = self._control.applied
        body = {
            "format": DUMP_FORMAT,
            "streams": streams,
            "applied": applied,
            "last": list(last),
            "prev": list(prev),
            "cluster": sorted(str(node.id) for node in cluster),
        }
        with open(path, "wb") as f:
            f.write(msgpack.packb(body, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())

    def _read_dump(self, path: str) -> tuple[Any, Any, list[Node]]:
        with open(path, "rb") as f:
            body = msgpack.unpackb(f.read(), raw=False, strict_map_key=True, use_list=True)
        if not isinstance(body, dict) or body.get("format") != DUMP_FORMAT:
            raise InvalidInput(f"{path} is not a {DUMP_FORMAT} dump")
        streams = body.get("streams")
        if not isinstance(streams, list):
            raise InvalidInput(f"{path}: streams must be a list")
        states = [stream_from_wire(s) for s in streams]
        if len({s.name for s in states}) != len(states):
            raise InvalidInput(f"{path}: a stream appears twice")
        applied = _wire_int(f"{path}: applied", body.get("applied"))
        last, prev = _dump_entry(path, body.get("last")), _dump_entry(path, body.get("prev"))
        members = _list(path, body.get("cluster"))
        cluster = [Node(_check_node_id(f"{path}: cluster[]", n)) for n in members]
        state = state_from_streams(states, applied)
        with self._control_lock:
            self._control = state
        snapshot = state.snapshot()
        for listener in list(self._restored_listeners):
            try:
                listener(snapshot)
            except Exception:
                log.exception("raft: an on_restored listener failed")
        return last, prev, cluster


def _list(path: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(f"{path}: expected a list, not {type(value).__name__}")
    return value


def _dump_entry(path: str, value: object) -> tuple[bytes, int, int]:
    entry = _list(path, value)
    if len(entry) != 3 or not isinstance(entry[0], bytes):
        raise InvalidInput(f"{path}: a log entry must be [command, index, term]")
    return entry[0], _wire_int(f"{path}: index", entry[1]), _wire_int(f"{path}: term", entry[2])
