"""Which inputs of a query are missing (Borealis DPC's detection), from observations and a clock.

Theory of operation
-------------------
A query with an availability bound X must not let a missing input delay its results by more
than X. An input is *missing* when its upstream (the primary of a source stream, or the
fragment producing a result stream) has been unreachable for the threshold, or when it has
made no progress for the threshold while another input of the same query has made progress
since (an input that is merely quiet while every input is quiet holds nothing back that
could be computed). The threshold is X less ``lead_s``, the time the caller needs to start
processing without the input, so that the first tentative results come within X (but at
least X / 2).

A missing input stays missing until its upstream is reachable and it makes progress again,
or every other input has been quiet for the threshold too (nothing shows any more that it is
missing rather than at its end, as every input may be): then it has *returned*, and the
caller corrects. The caller feeds :meth:`MissingInputs.observe`
with each input's position (its log's end: any number that grows with progress), whether its
upstream is reachable, and the time (monotonic seconds); :meth:`MissingInputs.missing` says
which inputs are missing at that time. No I/O, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class _Input:
    position: int | None = None
    changed_at: float = 0.0  # when its position last changed (or was first seen)
    unreachable_since: float | None = None
    missing_since: float | None = None


class MissingInputs:
    """The missing inputs of one query (see the module notes)."""

    def __init__(self, inputs: Iterable[str], bound_s: float, *, lead_s: float = 0.0) -> None:
        if not bound_s > 0:
            raise ValueError(f"an availability bound is above 0 s, not {bound_s}")
        self.bound_s = bound_s
        self.threshold_s = bound_s
        self.set_lead(lead_s)
        self._inputs = {name: _Input() for name in inputs}
        if not self._inputs:
            raise ValueError("a query without inputs misses none")

    def set_lead(self, lead_s: float) -> None:
        """Detect ``lead_s`` before the bound: the time the caller has measured it needs
        before its first tentative result; never before half the bound, so that inputs
        taking turns are not taken for missing ones."""
        self.threshold_s = max(self.bound_s / 2, self.bound_s - max(0.0, lead_s))

    def observe(self, stream: str, position: int, now: float, *, reachable: bool = True) -> None:
        state = self._inputs[stream]
        if state.position is None or position != state.position:
            state.position = position
            state.changed_at = now
        if reachable:
            state.unreachable_since = None
        elif state.unreachable_since is None:
            state.unreachable_since = now

    def missing(self, now: float) -> frozenset[str]:
        """The inputs missing at ``now`` (marking newly missing ones, freeing returned ones)."""
        for name, state in self._inputs.items():
            if state.missing_since is not None:
                if state.unreachable_since is None and (
                    state.changed_at > state.missing_since or self._all_quiet(name, now)
                ):
                    state.missing_since = None
                continue
            if self._is_missing(name, state, now):
                state.missing_since = now
        return frozenset(n for n, s in self._inputs.items() if s.missing_since is not None)

    def _is_missing(self, name: str, state: _Input, now: float) -> bool:
        if state.position is None:
            return False  # never observed: nothing known yet
        gone = state.unreachable_since
        if gone is not None and now - gone >= self.threshold_s:
            return True
        if now - state.changed_at < self.threshold_s:
            return False
        return any(
            other.position is not None and other.changed_at > state.changed_at
            for n, other in self._inputs.items()
            if n != name
        )

    def _all_quiet(self, name: str, now: float) -> bool:
        """Whether no other input has made progress for the threshold: then nothing shows
        that ``name`` is missing rather than done (the end of every input)."""
        return all(
            now - other.changed_at >= self.threshold_s
            for n, other in self._inputs.items()
            if n != name
        )

    def silent_s(self, stream: str, now: float) -> float:
        """Seconds since ``stream`` last made progress."""
        return now - self._inputs[stream].changed_at
