"""The catalog on the DHT: typed, signed records with a local cache that is refreshed.

Theory of operation
-------------------
Every catalog entry is one signed record (:mod:`overlay.records`) under a namespaced key:

=====================  ==========================================  =======================
key                    value (a msgpack map)                       signed by (owner)
=====================  ==========================================  =======================
``participant:NAME``   ``{name, pk}``                              that participant (pk)
``peer:IDHEX``         ``{cert, ov, api, eng}``                    the node key (id = sha1)
``schema:NAME``        ``{schema}`` (the schema as a dict)         the creating participant
``stream:NAME``        ``{schema, derived_from}``                  the creating participant
``query:NAME``         ``{sha256, size, providers, host, ...}``    the creating participant
``place:STREAM``       ``{node, cert, ov, api, until}`` (a lease)  the hosting node's key
=====================  ==========================================  =======================

The first owner of a name is pinned by the storing nodes, so nobody else can take it over; a
``place:`` record is a lease: its expiry is short and its holder renews it, and once it has
expired another node may take the stream over. Query definitions can be far larger than a
datagram, so ``query:`` holds their SHA-256 and the node ids that serve the body over peer
links (:meth:`Catalog.fetch_body` is given a fetch function by the overlay).

:meth:`Catalog.policy` is the storage policy every node applies to every record it stores or
reads: catalog records must be signed by a participant this node trusts; node records by a
node key whose certificate a trusted participant issued.

Reads go through a cache: a hit younger than its namespace's TTL is answered locally (well
under a millisecond); an older one is refreshed from the DHT, so a stale entry is never
trusted for long.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from overlay.records import Record, RecordError

__all__ = ["CACHE_TTL_S", "Catalog", "CatalogError", "Placement"]

NAMESPACES = ("participant", "peer", "schema", "stream", "query", "place")
CATALOG_EXPIRY_S = 24 * 3600.0
PEER_EXPIRY_S = 600.0
CACHE_TTL_S = {"place": 5.0, "peer": 30.0}
DEFAULT_TTL_S = 30.0
MAX_CACHE = 4096


class CatalogError(Exception):
    """A catalog record could not be read or written (the message says which and why)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class Dht(Protocol):
    """What the catalog needs of overlay.dht.CatalogServer."""

    async def put(
        self,
        key: str,
        value: bytes,
        signer: Ed25519PrivateKey,
        *,
        expiry_s: float,
        seq: int | None = None,
    ) -> int: ...

    async def get(
        self, key: str, *, quorum: int = 1, pinned_owner: bytes | None = None
    ) -> Record | None: ...

    def routing_size(self) -> int: ...

    @property
    def storage(self) -> Any: ...  # overlay.dht_store.CatalogStorage (its ``local(key)``)


@dataclass(frozen=True)
class Placement:
    """Which node hosts a stream, until when (a lease)."""

    stream: str
    node_id: bytes
    overlay: tuple[str, int]
    api: tuple[str, int]
    until: float
    # set by a host handing the stream over to another peer (a fragment moved, issue 5): the
    # new host, which publishes its own lease once this short one has run out
    moved_to: bytes | None = None
    # a replicated stream's epoch in which the control plane named this node its primary
    # (the record mirrors that decision for readers; it decides nothing)
    epoch: int | None = None


def _epoch(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("epoch must be a positive int")
    return value


def _moved_to(value: Any) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, bytes) or len(value) != 20:
        raise ValueError("moved_to must be a node id")
    return value


def pack(value: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(raw: bytes) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(raw, raw=False, max_bin_len=8192, max_str_len=8192)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CatalogError(f"catalog value does not decode: {exc}") from None
    if not isinstance(value, dict):
        raise CatalogError("catalog value is not a map")
    return value


class Catalog:
    def __init__(
        self,
        dht: Dht,
        *,
        participant: str,
        participant_key: Ed25519PrivateKey,
        node_key: Ed25519PrivateKey,
        cache_ttl_s: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        alone: Callable[[], bool] | None = None,
        on_lookup: Callable[[float], None] | None = None,
    ) -> None:
        self.dht = dht
        self.participant = participant
        self._participant_key = participant_key
        self._node_key = node_key
        self._ttl = {**CACHE_TTL_S, **(cache_ttl_s or {})}
        self._clock = clock
        self._alone = alone or (lambda: self.dht.routing_size() == 0)
        self._cache: dict[str, tuple[float, dict[str, Any] | None, Record | None]] = {}
        self.hits = 0
        self.misses = 0
        # Told how long each lookup that went to the DHT took (seconds; the peer's metrics).
        self.on_lookup = on_lookup

    # reading
    async def read(self, key: str, *, fresh: bool = False) -> dict[str, Any] | None:
        """The value under ``key`` (None if absent); cached up to the namespace's TTL."""
        namespace = key.partition(":")[0]
        now = self._clock()
        cached = self._cache.get(key)
        if (
            not fresh
            and cached is not None
            and now - cached[0] < self._ttl.get(namespace, DEFAULT_TTL_S)
        ):
            self.hits += 1
            return cached[1]
        self.misses += 1
        pinned = cached[2].owner if cached is not None and cached[2] is not None else None
        try:
            if self._alone():  # nobody to ask: our own copy is the catalog
                record = self.dht.storage.local(key)
            else:
                started = time.monotonic()
                record = await self.dht.get(key, pinned_owner=pinned)
                if self.on_lookup is not None:
                    self.on_lookup(time.monotonic() - started)
        except Exception as exc:
            if cached is not None:
                return cached[1]  # the network is unreachable: the last value we saw
            raise CatalogError(f"cannot read {key} from the DHT: {exc}", retriable=True) from exc
        value = unpack(record.value) if record is not None else None
        self._remember(key, value, record)
        return value

    def cached(self, key: str) -> dict[str, Any] | None:
        entry = self._cache.get(key)
        return None if entry is None else entry[1]

    def _remember(self, key: str, value: dict[str, Any] | None, record: Record | None) -> None:
        if len(self._cache) >= MAX_CACHE and key not in self._cache:
            oldest = min(self._cache, key=lambda k: self._cache[k][0])
            del self._cache[oldest]
        self._cache[key] = (self._clock(), value, record)

    def forget(self, key: str) -> None:
        self._cache.pop(key, None)

    def forget_prefix(self, prefix: str) -> None:
        """Forget every cached record whose key starts with ``prefix`` (``place:``: after a
        member died, the next request re-resolves its streams)."""
        for key in [k for k in self._cache if k.startswith(prefix)]:
            del self._cache[key]

    # writing
    async def write(
        self, key: str, value: dict[str, Any], *, as_node: bool = False, expiry_s: float
    ) -> int:
        signer = self._node_key if as_node else self._participant_key
        try:
            acks = await self.dht.put(key, pack(value), signer, expiry_s=expiry_s)
        except RecordError as exc:  # the record itself is refused (key, size, owner)
            raise CatalogError(f"cannot write {key} to the DHT: {exc}") from exc
        except Exception as exc:
            raise CatalogError(f"cannot write {key} to the DHT: {exc}", retriable=True) from exc
        self._remember(key, value, None)
        return acks

    async def claim(self, key: str, value: dict[str, Any]) -> dict[str, Any] | None:
        """Write ``key`` unless another participant already owns a different value there;
        returns that other value (the caller refuses), or None when ours is in place."""
        existing = await self.read(key, fresh=True)
        if existing is not None and existing != value:
            owner = existing.get("owner")
            if owner != self.participant:
                return existing
        await self.write(key, {**value, "owner": self.participant}, expiry_s=CATALOG_EXPIRY_S)
        return None

    # typed helpers
    async def publish_participant(self, public_key: bytes) -> None:
        await self.write(
            f"participant:{self.participant}",
            {"name": self.participant, "pk": public_key},
            expiry_s=CATALOG_EXPIRY_S,
        )

    async def publish_peer(
        self,
        node_id: bytes,
        cert: bytes,
        overlay: tuple[str, int],
        api: tuple[str, int],
        engine: bool,
    ) -> None:
        await self.write(
            f"peer:{node_id.hex()}",
            {"cert": cert, "ov": list(overlay), "api": list(api), "eng": engine},
            as_node=True,
            expiry_s=PEER_EXPIRY_S,
        )

    async def place(
        self,
        stream: str,
        node_id: bytes,
        cert: bytes,
        overlay: tuple[str, int],
        api: tuple[str, int],
        lease_s: float,
        mirrors: list[bytes] | None = None,
        moved_to: bytes | None = None,
        epoch: int | None = None,
    ) -> Placement:
        """Write our lease on ``stream``; ``mirrors`` are the peers its tuples are mirrored to
        (a successor taking the stream over carries on mirroring to them); ``epoch``: the
        control plane's epoch of a replicated stream whose primary we are."""
        until = time.time() + lease_s
        await self.write(
            f"place:{stream}",
            {
                "node": node_id,
                "cert": cert,
                "ov": list(overlay),
                "api": list(api),
                "until": until,
                "mirrors": list(mirrors or []),
                **({"moved_to": moved_to} if moved_to is not None else {}),
                **({"epoch": epoch} if epoch is not None else {}),
            },
            as_node=True,
            expiry_s=lease_s,
        )
        return Placement(stream, node_id, overlay, api, until, moved_to, epoch)

    async def placement(self, stream: str, *, fresh: bool = False) -> Placement | None:
        value = await self.read(f"place:{stream}", fresh=fresh)
        if value is None:
            return None
        try:
            return Placement(
                stream,
                bytes(value["node"]),
                (str(value["ov"][0]), int(value["ov"][1])),
                (str(value["api"][0]), int(value["api"][1])),
                float(value["until"]),
                _moved_to(value.get("moved_to")),
                _epoch(value.get("epoch")),
            )
        except (KeyError, IndexError, TypeError, ValueError):
            raise CatalogError(f"placement record of {stream} is malformed") from None

    async def fetch_body(
        self,
        key: str,
        fetch: Callable[[bytes, bytes], Awaitable[bytes | None]],
    ) -> tuple[dict[str, Any], bytes] | None:
        """A ``query:`` record and its body: the record's own ``body`` when it carries one,
        else fetched from one of its providers with ``fetch(provider_node_id, sha256)``;
        checked against its hash either way."""
        pointer = await self.read(key)
        if pointer is None:
            return None
        digest = pointer.get("sha256")
        if not isinstance(digest, bytes):
            raise CatalogError(f"{key} has no body hash")
        inline = pointer.get("body")  # a small body travels in the record itself
        if isinstance(inline, bytes) and hashlib.sha256(inline).digest() == digest:
            return pointer, inline
        for provider in pointer.get("providers", []):
            try:
                body = await fetch(bytes(provider), digest)
            except Exception:  # one provider down: try the next
                continue
            if body is not None and hashlib.sha256(body).digest() == digest:
                return pointer, body
        raise CatalogError(
            f"{key}: no provider of its definition answered with the right body", retriable=True
        )

    def stats(self) -> dict[str, int]:
        return {"cached": len(self._cache), "hits": self.hits, "misses": self.misses}
