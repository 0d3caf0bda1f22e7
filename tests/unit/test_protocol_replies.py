"""The typed results of the client API's ``ok`` replies (peer.protocol.replies): each kind
encodes to exactly the bytes the peer has always sent, decodes back to itself, and refuses a
malformed result naming the field."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.errors import RemoteProtocolError
from peer.protocol.api import Ok
from peer.protocol.link_replies import (
    HostStreamReply,
    MirrorAppendReply,
    MirrorStartReply,
    MirrorStopReply,
)
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateStreamReply,
    HelloReply,
    LookupReply,
    PushReply,
    Reply,
    SetQueryStatusReply,
    StatusReply,
    SubscribeReply,
    TypedReply,
    UnsubscribeReply,
    decode_result,
)

# One result per kind as the peer writes it (docs/protocol.md, sections 3 and 8), field for
# field and in the peer's order: the maps the site, the federation and the server built by hand
# before replies were typed.
WIRE: dict[str, dict[str, Any]] = {
    "hello": {"server": "fedstream", "version": 1, "max_frame_bytes": 67108864},
    "create_schema": {"schema": "people", "fields": ["name", "id"]},
    "create_stream": {"stream": "people", "schema": "people", "host": "ab" * 20},
    "create_query": {
        "query": "q",
        "status": "SETUP",
        "inputs": ["people"],
        "outputs": ["adults"],
        "fragments": [{"name": "q", "site": "ab" * 20}],
    },
    "set_query_status": {"query": "q", "status": "RUNNING", "fragments": 1},
    "push": {"stream": "people", "count": 1, "offset": 0, "duplicate": False},
    "subscribe": {"subscription": 1, "stream": "people"},
    "unsubscribe": {"subscription": 1},
    "lookup": {  # a stream looked up through the DHT catalog: its lease comes first
        "lease": {"node": "ab" * 20, "until": 12.5},
        "kind": "stream",
        "name": "people",
        "schema": {"name": "people", "fields": []},
        "derived_from": None,
        "owner": None,
        "host": "ab" * 20,
        "responsible": "127.0.0.1:7700",
    },
    "status": {
        "peer": "127.0.0.1:7700",
        "pid": 4242,
        "uptime_s": 3.5,
        "engine": "none",
        "data_dir": "/tmp/p",
        "streams": [{"name": "people", "latest_offset": 0}],
        "queries": [],
        "quarantined": [],
        "overlay": {"node_id": "ab" * 20, "members": []},
    },
}

# The same results as the services build them.
TYPED: dict[str, Reply] = {
    "hello": HelloReply("fedstream", 1, 67108864),
    "create_schema": CreateSchemaReply("people", ["name", "id"]),
    "create_stream": CreateStreamReply("people", "people", "ab" * 20),
    "create_query": CreateQueryReply(
        "q",
        "SETUP",
        extra={
            "inputs": ["people"],
            "outputs": ["adults"],
            "fragments": [{"name": "q", "site": "ab" * 20}],
        },
    ),
    "set_query_status": SetQueryStatusReply("q", "RUNNING", extra={"fragments": 1}),
    "push": PushReply("people", 1, 0, False),
    "subscribe": SubscribeReply(1, "people"),
    "unsubscribe": UnsubscribeReply(1),
    "lookup": LookupReply(
        "stream",
        "people",
        "ab" * 20,
        extra={
            "lease": {"node": "ab" * 20, "until": 12.5},
            "schema": {"name": "people", "fields": []},
            "derived_from": None,
            "owner": None,
            "responsible": "127.0.0.1:7700",
        },
        order=("lease", "kind", "name", "schema", "derived_from", "owner", "host"),
    ),
    "status": StatusReply(
        "127.0.0.1:7700",
        4242,
        3.5,
        "none",
        "/tmp/p",
        [{"name": "people", "latest_offset": 0}],
        [],
        extra={"quarantined": [], "overlay": {"node_id": "ab" * 20, "members": []}},
    ),
}

OPS = sorted(WIRE)


def _bytes(result: dict[str, Any], rid: int = 7) -> bytes:
    return bytes(msgpack.packb(Ok(rid, result).to_wire(), use_bin_type=True))


@pytest.mark.parametrize("op", OPS)
def test_each_kind_encodes_to_the_bytes_the_peer_always_sent(op: str) -> None:
    assert _bytes(TYPED[op].to_wire()) == _bytes(WIRE[op])


@pytest.mark.parametrize("op", OPS)
def test_each_kind_decodes_to_the_typed_reply_and_back_to_the_same_bytes(op: str) -> None:
    reply = decode_result(op, WIRE[op])
    assert type(reply) is type(TYPED[op]) and reply == TYPED[op]
    assert _bytes(reply.to_wire()) == _bytes(WIRE[op])


def test_the_typed_fields_are_what_callers_read() -> None:
    push = decode_result("push", {**WIRE["push"], "forwarded": True})
    assert isinstance(push, PushReply)
    assert (push.count, push.offset, push.duplicate, push.forwarded) == (1, 0, False, True)
    lookup = decode_result("lookup", WIRE["lookup"])
    assert isinstance(lookup, LookupReply)
    assert (lookup.kind, lookup.host, lookup.extra["responsible"]) == (
        "stream",
        "ab" * 20,
        "127.0.0.1:7700",
    )
    hello = decode_result("hello", {"server": "fedstream", "version": 1})
    assert isinstance(hello, HelloReply) and hello.max_frame_bytes is None
    assert "max_frame_bytes" not in hello.to_wire()  # absent stays absent


def test_the_deprecated_dict_form_reads_the_wire_fields() -> None:
    reply = TYPED["push"]
    assert reply["count"] == 1 and reply.get("forwarded") is None and "offset" in reply
    assert dict(reply) == WIRE["push"] and reply == WIRE["push"]
    assert reply != {**WIRE["push"], "count": 2}
    with pytest.raises(KeyError):
        reply["nope"]
    with pytest.raises(TypeError):
        hash(reply)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def _results(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid result of some kind: its fields in a shuffled order, with extra fields."""
    op = draw(st.sampled_from(OPS))
    base = dict(WIRE[op])
    for key in list(base):
        if key in ("count", "offset", "pid", "subscription", "max_frame_bytes"):
            base[key] = draw(st.integers(min_value=1, max_value=2**40))
        elif isinstance(base[key], str):
            base[key] = draw(st.text(max_size=12))
    extra = draw(st.dictionaries(st.text(min_size=1, max_size=6), _VALUES, max_size=4))
    merged = {**base, **{k: v for k, v in extra.items() if k not in base}}
    keys = draw(st.permutations(list(merged)))
    return op, {key: merged[key] for key in keys}


@given(_results())
def test_any_valid_result_round_trips_byte_for_byte(case: tuple[str, dict[str, Any]]) -> None:
    op, result = case
    reply = decode_result(op, result)
    assert _bytes(reply.to_wire()) == _bytes(result)
    assert decode_result(op, reply.to_wire()) == reply


# (op, the result, the field the error must name, what it must say)
MALFORMED: list[tuple[str, Any, str]] = [
    ("push", [1, 2], "the result must be a map"),
    ("push", {"stream": "s", "count": 1, "duplicate": False}, "missing field 'offset'"),
    ("push", {**WIRE["push"], "count": "1"}, "field 'count' must be an integer, not str"),
    ("push", {**WIRE["push"], "count": True}, "field 'count' must be an integer, not bool"),
    ("push", {**WIRE["push"], "count": -1}, "field 'count' is negative"),
    ("push", {**WIRE["push"], "offset": "0"}, "field 'offset' must be an integer or nil"),
    ("push", {**WIRE["push"], "duplicate": 0}, "field 'duplicate' must be a boolean"),
    ("hello", {"server": "fedstream"}, "missing field 'version'"),
    ("hello", {**WIRE["hello"], "max_frame_bytes": "big"}, "field 'max_frame_bytes' must be"),
    ("hello", {**WIRE["hello"], "max_frame_bytes": 0}, "'max_frame_bytes' must be a positive"),
    ("hello", {**WIRE["hello"], "participant": 3}, "field 'participant' must be a string"),
    ("create_schema", {"schema": "s", "fields": 2}, "field 'fields' must be an array"),
    ("create_stream", {"stream": "s"}, "missing field 'schema'"),
    ("create_stream", {**WIRE["create_stream"], "host": b"x"}, "field 'host' must be a string"),
    ("create_query", {"query": "q"}, "missing field 'status'"),
    ("set_query_status", {"query": 1, "status": "SETUP"}, "field 'query' must be a string"),
    ("subscribe", {"stream": "s"}, "missing field 'subscription'"),
    ("unsubscribe", {"subscription": "1"}, "field 'subscription' must be an integer"),
    ("lookup", {"kind": "stream"}, "missing field 'name'"),
    ("status", {**WIRE["status"], "uptime_s": "3"}, "field 'uptime_s' must be a number"),
    ("status", {**WIRE["status"], "streams": {}}, "field 'streams' must be an array"),
    ("frobnicate", {}, "an ok reply to 'frobnicate', which has no reply kind"),
]


@pytest.mark.parametrize(("op", "result", "says"), MALFORMED)
def test_a_malformed_result_is_refused_naming_the_field(op: str, result: Any, says: str) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        decode_result(op, result)
    assert says in str(err.value)
    assert str(err.value).startswith(f"{op} reply: ") or "no reply kind" in says


# -- the replies of peer-link requests only peers send (peer.protocol.link_replies) ----------

LINK_WIRE: dict[type[TypedReply], tuple[dict[str, Any], TypedReply]] = {
    HostStreamReply: (
        {"stream": "s", "host": "ab" * 20, "replicated": True},
        HostStreamReply("s", "ab" * 20, replicated=True),
    ),
    MirrorStartReply: ({"stream": "s", "to": "cd" * 20}, MirrorStartReply("s", "cd" * 20)),
    MirrorStopReply: (
        {"stream": "s", "to": "cd" * 20, "acked": 41},
        MirrorStopReply("s", "cd" * 20, 41),
    ),
    MirrorAppendReply: ({"stream": "s", "last": 14, "kept": 2}, MirrorAppendReply("s", 14, 2)),
}


@pytest.mark.parametrize("kind", list(LINK_WIRE), ids=lambda kind: kind.__name__)
def test_each_link_reply_encodes_to_the_bytes_peers_always_sent(kind: type[TypedReply]) -> None:
    wire, typed = LINK_WIRE[kind]
    assert _bytes(typed.to_wire()) == _bytes(wire)
    decoded = kind.from_wire(wire)
    assert decoded == typed and _bytes(decoded.to_wire()) == _bytes(wire)


def test_a_plain_stream_is_hosted_without_the_replicated_field() -> None:
    assert HostStreamReply("s", "ab" * 20).to_wire() == {"stream": "s", "host": "ab" * 20}


@pytest.mark.parametrize(
    ("kind", "result", "says"),
    [
        (HostStreamReply, {"stream": "s"}, "host_stream reply: missing field 'host'"),
        (
            HostStreamReply,
            {"stream": "s", "host": "h", "replicated": "yes"},
            "host_stream reply: field 'replicated' must be a boolean, not str",
        ),
        (MirrorStopReply, {"stream": "s", "to": "t"}, "stop_mirror reply: missing field 'acked'"),
        (
            MirrorAppendReply,
            {"stream": "s", "last": 1.5, "kept": 0},
            "mirror_append reply: field 'last' must be an integer, not float",
        ),
        (MirrorStartReply, None, "start_mirror reply: the result must be a map"),
    ],
)
def test_a_malformed_link_reply_is_refused_naming_the_field(
    kind: type[TypedReply], result: Any, says: str
) -> None:
    with pytest.raises(RemoteProtocolError, match=re.escape(says)):
        kind.from_wire(result)
