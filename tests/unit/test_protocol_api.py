"""peer.protocol.api: the client API's typed messages, to and from wire frames (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.errors import RemoteProtocolError
from overlay.wire import FrameDecoder
from peer.errors import InvalidInput, NotFound
from peer.protocol.api import (
    MAX_NAME_ARG_CHARS,
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
    batch_frames,
    decode_request,
    error_from_wire,
    request_id,
)

names = st.text(min_size=1, max_size=12)
# producer ids: any text but control characters (Push.from_wire refuses those)
producers = st.text(st.characters(blacklist_categories=("Cc", "Zl", "Zp")), min_size=1, max_size=12)
requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(Hello, names, st.sampled_from([None, 1])),
    st.builds(CreateSchema, st.one_of(names, st.fixed_dictionaries({"name": names}))),
    st.builds(CreateStream, names, names),
    st.builds(CreateQuery, st.one_of(names, st.fixed_dictionaries({"name": names}))),
    st.builds(SetQueryStatus, names, st.sampled_from(["SETUP", "RUNNING", "STOPPED", "DELETED"])),
    st.builds(
        Push,
        names,
        st.one_of(
            st.fixed_dictionaries({"columns": st.dictionaries(names, st.lists(st.integers()))}),
            st.fixed_dictionaries({"rows": st.lists(st.dictionaries(names, st.integers()))}),
            st.fixed_dictionaries({"arrow": st.binary(min_size=1)}),
        ),
        st.one_of(st.none(), producers),
        st.one_of(st.none(), st.integers(min_value=0)),
    ),
    st.builds(
        Subscribe,
        names,
        st.sampled_from(["latest", "earliest"]),
        st.one_of(st.none(), st.integers(min_value=1)),
    ),
    st.builds(Unsubscribe, st.integers()),
    st.builds(Lookup, names),
    st.builds(Status),
)


@given(request=requests, rid=st.integers(min_value=0, max_value=2**31))
def test_every_request_survives_its_wire_form(request: Request, rid: int) -> None:
    frame = request.to_wire(rid)
    assert frame["type"] == request.op
    assert request_id(frame) == rid
    assert decode_request(frame) == request


def test_a_status_is_upper_cased_and_checked() -> None:
    assert decode_request(SetQueryStatus("q", "running").to_wire(1)) == SetQueryStatus(
        "q", "RUNNING"
    )
    with pytest.raises(InvalidInput, match="not 'paused'") as err:
        decode_request(SetQueryStatus("q", "paused").to_wire(1))
    assert err.value.details == {"argument": "status"}


@pytest.mark.parametrize(
    ("frame", "message", "details"),
    [
        (
            {"type": "status", "id": "1"},
            "status: a request needs an integer 'id'",
            {"op": "status"},
        ),
        ({"type": "status", "id": True}, "a request needs an integer 'id'", {"op": "status"}),
    ],
)
def test_a_request_without_an_integer_id(
    frame: dict[str, Any], message: str, details: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInput, match=message) as err:
        request_id(frame)
    assert err.value.details == details


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "frobnicate", "id": 1}, "unknown op 'frobnicate'"),
        ({"type": "create_stream", "id": 1, "name": 7}, "'name' must be a string, not int"),
        ({"type": "lookup", "id": 1, "name": ""}, "'name' must not be empty"),
        ({"type": "push", "id": 1, "stream": "s"}, "exactly one of 'columns', 'rows', 'arrow'"),
        ({"type": "push", "id": 1, "stream": "s", "rows": [1]}, "row 0 must be a map"),
        ({"type": "push", "id": 1, "stream": "s", "rows": [], "seq": -1}, "must not be negative"),
        ({"type": "subscribe", "id": 1, "stream": "s", "credit": 0}, "at least 1"),
        ({"type": "hello", "id": 1, "client": "x", "version": 2}, "version 2 is not supported"),
    ],
)
def test_requests_are_checked_with_messages_naming_the_argument(
    frame: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_request(frame)


def test_credit_frames() -> None:
    assert Credit.from_wire(Credit(3, 5).to_wire()) == Credit(3, 5)
    with pytest.raises(InvalidInput, match="'batches' must be at least 1"):
        Credit.from_wire({"type": "credit", "subscription": 3, "batches": 0})


def test_replies_and_errors() -> None:
    ok = Ok(4, {"stream": "s"})
    assert Ok.from_wire(ok.to_wire()) == ok
    with pytest.raises(RemoteProtocolError, match="no result map"):
        Ok.from_wire({"type": "ok", "id": 4, "result": [1]})
    wire = ErrorReply.of(4, NotFound("no stream 's'", stream="s")).to_wire()
    assert wire == {
        "type": "error",
        "id": 4,
        "code": "not_found",
        "message": "no stream 's'",
        "details": {"stream": "s"},
    }
    err = error_from_wire(wire)
    assert isinstance(err, NotFound) and err.details == {"stream": "s"}
    internal = ErrorReply.internal(None, subscription=2).to_wire()
    assert (internal["subscription"], internal["code"]) == (2, "internal")
    assert End(2, "s").to_wire() == {"type": "end", "subscription": 2, "stream": "s"}


def decode(data: bytes) -> dict[str, Any]:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    frame = decoder.next_frame()
    assert frame is not None
    return frame


def test_a_batch_too_big_for_one_frame_comes_in_parts_that_fit() -> None:
    columns: dict[str, list[Any]] = {
        "name": [f"{i:04d}" * 10 for i in range(300)],
        "id": list(range(300)),
    }
    assert len(batch_frames(1, "s", 7, {"id": [1]}, max_frame_bytes=4096)) == 1
    parts = [
        BatchFrame.from_wire(decode(d))
        for d in batch_frames(1, "s", 7, columns, max_frame_bytes=4096)
    ]
    assert len(parts) >= 4
    assert [(p.part, p.parts, p.offset) for p in parts] == [
        (i, len(parts), 7) for i in range(len(parts))
    ]
    assert [i for p in parts for i in p.columns["id"]] == list(range(300))
    with pytest.raises(InvalidInput, match="larger than the frame limit"):
        batch_frames(1, "s", 7, {"name": ["x" * 5000]}, max_frame_bytes=4096)
    with pytest.raises(RemoteProtocolError, match="batch frame lacks"):
        BatchFrame.from_wire({"type": "batch", "subscription": 1, "offset": "7"})


def test_a_name_argument_over_the_name_limit_is_refused_before_any_work() -> None:
    long = "n" * (MAX_NAME_ARG_CHARS + 1)
    with pytest.raises(InvalidInput, match=r"too long \(1025 characters"):
        Lookup.from_wire({"type": "lookup", "id": 1, "name": long})
    assert Lookup.from_wire({"type": "lookup", "id": 1, "name": "n" * 256}).name == "n" * 256
