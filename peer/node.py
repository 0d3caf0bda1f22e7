"""One peer, wired together: configuration in, objects built, one TaskGroup running them.

The composition root and nothing else. The rooms it wires, each using only the ones below
it (docs/architecture.md): :class:`peer.site.LocalSite` (streams, queries and the Spark
engine of this peer); :class:`peer.federation.Federation` (with an overlay: where things
live in the federation, and how requests get there); :class:`peer.move.Mover` and
:class:`peer.brain.Brain` (with contracts: moving fragments to partners under the
bounded-price mechanism); the client API server (:mod:`peer.server`), serving the site or
the federation; with ``http``, the observer and its HTTP server (:mod:`peer.observe`), fed
at the seams this module holds (client service, brain port, engine result seam, lookups).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from overlay.stream import decode_pool
from overlay.wire import DecodeBudget
from peer.errors import Conflict, FedstreamError, Unavailable
from peer.federation import Federation
from peer.fetch.server import FetchLimits, FetchServer, advertised_host, remote_input
from peer.model.limits import ContentLimits
from peer.protocol import replies
from peer.protocol.link import Raw
from peer.replication.plane import ReplicationSettings
from peer.server import AnnouncedBatches, ApiServer, PeerService, api_server_tls, is_loopback
from peer.site import LocalSite, SiteConfig
from peer.timing import MONOTONIC, Clock, every

if TYPE_CHECKING:
    from contracts.book import ContractBook
    from overlay.identity import NodeIdentity, TrustStore
    from overlay.membership import MemberInfo
    from overlay.node import Overlay
    from peer.brain import Brain
    from peer.engine.runner import Engine
    from peer.move import Mover
    from peer.observe import HttpServer, Observer

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass
class PeerConfig:
    data_dir: Path = field(default_factory=lambda: Path("peer-data"))
    host: str = "127.0.0.1"
    port: int = 7700
    engine: bool = True
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    checkpoint_root: Path | None = None  # None: DATA_DIR/checkpoints (peer.engine.checkpoint_home)
    trigger_s: float = 0.0
    max_rows_per_batch: int = 200_000
    # Run filter/map/union-only queries together in one streaming query (peer.engine.lane).
    fuse_stateless: bool = True
    # How many per-tuple queries run on their own before the next ones share the lane.
    lane_after: int = 1
    max_frame_bytes: int = 64 * 1024 * 1024
    # Wire budgets, timeouts, fair sharing (issue 12): docs/protocol.md section 6 says each.
    max_frame_depth: int = 32
    max_frame_elements: int = 2_000_000
    max_container_len: int = 1_000_000
    max_decoded_bytes: int = 128 * 1024 * 1024
    frame_timeout_s: float = 60.0
    api_idle_timeout_s: float = 300.0
    link_idle_timeout_s: float = 300.0
    max_connections_per_address: int = 64
    evict_idle_s: float = 2.0
    relay_streams_per_connection: int = 16
    relay_streams_per_address: int = 32
    decode_workers: int = 1
    maintenance_interval_s: float = 2.0
    availability_interval_s: float = 0.25  # how often queries with a bound are looked at
    # How long a stream no query reads (a result stream) keeps its tuples for late subscribers.
    retention_s: float = 600.0
    fsync: bool = True
    # the overlay (DHT catalog, peer links, gossip); off: a lone peer as in issue 2
    overlay: bool = True
    overlay_host: str | None = None  # default: the API host
    overlay_port: int | None = None  # default: API port + 1 (0 when the API port is 0)
    bootstrap: list[tuple[str, int]] = field(default_factory=list)
    bootstrap_timeout_s: float = 30.0
    participant: str | None = None
    key_path: Path | None = None
    trust_dir: Path | None = None
    gossip_interval_s: float = 1.0
    suspect_after_s: float = 3.0
    dead_after_s: float = 8.0
    lease_s: float = 20.0
    # Backpressure: how many batches a stream may hold that its slowest reader (a query, a
    # mirror to another peer) has not taken; beyond it, pushes and mirrored appends wait
    # (up to backlog_wait_s, then a retriable error) and queries writing it read no input.
    max_backlog_batches: int = 1000
    backlog_wait_s: float = 30.0
    # Federation (issue 5): signed contracts with partners, and the bounded-price brain.
    contracts_dir: Path | None = None
    capacity: float | None = None  # cores this peer offers; default: os.cpu_count()
    bpm_period_s: float = 5.0
    offer_margin: float = 0.05
    accept_margin: float = 0.05
    offer_timeout_s: float = 10.0
    brain: bool = True  # run the brain when there are contracts
    # Replication (issue 11): a seat in the control plane, and the defaults of new streams.
    voter: bool = False
    replicas: int = 3
    min_insync: int = 2
    failover_after_s: float = 1.5
    repair_after_s: float = 30.0  # a replica silent this long is replaced by a live peer
    # Observability (issue 13): /metrics, /status and the dashboard on this address; None: off
    # (``peer join`` serves them by default on the API host, API port + 2).
    http: tuple[str, int] | None = None
    # Run a small windowed query once after this peer's own Spark session starts, so that the
    # first fragment it runs (a take-over, an arrival) starts warm (peer.engine.warm).
    warm_up: bool = True
    # Content budgets of requests (issue 12): pushed Arrow bytes once decompressed, query size
    # in any form, boxes, arrows per box, parameter text (peer.model.limits).
    limits: ContentLimits = field(default_factory=ContentLimits)
    # Executors fetch spool files from this peer (peer.fetch.server.remote_input: None = when
    # the Spark master is not local, or FEDSTREAM_FETCH_REMOTE=1).
    fetch_remote: bool | None = None
    fetch_port: int = 0  # 0: any free port (fix it where a firewall needs to know)
    fetch_limits: FetchLimits = field(default_factory=FetchLimits)


class Peer:
    """A peer's objects, built from a :class:`PeerConfig`, run in one TaskGroup until stop()."""

    def __init__(self, config: PeerConfig, *, clock: Clock = MONOTONIC) -> None:
        self.config = config
        self.clock = clock  # intervals: the housekeeping rounds, the load figures
        self.data_dir = config.data_dir
        self.site: LocalSite | None = None
        self.api: ApiServer | None = None
        self.identity: NodeIdentity | None = None
        self.trust: TrustStore | None = None
        self.book: ContractBook | None = None
        self.overlay: Overlay | None = None
        self.fed: Federation | None = None
        self.mover: Mover | None = None
        self.brain: Brain | None = None
        self.observer: Observer | None = None
        self.http: HttpServer | None = None
        self.fetch: FetchServer | None = None
        self._service = ClientService(clock)
        self._stopping = asyncio.Event()
        self._cpu_mark = (clock(), time.process_time())

    @property
    def budget(self) -> DecodeBudget:
        """What one frame from a client or a peer may decode to."""
        c = self.config
        return DecodeBudget(
            c.max_frame_depth, c.max_frame_elements, c.max_container_len, c.max_decoded_bytes
        )

    @property
    def engine(self) -> Engine | None:
        return None if self.site is None else self.site.engine

    # lifecycle
    async def start(self, spark: Any = None) -> None:
        config = self.config
        site = self.site = LocalSite(
            SiteConfig(
                data_dir=config.data_dir,
                max_backlog_batches=config.max_backlog_batches,
                backlog_wait_s=config.backlog_wait_s,
                retention_s=config.retention_s,
                limits=config.limits,
            )
        )
        self._service.target = site
        if config.engine:
            site.engine = await self._start_engine(site, spark)
            from peer.move.journal import Journal

            # a fragment whose move did not finish runs where its move's outcome says
            await site.resume_queries(skip=Journal(site.data_dir).fragments_in_doubt())
        http_off_loopback = config.http is not None and not is_loopback(config.http[0])
        if config.overlay or not is_loopback(config.host) or http_off_loopback:
            await self._load_identity()
        tls: dict[str, Any] = {}
        if not is_loopback(config.host):
            # a client port off loopback takes TLS clients with a trusted participant's key
            assert self.identity is not None and self.trust is not None
            tls = {"ssl": api_server_tls(self.identity, self.trust), "trust": self.trust}
        decode_pool(config.decode_workers)  # made once per process, by its first peer
        self.api = ApiServer(
            self._service,
            host=config.host,
            port=config.port,
            max_frame_bytes=config.max_frame_bytes,
            budget=self.budget,
            frame_timeout_s=config.frame_timeout_s,
            idle_timeout_s=config.api_idle_timeout_s,
            max_per_address=config.max_connections_per_address,
            evict_idle_s=config.evict_idle_s,
            **tls,
        )
        await self.api.start()
        site.address = f"{config.host}:{self.api.port}"
        if config.overlay:
            await self._start_federation(site)
        if config.http is not None:
            await self._start_http(*config.http)
        log.info("peer listening on %s:%d (data %s)", config.host, self.api.port, self.data_dir)

    async def _start_engine(self, site: LocalSite, spark: Any) -> Engine:
        from peer.engine.runner import Engine  # pyspark: imported only by peers with an engine

        config = self.config
        checkpoints = config.checkpoint_root or self.data_dir / "checkpoints"
        if remote_input(config.fetch_remote, config.spark_master):
            # The spools executors read: the streams', and those the engine keeps beside its
            # checkpoints (the warm-up's, tentative forks'), wherever --checkpoint-dir put them.
            roots = [self.data_dir, checkpoints]
            self.fetch = await FetchServer.open(
                self.data_dir, roots, config.host, config.fetch_port, config.fetch_limits,
                advertised_host(config.host, config.spark_conf),
            )  # fmt: skip
        engine = Engine(
            site.spools,
            checkpoints,
            master=config.spark_master,
            conf=config.spark_conf,
            trigger_s=config.trigger_s,
            max_rows_per_batch=config.max_rows_per_batch,
            fuse_stateless=config.fuse_stateless,
            lane_after=config.lane_after,
            max_backlog=config.max_backlog_batches,
            fetch=None if self.fetch is None else self.fetch.endpoint,
        )
        await engine.start(spark)
        return engine

    async def _load_identity(self) -> None:
        from overlay.identity import NodeIdentity

        config = self.config
        identity = await asyncio.to_thread(
            NodeIdentity.load_or_create, self.data_dir, config.participant, config.key_path
        )
        self.identity = identity
        self.trust = identity.trust_store()
        if config.trust_dir is not None:
            self.trust.load_dir(config.trust_dir)
        if config.contracts_dir is not None:
            from peer.brain.book import load_contracts

            self.book = load_contracts(config.contracts_dir, identity, self.trust)

    async def _start_federation(self, site: LocalSite) -> None:
        from overlay.link import LinkSettings
        from overlay.node import Overlay, OverlayConfig
        from peer.federation.quota import RelayQuota
        from peer.move import Mover

        config = self.config
        identity, trust = self.identity, self.trust
        assert identity is not None and trust is not None
        port = config.overlay_port
        if port is None:
            port = config.port + 1 if config.port else 0
        overlay = self.overlay = Overlay(
            identity,
            trust,
            OverlayConfig(
                host=config.overlay_host or config.host,
                port=port,
                bootstrap=list(config.bootstrap),
                bootstrap_timeout_s=config.bootstrap_timeout_s,
                gossip_interval_s=config.gossip_interval_s,
                suspect_after_s=config.suspect_after_s,
                dead_after_s=config.dead_after_s,
                links=LinkSettings(
                    max_frame_bytes=config.max_frame_bytes,
                    budget=self.budget,
                    frame_timeout_s=config.frame_timeout_s,
                    idle_timeout_s=config.link_idle_timeout_s,
                    max_per_address=config.max_connections_per_address,
                    evict_idle_s=config.evict_idle_s,
                ),
            ),
            self.data_dir,
            api=self.api_addr,
            engine=site.engine is not None,
        )
        replication = ReplicationSettings(
            voter=config.voter,
            replicas=config.replicas,
            min_insync=config.min_insync,
            failover_after_s=config.failover_after_s,
            repair_after_s=config.repair_after_s,
        )
        fed = self.fed = Federation(
            site, overlay, self.api_addr, lease_s=config.lease_s, replication=replication
        )
        fed.forwarder.quota = RelayQuota(
            config.relay_streams_per_connection, config.relay_streams_per_address
        )
        overlay.handler = fed.router
        overlay.on_member = fed.on_member
        if self.book is not None and config.brain:
            self.brain = self._make_brain(fed, self.book)
        self.mover = Mover(site, fed, self.book, self._arrived)
        self.mover.register()
        if self.brain is not None:
            fed.router.register("offer", self._on_offer)
            brain = self.brain
            fed.status_parts["brain"] = lambda: dict(brain.status())
        else:
            fed.router.register("offer", _no_offers)
        await overlay.start()
        await fed.start()
        self._service.target = fed
        await self.mover.recover()

    async def _start_http(self, host: str, port: int) -> None:
        from peer.observe import HttpServer, Observer, PeerPort, current_context
        from peer.protocol.link import ObservePeer

        ssl_context = None
        if not is_loopback(host):  # like the client API: TLS with participant certificates
            assert self.identity is not None and self.trust is not None
            ssl_context = current_context(api_server_tls(self.identity, self.trust))
        assert self.site is not None
        observer = self.observer = Observer(PeerPort(self._service.status, self.site, self.fed))
        self._service.observer = observer
        if self.engine is not None:
            self.engine.on_result = observer.result
        if self.overlay is not None and self.overlay.catalog is not None:
            self.overlay.catalog.on_lookup = observer.dht_lookup
        if self.fed is not None:
            self.fed.router.register(ObservePeer.OP, observer.handle_observe)
        self.http = HttpServer(observer, self._service.status, host, port, ssl_context=ssl_context)
        await self.http.start()
        observer.dashboard = self.http.url

    def _make_brain(self, fed: Federation, book: ContractBook) -> Brain:
        from contracts.bpm import BpmConfig
        from peer.brain import Brain

        config = self.config
        bpm = BpmConfig(
            period_s=config.bpm_period_s,
            offer_timeout_s=config.offer_timeout_s,
            offer_margin=config.offer_margin,
            accept_margin=config.accept_margin,
        )
        capacity = config.capacity or float(os.cpu_count() or 1)
        return Brain(BrainPort(self, fed), book, bpm, capacity)

    async def _on_offer(self, message: Raw, sender: str) -> dict[str, Any]:
        assert self.brain is not None
        reply = dict(await self.brain.handle_offer(message.frame, sender=sender))
        if self.observer is not None:
            self.observer.offered("received", "accepted" if reply.get("accepted") else "refused")
        return reply

    async def _arrived(
        self,
        fragment: str,
        from_participant: str,
        contract: str,
        load: float,
        price: float,
        *,
        from_node: bytes | None = None,
    ) -> None:
        """A fragment moved in: counted, then the brain's ledger (peer.move.ArrivalHook)."""
        if self.observer is not None:
            self.observer.moved("in", True)
        if self.brain is not None:
            await self.brain.note_arrival(
                fragment, from_participant, contract, load, price, from_node=from_node
            )

    @property
    def api_addr(self) -> tuple[str, int]:
        return (self.config.host, self.port)

    @property
    def port(self) -> int:
        assert self.api is not None
        return int(self.api.port)

    async def run(self) -> None:
        """Serve until stop() is called (SIGINT/SIGTERM in the CLI), then close."""
        try:
            async with asyncio.TaskGroup() as tg:
                housekeeping_s, site = self.config.maintenance_interval_s, self.site
                tg.create_task(every(housekeeping_s, self._maintenance, clock=self.clock))
                if site is not None:  # queries with an availability bound (issue 16)
                    tg.create_task(
                        every(
                            self.config.availability_interval_s,
                            site.check_availability,
                            clock=self.clock,
                        )
                    )
                if self.overlay is not None and self.fed is not None:
                    tg.create_task(self.overlay.run())
                    tg.create_task(self.fed.run())
                    if self.brain is not None:
                        tg.create_task(self.brain.run())
                if self.observer is not None:
                    tg.create_task(self.observer.run())
                if self.mover is not None:  # moves left in doubt are resolved there
                    tg.create_task(self.mover.run())
                engine = self.site.engine if self.site is not None else None
                if engine is not None and engine.owns_session and self.config.warm_up:
                    from peer.engine.warm import warm_up

                    tg.create_task(warm_up(engine))
                await self._stopping.wait()
                raise _Stop
        except* _Stop:
            pass
        finally:
            await self.close()

    def stop(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        if self.overlay is not None:
            await self.overlay.close()
            self.overlay = None
        if self.api is not None:
            await self.api.close()
            self.api = None
        if self.site is not None:
            await self.site.close()
            self.site = None
        if self.fetch is not None:  # after the engine: its last reads may still fetch
            await self.fetch.close()
            self.fetch = None

    async def _maintenance(self) -> None:
        if self.overlay is not None:
            self.overlay.set_load(self._load_figures())
        if self.site is not None:
            await self.site.maintain()

    def _load_figures(self) -> dict[str, float]:
        """What this peer gossips about its load: the share of one core its process used
        since the last round, and how many streams and queries it holds."""
        now, cpu = self.clock(), time.process_time()
        last = self._cpu_mark
        self._cpu_mark = (now, cpu)
        share = (cpu - last[1]) / (now - last[0]) if now > last[0] else 0.0
        assert self.site is not None
        brain = {} if self.brain is None else self.brain.load_figures()
        return {
            **brain,
            "cpu": round(share, 3),
            "streams": float(len(self.fed.hosting.hosted) if self.fed is not None else 0),
            "queries": float(len(self.site.catalog.query_names())),
        }

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float = 0.0, price: float = 0.0
    ) -> dict[str, Any]:
        """Move fragment ``name``, with its state, to peer ``target`` (peer.move)."""
        if self.mover is None:
            raise Conflict("this peer is not in an overlay: fragments cannot move")
        try:
            reply = await self.mover.move_out(
                name, target, contract=contract, load=load, price=price
            )
        except BaseException:
            if self.observer is not None:
                self.observer.moved("out", False)
            raise
        if self.observer is not None:
            pause = reply.get("pause_s")
            self.observer.moved("out", True, pause if isinstance(pause, float | int) else None)
        return reply


class ClientService:
    """The client API's view of the peer: the site of a lone peer, the federation once the
    overlay has joined. Subscriptions announce their start position (peer.server)."""

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        self.clock = clock  # times a push for the metrics
        self.target: PeerService | None = None
        self.observer: Observer | None = None  # told of pushes and refusals

    async def _counted(self, call: Awaitable[R]) -> R:
        """``call``'s reply; a refusal is counted by its code (the metrics) and raised."""
        try:
            return await call
        except FedstreamError as exc:
            if self.observer is not None:
                self.observer.refused(exc.code)
            raise

    def _to(self) -> PeerService:
        if self.target is None:
            raise Unavailable("the peer is starting; retry")
        return self.target

    async def create_schema(self, schema: str | dict[str, Any]) -> replies.CreateSchemaReply:
        return await self._counted(self._to().create_schema(schema))

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> replies.CreateStreamReply:
        return await self._counted(self._to().create_stream(name, schema, replicas))

    async def create_query(self, query: str | dict[str, Any]) -> replies.CreateQueryReply:
        return await self._counted(self._to().create_query(query))

    async def set_query_status(self, name: str, status: str) -> replies.SetQueryStatusReply:
        return await self._counted(self._to().set_query_status(name, status))

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> replies.PushReply:
        started = self.clock()
        reply = await self._counted(self._to().push(stream, payload, producer, seq))
        if self.observer is not None:
            self.observer.pushed(stream, reply.count, self.clock() - started)
        return reply

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        return AnnouncedBatches(self._to().subscribe(stream, start))

    async def lookup(self, name: str) -> replies.LookupReply:
        return await self._counted(self._to().lookup(name))

    async def status(self) -> replies.StatusReply:
        return await self._to().status()


class BrainPort:
    """What the brain uses of the peer (peer.brain.BrainHost)."""

    def __init__(self, peer: Peer, fed: Federation) -> None:
        self._peer = peer
        self._fed = fed

    @property
    def node_id(self) -> bytes:
        return self._fed.node_id

    @property
    def data_dir(self) -> Path:
        return self._peer.data_dir

    def live_members(self) -> Sequence[MemberInfo]:
        return self._fed.overlay.live_members()

    async def send_offer(self, node_id: bytes, frame: dict[str, object]) -> object:
        observer = self._peer.observer
        try:
            reply = await self._fed.router.call(node_id, Raw("offer", dict(frame)))
        except FedstreamError:
            if observer is not None:
                observer.offered("sent", "failed")
            raise
        if observer is not None:
            observer.offered("sent", "accepted" if reply.get("accepted") else "refused")
        return reply

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        return [] if self._peer.mover is None else self._peer.mover.movable()

    async def engine_busy_seconds(self) -> Mapping[str, float]:
        return await self._fed.site.engine_busy_seconds()

    def input_backlog(self) -> int:
        return self._fed.site.input_backlog()

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]:
        return await self._peer.move_fragment(
            name, target, contract=contract, load=load, price=price
        )


async def _no_offers(_message: Raw, _sender: str) -> dict[str, Any]:
    return {"accepted": [], "reason": "this peer holds no contracts"}


class _Stop(Exception):
    pass
