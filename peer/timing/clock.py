"""The clock a part of the peer reads the time from, and sleeps on.

A part that reads the time takes a ``clock`` when it is made, by default the real one; a test
gives it a :class:`peer.testing.ManualClock` and moves time on by hand, so that periods,
deadlines and timeouts are exact and the test sleeps for nothing (trio's ``MockClock`` plays
the same part). A clock is called for the time (``clock()``, seconds) and awaited to sleep
(``await clock.sleep(seconds)``); a plain ``Callable[[], float]`` still fits where a part only
reads the time, since a :class:`Clock` is one.

:data:`MONOTONIC` measures intervals and deadlines; :data:`WALL` is seconds since the epoch,
for what is written down or compared across peers (lease expiries, contract validity).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["MONOTONIC", "WALL", "Clock", "SystemClock", "wait_event", "within"]

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """What a part of the peer needs of time: now, and a sleep measured on the same clock."""

    def __call__(self) -> float:
        """The time now, in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real time: ``read`` (``time.monotonic`` or ``time.time``) and ``asyncio.sleep``."""

    __slots__ = ("_read", "name")

    def __init__(self, read: Callable[[], float], name: str) -> None:
        self._read = read
        self.name = name

    def __call__(self) -> float:
        return self._read()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return f"SystemClock({self.name})"


MONOTONIC: Clock = SystemClock(time.monotonic, "monotonic")
WALL: Clock = SystemClock(time.time, "wall")


async def wait_event(event: asyncio.Event, timeout_s: float, clock: Clock = MONOTONIC) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` has passed on ``clock``; whether it is set.

    On a system clock this is ``asyncio.timeout``; on another clock (a test's) the event and
    the clock's sleep race in a task group of their own, and the loser is cancelled.
    """
    if event.is_set():
        return True
    if isinstance(clock, SystemClock):
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await event.wait()
        except TimeoutError:
            return False
        return True
    async with asyncio.TaskGroup() as tg:
        waiter = tg.create_task(event.wait())
        sleeper = tg.create_task(clock.sleep(timeout_s))
        await asyncio.wait((waiter, sleeper), return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        sleeper.cancel()
    return event.is_set()


async def within(timeout_s: float, awaitable: Awaitable[T], clock: Clock = MONOTONIC) -> T:
    """``await awaitable``, or :class:`TimeoutError` (the awaitable cancelled) once
    ``timeout_s`` has passed on ``clock``: ``asyncio.timeout`` on a system clock, and on
    another clock (a test's) the same race as :func:`wait_event`'s."""
    if isinstance(clock, SystemClock):
        async with asyncio.timeout(max(0.0, timeout_s)):
            return await awaitable
    outcome: list[T] = []
    failure: list[Exception] = []

    async def work() -> None:
        try:
            outcome.append(await awaitable)
        except Exception as exc:  # raised below, as it is, not in an ExceptionGroup
            failure.append(exc)

    async with asyncio.TaskGroup() as tg:
        worker = tg.create_task(work())
        sleeper = tg.create_task(clock.sleep(timeout_s))
        await asyncio.wait((worker, sleeper), return_when=asyncio.FIRST_COMPLETED)
        worker.cancel()
        sleeper.cancel()
    if failure:
        raise failure[0]
    if not outcome:
        raise TimeoutError(f"not done within {timeout_s:g} s")
    return outcome[0]
