"""The local site: one peer's streams, queries and engine, and nothing of the overlay.

The walk of a tuple through a single peer (DESIGN.md section 3): ``push`` validates the batch
against the stream's schema (a bad tuple refuses the whole batch), appends it to the stream's
spool with an fsync, and only then acknowledges. The Spark engine reads the spool through the
``fedspool`` source and appends each result micro-batch to the result stream's spool, whose
listeners wake the subscribers. Nothing blocking runs on the event loop: validation and spool
I/O go to worker threads, py4j calls to the engine's own thread.

A lone peer (``--no-overlay``) serves the client API with this class alone. In a federation,
:class:`peer.federation.Federation` decides which requests are local and calls the site for
them; the site never calls back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from typing import TYPE_CHECKING, Any

from peer.errors import Conflict, EngineError, FedstreamError, InvalidInput, NotFound, Unavailable
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.schema import Schema, check_name, parse_schema, to_arrow_schema
from peer.model.sql import unbounded_state
from peer.model.tentative import UNDO
from peer.model.tuples import batch_from_wire
from peer.protocol import replies
from peer.protocol.api import QUERY_STATUSES, START_POSITIONS
from peer.protocol.link_replies import MirrorAppendReply
from peer.site.ports import NoReplicaLogs, Reachable, ReplicaLogs, always_reachable
from peer.site.restarts import Restarts
from peer.site.store import SiteConfig, SiteStore
from peer.site.subscribe import follow
from peer.storage import spool_format as fmt
from peer.storage.catalog import QueryEntry
from peer.storage.feed import open_tentative
from peer.storage.spool import Spool
from peer.storage.spool_format import REPLICA_STATE_FILE, Quarantine
from peer.timing import MONOTONIC, Clock

if TYPE_CHECKING:
    from peer.engine.forks import Availability
    from peer.engine.runner import Engine

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "~"  # streams the federation makes for itself (names users cannot give)
# An internal stream (a fragment's checkpoints) keeps its newest batch, and the others this
# long: a replica that was away longer cannot catch up on them.
INTERNAL_RETENTION_S = 120.0


def checked_status(status: str) -> str:
    status = status.upper()
    if status not in QUERY_STATUSES:
        raise InvalidInput(
            f"unknown query status {status!r} (one of {', '.join(QUERY_STATUSES)})",
            status=status,
        )
    return status


class LocalSite:
    """Streams, queries and the engine of one peer (implements peer.server.PeerService)."""

    def __init__(
        self,
        config: SiteConfig,
        engine: Engine | None = None,
        *,
        store: SiteStore | None = None,
        availability: Availability | None = None,
        logs: ReplicaLogs | None = None,
        address: Callable[[], str] = lambda: "",
        clock: Clock = MONOTONIC,
        restarts: Restarts | None = None,
    ) -> None:
        """``store``: opened here if not given (the engine's spools must be its spools);
        ``availability``: the engine's tentative forks (None: queries are never forked);
        ``logs``: the replicated streams' appenders; ``address``: HOST:PORT of the client API
        (empty until it listens); ``clock``: for the uptime, the backlog wait and the restarts of
        failed queries; ``restarts``: when those happen (default: ``RestartPolicy()``)."""
        self.config = config
        self.data_dir = config.data_dir
        self.engine = engine
        self.clock = clock
        self.started_at = clock()
        self._address = address
        self.query_errors: dict[str, str] = {}
        self.restarts = restarts or Restarts()  # failed queries started again (and when)
        store = store or SiteStore.open(config.data_dir)
        self.catalog = store.catalog
        self.spools = store.spools
        self._checked: dict[str, CheckedQuery] = {}
        self._frozen: set[str] = set()  # replica streams being moved away: no appends
        self._landing: dict[str, int] = {}  # mirrored appends under way, per stream
        self._landed = asyncio.Condition()
        # streams whose pushes another room appends (replicated streams), and their trim limits
        self.logs: ReplicaLogs = logs or NoReplicaLogs()
        self.availability = availability

    # lifecycle
    async def resume_queries(self, skip: Collection[str] = ()) -> None:
        """Restart the queries that were RUNNING, from their checkpoints (but those in
        ``skip``: fragments whose unfinished move decides where they run)."""
        for name in self.catalog.query_names():
            entry = self.catalog.query(name)
            if name not in skip and not self.replicated_outputs(entry.query):
                await self.resume_query(name)

    async def resume_query(self, name: str) -> None:
        """Restart query ``name`` from its checkpoint if its status is RUNNING and the engine
        does not run it yet (a failure is noted in ``query_errors``, not raised)."""
        entry = self.catalog.query(name)
        if entry.status != "RUNNING" or self.engine is None:
            return
        blocked = self.quarantined_streams(entry.query)
        if blocked:
            self.query_errors[name] = blocked[0].error().message
            log.error("query %s cannot resume: %s", name, self.query_errors[name])
            return
        try:
            await self._run(entry, resume=True)
        except EngineError as exc:
            self.query_errors[name] = exc.message
            log.error("query %s could not resume: %s", name, exc.message)

    async def check_availability(self, reachable: Reachable = always_reachable) -> None:
        """Fork or correct the queries with an availability bound (peer.engine.forks);
        ``reachable`` says whether a stream's upstream is (the federation knows; alone: yes)."""
        if self.engine is None or self.availability is None:
            return
        entries = [self.catalog.query(n) for n in self.catalog.query_names()]
        bounded = [e for e in entries if e.query.availability_bound_s and e.status == "RUNNING"]
        unreplicated = [e for e in bounded if not self.replicated_outputs(e.query)]
        queries = [(self.checked(e.query), e.incarnation) for e in unreplicated]
        await self.availability.tick(queries, reachable)

    async def close(self) -> None:
        if self.availability is not None:
            await self.availability.close()
        if self.engine is not None:
            await self.engine.close()
            self.engine = None
        self.catalog.close()

    async def maintain(self) -> None:
        """Trim what every reader has taken (and old result tuples); note failed queries."""
        for name in self.spools.streams():
            with contextlib.suppress(KeyError, OSError):
                spool = self.spools.get(name)
                retain, age = 0, self.config.retention_s
                if name.startswith(INTERNAL_PREFIX):  # a fragment's checkpoints: the newest
                    retain, age = 1, min(INTERNAL_RETENTION_S, age)
                keep = self.logs.trim_limit(name)
                await asyncio.to_thread(spool.trim, retain, max_age_s=age, keep_after=keep)
        if self.engine is not None:
            failed = await self.engine.failed()
            for name, reason in failed.items():
                if self.query_errors.get(name) != reason:
                    log.error("query %s failed: %s", name, reason)
                    self.query_errors[name] = reason
            await self._restart_failed(failed)

    async def _restart_failed(self, failed: dict[str, str]) -> None:
        """Start failed queries again from their checkpoints, as ``self.restarts`` says when
        (peer.site.restarts: exponential delay, a bounded number of times)."""
        engine = self.engine
        assert engine is not None
        now = self.clock()
        lane_restarted = False
        for name in self.restarts.due(failed, now):
            entry = self.catalog.find_query(name)
            if (
                entry is None
                or entry.status != "RUNNING"
                or not engine.runs(name, entry.incarnation)
            ):
                self.restarts.forget(name)  # not ours to restart (gone, stopped, a standby)
                continue
            self.restarts.restarted(name, now)
            try:
                if name in engine.lane.members:
                    if not lane_restarted:
                        await engine.restart_query(name)
                    lane_restarted = True
                else:
                    await engine.restart_query(name)
            except FedstreamError as exc:
                log.error("query %s could not start again: %s", name, exc.message)
                continue
            log.warning(
                "query %s had failed (%s); started again from its checkpoint (restart %d)",
                name,
                failed[name],
                self.restarts.attempts(name),
            )
            self.query_errors.pop(name, None)

    async def _run(self, entry: QueryEntry, *, resume: bool = False) -> None:
        """Start a query where it ran before (its checkpoint is there), or where the engine
        places it on its first start, and remember that place."""
        assert self.engine is not None
        placement = await self.engine.run_query(
            await asyncio.to_thread(self.checked, entry.query),
            entry.incarnation,
            resume=resume,
            placement=entry.placement,
        )
        if placement != entry.placement:
            await asyncio.to_thread(self.catalog.set_placement, entry.query.name, placement)

    def replicated_outputs(self, query: Query) -> bool:
        """Whether ``query`` writes replicated streams: it runs wherever the primary of its
        input is (peer.replication.fragment_failover starts it there), not where it ran before."""
        outputs = [s for box in query.boxes for s in box.outputs]
        return any(
            s in self.spools and (self.spools.get(s).directory / REPLICA_STATE_FILE).exists()
            for s in outputs
        )

    async def restore_query(self, query: Query, incarnation: str, status: str) -> None:
        """Enter a fragment taken over from another peer (its checkpoint in place already),
        in its own streaming query, and run it if it ran there."""
        await asyncio.to_thread(self.catalog.add_query, query, incarnation)
        await asyncio.to_thread(self.catalog.set_placement, query.name, "own")
        if status == "RUNNING":
            await self.set_query_status_here(query.name, "RUNNING")
        elif status == "STOPPED":
            await asyncio.to_thread(self.catalog.set_status, query.name, status)

    async def adopt_query(self, query: Query, incarnation: str) -> None:
        """Enter, RUNNING, a fragment whose streaming query runs here already under
        ``incarnation`` (a promoted warm standby, peer.replication.standby), in place of any
        entry of another run of it (a stale one: this peer ran it before and was deposed)."""
        stale = self.catalog.find_query(query.name)
        if stale is not None and stale.incarnation != incarnation:
            await asyncio.to_thread(self.catalog.remove_query, query.name)
            self._checked.pop(query.name, None)
            if self.engine is not None:
                await self.engine.drop_leftovers(query.name, stale.incarnation)
        if stale is None or stale.incarnation != incarnation:
            await asyncio.to_thread(self.catalog.add_query, query, incarnation)
        await asyncio.to_thread(self.catalog.set_placement, query.name, "own")
        await asyncio.to_thread(self.catalog.set_status, query.name, "RUNNING")
        self.query_errors.pop(query.name, None)

    async def release_query(self, name: str) -> None:
        """Stop a fragment that now runs on another peer and forget it here (its streams
        stay: they are replicas)."""
        entry = self.catalog.find_query(name)
        if entry is None:
            return
        if self.engine is not None:
            await self.engine.drop_query(name, entry.incarnation)
        await asyncio.to_thread(self.catalog.remove_query, name)
        self._checked.pop(name, None)

    def quarantined_streams(self, query: Query) -> list[Quarantine]:
        """The quarantined spools among the streams ``query`` reads or writes."""
        streams = {s for box in query.boxes for s in (*box.inputs, *box.outputs)}
        found = (self.spools.quarantine_of(s) for s in sorted(streams))
        return [q for q in found if q is not None]

    def checked(self, query: Query) -> CheckedQuery:
        """The query checked against the local streams' schemas (once per query)."""
        found = self._checked.get(query.name)
        if found is None or found.query != query:  # the catalog parses a fresh copy
            found = check_query(query, self.catalog.stream_schemas())
            self._checked[query.name] = found
        return found

    # schemas and streams
    async def add_schema(self, schema: Schema) -> None:
        await asyncio.to_thread(self.catalog.add_schema, schema)

    def find_schema(self, name: str) -> Schema | None:
        return self.catalog.find_schema(name)

    def unknown_schema(self, name: str) -> NotFound:
        known = ", ".join(self.catalog.schema_names()) or "none"
        return NotFound(f"unknown schema {name} (known here: {known})", schema=name)

    async def add_stream(self, name: str, schema: Schema, derived_from: str | None) -> None:
        """A stream held here: its catalog entry and its spool."""
        await asyncio.to_thread(self.catalog.add_stream, name, schema, derived_from)
        if name not in self.spools:
            await asyncio.to_thread(self.spools.create, name, to_arrow_schema(schema))

    async def add_replica(self, stream: str, schema: Schema, source: str) -> None:
        """A copy of a stream hosted by ``source`` (node id, hex), mirrored here."""
        await self.add_stream(stream, schema, None)
        await asyncio.to_thread(self.catalog.add_replica, stream, source)

    def stream_names(self) -> list[str]:
        return self.catalog.stream_names()

    def replicas(self) -> dict[str, str]:
        return self.catalog.replicas()

    async def drop_streams(self, streams: list[str]) -> None:
        for stream in streams:
            await asyncio.to_thread(self.catalog.remove_stream, stream)
            if stream in self.spools:
                await asyncio.to_thread(self.spools.drop, stream)

    def streams_read(self, *, besides: str | None = None) -> set[str]:
        """The streams the local queries (but ``besides``) read."""
        return {
            s
            for name in self.catalog.query_names()
            if name != besides
            for box in self.catalog.query(name).query.boxes
            for s in box.inputs
        }

    # queries
    def check_new(self, query: Query) -> CheckedQuery:
        """Check a query that is to run here; refuse before anything is written."""
        if self.catalog.find_query(query.name) is not None:
            raise Conflict(f"query {query.name} already exists; delete it first", query=query.name)
        checked = self.checked(query)
        for stream in checked.outputs:
            self.catalog.check_stream(stream, checked.stream_schemas[stream])
        return checked

    async def add_query(self, checked: CheckedQuery) -> replies.CreateQueryReply:
        """Enter a checked query (SETUP) whose result streams exist here already."""
        query = checked.query
        await asyncio.to_thread(self.catalog.add_query, query, uuid.uuid4().hex[:8])
        return replies.CreateQueryReply(
            query.name,
            "SETUP",
            extra={"inputs": list(checked.inputs), "outputs": list(checked.outputs)},
        )

    async def set_query_status_here(self, name: str, status: str) -> replies.SetQueryStatusReply:
        status = checked_status(status)
        entry = self.catalog.query(name)
        self.restarts.forget(name)  # set by hand: its restarts count from zero again
        if status == "RUNNING" and entry.status != "RUNNING":
            if self.engine is None:
                raise Conflict(
                    f"query {name}: this peer runs without an engine (--no-engine)", query=name
                )
            self.query_errors.pop(name, None)
            await self._run(entry)
        elif status in ("STOPPED", "SETUP") and entry.status == "RUNNING":
            assert self.engine is not None
            await self.engine.stop_query(name)  # (and its tentative fork)
        elif status == "DELETED":
            if self.engine is not None:
                await self.engine.drop_query(name, entry.incarnation)
            await asyncio.to_thread(self.catalog.remove_query, name)
            self._checked.pop(name, None)
            return replies.SetQueryStatusReply(name, "DELETED")
        await asyncio.to_thread(self.catalog.set_status, name, status)
        return replies.SetQueryStatusReply(name, status)

    # tuples in
    async def push_here(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> replies.PushReply:
        """Append a batch to a stream held here (fsync before the reply)."""
        entry = self.catalog.stream(stream)
        spool = self.spools.get(stream)
        if (producer is None) != (seq is None):
            raise InvalidInput("push: give both producer and seq, or neither", stream=stream)

        def land() -> tuple[int, int | None]:
            table = batch_from_wire(
                entry.schema, payload, stream=stream, max_bytes=self.max_push_bytes
            )
            return table.num_rows, spool.append(table, origin=producer, seq=seq)

        await self.room(stream, spool)
        appender = self.logs.appender(stream)
        if appender is not None:  # a replicated stream: its replicas must hold it first

            def encode() -> tuple[int, bytes | None]:
                table = batch_from_wire(
                    entry.schema, payload, stream=stream, max_bytes=self.max_push_bytes
                )
                rows = table.num_rows
                return rows, spool.encode(table, origin=producer, seq=seq) if rows else None

            count, body = await asyncio.to_thread(encode)
            if body is None:
                return replies.PushReply(stream, 0, None, False)
            # (the replica room answers with the reply's wire map: checked like one)
            return replies.PushReply.from_wire(await appender(body, count, producer, seq))
        count, offset = await asyncio.to_thread(land)
        return replies.PushReply(stream, count, offset, offset is None and count > 0)

    async def append_mirrored(
        self, stream: str, origin: str, batches: tuple[tuple[int, bytes, str], ...]
    ) -> MirrorAppendReply:
        """Append mirrored batches of a replica (each fsynced; replays dropped by seq), with
        their status (an undo names this log's own first tentative offset)."""
        entry = self.catalog.stream(stream)
        if stream not in self.catalog.replicas():
            raise Conflict(f"stream {stream} is not mirrored to this peer", stream=stream)
        spool = self.spools.get(stream)

        def land() -> int:
            kept = 0
            for seq, body, status in batches:
                table = batch_from_wire(
                    entry.schema, {"arrow": body}, stream=stream, max_bytes=self.max_push_bytes
                )
                undo = open_tentative(spool) if status == UNDO else None
                if status == UNDO and undo is None:
                    continue  # nothing tentative here to take back (a replay)
                at = spool.append(table, origin=origin, seq=seq, status=status, undo=undo)
                kept += at is not None
            return kept

        if stream in self._frozen:
            raise Unavailable(f"stream {stream} is moving to another peer", stream=stream)
        if self.logs.appender(stream) is not None:
            return await asyncio.to_thread(self._mirrored_replica, stream, spool, batches[-1][0])
        await self.room(stream, spool)
        self._landing[stream] = self._landing.get(stream, 0) + 1
        try:
            kept = await asyncio.to_thread(land)
        finally:
            self._landing[stream] -= 1
            async with self._landed:
                self._landed.notify_all()
        return MirrorAppendReply(stream, batches[-1][0], kept)

    def _mirrored_replica(self, stream: str, spool: Spool, through: int) -> MirrorAppendReply:
        """A mirrored stream that this peer also replicates (a fragment here reads a stream
        whose replica set includes this peer). Its replicas write the primary's bytes at the
        primary's offsets into this very spool, so the mirror's batches are there already;
        writing them again would put every batch twice into the log and shift the offsets
        under the replication. What the mirror adds is news: it carries acknowledged batches
        only, and its seq is the host's offset, so everything through ``through`` may be read
        here (a follower's own readers otherwise see nothing, its spool held at -1 until it
        leads). A batch not yet replicated here is refused retriably: the mirror resends it."""
        held = min(through, spool.log_end)
        bound = spool.visible_bound
        if bound is not None and held > bound:
            spool.hold(held)  # (only raised: what was visible stays visible)
        if held < through:
            raise Unavailable(
                f"stream {stream}: this replica holds offsets through {spool.log_end} only, "
                f"the mirror sent up to {through}; the rest comes by replication, retry",
                stream=stream,
            )
        return MirrorAppendReply(stream, through, 0)

    async def room(self, stream: str, spool: Spool) -> None:
        """Wait while the stream's slowest reader is too far behind (backpressure): the
        writer (a client, or the peer mirroring to us) slows down instead of our disk and
        memory filling up; after backlog_wait_s it gets a retriable error."""
        limit = self.config.max_backlog_batches
        if limit <= 0 or spool.backlog() <= limit:
            return
        deadline = self.clock() + self.config.backlog_wait_s
        while spool.backlog() > limit:
            if self.clock() >= deadline:
                raise Unavailable(
                    f"stream {stream} is backlogged: its slowest reader is more than {limit} "
                    "batches behind; retry later",
                    stream=stream,
                )
            await self.clock.sleep(0.05)

    def freeze(self, stream: str) -> None:
        """Refuse mirrored appends to ``stream`` (a replica whose reader is moving away)."""
        self._frozen.add(stream)

    def thaw(self, stream: str) -> None:
        self._frozen.discard(stream)

    async def drained(self, stream: str, timeout_s: float = 30.0) -> None:
        """Wait until no mirrored append to ``stream`` is landing."""
        async with asyncio.timeout(timeout_s), self._landed:
            await self._landed.wait_for(lambda: not self._landing.get(stream))

    # tuples out
    async def subscribe_here(
        self, stream: str, start: str, tentative: bool = True
    ) -> AsyncIterator[dict[str, Any]]:
        """Batches of a stream held here from ``start`` (latest, earliest or ``after:N``, a
        relay resuming where it was); :data:`READY` first, once the position is fixed.

        Never skips: when the next batch a subscriber needs has been trimmed (it fell more
        than the retention behind, or resumes from an offset no longer kept), it gets
        :func:`trimmed_gap`, naming the first missing offset, and may subscribe again."""
        self.catalog.stream(stream)
        async with contextlib.aclosing(follow(self.spools, stream, start, tentative)) as items:
            async for item in items:
                yield item

    # what the brain and moves measure
    def input_backlog(self) -> int:
        """Batches waiting in the inputs of this peer's own streaming queries."""
        if self.engine is None:
            return 0
        total = 0
        for running in list(self.engine.running.values()):
            for stream, reader in running.readers:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    spool = self.spools.get(stream)
                    total += max(0, spool.latest - spool.committed(reader))
        return total

    def input_backlog_rows(self, most_files: int = 64) -> int:
        """Rows waiting in the inputs of this peer's own streaming queries (and the lane's):
        for each reader, the rows of the spool files it has not committed, counted in at most
        ``most_files`` files per reader and extrapolated from their mean beyond. Blocking."""
        if self.engine is None:
            return 0
        readers = self.engine.input_readers()
        total = 0
        for stream, reader in readers:
            with contextlib.suppress(KeyError, ValueError, OSError, fmt.TrimmedError):
                spool = self.spools.get(stream)
                first, last = spool.committed(reader) + 1, spool.latest
                if last < first:
                    continue
                counted = [
                    fmt.file_rows(fmt.offset_path(spool.directory, o))
                    for o in range(max(first, last - most_files + 1), last + 1)
                ]
                total += round(sum(counted) / len(counted) * (last - first + 1))
        return total

    async def engine_busy_seconds(self) -> dict[str, float]:
        return {} if self.engine is None else await self.engine.busy_seconds()

    # describing
    def lookup_here(self, name: str) -> replies.LookupReply:
        stream = self.catalog.find_stream(name)
        if stream is not None:
            return replies.LookupReply(
                "stream",
                name,
                extra={
                    "schema": stream.schema.to_dict(),
                    "derived_from": stream.derived_from,
                    "responsible": self.address,
                    "latest_offset": self.spools.get(name).latest,
                },
            )
        query = self.catalog.find_query(name)
        if query is not None:
            return replies.LookupReply(
                "query",
                name,
                extra={
                    "status": query.status,
                    "definition": query_to_dict(query.query),
                    "peer": self.address,
                },
            )
        schema = self.catalog.find_schema(name)
        if schema is not None:
            return replies.LookupReply("schema", name, extra={"schema": schema.to_dict()})
        raise NotFound(f"nothing named {name} in the catalog", name=name)

    async def status(self) -> replies.StatusReply:
        names = self.catalog.query_names()
        engine_info = await self.engine.describe(names) if self.engine is not None else {}
        queries = []
        for name in names:
            entry = self.catalog.find_query(name)
            if entry is None:  # moved away or deleted while the engine answered
                continue
            info: dict[str, Any] = {"name": name, "status": entry.status}
            # its boxes and arrows, for the dashboard's query diagram (peer.observe.diagram)
            info["boxes"] = [
                {
                    "name": b.name,
                    "type": b.type,
                    "inputs": list(b.inputs),
                    "outputs": list(b.outputs),
                }
                for b in entry.query.boxes
            ]
            unbounded = unbounded_state(entry.query)
            if unbounded:  # a join without a time bound (docs/sql.md, NEXMark q3)
                info["unbounded_state"] = list(unbounded)
            info.update(engine_info.get(name, {}))
            dpc = None if self.availability is None else self.availability.describe(name)
            if dpc is not None:  # a tentative fork runs in the stable query's stead
                info["availability"] = dpc
                info["active"] = info.get("active") or dpc["tentative"]
            if name in self.query_errors:
                info["error"] = self.query_errors[name]
            queries.append(info)
        quarantined = {q.stream: q for q in self.spools.quarantined()}
        streams: list[dict[str, Any]] = []
        for n in self.catalog.stream_names():
            q = quarantined.get(n)
            if q is None:
                try:
                    latest = self.spools.get(n).latest
                except KeyError:  # dropped meanwhile (a move lets go of it in a thread)
                    continue
                streams.append({"name": n, "latest_offset": latest})
            else:
                streams.append({"name": n, "latest_offset": None, "quarantined": q.reason})
        return replies.StatusReply(
            self.address,
            os.getpid(),
            round(self.clock() - self.started_at, 1),
            "spark" if self.engine is not None else "none",
            str(self.data_dir),
            streams,
            queries,
            extra={
                "quarantined": [q.to_dict() for q in quarantined.values()],
                **self._executors(),
            },
        )

    def _executors(self) -> dict[str, Any]:
        """A cluster engine's executors (``peer.engine.executors``); nothing on local ones."""
        watch = None if self.engine is None else self.engine.executors
        return {} if watch is None else {"executors": watch.status.to_wire()}

    # the client API of a lone peer (peer.server.PeerService)
    async def create_schema(self, schema: str | dict[str, Any]) -> replies.CreateSchemaReply:
        parsed = parse_schema(schema)
        await self.add_schema(parsed)
        return replies.CreateSchemaReply(parsed.name, [f.name for f in parsed.fields])

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> replies.CreateStreamReply:
        """A stream on this lone peer (``replicas`` has no meaning without a federation)."""
        found = self.find_schema(schema)
        if found is None:
            raise self.unknown_schema(schema)
        check_name(name, "stream", InvalidInput)
        await self.add_stream(name, found, None)
        return replies.CreateStreamReply(name, found.name)

    async def create_query(self, query: str | dict[str, Any]) -> replies.CreateQueryReply:
        checked = await asyncio.to_thread(lambda: self.check_new(self.parse_query(query)))
        for stream in checked.outputs:
            await self.add_stream(stream, checked.stream_schemas[stream], checked.query.name)
        return await self.add_query(checked)

    def parse_query(self, query: str | dict[str, Any]) -> Query:
        """A query from a client, within this peer's limits (CPU work: not on the loop)."""
        return parse_query(query, limits=self.config.limits)

    @property
    def max_push_bytes(self) -> int:
        return self.config.limits.max_push_bytes

    async def set_query_status(self, name: str, status: str) -> replies.SetQueryStatusReply:
        return await self.set_query_status_here(name, status)

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> replies.PushReply:
        return await self.push_here(stream, payload, producer, seq)

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        if start not in START_POSITIONS:
            raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
        return self.subscribe_here(stream, start)

    async def lookup(self, name: str) -> replies.LookupReply:
        return self.lookup_here(name)

    @property
    def address(self) -> str:
        """HOST:PORT of this peer's client API (empty until it listens)."""
        return self._address()
