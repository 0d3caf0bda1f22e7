"""Run an async test body on a fresh event loop, bounded in time.

A synchronous test calls :func:`run_async` with a coroutine function: the body runs on a new
loop of the kind asked for (plain asyncio, or uvloop as ``peer join`` uses), and a body that
hangs fails with ``TimeoutError`` after ``timeout_s`` instead of holding the suite until the
per-test timeout kills it. Parametrize a test over :data:`LOOPS` to run it on both kinds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

T = TypeVar("T")
Loop = Literal["asyncio", "uvloop"]
LOOPS: tuple[Loop, ...] = ("asyncio", "uvloop")


def run_async(
    body: Callable[[], Awaitable[T]], *, timeout_s: float = 20.0, loop: Loop = "asyncio"
) -> T:
    """``body()`` awaited on a fresh ``loop`` within ``timeout_s``; returns its result."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout_s):
            return await body()

    if loop == "uvloop":
        import uvloop

        return uvloop.run(bounded())
    return asyncio.run(bounded())
