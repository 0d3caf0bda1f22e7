"""A real peer on its own event loop in a background thread, for synchronous tests.

``PeerThread`` runs a :class:`peer.node.Peer` (real sockets, real spools, the given or a new
Spark session) on an event loop of its own in a daemon thread, so that a synchronous test can
drive it with the real ``Client`` through ``asyncio.run`` and, through :meth:`PeerThread.call`,
run a coroutine on the peer's own loop to look inside it. Leaving the ``with`` block (or
:meth:`PeerThread.close`) stops the peer the way SIGTERM stops ``peer join``.

Of the peer it uses only ``Peer(config)``, ``start(spark)``, ``run()``, ``stop()``,
``close()`` and ``port``; tests reach further through :attr:`PeerThread.peer`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from peer.node import Peer, PeerConfig

T = TypeVar("T")


class PeerThread:
    def __init__(
        self, config: PeerConfig, spark: Any = None, *, ready_timeout_s: float = 180
    ) -> None:
        from peer.node import Peer

        self.config = config
        self.spark = spark
        self.ready_timeout_s = ready_timeout_s
        self.peer: Peer = Peer(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="peer-loop", daemon=True)

    def _main(self) -> None:
        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                await self.peer.start(self.spark)
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                await self.peer.close()
                return
            self._ready.set()
            await self.peer.run()

        asyncio.run(body())

    @property
    def port(self) -> int:
        return self.peer.port

    def __enter__(self) -> PeerThread:
        self._thread.start()
        if not self._ready.wait(self.ready_timeout_s):
            raise TimeoutError(f"peer not ready after {self.ready_timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 60) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.peer.stop)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"peer did not stop within {timeout_s} s")

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        """Run a coroutine on the peer's own loop (for reaching into the peer in tests)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)
