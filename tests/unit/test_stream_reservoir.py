"""Large frames in progress share one byte budget per event loop (overlay.stream): a stream
whose large frame does not fit waits, reading no more of it, until another frame completes or
fails; every reservation is given back."""

from __future__ import annotations

import asyncio

import pytest

from overlay import stream as stream_module
from overlay.errors import RemoteProtocolError
from overlay.stream import memory_stream_pair
from overlay.wire import encode_frame
from peer.testing import all_tasks_blocked

MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_module, "PARTIAL_BUDGET_BYTES", 3 * MIB)
    monkeypatch.setattr(stream_module, "LARGE_FRAME_BYTES", MIB)


def frame(tag: int) -> bytes:
    return encode_frame({"type": "t", "tag": tag, "pad": bytes(2 * MIB)})


def test_a_large_frame_waits_for_room_then_arrives() -> None:
    async def body() -> None:
        a1, b1 = memory_stream_pair(high_water_bytes=8 * MIB)
        a2, b2 = memory_stream_pair(high_water_bytes=8 * MIB)
        f1, f2 = frame(1), frame(2)
        a1._writer.write(f1[: len(f1) // 2])  # half of frame 1: it holds 2 MiB
        first = asyncio.create_task(b1.recv())
        await all_tasks_blocked()
        assert stream_module._reservoir().held == len(f1) - 4
        a2._writer.write(f2)  # all of frame 2, which does not fit beside frame 1
        second = asyncio.create_task(b2.recv())
        await all_tasks_blocked()
        assert not second.done() and not first.done()
        assert b2.received_bytes < MIB  # it stopped reading frame 2
        a1._writer.write(f1[len(f1) // 2 :])
        got1 = await asyncio.wait_for(first, 5)
        got2 = await asyncio.wait_for(second, 5)
        assert got1 is not None and got2 is not None
        assert (got1["tag"], got2["tag"]) == (1, 2)
        assert len(got2["pad"]) == 2 * MIB
        assert stream_module._reservoir().held == 0

    asyncio.run(body())


def test_a_frame_that_times_out_gives_its_room_back() -> None:
    async def body() -> None:
        a, b = memory_stream_pair(high_water_bytes=8 * MIB)
        b.set_limits(None, 0.2)
        f = frame(1)
        a._writer.write(f[: len(f) // 2])
        with pytest.raises(RemoteProtocolError, match="frame_timeout_s"):
            await asyncio.wait_for(b.recv(), 5)
        assert stream_module._reservoir().held == 0

    asyncio.run(body())


def test_small_frames_take_no_room() -> None:
    async def body() -> None:
        a, b = memory_stream_pair()
        await a.send({"type": "t", "tag": 1, "pad": bytes(1000)})
        got = await asyncio.wait_for(b.recv(), 5)
        assert got is not None and got["tag"] == 1
        assert stream_module._reservoir().held == 0

    asyncio.run(body())
