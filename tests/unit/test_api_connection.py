"""peer.protocol.api_connection: the client API connection's state machines, driven directly
(no asyncio, no sockets).

A :class:`Pair` joins a ClientConnection and a ServerConnection by frames (each one encoded by
one side and decoded by :class:`~overlay.wire.FrameDecoder` for the other, as h11's
ConnectionPair does); the test plays the service. The fuzz tests hold both sides to the
contract "a frame from the other side is accepted or raises RemoteProtocolError, never anything
else". tests/unit/test_api_connection_model.py runs Hypothesis sequences of events through a
Pair against a model.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import peer.protocol.api_connection as api_connection
import peer.protocol.api_events as api_events
from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.wire import FrameDecoder, encode_frame
from peer.errors import FedstreamError, InvalidInput, NotFound, Unavailable
from peer.protocol.api import (
    MAX_CREDIT,
    BatchFrame,
    CreateQuery,
    CreateSchema,
    CreateStream,
    Credit,
    End,
    ErrorReply,
    Hello,
    Lookup,
    Ok,
    Push,
    Request,
    SetQueryStatus,
    Status,
    Subscribe,
    Unsubscribe,
)
from peer.protocol.api_connection import ClientConnection, ServerConnection, State
from peer.protocol.api_events import (
    BadCredit,
    BadRequest,
    BatchReceived,
    ClientEvent,
    ConnectionClosed,
    CreditGranted,
    Farewell,
    Ignored,
    RawRequest,
    Replied,
    RequestFailed,
    RequestReceived,
    ServerEvent,
    Subscribed,
    SubscriptionEnded,
    Unsubscribed,
)
from peer.protocol.replies import HelloReply, LookupReply, StatusReply

COLUMNS = {"x": [1, 2]}


def decode(data: bytes) -> dict[str, Any]:
    decoder = FrameDecoder(1 << 30)
    decoder.receive_data(data)
    frame = decoder.next_frame()
    assert frame is not None and decoder.next_frame() is None
    return frame


class Pair:
    """A client and a server state machine joined by frames."""

    def __init__(self, **server: Any) -> None:
        self.client = ClientConnection()
        self.server = ServerConnection(**server)

    def request(self, request: Request | RawRequest) -> tuple[int, ServerEvent]:
        rid, data = self.client.send_request(request)
        return rid, self.server.receive(decode(data))

    def reply(self, message: api_events.ServerMessage) -> ClientEvent:
        return self.client.receive(decode(self.server.send(message)))

    def grant(self, credit: Credit) -> ServerEvent:
        return self.server.receive(decode(self.client.send_credit(credit)))

    def subscribe(self, credit: int | None = 2, stream: str = "s") -> int:
        request = Subscribe(stream, "latest", credit)
        rid, event = self.request(request)
        assert event == RequestReceived(rid, request)
        sid = self.server.open_subscription(rid, request)
        assert self.reply(Subscribed(rid, sid, stream)) == Replied(
            rid, {"subscription": sid, "stream": stream}
        )
        return sid

    def batch(self, sid: int, offset: int = 0) -> ClientEvent:
        [part] = self.server.batch(sid, offset, COLUMNS)
        return self.client.receive(decode(self.server.send(part)))


# -- requests, replies, the handshake ---------------------------------------------------------


def test_hello_sets_the_frame_limit_for_later_requests() -> None:
    pair = Pair(max_frame_bytes=4096, participant="acme")
    rid, event = pair.request(Hello("py", 1))
    assert event == RequestReceived(rid, Hello("py", 1))
    info = HelloReply("fedstream", 1, 4096, "acme")
    assert pair.server.hello_result == info
    assert pair.reply(Ok(rid, pair.server.hello_result.to_wire())) == Replied(rid, info)
    assert (pair.client.server_info, pair.client.max_frame_bytes) == (info, 4096)
    with pytest.raises(LocalProtocolError, match="exceeds the limit"):
        pair.client.send_request(Push("s", {"columns": {"x": ["y" * 5000]}}))
    assert pair.client.in_flight == 0  # nothing was sent


def test_replies_in_any_order_each_exactly_once() -> None:
    pair = Pair()
    first, _ = pair.request(Status())
    second, _ = pair.request(Lookup("people"))
    assert pair.server.in_flight == 2
    found = LookupReply("stream", "people")
    assert pair.reply(Ok(second, found.to_wire())) == Replied(second, found)
    failed = pair.reply(ErrorReply.of(first, NotFound("no peer", peer="p")))
    assert isinstance(failed, RequestFailed) and failed.id == first
    assert isinstance(failed.error, NotFound) and failed.error.details == {"peer": "p"}
    with pytest.raises(LocalProtocolError, match="owed none"):
        pair.server.send(Ok(first, {}))
    assert (pair.server.in_flight, pair.client.in_flight) == (0, 0)


def test_a_reply_that_does_not_fit_changes_nothing() -> None:
    pair = Pair(max_frame_bytes=1024)
    rid, _ = pair.request(Status())
    with pytest.raises(LocalProtocolError, match="exceeds the limit"):
        pair.server.send(Ok(rid, {"blob": "x" * 2000}))
    assert pair.server.in_flight == 1
    event = pair.reply(ErrorReply.internal(rid))
    assert isinstance(event, RequestFailed) and event.id == rid
    assert type(event.error) is FedstreamError and event.error.code == "internal"


def test_the_server_reads_no_further_with_max_in_flight_unanswered() -> None:
    pair = Pair(max_in_flight=2)
    pair.request(Status())
    bad, event = pair.request(RawRequest("frobnicate", {}))
    assert isinstance(event, BadRequest) and event.id == bad
    assert event.error.code == "invalid" and event.error.message == "unknown op 'frobnicate'"
    assert pair.server.reading_paused
    _, data = pair.client.send_request(Status())
    with pytest.raises(LocalProtocolError, match="read no further"):
        pair.server.receive(decode(data))
    pair.reply(ErrorReply.of(bad, event.error))
    assert not pair.server.reading_paused
    assert isinstance(pair.server.receive(decode(data)), RequestReceived)
    assert pair.server.in_flight == 2


def test_frames_answered_by_nobody() -> None:
    server = ServerConnection(max_in_flight=1)
    no_id = server.receive({"type": "status", "id": "one"})
    assert isinstance(no_id, BadRequest) and no_id.id is None
    assert no_id.error.message == "status: a request needs an integer 'id'"
    bad_credit = server.receive({"type": "credit", "subscription": 1, "batches": 0})
    assert isinstance(bad_credit, BadCredit)
    assert bad_credit.error.message == "credit for subscription 1: 'batches' must be at least 1"
    assert bad_credit.error.details == {"argument": "batches", "subscription": 1}
    assert server.receive(Credit(9, 1).to_wire()) == Ignored(
        "credit for subscription 9, which is gone"
    )
    assert server.in_flight == 0 and not server.reading_paused
    notice = decode(server.send(ErrorReply.of(None, no_id.error)))
    assert (notice["type"], notice["id"], notice["code"]) == ("error", None, "invalid")


def test_client_ids_are_never_reused_across_connections() -> None:
    ids = iter(range(1, 100))
    first, second = ClientConnection(ids=ids), ClientConnection(ids=ids)
    used = [first.send_request(Status())[0], second.send_request(Status())[0]]
    used.append(first.send_request(Status())[0])
    assert used == [1, 2, 3]


def test_a_reply_to_an_abandoned_request_is_ignored() -> None:
    pair = Pair()
    rid, _ = pair.request(Status())
    pair.client.abandon(rid)
    assert pair.reply(Ok(rid, {})) == Ignored(f"reply to request {rid} that nobody waits for")


# -- subscriptions and credit -----------------------------------------------------------------


def test_batches_only_after_the_subscribe_reply_and_within_credit() -> None:
    pair = Pair()
    request = Subscribe("s", "earliest", 2)
    rid, _ = pair.request(request)
    sid = pair.server.open_subscription(rid, request)
    assert not pair.server.may_send_batch(sid)
    with pytest.raises(LocalProtocolError, match="not yet answered"):
        pair.server.batch(sid, 0, COLUMNS)
    with pytest.raises(NotFound, match=f"no subscription {sid} on this connection"):
        pair.server.check_unsubscribe(sid)  # a client cannot know it yet
    pair.reply(Subscribed(rid, sid, "s"))
    parts = [pair.server.batch(sid, offset, COLUMNS)[0] for offset in range(3)]
    for part in parts[:2]:
        event = pair.client.receive(decode(pair.server.send(part)))
        assert isinstance(event, BatchReceived) and event.batch.columns == COLUMNS
    assert not pair.server.may_send_batch(sid)
    with pytest.raises(LocalProtocolError, match="no credit"):
        pair.server.send(parts[2])
    credit = pair.client.taken(sid)  # half of a window of 2: given back at once
    assert credit == Credit(sid, 1)
    assert pair.grant(credit) == CreditGranted(sid, 1)
    assert isinstance(pair.client.receive(decode(pair.server.send(parts[2]))), BatchReceived)


def test_credit_goes_back_once_half_the_window_is_taken() -> None:
    pair = Pair()
    sid = pair.subscribe(credit=4)
    for offset in range(4):
        assert isinstance(pair.batch(sid, offset), BatchReceived)
    assert not pair.server.may_send_batch(sid)
    assert pair.client.taken(sid) is None
    credit = pair.client.taken(sid)
    assert credit == Credit(sid, 2)
    assert pair.grant(credit) == CreditGranted(sid, 2)
    assert pair.server.may_send_batch(sid)


def test_server_caps_unused_credit_and_client_refuses_batches_beyond_it() -> None:
    pair = Pair()
    sid = pair.subscribe(credit=MAX_CREDIT + 5)  # the server keeps at most MAX_CREDIT
    assert pair.server.credit(sid) == MAX_CREDIT
    pair.batch(sid)
    pair.grant(Credit(sid, 10))  # past the cap: the rest is dropped, as a client may grant
    assert pair.server.credit(sid) == MAX_CREDIT

    client = ClientConnection()
    rid, _ = client.send_request(Subscribe("s", "latest", 1))
    client.receive({"type": "ok", "id": rid, "result": {"subscription": 7, "stream": "s"}})
    batch = {"type": "batch", "subscription": 7, "stream": "s", "offset": 0, "columns": {}}
    assert isinstance(client.receive(batch), BatchReceived)
    with pytest.raises(RemoteProtocolError, match="more batches than the credit of 1"):
        client.receive(batch)
    assert client.state is State.CLOSED


def test_end_error_and_unsubscribe() -> None:
    pair = Pair()
    ended, failed, dropped = pair.subscribe(), pair.subscribe(), pair.subscribe(credit=None)
    assert pair.reply(End(ended, "s")) == SubscriptionEnded(ended, None)
    with pytest.raises(LocalProtocolError, match="which is gone"):
        pair.server.batch(ended, 1, COLUMNS)
    event = pair.reply(ErrorReply.of(None, Unavailable("host gone"), subscription=failed))
    assert isinstance(event, SubscriptionEnded) and isinstance(event.error, Unavailable)
    assert pair.client.taken(ended) is None  # it has ended: nothing to give back

    rid, request = pair.request(Unsubscribe(dropped))
    assert request == RequestReceived(rid, Unsubscribe(dropped))
    assert pair.batch(dropped) == Ignored(f"batch of subscription {dropped}, which is not open")
    pair.server.check_unsubscribe(dropped)
    with pytest.raises(LocalProtocolError, match="before subscription"):
        pair.server.send(Unsubscribed(rid, dropped))  # its batches may still come
    pair.server.drop_subscription(dropped)
    assert pair.reply(Unsubscribed(rid, dropped)) == Replied(rid, {"subscription": dropped})
    assert pair.server.subscriptions == pair.client.subscriptions == 0


def test_subscription_limit_and_closing_say_so() -> None:
    pair = Pair(max_subscriptions=1)
    pair.subscribe()
    request = Subscribe("people", "latest", None)
    rid, _ = pair.request(request)
    with pytest.raises(InvalidInput) as limit:
        pair.server.open_subscription(rid, request)
    assert limit.value.message == (
        "subscribe to 'people': this connection already has 1 subscriptions (max 1)"
    )
    with pytest.raises(LocalProtocolError, match="no request 99"):
        ServerConnection().open_subscription(99, request)
    assert pair.server.receive(None) == ConnectionClosed()
    with pytest.raises(Unavailable, match="subscribe to 'people': the connection is closing"):
        pair.server.check_subscribe(request)


# -- closing ----------------------------------------------------------------------------------


def test_server_closing_flushes_what_is_owed_then_says_why() -> None:
    pair = Pair()
    rid, _ = pair.request(Status())
    pair.server.broken(RemoteProtocolError("frame of 9 bytes exceeds the limit"))
    with pytest.raises(LocalProtocolError, match="closing connection"):
        pair.server.receive({"type": "status", "id": 5})
    status = StatusReply("p", 1, 0.0, "none", None, [], [])
    assert pair.reply(Ok(rid, status.to_wire())) == Replied(rid, status)
    farewell = pair.server.finish()
    assert farewell is not None
    assert decode(farewell) == {
        "type": "error",
        "id": None,
        "code": "protocol",
        "message": "frame of 9 bytes exceeds the limit",
        "details": {},
    }
    assert pair.client.receive(decode(farewell)) == Farewell(
        "protocol", "frame of 9 bytes exceeds the limit"
    )
    with pytest.raises(LocalProtocolError, match="closing"):
        pair.client.send_request(Status())
    with pytest.raises(LocalProtocolError, match="closed"):
        pair.server.send(ErrorReply.internal(None))
    assert pair.client.receive(None) == ConnectionClosed()
    assert pair.client.state is State.CLOSED


def test_a_frame_without_a_type_breaks_the_connection() -> None:
    server = ServerConnection()
    with pytest.raises(RemoteProtocolError):
        server.receive({"id": 1})
    assert server.state is State.CLOSING and server.finish() is not None


def test_client_refuses_replies_that_break_the_protocol() -> None:
    cases: list[tuple[Request, dict[str, Any], str]] = [
        (
            Hello("py", 1),
            {"server": "fedstream", "version": 1, "max_frame_bytes": 0},
            "'max_frame_bytes' must be a positive",
        ),
        (Subscribe("s"), {"stream": "s"}, "subscribe reply: missing field 'subscription'"),
    ]
    for request, result, match in cases:
        client = ClientConnection()
        rid, _ = client.send_request(request)
        with pytest.raises(RemoteProtocolError, match=match):
            client.receive({"type": "ok", "id": rid, "result": result})
    client = ClientConnection()
    rid, _ = client.send_request(Status())
    bad = {"type": "error", "id": rid, "code": "x", "message": "m", "details": {"message": 1}}
    with pytest.raises(RemoteProtocolError, match="invalid details"):
        client.receive(bad)


def test_the_modules_import_no_asyncio_and_do_no_io() -> None:
    for module in (api_connection, api_events):
        tree = ast.parse(inspect.getsource(module))
        imported = {
            name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for name in (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
        }
        assert not imported & {"asyncio", "socket", "ssl", "selectors", "threading"}, module


# -- fuzz: a frame from the other side is accepted or raises RemoteProtocolError --------------

_keys = st.sampled_from(["a", "x", "id", "type", "message", "subscription"])
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=4,
)
_ids = st.one_of(st.integers(-1, 6), st.booleans(), _values)
_FIELDS = {
    "id": _ids,
    "subscription": _ids,
    "result": st.one_of(
        st.fixed_dictionaries(
            {}, optional={"subscription": _ids, "max_frame_bytes": _ids, "stream": _values}
        ),
        _values,
    ),
    "code": st.one_of(st.sampled_from(["invalid", "not_found", "protocol"]), _values),
    "message": _values,
    "details": st.dictionaries(st.sampled_from(["message", "stream", "x"]), _values, min_size=1),
    "stream": st.one_of(st.just("s"), _values),
    "offset": _ids,
    "columns": st.one_of(st.dictionaries(_keys, st.lists(_values, max_size=3)), _values),
    "part": _ids,
    "parts": _ids,
    "batches": _ids,
    "credit": _ids,
    "start": st.one_of(st.sampled_from(["latest", "earliest"]), _values),
    "rows": st.one_of(st.lists(st.dictionaries(_keys, _values), max_size=3), _values),
    "arrow": _values,
    "name": _values,
    "schema": _values,
    "query": _values,
    "status": st.one_of(st.sampled_from(["running", "PAUSED"]), _values),
    "client": _values,
    "version": _ids,
    "producer": _values,
    "seq": _ids,
}


def _every_request() -> list[Request]:
    return [
        Hello("py", 1),
        CreateSchema({"name": "s", "fields": []}),
        CreateStream("s", "s"),
        CreateQuery("<query/>"),
        SetQueryStatus("q", "RUNNING"),
        Push("s", {"rows": [{"x": 1}]}, "p", 1),
        Subscribe("s", "earliest", 2),
        Unsubscribe(1),
        Lookup("s"),
        Status(),
    ]


_KINDS = [
    "ok", "error", "batch", "end", "credit", "hello", "push", "subscribe", "unsubscribe",
    "create_schema", "create_stream", "create_query", "set_query_status", "lookup", "status",
]  # fmt: skip
random_frames = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.one_of(st.sampled_from(_KINDS), st.text(max_size=6)),
    st.fixed_dictionaries({}, optional=_FIELDS),
)


def _near(valid: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Valid frames with a field or two changed or left out (mostly their own fields)."""

    def mutations(frame: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        keys = sorted(set(frame) - {"type"}) * 8 + sorted(_FIELDS)
        changes = st.lists(st.sampled_from(keys), max_size=2, unique=True).flatmap(
            lambda chosen: st.fixed_dictionaries({key: _FIELDS[key] for key in chosen})
        )
        return st.builds(
            lambda changed, dropped: {
                key: value for key, value in {**frame, **changed}.items() if key not in dropped
            },
            changes,
            st.sets(st.sampled_from(keys), max_size=1),
        )

    return st.sampled_from(valid).flatmap(mutations)


def _busy_pair() -> Pair:
    """A pair with a live subscription 1 (credit 2) and subscription 2 opening; the client
    waits for requests 2 (its subscribe), 3 (hello), 4 (status) and 5 (another subscribe)."""
    pair = Pair(max_in_flight=1 << 16)
    pair.subscribe(credit=2)
    request = Subscribe("s", "earliest", 1)
    rid, _ = pair.request(request)
    pair.server.open_subscription(rid, request)
    for other in (Hello("py", 1), Status(), Subscribe("t", "latest", 3)):
        pair.request(other)
    return pair


_TO_SERVER = [
    *(r.to_wire(rid) for rid, r in enumerate(list(_every_request()), start=6)),
    Credit(1, 2).to_wire(),
    Credit(2, 1).to_wire(),
]
_TO_CLIENT = [
    *(
        Ok(rid, {"subscription": 9, "stream": "s", "max_frame_bytes": 4096}).to_wire()
        for rid in range(2, 6)
    ),
    *(ErrorReply.of(rid, NotFound("no", stream="s")).to_wire() for rid in range(2, 6)),
    BatchFrame(1, "s", 0, {"x": [1]}).to_wire(),
    BatchFrame(1, "s", 0, {"x": [1]}, 0, 2).to_wire(),
    End(1, "s").to_wire(),
    ErrorReply.of(None, Unavailable("gone"), subscription=1).to_wire(),
    ErrorReply(None, "protocol", "bye").to_wire(),
]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(st.one_of(random_frames, _near(_TO_SERVER)), min_size=1, max_size=6))
def test_fuzz_the_server_accepts_a_frame_or_raises_remote_protocol_error(
    sequence: list[dict[str, Any]],
) -> None:
    pair = _busy_pair()
    for frame in sequence:
        encode_frame(frame)  # (a frame the wire could carry)
        try:
            pair.server.receive(frame)
        except RemoteProtocolError:
            assert pair.server.state is State.CLOSING
            return


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(st.one_of(random_frames, _near(_TO_CLIENT)), min_size=1, max_size=6))
def test_fuzz_the_client_accepts_a_frame_or_raises_remote_protocol_error(
    sequence: list[dict[str, Any]],
) -> None:
    pair = _busy_pair()
    for frame in sequence:
        encode_frame(frame)
        try:
            pair.client.receive(frame)
        except RemoteProtocolError:
            assert pair.client.state is State.CLOSED
            return
