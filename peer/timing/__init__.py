"""Time and background work, the one way the peer does them.

* :mod:`peer.timing.clock`: the :class:`Clock` every part that reads the time is given
  (the real one by default; tests pass :class:`peer.testing.ManualClock`), and the waits
  measured on it: :func:`wait_event` (an event, or a timeout) and :func:`within` (an
  awaitable, or a timeout);
* :mod:`peer.timing.periodic`: :func:`every`, the loop that runs a step every so often inside
  its caller's task group and outlives a failed step;
* :mod:`peer.timing.tasks`: :class:`OwnedTasks`, background tasks an owner cancels and awaits
  when it stops, where a task group cannot be threaded through (a synchronous callback);
* :mod:`peer.timing.backoff`: :class:`Backoff`, how long to wait before retry number *n*;
* :mod:`peer.timing.poll`: :func:`wait_until`, asking a condition again up to a deadline (for
  what cannot signal an event: other processes, Spark, the test harness).

This package imports nothing else of the peer: every room may use it.
"""

from peer.timing.backoff import Backoff
from peer.timing.clock import MONOTONIC, WALL, Clock, SystemClock, wait_event, within
from peer.timing.periodic import every
from peer.timing.poll import wait_until, wait_until_sync
from peer.timing.tasks import OwnedTasks

__all__ = [
    "MONOTONIC",
    "WALL",
    "Backoff",
    "Clock",
    "OwnedTasks",
    "SystemClock",
    "every",
    "wait_event",
    "wait_until",
    "wait_until_sync",
    "within",
]
