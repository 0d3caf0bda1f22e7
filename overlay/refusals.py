"""Refused connections, logged without flooding the log.

Anyone who can reach a port can have a handshake refused as often as they like; a warning per
refusal lets them fill the disk and bury everything else. A :class:`RefusalLog` lets the first
``burst`` refusals of each ``window_s`` through as warnings, counts the rest, and reports the
count with the next warning it lets through ("... and 4,182 more refused in the last 60 s").
Pure: the clock is given, nothing here sleeps or schedules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["RefusalLog"]


class RefusalLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 5,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self._window_start: float | None = None
        self._logged = 0
        self.suppressed = 0  # refusals counted but not logged since the last warning
        self.total = 0

    def warning(self, message: str, *args: object) -> bool:
        """Log one refusal (lazy ``%`` arguments, as logging takes them), or count it;
        True if it was logged."""
        self.total += 1
        now = self.clock()
        if self._window_start is None or now - self._window_start >= self.window_s:
            self._window_start = now
            self._logged = 0
        if self._logged >= self.burst:
            self.suppressed += 1
            return False
        self._logged += 1
        if self.suppressed:
            message += " (and %d more refused, not logged, in the last %.0f s)"
            args = (*args, self.suppressed, self.window_s)
            self.suppressed = 0
        self.logger.warning(message, *args)
        return True
