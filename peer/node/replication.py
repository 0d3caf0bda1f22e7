"""The replication room, built by the composition root and handed to the federation.

The room is this peer's control plane (:class:`peer.replication.plane.ControlPlane`) and its
replicated fragments (:class:`peer.replication.fragment_failover.ReplicatedFragments`). Only
this package builds them (pyproject.toml's import-linter contract); the federation sees them
through :class:`peer.federation.replicas.ReplicationRoom`, which :class:`PlaneRoom` implements.

The plane tells the peer of its role changes, and the federation that acts on them (its
hosting, then the room's fragments) is made after the room, with the room: the plane is given
a :class:`RoleDoor` that the root opens once the federation is made, before the overlay starts
and so before any role can change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from overlay.node import Overlay
from peer.federation.records import CatalogRecords
from peer.federation.replicas import Members, ReplicaSet
from peer.federation.router import Router
from peer.model.plan import CheckedQuery
from peer.protocol.link import Frame
from peer.replication.appenders import Appenders
from peer.replication.fragment_failover import ReplicatedFragments
from peer.replication.plane import ControlPlane, ReplicationSettings
from peer.replication.standby import Standbys
from peer.site import LocalSite
from peer.timing import MONOTONIC, Clock

if TYPE_CHECKING:
    from peer.engine.seams import EngineSeams


OnRole = Callable[[str, bool], None]  # (stream, whether this peer is now its primary)


class RoleDoor:
    """The control plane's way to tell the federation of a role change (its ``on_role``);
    opened once, with the federation's :meth:`~peer.federation.Federation.on_role`, before
    the overlay starts."""

    def __init__(self) -> None:
        self._listener: OnRole | None = None

    def open(self, listener: OnRole) -> None:
        if self._listener is not None:
            raise RuntimeError("the door for role changes is open already")
        self._listener = listener

    def on_role(self, stream: str, primary: bool) -> None:
        if self._listener is None:  # it opens before the overlay starts: a bug if not
            raise RuntimeError(f"stream {stream}: a role change before the federation was made")
        self._listener(stream, primary)


class PlaneRoom:
    """Implements peer.federation.replicas.ReplicationRoom (and so ReplicaPlacement and
    ReplicaRequests) with this peer's control plane and replicated fragments."""

    def __init__(
        self,
        plane: ControlPlane,
        fragments: ReplicatedFragments,
        settings: ReplicationSettings,
    ) -> None:
        self.plane = plane
        self.fragments = fragments
        self.settings = settings

    # peer.federation.replicas.ReplicaPlacement
    def is_replicated(self, stream: str) -> bool:
        return self.plane.replicas.is_replicated(stream)

    def epoch_of(self, stream: str) -> int | None:
        return self.plane.replicas.epoch_of(stream)

    async def primary_of(self, stream: str, fresh: bool) -> bytes | None:
        if not self.plane.client.active:
            return None
        state = await self.plane.client.state_of(stream, fresh=fresh)
        return None if state is None else bytes.fromhex(state.primary)

    # peer.federation.replicas.ReplicaRequests
    async def host_replica(self, stream: str) -> bool:
        if not self.plane.client.active:
            return False
        state = await self.plane.replicas.refresh(stream)
        return state is not None

    async def install(self, checked: CheckedQuery) -> dict[str, Any] | None:
        return await self.fragments.install(checked)

    async def after_status(self, fragment: str, status: str) -> None:
        await self.fragments.after_status(fragment, status)

    # peer.federation.replicas.ReplicationRoom
    @property
    def active(self) -> bool:
        return self.plane.client.active

    @property
    def default_replicas(self) -> int:
        return self.settings.replicas

    async def create(self, stream: str, nodes: list[bytes], replicas: int) -> Frame:
        return await self.plane.replicas.create(stream, nodes, replicas, self.settings.min_insync)

    async def replica_set(self, stream: str) -> ReplicaSet | None:
        if not self.plane.client.active:
            return None
        state = await self.plane.client.state_of(stream, fresh=True)
        if state is None:
            return None
        copies = self.plane.replicas.copies(stream, state)
        return ReplicaSet(
            epoch=state.epoch,
            primary=state.primary,
            replicas=state.replicas,
            in_sync=state.in_sync,
            min_insync=state.min_insync,
            under_replicated=state.under_replicated,
            asked=copies["asked"],
            copies=copies["copies"],
        )

    def plain_copies(self) -> str:
        return self.plane.plain_copies()

    def status(self) -> dict[str, Any]:
        return {**self.plane.status(), **self.fragments.standbys.status()}

    def on_role(self, stream: str, primary: bool) -> None:
        self.fragments.on_role(stream, primary)

    async def start(self, members: Members) -> None:
        """Find the control plane (or found it, or take a seat), then take back the
        replicated fragments this peer leads again."""
        await self.plane.start(members)
        await self.fragments.start()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.plane.run())
            tg.create_task(self.fragments.run())


def build_room(
    site: LocalSite,
    overlay: Overlay,
    router: Router,
    records: CatalogRecords,
    settings: ReplicationSettings,
    roles: RoleDoor,
    *,
    logs: Appenders,
    seams: EngineSeams | None,
    clock: Clock = MONOTONIC,
) -> PlaneRoom:
    """The control plane and the replicated fragments of this peer. ``logs``: the registry of
    replicated streams the site was given; ``seams``: the engine's (None: no engine);
    ``clock``: the room's heartbeats, voter rounds, deadlines and retries."""

    def is_live(node: str) -> bool:
        return overlay.is_live(bytes.fromhex(node))

    def responsible(name: str, r: int, any_peer: bool) -> list[str]:
        found = overlay.successors(name, r) if any_peer else overlay.responsible(name, r)
        return [m.node_id.hex() for m in found]

    async def gone(node: str) -> bool:
        return await overlay.refuses_connections(bytes.fromhex(node))

    plane = ControlPlane(
        site,
        router,
        records,
        settings,
        roles.on_role,
        logs=logs,
        is_live=is_live,
        responsible=responsible,
        gone=gone,
        clock=clock,
    )
    fragments = ReplicatedFragments(
        site,
        plane,
        records,
        router,
        min_insync=settings.min_insync,
        logs=logs,
        standbys=Standbys(site, plane, clock=clock),
        seams=seams,
        clock=clock,
    )
    return PlaneRoom(plane, fragments, settings)
