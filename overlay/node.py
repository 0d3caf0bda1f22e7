"""One overlay node: the DHT catalog, peer links and gossip of a peer, under one TaskGroup.

Theory of operation
-------------------
A node listens on one overlay port number: UDP for the Kademlia DHT (:mod:`overlay.dht`) and
TCP for peer links (:mod:`overlay.link`, mutual TLS bound to participant keys). Joining means:
bootstrap the DHT from the ``--bootstrap`` addresses and the neighbours saved by the last run
(tried in turn; JSON, never pickle), gossip once with those addresses to learn the members,
then publish our ``participant:`` and ``peer:`` records.

Every ``gossip_interval_s`` the node bumps its heartbeat and exchanges its membership table
with ``fanout`` random live members (and now and then with a dead one, so that a member back
from the dead is noticed). :class:`~overlay.membership.Membership` decides who is suspect or
dead; the node reports those changes to the peer through ``on_member`` so that the peer can
take over the streams of a dead member.

Requests a peer link brings that are not the overlay's own (``gossip``, ``blob``) go to the
peer's handler: the overlay knows nothing of streams or queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from overlay.catalog import Catalog
from overlay.dht import CatalogServer, DhtUnavailable
from overlay.identity import IdentityError, NodeIdentity, TrustStore, verify_node_cert
from overlay.link import Link, LinkError, LinkPool, LinkServer, LinkSettings
from overlay.membership import Event, MemberInfo, Membership, MemberState, rank, stream_target
from overlay.neighbours import load_neighbours, save_neighbours
from overlay.record_policy import record_refusal
from overlay.records import DhtError, Record
from overlay.tls import TlsContexts
from overlay.transport import refused

__all__ = ["NotAdmitted", "Overlay", "OverlayConfig", "OverlayError", "PeerHandler"]

log = logging.getLogger(__name__)

STATE_FILE = "overlay-state.json"


class OverlayError(Exception):
    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class NotAdmitted(OverlayError):
    """The bootstrap peers answered on the DHT but none took a peer link from this node
    before the bootstrap timeout: they do not trust its participant (or, less likely, their
    link port is unreachable)."""

    def __init__(self, participant: str, seeds: list[tuple[str, int]], reason: str) -> None:
        addresses = ", ".join(f"{h}:{p}" for h, p in seeds)
        super().__init__(
            f"the peers at {addresses} did not admit participant {participant!r} ({reason})",
            retriable=False,
        )
        self.participant = participant
        self.seeds = seeds


@dataclass
class OverlayConfig:
    host: str = "127.0.0.1"
    port: int = 0
    bootstrap: list[tuple[str, int]] = field(default_factory=list)
    bootstrap_timeout_s: float = 30.0
    gossip_interval_s: float = 1.0
    gossip_fanout: int = 2
    suspect_after_s: float = 3.0
    dead_after_s: float = 8.0
    rpc_timeout_s: float = 1.0
    request_timeout_s: float = 30.0
    ksize: int = 20
    links: LinkSettings = field(default_factory=LinkSettings)  # budgets, timeouts, slots


class PeerHandler(Protocol):
    """What a peer serves over links (everything but the overlay's own requests)."""

    async def handle_link(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]: ...

    def stream_link(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...


class Overlay:
    def __init__(
        self,
        identity: NodeIdentity,
        trust: TrustStore,
        config: OverlayConfig,
        data_dir: Path,
        *,
        api: tuple[str, int],
        engine: bool,
        handler: PeerHandler | None = None,
        on_member: Callable[[Event], Awaitable[None]] | None = None,
        on_lookup: Callable[[float], None] | None = None,
    ) -> None:
        """``handler``: what serves the peer's requests over links; ``on_member``: told of
        every member event; ``on_lookup``: told how long each catalog lookup that went to
        the DHT took (seconds)."""
        self.identity = identity
        self.trust = trust
        self.config = config
        self.data_dir = data_dir
        self.api = api
        self.engine = engine
        self.handler = handler
        self.on_member = on_member
        self._on_lookup = on_lookup
        self.incarnation = time.time_ns() // 1000
        self.links: LinkServer | None = None
        self.pool: LinkPool | None = None
        self.dht: CatalogServer | None = None
        self.catalog: Catalog | None = None
        self.membership: Membership | None = None
        self._rng = random.Random()
        self._load: dict[str, float] = {}
        self._pending: list[Event] = []
        self._wake = asyncio.Event()
        self._seeds: list[tuple[str, int]] = []

    # lifecycle
    @property
    def port(self) -> int:
        assert self.links is not None
        return int(self.links.port)

    @property
    def node_id(self) -> bytes:
        return self.identity.node_id

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        await self._listen()
        me = MemberInfo(
            node_id=self.identity.node_id,
            participant=self.identity.participant,
            cert=self.identity.cert,
            overlay=(self.config.host, self.port),
            api=self.api,
            engine=self.engine,
            incarnation=self.incarnation,
        )
        self.membership = Membership(
            me,
            now=time.monotonic(),
            suspect_after_s=self.config.suspect_after_s,
            dead_after_s=self.config.dead_after_s,
            verify=self._verify_member,
        )
        self.catalog = Catalog(
            self._dht(),
            participant=self.identity.participant,
            participant_key=self.identity.participant_key,
            node_key=self.identity.node_key,
            alone=self._alone,
            on_lookup=self._on_lookup,
        )
        await self._join()

    async def _listen(self) -> None:
        """Bind TCP (links) and UDP (DHT) on one port number; with port 0, retry until an
        ephemeral TCP port is free for UDP too."""
        tls = TlsContexts(self.identity, self.trust)
        for _attempt in range(20):
            links = LinkServer(
                self.identity,
                self.trust,
                self,
                host=self.config.host,
                port=self.config.port,
                tls=tls,
                limits=self.config.links,
            )
            await links.start()
            dht = CatalogServer(
                self.identity.node_key,
                self.identity.cert,
                admit=self._admit,
                policy=self.policy,
                storage_path=self.data_dir / "dht.sqlite",
                ksize=self.config.ksize,
                rpc_timeout_s=self.config.rpc_timeout_s,
            )
            try:
                await dht.listen(int(links.port), interface=self.config.host)
            except OSError:
                await links.close()
                dht.stop()
                if self.config.port:
                    raise
                continue
            self.links, self.dht = links, dht
            self.pool = LinkPool(self.identity, self.trust, self, tls=tls, limits=self.config.links)
            await self.pool.start()
            return
        raise OverlayError("no port free for both TCP and UDP after 20 tries")

    async def _join(self) -> None:
        saved = load_neighbours(self.data_dir / STATE_FILE)
        seeds = self._seeds = list(dict.fromkeys([*self.config.bootstrap, *saved]))
        if not seeds:
            await self._publish_self()
            return
        deadline = time.monotonic() + self.config.bootstrap_timeout_s
        while True:
            answered, admitted, refusal, retriable = 0, False, "no reply", True
            with contextlib.suppress(DhtUnavailable):
                answered = await self._dht().bootstrap(seeds)
            for addr in seeds:
                try:
                    await self._gossip_with(addr, None)
                    admitted = True
                except (LinkError, OverlayError, OSError, TimeoutError) as exc:
                    refusal = str(exc) or type(exc).__name__
                    retriable = retriable and getattr(exc, "retriable", True)
            # With --bootstrap, joining needs a peer link: the DHT answers anyone, links not
            if answered and (admitted or not self.config.bootstrap):
                break
            if time.monotonic() >= deadline:
                if answered and retriable:  # e.g. its link port was full: _rejoin goes on
                    log.warning("joining: no peer link yet (%s); retrying", refusal)
                    break
                if answered:
                    raise NotAdmitted(self.identity.participant, seeds, refusal)
                raise OverlayError(
                    "no bootstrap peer answered at "
                    + ", ".join(f"{h}:{p}" for h, p in seeds)
                    + f" within {self.config.bootstrap_timeout_s:.0f} s (a bootstrap address is "
                    "another peer's overlay address: its --overlay HOST:PORT)",
                    retriable=True,
                )
            await asyncio.sleep(1.0)
        await self._publish_self()

    async def _publish_self(self) -> None:
        catalog = self._catalog()
        with contextlib.suppress(Exception):
            await catalog.publish_participant(self.identity.participant_pub)
        with contextlib.suppress(Exception):
            await catalog.publish_peer(
                self.identity.node_id,
                self.identity.cert,
                (self.config.host, self.port),
                self.api,
                self.engine,
            )

    async def run(self) -> None:
        """The overlay's background work (gossip, record renewal); run it in the peer's
        TaskGroup, cancel it to stop."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._gossip_loop())
            tg.create_task(self._republish_loop())

    async def close(self, *, leave: bool = True) -> None:
        if self.membership is not None and leave and self.pool is not None:
            self.membership.leave(time.monotonic())
            targets = self._gossip_targets(self.config.gossip_fanout + 2)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    gossips = (self._gossip_with(m.overlay, m.node_id) for m in targets)
                    await asyncio.gather(*gossips, return_exceptions=True)
        if self.dht is not None:
            self._save_state()
            self.dht.stop()
            self.dht = None
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self.links is not None:
            await self.links.close()
            self.links = None

    def _alone(self) -> bool:
        """No other member known and no DHT contact: a standalone peer."""
        alone = all(m.node_id == self.node_id for m in self.live_members())
        return alone and self._dht().routing_size() == 0

    def _save_state(self) -> None:  # the neighbours for the next start (overlay.neighbours)
        others = [m.overlay for m in self.live_members() if m.node_id != self.node_id]
        save_neighbours(self.data_dir / STATE_FILE, others)

    # policies
    def _admit(self, node_id: bytes, node_pub: bytes, cert: bytes) -> bool:
        try:
            parsed = verify_node_cert(cert, self.trust, time.time())
        except IdentityError:
            return False
        return parsed.node_pub == node_pub

    def _verify_member(self, info: MemberInfo) -> str | None:
        try:
            parsed = verify_node_cert(info.cert, self.trust, time.time())
        except IdentityError as exc:
            return str(exc)
        if parsed.node_id != info.node_id:
            return "member certificate is for another node id"
        if parsed.participant != info.participant:
            return "member participant does not match its certificate"
        return None

    def policy(self, record: Record) -> str | None:
        """Who may sign what (applied by storing nodes and readers): overlay.record_policy."""
        return record_refusal(self.trust, record)

    # membership and routing
    def live_members(self) -> list[MemberInfo]:
        return [] if self.membership is None else self.membership.live()

    def member(self, node_id: bytes) -> MemberInfo | None:
        member = None if self.membership is None else self.membership.get(node_id)
        return None if member is None else member.info

    def is_live(self, node_id: bytes) -> bool:
        if node_id == self.node_id:
            return True
        state = None if self.membership is None else self.membership.state_of(node_id)
        return state in (MemberState.ALIVE, MemberState.SUSPECT)

    async def refuses_connections(self, node_id: bytes, *, timeout_s: float = 0.25) -> bool:
        """Whether the host of member ``node_id`` refuses a connection to its link port: the
        process that listened there is gone (killed, crashed) while its host lives. False
        for an unknown member, a connection made (a process stopped or slow still has its
        port open) and a host that does not answer in ``timeout_s`` (silence decides then)."""
        member = self.member(node_id)
        if member is None or node_id == self.node_id:
            return False
        host, port = member.overlay
        return await refused(host, port, timeout_s=timeout_s)

    def state_of(self, node_id: bytes) -> str | None:
        state = None if self.membership is None else self.membership.state_of(node_id)
        return None if state is None else state.value

    def responsible(self, stream: str, r: int = 1) -> list[MemberInfo]:
        """The live members responsible for ``stream``: XOR-closest to its target among the
        members that run an engine (all live members if none does)."""
        live = self.live_members()
        engines = [m for m in live if m.engine]
        return rank(stream_target(stream), engines or live)[:r]

    def successors(self, stream: str, r: int = 1) -> list[MemberInfo]:
        """The live members that should hold copies of ``stream``, best first: those that run
        an engine XOR-closest to its target, then the others (a copy on a peer without an
        engine keeps the data safe when the engine peers run out)."""
        live = self.live_members()
        target = stream_target(stream)
        engines = rank(target, [m for m in live if m.engine])
        return [*engines, *rank(target, [m for m in live if not m.engine])][:r]

    # links
    async def request(
        self, node_id: bytes, frame: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        info = self.member(node_id)
        if info is None:
            raise OverlayError(f"peer {node_id.hex()[:12]} is not a known member")
        assert self.pool is not None
        return await self.pool.request(
            info.overlay,
            frame,
            node_id=node_id,
            timeout_s=timeout_s or self.config.request_timeout_s,
        )

    async def request_addr(
        self, addr: tuple[str, int], node_id: bytes, frame: dict[str, Any]
    ) -> dict[str, Any]:
        assert self.pool is not None
        return await self.pool.request(
            addr, frame, node_id=node_id, timeout_s=self.config.request_timeout_s
        )

    async def open_stream(
        self, node_id: bytes, frame: dict[str, Any], *, credit: int = 16
    ) -> AsyncIterator[dict[str, Any]]:
        """Items of a stream the remote serves (a subscription relay), credit-controlled."""
        info = self.member(node_id)
        if info is None:
            raise OverlayError(f"peer {node_id.hex()[:12]} is not a known member")
        assert self.pool is not None
        link = await self.pool.link(
            info.overlay, node_id=node_id, timeout_s=self.config.request_timeout_s
        )
        async with link.open_stream(frame, credit=credit) as items:
            async for item in items:
                yield item

    # the link handler (overlay requests first, then the peer's)
    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        op = frame.get("op")
        if op == "gossip":
            return self._on_gossip(frame)
        if op == "blob":
            digest = frame.get("sha256")
            if not isinstance(digest, bytes) or len(digest) != 32:
                raise OverlayError("blob: sha256 must be 32 bytes", retriable=False)
            body = self._dht().storage.get_blob(digest)
            return {"body": body}
        return await self._handler().handle_link(link, frame)

    def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        return self._handler().stream_link(link, frame)

    def _handler(self) -> PeerHandler:
        """The peer's handler (given when the overlay is made); without one, a request gets
        a retriable refusal."""
        if self.handler is None:
            raise OverlayError("this peer is starting; retry")
        return self.handler

    async def fetch_blob(self, node_id: bytes, digest: bytes) -> bytes | None:
        local = self._dht().storage.get_blob(digest)
        if local is not None:
            return bytes(local)
        reply = await self.request(node_id, {"op": "blob", "sha256": digest})
        body = reply.get("body")
        if isinstance(body, bytes):
            self._dht().storage.put_blob(body)
            return body
        return None

    # gossip
    def _on_gossip(self, frame: dict[str, Any]) -> dict[str, Any]:
        membership = self._membership()
        entries = frame.get("members")
        if not isinstance(entries, list):
            raise OverlayError("gossip: members must be a list", retriable=False)
        events = membership.merge(entries, time.monotonic())
        self._dispatch(events)
        return {"members": membership.digest()}

    async def _gossip_with(self, addr: tuple[str, int], node_id: bytes | None) -> None:
        assert self.pool is not None
        membership = self._membership()
        reply = await self.pool.request(
            addr,
            {"op": "gossip", "members": membership.digest()},
            node_id=node_id,
            timeout_s=max(2.0, self.config.gossip_interval_s * 2),
        )
        entries = reply.get("members")
        if isinstance(entries, list):
            self._dispatch(membership.merge(entries, time.monotonic()))

    async def _rejoin(self) -> None:
        """Alone though we had seeds (a failed first gossip, a stall): try them all again."""

        async def seed(addr: tuple[str, int]) -> None:
            # a seed that does not answer (its DHT or its links) is tried again next round:
            # being alone must never end the peer
            with contextlib.suppress(LinkError, OverlayError, DhtError, OSError, TimeoutError):
                if not self._dht().routing_size():
                    await self._dht().bootstrap([addr])
                await self._gossip_with(addr, None)

        with contextlib.suppress(TimeoutError):  # the loop's heartbeats must go on
            async with asyncio.timeout(max(2.0, 2 * self.config.gossip_interval_s)):
                await asyncio.gather(*(seed(addr) for addr in self._seeds))

    def _gossip_targets(self, count: int) -> list[MemberInfo]:
        others = [m for m in self.live_members() if m.node_id != self.node_id]
        chosen = self._rng.sample(others, min(count, len(others)))
        if self.membership is not None and self._rng.random() < 0.1:
            dead = [
                m.info
                for m in self.membership.members()
                if m.state is MemberState.DEAD and m.info.node_id != self.node_id
            ]
            if dead:
                chosen.append(self._rng.choice(dead))
        return chosen

    async def _gossip_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.gossip_interval_s * (0.8 + 0.4 * self._rng.random()))
            membership = self._membership()
            now = time.monotonic()
            membership.beat(now, self.load())
            self._dispatch(membership.tick(now))
            targets = self._gossip_targets(self.config.gossip_fanout)
            if not targets:
                await self._rejoin()
            results = await asyncio.gather(
                *(self._gossip_with(m.overlay, m.node_id) for m in targets),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, Exception):
                    raise result

    def load(self) -> dict[str, float]:
        """Load figures gossiped with each heartbeat (the peer may override via set_load)."""
        return dict(self._load)

    def set_load(self, figures: dict[str, float]) -> None:
        self._load = dict(figures)

    def _dispatch(self, events: list[Event]) -> None:
        protocol = self.dht.protocol if self.dht is not None else None
        for event in events:
            log.info("member %s %s", event.info.node_id.hex()[:12], event.kind)
            if protocol is not None:  # the DHT stops spending lookups on the dead
                if event.kind in ("dead", "left"):
                    protocol.depart(event.info.node_id)
                elif event.kind in ("alive", "joined"):
                    protocol.welcome_back(event.info.node_id, event.info.overlay)
            self._pending.append(event)
        if self._pending:
            self._wake.set()

    async def _republish_loop(self) -> None:
        """Renew our peer record (it expires after 10 min) and hand member events to the
        peer, one at a time, in order."""
        next_publish = time.monotonic() + 180.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_publish - time.monotonic())):
                    await self._wake.wait()
            self._wake.clear()
            joined = False
            while self._pending:
                event = self._pending.pop(0)
                joined = joined or event.kind in ("joined", "alive")
                if self.on_member is None:
                    continue
                try:
                    await self.on_member(event)
                except Exception:
                    log.exception("handling member event %s failed", event.kind)
            if joined:  # a peer killed with -9 must still find its neighbours on restart
                await asyncio.to_thread(self._save_state)
            if time.monotonic() >= next_publish:
                await self._publish_self()
                next_publish = time.monotonic() + 180.0

    # views
    def status(self) -> dict[str, Any]:
        membership = self._membership()
        members = [
            {
                "node_id": m.info.node_id.hex(),
                "participant": m.info.participant,
                "state": m.state.value,
                "overlay": f"{m.info.overlay[0]}:{m.info.overlay[1]}",
                "api": f"{m.info.api[0]}:{m.info.api[1]}",
                "engine": m.info.engine,
                "load": m.info.load,
                "self": m.info.node_id == self.node_id,
            }
            for m in sorted(membership.members(), key=lambda m: m.info.node_id)
        ]
        dht = self._dht()
        return {
            "node_id": self.node_id.hex(),
            "participant": self.identity.participant,
            "overlay": f"{self.config.host}:{self.port}",
            "members": members,
            "dht": {"contacts": dht.routing_size(), **dht.stats},
            "catalog_cache": self._catalog().stats(),
            "gossip_refused": dict(membership.refused),
        }

    def link_stats(self) -> dict[str, int]:
        """Peer links open now (outgoing: opened here; incoming: accepted), and their bytes."""
        pool, server = self.pool, self.links
        out_sent, out_received = pool.traffic() if pool is not None else (0, 0)
        in_sent, in_received = server.traffic() if server is not None else (0, 0)
        return {
            "outgoing": 0 if pool is None else sum(not ln.closed for ln in pool.links.values()),
            "incoming": 0 if server is None else len(server.links),
            "sent_bytes": out_sent + in_sent,
            "received_bytes": out_received + in_received,
        }

    def _dht(self) -> CatalogServer:
        if self.dht is None:
            raise OverlayError("overlay is not started")
        return self.dht

    def _catalog(self) -> Catalog:
        if self.catalog is None:
            raise OverlayError("overlay is not started")
        return self.catalog

    def _membership(self) -> Membership:
        if self.membership is None:
            raise OverlayError("overlay is not started")
        return self.membership
