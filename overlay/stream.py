"""Frames over an asyncio byte stream: the stream type of :mod:`overlay.transport`.

:class:`FrameStream` joins the pure codec of :mod:`overlay.wire` to a byte stream with the
shape of asyncio's ``StreamReader``/``StreamWriter``. Everything in fedstream that talks over
a socket does so through a ``FrameStream`` made by :mod:`overlay.transport` (which holds the
socket and TLS code), so swapping in :func:`memory_stream_pair` makes that code testable
without sockets (httpcore's mock backend, trio's memory streams).

Backpressure is the writer's: :meth:`FrameStream.send` writes, then awaits ``drain()``, which
blocks while the transport's buffer is above its high-water mark, i.e. while the other side is
not reading. A sender that awaits ``send`` therefore cannot outrun its receiver by more than
one buffer. Reads are bounded too: at most one chunk beyond one frame is ever buffered.

Connection loss surfaces as ``OSError`` (usually ``ConnectionError``) from ``recv``/``send``;
an invalid byte stream as :class:`~overlay.errors.RemoteProtocolError` from ``recv``.

Budgets and time (issue 12): each frame is decoded under the stream's
:class:`~overlay.wire.DecodeBudget`; a frame over ``decode_inline_bytes`` is decoded in the
bounded worker pool of :func:`decode_pool`, off the event loop, so that one large frame does
not hold up every other connection. A frame whose first byte has arrived must be complete
within ``frame_timeout_s`` (a frame half-sent for too long is refused, naming
``frame_timeout_s``), and ``recv(idle_timeout_s=...)`` gives up with :class:`IdleTimeout`
when no frame starts in that time (the stream is intact: the caller decides whether the
connection is idle). :attr:`FrameStream.last_active` is when a frame last went either way.
Large frames arriving at once share one budget per event loop (``PARTIAL_BUDGET_BYTES``): a
frame over ``LARGE_FRAME_BYTES`` takes its declared size from it once its header is in, and
its stream reads no more of it (the sender is held back by TCP) until there is room, so that
connections sending frames slowly cannot together fill the peer's memory.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from overlay.errors import RemoteProtocolError
from overlay.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    DecodeBudget,
    FrameDecoder,
    FrameOverBudget,
    decode_body,
    encode_frame,
)

__all__ = [
    "ByteReader",
    "ByteWriter",
    "FrameStream",
    "IdleTimeout",
    "decode_pool",
    "memory_stream_pair",
]

READ_CHUNK_BYTES = 64 * 1024
CLOSE_TIMEOUT_S = 5.0
# Frames up to this size are decoded on the event loop (at most some 64 K small objects,
# a few milliseconds); larger ones in the decode pool.
DECODE_INLINE_BYTES = 64 * 1024
DECODE_WORKERS = 1
# Large frames in progress hold at most this many bytes at once per event loop (a frame over
# it alone still proceeds, when nothing else is held); smaller frames are not counted.
PARTIAL_BUDGET_BYTES = 128 * 1024 * 1024
LARGE_FRAME_BYTES = 1024 * 1024

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def decode_pool(workers: int | None = None) -> ThreadPoolExecutor:
    """The process's bounded pool that decodes large frames (made on first use with
    ``workers`` threads, default :data:`DECODE_WORKERS`; later calls return the same pool).
    msgpack holds the GIL while it builds a container, so more threads than cores would only
    queue: one or two is the right size."""
    global _pool
    with _pool_lock:
        if _pool is None:
            count = workers or DECODE_WORKERS
            if count < 1:
                raise ValueError("the decode pool needs at least one worker")
            _pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="frame-decode")
        return _pool


class _Reservoir:
    """The bytes of large frames in progress on one event loop, up to ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._changed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self.held and self.held + size > self.capacity:
            self._changed.clear()
            await self._changed.wait()
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size
        self._changed.set()


_reservoirs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reservoir] = (
    weakref.WeakKeyDictionary()
)


def _reservoir() -> _Reservoir:
    loop = asyncio.get_running_loop()
    found = _reservoirs.get(loop)
    if found is None:
        found = _reservoirs[loop] = _Reservoir(PARTIAL_BUDGET_BYTES)
    return found


class IdleTimeout(TimeoutError):
    """No frame started within the ``idle_timeout_s`` given to :meth:`FrameStream.recv`;
    the stream is unchanged and may be read again."""


class ByteReader(Protocol):
    """The part of ``asyncio.StreamReader`` a FrameStream uses."""

    async def read(self, n: int = -1) -> bytes: ...


class ByteWriter(Protocol):
    """The part of ``asyncio.StreamWriter`` a FrameStream uses."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class FrameStream:
    """A bidirectional stream of frames.

    One task at a time may ``recv``; ``send`` may be called from several tasks (frames are
    written whole, one after the other).
    """

    def __init__(
        self,
        reader: ByteReader,
        writer: ByteWriter,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        read_chunk_bytes: int = READ_CHUNK_BYTES,
        budget: DecodeBudget | None = None,
        frame_timeout_s: float | None = None,
        decode_inline_bytes: int = DECODE_INLINE_BYTES,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(max_frame_bytes, budget)
        self._read_chunk_bytes = read_chunk_bytes
        self.frame_timeout_s = frame_timeout_s
        self._decode_inline_bytes = decode_inline_bytes
        self._frame_started: float | None = None  # when the frame now arriving began
        self._reserved = 0  # bytes this stream's frame in progress holds of the reservoir
        self.last_active = time.monotonic()  # when a frame last went either way
        self._send_lock = asyncio.Lock()
        self._closed = False
        # bytes through this stream, as written and as read (what a link's traffic counts)
        self.sent_bytes = 0
        self.received_bytes = 0
        peername = writer.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.peer = f"{peername[0]}:{peername[1]}"
        else:
            self.peer = str(peername or "?")

    @property
    def max_frame_bytes(self) -> int:
        return self._decoder.max_frame_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def ssl_object(self) -> ssl.SSLObject | None:
        """The TLS session after its handshake (its peer's certificate); None without TLS."""
        tls = self._writer.get_extra_info("ssl_object")
        return tls if isinstance(tls, ssl.SSLObject) else None

    @property
    def budget(self) -> DecodeBudget | None:
        return self._decoder.budget

    def set_limits(self, budget: DecodeBudget | None, frame_timeout_s: float | None) -> None:
        """Decode later frames under ``budget``, each due within ``frame_timeout_s``."""
        self._decoder.budget = budget
        self.frame_timeout_s = frame_timeout_s

    async def recv(self, *, idle_timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next frame, or ``None`` once the other side has closed cleanly.

        Raises :class:`IdleTimeout` if no frame starts within ``idle_timeout_s`` (None: wait
        for ever), :class:`~overlay.errors.RemoteProtocolError` for an invalid frame, one over
        budget or one not complete within ``frame_timeout_s``.
        """
        decoder = self._decoder
        try:
            while True:
                body = decoder.next_body()
                if body is not None:
                    self._release()
                    frame = await self._decode(body)
                    self.last_active = now = time.monotonic()
                    self._frame_started = now if decoder.in_frame else None
                    return frame
                if decoder.at_eof:
                    return None
                data = await self._read(idle_timeout_s)
                self.received_bytes += len(data)
                decoder.receive_data(data)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self._reserved:
            _reservoir().give(self._reserved)
            self._reserved = 0

    async def _read(self, idle_timeout_s: float | None) -> bytes:
        decoder = self._decoder
        if not decoder.in_frame:  # between frames: the caller's idle timeout applies
            idle = asyncio.timeout(idle_timeout_s)
            try:
                async with idle:
                    data = await self._reader.read(self._read_chunk_bytes)
            except TimeoutError:
                if not idle.expired():  # ETIMEDOUT from the socket: a lost connection
                    raise
                raise IdleTimeout(f"no frame from {self.peer} in {idle_timeout_s} s") from None
            self._frame_started = time.monotonic()
            return data
        limit = self.frame_timeout_s
        if limit is None:
            await self._reserve()
            return await self._reader.read(self._read_chunk_bytes)
        if self._frame_started is None:
            self._frame_started = time.monotonic()
        deadline = asyncio.timeout(self._frame_started + limit - time.monotonic())
        try:
            async with deadline:
                await self._reserve()
                return await self._reader.read(self._read_chunk_bytes)
        except TimeoutError:
            if not deadline.expired():
                raise
            size = decoder.pending_body_bytes
            got = f"{decoder.buffered_bytes} of {size} bytes" if size else "its header"
            decoder.fail(
                FrameOverBudget(
                    f"frame from {self.peer} not complete within {limit:g} s (frame_timeout_s): "
                    f"{got} arrived",
                    "frame_timeout_s",
                )
            )

    async def _reserve(self) -> None:
        """A large frame takes its size from the reservoir before more of it is read."""
        size = self._decoder.pending_body_bytes
        if size is not None and size > LARGE_FRAME_BYTES and not self._reserved:
            await _reservoir().take(size)
            self._reserved = size

    async def _decode(self, body: bytes) -> dict[str, Any]:
        """Decode a body here if it is small, else in the decode pool (off the loop). A
        cancelled wait leaves the worker to finish; its frame is dropped."""
        budget = self._decoder.budget
        try:
            if len(body) <= self._decode_inline_bytes:
                return decode_body(body, budget)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(decode_pool(), decode_body, body, budget)
        except RemoteProtocolError as exc:
            self._decoder.fail(exc)

    async def send(self, frame: Mapping[str, Any]) -> None:
        """Encode and send one frame; returns once the transport has room again.

        Raises :class:`~overlay.errors.LocalProtocolError` (nothing sent) if the frame is
        invalid or larger than ``max_frame_bytes``.
        """
        await self.send_encoded(encode_frame(frame, max_frame_bytes=self.max_frame_bytes))

    async def send_encoded(self, data: bytes) -> None:
        """Send bytes made by :func:`~overlay.wire.encode_frame` (lets callers encode early)."""
        async with self._send_lock:
            if self._closed:
                raise ConnectionResetError("frame stream is closed")
            self._writer.write(data)
            self.sent_bytes += len(data)
            await self._writer.drain()
            self.last_active = time.monotonic()

    async def aclose(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close both directions, flushing what was sent for up to ``timeout_s``; a peer that
        does not read by then is cut off (the transport is aborted)."""
        if self._closed:
            return
        self._closed = True
        self._release()
        self._writer.close()
        try:
            async with asyncio.timeout(timeout_s):
                await self._writer.wait_closed()
        except TimeoutError:
            transport = getattr(self._writer, "transport", None)
            if transport is not None:
                transport.abort()
        except OSError:
            pass  # the connection is going away either way; nothing left to tell anyone


class _Pipe:
    """One direction of an in-memory byte stream, bounded by a high-water mark."""

    def __init__(self, high_water_bytes: int) -> None:
        self._buffer = bytearray()
        self._high_water = high_water_bytes
        self._writer_closed = False
        self._reader_closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    async def read(self, n: int = -1) -> bytes:
        while not self._buffer and not self._writer_closed and not self._reader_closed:
            self._readable.clear()
            await self._readable.wait()
        if self._reader_closed:
            raise ConnectionResetError("memory stream closed")
        n = len(self._buffer) if n < 0 else n
        chunk = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) <= self._high_water:
            self._writable.set()
        return chunk

    def write(self, data: bytes) -> None:
        if self._writer_closed or self._reader_closed:
            raise ConnectionResetError("memory stream closed")
        self._buffer += data
        self._readable.set()

    async def drain(self) -> None:
        while len(self._buffer) > self._high_water and not self._reader_closed:
            self._writable.clear()
            await self._writable.wait()
        if self._reader_closed:
            raise ConnectionResetError("the other end closed the memory stream")

    def close_writer(self) -> None:
        self._writer_closed = True
        self._readable.set()

    def close_reader(self) -> None:
        self._reader_closed = True
        self._buffer.clear()
        self._readable.set()
        self._writable.set()


class _MemoryWriter:
    def __init__(self, outgoing: _Pipe, incoming: _Pipe, name: str) -> None:
        self._outgoing = outgoing
        self._incoming = incoming
        self._name = name

    def write(self, data: bytes) -> None:
        self._outgoing.write(data)

    async def drain(self) -> None:
        await self._outgoing.drain()

    def close(self) -> None:
        # Like closing a socket: the other side reads EOF, and can no longer write to us.
        self._outgoing.close_writer()
        self._incoming.close_reader()

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._name if name == "peername" else default


def memory_stream_pair(
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    high_water_bytes: int = READ_CHUNK_BYTES,
    b_max_frame_bytes: int | None = None,
    names: tuple[str, str] = ("memory:a", "memory:b"),
) -> tuple[FrameStream, FrameStream]:
    """Two FrameStreams ``a`` and ``b`` joined in memory, each direction buffering at most
    about ``high_water_bytes`` before ``send`` blocks: a socket-free link for tests.

    ``b`` reads frames of up to ``b_max_frame_bytes`` (default: ``max_frame_bytes``, as
    ``a``); ``names`` are the ends' addresses (each one's ``peer`` is the other's name)."""
    a_to_b = _Pipe(high_water_bytes)
    b_to_a = _Pipe(high_water_bytes)
    a_name, b_name = names
    a = FrameStream(b_to_a, _MemoryWriter(a_to_b, b_to_a, b_name), max_frame_bytes=max_frame_bytes)
    b = FrameStream(
        a_to_b,
        _MemoryWriter(b_to_a, a_to_b, a_name),
        max_frame_bytes=max_frame_bytes if b_max_frame_bytes is None else b_max_frame_bytes,
    )
    return a, b
