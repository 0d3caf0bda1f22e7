"""Fuzzing the client API server and the peer-link protocol over the in-memory transport.

Hypothesis generates sequences of frames, mostly well-formed maps that look like requests and
link events (with arguments of every msgpack type, wrong ids, unknown operations) and now and
then raw bytes that break the framing. Each sequence is sent to one long-lived server (and to
fresh links), reconnecting whenever the other side closes the connection, as a hostile client
would. 100,000 frames in all (``FRAMES_PER_EXAMPLE`` x ``max_examples`` over both tests).

The contract, in h11's manner: every input is answered or refused, never a crash. So the
server answers only ``ok``/``error``/``batch``/``end`` frames and never code ``internal``, a
fresh client's ``hello`` is answered after every sequence, no task of a link fails, and
nothing grows without bound: after the run the server holds no connection, and the process
grew by less than 100 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.link import Link, LinkSettings
from overlay.stream import FrameStream, memory_stream_pair
from overlay.transport import MemoryNetwork
from overlay.wire import encode_frame
from peer.errors import InvalidInput
from peer.server import ApiServer
from peer.testing import wait_until
from tests.unit.test_api import FakePeer
from tests.unit.test_link_connection import ACME, Handler, Refusal

FRAMES_PER_EXAMPLE = 50
EXAMPLES = 1000  # per test: 2 x 1000 x 50 = 100,000 frames
REPLY_TYPES = {"ok", "error", "batch", "end"}


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


API_OPS = [
    "hello",
    "create_schema",
    "create_stream",
    "create_query",
    "create_sql",
    "set_query_status",
    "push",
    "subscribe",
    "unsubscribe",
    "lookup",
    "status",
    "credit",
    "nonsense",
]
API_ARGS = [
    "client",
    "version",
    "schema",
    "name",
    "query",
    "sql",
    "namespace",
    "status",
    "stream",
    "columns",
    "rows",
    "arrow",
    "start",
    "credit",
    "subscription",
    "batches",
    "producer",
    "seq",
    "replicas",
]
LINK_TYPES = ["req", "rep", "open", "item", "credit", "end", "cancel", "hello", "x"]
LINK_ARGS = ["body", "error", "credit", "n", "type", "op", "x", "code", "message"]
WORDS = ["people", "latest", "earliest", "RUNNING", "x", "", "a" * 300, "type", "id", "ok"]


class _Bytes:
    """Builds frames from Hypothesis's bytes, as a fuzzer's data provider does: drawing one
    blob per example is far cheaper than many small draws, and it still shrinks."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def byte(self) -> int:
        if self._pos >= len(self._data):
            return 0
        self._pos += 1
        return self._data[self._pos - 1]

    def pick(self, options: list[Any]) -> Any:
        return options[self.byte() % len(options)]

    def raw(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk

    def value(self, depth: int = 0) -> Any:
        kind = self.byte() % 12
        if kind == 0:
            return None
        if kind == 1:
            return bool(self.byte() & 1)
        if kind == 2:
            return self.byte() - 16
        if kind == 3:
            return int.from_bytes(self.raw(8), "big", signed=self.byte() & 1 == 1)
        if kind == 4:
            return self.byte() / 7
        if kind == 5:
            return self.pick(WORDS)
        if kind == 6:
            return self.raw(self.byte() % 16).decode("utf-8", "replace")
        if kind == 7:
            return self.raw(self.byte() % 16)
        if kind in (8, 9) and depth < 3:
            return [self.value(depth + 1) for _ in range(self.byte() % 4)]
        if kind in (10, 11) and depth < 3:
            keys = ["a", "x", "type", "id", "name", "int", "code"]
            return {self.pick(keys): self.value(depth + 1) for _ in range(self.byte() % 4)}
        return self.byte()

    def frame(self, kinds: list[str], args: list[str]) -> bytes:
        if self.byte() % 16 == 0:  # now and then: bytes that break the framing
            return self.raw(1 + self.byte() % 24) or b"\xff"
        frame: dict[str, Any] = {"type": self.pick(kinds)}
        rid = self.byte() % 10
        if rid < 8:
            frame["id"] = rid if rid < 6 else self.value()
        for _ in range(self.byte() % 4):
            frame[self.pick(args)] = self.value()
        try:
            return encode_frame(frame)
        except Exception:  # e.g. a key msgpack refuses: send a frame it cannot read instead
            return b"\x00\x00\x00\x01\xc1"

    def link_frame(self) -> bytes:
        """Mostly link events of the right shape (so that they reach the connection's
        checks), with random ids, credits and bodies; else any frame."""
        if self.byte() % 4 == 0:
            return self.frame(LINK_TYPES, LINK_ARGS)
        kind = self.pick(["req", "open", "credit", "cancel", "rep", "end", "item"])
        frame: dict[str, Any] = {"type": kind, "id": self.byte() % 8}
        if kind in ("req", "open", "rep", "item"):
            op = self.pick(["echo", "fail", "nope"])
            frame["body"] = {"type": op, "x": self.value(), "n": self.byte() % 5}
        if kind == "open":
            frame["credit"] = self.byte() % 6
        if kind == "credit":
            frame["n"] = self.byte() % 6 - 1
        return encode_frame(frame)


def _frames_of(kinds: list[str], args: list[str]) -> st.SearchStrategy[list[bytes]]:
    def build(data: bytes) -> list[bytes]:
        source = _Bytes(data)
        if kinds is LINK_TYPES:
            return [source.link_frame() for _ in range(FRAMES_PER_EXAMPLE)]
        return [source.frame(kinds, args) for _ in range(FRAMES_PER_EXAMPLE)]

    return st.binary(min_size=FRAMES_PER_EXAMPLE * 12, max_size=FRAMES_PER_EXAMPLE * 32).map(build)


_api_frames = _frames_of(API_OPS, API_ARGS)
_link_frames = _frames_of(LINK_TYPES, LINK_ARGS)


class _FuzzPeer(FakePeer):
    """The API tests' fake peer, whose own shortcuts (it trusts the shape of what it is given,
    as the real service, which checks it, does not) count as refusals: the server, not the
    fake, is under test."""

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name not in _SERVICE_CALLS:
            return attribute

        async def refusing(*args: Any) -> Any:
            try:
                return await attribute(*args)
            except (
                KeyError,
                TypeError,
                AttributeError,
                ValueError,
                IndexError,
                AssertionError,
            ) as exc:
                raise InvalidInput(f"the fake peer cannot take this: {exc!r}") from None

        return refusing


_SERVICE_CALLS = {
    "create_schema",
    "create_stream",
    "create_query",
    "set_query_status",
    "push",
    "lookup",
}


class _FuzzHandler(Handler):
    """The link tests' handler, taking any body: what it does not know it refuses with a
    code, as the peer's router does (the link, not the handler, is under test)."""

    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        if frame.get("type") == "echo":
            return {"echo": frame.get("x")}
        raise Refusal(f"unknown op {frame.get('type')!r}")

    async def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        n = frame.get("n")
        for i in range(n if isinstance(n, int) and 0 <= n < 8 else 1):
            yield {"i": i}


class _Failures(logging.Handler):
    """Error records of the code under test (a task that failed, an internal error)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def failures_logged() -> Iterator[_Failures]:
    """Errors logged in the block. Warnings (a link closed for an invalid frame: expected
    here) are not even made: pytest would keep every record, and with it the link it names."""
    handler = _Failures()
    root = logging.getLogger()
    loggers = [logging.getLogger(name) for name in ("overlay", "peer")]
    levels = [logger.level for logger in loggers]
    root.addHandler(handler)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


SENTINEL = 10**9  # the id of the hello that ends each sequence


async def _drain(stream: FrameStream, seen: list[dict[str, Any]]) -> None:
    with contextlib.suppress(Exception):  # the server may close at any time: that is allowed
        while (frame := await stream.recv()) is not None:
            seen.append(frame)
            if frame.get("id") == SENTINEL:
                return


API_SENTINEL = encode_frame({"type": "hello", "id": SENTINEL, "client": "z"})
LINK_SENTINEL = encode_frame({"type": "req", "id": SENTINEL, "body": {"type": "echo", "x": 0}})


async def _send_all(
    connect: Any,
    frames: list[bytes],
    seen: list[dict[str, Any]],
    on_close: Any = None,
    sentinel: bytes = API_SENTINEL,
) -> None:
    """Send every frame, on a new connection whenever the other side has closed ours; end
    with ``sentinel`` and wait for its answer (or the end of the connection)."""
    stream: FrameStream | None = None
    reader: asyncio.Task[None] | None = None
    for data in [*frames, sentinel]:
        if stream is None or reader is None or reader.done():
            if stream is not None:
                await stream.aclose(0.1)
                if on_close is not None:
                    await on_close()
            stream = await connect()
            reader = asyncio.create_task(_drain(stream, seen))
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(2):
                await stream.send_encoded(data)
        for _ in range(3):  # let the other side take it before the next one arrives
            await asyncio.sleep(0)
    assert stream is not None and reader is not None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.5):  # a half-sent frame: dropped after 0.2 s
            await asyncio.shield(reader)
    reader.cancel()
    await stream.aclose(0.1)
    if on_close is not None:
        await on_close()


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_api_server_answers_or_refuses_every_frame(loop: asyncio.AbstractEventLoop) -> None:
    network = MemoryNetwork()
    server = ApiServer(
        _FuzzPeer(), "127.0.0.1", 0, network=network, close_timeout_s=1, frame_timeout_s=0.2
    )
    loop.run_until_complete(server.start())
    before = rss_bytes()

    async def hello() -> None:
        stream = await network.connect("127.0.0.1", server.port)
        try:
            await stream.send({"type": "hello", "id": 1, "client": "check"})
            async with asyncio.timeout(5):
                reply = await stream.recv()
            assert reply is not None and reply["type"] == "ok"
        finally:
            await stream.aclose(0.1)

    replies = [0]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(frames=_api_frames)
    def one(frames: list[bytes]) -> None:
        seen: list[dict[str, Any]] = []

        async def connect() -> FrameStream:
            return await network.connect("127.0.0.1", server.port)

        with failures_logged() as failed:
            loop.run_until_complete(_send_all(connect, frames, seen))
            loop.run_until_complete(hello())
        assert not failed.records, [r.getMessage() for r in failed.records[:3]]
        for reply in seen:
            assert reply.get("type") in REPLY_TYPES, reply
            assert reply.get("code") != "internal", reply
        replies[0] += len(seen)

    try:
        one()

        settled = wait_until(
            lambda: server.connection_count == 0, "every connection closed", 10, every_s=0.01
        )
        loop.run_until_complete(settled)
        assert rss_bytes() - before < 100 * 1024 * 1024
        assert replies[0] > EXAMPLES * FRAMES_PER_EXAMPLE // 10  # the frames were read
    finally:
        loop.run_until_complete(server.close())


def test_a_link_answers_or_closes_on_every_frame(loop: asyncio.AbstractEventLoop) -> None:
    link_settings = LinkSettings(
        max_in_flight=4, max_streams=4, close_timeout_s=1, frame_timeout_s=0.2
    )
    before = rss_bytes()
    links: list[Link] = []
    answers = [0]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(frames=_link_frames)
    def one(frames: list[bytes]) -> None:
        seen: list[dict[str, Any]] = []
        running: list[asyncio.Task[None]] = []

        async def connect() -> FrameStream:
            ours, theirs = memory_stream_pair()
            link = Link(theirs, ACME, (4, 4), _FuzzHandler(), link_settings, address="memory:fuzz")
            links.append(link)
            running.append(asyncio.create_task(link.run()))
            return ours

        async def closed() -> None:
            for link in links:
                await link.close()
            links.clear()
            async with asyncio.timeout(5):
                await asyncio.gather(*running)
            running.clear()

        with failures_logged() as failed:
            loop.run_until_complete(
                _send_all(connect, frames, seen, on_close=closed, sentinel=LINK_SENTINEL)
            )
        assert not failed.records, [r.getMessage() for r in failed.records[:3]]
        for frame in seen:
            assert frame.get("type") in {"rep", "end", "item", "credit"}, frame
        answers[0] += len(seen)

    one()
    assert not links
    assert answers[0] > EXAMPLES  # the links did answer
    assert rss_bytes() - before < 100 * 1024 * 1024
