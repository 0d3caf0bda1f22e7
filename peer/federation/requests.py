"""What other peers ask of this one: the handlers of the peer-link requests of the federation.

Each handler takes a typed message (:mod:`peer.protocol.link`) and the sender's participant,
and works on the local site, the leases and the mirrors. A coordinator that is itself a
fragment's site reaches the same handlers through :meth:`peer.federation.router.Router.ask`,
so a local install and a remote one run the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from overlay.catalog import CatalogError
from peer.errors import FedstreamError, NotFound, Unavailable
from peer.federation.hosting import Hosting
from peer.federation.mirror import Mirrors
from peer.federation.records import CatalogRecords
from peer.federation.replicas import UNREPLICATED, ReplicaRequests
from peer.federation.router import Router
from peer.model.plan import CheckedQuery
from peer.protocol.link import (
    FragmentStatus,
    HostStream,
    InstallFragment,
    Lookup,
    MirrorAppend,
    PushBatch,
    StartMirror,
    StopMirror,
)
from peer.protocol.link_replies import (
    HostStreamReply,
    MirrorAppendReply,
    MirrorStartReply,
    MirrorStopReply,
)
from peer.protocol.replies import CreateQueryReply, LookupReply, PushReply, SetQueryStatusReply
from peer.site import LocalSite, checked_status

log = logging.getLogger(__name__)


class SiteRequests:
    def __init__(
        self,
        site: LocalSite,
        records: CatalogRecords,
        hosting: Hosting,
        mirrors: Mirrors,
        router: Router,
        replicas: ReplicaRequests = UNREPLICATED,
    ) -> None:
        """``replicas``: the replication room's side of a request (a replicated stream's
        copy, a fragment installed as replicated, a fragment's status changes)."""
        self.site = site
        self.records = records
        self.hosting = hosting
        self.mirrors = mirrors
        self.router = router
        self.replicas = replicas

    def register(self) -> None:
        r = self.router
        r.register(PushBatch.OP, self.push)
        r.register(HostStream.OP, self.host_stream)
        r.register(Lookup.OP, self.lookup)
        r.register(InstallFragment.OP, self.install_fragment)
        r.register(FragmentStatus.OP, self.fragment_status)
        r.register(StartMirror.OP, self.start_mirror)
        r.register(StopMirror.OP, self.stop_mirror)
        r.register(MirrorAppend.OP, self.mirror_append)

    @property
    def me(self) -> bytes:
        return self.router.node_id

    # streams
    async def push(self, message: PushBatch, _sender: str) -> PushReply:
        stream = message.stream
        if self.hosting.replicated(stream):  # its replica driver says whether we are primary
            return await self.site.push_here(
                stream, {"arrow": message.arrow}, message.producer, message.seq
            )
        if stream not in self.hosting.hosted:
            if await self.hosting.host_of(stream, fresh=True) != self.me:
                raise Unavailable(f"this peer does not host stream {stream}", stream=stream)
            await self.hosting.take_over(stream)
        return await self.site.push_here(
            stream, {"arrow": message.arrow}, message.producer, message.seq
        )

    async def host_stream(self, message: HostStream, _sender: str) -> HostStreamReply:
        if await self.replicas.host_replica(message.stream):  # the replica driver made it
            return HostStreamReply(message.stream, self.me.hex(), replicated=True)
        await self.site.add_stream(message.stream, message.schema, None)
        await self.hosting.host(message.stream)
        return HostStreamReply(message.stream, self.me.hex())

    async def start_mirror(self, message: StartMirror, _sender: str) -> MirrorStartReply:
        stream = message.stream
        if stream not in self.hosting.hosted:
            raise Unavailable(f"this peer does not host stream {stream}", stream=stream)
        self.mirrors.start(stream, message.to, message.after)
        with contextlib.suppress(CatalogError):
            await self.hosting.renew(stream)  # the lease lists its mirrors, for a successor
        return MirrorStartReply(stream, message.to.hex())

    async def stop_mirror(self, message: StopMirror, _sender: str) -> MirrorStopReply:
        if message.stream not in self.site.spools:
            raise NotFound(f"no stream {message.stream} on this peer", stream=message.stream)
        acked = await self.mirrors.detach(message.stream, message.to)
        return MirrorStopReply(message.stream, message.to.hex(), acked)

    async def mirror_append(self, message: MirrorAppend, _sender: str) -> MirrorAppendReply:
        return await self.site.append_mirrored(message.stream, message.origin, message.batches)

    # fragments
    async def lookup(self, message: Lookup, _sender: str) -> LookupReply:
        catalog = self.site.catalog
        moved_to = catalog.moved().get(message.name)
        if moved_to is not None and catalog.find_query(message.name) is None:
            return LookupReply.from_wire(await self.router.call(bytes.fromhex(moved_to), message))
        return self.site.lookup_here(message.name)

    async def install_fragment(self, message: InstallFragment, _sender: str) -> CreateQueryReply:
        """Phase 1 of a distributed query, on the fragment's site: replica spools for the
        inputs hosted elsewhere, then the fragment as a local query."""
        for stream, info in message.inputs.items():
            if stream in self.hosting.hosted or info.host == self.me.hex():
                continue  # hosted here, or made by another fragment here
            await self.site.add_replica(stream, info.schema, info.host)
        checked = await asyncio.to_thread(self.site.check_new, message.definition)
        return await self.create_here(checked)

    async def create_here(self, checked: CheckedQuery) -> CreateQueryReply:
        """A query (a whole one, or one fragment) that runs here, its result streams hosted
        here and published in the catalog."""
        replicated = await self.replicas.install(checked)
        if replicated is not None:  # (the replication room answers with the reply's map)
            return CreateQueryReply.from_wire(replicated)
        name = checked.query.name
        for stream in checked.outputs:
            schema = checked.stream_schemas[stream]
            await self.records.publish_stream(stream, schema, name)
            await self.site.add_stream(stream, schema, name)
            await self.hosting.host(stream)
        return await self.site.add_query(checked)

    async def fragment_status(self, message: FragmentStatus, _sender: str) -> SetQueryStatusReply:
        """A distributed query's status change, for one fragment here; DELETED also drops
        its result streams and the replicas no other local query reads."""
        fragment, status = message.fragment, checked_status(message.status)
        catalog = self.site.catalog
        if catalog.find_query(fragment) is None:
            moved_to = catalog.moved().get(fragment)
            if moved_to is not None:  # it moved on: tell it there
                there = await self.router.call(
                    bytes.fromhex(moved_to), FragmentStatus(fragment, status)
                )
                if status == "DELETED":
                    await asyncio.to_thread(catalog.forget_moved, fragment)
                return SetQueryStatusReply.from_wire(there)
            if status == "DELETED":
                await self.replicas.after_status(fragment, status)  # a replica of its streams?
                return SetQueryStatusReply(fragment, status)  # gone already
            raise NotFound(f"no fragment {fragment} on this peer", query=fragment)
        outputs = [s for box in catalog.query(fragment).query.boxes for s in box.outputs]
        reply = await self.site.set_query_status_here(fragment, status)
        await self.replicas.after_status(fragment, status)
        if status == "DELETED":
            still_read = self.site.streams_read()
            await self.drop_streams(
                [s for s in outputs if s not in still_read and s in catalog.stream_names()],
                tombstone=True,
            )
            unused = {s: host for s, host in catalog.replicas().items() if s not in still_read}
            for stream, host in unused.items():
                await self.stop_mirror_here(stream, bytes.fromhex(host))
            # a stream this peer also replicates keeps its copy: the replication owns it
            kept = [s for s in unused if self.hosting.replicated(s)]
            for stream in kept:
                await asyncio.to_thread(catalog.remove_replica, stream)
            await self.drop_streams([s for s in unused if s not in kept], tombstone=False)
        return reply

    async def drop_streams(self, streams: list[str], *, tombstone: bool) -> None:
        for stream in streams:
            self.mirrors.stop_stream(stream)
            self.hosting.drop(stream)
            if tombstone:
                with contextlib.suppress(FedstreamError):
                    await self.records.publish(f"stream:{stream}", {"deleted": True})
            await self.site.drop_streams([stream])

    async def stop_mirror_here(self, stream: str, recorded_host: bytes) -> None:
        """Ask the host of ``stream`` to stop mirroring it to us (our replica is no longer
        read). A mirror left running would keep the host's spool from ever trimming past it."""
        host = await self.hosting.host_now(stream, recorded_host)
        if host == self.me:
            return
        try:
            await self.router.call(host, StopMirror(stream, self.me))
        except FedstreamError as exc:  # its host is gone: nothing left to stop
            log.warning("the host of %s did not stop mirroring it here: %s", stream, exc)
