"""A peer's fetch server on its own event loop in a background thread, for synchronous tests.

Spark's calls block the test's thread, while the executors' reads need the fetch server
(:mod:`peer.fetch.server`) to answer: :class:`FetchServerThread` runs one, with real TLS on a
real port, on a loop of its own. Its clock is the wall clock plus :attr:`skew_s`, which a test
moves to make every capability expired (and back) without sleeping. A cluster test hands
:attr:`FetchServerThread.endpoint` to ``read_stream(..., fetch=...)`` exactly as the engine
does, and binds ``host`` to an address its Workers reach.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import TracebackType

from peer.fetch.capability import FetchKey, fetch_key_path
from peer.fetch.protocol import FetchEndpoint
from peer.fetch.server import FetchLimits, FetchServer

__all__ = ["FetchServerThread"]


class FetchServerThread:
    """``with FetchServerThread(data_dir) as fetch:`` serves the spools under ``data_dir``
    with the fetch key of ``data_dir`` (made on first use)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        limits: FetchLimits | None = None,
        ready_timeout_s: float = 30.0,
    ) -> None:
        self.data_dir = data_dir
        self.skew_s = 0.0
        key = FetchKey.load_or_create(data_dir)
        self.server = FetchServer(
            key,
            fetch_key_path(data_dir),
            [data_dir],
            host=host,
            limits=limits,
            clock=lambda: time.time() + self.skew_s,
        )
        self._ready_timeout_s = ready_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="fetch-server", daemon=True)

    @property
    def endpoint(self) -> FetchEndpoint:
        return self.server.endpoint

    def _main(self) -> None:
        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await self.server.close()

        asyncio.run(body())

    def __enter__(self) -> FetchServerThread:
        self._thread.start()
        if not self._ready.wait(self._ready_timeout_s):
            raise TimeoutError(f"fetch server not ready after {self._ready_timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self, timeout_s: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"fetch server did not stop within {timeout_s} s")
