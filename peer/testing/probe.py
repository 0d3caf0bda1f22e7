"""A client of the wire, written with blocking sockets: frames, and a ``hello`` probe.

:class:`HelloProbe` says ``hello`` every 50 ms on its own connection in a thread of its own
and keeps the slowest answer, so that a test or a script measures how a peer answers while it
is attacked, independently of any event loop of its own (tests/integration/test_hostile_wire.py,
scripts/attack_wire.py).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import msgpack

__all__ = ["HelloProbe", "connect", "frame_bytes", "read_frame"]


def frame_bytes(frame: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(frame, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def read_frame(sock: socket.socket) -> dict[str, Any] | None:
    header = _read_exact(sock, 4)
    if header is None:
        return None
    body = _read_exact(sock, struct.unpack(">I", header)[0])
    if body is None:
        return None
    frame: dict[str, Any] = msgpack.unpackb(body, raw=False)
    return frame


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except (ConnectionResetError, TimeoutError):
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class HelloProbe:
    """A client that says ``hello`` every 50 ms on its own connection, in its own thread,
    and keeps the slowest answer (a connection lost is reconnected and counted as slow as
    the reconnecting took)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.slowest_s = 0.0
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="hello-probe", daemon=True)

    def __enter__(self) -> HelloProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _main(self) -> None:
        rid = 0
        sock: socket.socket | None = None
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                if sock is None:
                    sock = connect(self.port, timeout_s=5)
                rid += 1
                sock.sendall(frame_bytes({"type": "hello", "id": rid, "client": "probe"}))
                reply = read_frame(sock)
                if reply is None or reply.get("id") != rid:
                    raise OSError(f"no hello reply: {reply!r}")
                self.answers += 1
            except OSError as exc:
                self.failures.append(repr(exc))
                if sock is not None:
                    sock.close()
                sock = None
            self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
            self._stop.wait(0.05)
        if sock is not None:
            sock.close()
