"""Where a stream or query lives in the overlay, and how a request gets there.

Theory of operation
-------------------
Any peer takes any request (DESIGN.md section 3). This module decides, for each one, whether
this peer serves it or which peer does, and carries it there over a peer link:

* A *source* stream is hosted by the live member XOR-closest to ``sha1("sid:" + name)`` among
  the members that run an engine (:meth:`overlay.node.Overlay.responsible`). The host appends
  pushes to its spool and renews a ``place:`` lease record in the DHT. A *result* stream is
  hosted where the query producing it runs.
* A lease is sticky: a member that joins later and is closer does not take a stream away
  while its host lives (nothing moves, nothing flaps). When the host is declared dead (gossip)
  or its lease has lapsed, the next closest live member takes the stream over on the first
  request that needs it, and publishes a new ``place:`` record: the catalog says so.
* A push to a peer that does not host its stream is validated there (a bad batch is refused
  before anything travels), then forwarded as Arrow IPC to the host, which acknowledges only
  after its own fsync; only then is the client acknowledged. Forwarded batches carry an event
  id ``(origin, seq)``: the client's, or one of this peer's *forwarding slots* (one origin per
  slot and process, one batch in flight per slot), so a retry after a lost reply is dropped
  by the host's spool instead of appended twice.
* A subscription on a peer that does not host the stream is relayed from the host over a
  credit-controlled link stream, so a slow subscriber slows only its own relay.
* A query runs on the host of its input streams (this issue places a whole query on one peer;
  fragments across peers come with distributed queries).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from overlay.catalog import CATALOG_EXPIRY_S, CatalogError, Placement
from overlay.link import LinkError, LinkRemoteError
from overlay.node import Overlay, OverlayError
from peer.coordinator import Coordinator
from peer.errors import Conflict, FedstreamError, InvalidInput, NotFound, Unavailable, from_wire
from peer.mirror import Mirrors, parse_mirror_batches
from peer.model.schema import Schema, parse_schema

if TYPE_CHECKING:
    from peer.node import Peer

log = logging.getLogger(__name__)

FORWARD_SLOTS = 8
FORWARD_DEADLINE_S = 30.0
LEASE_S = 20.0
LEASE_GAP_S = 3.0  # a moved stream's lease may be unreadable this long after the move


class Federation:
    def __init__(self, peer: Peer, overlay: Overlay, *, lease_s: float = LEASE_S) -> None:
        self.peer = peer
        self.overlay = overlay
        self.lease_s = lease_s
        self.hosted: set[str] = set()  # streams this peer hosts (appends, renews the lease)
        self.moved_streams: dict[str, bytes] = {}  # streams handed over to another peer
        self._background: set[asyncio.Task[None]] = set()
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        self._slot_seq = [0] * FORWARD_SLOTS
        for slot in range(FORWARD_SLOTS):
            self._slots.put_nowait(slot)
        self._origin = f"fwd:{overlay.node_id.hex()[:16]}:{overlay.incarnation}"
        self._takeover = asyncio.Lock()
        self.forwarded = 0
        self.mirrors = Mirrors(self)
        self.coordinator = Coordinator(self)

    @property
    def node_id(self) -> bytes:
        return self.overlay.node_id

    # hosting
    async def host(
        self, stream: str, schema: Schema, derived_from: str | None, *, taking_over: bool = False
    ) -> None:
        """Host ``stream`` here: its spool, its local catalog entry, its lease. Taking over
        from a dead host, the old lease may not have run out yet: the renewal loop publishes
        ours as soon as the storing nodes let it."""
        await self.peer.host_locally(stream, schema, derived_from)
        self.hosted.add(stream)
        try:
            await self._renew(stream)
        except CatalogError:
            if not taking_over:
                raise
            log.info("lease of %s not yet free; publishing it when it lapses", stream)

    def adopt(self, stream: str) -> None:
        """Host ``stream``, handed over by its previous host (a moved fragment's result): our
        lease goes out as soon as the storing nodes let it (the handover record is short)."""
        self.hosted.add(stream)
        self.moved_streams.pop(stream, None)
        task = asyncio.create_task(self._claim(stream))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _claim(self, stream: str) -> None:
        deadline = time.monotonic() + 3 * self.lease_s
        while stream in self.hosted:
            try:
                await self._renew(stream)
                return
            except CatalogError as exc:
                if time.monotonic() > deadline:
                    log.warning("lease of %s still not ours: %s", stream, exc)
                    return
            await asyncio.sleep(0.5)

    async def hand_over(self, stream: str, target: bytes, handover_s: float) -> None:
        """Stop hosting ``stream``: a short last lease names ``target`` as its new host."""
        self.hosted.discard(stream)
        self.moved_streams[stream] = target
        overlay = self.overlay
        assert overlay.catalog is not None
        try:
            await overlay.catalog.place(
                stream,
                self.node_id,
                overlay.identity.cert,
                (overlay.config.host, overlay.port),
                self.peer.api_addr,
                handover_s,
                [],
                moved_to=target,
            )
        except CatalogError as exc:
            log.warning("handover record of %s not published: %s", stream, exc)

    async def _renew(self, stream: str) -> Placement:
        overlay = self.overlay
        catalog = overlay.catalog
        assert catalog is not None
        return await catalog.place(
            stream,
            self.node_id,
            overlay.identity.cert,
            (overlay.config.host, overlay.port),
            self.peer.api_addr,
            self.lease_s,
            self.mirrors.targets(stream),
        )

    async def resume(self) -> None:
        """After a restart: hold on to our streams unless another peer took them over while
        we were gone and holds a valid lease (then forward to it)."""
        replicas = self.peer.replica_streams()
        for stream in self.peer.local_streams():
            if stream in replicas:
                continue  # a copy of a stream hosted elsewhere, kept for a local fragment
            placement = await self._placement(stream, fresh=True)
            if (
                placement is not None
                and placement.node_id != self.node_id
                and placement.until > time.time()
            ):
                log.warning(
                    "stream %s is hosted by %s now; forwarding to it",
                    stream,
                    placement.node_id.hex()[:12],
                )
                continue
            self.hosted.add(stream)
            with contextlib.suppress(CatalogError):
                await self._renew(stream)

    async def renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            for stream in sorted(self.hosted):
                try:
                    await self._renew(stream)
                except CatalogError as exc:
                    log.info("renewing the lease of %s failed: %s", stream, exc)
                    await self._yield_if_taken(stream)

    async def _yield_if_taken(self, stream: str) -> None:
        """Another live peer holds a valid lease on a stream we host (we came back before our
        successor's lease could be published, or the other way round): the lease holder
        keeps the stream, we forward to it. Tuples we took meanwhile stay in our spool."""
        placement = await self._placement(stream, fresh=True)
        if (
            placement is not None
            and placement.node_id != self.node_id
            and placement.moved_to != self.node_id  # handed over to us: ours once it lapses
            and placement.until > time.time()
            and self.overlay.is_live(placement.node_id)
        ):
            log.warning(
                "stream %s is held by %s under a valid lease; forwarding to it",
                stream,
                placement.node_id.hex()[:12],
            )
            self.hosted.discard(stream)

    async def _placement(self, stream: str, *, fresh: bool = False) -> Placement | None:
        catalog = self.overlay.catalog
        assert catalog is not None
        try:
            return await catalog.placement(stream, fresh=fresh)
        except CatalogError:
            return None

    async def host_of(self, stream: str, *, fresh: bool = False) -> bytes:
        """The node id of the peer that hosts ``stream`` now (maybe us)."""
        if stream in self.hosted:
            return self.node_id
        if stream in self.moved_streams:
            return self.moved_streams[stream]
        placement = await self._placement(stream, fresh=fresh)
        if placement is not None and placement.moved_to is not None:
            return placement.moved_to
        if placement is not None and placement.node_id != self.node_id:
            state = self.overlay.state_of(placement.node_id)
            if state in ("alive", "suspect") or (state is None and placement.until > time.time()):
                return placement.node_id
        record = await self.stream_record(stream)
        if record.get("derived_from"):
            # a result stream lives where its query runs; no one else can take it over
            if placement is not None:
                return placement.node_id
            raise Unavailable(f"stream {stream}: the peer running its query is unknown")
        responsible = self.overlay.responsible(stream)
        if not responsible:
            raise Unavailable(f"stream {stream}: no live peer can host it")
        return responsible[0].node_id

    async def take_over(self, stream: str) -> None:
        """Become the host of a source stream whose host is gone (we are responsible now)."""
        async with self._takeover:
            if stream in self.hosted:
                return
            record = await self.stream_record(stream)
            if record.get("derived_from"):
                raise Unavailable(f"stream {stream} is a query result; it cannot move here")
            schema = parse_schema(record["schema"])
            log.warning("taking over stream %s (its host is gone)", stream)
            previous = await self._read(f"place:{stream}", fresh=True) or {}
            await self.host(stream, schema, None, taking_over=True)
            for target in previous.get("mirrors", []):
                if isinstance(target, bytes) and len(target) == 20 and target != self.node_id:
                    self.mirrors.start(stream, target)  # the fragments reading it go on

    # catalog records
    async def stream_record(self, stream: str) -> dict[str, Any]:
        value = await self._read(f"stream:{stream}")
        if value is None or value.get("deleted"):
            raise NotFound(f"unknown stream {stream}", stream=stream)
        return value

    async def stream_record_or_none(self, stream: str) -> dict[str, Any] | None:
        value = await self._read(f"stream:{stream}", fresh=True)
        return None if value is None or value.get("deleted") else value

    async def query_pointer(self, name: str) -> dict[str, Any] | None:
        return await self._read(f"query:{name}", fresh=True)

    async def lookup(self, name: str) -> dict[str, Any]:
        """Describe a stream, query or schema from the DHT catalog (not hosted here)."""
        # the three namespaces at once: a lookup costs one DHT round trip, not three
        stream, query, schema = await asyncio.gather(
            self._read(f"stream:{name}"),
            self._read(f"query:{name}"),
            self._read(f"schema:{name}"),
        )
        if stream is not None and stream.get("deleted"):
            stream = None
        if stream is not None:
            host = await self.host_of(name)
            member = self.overlay.member(host)
            lease = await self._placement(name)
            return {
                "lease": None
                if lease is None
                else {"node": lease.node_id.hex(), "until": round(lease.until, 3)},
                "kind": "stream",
                "name": name,
                "schema": stream["schema"],
                "derived_from": stream.get("derived_from"),
                "owner": stream.get("owner"),
                "host": host.hex(),
                "responsible": None if member is None else f"{member.api[0]}:{member.api[1]}",
            }
        found = (
            await self.query_definition(name)
            if query is not None and not query.get("deleted")
            else None
        )
        if found is not None:
            pointer, plan = found
            definition = plan.get("query", plan)
            fragments = await self.coordinator.describe(name)
            statuses = {f.get("status") for f in fragments}
            return {
                "kind": "query",
                "name": name,
                "status": statuses.pop() if len(statuses) == 1 else "MIXED",
                "definition": definition,
                "owner": pointer.get("owner"),
                "host": bytes(pointer["host"]).hex(),
                "fragments": fragments,
            }
        if schema is not None:
            return {"kind": "schema", "name": name, "schema": schema["schema"]}
        participant = await self._read(f"participant:{name}")
        if participant is not None:
            pk = participant.get("pk")
            return {
                "kind": "participant",
                "name": name,
                "public_key": pk.hex() if isinstance(pk, bytes) else None,
                "trusted_here": isinstance(pk, bytes) and self.overlay.trust.is_trusted(pk),
            }
        raise NotFound(f"nothing named {name} in the catalog", name=name)

    async def schema_record(self, name: str) -> Schema | None:
        value = await self._read(f"schema:{name}")
        return None if value is None else parse_schema(value["schema"])

    async def _read(self, key: str, *, fresh: bool = False) -> dict[str, Any] | None:
        catalog = self.overlay.catalog
        assert catalog is not None
        try:
            return await catalog.read(key, fresh=fresh)
        except CatalogError as exc:
            raise Unavailable(str(exc)) from exc

    async def publish(self, key: str, value: dict[str, Any]) -> None:
        """Write a participant-owned catalog record, refusing if another owner holds it."""
        catalog = self.overlay.catalog
        assert catalog is not None
        existing = await self._read(key, fresh=True)
        if existing is not None and existing.get("owner") not in (None, catalog.participant):
            raise Conflict(
                f"{key.replace(':', ' ', 1)} belongs to participant {existing.get('owner')}",
                name=key,
            )
        try:
            await catalog.write(
                key, {**value, "owner": catalog.participant}, expiry_s=CATALOG_EXPIRY_S
            )
        except CatalogError as exc:
            raise Unavailable(str(exc)) from exc

    async def publish_query(
        self, name: str, definition: dict[str, Any], info: dict[str, Any]
    ) -> None:
        """``query:NAME`` points at the definition's hash; the body is served over links."""
        body = json.dumps(definition, sort_keys=True).encode()
        dht = self.overlay.dht
        assert dht is not None
        digest = dht.storage.put_blob(body)
        await self.publish(
            f"query:{name}",
            {
                "sha256": digest,
                "size": len(body),
                "providers": [self.node_id],
                "host": self.node_id,
                **info,
            },
        )
        self._check_hash(body, digest)

    @staticmethod
    def _check_hash(body: bytes, digest: bytes) -> None:
        if hashlib.sha256(body).digest() != digest:
            raise FedstreamError("blob store returned a wrong hash")

    async def query_definition(self, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        catalog = self.overlay.catalog
        assert catalog is not None
        try:
            found = await catalog.fetch_body(f"query:{name}", self.overlay.fetch_blob)
        except CatalogError as exc:
            raise Unavailable(str(exc)) from exc
        if found is None:
            return None
        pointer, body = found
        return pointer, json.loads(body)

    # requests to other peers
    async def host_now(self, stream: str, recorded: bytes) -> bytes:
        """The peer hosting ``stream`` now (a move may have changed it), from a fresh read of
        its lease, else ``recorded`` (the host a plan or a replica noted). Right after a move
        there is a moment with no lease (the old host's handover lease has run out, the new
        host's is not yet stored): a retriable answer is asked again for up to LEASE_GAP_S."""
        deadline = time.monotonic() + LEASE_GAP_S
        while True:
            try:
                return await self.host_of(stream, fresh=True)
            except FedstreamError as exc:
                if exc.retriable and time.monotonic() < deadline:
                    await asyncio.sleep(0.25)
                    continue
                log.info("host of %s not found from its lease: %s", stream, exc)
                return recorded

    async def stop_mirror_here(self, stream: str, recorded_host: bytes) -> None:
        """Ask the host of ``stream`` to stop mirroring it to us (our replica is no longer
        read). A mirror left running would keep the host's spool from ever trimming past it."""
        host = await self.host_now(stream, recorded_host)
        if host == self.node_id:
            return
        try:
            await self.call(host, {"op": "unmirror", "stream": stream, "to": self.node_id.hex()})
        except FedstreamError as exc:  # its host is gone: nothing left to stop
            log.warning("the host of %s did not stop mirroring it here: %s", stream, exc)

    async def call_site(self, node_id: bytes, frame: dict[str, Any]) -> dict[str, Any]:
        """``frame`` served by peer ``node_id``: here directly, or over a link."""
        if node_id == self.node_id:
            return await self.handle_link(frame)
        return await self.call(node_id, frame)

    async def call(self, node_id: bytes, frame: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.overlay.request(node_id, frame)
        except LinkRemoteError as exc:
            raise from_wire(
                {"code": exc.code, "message": exc.message, "details": exc.details}
            ) from None
        except (LinkError, OverlayError, OSError, TimeoutError) as exc:
            raise Unavailable(f"peer {node_id.hex()[:12]} unreachable: {exc}") from exc

    async def forward_push(
        self,
        stream: str,
        table: pa.Table,
        producer: str | None,
        seq: int | None,
    ) -> dict[str, Any]:
        """Send a validated batch to the stream's host; return once the host has fsynced."""
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        body = sink.getvalue()
        slot: int | None = None
        if producer is None:
            slot = await self._slots.get()
            self._slot_seq[slot] += 1
            producer, seq = f"{self._origin}:{slot}", self._slot_seq[slot]
        try:
            return await self._forward(stream, body, producer, seq)
        finally:
            if slot is not None:
                self._slots.put_nowait(slot)

    async def _forward(
        self, stream: str, body: bytes, producer: str | None, seq: int | None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + FORWARD_DEADLINE_S
        fresh = False
        while True:
            host = await self.host_of(stream, fresh=fresh)
            if host == self.node_id:
                return await self.peer.push_local(stream, {"arrow": body}, producer, seq)
            try:
                reply = await self.call(
                    host,
                    {
                        "op": "push",
                        "stream": stream,
                        "arrow": body,
                        "producer": producer,
                        "seq": seq,
                    },
                )
                self.forwarded += 1
                return reply
            except Unavailable as exc:
                if time.monotonic() >= deadline:
                    raise Unavailable(
                        f"push to {stream}: its host {host.hex()[:12]} stayed unreachable "
                        f"for {FORWARD_DEADLINE_S:.0f} s ({exc.message})",
                        stream=stream,
                    ) from exc
                fresh = True
                await asyncio.sleep(0.5)

    async def relay(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        """A subscription served by the stream's host, here or over a link. When the stream
        moves to another peer (its producing fragment moved, with the same offsets), the
        relay carries on there after the last offset it delivered."""
        ready = False
        last: int | None = None
        deadline: float | None = None
        while True:
            host = await self.host_of(stream, fresh=deadline is not None)
            begin = start if last is None else f"after:{last}"
            try:
                async for item in self._relay_once(host, stream, begin):
                    if item.get("ready"):
                        if last is None and isinstance(item.get("after"), int):
                            last = item["after"]  # where the host started us
                        if ready:
                            continue
                        ready = True
                    elif isinstance(item.get("offset"), int):
                        last = item["offset"]
                    deadline = None
                    yield item
                return
            except Unavailable as exc:
                if not (exc.details.get("moved") or stream in self.moved_streams):
                    raise
                if deadline is None:
                    deadline = time.monotonic() + FORWARD_DEADLINE_S
                elif time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _relay_once(
        self, host: bytes, stream: str, start: str
    ) -> AsyncIterator[dict[str, Any]]:
        if host == self.node_id:
            if stream not in self.hosted:
                raise Unavailable(f"stream {stream} is moving", stream=stream, moved=True)
            async for item in self.peer.subscribe_local(stream, start):
                yield item
            return
        try:
            async for item in self.overlay.open_stream(
                host, {"op": "subscribe", "stream": stream, "start": start}
            ):
                yield item
        except LinkRemoteError as exc:
            raise from_wire(
                {"code": exc.code, "message": exc.message, "details": exc.details}
            ) from None
        except (LinkError, OverlayError, OSError) as exc:
            raise Unavailable(
                f"subscription to {stream}: its host {host.hex()[:12]} is unreachable ({exc})",
                stream=stream,
            ) from exc

    # requests from other peers (over links)
    async def handle_link(self, frame: dict[str, Any]) -> dict[str, Any]:
        op = frame.get("op")
        peer = self.peer
        if op == "push":
            stream = _str(frame, "stream")
            if stream not in self.hosted:
                if await self.host_of(stream, fresh=True) != self.node_id:
                    raise Unavailable(f"this peer does not host stream {stream}", stream=stream)
                await self.take_over(stream)
            arrow = frame.get("arrow")
            if not isinstance(arrow, bytes):
                raise InvalidInput("push: arrow must be bytes")
            producer, seq = frame.get("producer"), frame.get("seq")
            return await peer.push_local(stream, {"arrow": arrow}, producer, seq)
        if op == "host_stream":
            stream = _str(frame, "stream")
            schema = parse_schema(frame.get("schema") or {})
            derived = frame.get("derived_from")
            await self.host(stream, schema, derived if isinstance(derived, str) else None)
            return {"stream": stream, "host": self.node_id.hex()}
        if op == "create_query":
            return await peer.create_query_local(frame.get("query"))
        if op == "set_query_status":
            return await peer.set_query_status_local(_str(frame, "name"), _str(frame, "status"))
        if op == "lookup":
            return await peer.lookup_local(_str(frame, "name"))
        if op == "install_fragment":
            return await peer.install_fragment(frame)
        if op == "fragment_status":
            return await peer.fragment_status(_str(frame, "fragment"), _str(frame, "status"))
        if op == "mirror":
            stream, target = _str(frame, "stream"), _node(frame, "to")
            if stream not in self.hosted:
                raise Unavailable(f"this peer does not host stream {stream}", stream=stream)
            after = frame.get("after")
            if after is not None and (not isinstance(after, int) or after < -1):
                raise InvalidInput("mirror: after must be an offset (an integer >= -1)")
            self.mirrors.start(stream, target, after)
            with contextlib.suppress(CatalogError):
                await self._renew(stream)  # the lease lists its mirrors, for a successor
            return {"stream": stream, "to": target.hex()}
        if op == "unmirror":
            stream, target = _str(frame, "stream"), _node(frame, "to")
            if stream not in self.peer.spool_set():
                raise NotFound(f"no stream {stream} on this peer", stream=stream)
            acked = await self.mirrors.detach(stream, target)
            return {"stream": stream, "to": target.hex(), "acked": acked}
        if op == "mirror_append":
            stream, origin = _str(frame, "stream"), _str(frame, "origin")
            return await peer.append_mirrored(stream, origin, parse_mirror_batches(frame))
        raise InvalidInput(f"unknown peer request {op!r}")

    def stream_link(self, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        if frame.get("op") != "subscribe":
            raise InvalidInput(f"unknown peer stream {frame.get('op')!r}")
        stream = _str(frame, "stream")
        if stream not in self.hosted:
            raise Unavailable(
                f"this peer does not host stream {stream}",
                stream=stream,
                moved=stream in self.moved_streams,
            )
        return self.peer.subscribe_local(stream, _str(frame, "start"))

    async def on_member(self, event: Any) -> None:
        """A member died or left: forget cached placements, so that the next request
        re-resolves (and the responsible peer takes over lazily)."""
        if event.kind in ("dead", "left"):
            catalog = self.overlay.catalog
            if catalog is not None:
                for key in list(catalog._cache):  # placements only
                    if key.startswith("place:"):
                        catalog.forget(key)


def _node(frame: dict[str, Any], key: str) -> bytes:
    value = _str(frame, key)
    try:
        node = bytes.fromhex(value)
    except ValueError:
        node = b""
    if len(node) != 20:
        raise InvalidInput(f"peer request: {key!r} must be a node id (40 hex digits)")
    return node


def _str(frame: dict[str, Any], key: str) -> str:
    value = frame.get(key)
    if not isinstance(value, str):
        raise InvalidInput(f"peer request: {key!r} must be a string")
    return value
