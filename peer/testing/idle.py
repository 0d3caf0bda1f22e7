"""Wait until every other task on the loop is blocked: trio's ``wait_all_tasks_blocked``.

A unit test that checks that something does *not* happen (a sender without credit stays
blocked, a reader stops at its budget) must first let everything that can run, run. Sleeping
for a while guesses; this asks the loop: it yields until, on its own wake-up, nothing else is
ready to run. Tasks then wait on something (an event, a lock, I/O, a timer), and a check made
now sees the state they will keep until that something happens. Only for in-memory tests:
a task waiting on a socket or a thread counts as blocked although its answer may be on the way.
"""

from __future__ import annotations

import asyncio

__all__ = ["all_tasks_blocked"]

ROUNDS = 10_000  # asyncio: a bound on the rounds, never reached by a test that settles
BLIND_ROUNDS = 100  # uvloop, whose ready queue cannot be seen: this many rounds


async def all_tasks_blocked() -> None:
    """Return once no other task or callback is ready to run on this loop."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)  # asyncio's ready queue (uvloop keeps it hidden)
    for _ in range(ROUNDS if ready is not None else BLIND_ROUNDS):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            return
    if ready is not None:
        raise RuntimeError(f"the loop still had work ready after {ROUNDS} rounds")
