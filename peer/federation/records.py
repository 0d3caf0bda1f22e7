"""The federation's catalog records: schemas, streams, queries and participants in the DHT.

Records are owned by a participant (``owner``): a peer writes a record only if no other
participant owns it. A query's definition is stored by content hash and served over links;
its ``query:`` record points at the hash, and carries a small definition itself. Every DHT
failure becomes a retriable :class:`~peer.errors.Unavailable`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgpack

from overlay.catalog import CATALOG_EXPIRY_S, Catalog, CatalogError, Placement
from overlay.node import Overlay
from overlay.records import MAX_KEY_BYTES, MAX_RECORD_BYTES
from peer.errors import Conflict, FedstreamError, InvalidInput, NotFound, Unavailable
from peer.model.schema import Schema, parse_schema

# A query definition up to this size travels in its ``query:`` record (records hold at most
# MAX_RECORD_BYTES, signature and the pointer's other fields included).
INLINE_QUERY_BYTES = 4096
RECORD_OVERHEAD = 1024  # key, labels, signatures and framing around a record's value


class CatalogRecords:
    def __init__(self, overlay: Overlay) -> None:
        self.overlay = overlay

    @property
    def catalog(self) -> Catalog:
        catalog = self.overlay.catalog
        assert catalog is not None, "the overlay is not started"
        return catalog

    async def read(self, key: str, *, fresh: bool = False) -> dict[str, Any] | None:
        try:
            return await self.catalog.read(key, fresh=fresh)
        except CatalogError as exc:
            raise Unavailable(str(exc)) from exc

    async def placement(self, stream: str, *, fresh: bool = False) -> Placement | None:
        try:
            return await self.catalog.placement(stream, fresh=fresh)
        except CatalogError:
            return None

    async def stream(self, stream: str) -> dict[str, Any]:
        value = await self.read(f"stream:{stream}")
        if value is None:  # a remembered miss may be older than the record: ask again
            value = await self.read(f"stream:{stream}", fresh=True)
        if value is None or value.get("deleted"):
            raise NotFound(f"unknown stream {stream}", stream=stream)
        return value

    async def stream_or_none(self, stream: str) -> dict[str, Any] | None:
        value = await self.read(f"stream:{stream}", fresh=True)
        return None if value is None or value.get("deleted") else value

    async def stream_schema(self, stream: str) -> Schema:
        return parse_schema((await self.stream(stream))["schema"])

    async def query_pointer(self, name: str) -> dict[str, Any] | None:
        return await self.read(f"query:{name}", fresh=True)

    async def schema(self, name: str) -> Schema | None:
        value = await self.read(f"schema:{name}")
        return None if value is None else parse_schema(value["schema"])

    async def publish(self, key: str, value: dict[str, Any]) -> None:
        """Write a participant-owned catalog record, refusing if another owner holds it."""
        catalog = self.catalog
        existing = await self.read(key, fresh=True)
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
            if not exc.retriable:  # a key or record the DHT never takes (too long, too big)
                raise InvalidInput(
                    f"{key.replace(':', ' ', 1)} cannot be published: {exc} (a DHT key holds "
                    f"at most {MAX_KEY_BYTES} bytes, a record at most {MAX_RECORD_BYTES})",
                    name=key,
                ) from exc
            raise Unavailable(str(exc)) from exc

    async def publish_stream(self, stream: str, schema: Schema, derived_from: str | None) -> None:
        await self.publish(
            f"stream:{stream}", {"schema": schema.to_dict(), "derived_from": derived_from}
        )

    async def publish_query(
        self, name: str, definition: dict[str, Any], info: dict[str, Any]
    ) -> None:
        """``query:NAME`` points at the definition's hash; the body is served over links
        by this peer, and travels in the record itself when it is small (up to
        ``INLINE_QUERY_BYTES``): the DHT keeps a record on several nodes, so the definition
        outlives this peer."""
        body = json.dumps(definition, sort_keys=True).encode()
        dht = self.overlay.dht
        assert dht is not None
        digest = dht.storage.put_blob(body)
        if hashlib.sha256(body).digest() != digest:
            raise FedstreamError("blob store returned a wrong hash")
        node_id = self.overlay.node_id
        record = {
            "sha256": digest,
            "size": len(body),
            "providers": [node_id],
            "host": node_id,
            **info,
        }
        room = MAX_RECORD_BYTES - RECORD_OVERHEAD - len(msgpack.packb(record, use_bin_type=True))
        if len(body) <= min(INLINE_QUERY_BYTES, room):
            record["body"] = body
        await self.publish(f"query:{name}", record)

    async def query_definition(self, name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        try:
            found = await self.catalog.fetch_body(f"query:{name}", self.overlay.fetch_blob)
        except CatalogError as exc:
            raise Unavailable(str(exc)) from exc
        if found is None:
            return None
        pointer, body = found
        return pointer, json.loads(body)
