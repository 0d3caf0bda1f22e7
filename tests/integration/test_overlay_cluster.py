"""Peers of three participants, each a separate `peer join` process, form one overlay.

* A query runs on the peer that hosts its input stream (the only one with Spark); events pushed
  to a peer that does not host the stream come out at a subscriber on a third peer, equal to
  the same computation in plain Python.
* Without an engine anywhere, streams spread over the peers by XOR distance; when a host is
  killed (SIGKILL), gossip declares it dead, the next closest peer takes the stream over, the
  catalog says so, and pushes through any peer land there.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.keys import generate
from overlay.membership import MemberInfo, rank, stream_target
from peer.client import Client
from peer.protocol.replies import LookupReply, PushReply, StatusReply
from peer.testing import PeerProcess, collect, members_alive

SCHEMA = {
    "name": "reading",
    "fields": [
        {"name": "sensor", "type": "int"},
        {"name": "temp", "type": "double"},
        {"name": "t", "type": "long"},
    ],
}
QUERY = {
    "name": "hot_query",
    "boxes": [
        {
            "name": "only_hot",
            "type": "filter",
            "inputs": ["readings"],
            "outputs": ["hot_f"],
            "params": {"expression.0": "temp > 30.0"},
        },
        {
            "name": "to_f",
            "type": "map",
            "inputs": ["hot_f"],
            "outputs": ["hot"],
            "params": {
                "expression.0": "sensor",
                "output-field-name.0": "sensor",
                "expression.1": "temp * 9 / 5 + 32",
                "output-field-name.1": "fahrenheit",
                "expression.2": "t",
                "output-field-name.2": "t",
            },
        },
    ],
}
FAST = ("--gossip-interval", "0.3", "--suspect-after", "1.5", "--dead-after", "3")


def participants(root: Path) -> tuple[Path, dict[str, Path]]:
    trust = root / "trust"
    keys = root / "keys"
    made = {}
    for name in ("acme", "globex", "initech"):
        key, pub = generate(name, keys)
        trust.mkdir(exist_ok=True)
        (trust / pub.name).write_bytes(pub.read_bytes())
        made[name] = key
    return trust, made


def peer_args(name: str, keys: dict[str, Path], trust: Path, *extra: str) -> tuple[str, ...]:
    return ("--participant", name, "--key", str(keys[name]), "--trust", str(trust), *extra)


def run(coro: Any, timeout_s: float = 240) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout_s):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def stopper() -> Iterator[list[PeerProcess]]:
    started: list[PeerProcess] = []
    yield started
    for p in started:
        p.stop(30)


@pytest.mark.spark
@pytest.mark.slow
def test_push_anywhere_query_on_host_subscribe_anywhere(
    tmp_path: Path, stopper: list[PeerProcess]
) -> None:
    trust, keys = participants(tmp_path)
    a = PeerProcess(tmp_path / "a", *peer_args("acme", keys, trust, *FAST))
    a.launch()
    stopper.append(a)
    a.wait_ready()
    b = PeerProcess(
        tmp_path / "b",
        *peer_args("globex", keys, trust, "--no-engine", "--bootstrap", a.overlay_addr, *FAST),
    )
    c = PeerProcess(
        tmp_path / "c",
        *peer_args("initech", keys, trust, "--no-engine", "--bootstrap", a.overlay_addr, *FAST),
    )
    for p in (b, c):
        p.launch()
        stopper.append(p)
    for p in (b, c):
        p.wait_ready()

    rng = random.Random(3)
    rows = [
        {"sensor": rng.randrange(20), "temp": round(rng.uniform(0, 45), 2), "t": i}
        for i in range(3000)
    ]

    async def scenario() -> tuple[list[dict[str, Any]], LookupReply, StatusReply]:
        async with Client("127.0.0.1", b.port) as cb, Client("127.0.0.1", c.port) as cc:
            await members_alive(cc, 3)
            await cb.create_schema(SCHEMA)  # schema and stream made on a peer without Spark
            made = await cb.create_stream("readings", "reading")
            assert made["host"] == a.node_id  # the only engine peer hosts it
            submitted = await cc.create_query(QUERY)  # submitted on a third peer
            assert submitted["outputs"] == ["hot"]
            await cc.start_query("hot_query")
            for i in range(0, len(rows), 500):
                reply = await cb.push("readings", {"rows": rows[i : i + 500]})
                assert reply["forwarded"] and reply["count"] == 500
            expected = sum(1 for r in rows if r["temp"] > 30.0)
            got = await collect(cc, "hot", expected, timeout_s=120, settle_s=2.0)
            # the definition is fetched by content hash from the host over a peer link
            query = await cb.lookup_object("hot_query")
            assert query["kind"] == "query" and query["status"] == "RUNNING"
            assert [f["site"] for f in query["fragments"]] == [a.node_id]
            assert [b["name"] for b in query["definition"]["boxes"]] == ["only_hot", "to_f"]
            return got, await cc.lookup_object("readings"), await cb.status()

    got, lookup, status_b = run(scenario())
    expected = sorted(
        (r["sensor"], round(r["temp"] * 9 / 5 + 32, 6), r["t"]) for r in rows if r["temp"] > 30.0
    )
    assert sorted((r["sensor"], round(r["fahrenheit"], 6), r["t"]) for r in got) == expected
    assert len(got) == len(expected)
    assert lookup["host"] == a.node_id
    states = {m["node_id"]: m["state"] for m in status_b["overlay"]["members"]}
    assert states == {a.node_id: "alive", b.node_id: "alive", c.node_id: "alive"}


def test_responsibility_moves_when_the_host_dies(
    tmp_path: Path, stopper: list[PeerProcess]
) -> None:
    trust, keys = participants(tmp_path)
    names = ["acme", "globex", "initech", "acme"]
    # --no-voter: this test is about the unreplicated hosting's take-over (the place: lease)
    plain = ("--no-engine", "--no-voter")
    first = PeerProcess(tmp_path / "p0", *peer_args(names[0], keys, trust, *plain, *FAST))
    first.start()
    stopper.append(first)
    peers = [first]
    for i in range(1, 4):
        p = PeerProcess(
            tmp_path / f"p{i}",
            *peer_args(names[i], keys, trust, *plain, "--bootstrap", first.overlay_addr, *FAST),
        )
        p.launch()
        stopper.append(p)
        peers.append(p)
    for p in peers[1:]:
        p.wait_ready()
    by_id = {p.node_id: p for p in peers}

    def ranked(stream: str, ids: list[str]) -> list[str]:
        fake = [MemberInfo(bytes.fromhex(i), "x", b"", ("h", 1), ("h", 1), False, 1) for i in ids]
        return [m.node_id.hex() for m in rank(stream_target(stream), fake)]

    # a stream whose host is not the bootstrap peer, so that the survivors keep their seed
    stream = next(f"s{i}" for i in range(100) if ranked(f"s{i}", list(by_id))[0] != first.node_id)
    order = ranked(stream, list(by_id))
    host, successor = by_id[order[0]], by_id[order[1]]
    others = [p for p in peers if p not in (host, successor)]

    async def before() -> None:
        async with Client("127.0.0.1", others[0].port) as cl:
            await members_alive(cl, 4)
            await cl.create_schema(SCHEMA)
            made = await cl.create_stream(stream, "reading")
            assert made["host"] == host.node_id
            # a subscription from "latest" on a third peer, accepted before the push: the
            # reply waits until the host has fixed its position, so nothing pushed is missed
            async with Client("127.0.0.1", others[1].port) as cs:
                # the subscriber's peer must know the host too (gossip reaches each in turn)
                await members_alive(cs, 4)
            async with (
                Client("127.0.0.1", others[1].port) as cs,
                await cs.subscribe(stream, start="latest") as sub,
            ):
                reply = await cl.push(stream, {"rows": [{"sensor": 1, "temp": 1.0, "t": 1}]})
                assert reply["forwarded"]
                async with asyncio.timeout(30):
                    batch = await anext(aiter(sub))
                assert batch.rows() == [{"sensor": 1, "temp": 1.0, "t": 1}]

    run(before())
    host.kill()

    async def after() -> LookupReply:
        async with Client("127.0.0.1", others[-1].port) as cl:
            await members_alive(cl, 3, dead=1)
            rows = [{"sensor": 2, "temp": 2.0, "t": t} for t in range(10)]
            reply = await cl.push(stream, {"rows": rows})
            assert reply["count"] == 10
            async with Client("127.0.0.1", successor.port) as cs:
                status = await cs.status()
                assert stream in status["hosted"]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while True:
                info = await cl.lookup_object(stream)
                lease = info["lease"] or {}
                if lease.get("node") == successor.node_id or loop.time() > deadline:
                    return info
                await asyncio.sleep(0.5)

    info = run(after())
    assert info["host"] == successor.node_id
    assert info["lease"]["node"] == successor.node_id  # the catalog says so

    # restarted on its data directory without --bootstrap, the old host rejoins through the
    # neighbours it saved, with its old identity, and leaves the stream with its new host
    again = PeerProcess(
        host.data_dir, *peer_args(names[peers.index(host)], keys, trust, *plain, *FAST)
    )
    again.start()
    stopper.append(again)
    assert again.node_id == host.node_id

    async def rejoined() -> tuple[PushReply, StatusReply]:
        async with Client("127.0.0.1", again.port) as cl:
            await members_alive(cl, 4)
            reply = await cl.push(stream, {"rows": [{"sensor": 3, "temp": 3.0, "t": 99}]})
            return reply, await cl.status()

    reply, status = run(rejoined())
    assert reply.get("forwarded") and stream not in status["hosted"]
