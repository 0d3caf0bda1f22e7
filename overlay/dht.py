"""The catalog DHT: the ``kademlia`` library's routing, hardened through its own seams.

Theory of operation
-------------------
``kademlia`` 2.2.3 is used as a routing substrate (see /work/shared/notes/kademlia.md for its
measured defects, D1-D21). Nothing of it is copied; it is extended where it allows:

* :class:`CatalogProtocol` (a ``KademliaProtocol``) takes over datagram dispatch from
  ``rpcudp``, so that a datagram that is not a well-formed request or an expected reply is
  dropped and counted instead of raising in a stray task (D9), and no value is ever logged
  (D17). Every ``rpc_*`` handler checks its arguments; ``rpc_store`` answers whether storage
  accepted the record; replies to our own ``find_*`` calls are sanitised before the
  library's crawlers see them (D4a, D4b). A contact is dropped after three failures in a row,
  not one (D6), and the RPC timeout is ours to set (default 1 s).
* Admission (against D11, Sybil placement): a node's id is ``sha1(raw Ed25519 public key)``.
  Before any contact enters our routing table it must answer ``hello`` with a fresh random
  challenge: its public key (whose SHA-1 must be its id), an opaque certificate, and its
  signature over ``HELLO_DOMAIN + challenge + its id``; then the server's ``admit(node_id,
  pubkey, cert)`` must say yes. Unverified nodes can still query us and be queried during a
  lookup (so a stock ``kademlia`` node can join and *read*), but we never route through them
  nor tell anyone about them. Verified contacts are cached (bounded); failed ones are not
  asked again for a while.
* :class:`~overlay.dht_store.CatalogStorage` is the ``IStorage``: every write path checks
  signature, key, expiry, policy and the owner/sequence rule (D2, D3, D4a, D12, D13).
* :class:`RecordCrawl` (a ``ValueSpiderCrawl``) verifies every value a lookup meets, keeps
  going past forged ones, collects up to ``quorum`` valid records, and never caches by itself;
  :meth:`CatalogServer.get` picks with :func:`~overlay.records.select` and then corrects stale
  or missing copies among the nodes it asked (entry correction).
* :class:`CatalogServer` (a ``Server``) derives its id from its key, returns ack counts and
  tells "absent" (None) from "unreachable" (:class:`DhtUnavailable`) (D7), runs refresh and
  republish on its own intervals in one task it cancels on :meth:`~CatalogServer.stop` (D15,
  D16), and saves neighbours as JSON, never pickle (D8).

Every lookup has an overall deadline (``lookup_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import math
import os
import secrets
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

import umsgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from kademlia.crawling import NodeSpiderCrawl, RPCFindResponse, ValueSpiderCrawl
from kademlia.network import Server
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from overlay.dht_store import FULL, CatalogStorage, policy_refusal
from overlay.records import (
    MAX_RECORD_BYTES,
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

HELLO_DOMAIN = b"fedstream/dht-hello/v1\0"

Admit = Callable[[bytes, bytes, bytes], bool]
"""``admit(node_id, node_pubkey, cert) -> bool``: may this (proven) node join our routing?"""

_ID_BYTES = 20
_REQUEST, _RESPONSE = b"\x00", b"\x01"
_ARITY = {"ping": 1, "store": 3, "find_node": 2, "find_value": 2, "stun": 0, "hello": 2}
_CHALLENGE_BYTES = 32
_REFUSED_RETRY_S = 30.0
_MAX_TASKS = 256
_MAX_STATE_BYTES = 1 << 20


class DhtUnavailable(DhtError):
    """No DHT node answered (or none in time): the network, not the data, is missing."""

    retriable = True


def node_id_of(public_key: bytes) -> bytes:
    """The DHT node id of a raw Ed25519 public key."""
    return hashlib.sha1(public_key).digest()


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _is_id(value: object) -> bool:
    return isinstance(value, bytes) and len(value) == _ID_BYTES


def _is_ip(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


Contact = tuple[bytes, str, int]


def _contact(node: Node) -> Contact:
    return (node.id, node.ip, node.port)


def _within_k(node: Node, target: Node, closest: list[Node], k: int) -> bool:
    """Whether ``node`` belongs among the k closest to ``target``, given the ``closest``
    others known (closest first)."""
    return len(closest) < k or bool(node.distance_to(target) < closest[-1].distance_to(target))


class CatalogProtocol(KademliaProtocol):  # type: ignore[misc]
    """Validated RPCs, admission by signed hello, tolerant contact keeping; see the module
    docstring. ``stats`` counts drops, refusals and verified contacts."""

    def __init__(
        self,
        source_node: Node,
        storage: CatalogStorage,
        ksize: int,
        *,
        node_key: Ed25519PrivateKey,
        cert: bytes,
        admit: Admit,
        wait_timeout_s: float = 1.0,
        max_failures: int = 3,
        max_verified: int = 4096,
        max_pending_hellos: int = 64,
    ) -> None:
        super().__init__(source_node, storage, ksize)
        self._wait_timeout = wait_timeout_s
        self.storage: CatalogStorage = storage
        self.ksize = ksize
        self.node_key = node_key
        self.node_pub = _raw_public(node_key)
        self.cert = cert
        self.admit = admit
        self.max_failures = max_failures
        self.max_verified = max_verified
        self.max_pending_hellos = max_pending_hellos
        self.stats: Counter[str] = Counter()
        self._verified: OrderedDict[Contact, bytes] = OrderedDict()
        self._refused: OrderedDict[Contact, float] = OrderedDict()
        self._pending: dict[Contact, asyncio.Task[bool]] = {}
        self._failures: OrderedDict[bytes, int] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- datagrams (the rpcudp seam) -----------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._closed:
            return
        if len(data) < 22 or data[:1] not in (_REQUEST, _RESPONSE):
            self._drop("short or unknown datagram", addr)
            return
        try:
            body = umsgpack.unpackb(data[21:])
        except Exception:  # umsgpack raises many types on hostile bytes
            self._drop("undecodable datagram", addr)
            return
        msg_id = data[1:21]
        if data[:1] == _RESPONSE:
            self._on_response(msg_id, body, addr)
        else:
            self._on_request(msg_id, body, addr)

    def _on_response(self, msg_id: bytes, body: object, addr: tuple[str, int]) -> None:
        waiting = self._outstanding.pop(msg_id, None)
        if waiting is None:
            self._drop("reply to nothing we asked", addr)
            return
        future, timer = waiting
        timer.cancel()
        if not future.done():  # a lookup past its deadline has cancelled it
            future.set_result((True, body))

    def _on_request(self, msg_id: bytes, body: object, addr: tuple[str, int]) -> None:
        if not (isinstance(body, list) and len(body) == 2 and isinstance(body[1], list)):
            self._drop("malformed request", addr)
            return
        name, args = body
        if not isinstance(name, str) or _ARITY.get(name) != len(args):
            self._drop("unknown rpc or wrong arity", addr)
            return
        try:
            answer = getattr(self, f"rpc_{name}")(addr, *args)
            reply = umsgpack.packb(answer)
        except Exception:  # our bug, not the sender's: keep serving, say so once per request
            log.exception("rpc_%s failed on a request from %s", name, addr)
            self.stats["handler_errors"] += 1
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(_RESPONSE + msg_id + reply, addr)

    def _timeout(self, msg_id: bytes) -> None:
        # Replaces rpcudp's: a missing reply is routine on UDP (no ERROR log), and the future
        # may already be cancelled by a lookup deadline.
        waiting = self._outstanding.pop(msg_id, None)
        if waiting is not None and not waiting[0].done():
            waiting[0].set_result((False, None))

    def _drop(self, why: str, addr: tuple[str, int]) -> None:
        self.stats["datagrams_dropped"] += 1
        log.debug("dropped a datagram from %s: %s", addr, why)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    # -- RPC handlers (every argument checked: the whole network can call these) ---------------

    def rpc_ping(self, sender: tuple[str, int], nodeid: object) -> bytes | None:
        if not _is_id(nodeid):
            self.stats["requests_refused"] += 1
            return None
        answer: bytes = super().rpc_ping(sender, nodeid)
        return answer

    def rpc_store(
        self, sender: tuple[str, int], nodeid: object, key: object, value: object
    ) -> bool:
        if not _is_id(nodeid):
            self.stats["requests_refused"] += 1
            return False
        reason = self.storage.accept(key, value)  # type: ignore[arg-type]  # it checks types
        self.welcome_if_new(Node(nodeid, sender[0], sender[1]))
        self.stats["stores_accepted" if reason is None else "stores_refused"] += 1
        return reason is None

    def rpc_find_node(self, sender: tuple[str, int], nodeid: object, key: object) -> object:
        if not (_is_id(nodeid) and _is_id(key)):
            self.stats["requests_refused"] += 1
            return None
        return super().rpc_find_node(sender, nodeid, key)

    def rpc_find_value(self, sender: tuple[str, int], nodeid: object, key: object) -> object:
        if not (_is_id(nodeid) and _is_id(key)):
            self.stats["requests_refused"] += 1
            return None
        return super().rpc_find_value(sender, nodeid, key)

    def rpc_hello(self, sender: tuple[str, int], nodeid: object, challenge: object) -> object:
        """Prove that we hold the key our id is the hash of: ``[pubkey, cert, signature]``."""
        if not (_is_id(nodeid) and isinstance(challenge, bytes) and 16 <= len(challenge) <= 64):
            self.stats["requests_refused"] += 1
            return None
        signature = self.node_key.sign(HELLO_DOMAIN + challenge + self.source_node.id)
        return [self.node_pub, self.cert, signature]

    # -- our calls: sanitised replies, tolerant failure counting -------------------------------

    async def call_find_node(self, node_to_ask: Node, node_to_find: Node) -> tuple[bool, Any]:
        if self._closed:
            return (False, None)
        ok, answer = await super().call_find_node(node_to_ask, node_to_find)
        return (ok, self._node_list(answer)) if ok else (False, None)

    async def call_find_value(self, node_to_ask: Node, node_to_find: Node) -> tuple[bool, Any]:
        if self._closed:
            return (False, None)
        ok, answer = await super().call_find_value(node_to_ask, node_to_find)
        if not ok:
            return (False, None)
        if isinstance(answer, dict):
            value = answer.get("value")
            if len(answer) == 1 and isinstance(value, bytes) and len(value) <= MAX_RECORD_BYTES:
                return (True, {"value": value})
            self.stats["replies_invalid"] += 1
            return (True, [])
        return (True, self._node_list(answer))

    async def call_store(self, node_to_ask: Node, key: bytes, value: bytes) -> tuple[bool, Any]:
        if self._closed:
            return (False, None)
        result: tuple[bool, Any] = await super().call_store(node_to_ask, key, value)
        return result

    async def call_ping(self, node_to_ask: Node) -> tuple[bool, Any]:
        # The routing table pings a full bucket's head with a bare ensure_future; adopt that
        # task so that stop() cancels it too.
        task = asyncio.current_task()
        if task is not None and task not in self._tasks:
            self._track(task)
        if self._closed:
            return (False, None)
        result: tuple[bool, Any] = await super().call_ping(node_to_ask)
        return result

    def _node_list(self, answer: object) -> list[Contact]:
        if not isinstance(answer, list):
            self.stats["replies_invalid"] += 1
            return []
        nodes = []
        for item in answer[: self.ksize]:
            if (
                isinstance(item, list | tuple)
                and len(item) == 3
                and _is_id(item[0])
                and _is_ip(item[1])
                and type(item[2]) is int
                and 0 < item[2] < 65536
            ):
                if item[0] != self.source_node.id:
                    nodes.append((item[0], item[1], item[2]))
            else:
                self.stats["bad_node_tuples"] += 1
        return nodes

    def handle_call_response(self, result: tuple[bool, Any], node: Node) -> tuple[bool, Any]:
        if result[0]:
            self._failures.pop(node.id, None)
            self.welcome_if_new(node)
            return result
        failures = self._failures.pop(node.id, 0) + 1
        if failures >= self.max_failures:
            self.router.remove_contact(node)
            self.stats["contacts_dropped"] += 1
        else:
            self._failures[node.id] = failures
            while len(self._failures) > self.max_verified:
                self._failures.popitem(last=False)
        return result

    # -- admission -----------------------------------------------------------------------------

    def welcome_if_new(self, node: Node) -> None:
        """Add ``node`` to the routing table once it has proven its id and been admitted
        (right away if it already was); hand it the records it is now closer to."""
        if self._closed or not _is_id(node.id) or node.id == self.source_node.id:
            return
        if not self.router.is_new_node(node):
            return
        contact = _contact(node)
        if contact in self._verified:
            self._verified.move_to_end(contact)
            self._add_contact(node)
        else:
            self._start_hello(node)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_hellos(self) -> int:
        """How many contacts are being asked to prove their id right now."""
        return len(self._pending)

    def is_verified(self, node: Node) -> bool:
        return _contact(node) in self._verified

    async def ensure_verified(self, nodes: Iterable[Node]) -> list[Node]:
        """The ``nodes`` that are (or, within about two RPC timeouts, become) admitted."""
        nodes = [n for n in nodes if n.id != self.source_node.id]
        waits = []
        for node in nodes:
            if not self.is_verified(node):
                task = self._start_hello(node)
                if task is not None:
                    waits.append(task)
        if waits:
            await asyncio.wait(waits, timeout=2 * self._wait_timeout)
        return [n for n in nodes if self.is_verified(n)]

    def _start_hello(self, node: Node) -> asyncio.Task[bool] | None:
        contact = _contact(node)
        pending = self._pending.get(contact)
        if pending is not None:
            return pending
        if self._refused.get(contact, 0.0) > time.monotonic():
            return None
        if len(self._pending) >= self.max_pending_hellos or len(self._tasks) >= _MAX_TASKS:
            self.stats["hellos_skipped"] += 1
            return None
        task = self._spawn(self._hello(node))
        self._pending[contact] = task
        task.add_done_callback(lambda _: self._pending.pop(contact, None))
        return task

    async def _hello(self, node: Node) -> bool:
        challenge = secrets.token_bytes(_CHALLENGE_BYTES)
        ok, answer = await self.hello((node.ip, node.port), self.source_node.id, challenge)
        why = self._check_hello(node, challenge, answer) if ok else "no answer to hello"
        contact = _contact(node)
        if why is not None:
            self.stats["contacts_refused"] += 1
            log.info("not admitting %s at %s:%s: %s", node.id.hex(), node.ip, node.port, why)
            self._refused[contact] = time.monotonic() + _REFUSED_RETRY_S
            while len(self._refused) > self.max_verified:
                self._refused.popitem(last=False)
            return False
        self._verified[contact] = answer[0]
        while len(self._verified) > self.max_verified:
            self._verified.popitem(last=False)
        self.stats["contacts_verified"] += 1
        if self.router.is_new_node(node):
            self._add_contact(node)
        return True

    def _check_hello(self, node: Node, challenge: bytes, answer: object) -> str | None:
        if not (
            isinstance(answer, list)
            and len(answer) == 3
            and all(isinstance(part, bytes) for part in answer)
        ):
            return "malformed hello reply"
        pubkey, cert, signature = answer
        if len(pubkey) != 32 or node_id_of(pubkey) != node.id:
            return "its id is not the hash of its key"
        try:
            Ed25519PublicKey.from_public_bytes(pubkey).verify(
                signature, HELLO_DOMAIN + challenge + node.id
            )
        except (InvalidSignature, ValueError):
            return "bad hello signature"
        try:
            admitted = self.admit(node.id, pubkey, cert)
        except Exception:
            log.exception("admit() failed for %s", node.id.hex())
            admitted = False
        return None if admitted else "not admitted"

    def _add_contact(self, node: Node) -> None:
        handover = [(dkey, raw) for dkey, raw in self.storage if self._hand_over_to(node, dkey)]
        if handover and len(self._tasks) < _MAX_TASKS:
            self._spawn(self._hand_over(node, handover))
        self.router.add_contact(node)

    def _hand_over_to(self, newcomer: Node, dkey: bytes) -> bool:
        # Paper section 2.5: give a newcomer the records it is now among the k closest for,
        # if we are the closest holder we know of. The stored key is already the digest, so
        # it is the target as is (the library digests it a second time: D1).
        target = Node(dkey)
        known = self.router.find_neighbors(target, k=self.ksize)
        if not known:
            return True
        we_hold_closest = self.source_node.distance_to(target) < known[0].distance_to(target)
        return bool(we_hold_closest) and _within_k(newcomer, target, known, self.ksize)

    async def _hand_over(self, node: Node, records: list[tuple[bytes, bytes]]) -> None:
        for dkey, raw in records:
            ok, _ = await self.call_store(node, dkey, raw)
            if not ok:
                return

    # -- tasks ---------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._track(task)
        return task

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("DHT background task failed", exc_info=task.exception())

    def close(self) -> None:
        """Cancel our tasks and settle every call still waiting for a reply."""
        self._closed = True
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no loop running: nothing can be awaiting us
            current = None
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for future, timer in list(self._outstanding.values()):
            timer.cancel()
            if not future.done():
                future.set_result((False, None))
        self._outstanding.clear()


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
