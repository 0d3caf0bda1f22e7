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
msgpack's strict settings under a :class:`DecodeBudget`: one container's length is checked at
its header, before msgpack allocates for it, and the hooks msgpack calls as each map and array
is complete count the elements decoded so far, their estimated memory and their nesting
depth, raising :class:`FrameOverBudget` (naming the limit) the moment one is exceeded, so a
small frame cannot become a huge number of objects (a 64 MiB array of 67 M empty maps is
refused at its header; 64 arrays of 1 M each after the budget's worth, not 67 M objects).
*Anything* that goes wrong while unpacking or checking a frame surfaces as
:class:`RemoteProtocolError`, never as another exception (tests/unit/test_wire.py fuzzes this
contract).

:meth:`FrameDecoder.next_body` hands out a frame's body undecoded, so that a caller may run
:func:`decode_body` (pure, thread-safe) off its event loop for large frames
(:class:`overlay.stream.FrameStream` does).

:func:`encode_frame` is the sending half: it refuses, with :class:`LocalProtocolError` and
before anything is sent, a frame the other side would refuse.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import msgpack

from overlay.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER_BYTES",
    "DecodeBudget",
    "FrameDecoder",
    "FrameOverBudget",
    "clip",
    "decode_body",
    "encode_frame",
]

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
HEADER_BYTES = 4
_MAX_LENGTH_FIELD = 2**32 - 1


@dataclass(frozen=True, slots=True)
class DecodeBudget:
    """What one frame may decode to (docs/protocol.md, "Limits").

    ``max_depth``: maps and arrays nested in each other, the frame's own map counting 1;
    ``max_elements``: objects decoded (every map, array, key and value);
    ``max_container_len``: entries of one map or array, checked at its header;
    ``max_decoded_bytes``: the memory the decoded objects take, estimated as the body's bytes
    plus a fixed cost per map, array, entry and value (see ``_MAP_BYTES`` and friends).
    """

    max_depth: int = 32
    max_elements: int = 2_000_000
    max_container_len: int = 1_000_000
    max_decoded_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_elements", "max_container_len", "max_decoded_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


DEFAULT_BUDGET = DecodeBudget()

# The estimated cost of what a frame decodes to (CPython 3.11, 64 bit, rounded up): a map is
# its object and hash table, an array its object and one pointer per item, every value one
# small object (strings and bytes are counted once, as the body's bytes).
_MAP_BYTES, _MAP_ENTRY_BYTES = 240, 48
_LIST_BYTES, _LIST_ITEM_BYTES = 72, 8
_VALUE_BYTES = 32
_SCAN_INLINE = 16  # containers up to this many values are scanned in a Python loop


class FrameOverBudget(RemoteProtocolError):
    """A frame that would decode to more than its :class:`DecodeBudget` allows; ``limit``
    names the budget's field."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class _Tally:
    """The object hooks of one decode: they see each map and array once it is complete
    (innermost first), count it against the budget and raise the moment it is exceeded.

    Depth: a container's depth is one more than its deepest child container's; children's
    depths are kept by ``id`` (the children are alive, held by the decoder, until their
    parent's hook runs) and only when above 1, so flat data costs no bookkeeping.
    """

    __slots__ = ("_budget", "_bytes", "_depths", "_elements")

    def __init__(self, budget: DecodeBudget, body_bytes: int) -> None:
        self._budget = budget
        self._elements = 0
        self._bytes = body_bytes
        self._depths: dict[int, int] = {}

    def list_hook(self, items: list[Any]) -> list[Any]:
        nested, depth = self._nesting(items)
        self._charge(
            1 + len(items) - nested,
            _LIST_BYTES + len(items) * _LIST_ITEM_BYTES + (len(items) - nested) * _VALUE_BYTES,
        )
        self._enter(items, depth)
        return items

    def map_hook(self, pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
        # msgpack's strict_map_key still lets bytes keys through, and a map may repeat a key;
        # both are refused so that every frame means exactly one thing. One loop checks the
        # keys and finds the nested values (this runs once per map: rows of a push).
        result = dict(pairs)
        n = len(result)
        if n != len(pairs):
            raise ValueError("a map repeats a key")
        nested, deepest, depths = 0, 0, self._depths
        for key, value in pairs:
            if type(key) is not str:
                raise ValueError(f"a map key is {type(key).__name__}, not str")
            kind = type(value)
            if kind is list or kind is dict:
                nested += 1
                child = depths.pop(id(value), 1)
                if child > deepest:
                    deepest = child
        self._charge(
            1 + 2 * n - nested,
            _MAP_BYTES + n * _MAP_ENTRY_BYTES + (2 * n - nested) * _VALUE_BYTES,
        )
        self._enter(result, deepest + 1)
        return result

    def _nesting(self, values: Collection[Any]) -> tuple[int, int]:
        """How many of ``values`` are containers, and the depth of their parent."""
        if len(values) > _SCAN_INLINE:
            kinds = Counter(map(type, values))  # a C loop: large arrays stay cheap
            if not (kinds[list] or kinds[dict]):
                return 0, 1
        nested, deepest = 0, 0
        for value in values:
            kind = type(value)
            if kind is list or kind is dict:
                nested += 1
                child = self._depths.pop(id(value), 1)
                if child > deepest:
                    deepest = child
        return nested, deepest + 1

    def _enter(self, container: object, depth: int) -> None:
        limit = self._budget.max_depth
        if depth > limit:
            raise FrameOverBudget(
                f"frame refused: it nests maps and arrays more than {limit} deep (max_depth)",
                "max_depth",
            )
        if depth > 1:
            self._depths[id(container)] = depth

    def _charge(self, elements: int, nbytes: int) -> None:
        budget = self._budget
        self._elements += elements
        self._bytes += nbytes
        if self._elements > budget.max_elements:
            raise FrameOverBudget(
                f"frame refused: it decodes to more than {budget.max_elements} elements "
                "(max_elements)",
                "max_elements",
            )
        if self._bytes > budget.max_decoded_bytes:
            raise FrameOverBudget(
                f"frame refused: it decodes to more than {budget.max_decoded_bytes} bytes "
                "of objects (max_decoded_bytes)",
                "max_decoded_bytes",
            )


_MSGPACK_LIMITS = {
    "max_array_len": "max_container_len",
    "max_map_len": "max_container_len",
    "max_str_len": "max_frame_bytes",
    "max_bin_len": "max_frame_bytes",
    "max_ext_len": "max_frame_bytes",
}


def decode_body(body: bytes, budget: DecodeBudget | None = None) -> dict[str, Any]:
    """The frame a body (the bytes after the length header) holds, decoded under ``budget``
    (None: bounded only by the body's size). Pure and thread-safe.

    Raises :class:`FrameOverBudget` for a body over budget, :class:`RemoteProtocolError` for
    any other invalid body.
    """
    size = len(body)
    container_len = size if budget is None else min(size, budget.max_container_len)
    tally = _Tally(budget or _unbounded(size), size)
    try:
        frame = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_pairs_hook=tally.map_hook,
            list_hook=tally.list_hook,
            max_str_len=size,
            max_bin_len=size,
            max_ext_len=size,
            max_array_len=container_len,
            max_map_len=min(container_len, size // 2),
        )
    except FrameOverBudget:
        raise
    except msgpack.StackError as exc:
        raise FrameOverBudget(
            "frame refused: it nests maps and arrays deeper than the decoder's stack (max_depth)",
            "max_depth",
        ) from exc
    except Exception as exc:
        # msgpack raises ExtraData, FormatError, ValueError, TypeError, OverflowError,
        # UnicodeDecodeError ... on hostile bytes: all mean the same here.
        text = _shorten(str(exc))
        for name, limit in _MSGPACK_LIMITS.items():
            if f"exceeds {name}" in text and budget is not None and limit != "max_frame_bytes":
                raise FrameOverBudget(
                    f"frame refused: a map or array of more than {budget.max_container_len} "
                    f"entries ({limit}): {text}",
                    limit,
                ) from exc
        raise RemoteProtocolError(
            f"frame body is not one valid msgpack value: {_shorten(repr(exc))}"
        ) from exc
    if not isinstance(frame, dict):
        raise RemoteProtocolError(f"frame body is a msgpack {type(frame).__name__}, not a map")
    if not isinstance(frame.get("type"), str):
        raise RemoteProtocolError("frame has no str 'type' field")
    return frame


MESSAGE_CHARS = 2000  # an error message, at most, as sent
ECHO_CHARS = 256  # a string an error echoes (a name, an argument), at most
ECHO_ITEMS = 16  # items of a list or map an error echoes, at most


def clip(value: Any, *, chars: int = ECHO_CHARS, depth: int = 3) -> Any:
    """``value`` cut down to what an error reply may echo: strings to ``chars`` characters
    (marked with how long they were), bytes likewise, lists and maps to ``ECHO_ITEMS`` items
    and ``depth`` levels. A not-found reply naming a 40 MB name still fits a frame."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}... ({len(value)} characters)"
    if isinstance(value, bytes | bytearray):
        return bytes(value) if len(value) <= chars else bytes(value[:chars])
    if isinstance(value, Mapping):
        if depth <= 0:
            return f"<map of {len(value)}>"
        items = itertools.islice(value.items(), ECHO_ITEMS)
        return {clip(str(k), chars=64): clip(v, chars=chars, depth=depth - 1) for k, v in items}
    if isinstance(value, list | tuple):
        if depth <= 0:
            return f"<array of {len(value)}>"
        return [clip(v, chars=chars, depth=depth - 1) for v in itertools.islice(value, ECHO_ITEMS)]
    return value


def _shorten(text: str, limit: int = 200) -> str:
    # msgpack's errors may hold the rest of the body (ExtraData): never echo megabytes
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _unbounded(size: int) -> DecodeBudget:
    # Without a budget a body still cannot decode to more than its bytes allow; the depth is
    # the decoder's stack.
    return DecodeBudget(
        max_depth=2**31, max_elements=2**62, max_container_len=size + 1, max_decoded_bytes=2**62
    )


class FrameDecoder:
    """Turns a byte stream into frames (dicts); see the module docstring.

    ``budget`` bounds what each frame decodes to (None: only the frame's size does).
    """

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, budget: DecodeBudget | None = None
    ) -> None:
        if not 1 <= max_frame_bytes <= _MAX_LENGTH_FIELD:
            raise ValueError(f"max_frame_bytes must be in 1..{_MAX_LENGTH_FIELD}")
        self.max_frame_bytes = max_frame_bytes
        self.budget = budget
        self._buffer = bytearray()
        self._pos = 0  # bytes of _buffer already consumed (compacted on the next receive)
        self._body_bytes: int | None = None  # None: in the header state
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as frames (headers already read excluded)."""
        return len(self._buffer) - self._pos

    @property
    def in_frame(self) -> bool:
        """Whether part of a frame (not yet all of it) has arrived."""
        return self._body_bytes is not None or self.buffered_bytes > 0

    @property
    def pending_body_bytes(self) -> int | None:
        """The size of the frame being received, once its header is in (else None)."""
        return self._body_bytes

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
        body = self.next_body()
        if body is None:
            return None
        try:
            return decode_body(body, self.budget)
        except RemoteProtocolError as exc:
            self.fail(exc)

    def next_body(self) -> bytes | None:
        """The next complete frame's body, undecoded (see :func:`decode_body`), or ``None``
        when more bytes are needed; raises as :meth:`next_frame` does for framing errors."""
        if self._error is not None:
            raise self._error
        self._read_header()
        size = self._body_bytes
        if size is None or self.buffered_bytes < size:
            if self._eof and (size is not None or self.buffered_bytes):
                self.fail(
                    RemoteProtocolError(
                        f"stream ended inside a frame ({self.buffered_bytes} bytes left over)"
                    )
                )
            return None
        body = bytes(self._buffer[self._pos : self._pos + size])
        self._pos += size
        self._body_bytes = None
        if size > _COMPACT_AFTER_BYTES:  # let go of a large body's copy in the buffer now
            del self._buffer[: self._pos]
            self._pos = 0
        return body

    @property
    def at_eof(self) -> bool:
        """True once the stream has ended cleanly and every frame has been returned."""
        return self._eof and self._body_bytes is None and not self.buffered_bytes

    def _read_header(self) -> None:
        if self._body_bytes is not None or self.buffered_bytes < HEADER_BYTES:
            return
        size = int.from_bytes(self._buffer[self._pos : self._pos + HEADER_BYTES], "big")
        if size > self.max_frame_bytes:
            self.fail(
                FrameOverBudget(
                    f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes} bytes "
                    "(max_frame_bytes)",
                    "max_frame_bytes",
                )
            )
        self._pos += HEADER_BYTES
        self._body_bytes = size

    def fail(self, error: RemoteProtocolError) -> NoReturn:
        """Enter the error state with ``error`` (a frame decoded elsewhere was invalid): the
        rest of the stream is meaningless now; every later call raises ``error`` again."""
        self._error = error
        self._buffer.clear()
        self._pos = 0
        raise error


_COMPACT_AFTER_BYTES = 1024 * 1024


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
