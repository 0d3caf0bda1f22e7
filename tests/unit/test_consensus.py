"""peer.replication.raft without a cluster: the commands' wire form, the transport's frames (every
message type pysyncobj sends, and hostile ones), its connection reports, and the snapshot's
plain form. No JVM, no sockets; the transport runs on a stub SyncObj ticked by the test."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.node import Node
from pysyncobj.poller import createPoller

from peer.errors import InvalidInput
from peer.replication.control import (
    Command,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    SetReplicas,
    ShrinkIsr,
    StreamState,
)
from peer.replication.raft import (
    MAX_COMMAND_BYTES,
    LinkTransport,
    MessageError,
    RaftTimings,
    check_log_command,
    command_from_wire,
    command_to_wire,
    decode_message,
    encode_message,
    state_from_streams,
    stream_from_wire,
    stream_to_wire,
)

A, B, C = "a" * 40, "b" * 40, "c" * 40

COMMANDS: list[Command] = [
    CreateStream("s", (A, B, C), 2),
    Elect("s", 3, B),
    ShrinkIsr("s", 2, 7, C),
    ExpandIsr("s", 2, 8, C),
    SetReplicas("s", 9, (A, B)),
    CreateStream("t", (B, A), 1, "s"),
    DropStream("s"),
]


def pack(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return data


# ------------------------------------------------------------------------------ commands


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_round_trips_through_its_wire_form(command: Command) -> None:
    frame = command_to_wire(command)
    assert command_from_wire(frame) == command
    assert msgpack.unpackb(frame)["type"] in {
        "create_stream",
        "elect",
        "shrink_isr",
        "expand_isr",
        "set_replicas",
        "drop_stream",
    }


GOOD = {"type": "elect", "name": "s", "epoch": 3, "primary": B}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({**GOOD, "epoch": "3"}, "elect.epoch must be an int"),
        ({**GOOD, "epoch": True}, "elect.epoch must be an int"),
        ({**GOOD, "epoch": 2**64 - 1}, "elect.epoch must be an int of at most 63 bits"),
        ({**GOOD, "epoch": 0}, "Elect.epoch must be an int >= 1"),
        ({**GOOD, "primary": 7}, "elect.primary must be a str"),
        ({k: v for k, v in GOOD.items() if k != "primary"}, "missing field 'primary'"),
        ({**GOOD, "extra": 1}, "unexpected field 'extra'"),
        ({**GOOD, "type": "drop_everything"}, "unknown command type 'drop_everything'"),
        ({"name": "s"}, "unknown command type None"),
        ([1, 2, 3], "must be a map"),
        ({"type": "set_replicas", "name": "s", "version": 1, "replicas": A}, "list of str"),
        ({"type": "set_replicas", "name": "s", "version": 1, "replicas": [A, 5]}, "replicas[1]"),
        ({"type": "set_replicas", "name": "s", "version": 1, "replicas": [A, A]}, "twice"),
        ({"type": "create_stream", "name": "", "replicas": [A], "min_insync": 1}, "name"),
    ],
)
def test_a_wrong_command_frame_is_refused_naming_the_field(body: Any, named: str) -> None:
    with pytest.raises(InvalidInput) as err:
        command_from_wire(pack(body))
    assert named in str(err.value)


def test_garbage_and_oversized_command_frames_are_refused() -> None:
    with pytest.raises(InvalidInput, match="not msgpack"):
        command_from_wire(b"\xc1\xc1\xc1")
    with pytest.raises(InvalidInput, match="must be bytes"):
        command_from_wire("elect")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="at most"):
        command_from_wire(b"\x90" * (MAX_COMMAND_BYTES + 1))
    many = tuple(f"{i:040x}" for i in range(MAX_COMMAND_BYTES // 40))
    with pytest.raises(InvalidInput, match="bytes encoded"):
        command_to_wire(SetReplicas("s", 1, many))
    with pytest.raises(InvalidInput, match="not a control-plane command"):
        command_to_wire("elect")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_command_or_refused_with_invalid_input(data: bytes) -> None:
    try:
        command = command_from_wire(data)
    except InvalidInput:
        return
    assert command_from_wire(command_to_wire(command)) == command


# ----------------------------------------------------------------- pysyncobj's messages


def entry(kind: int, body: Any = None) -> bytes:
    return bytes([kind]) + (b"" if body is None else pickle.dumps(body, 2))


# The entries pysyncobj writes: a no-op, a call of the replicated method, a membership change,
# a code version.
ENTRIES = [
    (entry(1), 1, 0),
    (entry(0, (0, (command_to_wire(COMMANDS[0]),))), 2, 1),
    (entry(2, ["add", C, Node(C)]), 3, 1),
    (entry(3, 1), 4, 1),
]

HEARTBEAT = {"type": "append_entries", "term": 3, "commit_index": 2}
MESSAGES: list[dict[str, Any]] = [
    {"type": "request_vote", "term": 3, "last_log_index": 9, "last_log_term": 2},
    {"type": "response_vote", "term": 3},
    {"type": "timeout_now", "term": 3},
    {
        "type": "append_entries",
        "term": 3,
        "commit_index": 2,
        "entries": ENTRIES,
        "prevLogIdx": 0,
        "prevLogTerm": 0,
    },
    {
        "type": "append_entries",
        "term": 3,
        "commit_index": 2,
        "prevLogIdx": None,
        "prevLogTerm": None,
    },
    {"type": "append_entries", "term": 3, "commit_index": 2, "serialized": (b"dump", True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 2, "serialized": None},
    {"type": "next_node_idx", "next_node_idx": 5, "reset": True, "success": False},
    {"type": "apply_command", "command": ENTRIES[1][0], "request_id": 4},
    {"type": "apply_command", "command": ENTRIES[1][0]},
    {"type": "apply_command_response", "request_id": 4, "log_idx": 7, "log_term": 3},
    {"type": "apply_command_response", "request_id": 4, "error": 4},
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: str(m["type"]))
def test_every_message_pysyncobj_sends_round_trips_with_its_tuples(
    message: dict[str, Any],
) -> None:
    decoded = decode_message(encode_message(message))
    assert decoded == message
    for got in decoded.get("entries", []):
        assert isinstance(got, tuple)  # pysyncobj compares entries with its journal's tuples
    if decoded.get("serialized") is not None:
        assert isinstance(decoded["serialized"], tuple)


def test_a_failed_snapshot_read_is_passed_on_as_no_chunk() -> None:
    message = {"type": "append_entries", "term": 1, "commit_index": 1, "serialized": False}
    assert decode_message(encode_message(message))["serialized"] is None


class Boom:
    ran = False

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_boom, ())


def _boom() -> None:
    Boom.ran = True


VOTE = {"type": "request_vote", "term": 3, "last_log_index": 9, "last_log_term": 2}
APPEND = {"type": "append_entries", "term": 3, "commit_index": 2, "prevLogIdx": 1}


@pytest.mark.parametrize(
    ("message", "named"),
    [
        ({"type": "shutdown"}, "unknown message type 'shutdown'"),
        ({"term": 1}, "unknown message type None"),
        ({k: v for k, v in VOTE.items() if k != "term"}, "request_vote: missing field 'term'"),
        ({**VOTE, "term": "3"}, "request_vote.term must be an int"),
        ({**VOTE, "term": False}, "request_vote.term must be an int"),
        ({**VOTE, "term": -1}, "request_vote.term must be an int in [0, 2**63)"),
        ({**VOTE, "term": 2**64 - 1}, "request_vote.term must be an int in [0, 2**63)"),
        ({**VOTE, "bonus": 1}, "unexpected field 'bonus'"),
        ({**APPEND, "prevLogTerm": 1, "entries": "x"}, "entries must be a list"),
        ({**APPEND, "prevLogTerm": 1, "entries": [[b"\x01", 1]]}, "[command, index, term]"),
        ({**APPEND, "prevLogTerm": 1, "entries": [["x", 1, 1]]}, "command must be bytes"),
        (APPEND, "prevLogIdx and prevLogTerm go together"),
        ({**APPEND, "prevLogTerm": 1, "transmission": "start", "data": b"x"}, "chunked"),
        ({**APPEND, "prevLogTerm": 1, "serialized": [b"x", 1, True]}, "is_first must be a bool"),
        ({"type": "apply_command", "command": entry(5, 1)}, "unknown type 5"),
        ({"type": "apply_command", "command": entry(1, 1)}, "a no-op log entry has a body"),
        ({"type": "apply_command", "command": b""}, "a log entry is empty"),
        ({"type": "apply_command", "command": b"\x00garbage"}, "does not unpickle"),
        ({"type": "apply_command", "command": entry(0, Boom())}, "refers to tests.unit"),
        ({"type": "apply_command", "command": entry(0, "hi")}, "wrong shape"),
        ({"type": "apply_command", "command": entry(2, ["add", C, Node(A)])}, "wrong shape"),
        ({"type": "apply_command", "command": entry(3, True)}, "wrong shape"),
        ({"type": "apply_command_response", "request_id": 1, "log_idx": 2}, "log_idx and"),
    ],
)
def test_a_hostile_message_is_refused_naming_what_is_wrong(
    message: dict[str, Any], named: str
) -> None:
    with pytest.raises(MessageError) as err:
        decode_message(pack(message))
    assert named in str(err.value)
    assert not Boom.ran  # refused before any code of the pickle ran


def test_frames_that_are_not_maps_of_str_are_refused() -> None:
    for frame, named in [
        (b"\xc1", "not a msgpack frame"),
        (pack([1, 2]), "must be a map"),
        (pack({1: "x"}), "map key"),
        (b"\x82\xa4type\xa5hello\xa4type\xa5hello", "repeats a key"),
    ]:
        with pytest.raises(MessageError, match=named):
            decode_message(frame)
    with pytest.raises(MessageError, match="must be bytes"):
        decode_message("hello")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_message_or_a_message_error(data: bytes) -> None:
    try:
        message = decode_message(data)
    except MessageError:
        return
    assert message["type"] in {"hello", "request_vote", "response_vote", "timeout_now"}


def test_check_log_command_accepts_what_pysyncobj_writes() -> None:
    for command, _, _ in ENTRIES:
        check_log_command(command)


# ------------------------------------------------------------------------------ transport


class StubSync:
    """What LinkTransport uses of a SyncObj: the poller, tick callbacks and two timeouts."""

    def __init__(self, silence: float = 60.0, probe: float = 60.0) -> None:
        self._poller = createPoller("auto")
        self.conf = SimpleNamespace(connectionTimeout=silence, connectionRetryTime=probe)
        self.callbacks: list[Any] = []

    def addOnTickCallback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def removeOnTickCallback(self, callback: Any) -> None:
        self.callbacks.remove(callback)

    def tick(self, wait: float = 0.0) -> None:
        for callback in list(self.callbacks):
            callback()
        self._poller.poll(wait)


class Harness:
    def __init__(self, send_ok: bool = True, silence: float = 60.0, probe: float = 60.0) -> None:
        self.sync = StubSync(silence, probe)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.events: list[str] = []
        self.send_ok = send_ok
        self.t = LinkTransport(self.sync, Node(A), [Node(B), Node(C)], self.send)
        self.t.setOnMessageReceivedCallback(lambda n, m: self.got.append((n.id, m)))
        self.t.setOnNodeConnectedCallback(lambda n: self.events.append(f"+{n.id[0]}"))
        self.t.setOnNodeDisconnectedCallback(lambda n: self.events.append(f"-{n.id[0]}"))

    def send(self, dst: str, frame: bytes) -> bool:
        self.sent.append((dst, decode_message(frame)))
        return self.send_ok


VOTE_FRAME = encode_message(VOTE)


def test_a_frame_delivered_from_another_thread_wakes_the_tick_thread() -> None:
    h = Harness()
    thread = threading.Thread(target=h.t.deliver, args=(B, encode_message(MESSAGES[3])))
    started = time.monotonic()
    thread.start()
    h.sync._poller.poll(5.0)  # returns once the wake pipe is written, and drains there
    thread.join(timeout=5)
    assert time.monotonic() - started < 2.5
    assert h.got == [(B, MESSAGES[3])]
    h.t.destroy()


def test_bad_frames_and_strangers_are_dropped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    with caplog.at_level(logging.INFO, logger="peer.replication.raft.link_transport"):
        h.t.deliver("d" * 40, VOTE_FRAME)  # not a member
        h.t.deliver(B, b"\xc1garbage")
        h.t.deliver(B, pack({**VOTE, "term": "x"}))
        h.t.deliver(C, VOTE_FRAME)
        h.sync.tick()
    assert h.got == [(C, VOTE)]
    assert "not a member" in caplog.text
    assert "not a msgpack frame" in caplog.text
    assert "request_vote.term must be an int" in caplog.text
    h.t.destroy()


def test_pysyncobj_failing_on_one_message_does_not_stop_the_next() -> None:
    h = Harness()

    def picky(node: Node, message: dict[str, Any]) -> None:
        if message["term"] == 3:
            raise KeyError("boom")
        h.got.append((node.id, message))

    h.t.setOnMessageReceivedCallback(picky)
    h.t.deliver(B, VOTE_FRAME)
    h.t.deliver(B, encode_message({**VOTE, "term": 4}))
    h.sync.tick()
    assert h.got == [(B, {**VOTE, "term": 4})]
    h.t.destroy()


def test_members_are_probed_and_reported_connected_once_a_send_succeeds() -> None:
    h = Harness()
    assert h.events == []
    h.sync.tick()
    assert sorted(h.sent, key=lambda s: s[0]) == [(B, {"type": "hello"}), (C, {"type": "hello"})]
    assert sorted(h.events) == ["+b", "+c"]
    assert h.t.connected() == (B, C)
    h.t.deliver(B, encode_message({"type": "hello"}))
    h.sync.tick()
    assert h.got == []  # hellos stay in the transport
    h.t.destroy()


def test_a_failed_send_reports_the_member_disconnected_at_once() -> None:
    h = Harness()
    h.sync.tick()
    h.send_ok = False
    assert h.t.send(Node(B), {"type": "response_vote", "term": 1}) is False
    assert h.events[-1] == "-b"
    assert h.t.connected() == (C,)
    h.t.deliver(B, VOTE_FRAME)  # it is heard from again
    h.sync.tick()
    assert h.events[-1] == "+b"
    assert h.t.send(Node("d" * 40), {"type": "response_vote", "term": 1}) is False
    h.t.destroy()


def test_a_silent_member_is_reported_disconnected_and_probed() -> None:
    h = Harness(silence=0.3, probe=0.1)
    h.sync.tick()
    assert h.t.connected() == (B, C)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and h.t.connected():
        h.t.deliver(C, encode_message({"type": "hello"}))  # C keeps talking, B is silent
        h.sync.tick(0.05)
        if h.t.connected() == (C,):
            break
    assert h.t.connected() == (C,)
    assert "-b" in h.events
    probes = [dst for dst, m in h.sent if m == {"type": "hello"} and dst == B]
    assert len(probes) >= 2  # B still gets a hello every probe period
    h.t.deliver(B, VOTE_FRAME)
    h.sync.tick()
    assert h.t.connected() == (B, C)
    h.t.destroy()


def test_membership_changes_add_and_forget_members() -> None:
    h = Harness()
    h.sync.tick()
    h.t.dropNode(Node(B))
    assert h.events[-1] == "-b"
    h.t.deliver(B, VOTE_FRAME)
    h.t.addNode(Node("d" * 40))
    h.t.deliver("d" * 40, VOTE_FRAME)
    h.sync.tick()
    assert h.got == [("d" * 40, VOTE)]
    h.t.destroy()
    h.t.deliver(C, VOTE_FRAME)  # after destroy: no error, nothing delivered
    h.t.wake()
    assert h.sync.callbacks == []


# ---------------------------------------------------------------- snapshot, timings


def test_a_stream_state_round_trips_and_a_wrong_one_is_refused() -> None:
    stream = StreamState("s", 2, B, (A, B, C), (B, C), 2, 5)
    assert stream_from_wire(stream_to_wire(stream)) == stream
    state = state_from_streams([stream], applied=9)
    assert state.snapshot() == (stream,)
    assert state.applied == 9
    for wrong, named in [
        ([*stream_to_wire(stream)[:6]], "list of 7"),
        (["s", 2, A, [A, B, C], [B, C], 2, 5], "primary must be in sync"),
        (["s", 2, B, [A, B], [B, C], 2, 5], "the ISR in replicas"),
        (["s", 0, B, [A, B, C], [B, C], 2, 5], "below 1"),
        (["s", 2, B, [A, A], [A], 2, 5], "distinct"),
        (["s", 2, B, [A, B, C], [B, C], 2, "5"], "version must be an int"),
    ]:
        with pytest.raises(InvalidInput, match=named):
            stream_from_wire(wrong)


def test_raft_timings_refuse_values_pysyncobj_would_misuse() -> None:
    assert RaftTimings().conf().raftMaxTimeout == 0.9
    cases: list[tuple[dict[str, Any], str]] = [
        ({"raft_min_timeout": 0.1}, "raft_min_timeout > 3 x"),
        ({"raft_max_timeout": 0.3}, "raft_max_timeout > raft_min_timeout"),
        ({"silence_timeout": 0.5}, "silence_timeout >= raft_max"),
        ({"probe_period": 2.0}, "probe_period < silence_timeout"),
        ({"tick_period": 0}, "tick_period must be a number > 0"),
        ({"submit_timeout": True}, "submit_timeout must be a number"),
    ]
    for kwargs, named in cases:
        with pytest.raises(ValueError, match=named):
            RaftTimings(**kwargs)
