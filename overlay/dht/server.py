"""The catalog DHT's node: a ``kademlia`` ``Server`` with verified lookups and ack counts.

:class:`CatalogServer` derives its id from its key, returns ack counts and tells "absent"
(None) from "unreachable" (:class:`DhtUnavailable`) (D7); runs refresh and republish on its own
intervals in one task it cancels on :meth:`~CatalogServer.stop` (D15, D16); and saves
neighbours as JSON, never pickle (D8). :class:`RecordCrawl` (a ``ValueSpiderCrawl``) verifies
every value a lookup meets, keeps going past forged ones, collects up to ``quorum`` valid
records and never caches by itself; :meth:`CatalogServer.get` picks with
:func:`~overlay.records.select` and then corrects stale or missing copies among the nodes it
asked (entry correction). Every lookup has an overall deadline (``lookup_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kademlia.crawling import NodeSpiderCrawl, RPCFindResponse, ValueSpiderCrawl
from kademlia.network import Server
from kademlia.node import Node

from overlay.dht.protocol import (
    _MAX_TASKS,
    HELLO_DOMAIN,
    Admit,
    CatalogProtocol,
    _is_id,
    _is_ip,
    _raw_public,
    _within_k,
    node_id_of,
)
from overlay.dht.store import FULL, CatalogStorage, policy_refusal
from overlay.records import (
    DhtError,
    Policy,
    Record,
    RecordError,
    allow_all,
    decode,
    dht_key,
    encode,
    is_lease,
    select,
    sign_record,
    verify,
)

__all__ = [
    "HELLO_DOMAIN",
    "Admit",
    "CatalogProtocol",
    "CatalogServer",
    "DhtError",
    "DhtUnavailable",
    "RecordCrawl",
    "node_id_of",
]

log = logging.getLogger(__name__)

_MAX_STATE_BYTES = 1 << 20


class DhtUnavailable(DhtError):
    """No DHT node answered (or none in time): the network, not the data, is missing."""

    retriable = True


class RecordCrawl(ValueSpiderCrawl):  # type: ignore[misc]
    """A value lookup that verifies every record it meets (signature, key, expiry, policy,
    pinned owner), continues past invalid ones until ``quorum`` valid records are found or
    every close node was asked, and leaves caching to the caller (entry correction)."""

    def __init__(
        self,
        protocol: CatalogProtocol,
        node: Node,
        peers: list[Node],
        ksize: int,
        alpha: int,
        *,
        key: str,
        quorum: int,
        policy: Policy,
        pinned_owner: bytes | None,
    ) -> None:
        super().__init__(protocol, node, peers, ksize, alpha)
        self.key = key
        self.quorum = quorum
        self.policy = policy
        self.pinned_owner = pinned_owner
        self.found: list[tuple[Node, Record]] = []
        self.without_value: list[Node] = []
        self.answered = 0
        self.invalid = 0

    async def _nodes_found(self, responses: dict[bytes, Any]) -> list[tuple[Node, Record]]:
        lost = []
        for peer_id, response in responses.items():
            reply = RPCFindResponse(response)
            peer = self.nearest.get_node(peer_id)
            if not reply.happened():
                lost.append(peer_id)
                continue
            self.answered += 1
            if reply.has_value():
                record = self._valid(reply.get_value())
                if record is None:
                    self.invalid += 1
                else:
                    self.found.append((peer, record))
            else:
                self.without_value.append(peer)
                self.nearest.push(reply.get_node_list())
        self.nearest.remove(lost)
        if len(self.found) >= self.quorum or self.nearest.have_contacted_all():
            return self.found
        found: list[tuple[Node, Record]] = await self.find()
        return found

    def _valid(self, raw: bytes) -> Record | None:
        try:
            record = decode(raw)
            verify(record, self.node.id, time.time())
        except RecordError:
            return None
        if record.key != self.key or policy_refusal(self.policy, record) is not None:
            return None
        if self.pinned_owner is not None and record.owner != self.pinned_owner:
            return None
        return record


class CatalogServer(Server):  # type: ignore[misc]
    """A catalog DHT node (see the module docstring): signed records, admitted contacts."""

    protocol_class = CatalogProtocol
    protocol: CatalogProtocol | None
    storage: CatalogStorage

    def __init__(
        self,
        node_key: Ed25519PrivateKey,
        cert: bytes,
        admit: Admit,
        policy: Policy = allow_all,
        storage_path: str | os.PathLike[str] = ":memory:",
        ksize: int = 20,
        alpha: int = 3,
        rpc_timeout_s: float = 1.0,
        refresh_interval_s: float = 300,
        republish_interval_s: float = 900,
        *,
        lookup_timeout_s: float | None = None,
    ) -> None:
        if min(rpc_timeout_s, refresh_interval_s, republish_interval_s) <= 0:
            raise ValueError("timeouts and intervals must be positive")
        storage = CatalogStorage(storage_path, policy)
        super().__init__(ksize=ksize, alpha=alpha, node_id=node_id_of(_raw_public(node_key)))
        self.storage = storage  # not through Server(storage=...): it tests an empty one falsy
        self.node_key = node_key
        self.cert = cert
        self.admit = admit
        self.policy = policy
        self.rpc_timeout_s = rpc_timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.republish_interval_s = republish_interval_s
        self.lookup_timeout_s = lookup_timeout_s or max(5.0, 6 * rpc_timeout_s)
        self._maintenance: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._seeds: dict[bytes, Node] = {}  # nodes that answered bootstrap, id -> node

    def _create_protocol(self) -> CatalogProtocol:
        protocol: CatalogProtocol = self.protocol_class(
            self.node,
            self.storage,
            self.ksize,
            node_key=self.node_key,
            cert=self.cert,
            admit=self.admit,
            wait_timeout_s=self.rpc_timeout_s,
        )
        return protocol

    # -- life cycle ----------------------------------------------------------------------------

    async def listen(self, port: int = 0, interface: str = "127.0.0.1") -> None:
        """Bind the UDP socket (port 0: any free port) and start maintenance."""
        await super().listen(port, interface)  # ends by calling our refresh_table()
        self.node.ip, self.node.port = self.transport.get_extra_info("sockname")[:2]

    @property
    def port(self) -> int:
        if self.transport is None:
            raise DhtError("the DHT server is not listening")
        port: int = self.transport.get_extra_info("sockname")[1]
        return port

    def refresh_table(self, interval: float | None = None) -> None:
        # The library's listen() calls this to arm its 1-hour timer (whose interval sticks
        # only once, D15); ours runs on our own intervals instead.
        self.start_maintenance()

    def start_maintenance(self) -> None:
        """Start periodic refresh and republish (idempotent; :meth:`listen` does it)."""
        if self._maintenance is None or self._maintenance.done():
            self._maintenance = asyncio.get_running_loop().create_task(self._maintain())

    def stop(self) -> None:
        """Close the socket, cancel every task of this node and close its storage."""
        super().stop()
        if self._maintenance is not None:
            self._maintenance.cancel()
        for task in list(self._background):
            task.cancel()
        if self.protocol is not None:
            self.protocol.close()
        self.storage.close()

    async def _maintain(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time() + self.refresh_interval_s
        next_republish = loop.time() + self.republish_interval_s
        while True:
            await asyncio.sleep(max(0.0, min(next_refresh, next_republish) - loop.time()))
            try:
                if loop.time() >= next_refresh:
                    next_refresh = loop.time() + self.refresh_interval_s
                    await self.refresh()
                if loop.time() >= next_republish:
                    next_republish = loop.time() + self.republish_interval_s
                    await self.republish()
            except Exception:  # maintenance never kills the node
                log.exception("DHT maintenance failed; trying again next interval")

    # -- joining -------------------------------------------------------------------------------

    async def bootstrap(self, addrs: list[tuple[str, int]]) -> int:
        """Join through ``addrs`` (IP literals); returns how many other nodes answered (our
        own address, if listed, is skipped). Raises :class:`DhtUnavailable` if none of the
        others answered."""
        protocol = self._protocol()
        usable = [(a[0], a[1]) for a in addrs if self._usable(a)]
        answers = await asyncio.gather(*(protocol.ping(a, self.node.id) for a in usable))
        nodes = {
            answer: Node(answer, addr[0], addr[1])
            for addr, (ok, answer) in zip(usable, answers, strict=True)
            if ok and _is_id(answer) and answer != self.node.id
        }
        ourselves = sum(1 for ok, answer in answers if ok and answer == self.node.id)
        if not nodes:
            if len(addrs) > ourselves:
                raise DhtUnavailable(f"no DHT node answered at {_addresses(addrs)}")
            return 0
        self._seeds.update(nodes)
        while len(self._seeds) > self.ksize:
            del self._seeds[next(iter(self._seeds))]
        await protocol.ensure_verified(nodes.values())
        found = await self._crawl_nodes(self.node, list(nodes.values()), self.ksize)
        await protocol.ensure_verified(found)
        return len(nodes)

    def _usable(self, addr: object) -> bool:
        if not (isinstance(addr, tuple | list) and len(addr) == 2):
            return False
        host, port = addr
        if not _is_ip(host) or type(port) is not int or not 0 < port < 65536:
            log.warning("skipping bootstrap address %r: not an IP literal and a port", addr)
            return False
        family = self.transport.get_extra_info("socket").family
        if (ipaddress.ip_address(host).version == 6) != (family == socket.AF_INET6):
            log.warning("skipping bootstrap address %r: other IP version than our socket", addr)
            return False
        return True

    def save_state(self, path: str | os.PathLike[str]) -> None:
        """Write our neighbours to ``path`` as JSON (never pickle, D8). With no neighbours the
        file is left as it was (an isolated node keeps the last good list)."""
        contacts = [n for bucket in self._protocol().router.buckets for n in bucket.get_nodes()]
        if not contacts:
            return
        state = {
            "version": 1,
            "node_id": self.node.id.hex(),
            "neighbours": [[n.id.hex(), n.ip, n.port] for n in contacts],
        }
        tmp = Path(f"{os.fspath(path)}.tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)

    async def load_state(self, path: str | os.PathLike[str]) -> int:
        """Bootstrap from the neighbours saved in ``path``; returns how many answered (0 when
        there is no file). Raises :class:`DhtError` for a file that is not a state file, and
        :class:`DhtUnavailable` when none of its neighbours answered."""
        try:
            with open(path, "rb") as file:
                text = file.read(_MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return 0
        try:
            if len(text) > _MAX_STATE_BYTES:
                raise ValueError("file too large")
            state = json.loads(text)
            addrs = [(str(ip), int(port)) for _, ip, port in state["neighbours"]]
        except (ValueError, TypeError, KeyError) as exc:
            raise DhtError(f"{os.fspath(path)} is not a DHT state file: {exc}") from exc
        return await self.bootstrap(list(dict.fromkeys(addrs))) if addrs else 0

    # -- records -------------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        value: bytes,
        signer: Ed25519PrivateKey,
        *,
        expiry_s: float,
        seq: int | None = None,
    ) -> int:
        """Sign ``value`` under ``key`` and store it here and on the k closest admitted nodes;
        returns how many of those acknowledged. ``seq`` defaults to max(last seq we know + 1,
        unix microseconds). Raises :class:`RecordError` for a record this node refuses."""
        now = time.time()
        if seq is None:
            pin = self.storage.pinned(dht_key(key))
            last = pin[1] if pin is not None and pin[0] == _raw_public(signer) else -1
            seq = max(last + 1, time.time_ns() // 1000)
        record = sign_record(key, value, signer, seq, math.ceil(now + expiry_s))
        return await self.put_record(encode(record))

    async def put_record(self, raw: bytes) -> int:
        """Store an already signed record (the same bytes: nothing is re-signed) here and on
        the k closest admitted nodes; returns the number of acks."""
        now = time.time()
        record = decode(raw)
        dkey = dht_key(record.key)
        verify(record, dkey, now)
        reason = self.storage.accept(dkey, raw, now)
        if reason is not None and reason != FULL:
            raise RecordError(reason, record.key)
        targets = [n for n in await self.find_closest(dkey, self.ksize) if n.id != self.node.id]
        acks = await asyncio.gather(*(self._store(n, dkey, raw) for n in targets))
        return sum(acks)

    async def set_digest(self, dkey: bytes, value: bytes) -> bool:
        # The library's own write path (Server.set): only records get through.
        return await self.put_record(value) > 0 if dht_key(decode(value).key) == dkey else False

    async def _store(self, node: Node, dkey: bytes, raw: bytes) -> bool:
        for _attempt in range(2):  # one retry when there was no answer at all
            ok, answer = await self._protocol().call_store(node, dkey, raw)
            if ok:
                return answer is True
        return False

    async def get(
        self, key: str, *, quorum: int = 1, pinned_owner: bytes | None = None
    ) -> Record | None:
        """The newest valid record for ``key`` by the network's account.

        Asks the network until ``quorum`` valid records are found (our own copy is one more
        candidate, never a substitute); only ``pinned_owner``'s records count when given, else
        the owner this node pinned for the key, else the owner most replies agree on. Stale
        or missing copies among the nodes asked are then corrected. Returns None when nodes
        answered and none holds the key; raises :class:`DhtUnavailable` when no node answered
        (or the deadline passed first) and we hold no copy.
        """
        if quorum < 1:
            raise ValueError("quorum must be at least 1")
        protocol = self._protocol()
        dkey = dht_key(key)
        local = self._local_record(dkey)
        if pinned_owner is None and not is_lease(key):
            pin = self.storage.pinned(dkey)
            pinned_owner = pin[0] if pin is not None else None
        target = Node(dkey)
        crawl = RecordCrawl(
            protocol,
            target,
            self._seed_nodes(target),
            self.ksize,
            self.alpha,
            key=key,
            quorum=quorum,
            policy=self.policy,
            pinned_owner=pinned_owner,
        )
        complete = True
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                await crawl.find()
        except TimeoutError:
            complete = False
        protocol.stats["replies_invalid"] += crawl.invalid
        candidates = [record for _, record in crawl.found]
        if local is not None:
            candidates.append(local)
        best = select(candidates, pinned_owner)
        if best is None:
            if crawl.answered and complete:
                return None
            raise DhtUnavailable(
                f"{key}: no DHT node answered" if not crawl.answered else f"{key}: lookup timed out"
            )
        if crawl.answered:
            self._correct(crawl, best, local)
        return best

    def _local_record(self, dkey: bytes) -> Record | None:
        raw = self.storage.get(dkey)
        if raw is None:
            return None
        try:
            record = decode(raw)
            verify(record, dkey, time.time())
        except RecordError:
            return None
        return record if policy_refusal(self.policy, record) is None else None

    def _correct(self, crawl: RecordCrawl, best: Record, local: Record | None) -> None:
        protocol = self._protocol()
        if protocol.closed:  # stopped while the lookup ran
            return
        raw = encode(best)
        dkey = crawl.node.id
        if local is not None and local != best:
            self.storage.accept(dkey, raw)
        closest = {n.id for n in crawl.nearest}
        stale = [n for n, r in crawl.found if r.owner == best.owner and r.seq < best.seq]
        empty = [n for n in crawl.without_value if n.id in closest]
        targets = [n for n in stale + empty if protocol.is_verified(n)][: self.ksize]
        if not targets or len(self._background) >= _MAX_TASKS:
            return
        protocol.stats["entry_corrections"] += len(targets)

        async def send() -> None:
            await asyncio.gather(*(protocol.call_store(n, dkey, raw) for n in targets))

        task = asyncio.get_running_loop().create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- routing -------------------------------------------------------------------------------

    async def find_closest(self, target: bytes, count: int) -> list[Node]:
        """The ``count`` admitted nodes (this one included) closest to ``target`` (20 bytes)
        that answered a lookup, closest first."""
        if not _is_id(target):
            raise ValueError("a DHT target is 20 bytes")
        node = Node(target)
        found = await self._crawl_nodes(node, self._seed_nodes(node), max(count, self.ksize))
        nodes = await self._protocol().ensure_verified(found)
        nodes.append(self.node)
        nodes.sort(key=node.distance_to)
        return nodes[:count]

    async def _crawl_nodes(self, target: Node, seeds: list[Node], count: int) -> list[Node]:
        crawl = NodeSpiderCrawl(self._protocol(), target, seeds, count, self.alpha)
        try:
            async with asyncio.timeout(self.lookup_timeout_s):
                found: list[Node] = await crawl.find()
                return found
        except TimeoutError:
            return [n for n in crawl.nearest if n.id in crawl.nearest.contacted]

    def _seed_nodes(self, target: Node) -> list[Node]:
        nodes: list[Node] = self._protocol().router.find_neighbors(target, k=self.ksize)
        if len(nodes) < self.alpha:
            known = {n.id for n in nodes}
            nodes += [n for n in self._seeds.values() if n.id not in known]
        return nodes

    def routing_size(self) -> int:
        """How many contacts our routing table holds."""
        if self.protocol is None:
            return 0
        return sum(len(bucket) for bucket in self.protocol.router.buckets)

    def contacts(self) -> list[Node]:
        """Every contact of our routing table."""
        if self.protocol is None:
            return []
        return [n for bucket in self.protocol.router.buckets for n in bucket.get_nodes()]

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``datagrams_dropped``, ``contacts_verified``, ``contacts_refused``,
        ``stores_refused``, ``refused.<reason>`` (every refused write, by reason) ..."""
        counters = dict(self.protocol.stats) if self.protocol is not None else {}
        counters.update({f"refused.{k}": n for k, n in self.storage.refusals.items()})
        return counters

    # -- maintenance ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Look ourselves up, and a random id in every bucket untouched for an interval;
        rejoin through the bootstrap nodes if the routing table ran empty. Drops expired
        records."""
        protocol = self._protocol()
        self.storage.purge_expired()
        if not self.routing_size() and self._seeds:
            addrs = [(n.ip, n.port) for n in self._seeds.values()]
            with contextlib.suppress(DhtUnavailable):
                await self.bootstrap(addrs)
            return
        stale_before = time.monotonic() - self.refresh_interval_s
        targets = [self.node.id]
        for bucket in protocol.router.buckets:
            if bucket.last_updated < stale_before:
                low, high = bucket.range[0], min(bucket.range[1], 2**160 - 1)  # D18
                targets.append((low + secrets.randbelow(high - low + 1)).to_bytes(20, "big"))
        for target in targets:
            node = Node(target)
            await protocol.ensure_verified(
                await self._crawl_nodes(node, self._seed_nodes(node), self.ksize)
            )

    async def republish(self, older_than_s: float | None = None) -> int:
        """Send again, unchanged, each record we hold that was last stored more than
        ``older_than_s`` (default: the republish interval) ago and that we are among the k
        closest nodes for. Returns how many were republished."""
        age = self.republish_interval_s if older_than_s is None else older_than_s
        due = [raw for dkey, raw in self.storage.iter_older_than(age) if self._among_closest(dkey)]
        gate = asyncio.Semaphore(4)

        async def one(raw: bytes) -> int:
            async with gate:
                try:
                    await self.put_record(raw)
                except RecordError:  # expired meanwhile, or no longer allowed
                    return 0
                return 1

        done = sum(await asyncio.gather(*(one(raw) for raw in due)))
        self._protocol().stats["republished"] += done
        return done

    def _among_closest(self, dkey: bytes) -> bool:
        target = Node(dkey)
        known = self._protocol().router.find_neighbors(target, k=self.ksize)
        return _within_k(self.node, target, known, self.ksize)

    def _protocol(self) -> CatalogProtocol:
        if self.protocol is None:
            raise DhtError("the DHT server is not listening (call listen() first)")
        return self.protocol


def _addresses(addrs: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in addrs)
