"""Requests valid in shape but expensive in content, against two real `peer join --no-engine`
processes (issue 12): each is refused with an error naming the limit, while a concurrent
client's `hello` is answered within 1 s and the attacked peer grows by less than 300 MB.
Pure refusals (names, contract parties, move tars, catalog labels) are in
tests/unit/test_content_limits.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from peer.client import Client
from peer.errors import FedstreamError, InvalidInput, NotFound, QueryError, SqlError, TupleError
from peer.protocol.api import CreateQuery, Push
from peer.protocol.replies import CreateQueryReply, PushReply
from peer.testing import PeerProcess, make_participants, participant_args
from peer.testing.hostile import (
    Watch,
    arrow_bomb,
    big_schema,
    long_schema_name,
    reverse_chain_query,
    wide_filter_query,
)

HELLO_S = 1.0
GROWTH = 300 * 1024 * 1024


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PeerProcess]]:
    root = tmp_path_factory.mktemp("hostile")
    keys = make_participants(root, ("acme", "globex"))
    trust = root / "trust"
    a = PeerProcess(
        root / "a", *participant_args("acme", keys["acme"], trust), "--no-engine", "--http", "off"
    )
    a.start()
    b = PeerProcess(
        root / "b",
        *participant_args("globex", keys["globex"], trust),
        "--bootstrap",
        a.overlay_addr,
        "--no-engine",
        "--http",
        "off",
    )
    try:
        b.start()

        async def setup() -> None:
            async with Client("127.0.0.1", a.port) as client:
                await client.create_schema(
                    {"name": "text", "fields": [{"name": "s", "type": "string"}]}
                )
                await client.create_schema(
                    {"name": "num", "fields": [{"name": "x", "type": "int"}]}
                )
                await client.create_stream("words", "text", replicas=1)
                await client.create_stream("nums", "num", replicas=1)

        run(setup())
        yield {"a": a, "b": b}
    finally:
        b.stop(30)
        a.stop(30)


def run(coro: Any, timeout_s: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def watch(peer: PeerProcess) -> Watch:
    assert peer.proc is not None
    return Watch("127.0.0.1", peer.port, peer.proc.pid)


def assert_absorbed(seen: Watch) -> None:
    assert seen.failures == 0
    assert len(seen.hellos) >= 2 and seen.worst_hello_s < HELLO_S, seen.hellos
    assert seen.rss_growth < GROWTH, seen.rss_growth


@pytest.mark.parametrize("via", ["a", "b"])
def test_a_compressed_arrow_bomb_is_refused_without_inflating(
    peers: dict[str, PeerProcess], via: str
) -> None:
    """9 KB of zstd that inflate to 268 MB, pushed to each peer (one of them hosts the stream,
    the other forwards to it)."""
    body = arrow_bomb()
    assert len(body) < 64 * 1024
    peer = peers[via]

    async def go() -> None:
        async with Client("127.0.0.1", peer.port) as client:
            async with watch(peer) as seen:
                with pytest.raises(TupleError, match=r"push limit of 67108864 bytes") as err:
                    await client._ask(Push("words", {"arrow": body}), PushReply)
            assert err.value.details["limit"] == "max_push_bytes"
            assert_absorbed(seen)
            # the peer still takes a batch, and the refused one left nothing behind
            reply = await client.push("words", pa.table({"s": ["after"]}))
            assert reply["count"] == 1

    run(go())


def test_a_query_sent_as_a_map_is_held_to_the_text_limit(peers: dict[str, PeerProcess]) -> None:
    """1,000 outputs of 3.3 KB expressions: a 3.3 MB map, refused before any checking."""
    peer = peers["a"]

    async def go() -> None:
        async with Client("127.0.0.1", peer.port) as client:
            async with watch(peer) as seen:
                with pytest.raises(QueryError, match="larger than 1048576 bytes") as err:
                    await client.create_query(wide_filter_query("wide", "nums"))
            assert err.value.details["limit"] == "max_query_bytes"
            assert_absorbed(seen)
            narrower = wide_filter_query("wide", "nums", outputs=100)
            with pytest.raises(QueryError, match="more than 64") as err:
                await client.create_query(narrower)
            assert err.value.details["limit"] == "max_arrows_per_box"
            with pytest.raises(NotFound):
                await client.lookup_object("wide")

    run(go())


@pytest.mark.parametrize("via", ["a", "b"])
def test_hostile_sql_is_refused_while_the_peer_answers(
    peers: dict[str, PeerProcess], via: str
) -> None:
    """SQL scripts sent as create_sql frames, which the peer compiles: 1.1 MB of text, 1 MB
    of nesting, 60,000 tokens, a forbidden function, and a chain of 120 views (7,000 SELECTs
    to compile: refused at 1,000), to each peer (b creates through the federation what a
    script declares). The same text sent raw as a create_query
    frame is refused as a definition that is neither XML nor JSON. Meanwhile the peer answers
    hello, and nothing of a refused script is created."""
    peer = peers[via]
    ddl = "CREATE STREAM s (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"
    deep = ddl + "INSERT INTO o SELECT " + "(" * 500_000 + "a" + ")" * 500_000 + " FROM s"
    flood = ddl + "INSERT INTO o SELECT a FROM s WHERE a IN (" + ",1" * 60_000 + ")"
    huge = ddl + "INSERT INTO o SELECT a FROM s WHERE " + " OR ".join(["a = 1"] * 120_000)
    forbidden = ddl + "INSERT INTO o SELECT java_method('java.lang.System', 'exit', 0) AS x FROM s"
    chain = "\n".join(
        ["CREATE VIEW v0 AS SELECT * FROM nums WHERE x > 0;"]
        + [f"CREATE VIEW v{i} AS SELECT * FROM v{i - 1} WHERE x > {i};" for i in range(1, 120)]
        + ["INSERT INTO chained SELECT * FROM v119;"]
    )
    refusals = {
        huge: ("larger than 1048576 bytes", "max_query_bytes"),
        deep: ("more than 50000 tokens", None),
        flood: ("more than 50000 tokens", None),
        forbidden: ("function java_method is not allowed", None),
        chain: ("views expand into more than 1000 SELECTs", "max_sql_selects"),
    }

    async def go() -> None:
        async with Client("127.0.0.1", peer.port, timeout_s=60) as client:
            async with watch(peer) as seen:
                for text, (reason, limit) in refusals.items():
                    with pytest.raises(SqlError, match=reason) as refused:
                        await client.create_query(text, name="hostile")
                    assert refused.value.details.get("limit") == limit
                with pytest.raises(QueryError):
                    await client._ask(CreateQuery(deep), CreateQueryReply)
            assert_absorbed(seen)
            for name in ("hostile", "s", "chained"):
                with pytest.raises(NotFound):
                    await client.lookup_object(name)

    run(go())


def test_a_thousand_box_chain_in_reverse_order_works(peers: dict[str, PeerProcess]) -> None:
    peer = peers["b"]

    async def go() -> None:
        async with Client("127.0.0.1", peer.port) as client:
            async with watch(peer) as seen:
                try:
                    reply = await client.create_query(reverse_chain_query("chain", "nums"))
                except FedstreamError as exc:  # refused cleanly is allowed; internal is not
                    assert exc.code != "internal", exc
                    assert "Recursion" not in str(exc)
                else:
                    assert reply["query"] == "chain", reply
                    found = await client.lookup_object("chain")
                    assert found["kind"] == "query", found
                    assert reply["outputs"] == ["chain_s1000"]
            assert seen.failures == 0 and seen.worst_hello_s < HELLO_S, seen.hellos

    run(go(), 300)


def test_a_schema_the_dht_refuses_leaves_nothing_behind(peers: dict[str, PeerProcess]) -> None:
    peer = peers["a"]

    async def go() -> None:
        async with Client("127.0.0.1", peer.port) as client:
            for schema, limit in ((long_schema_name(), "256 bytes"), (big_schema(), "7600")):
                with pytest.raises(InvalidInput, match=limit) as err:
                    await client.create_schema(schema)
                assert err.value.code == "invalid"
                with pytest.raises(NotFound, match="unknown schema"):
                    await client.create_stream("s_on_" + schema["name"][:8], schema["name"])

    run(go())
