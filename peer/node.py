"""One peer: catalog, spools, Spark engine and the client API server, under one TaskGroup.

The walk of a tuple through a single peer (DESIGN.md section 3): ``push`` validates the batch
against the stream's schema (a bad tuple refuses the whole batch), appends it to the stream's
spool with an fsync, and only then acknowledges. The Spark engine reads the spool through the
``fedspool`` source and appends each result micro-batch to the result stream's spool, whose
listeners wake the subscribers. Nothing blocking runs on the event loop: validation and spool
I/O go to worker threads, py4j calls to the engine's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.api import READY, AnnouncedBatches, ApiServer, api_server_tls, is_loopback

if TYPE_CHECKING:
    from contracts.book import ContractBook
    from overlay.identity import NodeIdentity, TrustStore
    from overlay.node import Overlay
    from peer.federation import Federation
    from peer.move import Mover
from peer.storage.catalog import QUERY_STATUSES, LocalCatalog, QueryEntry
from peer.errors import (
    AlreadyExists,
    Conflict,
    EngineError,
    FedstreamError,
    InvalidInput,
    NotFound,
    Unavailable,
)
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.schema import Schema, check_name, parse_schema, to_arrow_schema
from peer.model.tuples import batch_from_wire, batch_to_wire
from peer.storage.spool import SpoolSet

log = logging.getLogger(__name__)

SUBSCRIBE_CHUNK = 64  # spool files read per wake-up of a subscriber


@dataclass
class PeerConfig:
    data_dir: Path = field(default_factory=lambda: Path("peer-data"))
    host: str = "127.0.0.1"
    port: int = 7700
    engine: bool = True
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    trigger_s: float = 0.0
    max_rows_per_batch: int = 200_000
    # Run filter/map/union-only queries together in one streaming query (peer.engine.lane).
    fuse_stateless: bool = True
    # How many per-tuple queries run on their own before the next ones share the lane.
    lane_after: int = 1
    max_frame_bytes: int = 64 * 1024 * 1024
    maintenance_interval_s: float = 2.0
    # How long a stream no query reads (a result stream) keeps its tuples for late subscribers.
    retention_s: float = 600.0
    fsync: bool = True
    # the overlay (DHT catalog, peer links, gossip); off: a lone peer as in issue 2
    overlay: bool = True
    overlay_host: str | None = None  # default: the API host
    overlay_port: int | None = None  # default: API port + 1 (0 when the API port is 0)
    bootstrap: list[tuple[str, int]] = field(default_factory=list)
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


class Peer:
    """Implements peer.api.PeerService for the client API server."""

    def __init__(self, config: PeerConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.catalog: LocalCatalog | None = None
        self.spools: SpoolSet | None = None
        self.engine: Any = None  # peer.engine.runner.Engine, imported lazily (pyspark)
        self.api: ApiServer | None = None
        self.started_at = time.time()
        self.query_errors: dict[str, str] = {}
        self.overlay: Overlay | None = None
        self.fed: Federation | None = None
        self.identity: NodeIdentity | None = None
        self.trust: TrustStore | None = None
        self.book: ContractBook | None = None
        self.mover: Mover | None = None
        self.brain: Any = None  # peer.brain.Brain when there are contracts
        self._frozen: set[str] = set()  # replica streams being moved away: no appends
        self._landing: dict[str, int] = {}  # mirrored appends under way, per stream
        self._stopping = asyncio.Event()
        self._cpu_mark = (time.monotonic(), time.process_time())

    # lifecycle
    async def start(self, spark: Any = None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.catalog = LocalCatalog(self.data_dir / "catalog.sqlite")
        self.spools = SpoolSet(self.data_dir / "spool")
        for name in self.catalog.stream_names():
            if name not in self.spools.streams():
                entry = self.catalog.stream(name)
                self.spools.create(name, to_arrow_schema(entry.schema))
        if self.config.engine:
            from peer.engine.runner import Engine

            self.engine = Engine(
                self.spools,
                self.data_dir / "checkpoints",
                master=self.config.spark_master,
                conf=self.config.spark_conf,
                trigger_s=self.config.trigger_s,
                max_rows_per_batch=self.config.max_rows_per_batch,
                fuse_stateless=self.config.fuse_stateless,
                lane_after=self.config.lane_after,
                max_backlog=self.config.max_backlog_batches,
            )
            await self.engine.start(spark)
            await self._resume_queries()
        tls: dict[str, Any] = {}
        if self.config.overlay or not is_loopback(self.config.host):
            await self._load_identity()
        if not is_loopback(self.config.host):
            # a client port off loopback takes TLS clients with a trusted participant's key
            assert self.identity is not None and self.trust is not None
            tls = {"ssl": api_server_tls(self.identity, self.trust), "trust": self.trust}
        self.api = ApiServer(
            self,
            host=self.config.host,
            port=self.config.port,
            max_frame_bytes=self.config.max_frame_bytes,
            **tls,
        )
        await self.api.start()
        if self.config.overlay:
            await self._start_overlay()
        log.info(
            "peer listening on %s:%d (data %s)", self.config.host, self.api.port, self.data_dir
        )

    async def _load_identity(self) -> None:
        from overlay.identity import NodeIdentity

        config = self.config
        self.identity = await asyncio.to_thread(
            NodeIdentity.load_or_create, self.data_dir, config.participant, config.key_path
        )
        self.trust = self.identity.trust_store()
        if config.trust_dir is not None:
            self.trust.load_dir(config.trust_dir)
        if config.contracts_dir is not None:
            self._load_contracts(config.contracts_dir)

    def _load_contracts(self, directory: Path) -> None:
        """The valid contracts of ``directory`` that involve our participant; each partner's
        key becomes trusted (its peers may link to us). A refused file is logged with its
        reason and never used."""
        from datetime import UTC, datetime

        from contracts.book import ContractBook
        from overlay.identity import IdentityError

        identity, trust = self.identity, self.trust
        assert identity is not None and trust is not None
        me = identity.participant
        book = ContractBook.load_dir(
            directory, me, datetime.now(UTC), known_keys={me: identity.participant_pub}
        )
        for refusal in book.refused:
            if refusal.reason == "not-a-party":  # another pair's contract: not ours to use
                log.debug("contract %s: %s", refusal.path.name, refusal.error)
            else:
                log.warning("contract %s refused: %s", refusal.path.name, refusal.error)
        for name, key in book.public_keys().items():
            try:
                trust.add(name, key)
            except IdentityError as exc:
                log.warning("contract partner %s not trusted: %s", name, exc)
        log.info("%d contract(s) with %s", len(book.contracts), ", ".join(book.partners()))
        self.book = book

    async def _start_overlay(self) -> None:
        from overlay.node import Overlay, OverlayConfig
        from peer.federation import Federation

        config = self.config
        identity, trust = self.identity, self.trust
        assert identity is not None and trust is not None
        host = config.overlay_host or config.host
        port = config.overlay_port
        if port is None:
            port = config.port + 1 if config.port else 0
        self.overlay = Overlay(
            identity,
            trust,
            OverlayConfig(
                host=host,
                port=port,
                bootstrap=list(config.bootstrap),
                gossip_interval_s=config.gossip_interval_s,
                suspect_after_s=config.suspect_after_s,
                dead_after_s=config.dead_after_s,
            ),
            self.data_dir,
            api=self.api_addr,
            engine=self.engine is not None,
            handler=self,
        )
        self.fed = Federation(self, self.overlay, lease_s=config.lease_s)
        self.overlay.on_member = self.fed.on_member
        from peer.move import Mover

        self.mover = Mover(self)
        if self.book is not None and config.brain:
            self.brain = self._make_brain()
        await self.overlay.start()
        await self.fed.resume()

    def _make_brain(self) -> Any:
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
        assert self.book is not None
        return Brain(self, self.book, bpm, capacity)

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
                tg.create_task(self._maintenance())
                if self.fed is not None:
                    tg.create_task(self.fed.overlay.run())
                    tg.create_task(self.fed.renew_loop())
                    tg.create_task(self.fed.mirrors.run())
                    if self.brain is not None:
                        tg.create_task(self.brain.run())
                await self._stopping.wait()
                raise _Stop
        except* _Stop:
            pass
        finally:
            await self.close()

    def stop(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        if self.overlay is not None:
            await self.overlay.close()
            self.overlay = None
        if self.api is not None:
            await self.api.close()
            self.api = None
        if self.engine is not None:
            await self.engine.close()
            self.engine = None
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None

    async def _maintenance(self) -> None:
        while True:
            await asyncio.sleep(self.config.maintenance_interval_s)
            try:
                await self._maintain()
            except Exception:  # housekeeping must never take the peer down
                log.exception("peer maintenance failed; retrying next round")

    async def _maintain(self) -> None:
        if self.fed is not None:
            self.fed.overlay.set_load(self._load_figures())
        spools = self._spools()
        for name in spools.streams():
            with contextlib.suppress(KeyError, OSError):
                spool = spools.get(name)
                await asyncio.to_thread(spool.trim, max_age_s=self.config.retention_s)
        if self.engine is not None:
            for name, reason in (await self.engine.failed()).items():
                if self.query_errors.get(name) != reason:
                    log.error("query %s failed: %s", name, reason)
                    self.query_errors[name] = reason

    def _load_figures(self) -> dict[str, float]:
        """What this peer gossips about its load: the share of one core its process used
        since the last round, and how many streams and queries it holds."""
        now, cpu = time.monotonic(), time.process_time()
        last = self._cpu_mark
        self._cpu_mark = (now, cpu)
        share = (cpu - last[1]) / (now - last[0]) if now > last[0] else 0.0
        catalog = self._catalog()
        brain = {} if self.brain is None else self.brain.load_figures()
        return {
            **brain,
            "cpu": round(share, 3),
            "streams": float(len(self.fed.hosted) if self.fed is not None else 0),
            "queries": float(len(catalog.query_names())),
        }

    async def _resume_queries(self) -> None:
        catalog = self._catalog()
        for name in catalog.query_names():
            entry = catalog.query(name)
            if entry.status == "RUNNING":
                try:
                    await self._run(entry, resume=True)
                except EngineError as exc:
                    self.query_errors[name] = exc.message
                    log.error("query %s could not resume: %s", name, exc.message)

    async def _run(self, entry: QueryEntry, *, resume: bool = False) -> None:
        """Start a query where it ran before (its checkpoint is there), or where the engine
        places it on its first start, and remember that place."""
        placement = await self.engine.run_query(
            self._check(entry.query),
            entry.incarnation,
            resume=resume,
            placement=entry.placement,
        )
        if placement != entry.placement:
            await asyncio.to_thread(self._catalog().set_placement, entry.query.name, placement)

    def _catalog(self) -> LocalCatalog:
        if self.catalog is None:
            raise EngineError("peer is not started")
        return self.catalog

    def _spools(self) -> SpoolSet:
        if self.spools is None:
            raise EngineError("peer is not started")
        return self.spools

    def _check(self, query: Any) -> CheckedQuery:
        return check_query(query, self._catalog().stream_schemas())

    # what peer.move and peer.brain use
    def local_catalog(self) -> LocalCatalog:
        return self._catalog()

    def checked(self, query: Any) -> CheckedQuery:
        return self._check(query)

    def freeze(self, stream: str) -> None:
        """Refuse mirrored appends to ``stream`` (a replica whose reader is moving away)."""
        self._frozen.add(stream)

    def thaw(self, stream: str) -> None:
        self._frozen.discard(stream)

    async def drained(self, stream: str, timeout_s: float = 30.0) -> None:
        """Wait until no mirrored append to ``stream`` is landing."""
        async with asyncio.timeout(timeout_s):
            while self._landing.get(stream):
                await asyncio.sleep(0.01)

    def movable_fragments(self) -> list[tuple[str, tuple[str, ...]]]:
        return [] if self.mover is None else self.mover.movable()

    async def engine_busy_seconds(self) -> dict[str, float]:
        if self.engine is None:
            return {}
        result: dict[str, float] = await self.engine.busy_seconds()
        return result

    def input_backlog(self) -> int:
        """Batches waiting in the inputs of this peer's own streaming queries."""
        if self.engine is None:
            return 0
        spools, total = self._spools(), 0
        for running in list(self.engine.running.values()):
            for stream, reader in running.readers:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    spool = spools.get(stream)
                    total += max(0, spool.latest - spool.committed(reader))
        return total

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float = 0.0, price: float = 0.0
    ) -> dict[str, Any]:
        """Move fragment ``name``, with its state, to peer ``target`` (peer.move)."""
        if self.mover is None:
            raise Conflict("this peer is not in an overlay: fragments cannot move")
        return await self.mover.move_out(name, target, contract=contract, load=load, price=price)

    # the client API (peer.api.PeerService)
    async def create_schema(self, schema: str | dict[str, Any]) -> dict[str, Any]:
        parsed = parse_schema(schema)
        existing = None
        if self.fed is not None:
            existing = await self.fed.schema_record(parsed.name)
            if existing is not None and existing.fields != parsed.fields:
                raise AlreadyExists(
                    f"schema {parsed.name} already exists in the federation with other fields",
                    schema=parsed.name,
                )
        await asyncio.to_thread(self._catalog().add_schema, parsed)
        if self.fed is not None and existing is None:
            await self.fed.publish(f"schema:{parsed.name}", {"schema": parsed.to_dict()})
        return {"schema": parsed.name, "fields": [f.name for f in parsed.fields]}

    async def _find_schema(self, name: str) -> Schema:
        found = self._catalog().find_schema(name)
        if found is None and self.fed is not None:
            found = await self.fed.schema_record(name)
        if found is None:
            known = ", ".join(self._catalog().schema_names()) or "none"
            raise NotFound(f"unknown schema {name} (known here: {known})", schema=name)
        return found

    async def create_stream(self, name: str, schema: str) -> dict[str, Any]:
        found = await self._find_schema(schema)
        check_name(name, "stream", InvalidInput)
        if self.fed is None:
            await self.host_locally(name, found, None)
            return {"stream": name, "schema": found.name}
        existing = await self.fed.stream_record_or_none(name)
        if existing is not None:
            if parse_schema(existing["schema"]).fields != found.fields:
                raise AlreadyExists(
                    f"stream {name} already exists with schema {existing['schema']['name']}",
                    stream=name,
                )
            host = await self.fed.host_of(name)
            return {"stream": name, "schema": found.name, "host": host.hex()}
        self._catalog().check_stream(name, found)
        responsible = self.fed.overlay.responsible(name)
        host = responsible[0].node_id
        await self.fed.publish(f"stream:{name}", {"schema": found.to_dict(), "derived_from": None})
        if host == self.fed.node_id:
            await self.fed.host(name, found, None)
        else:
            await self.fed.call(
                host, {"op": "host_stream", "stream": name, "schema": found.to_dict()}
            )
        return {"stream": name, "schema": found.name, "host": host.hex()}

    async def host_locally(self, name: str, schema: Schema, derived_from: str | None) -> None:
        """The local part of hosting a stream: catalog entry and spool."""
        catalog = self._catalog()
        await asyncio.to_thread(catalog.add_stream, name, schema, derived_from)
        if name not in self._spools().streams():
            await asyncio.to_thread(self._spools().create, name, to_arrow_schema(schema))

    def local_streams(self) -> list[str]:
        return self._catalog().stream_names()

    async def create_query_local(self, query: Any) -> dict[str, Any]:
        """Create a query (a whole one on a lone peer, or one fragment) that runs here, on
        streams this peer holds: hosted here, or replicas of streams hosted elsewhere."""
        parsed = parse_query(query)
        catalog = self._catalog()
        if catalog.find_query(parsed.name) is not None:
            raise Conflict(
                f"query {parsed.name} already exists; delete it first", query=parsed.name
            )
        checked = self._check(parsed)
        for stream in checked.outputs:  # refuse before anything is written
            catalog.check_stream(stream, checked.stream_schemas[stream])
        for stream in checked.outputs:
            schema = checked.stream_schemas[stream]
            if self.fed is not None:
                await self.fed.publish(
                    f"stream:{stream}", {"schema": schema.to_dict(), "derived_from": parsed.name}
                )
                await self.fed.host(stream, schema, parsed.name)
            else:
                await self.host_locally(stream, schema, parsed.name)
        await asyncio.to_thread(catalog.add_query, parsed, uuid.uuid4().hex[:8])
        return {
            "query": parsed.name,
            "status": "SETUP",
            "inputs": list(checked.inputs),
            "outputs": list(checked.outputs),
        }

    async def install_fragment(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Phase 1 of a distributed query, on the fragment's site: replica spools for the
        inputs hosted elsewhere, then the fragment as a local query."""
        assert self.fed is not None
        inputs = frame.get("inputs")
        if not isinstance(inputs, dict):
            raise InvalidInput("install_fragment: inputs must be a map")
        catalog = self._catalog()
        for stream, info in inputs.items():
            if stream in self.fed.hosted or not isinstance(info, dict):
                continue
            schema = parse_schema(info.get("schema") or {})
            source = str(info.get("host", ""))
            if source == self.fed.node_id.hex():
                continue  # made by another fragment here
            await self.host_locally(stream, schema, None)
            await asyncio.to_thread(catalog.add_replica, stream, source)
        return await self.create_query_local(frame.get("definition"))

    async def append_mirrored(
        self, stream: str, origin: str, batches: list[tuple[int, bytes]]
    ) -> dict[str, Any]:
        """Append mirrored batches of a replica (each fsynced; replays dropped by seq)."""
        entry = self._catalog().stream(stream)
        if stream not in self._catalog().replicas():
            raise Conflict(f"stream {stream} is not mirrored to this peer", stream=stream)
        spool = self._spools().get(stream)

        def land() -> int:
            kept = 0
            for seq, body in batches:
                table = batch_from_wire(entry.schema, {"arrow": body}, stream=stream)
                if spool.append(table, origin=origin, seq=seq) is not None:
                    kept += 1
            return kept

        if stream in self._frozen:
            raise Unavailable(f"stream {stream} is moving to another peer", stream=stream)
        await self._room(stream, spool)
        self._landing[stream] = self._landing.get(stream, 0) + 1
        try:
            kept = await asyncio.to_thread(land)
        finally:
            self._landing[stream] -= 1
        return {"stream": stream, "last": batches[-1][0], "kept": kept}

    async def _room(self, stream: str, spool: Any) -> None:
        """Wait while the stream's slowest reader is too far behind (backpressure): the
        writer (a client, or the peer mirroring to us) slows down instead of our disk and
        memory filling up; after backlog_wait_s it gets a retriable error."""
        limit = self.config.max_backlog_batches
        if limit <= 0 or spool.backlog() <= limit:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.backlog_wait_s
        while spool.backlog() > limit:
            if loop.time() >= deadline:
                raise Unavailable(
                    f"stream {stream} is backlogged: its slowest reader is more than {limit} "
                    "batches behind; retry later",
                    stream=stream,
                )
            await asyncio.sleep(0.05)

    async def fragment_status(self, fragment: str, status: str) -> dict[str, Any]:
        """A distributed query's status change, for one fragment here; DELETED also drops
        its result streams and the replicas no other local query reads."""
        status = status.upper()
        catalog = self._catalog()
        if catalog.find_query(fragment) is None:
            site = catalog.moved().get(fragment)
            if site is not None and self.fed is not None:  # it moved on: tell it there
                reply = await self.fed.call(
                    bytes.fromhex(site),
                    {"op": "fragment_status", "fragment": fragment, "status": status},
                )
                if status == "DELETED":
                    await asyncio.to_thread(catalog.forget_moved, fragment)
                return reply
            if status == "DELETED":
                return {"query": fragment, "status": status}  # gone already
            raise NotFound(f"no fragment {fragment} on this peer", query=fragment)
        outputs = [s for box in catalog.query(fragment).query.boxes for s in box.outputs]
        reply = await self.set_query_status_local(fragment, status)
        if status == "DELETED":
            still_read = {
                s
                for name in catalog.query_names()
                for box in catalog.query(name).query.boxes
                for s in box.inputs
            }
            await self._drop_streams(
                [s for s in outputs if s not in still_read and s in catalog.stream_names()],
                tombstone=True,
            )
            unused = {s: host for s, host in catalog.replicas().items() if s not in still_read}
            if self.fed is not None:
                for stream, host in unused.items():
                    await self.fed.stop_mirror_here(stream, bytes.fromhex(host))
            await self._drop_streams(list(unused), tombstone=False)
        return reply

    async def _drop_streams(self, streams: list[str], *, tombstone: bool) -> None:
        catalog, spools = self._catalog(), self._spools()
        for stream in streams:
            if self.fed is not None:
                self.fed.mirrors.stop_stream(stream)
                self.fed.hosted.discard(stream)
                if tombstone:
                    with contextlib.suppress(FedstreamError):
                        await self.fed.publish(f"stream:{stream}", {"deleted": True})
            await asyncio.to_thread(catalog.remove_stream, stream)
            if stream in spools.streams():
                await asyncio.to_thread(spools.drop, stream)

    def replica_streams(self) -> dict[str, str]:
        return self._catalog().replicas()

    def spool_set(self) -> SpoolSet:
        return self._spools()

    async def set_query_status_local(self, name: str, status: str) -> dict[str, Any]:
        status = _checked_status(status)
        catalog = self._catalog()
        entry = catalog.query(name)
        if status == "RUNNING" and entry.status != "RUNNING":
            if self.engine is None:
                raise Conflict(
                    f"query {name}: this peer runs without an engine (--no-engine)", query=name
                )
            self.query_errors.pop(name, None)
            await self._run(entry)
        elif status in ("STOPPED", "SETUP") and entry.status == "RUNNING":
            await self.engine.stop_query(name)
        elif status == "DELETED":
            if self.engine is not None:
                await self.engine.drop_query(name, entry.incarnation)
            await asyncio.to_thread(catalog.remove_query, name)
            return {"query": name, "status": "DELETED"}
        await asyncio.to_thread(catalog.set_status, name, status)
        return {"query": name, "status": status}

    async def push_local(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        """Append a batch to a stream hosted here (fsync before the reply)."""
        entry = self._catalog().stream(stream)
        spool = self._spools().get(stream)
        if (producer is None) != (seq is None):
            raise InvalidInput("push: give both producer and seq, or neither", stream=stream)

        def land() -> tuple[int, int | None]:
            table = batch_from_wire(entry.schema, payload)
            return table.num_rows, spool.append(table, origin=producer, seq=seq)

        await self._room(stream, spool)

        count, offset = await asyncio.to_thread(land)
        return {
            "stream": stream,
            "count": count,
            "offset": offset,
            "duplicate": offset is None and count > 0,
        }

    async def subscribe_local(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        self._catalog().stream(stream)
        after = _after_offset(start)  # "after:N": a relay resuming where it was (moves)
        if start not in ("latest", "earliest") and after is None:
            raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
        spool = self._spools().get(stream)
        spools = self._spools()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_append(_offset: int) -> None:
            loop.call_soon_threadsafe(wake.set)

        spool.add_listener(on_append)
        try:
            if after is not None:
                position = after
            else:
                position = spool.latest if start == "latest" else spool.earliest - 1
            # the start position is fixed: the subscribe reply may go out
            yield {**READY, "after": position}
            while True:
                wake.clear()
                latest = spool.latest
                if latest <= position:
                    if stream not in spools:  # moved away (peer.move) or dropped
                        raise Unavailable(
                            f"stream {stream} is no longer here; subscribe again",
                            stream=stream,
                            moved=True,
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), 1.0)
                    continue
                end = min(latest, position + SUBSCRIBE_CHUNK)
                position = max(position, spool.earliest - 1)  # skip what was trimmed meanwhile
                batches = await asyncio.to_thread(_read_range, spool, position, end)
                for offset, table in batches:
                    yield {"offset": offset, **batch_to_wire(table)}
                position = end
        finally:
            spool.remove_listener(on_append)

    async def lookup_local(self, name: str) -> dict[str, Any]:
        catalog = self._catalog()
        me = f"{self.config.host}:{self.port}"
        stream = catalog.find_stream(name)
        if stream is not None:
            spool = self._spools().get(name)
            return {
                "kind": "stream",
                "name": name,
                "schema": stream.schema.to_dict(),
                "derived_from": stream.derived_from,
                "responsible": me,
                "latest_offset": spool.latest,
            }
        query = catalog.find_query(name)
        if query is not None:
            return {
                "kind": "query",
                "name": name,
                "status": query.status,
                "definition": query_to_dict(query.query),
                "peer": me,
            }
        schema = catalog.find_schema(name)
        if schema is not None:
            return {"kind": "schema", "name": name, "schema": schema.to_dict()}
        raise NotFound(f"nothing named {name} in the catalog", name=name)

    async def status(self) -> dict[str, Any]:
        catalog = self._catalog()
        spools = self._spools()
        queries = []
        names = catalog.query_names()
        engine_info = await self.engine.describe(names) if self.engine is not None else {}
        for name in names:
            entry = catalog.query(name)
            info: dict[str, Any] = {"name": name, "status": entry.status}
            info.update(engine_info.get(name, {}))
            if name in self.query_errors:
                info["error"] = self.query_errors[name]
            queries.append(info)
        streams = [
            {"name": n, "latest_offset": spools.get(n).latest} for n in catalog.stream_names()
        ]
        return {
            "peer": f"{self.config.host}:{self.port}",
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "engine": "spark" if self.engine is not None else "none",
            "data_dir": str(self.data_dir),
            "streams": streams,
            "queries": queries,
            **(
                {
                    "overlay": self.fed.overlay.status(),
                    "hosted": sorted(self.fed.hosted),
                    "replicas": self._catalog().replicas(),
                    "mirrors": self.fed.mirrors.describe(),
                    "forwarded": self.fed.forwarded,
                    "moved": self._catalog().moved(),
                    **({"brain": self.brain.status()} if self.brain is not None else {}),
                }
                if self.fed is not None
                else {}
            ),
        }

    # the client API (peer.api.PeerService): any request, whichever peer serves it
    async def create_query(self, query: str | dict[str, Any]) -> dict[str, Any]:
        if self.fed is None:
            return await self.create_query_local(query)
        return await self.fed.coordinator.create(parse_query(query))

    async def set_query_status(self, name: str, status: str) -> dict[str, Any]:
        status = _checked_status(status)
        if self.fed is not None:
            pointer = await self.fed.query_pointer(name)
            if pointer is not None and not pointer.get("deleted"):
                return await self.fed.coordinator.set_status(name, status)
        return await self.set_query_status_local(name, status)

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        if self.fed is None or stream in self.fed.hosted:
            return await self.push_local(stream, payload, producer, seq)
        if (producer is None) != (seq is None):
            raise InvalidInput("push: give both producer and seq, or neither", stream=stream)
        record = await self.fed.stream_record(stream)
        schema = parse_schema(record["schema"])
        table = await asyncio.to_thread(batch_from_wire, schema, payload, stream=stream)
        reply = await self.fed.forward_push(stream, table, producer, seq)
        return {**reply, "forwarded": True}

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        if start not in ("latest", "earliest"):
            raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
        if self.fed is None:
            return AnnouncedBatches(self.subscribe_local(stream, start))
        return AnnouncedBatches(self.fed.relay(stream, start))

    async def lookup(self, name: str) -> dict[str, Any]:
        catalog = self._catalog()
        found_here = catalog.find_stream(name) is not None or catalog.find_query(name) is not None
        if self.fed is None or (
            found_here and (catalog.find_query(name) is not None or name in self.fed.hosted)
        ):
            info = await self.lookup_local(name)
            if self.fed is not None:
                info["host"] = self.fed.node_id.hex()
            return info
        return await self.fed.lookup(name)

    # requests from other peers (overlay.node.PeerHandler)
    async def handle_link(self, link: Any, frame: dict[str, Any]) -> dict[str, Any]:
        assert self.fed is not None
        op = frame.get("op")
        sender = str(link.remote_participant)
        if isinstance(op, str) and op.startswith("move_"):
            if self.mover is None:
                raise Conflict("this peer takes no fragments")
            return await self.mover.handle(frame, sender)
        if op == "offer":
            if self.brain is None:
                return {"accepted": [], "reason": "this peer holds no contracts"}
            reply: dict[str, Any] = await self.brain.handle_offer(frame, sender=sender)
            return reply
        if op == "lookup":
            name = frame.get("name")
            site = self._catalog().moved().get(name) if isinstance(name, str) else None
            if site is not None and self._catalog().find_query(str(name)) is None:
                return await self.fed.call(bytes.fromhex(site), frame)
        return await self.fed.handle_link(frame)

    def stream_link(self, link: Any, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        assert self.fed is not None
        return self.fed.stream_link(frame)


def _query_inputs(query: Query) -> list[str]:
    produced = {s for box in query.boxes for s in box.outputs}
    inputs: list[str] = []
    for box in query.boxes:
        for stream in box.inputs:
            if stream not in produced and stream not in inputs:
                inputs.append(stream)
    return inputs


def parsed_dict(query: Query) -> dict[str, Any]:
    return query_to_dict(query)


def _checked_status(status: str) -> str:
    status = status.upper()
    if status not in QUERY_STATUSES:
        raise InvalidInput(
            f"unknown query status {status!r} (one of {', '.join(QUERY_STATUSES)})",
            status=status,
        )
    return status


def _after_offset(start: str) -> int | None:
    if not start.startswith("after:"):
        return None
    try:
        value = int(start[6:])
    except ValueError:
        return None
    return value if value >= -1 else None


def _read_range(spool: Any, start: int, end: int) -> list[tuple[int, Any]]:
    return list(spool.read(start, end, skip_trimmed=True))


class _Stop(Exception):
    pass
