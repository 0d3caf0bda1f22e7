"""The catalog DHT's datagram side: checked RPCs, admission by signed hello, contact keeping.

Theory of operation
-------------------
The ``kademlia`` library's protocol class is extended through its own seams (the D numbers are
its defects, listed in /work/shared/notes/kademlia.md):

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
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import umsgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from kademlia.node import Node
from kademlia.protocol import KademliaProtocol

from overlay.dht.store import CatalogStorage
from overlay.records import MAX_RECORD_BYTES

__all__ = ["HELLO_DOMAIN", "Admit", "CatalogProtocol", "node_id_of"]

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
        # Nodes the overlay's gossip declared dead: left out of routing tables and crawls, so a
        # lookup does not spend an RPC timeout on each of them (until they come back), with the
        # contact each was (None: it was not in our table), to restore on its return.
        self.departed: OrderedDict[bytes, Node | None] = OrderedDict()

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
                if item[0] != self.source_node.id and item[0] not in self.departed:
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

    def depart(self, node_id: bytes) -> None:
        """Gossip says ``node_id`` is dead or gone: drop it from the routing table and skip
        it in crawls until :meth:`welcome_back`."""
        index = self.router.get_bucket_for(Node(node_id))
        contact = None if index is None else self.router.buckets[index].nodes.get(node_id)
        self.departed[node_id] = contact or self.departed.get(node_id)
        while len(self.departed) > self.max_verified:
            self.departed.popitem(last=False)
        self.router.remove_contact(Node(node_id))

    def welcome_back(self, node_id: bytes, address: tuple[str, int] | None = None) -> None:
        """Gossip says ``node_id`` is alive (again): it is a contact once more, at the
        address it had (or ``address``, its overlay address), re-admitted as any newcomer.
        After a stall that made two peers declare each other dead, this is what gives them
        their DHT contacts back (issue 12)."""
        known = self.departed.pop(node_id, None)
        if address is not None and _is_ip(address[0]) and 0 < address[1] < 65536:
            known = Node(node_id, address[0], address[1])
        if known is not None and not self._closed:
            self.welcome_if_new(known)

    def welcome_if_new(self, node: Node) -> None:
        """Add ``node`` to the routing table once it has proven its id and been admitted
        (right away if it already was); hand it the records it is now closer to."""
        if self._closed or not _is_id(node.id) or node.id == self.source_node.id:
            return
        if node.id in self.departed:
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
