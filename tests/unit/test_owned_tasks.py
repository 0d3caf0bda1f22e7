"""peer.timing.OwnedTasks: every task an owner spawns is cancelled and awaited when it closes,
a failed task is logged without ending its siblings, and a closed owner runs nothing more."""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest

from peer.timing import OwnedTasks


def test_aclose_cancels_every_task_and_awaits_its_cleanup() -> None:
    async def scenario() -> None:
        tasks = OwnedTasks("test")
        started = [asyncio.Event() for _ in range(3)]
        cleaned: list[int] = []

        async def worker(i: int) -> None:
            started[i].set()
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0)  # cleanup that itself awaits
                cleaned.append(i)

        for i in range(3):
            tasks.spawn(worker(i), name=f"w{i}")
        for event in started:
            await event.wait()
        assert len(tasks) == 3
        await tasks.aclose()
        assert sorted(cleaned) == [0, 1, 2] and len(tasks) == 0 and tasks.closed

    asyncio.run(scenario())


def test_a_failed_task_is_logged_and_its_siblings_run_on(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        tasks = OwnedTasks("the owner")
        sibling_done = asyncio.Event()
        go_on = asyncio.Event()

        async def fails() -> None:
            raise RuntimeError("broken")

        async def sibling() -> None:
            await go_on.wait()
            sibling_done.set()

        failing = tasks.spawn(fails())
        tasks.spawn(sibling())
        assert failing is not None
        await asyncio.wait([failing])
        go_on.set()
        async with asyncio.timeout(5):
            await sibling_done.wait()
        await tasks.aclose()

    with caplog.at_level(logging.ERROR, logger="peer.timing.tasks"):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "the owner: a background task failed" in r.message]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)


def test_a_closed_owner_closes_what_it_is_given_instead_of_running_it() -> None:
    async def scenario() -> None:
        tasks = OwnedTasks("test")
        ran: list[str] = []

        async def work() -> None:
            ran.append("ran")

        tasks.cancel()
        coroutine = work()
        assert tasks.spawn(coroutine) is None
        assert inspect.getcoroutinestate(coroutine) == "CORO_CLOSED"  # never to run, no warning
        await tasks.aclose()
        assert ran == [] and len(tasks) == 0

    asyncio.run(scenario())


def test_a_cancelled_closer_still_waits_for_the_tasks_then_is_cancelled() -> None:
    async def scenario() -> None:
        tasks = OwnedTasks("test")
        release = asyncio.Event()
        ended: list[str] = []
        started = asyncio.Event()

        async def stubborn() -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                await release.wait()  # its cleanup takes a while
                ended.append("stubborn")

        tasks.spawn(stubborn())
        await started.wait()
        closer = asyncio.create_task(tasks.aclose())
        await asyncio.sleep(0)
        closer.cancel()
        await asyncio.sleep(0)
        assert not closer.done()  # still waiting for the task's cleanup
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await closer
        assert ended == ["stubborn"] and len(tasks) == 0

    asyncio.run(scenario())


def test_a_task_that_closes_its_own_owner_ends_the_others_and_goes_on() -> None:
    async def scenario() -> None:
        tasks = OwnedTasks("test")
        other_started = asyncio.Event()
        steps: list[str] = []

        async def other() -> None:
            other_started.set()
            try:
                await asyncio.Event().wait()
            finally:
                steps.append("other ended")

        async def closer() -> None:
            await other_started.wait()
            await tasks.aclose()
            steps.append("closer went on")

        tasks.spawn(other())
        closing = tasks.spawn(closer())
        assert closing is not None
        async with asyncio.timeout(5):
            await asyncio.wait([closing])
        assert steps == ["other ended", "closer went on"] and len(tasks) == 0

    asyncio.run(scenario())
