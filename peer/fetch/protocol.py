"""The fetch protocol's messages, to and from wire frames, with no I/O (docs/protocol.md 11).

Theory of operation
-------------------
An executor reading a partition opens one TLS connection to the peer's fetch server (frames
of :mod:`overlay.wire`: a 4-byte length, then one msgpack map), checks the server's pin, and
asks for the partition's files one after the other::

    executor                                   peer
    fetch {spool, offset, capability}  ->
                                       <-      file {offset, size}
                                       <-      chunk {data}      (until size bytes came)
    fetch {spool, offset + 1, ...}     ->      ...
                                       <-      error {code, message, details}  (instead)

A ``file`` reply is followed by exactly as many ``chunk`` bytes as its ``size`` says: the
spool file as it is on disk (an Arrow IPC file), never re-encoded. An ``error`` answers one
request and the connection stays usable, except after a protocol error or too many refused
capabilities, when the server also closes it. :class:`FileAssembler` is the client's state
machine for one reply; it refuses a reply that breaks these rules with
:class:`~overlay.errors.RemoteProtocolError`.

:class:`FetchTicket` is what a Spark partition carries to an executor (pickled): where the
server is, its pin, the spool and the capability. :class:`FetchEndpoint` is what the engine
hands the ``fedspool`` source (as options) for its planner to make tickets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from overlay.errors import RemoteProtocolError
from peer.errors import FedstreamError, InvalidInput, from_wire

__all__ = [
    "CHUNK_BYTES",
    "MAX_REPLY_FRAME_BYTES",
    "MAX_REQUEST_BYTES",
    "Chunk",
    "FetchEndpoint",
    "FetchRequest",
    "FetchTicket",
    "FileAssembler",
    "FileHeader",
    "error_frame",
    "pin_of",
]

CHUNK_BYTES = 1024 * 1024  # a file is sent in chunks of this many bytes (the last one fewer)
MAX_REPLY_FRAME_BYTES = CHUNK_BYTES + 1024  # a chunk frame with its map and length headers
MAX_REQUEST_BYTES = 8 * 1024  # a fetch request: a path and a capability of <= 4 KiB each
MAX_OFFSET = 2**63 - 1


def pin_of(der: bytes) -> str:
    """The pin of a certificate: the SHA-256 of its DER bytes, 64 hex digits."""
    return hashlib.sha256(der).hexdigest()


def _field(frame: Mapping[str, Any], name: str, kind: type) -> Any:
    value = frame.get(name)
    if type(value) is not kind:
        raise InvalidInput(f"a {frame.get('type')!r} frame needs {name!r} of type {kind.__name__}")
    return value


@dataclass(frozen=True)
class FetchRequest:
    """Read file ``offset`` of ``spool`` under ``capability``."""

    TYPE = "fetch"
    spool: str
    offset: int
    capability: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "spool": self.spool,
            "offset": self.offset,
            "capability": self.capability,
        }

    @classmethod
    def from_wire(cls, frame: Mapping[str, Any]) -> FetchRequest:
        """InvalidInput naming the field if the frame is not a fetch request."""
        if frame.get("type") != cls.TYPE:
            raise InvalidInput(f"expected a 'fetch' frame, not {str(frame.get('type'))[:40]!r}")
        offset = _field(frame, "offset", int)
        if not 0 <= offset <= MAX_OFFSET:
            raise InvalidInput(f"offset {offset} is out of range")
        return cls(_field(frame, "spool", str), offset, _field(frame, "capability", bytes))


@dataclass(frozen=True)
class FileHeader:
    """The reply to a fetch: ``size`` bytes of file ``offset`` follow in chunks."""

    TYPE = "file"
    offset: int
    size: int

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "offset": self.offset, "size": self.size}


@dataclass(frozen=True)
class Chunk:
    TYPE = "chunk"
    data: bytes

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.TYPE, "data": self.data}


def error_frame(exc: FedstreamError) -> dict[str, Any]:
    return {"type": "error", **exc.to_wire()}


class FileAssembler:
    """The client's side of one reply: feed frames to :meth:`receive` until it returns the
    file's bytes. A refusal raises the peer's error (:func:`peer.errors.from_wire`); a frame
    out of place, a size over ``max_size`` or a chunk beyond the size raises
    RemoteProtocolError."""

    def __init__(self, offset: int, *, max_size: int) -> None:
        self.offset = offset
        self.max_size = max_size
        self._size: int | None = None
        self._parts: list[bytes] = []
        self._got = 0

    def receive(self, frame: Mapping[str, Any]) -> bytes | None:
        kind = frame.get("type")
        if kind == "error" and self._size is None:
            raise from_wire(dict(frame))
        if kind == FileHeader.TYPE and self._size is None:
            size, offset = frame.get("size"), frame.get("offset")
            if type(size) is not int or not 0 <= size <= self.max_size or offset != self.offset:
                raise RemoteProtocolError(
                    f"file header {size!r} bytes of offset {offset!r}: expected offset "
                    f"{self.offset}, at most {self.max_size} bytes"
                )
            self._size = size
            return self._done()
        if kind == Chunk.TYPE and self._size is not None:
            data = frame.get("data")
            if not isinstance(data, bytes) or not data or self._got + len(data) > self._size:
                raise RemoteProtocolError(f"a chunk beyond file {self.offset}'s {self._size} bytes")
            self._parts.append(data)
            self._got += len(data)
            return self._done()
        raise RemoteProtocolError(f"unexpected {str(kind)[:40]!r} frame in a fetch reply")

    def _done(self) -> bytes | None:
        if self._size is None or self._got < self._size:
            return None
        return b"".join(self._parts)


@dataclass(frozen=True)
class FetchTicket:
    """What one Spark partition carries to an executor: the server, its pin, the spool and a
    capability for the partition's files."""

    address: str  # host:port
    pin: str
    spool: str
    capability: bytes

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host.strip("[]"), int(port)


@dataclass(frozen=True)
class FetchEndpoint:
    """The peer's fetch server as the engine tells the ``fedspool`` source: its address and
    pin, the fetch key's file (read by the planner on the peer's host) and the capabilities'
    lifetime."""

    address: str
    pin: str
    key_path: str
    ttl_s: float

    def to_options(self) -> dict[str, str]:
        return {
            "fetch": "remote",
            "fetchAddress": self.address,
            "fetchPin": self.pin,
            "fetchKey": self.key_path,
            "fetchTtlS": repr(self.ttl_s),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FetchEndpoint | None:
        """The endpoint in (lower-cased) source options; None when reading files directly."""
        mode = (options.get("fetch") or "local").strip().lower()
        if mode == "local":
            return None
        if mode != "remote":
            raise ValueError(f"the fedspool option fetch is 'local' or 'remote', not {mode!r}")
        missing = [k for k in ("fetchaddress", "fetchpin", "fetchkey") if not options.get(k)]
        if missing:
            raise ValueError(f"fedspool with fetch=remote needs the options {missing}")
        return cls(
            options["fetchaddress"],
            options["fetchpin"],
            options["fetchkey"],
            float(options.get("fetchttls") or 900.0),
        )
