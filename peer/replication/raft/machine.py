"""The control plane's Raft driver: :class:`ControlMachine`, a pysyncobj ``SyncObj`` whose
replicated state is a :class:`~peer.replication.control.ControlState`.

Theory of operation
-------------------
Each voter peer runs one ``ControlMachine``. pysyncobj (Raft) runs on its own thread (the tick
thread) and talks to the other voters through
:class:`~peer.replication.raft.link_transport.LinkTransport`: frames go out by the ``send`` callable
the peer gives, and come in by :meth:`deliver`.

Commands. :meth:`ControlMachine.submit` encodes a command with
:func:`~peer.replication.raft.codec.command_to_wire` (a msgpack map, the only bytes of ours in the
Raft log) and calls the one ``@replicated`` method, ``_apply_frame``, with it. pysyncobj forwards it
to the leader, which appends it to the log; once committed, every voter (the submitter included)
runs ``_apply_frame`` in log order on its tick thread: it decodes the frame with
:func:`~peer.replication.raft.codec.command_from_wire` and applies it to its ``ControlState``
(deterministic, so every voter reaches the same state), then tells the ``on_applied`` listeners. The
submitter's future resolves with that :class:`Applied`, or fails with
:class:`~peer.errors.Unavailable` (retriable) when there is no leader, the leader changed before the
entry committed, or no answer came within ``submit_timeout`` (then the command may still be applied
later: commands are conditional on an epoch or version, so a retry is safe). A ``CreateStream``
without an anchor leaves ``anchor`` out of its map (older voters know no such field).

Snapshots. pysyncobj compacts its log by dumping the state machine, and sends the dump to a
voter too far behind. By default it pickles the object's attributes; here its ``serializer`` /
``deserializer`` seam writes a msgpack file instead (``_write_dump`` / ``_read_dump``): the
streams as plain lists (:func:`~peer.replication.raft.codec.stream_to_wire`), plus the two log
entries and the member list pysyncobj needs. A dump read back (at start, or sent by the leader) is
checked field by field, replaces the state at once and is announced to the ``on_restored``
listeners. That seam requires a dump file, so without ``journal_dir`` the dump lives in a private
temporary directory, removed by :meth:`close`.

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
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Any

import msgpack
from pysyncobj import FAIL_REASON, SyncObj, replicated
from pysyncobj.node import Node

from peer.errors import InvalidInput, Unavailable
from peer.replication.control import Applied, BurstState, Command, ControlState, StreamState
from peer.replication.raft.codec import (
    DUMP_FORMAT,
    burst_from_wire,
    burst_to_wire,
    check_node_id,
    command_from_wire,
    command_to_wire,
    dump_entry,
    dump_list,
    state_from_streams,
    stream_from_wire,
    stream_to_wire,
    wire_int,
)
from peer.replication.raft.link_transport import SendFn, TransportFactory
from peer.replication.raft.timings import DEFAULT_TIMINGS, RaftTimings

__all__ = ["ControlMachine"]

log = logging.getLogger(__name__)

_FAILURES = {
    FAIL_REASON.QUEUE_FULL: "the command queue is full",
    FAIL_REASON.MISSING_LEADER: "there is no leader",
    FAIL_REASON.DISCARDED: "a new leader discarded it",
    FAIL_REASON.NOT_LEADER: "the leader changed (outcome unknown)",
    FAIL_REASON.LEADER_CHANGED: "the leader changed before it committed (outcome unknown)",
    FAIL_REASON.REQUEST_DENIED: "the leader refused it (a membership change is pending)",
    FAIL_REASON.UNKNOWN_OUTCOME: "its outcome is unknown",
}


class ControlMachine(SyncObj):  # type: ignore[misc]
    """One voter of the control plane (see the module docstring)."""

    def __init__(
        self,
        self_id: str,
        voters: Sequence[str],
        send: SendFn,
        *,
        journal_dir: Path | None = None,
        timings: RaftTimings = DEFAULT_TIMINGS,
    ) -> None:
        check_node_id("self_id", self_id)
        ids = [check_node_id("voters[]", v) for v in voters]
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
        check_node_id("add_voter", node_id)
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
        check_node_id("remove_voter", node_id)
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

    def burst(self, participant: str) -> BurstState | None:
        with self._control_lock:
            return self._control.burst(participant)

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
            bursts = [burst_to_wire(b) for b in self._control.bursts()]
            applied = self._control.applied
        body = {
            "format": DUMP_FORMAT,
            "streams": streams,
            "bursts": bursts,
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
        bursts = [burst_from_wire(b) for b in dump_list(path, body.get("bursts", []))]
        if len({b.participant for b in bursts}) != len(bursts):
            raise InvalidInput(f"{path}: a participant's burst state appears twice")
        applied = wire_int(f"{path}: applied", body.get("applied"))
        last, prev = dump_entry(path, body.get("last")), dump_entry(path, body.get("prev"))
        members = dump_list(path, body.get("cluster"))
        cluster = [Node(check_node_id(f"{path}: cluster[]", n)) for n in members]
        state = state_from_streams(states, applied, bursts)
        with self._control_lock:
            self._control = state
        snapshot = state.snapshot()
        for listener in list(self._restored_listeners):
            try:
                listener(snapshot)
            except Exception:
                log.exception("raft: an on_restored listener failed")
        return last, prev, cluster
