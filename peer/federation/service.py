"""The client API of a peer in a federation: any request, whichever peer serves it.

Any peer takes any request (DESIGN.md section 3). :class:`Federation` decides, for each one,
whether the local site serves it or which peer does, and carries it there: pushes and
subscriptions through :mod:`peer.federation.forward`, queries through
:mod:`peer.federation.coordinator`, catalog records through :mod:`peer.federation.records`.
It is built from its parts by :mod:`peer.node` and knows nothing of the API server, moves or
the brain; the replication room it is given through a small port
(:class:`peer.federation.replicas.ReplicationRoom`), built by :mod:`peer.node.replication`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

from overlay.membership import Event
from overlay.node import Overlay
from peer.errors import AlreadyExists, InvalidInput, NotFound
from peer.federation.coordinator import Coordinator
from peer.federation.forward import Forwarder, checked_body
from peer.federation.hosting import LEASE_S, Hosting
from peer.federation.mirror import Mirrors
from peer.federation.quota import RelayQuota
from peer.federation.records import CatalogRecords
from peer.federation.replicas import ReplicationRoom
from peer.federation.requests import SiteRequests
from peer.federation.router import Router
from peer.model.schema import check_name, parse_schema
from peer.protocol.api import START_POSITIONS
from peer.protocol.link import HostStream
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateStreamReply,
    LookupReply,
    PushReply,
    SetQueryStatusReply,
    StatusReply,
)
from peer.site import LocalSite, checked_status

StatusPart = Callable[[], dict[str, Any]]


class Federation:
    """Implements peer.server.PeerService for a peer in an overlay."""

    def __init__(
        self,
        site: LocalSite,
        overlay: Overlay,
        api: tuple[str, int],
        *,
        router: Router,
        records: CatalogRecords,
        room: ReplicationRoom,
        quota: RelayQuota | None = None,
        status_parts: Mapping[str, StatusPart] | None = None,
        lease_s: float = LEASE_S,
        standby: bool = False,
    ) -> None:
        """Its parts, built in the order they need each other. ``router`` and ``records``:
        this peer's links and catalog, which the replication ``room`` was built on too;
        ``quota``: relayed subscriptions' shares; ``status_parts``: more of ``peer status``
        (the brain's, filled by the composition root once it is made); ``standby``: whether
        the queries coordinated here get warm standbys when they do not say."""
        self.site = site
        self.overlay = overlay
        self.api = api
        self.router = router
        self.records = records
        self.room = room
        self.mirrors = Mirrors(site.spools, overlay.node_id, self.router.call)
        self.hosting = Hosting(
            overlay, self.records, site, self.mirrors, api, replicas=room, lease_s=lease_s
        )
        self.forwarder = Forwarder(self.router, self.hosting, site, overlay.incarnation, quota)
        self.coordinator = Coordinator(
            overlay, self.records, self.hosting, self.router, room, standby=standby
        )
        self.requests = SiteRequests(
            site, self.records, self.hosting, self.mirrors, self.router, room
        )
        self.requests.register()
        self.router.register_stream(self.forwarder.serve)
        self.status_parts: Mapping[str, StatusPart] = {} if status_parts is None else status_parts

    def upstream_reachable(self, stream: str) -> bool:
        """Whether the peer a mirrored stream comes from is alive in gossip's view (a stream
        hosted here, or whose source is unknown, counts as reachable)."""
        source = self.site.catalog.replicas().get(stream)
        if source is None:
            return True
        state = self.overlay.state_of(bytes.fromhex(source))
        return state is None or state == "alive"

    @property
    def node_id(self) -> bytes:
        return self.overlay.node_id

    async def start(self) -> None:
        """Once the overlay has joined: find the control plane (and join it as a voter),
        take back the replicated fragments this peer leads again, then our unreplicated
        streams (see Hosting.resume)."""
        await self.room.start(lambda: [m.node_id for m in self.overlay.live_members()])
        await self.hosting.resume()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.hosting.run())
            tg.create_task(self.mirrors.run())
            tg.create_task(self.room.run())

    async def on_member(self, event: Event) -> None:
        """A member's state changed (gossip): re-resolve placements; a dead member's mirror
        readers stop holding back their streams' writers until it returns."""
        await self.hosting.on_member(event)
        if event.kind in ("dead", "left"):
            await asyncio.to_thread(self.mirrors.on_member, event.info.node_id, False)
        elif event.kind in ("alive", "joined"):
            await asyncio.to_thread(self.mirrors.on_member, event.info.node_id, True)

    def on_role(self, stream: str, primary: bool) -> None:
        """The control plane made this peer primary of ``stream``, or no longer (it calls
        this through the door peer.node.replication.RoleDoor)."""
        if primary:
            self.hosting.hosted.add(stream)
            self.hosting.moved_streams.pop(stream, None)
        else:
            self.hosting.hosted.discard(stream)
        self.room.on_role(stream, primary)

    # the client API (peer.server.PeerService)
    async def create_schema(self, schema: str | dict[str, Any]) -> CreateSchemaReply:
        parsed = parse_schema(schema)
        existing = await self.records.schema(parsed.name)
        if existing is not None and existing.fields != parsed.fields:
            raise AlreadyExists(
                f"schema {parsed.name} already exists in the federation with other fields",
                schema=parsed.name,
            )
        if existing is None:  # published first: a record the DHT refuses leaves nothing here
            await self.records.publish(f"schema:{parsed.name}", {"schema": parsed.to_dict()})
        await self.site.add_schema(parsed)
        return CreateSchemaReply(parsed.name, [f.name for f in parsed.fields])

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> CreateStreamReply:
        found = self.site.find_schema(schema) or await self.records.schema(schema)
        if found is None:
            raise self.site.unknown_schema(schema)
        check_name(name, "stream", InvalidInput)
        existing = await self.records.stream_or_none(name)
        if existing is not None:
            if parse_schema(existing["schema"]).fields != found.fields:
                raise AlreadyExists(
                    f"stream {name} already exists with schema {existing['schema']['name']}",
                    stream=name,
                )
            host = await self.hosting.host_of(name)
            return CreateStreamReply(name, found.name, host.hex())
        self.site.catalog.check_stream(name, found)
        count = self.room.default_replicas if replicas is None else replicas
        if count < 1:
            raise InvalidInput(f"stream {name}: replicas must be at least 1", stream=name)
        nodes = [m.node_id for m in self.overlay.responsible(name, count)]
        if self.room.active:
            await self.records.publish_stream(name, found, None)
            placed = await self.room.create(name, nodes, count)
            await asyncio.gather(  # each replica makes its copy and learns its role
                *(
                    self.router.ask(bytes.fromhex(n), HostStream(name, found))
                    for n in placed["replicas"]
                )
            )
            placement = {k: v for k, v in placed.items() if k not in ("stream", "schema", "host")}
            placement["under_replicated"] = len(placed["replicas"]) < count
            return CreateStreamReply(name, found.name, placed["primary"], extra=placement)
        host = nodes[0]
        await self.records.publish_stream(name, found, None)
        await self.router.ask(host, HostStream(name, found))
        return CreateStreamReply(name, found.name, host.hex())

    async def create_query(self, query: str | dict[str, Any]) -> CreateQueryReply:
        parsed = await asyncio.to_thread(self.site.parse_query, query)
        return await self.coordinator.create(parsed)

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply:
        status = checked_status(status)
        pointer = await self.records.query_pointer(name)
        if pointer is not None and not pointer.get("deleted"):
            return await self.coordinator.set_status(name, status)
        return await self.site.set_query_status_here(name, status)

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> PushReply:
        if stream in self.hosting.hosted:
            return await self.site.push_here(stream, payload, producer, seq)
        if (producer is None) != (seq is None):
            raise InvalidInput("push: give both producer and seq, or neither", stream=stream)
        schema = await self.records.stream_schema(stream)
        body = await checked_body(
            schema, payload, stream=stream, max_bytes=self.site.max_push_bytes
        )
        reply = await self.forwarder.push(stream, body, producer, seq)
        return replace(reply, extra={**reply.extra, "forwarded": True})

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        if start not in START_POSITIONS:
            raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
        return self.forwarder.relay(stream, start)

    async def lookup(self, name: str) -> LookupReply:
        catalog = self.site.catalog
        hosted_here = name in self.hosting.hosted and catalog.find_stream(name) is not None
        if catalog.find_query(name) is not None or hosted_here:
            here = self.site.lookup_here(name)
            order = (*here.to_wire(), "host")  # (the order this reply has always had)
            found = replace(here, host=self.node_id.hex(), order=order)
        else:
            found = await self._lookup_catalog(name)
        if found.kind == "stream":
            copies = await self._replication_of(name, found.host)
            return replace(found, extra={**found.extra, **copies})
        if found.kind == "query":
            fragments = found.extra.get("fragments")
            if fragments is None:  # looked up where it runs: this peer's fragment
                status = found.extra.get("status")
                fragments = [{"name": name, "site": self.node_id.hex(), "status": status}]
                found = replace(found, extra={**found.extra, "fragments": fragments})
            for fragment in fragments:
                node = fragment.get("site")  # ("site": the old key, kept for one release)
                if isinstance(node, str):
                    fragment.setdefault("peer", node)
                    fragment.setdefault("api", self._api_of(node))
        return found

    def _api_of(self, node: str) -> str | None:
        """HOST:PORT of the client API of peer ``node`` (hex), if it is known here."""
        if node == self.node_id.hex():
            return f"{self.api[0]}:{self.api[1]}"
        try:
            member = self.overlay.member(bytes.fromhex(node))
        except ValueError:
            return None
        return None if member is None else f"{member.api[0]}:{member.api[1]}"

    async def _replication_of(self, name: str, host: str | None) -> dict[str, Any]:
        """A stream's copies for ``peer lookup``, in one shape whether it is replicated or
        not (docs/protocol.md, "lookup"): a stream without replication has one copy, on its
        host, at no epoch."""
        state = await self.room.replica_set(name)
        if state is None:
            node = host or self.node_id.hex()
            copy = {"node": node, "api": self._api_of(node)}
            return {
                "stream": name,
                "epoch": None,
                "primary": copy,
                "replicas": [{**copy, "in_sync": True}],
                "in_sync": [node],
                "min_insync": 1,
                "asked": 1,
                "under_replicated": False,
                "replicated": False,
                "copies": self.room.plain_copies(),
            }
        return {
            "stream": name,
            "epoch": state.epoch,
            "primary": {"node": state.primary, "api": self._api_of(state.primary)},
            "replicas": [
                {"node": n, "api": self._api_of(n), "in_sync": n in state.in_sync}
                for n in state.replicas
            ],
            "in_sync": list(state.in_sync),
            "min_insync": state.min_insync,
            "under_replicated": state.under_replicated,
            "replicated": True,
            "asked": state.asked,
            "copies": state.copies,
        }

    async def _lookup_catalog(self, name: str) -> LookupReply:
        """Describe a stream, query or schema from the DHT catalog (not hosted here)."""
        # the three namespaces at once: a lookup costs one DHT round trip, not three
        stream, query, schema = await asyncio.gather(
            self.records.read(f"stream:{name}"),
            self.records.read(f"query:{name}"),
            self.records.read(f"schema:{name}"),
        )
        if stream is not None and not stream.get("deleted"):
            host = await self.hosting.host_of(name)
            member = self.overlay.member(host)
            lease = await self.records.placement(name)
            return LookupReply(
                "stream",
                name,
                host.hex(),
                extra={
                    "lease": None
                    if lease is None
                    else {"node": lease.node_id.hex(), "until": round(lease.until, 3)},
                    "schema": stream["schema"],
                    "derived_from": stream.get("derived_from"),
                    "owner": stream.get("owner"),
                    "responsible": None if member is None else f"{member.api[0]}:{member.api[1]}",
                },
                # (the order this reply has always had: the lease first)
                order=("lease", "kind", "name", "schema", "derived_from", "owner", "host"),
            )
        found = (
            await self.records.query_definition(name)
            if query is not None and not query.get("deleted")
            else None
        )
        if found is not None:
            pointer, plan = found
            fragments = await self.coordinator.describe(name)
            statuses = {f.get("status") for f in fragments}
            return LookupReply(
                "query",
                name,
                bytes(pointer["host"]).hex(),
                extra={
                    "status": statuses.pop() if len(statuses) == 1 else "MIXED",
                    "definition": plan.get("query", plan),
                    "owner": pointer.get("owner"),
                    "fragments": fragments,
                },
                order=("kind", "name", "status", "definition", "owner", "host"),
            )
        if schema is not None:
            return LookupReply("schema", name, extra={"schema": schema["schema"]})
        participant = await self.records.read(f"participant:{name}")
        if participant is not None:
            pk = participant.get("pk")
            return LookupReply(
                "participant",
                name,
                extra={
                    "public_key": pk.hex() if isinstance(pk, bytes) else None,
                    "trusted_here": isinstance(pk, bytes) and self.overlay.trust.is_trusted(pk),
                },
            )
        raise NotFound(f"nothing named {name} in the catalog", name=name)

    async def status(self) -> StatusReply:
        catalog = self.site.catalog
        status = await self.site.status()
        return replace(
            status,
            extra={
                **status.extra,
                "overlay": self.overlay.status(),
                "hosted": sorted(self.hosting.hosted),
                "replicas": catalog.replicas(),
                "mirrors": self.mirrors.describe(),
                "forwarded": self.forwarder.forwarded,
                "moved": catalog.moved(),
                "replication": self.room.status(),
                **{key: part() for key, part in self.status_parts.items()},
            },
        )
