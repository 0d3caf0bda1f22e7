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
from typing import Any

from peer.api import ApiServer
from peer.catalog import QUERY_STATUSES, LocalCatalog, QueryEntry
from peer.errors import Conflict, EngineError, InvalidInput, NotFound
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query, query_to_dict
from peer.model.schema import check_name, parse_schema, to_arrow_schema
from peer.model.tuples import batch_from_wire, batch_to_wire
from peer.spool import SpoolSet

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
        self._stopping = asyncio.Event()

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
            )
            await self.engine.start(spark)
            await self._resume_queries()
        self.api = ApiServer(
            self,
            host=self.config.host,
            port=self.config.port,
            max_frame_bytes=self.config.max_frame_bytes,
        )
        await self.api.start()
        log.info(
            "peer listening on %s:%d (data %s)", self.config.host, self.api.port, self.data_dir
        )

    @property
    def port(self) -> int:
        assert self.api is not None
        return int(self.api.port)

    async def run(self) -> None:
        """Serve until stop() is called (SIGINT/SIGTERM in the CLI), then close."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._maintenance())
                await self._stopping.wait()
                raise _Stop
        except* _Stop:
            pass
        finally:
            await self.close()

    def stop(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
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

    # the client API (peer.api.PeerService)
    async def create_schema(self, schema: str | dict[str, Any]) -> dict[str, Any]:
        parsed = parse_schema(schema)
        await asyncio.to_thread(self._catalog().add_schema, parsed)
        return {"schema": parsed.name, "fields": [f.name for f in parsed.fields]}

    async def create_stream(self, name: str, schema: str) -> dict[str, Any]:
        catalog = self._catalog()
        found = catalog.schema(schema)
        check_name(name, "stream", InvalidInput)
        await asyncio.to_thread(catalog.add_stream, name, found)
        if name not in self._spools().streams():
            await asyncio.to_thread(self._spools().create, name, to_arrow_schema(found))
        return {"stream": name, "schema": found.name}

    async def create_query(self, query: str | dict[str, Any]) -> dict[str, Any]:
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
            await asyncio.to_thread(catalog.add_stream, stream, schema, parsed.name)
            if stream not in self._spools().streams():
                await asyncio.to_thread(self._spools().create, stream, to_arrow_schema(schema))
        await asyncio.to_thread(catalog.add_query, parsed, uuid.uuid4().hex[:8])
        return {
            "query": parsed.name,
            "status": "SETUP",
            "inputs": list(checked.inputs),
            "outputs": list(checked.outputs),
        }

    async def set_query_status(self, name: str, status: str) -> dict[str, Any]:
        status = status.upper()
        if status not in QUERY_STATUSES:
            raise InvalidInput(
                f"unknown query status {status!r} (one of {', '.join(QUERY_STATUSES)})",
                status=status,
            )
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

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        entry = self._catalog().stream(stream)
        spool = self._spools().get(stream)
        if (producer is None) != (seq is None):
            raise InvalidInput("push: give both producer and seq, or neither", stream=stream)

        def land() -> tuple[int, int | None]:
            table = batch_from_wire(entry.schema, payload)
            return table.num_rows, spool.append(table, origin=producer, seq=seq)

        count, offset = await asyncio.to_thread(land)
        return {
            "stream": stream,
            "count": count,
            "offset": offset,
            "duplicate": offset is None and count > 0,
        }

    async def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        self._catalog().stream(stream)
        if start not in ("latest", "earliest"):
            raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
        spool = self._spools().get(stream)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_append(_offset: int) -> None:
            loop.call_soon_threadsafe(wake.set)

        spool.add_listener(on_append)
        try:
            position = spool.latest if start == "latest" else spool.earliest - 1
            while True:
                wake.clear()
                latest = spool.latest
                if latest <= position:
                    await wake.wait()
                    continue
                end = min(latest, position + SUBSCRIBE_CHUNK)
                position = max(position, spool.earliest - 1)  # skip what was trimmed meanwhile
                batches = await asyncio.to_thread(_read_range, spool, position, end)
                for offset, table in batches:
                    yield {"offset": offset, **batch_to_wire(table)}
                position = end
        finally:
            spool.remove_listener(on_append)

    async def lookup(self, name: str) -> dict[str, Any]:
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
        }


def _read_range(spool: Any, start: int, end: int) -> list[tuple[int, Any]]:
    return list(spool.read(start, end, skip_trimmed=True))


class _Stop(Exception):
    pass
