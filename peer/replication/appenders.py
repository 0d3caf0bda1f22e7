"""The site's replicated logs: which streams' pushes the replication room appends.

The replication room decides, stream by stream, that a push is appended through the stream's
replica (its replicas hold it before the client is answered) instead of the local spool, and
how far the stream's spool may be trimmed while a replica still lacks the rest. The site asks
this registry (:class:`peer.site.ReplicaLogs`); the room enters and removes streams in it. The
composition root makes one and hands it to both when it builds them, so neither reaches into
the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from peer.site import Appender

TrimLimit = Callable[[], int | None]  # the highest offset that may be trimmed now


class Appenders:
    """Implements peer.site.ReplicaLogs: one appender (and trim limit) per replicated stream."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Appender, TrimLimit]] = {}

    def register(self, stream: str, appender: Appender, trim_limit: TrimLimit) -> None:
        """Pushes of ``stream`` go to ``appender`` from now on (replacing any before)."""
        self._entries[stream] = (appender, trim_limit)

    def remove(self, stream: str) -> None:
        """``stream`` is appended to the local spool again (if it is still there at all)."""
        self._entries.pop(stream, None)

    def __contains__(self, stream: object) -> bool:
        return stream in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    # ----------------------------------------------------------------------- ReplicaLogs
    def appender(self, stream: str) -> Appender | None:
        entry = self._entries.get(stream)
        return None if entry is None else entry[0]

    def trim_limit(self, stream: str) -> int | None:
        entry = self._entries.get(stream)
        return None if entry is None else entry[1]()
