"""What an Arrow IPC stream says it holds, read before anything of it is decoded.

Theory of operation: a pushed ``arrow`` body is a stream of IPC messages (a schema, then
record batches, perhaps dictionary batches). With compression (LZ4 or ZSTD, per buffer) a few
kilobytes can declare hundreds of megabytes, and pyarrow allocates each buffer whole as it
decompresses it; the frame limit says nothing about that. So before pyarrow decodes a batch,
:func:`declared_size` walks every message's metadata (a FlatBuffer, ``Message.fbs`` of the
Arrow format) with :class:`pyarrow.ipc.MessageReader`, which only slices the body, and adds
up what the batches declare: their rows (``RecordBatch.length``) and the bytes of their
buffers once decompressed (a compressed buffer starts with its uncompressed length as a
little-endian int64, -1 for one stored as is). A stream over the budget is refused without
being decoded; pyarrow then refuses a buffer that inflates to anything but its declared
length, so the declaration bounds the actual size. Nothing here allocates more than the
metadata already occupies.

The FlatBuffer reader below covers the few tables it needs (Message, RecordBatch,
DictionaryBatch, BodyCompression) and checks every offset against the buffer, raising
:class:`ValueError` on anything malformed; pyarrow exposes no parser of its own for them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

__all__ = ["IpcSize", "declared_size"]

# MessageHeader union members (Message.fbs)
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_UNCOMPRESSED = -1  # a compressed body's buffer stored as is
_MAX_MESSAGES = 1 << 16  # batches of one push; an empty batch costs ~200 bytes of metadata


@dataclass(frozen=True)
class IpcSize:
    """What a stream's batches declare: rows (record batches only) and buffer bytes once
    decompressed (dictionaries included)."""

    rows: int
    bytes: int
    compressed: bool


class _Table:
    """One FlatBuffer table in ``buf`` at ``pos``; every read is bounds-checked."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        vtable = pos - _i32(buf, pos)
        self.vtable = vtable
        self.vsize = _u16(buf, vtable)
        if self.vsize < 4 or self.vsize % 2:
            raise ValueError("malformed FlatBuffer vtable")
        _need(buf, vtable, self.vsize)

    def _field(self, index: int) -> int:
        slot = 4 + 2 * index
        return 0 if slot >= self.vsize else _u16(self.buf, self.vtable + slot)

    def scalar(self, index: int, fmt: str, default: int) -> int:
        off = self._field(index)
        if not off:
            return default
        layout = "<" + fmt
        at = _need(self.buf, self.pos + off, struct.calcsize(layout))
        value: int = struct.unpack_from(layout, self.buf, at)[0]
        return value

    def _target(self, index: int) -> int | None:
        off = self._field(index)
        if not off:
            return None
        at = self.pos + off
        return at + _u32(self.buf, at)

    def table(self, index: int) -> _Table | None:
        target = self._target(index)
        return None if target is None else _Table(self.buf, target)

    def structs(self, index: int, size: int) -> list[tuple[int, int]]:
        """A vector of two-int64 structs (FieldNode, Buffer)."""
        target = self._target(index)
        if target is None:
            return []
        count = _u32(self.buf, target)
        _need(self.buf, target + 4, count * size)
        return [
            (int(a), int(b))
            for a, b in (
                struct.unpack_from("<qq", self.buf, target + 4 + i * size) for i in range(count)
            )
        ]


def _need(buf: bytes, pos: int, size: int) -> int:
    if pos < 0 or size < 0 or pos + size > len(buf):
        raise ValueError("FlatBuffer offset out of bounds")
    return pos


def _u16(buf: bytes, pos: int) -> int:
    value: int = struct.unpack_from("<H", buf, _need(buf, pos, 2))[0]
    return value


def _u32(buf: bytes, pos: int) -> int:
    value: int = struct.unpack_from("<I", buf, _need(buf, pos, 4))[0]
    return value


def _i32(buf: bytes, pos: int) -> int:
    value: int = struct.unpack_from("<i", buf, _need(buf, pos, 4))[0]
    return value


def _batch_bytes(batch: _Table, body: pa.Buffer | None) -> int:
    """The bytes a RecordBatch's buffers hold once decompressed."""
    compressed = batch.table(3) is not None
    size = 0
    body_len = 0 if body is None else body.size
    for offset, length in batch.structs(2, 16):
        if offset < 0 or length < 0 or offset + length > body_len:
            raise ValueError("a buffer lies outside the message body")
        if not compressed or length == 0:
            size += length
            continue
        if length < 8:
            raise ValueError("a compressed buffer is shorter than its length prefix")
        assert body is not None
        (declared,) = struct.unpack("<q", body.slice(offset, 8).to_pybytes())
        if declared == _UNCOMPRESSED:
            size += length - 8
        elif declared < 0:
            raise ValueError(f"a compressed buffer declares {declared} bytes")
        else:
            size += declared
    return size


def declared_size(
    body: bytes | memoryview | pa.Buffer, *, max_bytes: int, max_rows: int
) -> IpcSize:
    """What the IPC stream ``body`` declares; stops reading (and reports the sum so far) as
    soon as rows or bytes pass a limit, so the caller names the limit without any decoding.
    ValueError (or a pyarrow error) if the stream is malformed."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
    rows = size = 0
    compressed = False
    for count in range(_MAX_MESSAGES + 2):
        try:
            message = reader.read_next_message()
        except StopIteration:
            break
        if count > _MAX_MESSAGES:
            raise ValueError(f"the stream holds more than {_MAX_MESSAGES} messages")
        meta = message.metadata.to_pybytes()
        root = _Table(meta, _u32(meta, 0))
        kind = root.scalar(1, "B", 0)
        header = root.table(2)
        if kind == _SCHEMA:
            continue
        if kind not in (_RECORD_BATCH, _DICTIONARY_BATCH) or header is None:
            raise ValueError(f"unexpected IPC message (header type {kind})")
        batch = header if kind == _RECORD_BATCH else header.table(1)
        if batch is None:
            raise ValueError("a dictionary batch without its data")
        if kind == _RECORD_BATCH:
            length = batch.scalar(0, "q", 0)
            if length < 0:
                raise ValueError(f"a record batch declares {length} rows")
            rows += length
        compressed = compressed or batch.table(3) is not None
        size += _batch_bytes(batch, message.body)
        if rows > max_rows or size > max_bytes:
            break
    return IpcSize(rows, size, compressed)
