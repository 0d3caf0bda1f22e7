"""Background tasks that belong to an owner, for code that cannot hold a task group open.

A task should be a child of an :class:`asyncio.TaskGroup`. Where a group cannot be threaded
through (work started from a synchronous callback: a state heard from the control plane, a
frame handed over by pysyncobj's thread, an outbox made on first use) the owner keeps an
:class:`OwnedTasks` instead, with the same discipline: every task it spawns is its own until
it ends, a task that fails is logged and does not take its siblings down, and the owner, when
it stops, calls :meth:`OwnedTasks.aclose`, which cancels every task and awaits each one (no
task outlives its owner, none is left unawaited). Once closed, an owner spawns nothing more:
a coroutine handed to it then is closed, not run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["OwnedTasks"]

log = logging.getLogger(__name__)


class OwnedTasks:
    """The running background tasks of one owner (``name`` says whose, in log lines)."""

    __slots__ = ("_closed", "_tasks", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        """How many tasks run now."""
        return len(self._tasks)

    def spawn(
        self, coroutine: Coroutine[Any, Any, None], *, name: str | None = None
    ) -> asyncio.Task[None] | None:
        """Run ``coroutine`` as a task of this owner; None (and the coroutine closed) once
        the owner is closed."""
        if self._closed:
            coroutine.close()
            return None
        task = asyncio.get_running_loop().create_task(self._guarded(coroutine), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guarded(self, coroutine: Coroutine[Any, Any, None]) -> None:
        try:
            await coroutine
        except Exception:  # one failed task must not end its siblings, nor pass unseen
            log.exception("%s: a background task failed", self.name)

    def cancel(self) -> None:
        """Close the owner and cancel its tasks without waiting (a synchronous owner's stop;
        whoever owns *it* awaits through :meth:`aclose`). A task of this owner that closes it
        is not cancelled by it: it goes on to its end."""
        self._closed = True
        for task in self._others():
            task.cancel()

    def _others(self) -> tuple[asyncio.Task[None], ...]:
        try:
            me = asyncio.current_task()
        except RuntimeError:  # no running loop
            me = None
        return tuple(task for task in self._tasks if task is not me)

    async def aclose(self) -> None:
        """Close the owner, cancel its tasks and return once every one has ended.

        A cancellation of the caller while it waits goes on to the caller once the tasks
        have ended (as a task group does it).
        """
        self.cancel()
        while pending := self._others():
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:  # they are cancelled already: let them finish
                await asyncio.wait(pending)
                raise
            finally:
                self._tasks.difference_update(t for t in pending if t.done())
