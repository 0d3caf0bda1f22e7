"""Which peer hosts a stream: leases in the DHT, taken over when a host dies.

Theory of operation
-------------------
* A *source* stream is hosted by the live member XOR-closest to ``sha1("sid:" + name)`` among
  the members that run an engine (:meth:`overlay.node.Overlay.responsible`). The host appends
  pushes to its spool and renews a ``place:`` lease record in the DHT, listing the peers it
  mirrors the stream to. A *result* stream is hosted where the query producing it runs.
* A lease is sticky: a member that joins later and is closer does not take a stream away
  while its host lives (nothing moves, nothing flaps). When the host is declared dead (gossip)
  or its lease has lapsed, the next closest live member takes the stream over on the first
  request that needs it, publishes a new ``place:`` record, and mirrors the stream on to the
  peers the old lease listed, so the fragments reading it go on.
* A stream handed over by a move (:mod:`peer.move`) is *adopted*: the old host's last, short
  lease names us (``moved_to``) and ours goes out as soon as the storing nodes accept it; the
  renewal loop keeps trying for three lease periods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from overlay.catalog import CatalogError, Placement
from overlay.membership import Event
from overlay.node import Overlay
from peer.errors import FedstreamError, Unavailable
from peer.federation.mirror import Mirrors
from peer.federation.records import CatalogRecords
from peer.federation.replicas import UNREPLICATED, ReplicaPlacement
from peer.model.schema import parse_schema
from peer.site import LocalSite
from peer.timing import MONOTONIC, WALL, Clock, wait_event

log = logging.getLogger(__name__)


LEASE_S = 20.0
LEASE_GAP_S = 3.0  # a moved stream's lease may be unreadable this long after the move
CLAIM_RETRY_S = 0.5


class Hosting:
    def __init__(
        self,
        overlay: Overlay,
        records: CatalogRecords,
        site: LocalSite,
        mirrors: Mirrors,
        api: tuple[str, int],
        *,
        replicas: ReplicaPlacement = UNREPLICATED,
        lease_s: float = LEASE_S,
        clock: Clock = MONOTONIC,
        wall: Callable[[], float] = WALL,
    ) -> None:
        """``clock`` times the renewals and the waits; ``wall`` is compared with the expiry
        written in a lease (seconds since the epoch, read by every peer)."""
        self.overlay = overlay
        self.records = records
        self.site = site
        self.mirrors = mirrors
        self.api = api
        self.lease_s = lease_s
        self.clock = clock
        self.wall = wall
        self.hosted: set[str] = set()  # streams this peer hosts (appends, renews the lease)
        self.moved_streams: dict[str, bytes] = {}  # streams handed over to another peer
        self._claims: dict[str, float] = {}  # adopted streams -> give up claiming at
        self._claimed = asyncio.Event()
        self._takeover = asyncio.Lock()
        # Replicated streams: the control plane names their primary (peer.replication.streams)
        self.replicas = replicas

    @property
    def node_id(self) -> bytes:
        return self.overlay.node_id

    # hosting here
    async def host(self, stream: str, *, taking_over: bool = False) -> None:
        """Host ``stream`` (held by the site already) and publish its lease. Taking over from
        a dead host, the old lease may not have run out yet: the renewal loop publishes ours
        as soon as the storing nodes let it."""
        self.hosted.add(stream)
        try:
            await self.renew(stream)
        except CatalogError:
            if not taking_over:
                raise
            log.info("lease of %s not yet free; publishing it when it lapses", stream)

    def adopt(self, stream: str) -> None:
        """Host ``stream``, handed over by its previous host (a moved fragment's result)."""
        self.hosted.add(stream)
        self.moved_streams.pop(stream, None)
        self._claims[stream] = self.clock() + 3 * self.lease_s
        self._claimed.set()

    async def hand_over(self, stream: str, target: bytes, handover_s: float) -> None:
        """Stop hosting ``stream``: a short last lease names ``target`` as its new host."""
        self.hosted.discard(stream)
        self._claims.pop(stream, None)
        self.moved_streams[stream] = target
        overlay = self.overlay
        try:
            await self.records.catalog.place(
                stream,
                self.node_id,
                overlay.identity.cert,
                (overlay.config.host, overlay.port),
                self.api,
                handover_s,
                [],
                moved_to=target,
            )
        except CatalogError as exc:
            log.warning("handover record of %s not published: %s", stream, exc)

    def drop(self, stream: str) -> None:
        self.hosted.discard(stream)
        self._claims.pop(stream, None)

    async def renew(self, stream: str) -> Placement:
        overlay = self.overlay
        return await self.records.catalog.place(
            stream,
            self.node_id,
            overlay.identity.cert,
            (overlay.config.host, overlay.port),
            self.api,
            self.lease_s,
            self.mirrors.targets(stream),
            epoch=self.replicas.epoch_of(stream) if self.replicated(stream) else None,
        )

    async def resume(self) -> None:
        """After a restart: hold on to our streams unless another peer took them over while
        we were gone and holds a valid lease (then forward to it)."""
        replicas = self.site.replicas()
        for stream in self.site.stream_names():
            if stream in replicas or self.replicated(stream):
                continue  # a copy of a stream hosted elsewhere, kept for a local fragment
            placement = await self.records.placement(stream, fresh=True)
            if (
                placement is not None
                and placement.node_id != self.node_id
                and placement.until > self.wall()
            ):
                log.warning(
                    "stream %s is hosted by %s now; forwarding to it",
                    stream,
                    placement.node_id.hex()[:12],
                )
                continue
            self.hosted.add(stream)
            with contextlib.suppress(CatalogError):
                await self.renew(stream)

    async def run(self) -> None:
        """Renew our leases every third of a lease; claim adopted streams meanwhile."""
        renew_at = self.clock() + self.lease_s / 3
        while True:
            wait = renew_at - self.clock()
            if self._claims:
                wait = min(wait, CLAIM_RETRY_S)
            self._claimed.clear()
            await wait_event(self._claimed, max(0.0, wait), self.clock)
            await self._claim_adopted()
            if self.clock() >= renew_at:
                renew_at = self.clock() + self.lease_s / 3
                await self._renew_all()

    async def _claim_adopted(self) -> None:
        for stream, give_up_at in list(self._claims.items()):
            if stream not in self.hosted:
                self._claims.pop(stream, None)
                continue
            try:
                await self.renew(stream)
                self._claims.pop(stream, None)
            except CatalogError as exc:
                if self.clock() > give_up_at:
                    log.warning("lease of %s still not ours: %s", stream, exc)
                    self._claims.pop(stream, None)

    async def _renew_all(self) -> None:
        for stream in sorted(self.hosted):
            if stream in self._claims:
                continue
            if self.replicated(stream):
                # The control plane decides who serves it; the record only tells readers,
                # so an older primary's unexpired record is no reason to step back.
                with contextlib.suppress(CatalogError):
                    await self.renew(stream)
                continue
            try:
                await self.renew(stream)
            except CatalogError as exc:
                log.info("renewing the lease of %s failed: %s", stream, exc)
                await self._yield_if_taken(stream)

    async def _yield_if_taken(self, stream: str) -> None:
        """Another live peer holds a valid lease on a stream we host (we came back before our
        successor's lease could be published, or the other way round): the lease holder
        keeps the stream, we forward to it. Tuples we took meanwhile stay in our spool."""
        placement = await self.records.placement(stream, fresh=True)
        if (
            placement is not None
            and placement.node_id != self.node_id
            and placement.moved_to != self.node_id  # handed over to us: ours once it lapses
            and placement.until > self.wall()
            and self.overlay.is_live(placement.node_id)
        ):
            log.warning(
                "stream %s is held by %s under a valid lease; forwarding to it",
                stream,
                placement.node_id.hex()[:12],
            )
            self.hosted.discard(stream)

    # finding the host
    def replicated(self, stream: str) -> bool:
        """Whether ``stream`` is replicated here (its replica driver says who leads it)."""
        return self.replicas.is_replicated(stream)

    async def host_of(self, stream: str, *, fresh: bool = False) -> bytes:
        """The node id of the peer that hosts ``stream`` now (maybe us)."""
        if stream in self.hosted:
            return self.node_id
        if stream in self.moved_streams:
            return self.moved_streams[stream]
        primary = await self.replicas.primary_of(stream, fresh)
        if primary is not None:
            return primary
        placement = await self.records.placement(stream, fresh=fresh)
        if placement is not None and placement.moved_to is not None:
            return placement.moved_to
        if placement is not None and placement.node_id != self.node_id:
            state = self.overlay.state_of(placement.node_id)
            if state in ("alive", "suspect") or (state is None and placement.until > self.wall()):
                return placement.node_id
        record = await self.records.stream(stream)
        if record.get("derived_from"):
            # a result stream lives where its query runs; no one else can take it over
            if placement is not None:
                return placement.node_id
            raise Unavailable(f"stream {stream}: the peer running its query is unknown")
        responsible = self.overlay.responsible(stream)
        if not responsible:
            raise Unavailable(f"stream {stream}: no live peer can host it")
        return responsible[0].node_id

    async def host_now(self, stream: str, recorded: bytes) -> bytes:
        """The peer hosting ``stream`` now (a move may have changed it), from a fresh read of
        its lease, else ``recorded`` (the host a plan or a replica noted). Right after a move
        there is a moment with no lease (the old host's handover lease has run out, the new
        host's is not yet stored): a retriable answer is asked again for up to LEASE_GAP_S."""
        deadline = self.clock() + LEASE_GAP_S
        while True:
            try:
                return await self.host_of(stream, fresh=True)
            except FedstreamError as exc:
                if exc.retriable and self.clock() < deadline:
                    await self.clock.sleep(0.25)
                    continue
                log.info("host of %s not found from its lease: %s", stream, exc)
                return recorded

    async def take_over(self, stream: str) -> None:
        """Become the host of a source stream whose host is gone (we are responsible now),
        and mirror it on to the peers its old lease listed."""
        async with self._takeover:
            if stream in self.hosted:
                return
            if self.replicated(stream):
                raise Unavailable(f"stream {stream}: its primary is not this peer", stream=stream)
            record = await self.records.stream(stream)
            if record.get("derived_from"):
                raise Unavailable(f"stream {stream} is a query result; it cannot move here")
            schema = parse_schema(record["schema"])
            log.warning("taking over stream %s (its host is gone)", stream)
            previous = await self.records.read(f"place:{stream}", fresh=True) or {}
            await self.site.add_stream(stream, schema, None)
            await self.host(stream, taking_over=True)
            for target in previous.get("mirrors", []):
                if isinstance(target, bytes) and len(target) == 20 and target != self.node_id:
                    self.mirrors.start(stream, target)  # the fragments reading it go on

    async def on_member(self, event: Event) -> None:
        """A member died or left: forget cached placements, so that the next request
        re-resolves (and the responsible peer takes over lazily)."""
        if event.kind in ("dead", "left"):
            self.records.catalog.forget_prefix("place:")
