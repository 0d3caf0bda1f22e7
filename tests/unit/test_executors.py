"""The engine's watch over a cluster's executors, without a JVM: it says when the engine began
waiting for executors (the first look that found none, on the injected clock), keeps that time
while none come, forgets it when one returns, and its status survives the wire and is refused
when malformed."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from peer.engine.executors import ExecutorsStatus, ExecutorWatch, waiting_text
from peer.errors import InvalidInput
from peer.testing import ManualClock

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_a_new_watch_has_not_looked_and_does_not_claim_to_wait() -> None:
    watch = ExecutorWatch(ManualClock(T0))
    assert watch.status == ExecutorsStatus(0, None, checked=False)
    assert not watch.status.waiting
    assert waiting_text(watch.status.to_wire()) == "executors not checked yet"


def test_waiting_starts_at_the_first_look_without_executors_and_ends_when_one_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    watch = ExecutorWatch(clock)
    assert watch.observe(2) == ExecutorsStatus(2, None)
    clock.advance(10)
    with caplog.at_level(logging.INFO, logger="peer.engine.executors"):
        gone = watch.observe(0)
        assert gone == ExecutorsStatus(0, T0 + 10) and gone.waiting
        clock.advance(5)
        assert watch.observe(0) == ExecutorsStatus(0, T0 + 10)  # since the first look, kept
        clock.advance(30)
        back = watch.observe(1)
    assert back == ExecutorsStatus(1, None) and not back.waiting
    messages = [r.getMessage() for r in caplog.records]
    assert sum("waits for executors" in m for m in messages) == 1  # said once, not each look
    assert any("1 executor(s) registered again after 35 s" in m for m in messages), messages
    clock.advance(1)
    assert watch.observe(0) == ExecutorsStatus(0, T0 + 46)  # a new wait, a new since


def test_the_status_text_says_since_when_and_how_many() -> None:
    waiting = ExecutorsStatus(0, T0).to_wire()
    assert waiting == {"live": 0, "waiting": True, "waiting_since": T0, "checked": True}
    assert waiting_text(waiting, now=T0 + 42) == (
        "WAITING FOR EXECUTORS since 08:00:00 UTC (42 s; 0 live)"
    )
    assert waiting_text(ExecutorsStatus(2, None).to_wire()) == "2 executor(s)"


def test_the_status_survives_the_wire() -> None:
    for status in (
        ExecutorsStatus(0, T0),
        ExecutorsStatus(3, None),
        ExecutorsStatus(0, None, False),
    ):
        assert ExecutorsStatus.from_wire(status.to_wire()) == status


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"live": -1, "waiting_since": None, "checked": True}, "'live'"),
        ({"live": "2", "waiting_since": None, "checked": True}, "'live'"),
        ({"live": 0, "waiting_since": "08:00", "checked": True}, "'waiting_since'"),
        ({"live": 0, "waiting_since": True, "checked": True}, "'waiting_since'"),
        ({"live": 0, "waiting_since": None}, "'checked'"),
    ],
)
def test_a_malformed_status_is_refused_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        ExecutorsStatus.from_wire(data)


def test_a_negative_count_is_refused_and_changes_nothing() -> None:
    watch = ExecutorWatch(ManualClock(T0))
    watch.observe(2)
    with pytest.raises(ValueError, match="cannot be negative: -1"):
        watch.observe(-1)
    assert watch.status == ExecutorsStatus(2, None)
