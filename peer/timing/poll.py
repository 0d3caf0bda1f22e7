"""Wait for a condition by asking it again and again, up to a deadline.

The one poll helper of the project: the local federation harness
(:mod:`peer.testing.cluster`), the demo and the integration tests (through
:mod:`peer.testing`) all wait this way. Polling is for
what cannot signal an event: another process, a Spark query, a peer on another loop. Code that
can set an :class:`asyncio.Event` should, and a unit test moves a
:class:`peer.testing.ManualClock` instead of waiting at all.

``probe`` returns the thing waited for (anything true ends the wait and is returned) or a false
value; the async form also takes a probe that returns an awaitable. Exceptions listed in
``tolerate`` count as a false answer (a peer not up yet refuses a connection); any other goes
through at once. When the deadline passes, :class:`TimeoutError` names ``what`` and the last
answer, so a failed test says what it was waiting for.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

from peer.timing.clock import MONOTONIC, Clock

__all__ = ["wait_until", "wait_until_sync"]

T = TypeVar("T")


def _expired(what: str, timeout_s: float, last: object) -> TimeoutError:
    return TimeoutError(f"{what}: not after {timeout_s:g} s (last: {last!r})")


@overload
async def wait_until(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    timeout_s: float,
    *,
    every_s: float = ...,
    tolerate: tuple[type[BaseException], ...] = ...,
    clock: Clock = ...,
) -> T: ...


@overload
async def wait_until(
    probe: Callable[[], T | None],
    what: str,
    timeout_s: float,
    *,
    every_s: float = ...,
    tolerate: tuple[type[BaseException], ...] = ...,
    clock: Clock = ...,
) -> T: ...


async def wait_until(
    probe: Callable[[], object],
    what: str,
    timeout_s: float,
    *,
    every_s: float = 0.1,
    tolerate: tuple[type[BaseException], ...] = (),
    clock: Clock = MONOTONIC,
) -> object:
    """Ask ``probe()`` (awaited if it returns an awaitable) every ``every_s`` until it answers
    something true, which is returned; :class:`TimeoutError` after ``timeout_s``."""
    deadline = clock() + timeout_s
    last: object = None
    while True:
        try:
            answer: object = probe()
            if inspect.isawaitable(answer):
                answer = await answer
        except tolerate as exc:
            last = exc
        else:
            if answer:
                return answer
            last = answer
        if clock() >= deadline:
            raise _expired(what, timeout_s, last)
        await clock.sleep(every_s)


def wait_until_sync(
    probe: Callable[[], T | None],
    what: str,
    timeout_s: float,
    *,
    every_s: float = 0.1,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_until` for a synchronous caller (a test driving threads or processes)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            answer = probe()
        except tolerate as exc:
            last = exc
        else:
            if answer:
                return answer
            last = answer
        if time.monotonic() >= deadline:
            raise _expired(what, timeout_s, last)
        time.sleep(every_s)
