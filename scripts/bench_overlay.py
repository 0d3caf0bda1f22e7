#!/usr/bin/env python3
"""Overlay benchmark: our catalog DHT beside the stock ``kademlia`` library, and any-node push.

Usage (from the repository root)::

    .venv/bin/python scripts/bench_overlay.py                 # full run, ~40-60 min on 2 cores
    .venv/bin/python scripts/bench_overlay.py --quick         # smoke version, ~3 min
    .venv/bin/python scripts/bench_overlay.py --skip-push --sizes 50,100,200 --json dht.json

Part 1, the catalog DHT
-----------------------
N nodes (``--sizes``) run in this process on 127.0.0.1 ephemeral UDP ports, as in
/work/shared/notes/kademlia.md section 6. Two systems, one after the other, on the same
topology (same seed: same node ids, bootstrap contacts, writers, readers and victims):

* *ours*: :class:`overlay.dht.CatalogServer`, RPC timeout 1 s (the peer's default). Every node
  is an admitted member of one participant: its id is sha1 of its node key, its certificate is
  issued by the participant (:func:`overlay.identity.issue_node_cert`), ``admit`` verifies the
  certificate against the trust store (as :class:`overlay.node.Overlay` does) and the storage
  policy is :meth:`overlay.node.Overlay.policy` itself. Records are written and cached through
  :class:`overlay.catalog.Catalog`, as the peer does.
* *stock*: ``kademlia.network.Server`` 2.2.3 with the same node ids, RPC timeout 5 s (its
  default) and, with ``--stock-timeouts 5,1``, again at 1 s.

Phases: join (node i bootstraps to node 0 plus 2 random earlier nodes, one node after
another); ``--keys`` puts of ``stream:`` records (msgpack stream records, the same bytes for
stock) from random nodes; ``--lookups`` sequential uncached lookups of random (node, key) pairs
whose node does not hold the key (a holder pair is skipped and counted: the stock library would
answer it from its own storage); cached lookups (ours: a hit in the node's ``Catalog`` cache;
stock has no cache, its nearest equivalent is a get on a node holding the key, which returns
the local copy); then 30 % of the nodes are stopped (``stop()``: socket closed, no goodbye) and
``--churn-lookups`` lookups from survivors are run twice (pass 1, pass 2, nothing in between).
A lookup succeeds if it returns the value that was put. Every lookup is bounded (ours by its own
lookup deadline, stock by ``--get-limit``).

Part 2, any-node push
---------------------
Three ``peer join --no-engine`` processes (three participants, one ``--trust`` directory; the
second and third bootstrap to the first). A stream is created; ``create_stream``'s reply names
its host. The same Arrow batches (``--batch-rows`` rows of ``(k int, v long, t long)``) are
pushed with ``--inflight`` unacknowledged batches for ``--push-seconds`` per run, (a) to the host
directly and (b) to a peer that does not host the stream (validated there, forwarded over a peer
link, acknowledged after the host's fsync: its reply says ``"forwarded": true``), alternating,
``--push-runs`` runs each after one warm-up run each. Throughput = rows acknowledged / seconds
from the first push to the last ack; latency = push call to ack, per batch.

Everything started here is stopped on the way out (Ctrl-C included): DHT servers in
``finally``, peer processes killed with their process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kademlia.network import Server
from kademlia.utils import digest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc

from contracts.keys import generate
from overlay.catalog import CATALOG_EXPIRY_S, Catalog, CatalogError, unpack
from overlay.dht import CatalogServer, DhtError
from overlay.identity import IdentityError, NodeIdentity, TrustStore, verify_node_cert
from overlay.node import Overlay, OverlayConfig
from overlay.records import dht_key
from peer.client import Client
from peer.testing import PeerProcess

PARTICIPANT = "bench"
CHURN_FRACTION = 0.3
STREAM_SCHEMA: dict[str, Any] = {
    "name": "bench_row",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}

# --------------------------------------------------------------------------- part 1: the DHT


def _key_from(rng: random.Random) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(rng.randbytes(32))


@dataclass
class Topology:
    """What both systems share for one N: identities, who bootstraps to whom, the victims."""

    n: int
    seed: int
    identities: list[NodeIdentity]
    contacts: list[list[int]]  # node i bootstraps to these earlier nodes
    victims: set[int]

    @classmethod
    def make(cls, n: int, seed: int, participant_key: Ed25519PrivateKey) -> Topology:
        rng = random.Random(seed)
        identities = [
            NodeIdentity.create(PARTICIPANT, participant_key, _key_from(rng)) for _ in range(n)
        ]
        contacts: list[list[int]] = [[]]
        for i in range(1, n):
            earlier = range(1, i)
            contacts.append([0, *rng.sample(earlier, min(2, len(earlier)))])
        victims = set(rng.sample(range(n), round(CHURN_FRACTION * n)))
        return cls(n, seed, identities, contacts, victims)


def stream_value(i: int) -> dict[str, Any]:
    """A stream record as the peer writes it (``stream:NAME``)."""
    return {"schema": STREAM_SCHEMA, "derived_from": None, "owner": PARTICIPANT, "i": i}


class _NoPeer:
    """The peer side of an Overlay that is never started (only its policy is used)."""

    async def handle_link(self, link: Any, frame: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def stream_link(self, link: Any, frame: dict[str, Any]) -> Any:
        raise NotImplementedError


class DhtSystem:
    """One DHT implementation under test; subclasses wrap ours and the stock library."""

    label = ""
    timeout_s = 0.0

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.alive: set[int] = set()

    async def start(self, i: int) -> tuple[str, int]:
        raise NotImplementedError

    async def join(self, i: int, addrs: list[tuple[str, int]]) -> None:
        raise NotImplementedError

    async def put(self, i: int, key: str, value: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        """A network lookup of ``key`` from node ``i``; True if it returned ``value``."""
        raise NotImplementedError

    async def cached_get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        raise NotImplementedError

    def holds(self, i: int, key: str) -> bool:
        raise NotImplementedError

    def routing_size(self, i: int) -> int:
        raise NotImplementedError

    def stop(self, i: int) -> None:
        raise NotImplementedError

    def stop_all(self) -> None:
        for i in sorted(self.alive):
            self.stop(i)

    async def settle(self) -> None:
        """Let background work that joining started (hellos, key hand-over) finish."""
        await asyncio.sleep(0.5)

    def stats(self) -> dict[str, int]:
        return {}


class Ours(DhtSystem):
    """overlay.dht.CatalogServer with certificates, the overlay's policy and a Catalog each."""

    label = "ours"

    def __init__(
        self, topo: Topology, participant_key: Ed25519PrivateKey, trust: TrustStore, work: Path
    ) -> None:
        super().__init__(topo)
        self.timeout_s = OverlayConfig().rpc_timeout_s
        self.trust = trust
        # The storage policy is the overlay's own method; the overlay is never started.
        self.overlay = Overlay(
            topo.identities[0],
            trust,
            OverlayConfig(),
            work,
            api=("127.0.0.1", 0),
            engine=False,
            handler=_NoPeer(),
        )
        self.servers: dict[int, CatalogServer] = {}
        self.catalogs: dict[int, Catalog] = {}
        self.participant_key = participant_key

    def admit(self, node_id: bytes, node_pub: bytes, cert: bytes) -> bool:
        # What overlay.node.Overlay admits: a node cert a trusted participant issued for
        # exactly this node key.
        try:
            parsed = verify_node_cert(cert, self.trust, time.time())
        except IdentityError:
            return False
        return parsed.node_pub == node_pub

    async def start(self, i: int) -> tuple[str, int]:
        ident = self.topo.identities[i]
        server = CatalogServer(
            ident.node_key,
            ident.cert,
            admit=self.admit,
            policy=self.overlay.policy,
            rpc_timeout_s=self.timeout_s,
        )
        self.servers[i] = server
        self.alive.add(i)
        await server.listen(0, interface="127.0.0.1")
        self.catalogs[i] = Catalog(
            server,
            participant=PARTICIPANT,
            participant_key=self.participant_key,
            node_key=ident.node_key,
        )
        return ("127.0.0.1", server.port)

    async def join(self, i: int, addrs: list[tuple[str, int]]) -> None:
        await self.servers[i].bootstrap(addrs)

    async def put(self, i: int, key: str, value: dict[str, Any]) -> bool:
        try:
            return await self.catalogs[i].write(key, value, expiry_s=CATALOG_EXPIRY_S) > 0
        except CatalogError:
            return False

    async def get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        # What a Catalog cache miss runs (Catalog.read would hide a failure behind an older
        # cached value, so the DHT is asked directly).
        try:
            record = await self.servers[i].get(key)
        except DhtError:
            return False
        return record is not None and unpack(record.value) == value

    async def cached_get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        catalog = self.catalogs[i]
        hits = catalog.hits
        return await catalog.read(key) == value and catalog.hits == hits + 1

    async def warm_cache(self, i: int, key: str) -> None:
        await self.catalogs[i].read(key, fresh=True)

    def holds(self, i: int, key: str) -> bool:
        return self.servers[i].storage.get(dht_key(key)) is not None

    def routing_size(self, i: int) -> int:
        return self.servers[i].routing_size()

    def stop(self, i: int) -> None:
        if i in self.alive:
            self.alive.discard(i)
            self.servers[i].stop()

    async def settle(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                while any(
                    s.protocol is not None and s.protocol.pending_hellos
                    for i, s in self.servers.items()
                    if i in self.alive
                ):
                    await asyncio.sleep(0.05)
        await super().settle()

    def stats(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for i in self.alive:
            for name, count in self.servers[i].stats.items():
                total[name] = total.get(name, 0) + count
        return total


class Stock(DhtSystem):
    """kademlia.network.Server as shipped (ForgetfulStorage, no admission, no signatures)."""

    label = "stock"

    def __init__(self, topo: Topology, timeout_s: float) -> None:
        super().__init__(topo)
        self.timeout_s = timeout_s
        self.servers: dict[int, Server] = {}

    async def start(self, i: int) -> tuple[str, int]:
        server = Server(ksize=20, alpha=3, node_id=self.topo.identities[i].node_id)
        self.servers[i] = server
        self.alive.add(i)
        await server.listen(0, interface="127.0.0.1")
        server.protocol._wait_timeout = self.timeout_s  # its only knob (notes section 2.5)
        return ("127.0.0.1", int(server.transport.get_extra_info("sockname")[1]))

    async def join(self, i: int, addrs: list[tuple[str, int]]) -> None:
        await self.servers[i].bootstrap(addrs)

    async def put(self, i: int, key: str, value: dict[str, Any]) -> bool:
        try:
            return bool(await self.servers[i].set(key, _packed(value)))
        except ValueError:  # D7: every neighbour it asked was dead
            return False

    async def get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        return bool(await self.servers[i].get(key) == _packed(value))

    async def cached_get(self, i: int, key: str, value: dict[str, Any]) -> bool:
        # No cache: a node holding the key answers from its own storage.
        return await self.get(i, key, value)

    def holds(self, i: int, key: str) -> bool:
        return self.servers[i].storage.get(digest(key)) is not None

    def routing_size(self, i: int) -> int:
        return sum(len(b) for b in self.servers[i].protocol.router.buckets)

    def stop(self, i: int) -> None:
        if i in self.alive:
            self.alive.discard(i)
            self.servers[i].stop()


def _packed(value: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


@dataclass
class Samples:
    """Latencies (seconds) of one phase, with how many operations succeeded."""

    times: list[float] = field(default_factory=list)
    ok: int = 0
    skipped: int = 0  # pairs drawn and skipped (the node held the key)

    def add(self, seconds: float, ok: bool) -> None:
        self.times.append(seconds)
        self.ok += ok

    @property
    def count(self) -> int:
        return len(self.times)

    def q(self, quantile: float) -> float:
        return bc.quantile(np.asarray(self.times), quantile)

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "ok": self.ok,
            "skipped": self.skipped,
            "p50_s": self.q(0.5),
            "p99_s": self.q(0.99),
            "mean_s": float(np.mean(self.times)) if self.times else float("nan"),
            "max_s": max(self.times, default=float("nan")),
        }


async def _timed(op: Awaitable[bool], limit_s: float) -> tuple[float, bool]:
    start = time.perf_counter()
    try:
        async with asyncio.timeout(limit_s):
            ok = await op
    except TimeoutError:
        ok = False
    return time.perf_counter() - start, ok


async def _lookups(
    system: DhtSystem,
    readers: list[int],
    keys: dict[str, dict[str, Any]],
    count: int,
    rng: random.Random,
    limit_s: float,
    *,
    holders: bool = False,
) -> Samples:
    """``count`` sequential lookups of random (reader, key) pairs whose reader does not hold
    the key (``holders``: only pairs whose reader does)."""
    out = Samples()
    names = sorted(keys)
    for _ in range(count):
        for _attempt in range(200):
            i, key = rng.choice(readers), rng.choice(names)
            if system.holds(i, key) == holders:
                break
            out.skipped += 1
        else:
            continue
        seconds, ok = await _timed(system.get(i, key, keys[key]), limit_s)
        out.add(seconds, ok)
    return out


async def run_dht(system: DhtSystem, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase of part 1 on ``system``; stops all of its nodes before returning."""
    topo = system.topo
    result: dict[str, Any] = {
        "system": system.label,
        "n": topo.n,
        "rpc_timeout_s": system.timeout_s,
        "load_before": bc.load_average(),
    }
    limit = args.get_limit
    try:
        addrs = [await system.start(0)]
        joins = Samples()
        began = time.perf_counter()
        for i in range(1, topo.n):
            addrs.append(await system.start(i))
            seconds, _ = await _timed(_join(system, i, [addrs[j] for j in topo.contacts[i]]), 120)
            joins.add(seconds, True)
        result["join_total_s"] = time.perf_counter() - began
        result["join"] = joins.as_dict()
        await system.settle()
        result["routing_mean"] = float(np.mean([system.routing_size(i) for i in system.alive]))

        rng = random.Random(topo.seed + 100)
        keys = {f"stream:s{i}": stream_value(i) for i in range(args.keys)}
        puts = Samples()
        for key, value in keys.items():
            puts.add(*await _timed(system.put(rng.randrange(topo.n), key, value), limit))
        result["put"] = puts.as_dict()
        await system.settle()

        everyone = list(range(topo.n))
        rng = random.Random(topo.seed + 200)
        result["get"] = (await _lookups(system, everyone, keys, args.lookups, rng, limit)).as_dict()

        rng = random.Random(topo.seed + 300)
        cached = Samples()
        names = sorted(keys)
        for _ in range(args.lookups):
            i, key = rng.choice(everyone), rng.choice(names)
            if isinstance(system, Ours):
                await system.warm_cache(i, key)
            elif not system.holds(i, key):
                holders = [j for j in everyone if system.holds(j, key)]
                if not holders:
                    continue
                i = rng.choice(holders)
            cached.add(*await _timed(system.cached_get(i, key, keys[key]), limit))
        result["cached"] = cached.as_dict()

        for i in sorted(topo.victims):
            system.stop(i)
        survivors = sorted(system.alive)
        result["keys_without_live_holder"] = sum(
            1 for key in keys if not any(system.holds(i, key) for i in survivors)
        )
        for name, seed in (("churn1", 400), ("churn2", 500)):
            rng = random.Random(topo.seed + seed)
            began = time.perf_counter()
            samples = await _lookups(system, survivors, keys, args.churn_lookups, rng, limit)
            result[name] = samples.as_dict()
            print(
                f"  {system.label} N={topo.n} {name}: {samples.ok}/{samples.count} ok, "
                f"p50 {_ms(samples.q(0.5))} p99 {_ms(samples.q(0.99))} "
                f"({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        if args.churn_puts:
            rng = random.Random(topo.seed + 600)
            puts = Samples()
            for j in range(args.churn_puts):
                put = system.put(rng.choice(survivors), f"stream:late{j}", stream_value(j))
                puts.add(*await _timed(put, limit))
            result["churn_put"] = puts.as_dict()
        result["stats"] = system.stats()
        result["load_after"] = bc.load_average()
    finally:
        system.stop_all()
    return result


async def _join(system: DhtSystem, i: int, addrs: list[tuple[str, int]]) -> bool:
    await system.join(i, addrs)
    return True


async def dht_part(args: argparse.Namespace, work: Path, errors: list[str]) -> list[dict[str, Any]]:
    seeds = random.Random(args.seed)
    participant_key = _key_from(seeds)
    trust = TrustStore()
    trust.add(PARTICIPANT, participant_key.public_key())
    out = []
    for n in args.sizes:
        topo = Topology.make(n, args.seed + n, participant_key)
        systems: list[DhtSystem] = [Ours(topo, participant_key, trust, work)]
        systems += [Stock(topo, t) for t in args.stock_timeouts]
        for system in systems:
            began = time.perf_counter()
            print(f"DHT N={n}: {system.label}, RPC timeout {system.timeout_s:g} s", flush=True)
            try:
                result = await run_dht(system, args)
            except Exception as exc:  # one system failing must not lose the others' figures
                errors.append(f"DHT N={n} {system.label}: {type(exc).__name__}: {exc}")
                print(f"  FAILED: {errors[-1]}", flush=True)
                continue
            result["elapsed_s"] = time.perf_counter() - began
            out.append(result)
            print(f"  done in {result['elapsed_s']:.0f} s", flush=True)
    return out


# --------------------------------------------------------------------------- part 2: push


@dataclass
class PushRun:
    path: str  # direct | forwarded
    rows: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else float("nan")


def _tables(rows: int, count: int, seed: int) -> list[pa.Table]:
    from peer.model.schema import parse_schema, to_arrow_schema

    schema = to_arrow_schema(parse_schema(STREAM_SCHEMA))
    rng = np.random.default_rng(seed)
    return [
        pa.Table.from_arrays(
            [
                pa.array(rng.integers(0, 100, rows, dtype=np.int32)),
                pa.array(rng.integers(0, 1000, rows, dtype=np.int64)),
                pa.array(np.arange(i * rows, (i + 1) * rows, dtype=np.int64)),
            ],
            schema=schema,
        )
        for i in range(count)
    ]


async def push_run(
    client: Client,
    stream: str,
    tables: list[pa.Table],
    *,
    path: str,
    inflight: int,
    seconds: float,
    meters: dict[str, bc.CpuMeter],
) -> PushRun:
    """Push ``tables`` round-robin for ``seconds``, ``inflight`` unacknowledged at most."""
    run = PushRun(path)
    gate = asyncio.Semaphore(inflight)
    errors: list[BaseException] = []
    last_ack = 0.0

    async def one(table: pa.Table) -> None:
        nonlocal last_ack
        sent = time.perf_counter()
        try:
            reply = await client.push(stream, table)
            if bool(reply.get("forwarded")) != (path == "forwarded"):
                raise RuntimeError(f"{path} push came back with forwarded={reply.get('forwarded')}")
            last_ack = time.perf_counter()
            run.latencies.append(last_ack - sent)
            run.rows += table.num_rows
        except Exception as exc:
            errors.append(exc)
        finally:
            gate.release()

    for meter in meters.values():
        meter.start()
    pending: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < seconds and not errors:
        await gate.acquire()
        task = asyncio.create_task(one(tables[n % len(tables)]))
        n += 1
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=60)
    run.cpu = {name: meter.stop()[0] for name, meter in meters.items()}
    if errors:
        raise errors[0]
    run.seconds = last_ack - start
    return run


def _participants(root: Path) -> tuple[Path, dict[str, Path]]:
    trust = root / "trust"
    trust.mkdir(parents=True, exist_ok=True)
    keys = {}
    for name in ("acme", "globex", "initech"):
        key, pub = generate(name, root / "keys")
        (trust / pub.name).write_bytes(pub.read_bytes())
        keys[name] = key
    return trust, keys


async def _wait_members(client: Client, alive: int, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            status = await client.status()
            if [m["state"] for m in status["overlay"]["members"]].count("alive") >= alive:
                return
            await asyncio.sleep(0.2)


async def push_part(
    args: argparse.Namespace, work: Path, started: list[PeerProcess]
) -> dict[str, Any]:
    load_before = bc.load_average()
    trust, keys = _participants(work / "push")
    names = list(keys)

    def peer(i: int, *extra: str) -> PeerProcess:
        p = PeerProcess(
            work / "push" / f"p{i}",
            "--no-engine",
            "--participant",
            names[i],
            "--key",
            str(keys[names[i]]),
            "--trust",
            str(trust),
            *extra,
        )
        started.append(p)
        return p

    first = peer(0).launch()
    await asyncio.to_thread(first.wait_ready, 120)
    others = [peer(i, "--bootstrap", first.overlay_addr).launch() for i in (1, 2)]
    for p in others:
        await asyncio.to_thread(p.wait_ready, 120)
    peers = [first, *others]
    async with Client("127.0.0.1", first.port) as admin:
        await _wait_members(admin, 3)
        await admin.create_schema(STREAM_SCHEMA)
        made = await admin.create_stream("pushed", STREAM_SCHEMA["name"])
    host = next(p for p in peers if p.node_id == made["host"])
    forwarder = next(p for p in peers if p is not host)
    print(
        f"push: stream hosted by {host.node_id[:12]} (API port {host.port}); forwarding through "
        f"{forwarder.node_id[:12]} (API port {forwarder.port})",
        flush=True,
    )
    tables = _tables(args.batch_rows, 16, seed=args.seed)
    assert host.proc is not None and forwarder.proc is not None
    meters = {
        "host": bc.CpuMeter(host.proc.pid),
        "forwarder": bc.CpuMeter(forwarder.proc.pid),
        "client": bc.CpuMeter(os.getpid(), with_children=False),
    }
    runs: list[PushRun] = []
    async with (
        Client("127.0.0.1", host.port) as direct,
        Client("127.0.0.1", forwarder.port) as forwarded,
    ):
        clients = {"direct": direct, "forwarded": forwarded}
        order = ["direct", "forwarded"]
        for round_ in range(args.push_runs + 1):  # round 0 warms up both paths
            for path in order if round_ % 2 == 0 else order[::-1]:
                run = await push_run(
                    clients[path],
                    "pushed",
                    tables,
                    path=path,
                    inflight=args.inflight,
                    seconds=args.push_seconds if round_ else min(3.0, args.push_seconds),
                    meters=meters,
                )
                print(
                    f"  {'warm-up' if round_ == 0 else f'run {round_}'} {path}: "
                    f"{run.rate:,.0f} rows/s, ack p50 {_ms(_q(run.latencies, 0.5))} "
                    f"p99 {_ms(_q(run.latencies, 0.99))}",
                    flush=True,
                )
                if round_:
                    runs.append(run)
        status = await forwarded.status()
    return {
        "load_before": load_before,
        "load_after": bc.load_average(),
        "host": host.node_id,
        "forwarder": forwarder.node_id,
        "forwarded_count": status.get("forwarded"),
        "runs": [
            {
                "path": r.path,
                "rows": r.rows,
                "seconds": r.seconds,
                "rate": r.rate,
                "p50_s": _q(r.latencies, 0.5),
                "p99_s": _q(r.latencies, 0.99),
                "latencies": r.latencies,
                "cpu": r.cpu,
            }
            for r in runs
        ],
    }


# --------------------------------------------------------------------------- report


def _q(values: list[float], quantile: float) -> float:
    return bc.quantile(np.asarray(values), quantile)


def _ms(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1e3:.0f} ms"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e3:.2f} ms"


def _pair(d: dict[str, Any]) -> str:
    return f"{_ms(d['p50_s'])} / {_ms(d['p99_s'])}"


def _success(d: dict[str, Any]) -> str:
    return f"{100 * d['ok'] / d['count']:.0f} %" if d["count"] else "n/a"


def dht_table(results: list[dict[str, Any]]) -> str:
    header = [
        "N",
        "system (RPC timeout)",
        "join all",
        "join p50 / p99",
        "put p50 / p99 (ok)",
        "uncached lookup p50 / p99 (ok)",
        "cached lookup p50 / p99",
        "30 % killed, pass 1: ok, p50 / p99",
        "pass 2: ok, p50 / p99",
        "load (1 min) before / after",
    ]
    late = any("churn_put" in r for r in results)
    if late:
        header.append("put after the kill p50 / p99 (ok)")
    rows = []
    for r in results:
        rows.append(
            [
                str(r["n"]),
                f"{r['system']} ({r['rpc_timeout_s']:g} s)",
                f"{r['join_total_s']:.2f} s",
                _pair(r["join"]),
                f"{_pair(r['put'])} ({_success(r['put'])})",
                f"{_pair(r['get'])} ({_success(r['get'])})",
                _pair(r["cached"]) + ("" if r["system"] == "ours" else " (local copy)"),
                f"{_success(r['churn1'])}, {_pair(r['churn1'])}",
                f"{_success(r['churn2'])}, {_pair(r['churn2'])}",
                f"{r['load_before'].split()[0]} / {r['load_after'].split()[0]}",
            ]
        )
        if late:
            put = r.get("churn_put")
            rows[-1].append(f"{_pair(put)} ({_success(put)})" if put else "-")
    return bc.md_table(header, rows)


def dht_aims(results: list[dict[str, Any]]) -> str:
    ours = [r for r in results if r["system"] == "ours"]
    if not ours:
        return ""
    largest = max(ours, key=lambda r: r["n"])
    worst_cached = max(ours, key=lambda r: r["cached"]["p99_s"])
    churn = [(r, p) for r in ours for p in ("churn1", "churn2")]
    all_ok = all(r[p]["ok"] == r[p]["count"] for r, p in churn)
    worst = max(churn, key=lambda rp: rp[0][rp[1]]["p99_s"])
    rows = [
        [
            "cached lookup under 1 ms",
            f"p99 at most {_ms(worst_cached['cached']['p99_s'])} (N = {worst_cached['n']})",
            _met(worst_cached["cached"]["p99_s"] < 1e-3),
        ],
        [
            f"uncached p50 under 5 ms at {largest['n']} peers",
            f"{_ms(largest['get']['p50_s'])} (p99 {_ms(largest['get']['p99_s'])})",
            _met(largest["get"]["p50_s"] < 5e-3),
        ],
        [
            "after 30 % killed every read succeeds",
            ", ".join(f"N={r['n']} {p[-1]}: {r[p]['ok']}/{r[p]['count']}" for r, p in churn),
            _met(all_ok),
        ],
        [
            "after 30 % killed p99 under 2 s",
            f"worst {_ms(worst[0][worst[1]]['p99_s'])} (N = {worst[0]['n']}, pass {worst[1][-1]})",
            _met(worst[0][worst[1]]["p99_s"] < 2.0),
        ],
    ]
    return bc.md_table(["aim (ours)", "measured", "status"], rows)


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def push_table(result: dict[str, Any]) -> str:
    by_path: dict[str, list[dict[str, Any]]] = {"direct": [], "forwarded": []}
    for run in result["runs"]:
        by_path[run["path"]].append(run)
    rows = []
    rates = {}
    for path, runs in by_path.items():
        lat = [x for r in runs for x in r["latencies"]]
        rates[path] = float(np.median([r["rate"] for r in runs]))
        cpu = {k: float(np.mean([r["cpu"][k] for r in runs])) for k in runs[0]["cpu"]}
        rows.append(
            [
                path if path == "direct" else "forwarded (non-host peer)",
                str(len(runs)),
                f"{rates[path]:,.0f}",
                " / ".join(f"{r['rate'] / 1e3:.0f}k" for r in runs),
                f"{_ms(_q(lat, 0.5))} / {_ms(_q(lat, 0.99))}",
                f"{cpu['host']:.2f} / {cpu['forwarder']:.2f} / {cpu['client']:.2f}",
            ]
        )
    header = [
        "push to",
        "runs",
        "rows/s (median)",
        "rows/s per run",
        "ack p50 / p99 (all batches)",
        "cores: host / non-host / client",
    ]
    ratio = rates["forwarded"] / rates["direct"]
    return (
        bc.md_table(header, rows)
        + f"\n\nLoad average (1 min) before / after: {result['load_before'].split()[0]} / "
        f"{result['load_after'].split()[0]}."
        + f"\n\nForwarded / direct throughput: **{ratio:.2f}x** (forwarding costs "
        f"{100 * (1 - ratio):.0f} % of direct throughput; aim: under 20 %, "
        f"{_met(ratio > 0.8)})."
    )


def report(results: dict[str, Any], args: argparse.Namespace) -> str:
    info = results["machine"]
    out = [
        f"Machine: {info['nproc']} cores, {info['cpu']}, {info['ram_gib']} GiB RAM, Linux "
        f"{info['kernel']}; Python {info['python']}; {info['date']}",
        f"Load average before: {results['load_before']}, after: {results['load_after']}; "
        f"busiest other processes before: {results['busy_before'] or 'none'}",
        f"Command: {results['command']}",
    ]
    if results.get("dht"):
        out.append(
            f"\n### Catalog DHT: {args.keys} keys, {args.lookups} lookups, "
            f"{args.churn_lookups} lookups per pass after 30 % were killed\n"
        )
        out.append(dht_table(results["dht"]))
        out.append("\n" + dht_aims(results["dht"]))
    if results.get("push"):
        push = results["push"]
        out.append(
            f"\n### Any-node push: batches of {args.batch_rows} rows, {args.inflight} in flight, "
            f"{args.push_runs} runs of {args.push_seconds:g} s per path, alternating\n"
        )
        out.append(push_table(push))
    for error in results["errors"]:
        out.append(f"\n**Failed**: {error}")
    if results["loop_errors"]:
        out.append(f"\nUnhandled event-loop errors: {results['loop_errors']}")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    p.add_argument("--sizes", help="DHT sizes, comma-separated (default 50,100,200)")
    p.add_argument(
        "--stock-timeouts",
        help="stock RPC timeouts in s (default 5,1; quick: 5; empty: no stock run)",
    )
    p.add_argument("--keys", type=int, help="records put (default 100)")
    p.add_argument("--lookups", type=int, help="uncached and cached lookups (default 200)")
    p.add_argument("--churn-lookups", type=int, help="lookups per pass after the kill (100)")
    p.add_argument(
        "--churn-puts", type=int, default=0, help="puts from survivors after the kill (0: none)"
    )
    p.add_argument("--get-limit", type=float, default=60.0, help="bound on one operation, s")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--batch-rows", type=int, default=1000)
    p.add_argument("--inflight", type=int, default=4, help="unacknowledged pushes")
    p.add_argument("--push-seconds", type=float, help="seconds per push run (default 10)")
    p.add_argument("--push-runs", type=int, help="measured runs per path (default 4)")
    p.add_argument("--skip-dht", action="store_true")
    p.add_argument("--skip-push", action="store_true")
    p.add_argument("--json", help="write all measurements to this file")
    p.add_argument("--work-dir", help="where peer data goes (default: a temp dir, removed)")
    args = p.parse_args(argv)
    quick = args.quick
    args.sizes = [int(x) for x in (args.sizes or ("30" if quick else "50,100,200")).split(",")]
    if args.stock_timeouts is None:
        args.stock_timeouts = "5" if quick else "5,1"
    args.stock_timeouts = [float(x) for x in args.stock_timeouts.split(",") if x]
    args.keys = args.keys or (20 if quick else 100)
    args.lookups = args.lookups or (30 if quick else 200)
    args.churn_lookups = args.churn_lookups or (20 if quick else 100)
    args.push_seconds = args.push_seconds or (3.0 if quick else 10.0)
    args.push_runs = args.push_runs or (2 if quick else 4)
    return args


async def main_async(
    args: argparse.Namespace, work: Path, started: list[PeerProcess]
) -> dict[str, Any]:
    loop_errors: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _, ctx: loop_errors.append(str(ctx.get("exception") or ctx.get("message")))
    )
    results: dict[str, Any] = {
        "machine": bc.machine_info(),
        "load_before": bc.load_average(),
        "busy_before": bc.busy_processes(exclude={os.getpid()}),
        "command": " ".join([".venv/bin/python scripts/bench_overlay.py", *sys.argv[1:]]),
        "errors": [],
        "loop_errors": loop_errors,
    }
    print(f"load average {results['load_before']}; busiest: {results['busy_before']}", flush=True)
    began = time.monotonic()
    if not args.skip_dht:
        results["dht"] = await dht_part(args, work, results["errors"])
    if not args.skip_push:
        try:
            results["push"] = await push_part(args, work, started)
        except Exception as exc:
            results["errors"].append(f"push: {type(exc).__name__}: {exc}")
        finally:
            for p in started:
                await asyncio.to_thread(p.stop, 20)
    results["load_after"] = bc.load_average()
    results["elapsed_s"] = time.monotonic() - began
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The stock library logs every RPC timeout at ERROR: thousands of lines under churn.
    logging.getLogger("rpcudp").setLevel(logging.CRITICAL)
    logging.getLogger("kademlia").setLevel(logging.CRITICAL)
    started: list[PeerProcess] = []
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fedstream-bench-overlay-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = asyncio.run(main_async(args, work, started))
    except BaseException:
        print(f"benchmark failed: peer logs kept in {work}", flush=True)
        raise
    finally:
        for p in started:  # Ctrl-C, or a failure on the way: no peer outlives us
            p.kill()
    if results["errors"]:
        print(f"errors: {results['errors']}; peer logs kept in {work}", flush=True)
    elif not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    text = report(results, args)
    print("\n" + text)
    print(f"\nelapsed {results['elapsed_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(bc.jsonable(results), indent=1))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
