"""peer.timing: the clock, the periodic loop, the backoff rule and the poll helper, driven by a
ManualClock (no test here sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from peer.client.retry import RetryPolicy
from peer.testing import ManualClock, all_tasks_blocked, member_states, members_alive
from peer.timing import MONOTONIC, WALL, Backoff, Clock, every, wait_event, wait_until, within


async def settle() -> None:
    """Let every task that can run, run (a woken sleeper, then what it awaits next)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_system_clocks_and_the_manual_clock_are_clocks() -> None:
    assert isinstance(MONOTONIC, Clock) and isinstance(WALL, Clock)
    assert isinstance(ManualClock(), Clock)
    assert WALL() > 1.6e9  # seconds since the epoch


def test_a_manual_sleeper_wakes_when_the_clock_passes_its_deadline_and_not_before() -> None:
    async def scenario() -> None:
        clock = ManualClock(100.0)
        woke: list[float] = []

        async def sleeper() -> None:
            await clock.sleep(5)
            woke.append(clock())

        async with asyncio.TaskGroup() as tg:
            tg.create_task(sleeper())
            await settle()
            assert clock.sleepers == 1
            clock.advance(4.9)
            await settle()
            assert woke == []
            clock.now = 105.0
            await settle()
            assert woke == [105.0] and clock.sleepers == 0

    asyncio.run(scenario())


def test_every_runs_one_step_per_interval_and_outlives_a_failed_step() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        ran: list[float] = []

        async def step() -> None:
            ran.append(clock())
            if len(ran) == 2:
                raise RuntimeError("a bad round")

        async with asyncio.TaskGroup() as tg:
            loop = tg.create_task(every(10, step, clock=clock, first_s=0))
            await settle()
            assert ran == [0.0]  # first_s=0: at once
            for _ in range(3):
                clock.advance(10)
                await settle()
            assert ran == [0.0, 10.0, 20.0, 30.0]  # the failure at 10 s did not end the loop
            clock.advance(9)
            await settle()
            assert len(ran) == 4
            loop.cancel()
        assert loop.cancelled()  # cancellation went through, not swallowed

    asyncio.run(scenario())


def test_every_with_a_wake_event_runs_at_once_when_woken_and_on_the_period_otherwise() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        wake = asyncio.Event()
        ran: list[float] = []

        async def step() -> None:
            ran.append(clock())

        async with asyncio.TaskGroup() as tg:
            loop = tg.create_task(every(10, step, clock=clock, wake=wake))
            await all_tasks_blocked()
            assert ran == []
            clock.advance(3)
            wake.set()  # asked for now: no need to wait for the period
            await all_tasks_blocked()
            assert ran == [3.0] and not wake.is_set()  # cleared before the step
            clock.advance(9.9)
            await all_tasks_blocked()
            assert ran == [3.0]  # the period counts from the woken round
            clock.advance(0.1)
            await all_tasks_blocked()
            assert ran == [3.0, 13.0]
            loop.cancel()

    asyncio.run(scenario())


def test_every_refuses_an_interval_that_would_spin() -> None:
    async def noop() -> None:
        return None

    with pytest.raises(ValueError, match="interval above 0"):
        asyncio.run(every(0, noop))


def test_backoff_doubles_to_its_cap_and_jitter_only_shortens() -> None:
    rule = Backoff(0.05, 0.5)
    assert [rule.delay_s(n) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert rule.delay_s(10_000) == 0.5  # no overflow far out
    jittered = Backoff(1.0, 8.0, jitter=0.5)
    assert jittered.delay_s(2, 0.0) == 2.0 and jittered.delay_s(2, 0.999) > 1.0
    with pytest.raises(ValueError, match="first_s"):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError, match="retry numbers start at 1"):
        rule.delay_s(0)


def test_the_client_retry_policy_waits_by_the_same_rule() -> None:
    policy = RetryPolicy(first_backoff_s=0.1, max_backoff_s=5.0, jitter=0.5)
    for retry in range(1, 10):
        for draw in (0.0, 0.3, 0.9):
            assert policy.backoff_s(retry, draw) == Backoff(0.1, 5.0, 0.5).delay_s(retry, draw)


def test_wait_until_returns_the_answer_and_times_out_on_the_clock_naming_what() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        answers = iter([0, None, "found"])
        assert await wait_until(lambda: next(answers), "x", 1.0, every_s=0) == "found"

        async def mover() -> None:
            while True:
                await settle()
                clock.advance(0.5)

        async with asyncio.TaskGroup() as tg:
            moving = tg.create_task(mover())
            with pytest.raises(TimeoutError, match=r"the thing: not after 2 s \(last: False\)"):
                await wait_until(lambda: False, "the thing", 2.0, every_s=0.5, clock=clock)
            moving.cancel()

    asyncio.run(scenario())


def test_wait_until_tolerates_only_what_it_is_told() -> None:
    async def scenario() -> None:
        calls = 0

        async def flaky() -> int:
            nonlocal calls
            calls += 1
            if calls < 3:
                raise ConnectionRefusedError("not up yet")
            return calls

        assert await wait_until(flaky, "up", 5.0, every_s=0, tolerate=(OSError,)) == 3

        async def broken() -> int:
            raise KeyError("a bug")

        with pytest.raises(KeyError):
            await wait_until(broken, "up", 5.0, every_s=0, tolerate=(OSError,))

    asyncio.run(scenario())


class Status:
    def __init__(self, *rounds: list[str]) -> None:
        self.rounds = list(rounds)

    async def status(self) -> dict[str, Any]:
        states = self.rounds.pop(0) if len(self.rounds) > 1 else self.rounds[0]
        return {"overlay": {"members": [{"state": s} for s in states]}}


def test_members_alive_waits_for_enough_live_and_dead_members() -> None:
    async def scenario() -> None:
        client = Status(["alive"], ["alive", "suspect"], ["alive", "alive", "dead"])
        members = await members_alive(client, 2, dead=1, timeout_s=5)
        assert [m["state"] for m in members] == ["alive", "alive", "dead"]
        assert client.rounds == [["alive", "alive", "dead"]]
        with pytest.raises(TimeoutError, match="3 members alive"):
            await members_alive(Status(["alive"]), 3, timeout_s=0.3)

    asyncio.run(scenario())
    assert member_states({"overlay": {"members": [{"state": "dead"}]}}) == {"dead": 1}


def test_wait_event_returns_on_the_event_or_on_the_clock() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        event = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            timed_out = tg.create_task(wait_event(event, 5, clock))
            await settle()
            clock.advance(5)
            assert await timed_out is False
            woken = tg.create_task(wait_event(event, 5, clock))
            await settle()
            event.set()
            assert await woken is True
        assert clock.sleepers == 0  # the losing sleep was cancelled
        assert await wait_event(asyncio.Event(), 0.01) is False  # the system clock

    asyncio.run(scenario())


def test_within_answers_raises_or_times_out_on_the_clock() -> None:
    async def scenario() -> None:
        clock = ManualClock()
        release = asyncio.Event()
        cancelled: list[str] = []

        async def answer() -> str:
            await release.wait()
            return "answer"

        async def hang() -> str:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.append("hang")
            return "never"

        async def refuse() -> str:
            raise LookupError("no such thing")

        async def timeout_of(awaitable: Awaitable[str]) -> TimeoutError | None:
            try:
                await awaitable
            except TimeoutError as exc:
                return exc
            return None

        async with asyncio.TaskGroup() as tg:
            answered = tg.create_task(within(5, answer(), clock))
            await settle()
            clock.advance(4.9)
            release.set()
            assert await answered == "answer"
            timed_out = tg.create_task(timeout_of(within(5, hang(), clock)))
            await settle()
            clock.advance(4.9)
            await settle()
            assert not timed_out.done()
            clock.advance(0.1)
            assert str(await timed_out) == "not done within 5 s"
        assert cancelled == ["hang"] and clock.sleepers == 0
        with pytest.raises(LookupError, match="no such thing"):  # as it is, not in a group
            await within(5, refuse(), clock)
        assert await within(1, answer(), MONOTONIC) == "answer"  # the system clock

    asyncio.run(scenario())
