"""A clock a test sets by hand.

Code that reads the time through an injected clock (a :class:`peer.timing.Clock`, or a plain
``Callable[[], float]``) is tested with a :class:`ManualClock` in its place: the test moves
time on with :meth:`ManualClock.advance` (or sets :attr:`ManualClock.now`) instead of sleeping,
so that periods, timeouts and validity windows are exact and the test takes no wall-clock time.

``await clock.sleep(s)`` returns once the test has moved the clock ``s`` seconds on, so a loop
that sleeps on the clock (:func:`peer.timing.every`) runs one round per advance. A sleeper
wakes as a task does: the test lets the loop run (``await asyncio.sleep(0)``, or waits for an
event the woken code sets) before it looks at what the round did.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import datetime


class ManualClock:
    """``clock()`` is :attr:`now`, seconds since the epoch, which only the test moves."""

    def __init__(self, at: datetime | float = 0.0) -> None:
        self._now = at.timestamp() if isinstance(at, datetime) else float(at)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now = float(value)
        self._wake()

    def time_ns(self) -> int:
        """:attr:`now` in nanoseconds, for code that reads ``time.time_ns`` (the spool)."""
        return round(self.now * 1_000_000_000)

    def advance(self, seconds: float) -> float:
        """Move time on by ``seconds`` (never back); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.now = self._now + seconds
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been moved ``seconds`` on (at once if ``seconds <= 0``)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), waiter))
        await waiter

    @property
    def sleepers(self) -> int:
        """How many tasks sleep on this clock now (a test waits for a loop to park)."""
        return sum(1 for _, _, waiter in self._sleepers if not waiter.done())

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():  # a cancelled sleeper is simply dropped
                waiter.set_result(None)
