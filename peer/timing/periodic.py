"""One loop for background work that comes round every so often.

``tg.create_task(every(interval_s, step))`` runs ``step`` every ``interval_s`` seconds for as
long as the caller's task group lives: the task belongs to that group, so it is cancelled with
it and its cancellation propagates (a ``CancelledError`` is never caught here). A step that
raises anything else is logged and tried again next round: housekeeping must not take the peer
down. The wait is measured on the given clock, so a test drives the loop with a
:class:`peer.testing.ManualClock` instead of sleeping. Given a ``wake`` event, a round also
comes as soon as the event is set (it is cleared before the step runs): work that something
can ask for at once, with the period as its fallback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

from peer.timing.clock import MONOTONIC, Clock, wait_event

__all__ = ["every"]

log = logging.getLogger(__name__)


async def every(
    interval_s: float,
    step: Callable[[], Awaitable[object]],
    *,
    clock: Clock = MONOTONIC,
    first_s: float | None = None,
    what: str = "",
    wake: asyncio.Event | None = None,
) -> NoReturn:
    """Run ``step`` after ``first_s`` (default ``interval_s``), then every ``interval_s``,
    and whenever ``wake`` is set meanwhile.

    ``what`` names the work in the log line of a failed step (default: the step's name).
    """
    if not interval_s > 0:
        raise ValueError(f"a periodic step needs an interval above 0 s, not {interval_s}")
    if first_s is not None and first_s < 0:
        raise ValueError(f"a periodic step cannot start {first_s} s before it is started")
    name = what or getattr(step, "__qualname__", repr(step))
    wait = interval_s if first_s is None else first_s
    while True:
        if wake is not None:
            await wait_event(wake, wait, clock)
            wake.clear()
        elif wait > 0:
            await clock.sleep(wait)
        wait = interval_s
        try:
            await step()
        except Exception:
            log.exception("%s failed; trying again in %.3g s", name, interval_s)
