"""Whether a peer's engine on a Spark cluster has executors, and since when it has none.

Theory of operation
-------------------
On a cluster master the peer's queries run only while executors are registered with its
driver. When every Worker is gone, Spark neither fails nor finishes a micro-batch: its tasks
wait for resources, the peer goes on taking pushes (the spool holds them), and the queries go
on by themselves once a Worker returns and the master starts executors for the application
again. Nothing of that shows in a query's own status (its streaming query is still active), so
the engine says it: :class:`ExecutorWatch` is fed the number of registered executors each time
the engine looks (every housekeeping round of the peer, a few seconds apart, on the engine's
Spark thread) and keeps

* ``live``: the executors registered at the last look;
* ``waiting_since``: the wall-clock time of the first look that saw none (None while there are
  executors), so "since when" is exact to one housekeeping interval.

It holds no Spark object and reads time only through the clock it is given, so it is tested
without a JVM. A local master has no watch: its executors are the driver itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from peer.errors import InvalidInput

__all__ = ["ExecutorWatch", "ExecutorsStatus", "waiting_text"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutorsStatus:
    """What ``peer status`` says of a cluster engine's executors (``extra["executors"]``).
    ``checked`` is False until the engine first looked (a peer still starting)."""

    live: int
    waiting_since: float | None  # epoch seconds; None: it has executors (or never looked)
    checked: bool = True

    @property
    def waiting(self) -> bool:
        return self.checked and self.live == 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "waiting": self.waiting,
            "waiting_since": self.waiting_since,
            "checked": self.checked,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ExecutorsStatus:
        """InvalidInput naming the field if ``data`` is not an executors status."""
        live, since, checked = data.get("live"), data.get("waiting_since"), data.get("checked")
        if type(live) is not int or live < 0:
            raise InvalidInput(f"executors status: 'live' must be a count, not {live!r}")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
            raise InvalidInput(f"executors status: 'waiting_since' must be a time, not {since!r}")
        if type(checked) is not bool:
            raise InvalidInput(f"executors status: 'checked' must be a bool, not {checked!r}")
        return cls(live, None if since is None else float(since), checked)


class ExecutorWatch:
    """Counts of registered executors in, :class:`ExecutorsStatus` out (see the module)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # wall-clock seconds: "since when" is shown to people
        self._status = ExecutorsStatus(0, None, checked=False)

    def observe(self, live: int) -> ExecutorsStatus:
        """Record a look that found ``live`` executors; the status after it."""
        if live < 0:
            raise ValueError(f"a count of executors cannot be negative: {live}")
        before = self._status
        if live > 0:
            if before.waiting and before.waiting_since is not None:
                log.info(
                    "%d executor(s) registered again after %.0f s without any: queries resume",
                    live,
                    self.clock() - before.waiting_since,
                )
            self._status = ExecutorsStatus(live, None)
        elif before.waiting:
            self._status = before  # still none: keep the first time it saw none
        else:
            log.warning(
                "no executor is registered with the driver: the engine waits for executors "
                "(pushes are still taken; the queries resume when a Worker returns)"
            )
            self._status = ExecutorsStatus(0, self.clock())
        return self._status

    @property
    def status(self) -> ExecutorsStatus:
        return self._status


def waiting_text(status: Mapping[str, Any], now: float | None = None) -> str:
    """The executors of a status' ``extra["executors"]`` as ``peer status`` prints them."""
    parsed = ExecutorsStatus.from_wire(status)
    if not parsed.checked:
        return "executors not checked yet"
    if not parsed.waiting or parsed.waiting_since is None:
        return f"{parsed.live} executor(s)"
    age = (time.time() if now is None else now) - parsed.waiting_since
    stamp = time.strftime("%H:%M:%S", time.gmtime(parsed.waiting_since))
    return f"WAITING FOR EXECUTORS since {stamp} UTC ({age:.0f} s; 0 live)"
