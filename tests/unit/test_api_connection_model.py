"""peer.protocol.api_connection: Hypothesis sequences of requests, replies, subscriptions,
batches, credit and ends through a client and a server state machine, against a model.

The client's frames wait in a queue until the server reads them (never while its in-flight
requests are at the limit); the server's arrive at once. After every step the model checks
what each side counts: requests owed and waiting, subscriptions, and each subscription's
credit, conserved between the server, the wire and the client's application.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from overlay.errors import LocalProtocolError
from peer.errors import InvalidInput, NotFound, Unavailable
from peer.protocol.api import (
    MAX_CREDIT,
    Credit,
    End,
    ErrorReply,
    Hello,
    Lookup,
    Ok,
    Push,
    Request,
    Status,
    Subscribe,
    Unsubscribe,
)
from peer.protocol.api_connection import ClientConnection, ServerConnection
from peer.protocol.api_events import (
    BatchReceived,
    CreditGranted,
    Ignored,
    Replied,
    RequestFailed,
    RequestReceived,
    Subscribed,
    SubscriptionEnded,
    Unsubscribed,
)
from tests.unit.test_api_connection import COLUMNS, Pair, decode
from tests.unit.test_protocol_replies import TYPED

MAX_IN_FLIGHT = 3
MAX_SUBSCRIPTIONS = 3

simple_requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(Status),
    st.builds(Lookup, st.text(min_size=1, max_size=6)),
    st.builds(Hello, st.text(min_size=1, max_size=6), st.just(1)),
    st.builds(
        Push,
        st.just("s"),
        st.fixed_dictionaries(
            {"columns": st.fixed_dictionaries({"x": st.lists(st.integers(-(2**63), 2**63 - 1))})}
        ),
    ),
)


@dataclass
class Flow:
    """The model of one live subscription: where its credit is."""

    window: int | None  # the credit it asked for (None: no flow control)
    server_credit: int | None  # what the server may still send
    held: int = 0  # arrived at the client, not yet taken by the application
    taken: int = 0  # taken, not yet given back as credit
    in_transit: int = 0  # given back, not yet read by the server
    forgotten: bool = False  # the client sent unsubscribe: it no longer counts
    unsubscribing: int | None = None  # that unsubscribe's id, once the server has read it


class Session(RuleBasedStateMachine):
    """A client and a server state machine exchanging frames, the test playing the service.

    What the client sends waits in ``to_server`` until the server reads it (never while its
    in-flight requests are at the limit); what the server sends arrives at once.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair(max_in_flight=MAX_IN_FLIGHT, max_subscriptions=MAX_SUBSCRIPTIONS)
        self.to_server: list[bytes] = []
        self.sent: dict[int, Request] = {}  # sent by the client, not yet read
        self.waiting: set[int] = set()  # sent by the client, neither answered nor abandoned
        self.owed: dict[int, Request] = {}  # read by the server, not answered
        self.opening: dict[int, tuple[int, Subscribe]] = {}  # sid -> (request id, request)
        self.flows: dict[int, Flow] = {}
        self.gone: set[int] = set()  # subscriptions that have ended
        self.ended_held = 0  # batches of ended subscriptions the application still holds
        self.offset = 0

    @property
    def client(self) -> ClientConnection:
        return self.pair.client

    @property
    def server(self) -> ServerConnection:
        return self.pair.server

    def unsubscribing(self) -> list[int]:
        return sorted(sid for sid, flow in self.flows.items() if flow.unsubscribing is not None)

    # -- the client --

    def client_sends(self, request: Request) -> int:
        rid, data = self.client.send_request(request)
        self.to_server.append(data)
        self.sent[rid] = request
        self.waiting.add(rid)
        return rid

    @precondition(lambda self: len(self.to_server) < 3)
    @rule(request=simple_requests)
    def send_request(self, request: Request) -> None:
        self.client_sends(request)

    @precondition(lambda self: len(self.to_server) < 3 and len(self.flows) <= MAX_SUBSCRIPTIONS)
    @rule(credit=st.sampled_from([None, 1, 2, 3, 4]))
    def subscribe(self, credit: int | None) -> None:
        self.client_sends(Subscribe("s", "latest", credit))

    @precondition(lambda self: any(not flow.forgotten for flow in self.flows.values()))
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        sid = data.draw(
            st.sampled_from(sorted(s for s, f in self.flows.items() if not f.forgotten))
        )
        flow = self.flows[sid]
        self.client_sends(Unsubscribe(sid))
        flow.forgotten = True
        self.ended_held += flow.held
        flow.held = flow.taken = 0

    def abandonable(self) -> list[int]:
        simple = {**self.sent, **self.owed}
        return sorted(
            rid
            for rid in self.waiting
            if rid in simple and not isinstance(simple[rid], Subscribe | Unsubscribe)
        )

    @precondition(lambda self: self.abandonable())
    @rule(data=st.data())
    def abandon(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.abandonable()))
        self.client.abandon(rid)
        self.waiting.discard(rid)

    @precondition(lambda self: any(flow.held for flow in self.flows.values()) or self.ended_held)
    @rule(data=st.data(), n=st.integers(1, 4))
    def take(self, data: st.DataObject, n: int) -> None:
        """The application takes up to ``n`` batches of one subscription."""
        holding = sorted(sid for sid, flow in self.flows.items() if flow.held)
        if not holding:  # a batch of a subscription that has ended: nothing to give back
            self.ended_held -= 1
            assert self.client.taken(min(self.gone, default=-1)) is None
            return
        sid = data.draw(st.sampled_from(holding))
        flow = self.flows[sid]
        for _ in range(min(n, flow.held)):
            flow.held -= 1
            credit = self.client.taken(sid)
            if flow.window is None:
                assert credit is None
                continue
            flow.taken += 1
            if flow.taken * 2 >= flow.window:  # half the window taken: all of it goes back
                assert credit == Credit(sid, flow.taken)
                self.to_server.append(self.client.send_credit(credit))
                flow.in_transit += flow.taken
                flow.taken = 0
            else:
                assert credit is None

    # -- the server --

    @precondition(lambda self: self.to_server and self.server.reading_paused)
    @rule()
    def a_paused_server_reads_nothing(self) -> None:
        with pytest.raises(LocalProtocolError, match="read no further"):
            self.server.receive(decode(self.to_server[0]))

    @precondition(lambda self: self.to_server and not self.server.reading_paused)
    @rule()
    def server_reads(self) -> None:
        frame = decode(self.to_server.pop(0))
        event = self.server.receive(frame)
        if frame["type"] == "credit":
            sid, batches = frame["subscription"], frame["batches"]
            flow = self.flows.get(sid)
            if flow is None:
                assert isinstance(event, Ignored) and sid in self.gone
                return
            assert event == CreditGranted(sid, batches)
            flow.in_transit -= batches
            assert flow.server_credit is not None
            flow.server_credit += min(batches, MAX_CREDIT - flow.server_credit)
            return
        rid = frame["id"]
        request = self.sent.pop(rid)
        assert event == RequestReceived(rid, request)
        if isinstance(request, Subscribe):
            self.open(rid, request)
        elif isinstance(request, Unsubscribe) and request.subscription in self.flows:
            self.flows[request.subscription].unsubscribing = rid
        else:
            self.owed[rid] = request

    def open(self, rid: int, request: Subscribe) -> None:
        if self.server.subscriptions >= MAX_SUBSCRIPTIONS:
            with pytest.raises(InvalidInput, match="subscriptions"):
                self.server.open_subscription(rid, request)
            self.owed[rid] = request  # answered with the error, as any
            return
        sid = self.server.open_subscription(rid, request)
        assert not self.server.may_send_batch(sid)
        self.opening[sid] = (rid, request)

    @precondition(lambda self: self.owed)
    @rule(data=st.data(), ok=st.booleans())
    def answer(self, data: st.DataObject, ok: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.owed)))
        request = self.owed.pop(rid)
        if isinstance(request, Subscribe | Unsubscribe):
            ok = False  # (refused for the limit, or the subscription had ended)
        result = self.server.hello_result if isinstance(request, Hello) else TYPED[request.op]
        event = self.pair.reply(
            Ok(rid, result.to_wire()) if ok else ErrorReply.of(rid, NotFound("no"))
        )
        if rid not in self.waiting:
            assert isinstance(event, Ignored)
            return
        self.waiting.remove(rid)
        if ok:
            assert event == Replied(rid, result)
        else:
            assert isinstance(event, RequestFailed) and event.error.code in ("not_found")
        if ok and isinstance(request, Hello):
            assert self.client.max_frame_bytes == self.server.max_frame_bytes

    @precondition(lambda self: self.opening)
    @rule(data=st.data())
    def accept(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.opening)))
        rid, request = self.opening.pop(sid)
        assert self.pair.reply(Subscribed(rid, sid, "s")) == Replied(
            rid, {"subscription": sid, "stream": "s"}
        )
        self.waiting.remove(rid)
        self.flows[sid] = Flow(request.credit, request.credit)

    def sendable(self) -> list[int]:
        return sorted(sid for sid in self.flows if self.server.may_send_batch(sid))

    @precondition(lambda self: self.sendable())
    @rule(data=st.data(), n=st.integers(1, 4))
    def send_batches(self, data: st.DataObject, n: int) -> None:
        """The server sends up to ``n`` batches of one subscription, as its credit allows."""
        sid = data.draw(st.sampled_from(self.sendable()))
        flow = self.flows[sid]
        for _ in range(n):
            if not self.server.may_send_batch(sid):
                break
            event = self.pair.batch(sid, self.offset)
            self.offset += 1
            if flow.server_credit is not None:
                flow.server_credit -= 1
            if flow.forgotten:
                assert isinstance(event, Ignored)
            else:
                assert isinstance(event, BatchReceived) and event.batch.offset == self.offset - 1
                flow.held += 1

    @precondition(lambda self: any(not self.server.may_send_batch(sid) for sid in self.flows))
    @rule(data=st.data())
    def no_batch_without_credit(self, data: st.DataObject) -> None:
        stalled = sorted(sid for sid in self.flows if not self.server.may_send_batch(sid))
        sid = data.draw(st.sampled_from(stalled))
        [part] = self.server.batch(sid, 0, COLUMNS)
        with pytest.raises(LocalProtocolError, match="no credit"):
            self.server.send(part)

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), failed=st.booleans(), now=st.integers(0, 3))
    def end(self, data: st.DataObject, failed: bool, now: int) -> None:
        if now:  # (subscriptions mostly live on: most steps should move batches and credit)
            return
        sid = data.draw(st.sampled_from(sorted(self.flows)))
        flow = self.flows.pop(sid)
        last = (
            ErrorReply.of(None, Unavailable("gone"), subscription=sid) if failed else End(sid, "s")
        )
        event = self.pair.reply(last)
        if flow.forgotten:
            assert isinstance(event, Ignored)
        else:
            assert isinstance(event, SubscriptionEnded) and event.subscription == sid
            assert (event.error is not None) == failed
        if flow.unsubscribing is not None:
            self.owed[flow.unsubscribing] = Unsubscribe(sid)  # answered NotFound, as any
        self.ended_held += flow.held
        self.gone.add(sid)

    @precondition(lambda self: self.unsubscribing())
    @rule(data=st.data())
    def server_unsubscribes(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(self.unsubscribing()))
        rid = self.flows.pop(sid).unsubscribing
        assert rid is not None
        self.server.check_unsubscribe(sid)
        with pytest.raises(LocalProtocolError, match="before subscription"):
            self.server.send(Unsubscribed(rid, sid))  # its batches may still come
        self.server.drop_subscription(sid)
        assert self.pair.reply(Unsubscribed(rid, sid)) == Replied(rid, {"subscription": sid})
        self.waiting.remove(rid)
        self.gone.add(sid)

    # -- what must hold after every step --

    @invariant()
    def requests_are_counted(self) -> None:
        in_flight = len(self.owed) + len(self.opening) + len(self.unsubscribing())
        assert self.server.in_flight == in_flight
        assert self.server.reading_paused == (in_flight >= MAX_IN_FLIGHT)
        assert self.server.subscriptions == len(self.opening) + len(self.flows)
        assert self.client.in_flight == len(self.waiting)

    @invariant()
    def credit_is_conserved(self) -> None:
        for sid, flow in self.flows.items():
            assert self.server.credit(sid) == flow.server_credit
            assert self.server.may_send_batch(sid) == (flow.server_credit != 0)
            if flow.window is not None and not flow.forgotten:
                assert flow.server_credit is not None
                in_hand = flow.held + flow.taken + flow.in_transit
                assert flow.server_credit + in_hand == flow.window


Session.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, print_blob=True
)
TestSession = Session.TestCase
