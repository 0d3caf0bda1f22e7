"""One peer, wired together: configuration in, objects built, one TaskGroup running them.

The composition root and nothing else. The rooms it wires, each using only the ones below
it (docs/architecture.md): :class:`peer.site.LocalSite` (streams, queries and the Spark
engine of this peer); :class:`peer.federation.Federation` (with an overlay: where things
live in the federation, and how requests get there), given the replication room that
:mod:`peer.node.replication` builds; :class:`peer.move.Mover` and
:class:`peer.brain.Brain` (with contracts: moving fragments to partners under the
bounded-price mechanism); the client API server (:mod:`peer.server`), serving the site or
the federation; with ``http``, the observer and its HTTP server (:mod:`peer.observe`), made
first and given to the parts that feed it (client service, brain port, engine seams, DHT
lookups). Each object gets its collaborators when it is made (tests/unit/test_wiring.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from overlay.stream import decode_pool
from overlay.wire import DecodeBudget
from peer.engine.seams import EngineSeams
from peer.errors import Conflict
from peer.federation import Federation
from peer.federation.service import StatusPart
from peer.fetch.server import FetchServer, advertised_host, remote_input
from peer.node.client_service import ClientService
from peer.node.config import PeerConfig
from peer.node.ports import BrainPort, ElasticPort, FederationDoor
from peer.node.replication import PlaneRoom, RoleDoor, build_room
from peer.protocol import replies
from peer.protocol.link import Raw
from peer.replication.appenders import Appenders
from peer.replication.plane import ReplicationSettings
from peer.server import ApiServer, api_server_tls, is_loopback
from peer.site import LocalSite, SiteConfig, SiteStore, always_reachable
from peer.storage.spool import SpoolSet
from peer.timing import MONOTONIC, Clock, every

if TYPE_CHECKING:
    from contracts.book import ContractBook
    from overlay.identity import NodeIdentity, TrustStore
    from overlay.node import Overlay
    from peer.brain import Brain
    from peer.elastic.drain import Drainer
    from peer.elastic.leader import BurstLeader
    from peer.engine.forks import Availability
    from peer.engine.runner import Engine
    from peer.move import Mover
    from peer.observe import HttpServer, Observer

log = logging.getLogger(__name__)


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
        self.room: PlaneRoom | None = None  # the replication room (the control plane's peer)
        self.mover: Mover | None = None
        self.brain: Brain | None = None
        self.leader: BurstLeader | None = None  # an elastic participant's (--elastic)
        self.drainer: Drainer | None = None  # a launched peer's (--launched-as)
        self._figures: dict[str, float] = {}  # what this peer gossiped last
        self.http: HttpServer | None = None
        self.fetch: FetchServer | None = None
        # with ``http``, the observer is made first: the parts that feed it get it when made
        self.observer: Observer | None = self._make_observer() if config.http else None
        self._service = ClientService(clock, self.observer)
        # made here, before what they join: the site and the replication room share the
        # registry of replicated streams; the engine and the parts taking its results share
        # its seams (each bound once, as those parts are made)
        self._logs = Appenders()
        self._seams = EngineSeams()
        self._status_parts: dict[str, StatusPart] = {}  # more of `peer status` (the brain's)
        if self.observer is not None:
            self._seams.report_results_to(self.observer.result)
        self._stopping = asyncio.Event()
        self._cpu_mark = (clock(), time.process_time())
        # (when, the engine's rows read, its busy seconds then): gossip's tps and busy
        self._work_mark = (clock(), 0, 0.0)

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
        store = SiteStore.open(config.data_dir)
        engine: Engine | None = None
        availability: Availability | None = None
        if config.engine:
            engine = await self._start_engine(store.spools, spark)
            from peer.engine.forks import Availability  # pyspark: peers with an engine

            availability = Availability(engine, store.spools)
            self._seams.fork_with(availability)
        site = self.site = LocalSite(
            SiteConfig(
                data_dir=config.data_dir,
                max_backlog_batches=config.max_backlog_batches,
                backlog_wait_s=config.backlog_wait_s,
                retention_s=config.retention_s,
                limits=config.limits,
            ),
            engine,
            store=store,
            availability=availability,
            logs=self._logs,
            address=self._api_address,
            clock=self.clock,
        )
        self._service.serve(site)
        if config.engine:
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
            limits=config.limits,  # create_sql scripts are held to the peer's own budgets
            **tls,
        )
        await self.api.start()
        if config.overlay:
            await self._start_federation(site)
        if config.http is not None:
            await self._start_http(*config.http)
        log.info("peer listening on %s:%d (data %s)", config.host, self.api.port, self.data_dir)

    def _api_address(self) -> str:
        """HOST:PORT of the client API (the site's answer to where it is), once it listens."""
        return "" if self.api is None else f"{self.config.host}:{self.api.port}"

    async def _start_engine(self, spools: SpoolSet, spark: Any) -> Engine:
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
            spools,
            checkpoints,
            master=config.spark_master,
            conf=config.spark_conf,
            trigger_s=config.trigger_s,
            max_rows_per_batch=config.max_rows_per_batch,
            fuse_stateless=config.fuse_stateless,
            lane_after=config.lane_after,
            max_backlog=config.max_backlog_batches,
            fetch=None if self.fetch is None else self.fetch.endpoint,
            seams=self._seams,
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
        from contracts.book import ContractBook
        from overlay.link import LinkSettings
        from overlay.node import Overlay, OverlayConfig
        from peer.federation.quota import RelayQuota
        from peer.federation.records import CatalogRecords
        from peer.federation.router import Router
        from peer.move import Mover

        config = self.config
        identity, trust = self.identity, self.trust
        assert identity is not None and trust is not None
        port = config.overlay_port
        if port is None:
            port = config.port + 1 if config.port else 0
        door = FederationDoor()
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
            handler=door,
            on_member=door.on_member,
            on_lookup=None if self.observer is None else self.observer.dht_lookup,
        )
        replication = ReplicationSettings(
            voter=config.voter,
            volunteer=config.volunteer,
            founder=not config.bootstrap,
            replicas=config.replicas,
            min_insync=config.min_insync,
            failover_after_s=config.failover_after_s,
            repair_after_s=config.repair_after_s,
            voter_grace_s=config.voter_grace_s,
        )
        router = Router(overlay, overlay.identity.participant)
        records = CatalogRecords(overlay)
        roles = RoleDoor()
        room = self.room = build_room(
            site,
            overlay,
            router,
            records,
            replication,
            roles,
            logs=self._logs,
            seams=None if site.engine is None else self._seams,
            clock=self.clock,
        )
        fed = self.fed = Federation(
            site,
            overlay,
            self.api_addr,
            router=router,
            records=records,
            room=room,
            quota=RelayQuota(config.relay_streams_per_connection, config.relay_streams_per_address),
            status_parts=self._status_parts,
            lease_s=config.lease_s,
            standby=config.standby,
        )
        roles.open(fed.on_role)
        door.open(fed)
        mover = self.mover = Mover(site, fed, self.book, self._arrived)
        mover.register()
        if config.brain and (self.book is not None or (config.balance and site.engine)):
            # without contracts, the brain still balances load among this participant's peers
            book = self.book or ContractBook(identity.participant, [], [])
            self.brain = self._make_brain(fed, mover, book)
        if self.brain is not None:
            fed.router.register("offer", self._on_offer)
            brain = self.brain
            self._status_parts["brain"] = lambda: dict(brain.status())
        else:
            fed.router.register("offer", _no_offers)
        await overlay.start()
        if (config.elastic or config.launched_as) and site.engine is not None:
            self._make_elastic(fed, mover)  # after the overlay starts: its port is known
            self._status_parts["elastic"] = self._elastic_status
        await fed.start()
        self._service.serve(fed)
        await self.mover.recover()

    def _make_observer(self) -> Observer:
        from peer.observe import Observer, PeerPort  # aiohttp: imported only with ``http``

        port = PeerPort(self._client_status, lambda: self.site, lambda: self.fed)
        return Observer(port, dashboard=self._dashboard_url)

    async def _client_status(self) -> replies.StatusReply:
        return await self._service.status()

    def _dashboard_url(self) -> str | None:
        return None if self.http is None else self.http.url

    async def _start_http(self, host: str, port: int) -> None:
        from peer.observe import HttpServer, current_context
        from peer.protocol.link import ObservePeer

        ssl_context = None
        if not is_loopback(host):  # like the client API: TLS with participant certificates
            assert self.identity is not None and self.trust is not None
            ssl_context = current_context(api_server_tls(self.identity, self.trust))
        observer = self.observer
        assert observer is not None
        if self.fed is not None:
            self.fed.router.register(ObservePeer.OP, observer.handle_observe)
        self.http = HttpServer(observer, self._service.status, host, port, ssl_context=ssl_context)
        await self.http.start()

    def _make_brain(self, fed: Federation, mover: Mover, book: ContractBook) -> Brain:
        from contracts.bpm import BpmConfig
        from peer.brain import Brain
        from peer.elastic.siblings import SiblingBalancer

        config = self.config
        bpm = BpmConfig(
            period_s=config.bpm_period_s,
            offer_timeout_s=config.offer_timeout_s,
            offer_margin=config.offer_margin,
            accept_margin=config.accept_margin,
        )
        capacity = config.capacity or float(os.cpu_count() or 1)
        port = self._brain_port(fed, mover)
        siblings = None
        if config.balance:
            siblings = SiblingBalancer(fed.node_id, book.me, margin=config.balance_margin)
        return Brain(port, book, bpm, capacity, siblings=siblings)

    def _brain_port(self, fed: Federation, mover: Mover) -> BrainPort:
        return BrainPort(
            fed,
            data_dir=self.data_dir,
            mover=mover,
            observer=self.observer,
            move=self.move_fragment,
            replicated=self.room.fragments if self.room is not None else None,
        )

    def _make_elastic(self, fed: Federation, mover: Mover) -> None:
        """The burst leader (--elastic) and, on a launched peer, its drain (peer.elastic)."""
        from peer.elastic.drain import Drainer
        from peer.elastic.leader import BurstLeader
        from peer.elastic.provision import LaunchSpec, make_provisioner
        from peer.elastic.sizing import SizingPolicy

        config, room = self.config, self.room
        assert room is not None and fed.overlay is not None
        port = ElasticPort(fed, self._brain_port(fed, mover), room)
        participant = fed.overlay.identity.participant
        if config.launched_as is not None:
            self.drainer = Drainer(port, participant, config.launched_as, self.stop)
        if config.elastic is None:
            return
        minimum, maximum = config.elastic
        overlay_host = config.overlay_host or config.host
        spec = LaunchSpec(
            participant,
            bootstrap=f"{overlay_host}:{fed.overlay.port}",
            elastic=f"{minimum}:{maximum}",
            key=None if config.key_path is None else config.key_path.resolve(),
            trust=None if config.trust_dir is None else config.trust_dir.resolve(),
            extra=config.launch_args,
        )
        base = self.data_dir.resolve().parent
        self.leader = BurstLeader(
            node=fed.node_id.hex(),
            participant=participant,
            policy=SizingPolicy(minimum, maximum),
            control=port,
            figures=lambda: port.participant_figures(self._figures),
            is_live=port.is_live,
            provisioner=make_provisioner(config.provisioner, base, spec),
            record=self.data_dir / "elastic.jsonl",
            clock=self.clock,
            decide_s=config.elastic_interval_s,
            cooldown_s=3 * config.elastic_interval_s,
            warmup_s=3 * config.elastic_interval_s,
        )

    def _elastic_status(self) -> dict[str, Any]:
        """The leader's and, on a launched peer, the drain's status, side by side."""
        part: dict[str, Any] = {}
        if self.leader is not None:
            part.update(self.leader.status())
        if self.drainer is not None:
            part.update(self.drainer.status())
        return part

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
                            self._check_availability,
                            clock=self.clock,
                        )
                    )
                if self.overlay is not None and self.fed is not None:
                    tg.create_task(self.overlay.run())
                    tg.create_task(self.fed.run())
                    if self.brain is not None:
                        tg.create_task(self.brain.run())
                    if self.leader is not None:
                        tg.create_task(self.leader.run())
                    if self.drainer is not None:
                        tg.create_task(self.drainer.run())
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

    async def _check_availability(self) -> None:
        """Fork or correct the site's queries with a bound; the federation, if any, says
        whose upstream is out of reach."""
        if self.site is not None:
            fed = self.fed
            await self.site.check_availability(
                always_reachable if fed is None else fed.upstream_reachable
            )

    async def _maintenance(self) -> None:
        if self.overlay is not None:
            site = self.site
            lag = 0 if site is None else await asyncio.to_thread(site.input_backlog_rows)
            self._figures = self._load_figures(lag)
            self.overlay.set_load(self._figures)
        if self.site is not None:
            await self.site.maintain()

    def _load_figures(self, lag: int = 0) -> dict[str, float]:
        """What this peer gossips about its load: the share of one core its process used
        since the last round, how many streams and queries it holds, and for an elastic
        participant's sizing (peer.elastic.figures) the rows/s its engine read since the last
        round (``tps``), the share of that time its micro-batches ran (``busy``, at most 1)
        and the rows waiting in its queries' inputs (``lag``)."""
        now, cpu = self.clock(), time.process_time()
        last = self._cpu_mark
        self._cpu_mark = (now, cpu)
        share = (cpu - last[1]) / (now - last[0]) if now > last[0] else 0.0
        assert self.site is not None
        brain = {} if self.brain is None else self.brain.load_figures()
        engine = self.site.engine
        rows = 0 if engine is None else engine.rows_read()
        spent = 0.0 if engine is None else engine.busy_total()
        then, rows_before, spent_before = self._work_mark
        self._work_mark = (now, rows, spent)
        dt = now - then
        tps = max(0, rows - rows_before) / dt if dt > 0 else 0.0
        busy = min(1.0, max(0.0, spent - spent_before) / dt) if dt > 0 else 0.0
        draining = {} if self.drainer is None else self.drainer.figures()
        return {
            **brain,
            **draining,
            "tps": round(tps, 1),
            "busy": round(busy, 4),
            "lag": float(lag),
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


async def _no_offers(_message: Raw, _sender: str) -> dict[str, Any]:
    return {"accepted": [], "reason": "this peer holds no contracts"}


class _Stop(Exception):
    pass
