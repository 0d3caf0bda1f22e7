"""The frame codec: byte-exact encoding, incremental decoding, and hostile input."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from overlay.stream import memory_stream_pair
from overlay.wire import FrameDecoder, encode_frame
from peer.testing import all_tasks_blocked

HELLO = {"type": "hello", "id": 1, "client": "py"}
# The worked example of docs/protocol.md.
HELLO_BYTES = bytes.fromhex(
    "0000001a 83 a474797065 a568656c6c6f a26964 01 a6636c69656e74 a27079".replace(" ", "")
)


def decode_all(data: bytes, *, max_frame_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    decoder = FrameDecoder(max_frame_bytes)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    assert decoder.at_eof
    return frames


def raw_frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


# -- encoding ---------------------------------------------------------------------------------


def test_encode_is_byte_exact() -> None:
    assert encode_frame(HELLO) == HELLO_BYTES


def test_decode_is_byte_exact() -> None:
    assert decode_all(HELLO_BYTES) == [HELLO]


def test_round_trip_of_every_msgpack_type_we_use() -> None:
    frame = {
        "type": "push",
        "id": 2**40,
        "stream": "people",
        "columns": {
            "i": [1, -2, 2**63 - 1],
            "d": [0.5, -1e300],
            "b": [True, False],
            "s": ["", "żółw"],
            "ts": [1_700_000_000_000_000],
            "n": [None],
        },
        "arrow": b"\x00\xff",
    }
    assert decode_all(encode_frame(frame)) == [frame]


def test_bin_and_str_stay_distinct() -> None:
    (frame,) = decode_all(encode_frame({"type": "x", "b": b"abc", "s": "abc"}))
    assert frame["b"] == b"abc" and frame["s"] == "abc"


@pytest.mark.parametrize(
    "bad",
    [
        ["type", "x"],
        {"id": 1},
        {"type": 7},
        {"type": "x", 1: "int key"},
        {"type": "x", "value": object()},
        {"type": "x", "value": 2**64},
    ],
)
def test_encode_refuses_invalid_frames(bad: Any) -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(bad)


def test_encode_refuses_oversized_frames() -> None:
    frame = {"type": "x", "blob": b"\x00" * 100}
    assert len(encode_frame(frame, max_frame_bytes=200)) > 100
    with pytest.raises(LocalProtocolError, match="exceeds the limit of 50 bytes"):
        encode_frame(frame, max_frame_bytes=50)


# -- incremental decoding ---------------------------------------------------------------------


def test_split_at_every_byte() -> None:
    data = HELLO_BYTES + encode_frame({"type": "status", "id": 2})
    for cut in range(len(data) + 1):
        decoder = FrameDecoder()
        frames = []
        for chunk in (data[:cut], data[cut:]):
            if chunk:
                decoder.receive_data(chunk)
            while (frame := decoder.next_frame()) is not None:
                frames.append(frame)
        assert frames == [HELLO, {"type": "status", "id": 2}], cut


def test_one_byte_at_a_time() -> None:
    data = b"".join(encode_frame({"type": "t", "n": n}) for n in range(5))
    decoder = FrameDecoder()
    frames = []
    for i in range(len(data)):
        decoder.receive_data(data[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            frames.append(frame)
    assert [f["n"] for f in frames] == list(range(5))
    decoder.receive_data(b"")
    assert decoder.next_frame() is None and decoder.at_eof


def test_several_frames_in_one_chunk() -> None:
    frames = [{"type": "batch", "offset": n, "columns": {"x": [n] * n}} for n in range(50)]
    assert decode_all(b"".join(encode_frame(f) for f in frames)) == frames


def test_need_more_data_is_none_not_eof() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(HELLO_BYTES[:10])
    assert decoder.next_frame() is None
    assert not decoder.at_eof


# -- refusing bad input -----------------------------------------------------------------------


def test_oversized_length_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(RemoteProtocolError, match="4294967295 bytes exceeds the limit"):
        decoder.receive_data(b"\xff\xff\xff\xff")  # no body at all: refused already
    # The decoder stays broken: the stream cannot be resynchronised.
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()
    assert decoder.buffered_bytes == 0


def test_length_exactly_at_the_limit_is_accepted() -> None:
    frame = encode_frame({"type": "x", "pad": "a" * 20})
    assert decode_all(frame, max_frame_bytes=len(frame) - 4)
    with pytest.raises(RemoteProtocolError):
        decode_all(frame, max_frame_bytes=len(frame) - 5)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "not one valid msgpack value"),
        (b"\xc1", "not one valid msgpack value"),  # never-used msgpack byte
        (msgpack.packb({"type": "x"}) + b"\x00", "not one valid msgpack value"),  # trailing
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb("type"), "not a map"),
        (msgpack.packb({"id": 1}), "no str 'type'"),
        (msgpack.packb({"type": 1}), "no str 'type'"),
        (msgpack.packb({"type": "x", 1: 2}), "not one valid msgpack value"),
        (msgpack.packb({"type": "x", b"k": 2}, use_bin_type=True), "not one valid"),
        (msgpack.packb({"type": "x", "m": {b"k": 1}}, use_bin_type=True), "not one valid"),
        (b"\x82\xa4type\xa1x\xa4type\xa1y", "not one valid msgpack value"),  # repeated key
        (b"\x81\xa4type\xa2\xff\xfe", "not one valid msgpack value"),  # invalid UTF-8
        (b"\x91" * 5000 + b"\x00", "max_depth"),  # deeper than msgpack's stack
        (b"\xdd\xff\xff\xff\xff", "not one valid msgpack value"),  # array claims 4G items
    ],
)
def test_invalid_bodies_are_remote_protocol_errors(body: bytes, why: str) -> None:
    with pytest.raises(RemoteProtocolError, match=why):
        decode_all(raw_frame(body))


@pytest.mark.parametrize("cut", [1, 3, 4, 10])
def test_eof_inside_a_frame(cut: int) -> None:
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        decode_all(HELLO_BYTES[:cut])


def test_data_after_eof_is_a_usage_error() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"")
    with pytest.raises(RuntimeError):
        decoder.receive_data(b"x")


def test_timestamps_stay_msgpack_timestamps() -> None:
    (frame,) = decode_all(raw_frame(b"\x82\xa4type\xa1x\xa1t\xd6\xff\x00\x00\x00\x01"))
    assert frame["t"] == msgpack.Timestamp(1, 0)


# -- the fuzz contract: parse it or raise RemoteProtocolError, never anything else ------------


def _feed(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_bytes=4096)
    previous = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if data[previous:cut]:
            decoder.receive_data(data[previous:cut])
        previous = cut
        while (frame := decoder.next_frame()) is not None:
            assert isinstance(frame, dict) and isinstance(frame["type"], str)
    decoder.receive_data(b"")
    while decoder.next_frame() is not None:
        pass


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048), cuts=st.lists(st.integers(0, 4096), max_size=4))
def test_fuzz_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(RemoteProtocolError):
        _feed(data, cuts)


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(value=_msgpack_values, mutation=st.binary(max_size=8), at=st.integers(0, 64))
def test_fuzz_framed_near_valid_msgpack(value: Any, mutation: bytes, at: int) -> None:
    """Well-framed bodies that are valid or slightly corrupted msgpack."""
    try:
        body = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return
    body = body[:at] + mutation + body[at + len(mutation) :]
    with contextlib.suppress(RemoteProtocolError):
        _feed(raw_frame(body), [])


def _fits_msgpack(value: Any) -> bool:
    """Whether msgpack can encode ``value``: every int, keys included, fits 64 bits."""
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, list):
        return all(map(_fits_msgpack, value))
    if isinstance(value, dict):
        return all(_fits_msgpack(k) and _fits_msgpack(v) for k, v in value.items())
    return True


def _str_keys_only(value: Any) -> bool:
    """Whether every map in ``value``, at every depth, has str keys only."""
    if isinstance(value, list):
        return all(map(_str_keys_only, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _str_keys_only(v) for k, v in value.items())
    return True


@given(frame=st.dictionaries(st.text(max_size=8), _msgpack_values, max_size=6), kind=st.text())
def test_fuzz_round_trip(frame: dict[str, Any], kind: str) -> None:
    """A frame comes back equal, or is refused: on the way out (LocalProtocolError) when msgpack
    cannot encode it, on the way in (RemoteProtocolError) when a nested map has a non-str key
    (encodable, but the strict decoder refuses it); never refused otherwise."""
    frame = {**frame, "type": kind}
    if not _fits_msgpack(frame):
        with pytest.raises(LocalProtocolError):
            encode_frame(frame)
        return
    data = encode_frame(frame)
    if _str_keys_only(frame):
        assert decode_all(data) == [frame]
    else:
        with pytest.raises(RemoteProtocolError, match="map key"):
            decode_all(data)


def test_protocol_errors_are_never_retriable() -> None:
    assert not ProtocolError.retriable
    assert issubclass(LocalProtocolError, ProtocolError)
    assert issubclass(RemoteProtocolError, ProtocolError)


# -- the in-memory stream pair ----------------------------------------------------------------


def test_memory_stream_pair_carries_frames_and_eof() -> None:
    async def main() -> None:
        async with asyncio.timeout(5):
            a, b = memory_stream_pair()
            await a.send(HELLO)
            await a.send({"type": "status", "id": 2})
            assert await b.recv() == HELLO
            assert await b.recv() == {"type": "status", "id": 2}
            await b.send({"type": "ok", "id": 2, "result": {}})
            assert (await a.recv() or {})["type"] == "ok"
            await a.aclose()
            assert await b.recv() is None
            with pytest.raises(ConnectionError):
                await b.send({"type": "late"})

    asyncio.run(main())


def test_memory_stream_pair_applies_backpressure() -> None:
    async def main() -> None:
        async with asyncio.timeout(5):
            a, b = memory_stream_pair(high_water_bytes=1024)
            blob = {"type": "x", "blob": b"\x00" * 600}
            await a.send(blob)  # under the high-water mark: returns at once
            blocked = asyncio.create_task(a.send(blob))  # over it: waits for b to read
            await all_tasks_blocked()
            assert not blocked.done()
            assert await b.recv() == blob
            await asyncio.wait_for(blocked, 1)
            assert await b.recv() == blob

    asyncio.run(main())
