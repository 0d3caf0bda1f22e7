"""What the federation's parts ask of the replication room, as small ports.

Hosting, the coordinator and the requests of other peers need a few answers about
replicated streams and fragments (is this stream replicated, who leads it, install this
fragment as a replicated one). The room that knows them sits beside the federation and is
built by the composition root (:mod:`peer.node.replication`), which hands the federation a
:class:`ReplicationRoom`; the federation gives each part that room as one of these ports when
the part is made (a part without replication, or a test, gets :data:`UNREPLICATED`) instead of
having callables planted on it. Nothing here imports the room's builders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from peer.model.plan import CheckedQuery
from peer.protocol.link import Frame

Members = Callable[[], list[bytes]]  # the overlay's live members now (node ids)


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


@dataclass(frozen=True)
class ReplicaSet:
    """A replicated stream's copies as the control plane decided them (``peer lookup``)."""

    epoch: int
    primary: str  # node ids, hex
    replicas: tuple[str, ...]
    in_sync: tuple[str, ...]
    min_insync: int
    under_replicated: bool
    asked: int  # the replicas the stream asked for
    copies: str  # its copies, asked for and held, in words


class ReplicationRoom(ReplicaPlacement, ReplicaRequests, Protocol):
    """What the federation itself asks of the replication room (the control plane and the
    replicated fragments, built by :mod:`peer.node.replication`)."""

    @property
    def active(self) -> bool:
        """Whether this peer has found a control plane (else no stream is replicated)."""
        ...

    @property
    def default_replicas(self) -> int:
        """The copies a stream gets when its creator names no count."""
        ...

    async def create(self, stream: str, nodes: list[bytes], replicas: int) -> Frame:
        """Create a replicated stream on ``nodes`` (the first leads): its epoch, primary and
        replicas as the control plane placed them."""
        ...

    async def replica_set(self, stream: str) -> ReplicaSet | None:
        """``stream``'s copies, read fresh from the control plane (None: not replicated)."""
        ...

    def plain_copies(self) -> str:
        """The copies of a stream that is not replicated, in words."""
        ...

    def status(self) -> dict[str, Any]:
        """The room's part of ``peer status``."""
        ...

    def on_role(self, stream: str, primary: bool) -> None:
        """This peer became primary of ``stream``, or no longer (after hosting learnt it)."""
        ...

    async def start(self, members: Members) -> None:
        """Once the overlay has joined: find the control plane (and join it as a voter), then
        take back the replicated fragments this peer leads again."""
        ...

    async def run(self) -> None:
        """The room's loops, until cancelled."""
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
