"""How much CPU this peer uses, and how much of it each movable fragment accounts for.

Theory of operation
-------------------
A peer is more than one process: the Spark JVM is a child of the peer, and Spark's Python
workers are children of the JVM. :class:`LoadMeter` therefore adds up the CPU time of the peer
and of all its descendants between two samples, and divides by the wall time between them:
the result is in *cores* (2.0 = two cores busy all the time), the unit of a peer's capacity.

Children come and go (Python workers are forked on demand), so the meter keeps each
process's CPU time at its last sample, keyed by (pid, creation time) so that a reused pid is
a new process:

- a process seen before counts what it used since then (never less than nothing);
- a process seen for the first time counts its whole CPU time if it was created after the
  previous sample (all of it falls in the period), and nothing otherwise (it was there but
  missed, as in a race with the enumeration: its time before this sample is unknown);
- a process that has gone counted up to its last sample; what it did after that is lost.

The first sample only sets the mark and says 0.0. psutil raises ``NoSuchProcess`` when a
process ends between enumeration and reading, and ``AccessDenied`` for what we may not read;
both are skipped, so a sample never fails on a process that vanished.

:func:`fragment_loads` then splits the measured CPU among the fragments, by the share of the
period each fragment's streaming query spent running micro-batches (DESIGN.md section 7: the
brain moves boxes, so it needs a load per box). It is an estimate that assumes CPU use was
even over the period.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import psutil

__all__ = ["LoadMeter", "Meter", "fragment_loads"]

if sys.platform.startswith("linux"):
    # psutil adds a process's start (clock ticks since boot) to the boot time, which Linux
    # gives to the whole second: its creation times can be a second early. Since-boot times
    # compared with the boot clock are exact to a tick.
    _TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

    def _clock_for_creation() -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def _created(proc: psutil.Process) -> float:
        return float(proc.create_time() - psutil.boot_time())

else:
    _TICK_S = 0.0

    def _clock_for_creation() -> float:
        return time.time()

    def _created(proc: psutil.Process) -> float:
        return float(proc.create_time())


class Meter(Protocol):
    """What measures the CPU a peer uses: :class:`LoadMeter`, or a fake in tests."""

    def sample(self) -> float:
        """Cores used since the previous sample (0.0 on the first call). Blocking."""
        ...


class LoadMeter:
    """CPU cores used by a process and all its descendants since the previous sample."""

    def __init__(
        self,
        process: psutil.Process | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.process = process if process is not None else psutil.Process()
        self._clock = clock
        self._mark: float | None = None  # clock() at the previous sample
        self._mark_created = 0.0  # the previous sample, on the clock of creation times
        self._seen: dict[tuple[int, float], float] = {}  # (pid, created) -> CPU seconds

    def sample(self) -> float:
        """Cores used since the previous sample (0.0 on the first call, which sets the mark)."""
        # The creation mark is taken before enumerating: a process created after it is either
        # seen now or, next time, counted as created after this sample.
        now, mark = self._clock(), _clock_for_creation()
        first = self._mark is None
        seen: dict[tuple[int, float], float] = {}
        used = 0.0
        for proc in self._tree():
            try:
                with proc.oneshot():
                    key = (proc.pid, _created(proc))
                    times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total = times.user + times.system
            seen[key] = total
            before = self._seen.get(key)
            if before is not None:
                used += max(0.0, total - before)
            elif not first and key[1] > self._mark_created - _TICK_S:
                used += total  # created after the previous sample (to a clock tick)
        elapsed = 0.0 if self._mark is None else now - self._mark
        self._seen, self._mark, self._mark_created = seen, now, mark
        if first or elapsed <= 0:
            return 0.0
        return used / elapsed

    def _tree(self) -> list[psutil.Process]:
        try:
            children = self.process.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            children = []
        return [self.process, *children]


def fragment_loads(cpu_cores: float, busy: Mapping[str, float]) -> dict[str, float]:
    """The CPU (cores) each fragment accounts for: ``cpu_cores * busy_f / max(sum(busy), 1)``.

    ``busy[f]`` is the share of the period's wall time that fragment ``f``'s streaming query
    spent running micro-batches (1.0: one batch after another all the time). A fragment is
    charged the CPU of the time it was busy, assuming the peer used its CPU evenly over the
    period. When the shares add up to less than 1, no fragment ran for part of the period, and
    the CPU of that part stays unattributed: it went to ingest, mirrors and the peer process
    itself, none of which can move. When they add up to more than 1 (queries running side by
    side), all the CPU is shared among the fragments in proportion, so the loads never add up
    to more than was measured. Negative or non-finite inputs count as 0.
    """
    cpu = cpu_cores if math.isfinite(cpu_cores) and cpu_cores > 0 else 0.0
    shares = {name: b if math.isfinite(b) and b > 0 else 0.0 for name, b in busy.items()}
    scale = cpu / max(math.fsum(shares.values()), 1.0)
    return {name: share * scale for name, share in shares.items()}
