"""peer.load: CPU of the peer's process tree, its split among fragments, and the engine's
busy time per query (from Spark's progress reports, faked here: no JVM)."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.brain.load import LoadMeter, fragment_loads

# Spins until it has used 0.5 s of CPU (however busy the machine), says so, then idles until
# its stdin closes: the test reads the meter while the child is alive and idle.
SPIN = """
import sys, time
while time.process_time() < 0.5:
    pass
print("spun", flush=True)
sys.stdin.read()
"""


class Clock:
    """Wall time between samples, set by the test (the cores are CPU seconds per second)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spawn() -> Iterator[Callable[[], subprocess.Popen[str]]]:
    """Start spinning children; each is killed and reaped at the end of the test."""
    children: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def spun(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "spun"


def test_the_first_sample_only_sets_the_mark() -> None:
    assert LoadMeter().sample() == 0.0


def test_a_child_started_after_the_mark_counts_all_its_cpu(
    spawn: Callable[[], subprocess.Popen[str]],
) -> None:
    clock = Clock()
    meter = LoadMeter(clock=clock)
    assert meter.sample() == 0.0
    spun(spawn())
    clock.now += 1.0
    # The child used at least 0.5 s of CPU in the 1 s the clock says passed.
    assert meter.sample() > 0.3


def test_a_child_there_before_it_was_first_seen_counts_from_then(
    spawn: Callable[[], subprocess.Popen[str]],
) -> None:
    spun(spawn())  # its 0.5 s of CPU were spent before the meter existed
    clock = Clock()
    meter = LoadMeter(clock=clock)
    meter.sample()
    clock.now += 1.0
    assert meter.sample() < 0.3  # the idle child adds (almost) nothing now


def test_a_vanished_child_does_not_make_a_negative_sample(
    spawn: Callable[[], subprocess.Popen[str]],
) -> None:
    """A child that has gone counted up to its last sample: its CPU is not taken back from
    what the processes still there used (which would show as less than that, down to a
    negative sample or one clamped at zero), nor counted again."""
    clock = Clock()
    meter = LoadMeter(clock=clock)
    meter.sample()
    child = spawn()
    spun(child)
    clock.now += 1.0
    assert meter.sample() > 0.3
    child.kill()
    child.wait()
    spun(spawn())  # uses its 0.5 s of CPU in the same period as the first child vanished
    clock.now += 1.0
    # The new child's 0.5 s (and the test's own bit), neither minus nor plus the first's 0.5 s.
    assert 0.3 < meter.sample() < 0.8


def test_a_process_that_cannot_be_read_is_skipped() -> None:
    class Gone:
        pid = 123456

        def children(self, recursive: bool) -> list[Any]:
            raise psutil.NoSuchProcess(self.pid)

        def oneshot(self) -> Any:
            raise psutil.AccessDenied(self.pid)

    meter = LoadMeter(cast(psutil.Process, Gone()))
    assert meter.sample() == 0.0
    assert meter.sample() == 0.0


def test_a_clock_that_did_not_move_gives_zero() -> None:
    clock = Clock()
    meter = LoadMeter(clock=clock)
    meter.sample()
    assert meter.sample() == 0.0


# -- fragment_loads ------------------------------------------------------------------------------

shares = st.dictionaries(
    st.text(min_size=1, max_size=8), st.floats(0.0, 5.0, allow_nan=False), max_size=8
)
cores = st.floats(0.0, 64.0, allow_nan=False)


@given(cores, shares)
def test_fragment_loads_never_add_up_to_more_than_was_measured(
    cpu: float, busy: dict[str, float]
) -> None:
    loads = fragment_loads(cpu, busy)
    assert set(loads) == set(busy)
    assert all(load >= 0 for load in loads.values())
    assert math.fsum(loads.values()) <= cpu * (1 + 1e-9) + 1e-12


@given(cores, shares)
def test_fragment_loads_are_proportional_to_busy_time(cpu: float, busy: dict[str, float]) -> None:
    loads = fragment_loads(cpu, busy)
    total = math.fsum(busy.values())
    for name, share in busy.items():
        assert loads[name] == pytest.approx(cpu * share / max(total, 1.0), rel=1e-9, abs=1e-12)
    if total >= 1.0:  # busy all the period between them: all the CPU is theirs
        assert math.fsum(loads.values()) == pytest.approx(cpu, rel=1e-9, abs=1e-12)


def test_idle_time_stays_unattributed() -> None:
    assert fragment_loads(4.0, {"a": 0.25, "b": 0.25}) == {"a": 1.0, "b": 1.0}
    assert fragment_loads(4.0, {"a": 1.5, "b": 0.5}) == {"a": 3.0, "b": 1.0}


def test_nonsense_inputs_count_as_nothing() -> None:
    assert fragment_loads(math.nan, {"a": 1.0}) == {"a": 0.0}
    assert fragment_loads(2.0, {"a": -1.0, "b": math.inf, "c": 1.0}) == {
        "a": 0.0,
        "b": 0.0,
        "c": 2.0,
    }


# -- Engine.busy_seconds -------------------------------------------------------------------------


def progress(stamp: str, batch: int, ms: float) -> dict[str, Any]:
    return {"timestamp": stamp, "batchId": batch, "durationMs": {"triggerExecution": ms}}


def test_engine_counts_each_trigger_once(tmp_path: Path) -> None:
    from peer.engine.runner import Engine
    from peer.storage.spool import SpoolSet

    engine = Engine(SpoolSet(tmp_path / "spool", fsync=False), tmp_path / "checkpoints")
    reports: list[dict[str, Any]] = [
        progress("2026-01-01T00:00:00.000Z", 0, 400),
        progress("2026-01-01T00:00:00.500Z", 1, 600),
    ]
    broken = SimpleNamespace()  # a query whose handle fails: counted as no new batches
    engine.running = {
        "q": SimpleNamespace(handle=SimpleNamespace(recentProgress=reports)),  # type: ignore[dict-item]
    }

    async def main() -> list[dict[str, float]]:
        seen = [await engine.busy_seconds()]
        # The same reports again, an idle trigger reporting the next batch's id, then that
        # batch itself: only what is new counts.
        reports.append(progress("2026-01-01T00:00:01.000Z", 2, 5))
        reports.append(progress("2026-01-01T00:00:02.000Z", 2, 1000))
        seen.append(await engine.busy_seconds())
        engine.running["lost"] = broken  # type: ignore[assignment]
        seen.append(await engine.busy_seconds())
        del engine.running["q"]
        seen.append(await engine.busy_seconds())
        return seen

    try:
        first, second, third, fourth = asyncio.run(main())
    finally:
        engine._executor.shutdown(wait=True)
    assert first == {"q": pytest.approx(1.0)}
    assert second == {"q": pytest.approx(2.005)}
    assert third == {"q": pytest.approx(2.005), "lost": 0.0}
    assert fourth == {"lost": 0.0}


def test_engine_counts_the_lane_apart_from_the_fragments(tmp_path: Path) -> None:
    """The lane's batches are busy time no movable fragment used: counted under LANE_BUSY, so
    that fragment_loads does not charge the lane's CPU to the fragments that may move."""
    from peer.brain.load import fragment_loads
    from peer.engine.runner import LANE_BUSY, Engine
    from peer.storage.spool import SpoolSet

    engine = Engine(SpoolSet(tmp_path / "spool", fsync=False), tmp_path / "checkpoints")
    engine.running = {
        "q": SimpleNamespace(  # type: ignore[dict-item]
            handle=SimpleNamespace(recentProgress=[progress("2026-01-01T00:00:00.000Z", 0, 500)])
        ),
    }
    engine.lane.handle = SimpleNamespace(  # type: ignore[assignment]
        recentProgress=[progress("2026-01-01T00:00:00.000Z", 0, 1500)]
    )
    try:
        busy = asyncio.run(engine.busy_seconds())
    finally:
        engine._executor.shutdown(wait=True)
        engine.lane.handle = None
    assert busy == {"q": pytest.approx(0.5), LANE_BUSY: pytest.approx(1.5)}
    # Over a 1 s period with 2 cores used, q and the lane side by side: q ran a quarter of the
    # busy time, so it is charged a quarter (without the lane's entry it would be charged 1.0).
    loads = fragment_loads(2.0, dict(busy))
    assert loads["q"] == pytest.approx(0.5)
    assert fragment_loads(2.0, {"q": busy["q"]})["q"] == pytest.approx(1.0)


def test_engine_shares_the_lane_among_its_members(tmp_path: Path) -> None:
    """Lane members move (issue 28), so the brain needs their load: the lane's batches are
    split equally among the members it has when counted; a member that joins later shares
    only what came after, and one that left drops out. A lane without members stays apart."""
    from peer.engine.lane import LaneMember
    from peer.engine.runner import LANE_BUSY, Engine
    from peer.storage.spool import SpoolSet

    engine = Engine(SpoolSet(tmp_path / "spool", fsync=False), tmp_path / "checkpoints")
    reports = [progress("2026-01-01T00:00:00.000Z", 0, 1200)]
    engine.lane.handle = SimpleNamespace(recentProgress=reports)  # type: ignore[assignment]

    def member() -> LaneMember:
        return SimpleNamespace()  # type: ignore[return-value]

    try:
        assert asyncio.run(engine.busy_seconds()) == {LANE_BUSY: pytest.approx(1.2)}
        engine.lane.members = {"a": member(), "b": member()}
        reports.append(progress("2026-01-01T00:00:01.000Z", 1, 600))
        first = asyncio.run(engine.busy_seconds())
        engine.lane.members = {"a": member(), "c": member(), "d": member()}
        reports.append(progress("2026-01-01T00:00:02.000Z", 2, 900))
        second = asyncio.run(engine.busy_seconds())
    finally:
        engine._executor.shutdown(wait=True)
        engine.lane.handle = None
    assert first == {"a": pytest.approx(0.3), "b": pytest.approx(0.3)}
    assert second == {"a": pytest.approx(0.6), "c": pytest.approx(0.3), "d": pytest.approx(0.3)}
