"""What the federation's parts ask of the replication room, as small ports.

Hosting, the coordinator and the requests of other peers need a few answers about
replicated streams and fragments (is this stream replicated, who leads it, install this
fragment as a replicated one). The room that knows them sits beside the federation and is
built with it, so each part is given one of these ports when it is made
(:class:`peer.federation.service.Federation` passes the control plane's; a federation without
one, or a test, passes :data:`UNREPLICATED`) instead of having callables planted on it.
"""

from __future__ import annotations

from typing import Any, Protocol

from peer.model.plan import CheckedQuery


class ReplicaPlacement(Protocol):
    """Where replicated streams live (hosting, the coordinator's placement)."""

    def is_replicated(self, stream: str) -> bool:
        """Whether this peer holds a replica of ``stream`` (or one waiting for its role)."""
        ...

    def epoch_of(self, stream: str) -> int | None:
        """The epoch in which this peer leads ``stream`` (None: it does not)."""
        ...

    async def primary_of(self, stream: str, fresh: bool) -> bytes | None:
        """The node id of ``stream``'s primary (None: not a replicated stream)."""
        ...


class ReplicaRequests(Protocol):
    """What the requests of other peers hand to the replication room."""

    async def host_replica(self, stream: str) -> bool:
        """Make this peer's copy of a replicated stream (False: not a replicated one)."""
        ...

    async def install(self, checked: CheckedQuery) -> dict[str, Any] | None:
        """Install a fragment as replicated (its reply's wire map), or None if it cannot be."""
        ...

    async def after_status(self, fragment: str, status: str) -> None:
        """A fragment's status changed here."""
        ...


class Unreplicated:
    """Implements both ports where no stream is replicated."""

    def is_replicated(self, stream: str) -> bool:
        return False

    def epoch_of(self, stream: str) -> int | None:
        return None

    async def primary_of(self, stream: str, fresh: bool) -> bytes | None:
        return None

    async def host_replica(self, stream: str) -> bool:
        return False

    async def install(self, checked: CheckedQuery) -> dict[str, Any] | None:
        return None

    async def after_status(self, fragment: str, status: str) -> None:
        return None


UNREPLICATED = Unreplicated()
