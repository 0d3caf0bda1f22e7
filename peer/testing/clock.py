"""A clock a test sets by hand.

Code that reads the time through an injected ``clock: Callable[[], float]`` (the brain, the
ledger) is tested with a :class:`ManualClock` in its place: the test moves time on with
:meth:`ManualClock.advance` (or sets :attr:`ManualClock.now`) instead of sleeping, so that
periods, timeouts and validity windows are exact and the test takes no wall-clock time.
"""

from __future__ import annotations

from datetime import datetime


class ManualClock:
    """``clock()`` is :attr:`now`, seconds since the epoch, which only the test moves."""

    def __init__(self, at: datetime | float = 0.0) -> None:
        self.now = at.timestamp() if isinstance(at, datetime) else float(at)

    def __call__(self) -> float:
        return self.now

    def time_ns(self) -> int:
        """:attr:`now` in nanoseconds, for code that reads ``time.time_ns`` (the spool)."""
        return round(self.now * 1_000_000_000)

    def advance(self, seconds: float) -> float:
        """Move time on by ``seconds`` (never back); returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.now += seconds
        return self.now
