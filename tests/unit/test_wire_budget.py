"""Decode budgets: what one frame may decode to, refused while decoding, naming the limit."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.errors import RemoteProtocolError
from overlay.wire import (
    DEFAULT_BUDGET,
    DecodeBudget,
    FrameDecoder,
    FrameOverBudget,
    decode_body,
    encode_frame,
)


def body_of(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def nested(depth: int) -> dict[str, Any]:
    """A frame whose maps and arrays nest ``depth`` deep (the frame's own map is 1)."""
    inner: Any = 0
    for _ in range(depth - 1):
        inner = [inner]
    return {"type": "x", "v": inner}


def refused(body: bytes, budget: DecodeBudget) -> FrameOverBudget:
    with pytest.raises(FrameOverBudget) as caught:
        decode_body(body, budget)
    assert caught.value.limit in str(caught.value)
    return caught.value


def test_a_container_header_beyond_the_limit_is_refused_before_its_items() -> None:
    # The attack of issue 12: one array of 67 M empty maps in a 64 MiB frame. Its header alone
    # is refused; the body here is only its first kilobyte, which shows that nothing after
    # the header was looked at (a whole body would be refused the same way).
    body = b"\x82\xa4type\xa1x\xa1v" + b"\xdd" + (67_108_864).to_bytes(4, "big") + b"\x80" * 1024
    started = time.perf_counter()
    error = refused(body, DEFAULT_BUDGET)
    assert error.limit == "max_container_len"
    assert "1000000" in str(error)
    assert time.perf_counter() - started < 1.0


def test_elements_are_counted_across_containers() -> None:
    budget = DecodeBudget(max_elements=2500, max_container_len=1000)
    frame = {"type": "x", "a": [{}] * 1000, "b": [{}] * 1000, "c": [{}] * 1000}
    assert refused(body_of(frame), budget).limit == "max_elements"
    assert decode_body(body_of({"type": "x", "a": [{}] * 1000}), budget)["a"] == [{}] * 1000


def test_a_map_counts_its_keys_and_values() -> None:
    budget = DecodeBudget(max_elements=21)  # the frame map, "type", "x", then 9 pairs
    ok = {"type": "x", **{f"k{i}": i for i in range(9)}}
    assert decode_body(body_of(ok), budget) == ok
    assert refused(body_of({**ok, "k9": 9}), budget).limit == "max_elements"


def test_depth_is_bounded_and_counted_from_the_frame() -> None:
    budget = DecodeBudget(max_depth=8)
    assert decode_body(body_of(nested(8)), budget) == nested(8)
    assert refused(body_of(nested(9)), budget).limit == "max_depth"


def test_depth_of_a_wide_container_with_one_deep_child() -> None:
    budget = DecodeBudget(max_depth=5)
    deep = nested(5)["v"]
    wide = {"type": "x", "v": [1] * 100 + [deep] + [[]] * 100}  # 1 + 1 + 4 = 6 deep
    assert refused(body_of(wide), budget).limit == "max_depth"
    wide["v"] = [1] * 100 + [deep[0]] + [[]] * 100
    assert decode_body(body_of(wide), budget) == wide


def test_decoded_bytes_are_estimated_per_object() -> None:
    budget = DecodeBudget(max_decoded_bytes=1_000_000)
    few = {"type": "x", "maps": [{}] * 2000}  # about 2000 * 250 bytes
    many = {"type": "x", "maps": [{}] * 5000}
    assert decode_body(body_of(few), budget) == few
    assert refused(body_of(many), budget).limit == "max_decoded_bytes"


def test_strings_count_with_the_body() -> None:
    budget = DecodeBudget(max_decoded_bytes=100_000)
    assert refused(body_of({"type": "x", "s": "a" * 100_000}), budget).limit == (
        "max_decoded_bytes"
    )


def test_msgpack_stack_overflow_is_named_as_depth() -> None:
    assert refused(b"\x91" * 5000 + b"\x00", DEFAULT_BUDGET).limit == "max_depth"


def test_over_budget_is_a_remote_protocol_error_and_sticks() -> None:
    decoder = FrameDecoder(1 << 20, DecodeBudget(max_elements=3))
    decoder.receive_data(encode_frame({"type": "x", "a": [1, 2, 3]}))
    with pytest.raises(RemoteProtocolError, match="max_elements"):
        decoder.next_frame()
    with pytest.raises(RemoteProtocolError, match="max_elements"):
        decoder.next_frame()


def test_an_oversized_header_names_the_limit() -> None:
    decoder = FrameDecoder(100)
    with pytest.raises(FrameOverBudget, match="max_frame_bytes") as caught:
        decoder.receive_data((101).to_bytes(4, "big"))
    assert caught.value.limit == "max_frame_bytes"


def test_bodies_can_be_taken_and_decoded_elsewhere() -> None:
    decoder = FrameDecoder(1 << 20)
    decoder.receive_data(encode_frame({"type": "a"}) + encode_frame({"type": "b"})[:3])
    assert decoder.in_frame
    body = decoder.next_body()
    assert body is not None and decode_body(body) == {"type": "a"}
    assert decoder.next_body() is None and decoder.in_frame
    decoder.receive_data(encode_frame({"type": "b"})[3:])
    assert decoder.pending_body_bytes is not None
    assert decoder.next_frame() == {"type": "b"}
    assert not decoder.in_frame


def test_budget_fields_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        DecodeBudget(max_depth=0)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(frame=st.dictionaries(st.text(max_size=6), _values, max_size=6))
def test_within_budget_a_frame_decodes_exactly_as_without(frame: dict[str, Any]) -> None:
    frame["type"] = "x"
    body = body_of(frame)
    assert decode_body(body, DEFAULT_BUDGET) == msgpack.unpackb(body, raw=False)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _elements(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + _elements(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_elements(v) for v in value)
    return 1


@settings(max_examples=300, deadline=None)
@given(
    frame=st.dictionaries(st.text(max_size=6), _values, max_size=6),
    max_depth=st.integers(1, 6),
    max_elements=st.integers(1, 80),
)
def test_depth_and_elements_match_an_independent_count(
    frame: dict[str, Any], max_depth: int, max_elements: int
) -> None:
    frame["type"] = "x"
    budget = DecodeBudget(max_depth=max_depth, max_elements=max_elements)
    depth, elements = _depth(frame), _elements(frame)
    try:
        decoded = decode_body(body_of(frame), budget)
    except FrameOverBudget as exc:
        assert (exc.limit == "max_depth" and depth > max_depth) or (
            exc.limit == "max_elements" and elements > max_elements
        )
    else:
        assert decoded == frame
        assert depth <= max_depth and elements <= max_elements
