"""Length-prefixed msgpack frames: a pure, sans-I/O codec.

Theory of operation
-------------------
Every message on a fedstream socket (client API and peer links alike) is one *frame*::

    +----------------------+------------------------------------------+
    | N: uint32 big-endian | N bytes: exactly one msgpack map         |
    +----------------------+------------------------------------------+

The map has ``str`` keys only (at every depth) and a ``"type"`` field holding a ``str``; what
the other fields mean is the business of the protocol riding on top (see docs/protocol.md).

This module does no I/O and imports no asyncio, in the manner of h11: bytes go in with
:meth:`FrameDecoder.receive_data` (``b""`` meaning end of stream), frames come out of
:meth:`FrameDecoder.next_frame`, which returns ``None`` while it needs more bytes. The decoder
is a two-state machine, *header* (waiting for the 4 length bytes) and *body* (waiting for N
bytes), plus a terminal *error* state: once it has raised, it raises the same error again on
every call, because after a framing error the byte stream cannot be resynchronised.

Hostile input is expected. The length is checked against ``max_frame_bytes`` as soon as the
header is complete, before any of the body is buffered, so a peer cannot make us allocate
more than one frame's worth of memory (plus one read chunk). The body is unpacked with
msgpack's strict settings and length limits derived from the body size; *anything* that goes
wrong while unpacking or checking a frame surfaces as :class:`RemoteProtocolError`, never as
another exception (tests/unit/test_wire.py fuzzes this contract).

:func:`encode_frame` is the sending half: it refuses, with :class:`LocalProtocolError` and
before anything is sent, a frame the other side would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import msgpack

from overlay.errors import LocalProtocolError, RemoteProtocolError

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "HEADER_BYTES", "FrameDecoder", "encode_frame"]

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
HEADER_BYTES = 4
_MAX_LENGTH_FIELD = 2**32 - 1


def _str_keyed_map(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    # msgpack's strict_map_key still lets bytes keys through, and a map may repeat a key;
    # both are refused so that every frame means exactly one thing.
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("a map repeats a key")
    for key in result:
        if not isinstance(key, str):
            raise ValueError(f"a map key is {type(key).__name__}, not str")
    return result


class FrameDecoder:
    """Turns a byte stream into frames (dicts); see the module docstring."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not 1 <= max_frame_bytes <= _MAX_LENGTH_FIELD:
            raise ValueError(f"max_frame_bytes must be in 1..{_MAX_LENGTH_FIELD}")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._pos = 0  # bytes of _buffer already consumed (compacted on the next receive)
        self._body_bytes: int | None = None  # None: in the header state
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames (headers already read excluded)."""
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the stream; ``b""`` means the other side closed it."""
        if self._error is not None:
            raise self._error
        if self._eof:
            raise RuntimeError("receive_data() after end of stream")
        if not data:
            self._eof = True
            return
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data
        self._read_header()

    def next_frame(self) -> dict[str, Any] | None:
        """The next complete frame, or ``None`` when more bytes are needed.

        Raises :class:`RemoteProtocolError` for an invalid frame, and for a stream that ended
        inside a frame. At a clean end of stream it keeps returning ``None``; use
        :attr:`at_eof` to tell the two apart.
        """
        if self._error is not None:
            raise self._error
        self._read_header()
        size = self._body_bytes
        if size is None or self.buffered_bytes < size:
            if self._eof and (size is not None or self.buffered_bytes):
                self._fail(f"stream ended inside a frame ({self.buffered_bytes} bytes left over)")
            return None
        body = bytes(self._buffer[self._pos : self._pos + size])
        self._pos += size
        self._body_bytes = None
        return self._parse(body)

    @property
    def at_eof(self) -> bool:
        """True once the stream has ended cleanly and every frame has been returned."""
        return self._eof and self._body_bytes is None and not self.buffered_bytes

    def _read_header(self) -> None:
        if self._body_bytes is not None or self.buffered_bytes < HEADER_BYTES:
            return
        size = int.from_bytes(self._buffer[self._pos : self._pos + HEADER_BYTES], "big")
        if size > self.max_frame_bytes:
            self._fail(f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes} bytes")
        self._pos += HEADER_BYTES
        self._body_bytes = size

    def _parse(self, body: bytes) -> dict[str, Any]:
        size = len(body)
        try:
            frame = msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                use_list=True,
                object_pairs_hook=_str_keyed_map,
                max_str_len=size,
                max_bin_len=size,
                max_ext_len=size,
                max_array_len=size,
                max_map_len=size // 2,
            )
        except Exception as exc:
            # msgpack raises ExtraData, FormatError, StackError, ValueError, TypeError,
            # OverflowError, UnicodeDecodeError ... on hostile bytes: all mean the same here.
            self._fail(f"frame body is not one valid msgpack value: {exc!r}", exc)
        if not isinstance(frame, dict):
            self._fail(f"frame body is a msgpack {type(frame).__name__}, not a map")
        kind = frame.get("type")
        if not isinstance(kind, str):
            self._fail("frame has no str 'type' field")
        return frame

    def _fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        self._error = RemoteProtocolError(message)
        self._buffer.clear()  # the rest of the stream is meaningless now
        self._pos = 0
        raise self._error from cause


def encode_frame(
    frame: Mapping[str, Any], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    """The bytes of one frame (header included).

    Raises :class:`LocalProtocolError` if ``frame`` is not a mapping with a str ``"type"`` and
    str keys, holds a value msgpack cannot encode, or encodes to more than
    ``max_frame_bytes``. Nested maps must have str keys too (the decoder refuses others).
    """
    if not isinstance(frame, Mapping):
        raise LocalProtocolError(f"a frame must be a mapping, not {type(frame).__name__}")
    if not isinstance(frame.get("type"), str):
        raise LocalProtocolError("a frame needs a str 'type' field")
    for key in frame:
        if not isinstance(key, str):
            raise LocalProtocolError(f"frame key {key!r} is not a str")
    try:
        body: bytes = msgpack.packb(dict(frame), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"{frame['type']} frame cannot be encoded: {exc}") from exc
    limit = min(max_frame_bytes, _MAX_LENGTH_FIELD)
    if len(body) > limit:
        raise LocalProtocolError(
            f"{frame['type']} frame of {len(body)} bytes exceeds the limit of {limit} bytes"
        )
    return len(body).to_bytes(HEADER_BYTES, "big") + body
