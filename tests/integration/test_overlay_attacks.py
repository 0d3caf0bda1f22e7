"""Attacks on real `peer join --no-engine` processes, each refused while the peers keep serving,
and a stock kademlia node reading the catalog.

The attacker speaks the DHT's own protocol through a stock ``kademlia.network.Server`` (so a
refusal is the peers' doing, not a client's) and opens TLS links with keys of its own.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from kademlia.network import Server
from kademlia.node import Node

from contracts.keys import load_private
from overlay.identity import NodeIdentity, TrustStore
from overlay.link import LinkError, LinkPool
from overlay.records import DOMAIN, decode, dht_key, encode, sign_record
from peer.client import Client
from peer.errors import AlreadyExists, NotFound
from peer.protocol.replies import LookupReply
from peer.testing import PeerProcess, make_participants, participant_args

SCHEMA = {"name": "reading", "fields": [{"name": "x", "type": "int"}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("attacks")
    keys = make_participants(root, ("acme", "globex"))
    trust = root / "trust"
    a = PeerProcess(root / "a", *participant_args("acme", keys["acme"], trust), "--no-engine")
    a.start()
    b = PeerProcess(
        root / "b",
        *participant_args("globex", keys["globex"], trust),
        "--bootstrap",
        a.overlay_addr,
        "--no-engine",
    )
    try:
        b.start()

        async def setup() -> None:
            async with Client("127.0.0.1", a.port) as client:
                await client.create_schema(SCHEMA)

        asyncio.run(asyncio.wait_for(setup(), 60))
        yield {"a": a, "b": b, "keys": keys, "trust": trust, "root": root}
    finally:
        b.stop(30)
        a.stop(30)


def run(coro: Any, timeout_s: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def stock_node(*peers: PeerProcess) -> Server:
    server = Server()
    await server.listen(0, interface="127.0.0.1")
    await server.bootstrap([("127.0.0.1", p.overlay_port) for p in peers])
    return server


async def read_schema(peer: PeerProcess) -> LookupReply:
    async with Client("127.0.0.1", peer.port) as client:
        return await client.lookup_object("reading")


async def store_everywhere(server: Server, key: str, raw: bytes) -> list[Any]:
    """STORE ``raw`` under ``key`` on every overlay node the stock node knows; the answers."""
    nodes = server.protocol.router.find_neighbors(Node(dht_key(key)))
    return [(await server.protocol.call_store(n, dht_key(key), raw))[1] for n in nodes]


def genuine_record(cluster: dict[str, Any]) -> bytes:
    async def go() -> bytes:
        server = await stock_node(cluster["a"], cluster["b"])
        try:
            raw = await server.get("schema:reading")
            assert isinstance(raw, bytes)
            return raw
        finally:
            server.stop()

    result: bytes = run(go())
    return result


def test_stock_kademlia_node_reads_a_record_that_verifies_with_cryptography(
    cluster: dict[str, Any],
) -> None:
    raw = genuine_record(cluster)
    fields = msgpack.unpackb(raw)
    signed = DOMAIN + msgpack.packb(
        [fields["k"], fields["v"], fields["o"], fields["s"], fields["e"]]
    )
    Ed25519PublicKey.from_public_bytes(fields["o"]).verify(fields["sig"], signed)  # no raise
    acme = load_private(cluster["keys"]["acme"]).public_key()
    assert Ed25519PublicKey.from_public_bytes(fields["o"]).public_bytes_raw() == (
        acme.public_bytes_raw()
    )
    assert msgpack.unpackb(fields["v"])["schema"]["name"] == "reading"


def test_forged_overwrite_replay_oversize_and_junk_are_refused(cluster: dict[str, Any]) -> None:
    genuine = decode(genuine_record(cluster))
    globex = load_private(cluster["keys"]["globex"])
    stranger = Ed25519PrivateKey.generate()
    evil_value = msgpack.packb({"schema": {"name": "reading", "fields": []}, "owner": "acme"})
    forged = encode(genuine.__class__(**{**genuine.__dict__, "value": evil_value}))  # bad sig
    non_owner = encode(
        sign_record(genuine.key, evil_value, globex, genuine.seq + 1, genuine.expiry)
    )
    outsider = encode(
        sign_record(genuine.key, evil_value, stranger, genuine.seq + 1, genuine.expiry)
    )
    acme = load_private(cluster["keys"]["acme"])
    older = encode(sign_record(genuine.key, evil_value, acme, genuine.seq - 1, genuine.expiry))
    # validly signed, but above the record size cap (and under the library's 8 KiB request cap)
    big = ["schema:big", b"x" * 7700, acme.public_key().public_bytes_raw(), 1, genuine.expiry]
    oversized = msgpack.packb(
        {**dict(zip("kvose", big, strict=True)), "sig": acme.sign(DOMAIN + msgpack.packb(big))}
    )

    async def attack() -> list[list[Any]]:
        server = await stock_node(cluster["a"], cluster["b"])
        try:
            answers = [
                await store_everywhere(server, genuine.key, raw)
                for raw in (forged, non_owner, outsider, older)
            ]
            answers.append(await store_everywhere(server, "schema:big", oversized))
            return answers
        finally:
            server.stop()

    answers = run(attack())
    assert all(a is not True for row in answers for a in row)  # no node accepted any
    assert all(row for row in answers)  # and each attack reached the nodes
    # an oversized datagram and plain junk, sent raw to both peers' DHT ports
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for peer in (cluster["a"], cluster["b"]):
            for junk in (os.urandom(9000), b"\x00" * 21, b"\x00" + os.urandom(20) + b"\xc1"):
                sock.sendto(junk, ("127.0.0.1", peer.overlay_port))
    for peer in (cluster["a"], cluster["b"]):  # both still serve, with the genuine schema
        info = run(read_schema(peer))
        assert info["kind"] == "schema" and info["schema"]["fields"][0]["name"] == "x"
    assert decode(genuine_record(cluster)).value == genuine.value

    async def big_absent() -> Any:
        async with Client("127.0.0.1", cluster["b"].port) as client:
            return await client.lookup_object("big")

    with pytest.raises(NotFound):
        run(big_absent())


def test_non_owner_participant_cannot_take_a_name_through_the_api(
    cluster: dict[str, Any],
) -> None:
    async def go() -> None:
        async with Client("127.0.0.1", cluster["b"].port) as client:  # a globex peer
            with pytest.raises(AlreadyExists):
                await client.create_schema(
                    {"name": "reading", "fields": [{"name": "y", "type": "long"}]}
                )

    run(go())
    assert run(read_schema(cluster["a"]))["schema"]["fields"][0]["name"] == "x"


def test_link_from_a_key_outside_the_federation_is_refused(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    outsider = NodeIdentity.create("mallory", Ed25519PrivateKey.generate())
    # mallory trusts the peers' participants, but they do not trust mallory
    trust = TrustStore()
    trust.load_dir(cluster["trust"])
    trust.add("mallory", outsider.participant_pub)
    peer = cluster["a"]

    async def go() -> None:
        async with LinkPool(outsider, trust) as pool:
            with pytest.raises(LinkError):
                await pool.request(
                    ("127.0.0.1", peer.overlay_port), {"op": "gossip", "members": []}, timeout_s=10
                )

    run(go())
    assert run(read_schema(peer))["kind"] == "schema"  # and the peer keeps serving
