"""Detecting a missing input (peer.model.availability), with a hand-driven clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.model.availability import MissingInputs


def feed(detector: MissingInputs, now: float, **positions: int) -> frozenset[str]:
    for stream, position in positions.items():
        detector.observe(stream, position, now)
    return detector.missing(now)


def test_a_silent_input_is_missing_once_the_others_progressed_for_the_bound() -> None:
    d = MissingInputs(["a", "g"], bound_s=5.0)
    assert feed(d, 0.0, a=0, g=0) == frozenset()
    for t in range(1, 5):  # a progresses, g is silent: not yet the bound
        assert feed(d, float(t), a=t, g=0) == frozenset()
    assert feed(d, 4.9, a=5, g=0) == frozenset()
    assert feed(d, 5.0, a=6, g=0) == {"g"}
    # it stays missing while silent and a goes on
    assert feed(d, 8.0, a=7, g=0) == {"g"}
    # it returns once it progresses
    assert feed(d, 9.0, a=8, g=1) == frozenset()


def test_a_missing_input_returns_once_every_input_is_quiet() -> None:
    """At the end of every input, a quiet input must not hold the query in its fork."""
    d = MissingInputs(["a", "g"], bound_s=2.0)
    feed(d, 0.0, a=0, g=0)
    assert feed(d, 2.0, a=1, g=0) == {"g"}
    assert feed(d, 3.9, a=1, g=0) == {"g"}  # a last moved at 2.0: not yet quiet for 2 s
    assert feed(d, 4.0, a=1, g=0) == frozenset()
    # but not while g's upstream is unreachable
    d.observe("g", 0, 5.0, reachable=False)
    assert d.missing(7.0) == {"g"}
    d.observe("g", 0, 9.0, reachable=False)
    assert d.missing(20.0) == {"g"}


def test_inputs_that_are_all_quiet_miss_nothing() -> None:
    d = MissingInputs(["a", "g"], bound_s=2.0)
    feed(d, 0.0, a=3, g=7)
    assert feed(d, 100.0, a=3, g=7) == frozenset()


def test_an_unreachable_upstream_makes_its_input_missing_after_the_bound() -> None:
    d = MissingInputs(["a"], bound_s=3.0)
    d.observe("a", 0, 0.0, reachable=False)
    assert d.missing(2.9) == frozenset()
    d.observe("a", 0, 3.0, reachable=False)
    assert d.missing(3.0) == {"a"}
    # progress alone is not a return while the upstream is unreachable
    d.observe("a", 1, 4.0, reachable=False)
    assert d.missing(4.0) == {"a"}
    d.observe("a", 2, 5.0)
    assert d.missing(5.0) == frozenset()


def test_lead_time_brings_detection_forward() -> None:
    d = MissingInputs(["a", "g"], bound_s=5.0, lead_s=2.0)
    feed(d, 0.0, a=0, g=0)
    assert feed(d, 2.9, a=1, g=0) == frozenset()
    assert feed(d, 3.0, a=2, g=0) == {"g"}
    # however long the caller needs, never before half the bound
    d = MissingInputs(["a", "g"], bound_s=5.0, lead_s=30.0)
    feed(d, 0.0, a=0, g=0)
    assert feed(d, 2.4, a=1, g=0) == frozenset()
    assert feed(d, 2.5, a=2, g=0) == {"g"}


@pytest.mark.parametrize("bound", [0.0, -1.0])
def test_a_bound_must_be_positive(bound: float) -> None:
    with pytest.raises(ValueError, match="above 0"):
        MissingInputs(["a"], bound_s=bound)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0.01, 3.0)), max_size=60),
    st.floats(0.5, 5.0),
)
def test_never_missing_before_the_bound_and_always_after_a_long_silence(
    steps: list[tuple[bool, bool, float]], bound: float
) -> None:
    """An input is never declared missing while it progressed within the bound; once it has
    been silent for the bound while the other progressed, it is missing."""
    d = MissingInputs(["a", "g"], bound_s=bound)
    now, pos = 0.0, {"a": 0, "g": 0}
    last = {"a": 0.0, "g": 0.0}
    before: frozenset[str] = feed(d, now, **pos)
    for a_moves, g_moves, dt in steps:
        now += dt
        for name, moves in (("a", a_moves), ("g", g_moves)):
            if moves:
                pos[name] += 1
                last[name] = now
        missing = feed(d, now, **pos)
        for name in ("a", "g"):
            other = "g" if name == "a" else "a"
            if name in missing and name not in before:
                assert now - last[name] >= bound  # newly missing: silent for the bound
            if name in missing and last[name] == now:
                raise AssertionError(f"{name} progressed now and is still missing")
            recent = now - last[other] < bound  # the other input still goes on
            if now - last[name] >= bound and last[other] > last[name] and recent:
                assert name in missing
        before = missing
