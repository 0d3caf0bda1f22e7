"""What the site is given by the rooms above it, as small ports (it never calls back up).

A replicated stream's pushes are appended by the replication room (its replicas hold a batch
before the client is answered), which also says how far each stream may be trimmed: the site
is given a :class:`ReplicaLogs` when it is made. Whether a stream's upstream is reachable is
the federation's to say (:data:`Reachable`, an argument of ``check_availability``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

# (the batch's spool file, its rows, producer, seq) -> the push's answer
Appender = Callable[[bytes, int, str | None, int | None], Awaitable[dict[str, Any]]]
# whether a stream's upstream (the peer it is mirrored from) is reachable
Reachable = Callable[[str], bool]


class ReplicaLogs(Protocol):
    """The streams whose pushes another room appends (replicated streams: the replication
    room's registry, given to the site when it is made), and how far each may be trimmed."""

    def appender(self, stream: str) -> Appender | None:
        """How a push of ``stream`` is appended (None: to the local spool, as usual)."""
        ...

    def trim_limit(self, stream: str) -> int | None:
        """The highest offset of ``stream`` that may be trimmed (None: no limit)."""
        ...


class NoReplicaLogs:
    """A lone peer's: every stream is appended and trimmed here alone."""

    def appender(self, stream: str) -> Appender | None:
        return None

    def trim_limit(self, stream: str) -> int | None:
        return None


def always_reachable(_stream: str) -> bool:
    """A lone peer's upstreams: every stream is here, so none is out of reach."""
    return True
