"""Failed queries are started again from their checkpoints (peer.site.restarts), without a
JVM: the policy's delays and limits on an injected clock, and the site's maintenance round
restarting what the engine reports failed, the lane once for all its members."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.errors import EngineError
from peer.model.query import parse_query
from peer.site import LocalSite
from peer.site.restarts import RestartPolicy, Restarts
from peer.site.store import SiteConfig
from peer.testing import ManualClock
from peer.timing import Backoff

POLICY = RestartPolicy(Backoff(first_s=1.0, max_s=8.0), max_attempts=4, healthy_s=60.0)


def test_restarts_come_later_each_time_and_stop_after_max_attempts() -> None:
    restarts, now, at = Restarts(POLICY), 0.0, []
    while now < 100:
        for name in restarts.due(["q"], now):
            restarts.restarted(name, now)
            at.append(now)
        now += 0.5
    # seen failing at 0: due 1 s later; then, seen failing again in the round after each
    # restart (0.5 s on), due 2, 4 and 8 s after that; then no more
    assert at == [1.0, 3.5, 8.0, 16.5]
    assert restarts.gave_up("q") and restarts.attempts("q") == 4


def test_a_query_healthy_long_enough_starts_over_and_one_set_by_hand_too() -> None:
    restarts = Restarts(POLICY)
    assert restarts.due(["q"], 0.0) == []
    assert restarts.due(["q"], 1.0) == ["q"]
    restarts.restarted("q", 1.0)
    assert restarts.due([], 30.0) == [] and restarts.attempts("q") == 1  # not healthy yet
    assert restarts.due(["q"], 31.0) == []  # failed again: 2 s from now
    assert restarts.due(["q"], 33.0) == ["q"]
    restarts.restarted("q", 33.0)
    assert restarts.due([], 93.0) == [] and restarts.attempts("q") == 0  # 60 s healthy
    restarts.restarted("q", 94.0)
    restarts.forget("q")
    assert restarts.attempts("q") == 0


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 20)), max_size=60))
def test_never_more_restarts_than_allowed_between_healthy_spells(
    rounds: list[tuple[bool, float]],
) -> None:
    restarts, now, count = Restarts(POLICY), 0.0, 0
    for failing, step in rounds:
        now += step
        for name in restarts.due(["q"] if failing else [], now):
            restarts.restarted(name, now)
            count += 1
        assert restarts.attempts("q") <= POLICY.max_attempts
    assert count <= POLICY.max_attempts * (1 + int(now // POLICY.healthy_s))


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RestartPolicy(max_attempts=-1)
    with pytest.raises(ValueError, match="healthy_s"):
        RestartPolicy(healthy_s=float("nan"))


class FakeEngine:
    """What the site asks an engine in a maintenance round."""

    def __init__(self) -> None:
        self.failures: dict[str, str] = {}
        self.incarnations: dict[str, str] = {}
        self.lane = SimpleNamespace(members={})
        self.restarted: list[str] = []
        self.refuse = False

    async def failed(self) -> dict[str, str]:
        return dict(self.failures)

    async def stop_query(self, name: str) -> None:
        self.failures.pop(name, None)

    def runs(self, name: str, incarnation: str) -> bool:
        return self.incarnations.get(name) == incarnation

    async def restart_query(self, name: str) -> str:
        if self.refuse:
            raise EngineError(f"query {name}: Spark refused to start it again: no", query=name)
        self.restarted.append(name)
        for member in self.lane.members if name in self.lane.members else [name]:
            self.failures.pop(member, None)
        return "lane" if name in self.lane.members else "own"


def query(name: str) -> Any:
    box = {"name": "f", "type": "filter", "inputs": ["src"], "outputs": [f"{name}_out"],
           "params": {"expression.0": "v > 1"}}  # fmt: skip
    return parse_query({"name": name, "boxes": [box]})


@pytest.fixture
def site(tmp_path: Path) -> tuple[LocalSite, FakeEngine, ManualClock]:
    clock, engine = ManualClock(), FakeEngine()
    site = LocalSite(
        SiteConfig(data_dir=tmp_path),
        engine,  # type: ignore[arg-type]
        clock=clock,
        restarts=Restarts(POLICY),
    )
    for name in ("own", "l1", "l2", "standby_of_x"):
        site.catalog.add_query(query(name), "inc1")
        site.catalog.set_status(name, "RUNNING")
        engine.incarnations[name] = "inc1"
    engine.incarnations["standby_of_x"] = "sb-9"  # a warm standby's run: not the entry's
    engine.lane.members = {"l1": object(), "l2": object()}
    return site, engine, clock


def test_the_site_restarts_failed_queries_and_the_lane_once(
    site: tuple[LocalSite, FakeEngine, ManualClock],
) -> None:
    s, engine, clock = site
    engine.failures = {n: "Python worker failed to connect back" for n in ("own", "l1", "l2")}
    engine.failures["standby_of_x"] = "stopped"
    asyncio.run(s.maintain())
    assert engine.restarted == [] and s.query_errors["own"].startswith("Python worker")
    clock.advance(1.0)
    asyncio.run(s.maintain())
    assert sorted(engine.restarted) == ["l1", "own"]  # the lane once, for both members
    assert "own" not in s.query_errors and "l2" not in s.query_errors
    assert s.restarts.attempts("l2") == 1
    assert "standby_of_x" in s.query_errors and s.restarts.attempts("standby_of_x") == 0


def test_a_restart_spark_refuses_is_tried_again_later_and_then_given_up(
    site: tuple[LocalSite, FakeEngine, ManualClock],
) -> None:
    s, engine, clock = site
    engine.lane.members = {}
    engine.failures = {"own": "stopped"}
    engine.refuse = True
    for _ in range(40):
        asyncio.run(s.maintain())
        clock.advance(1.0)
    assert s.restarts.gave_up("own") and s.query_errors["own"] == "stopped"
    engine.refuse = False
    asyncio.run(s.set_query_status_here("own", "STOPPED"))  # by hand: it starts over
    assert not s.restarts.gave_up("own")
