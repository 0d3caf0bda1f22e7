"""The ``create_sql`` frame (docs/protocol.md): its codec, and the peer compiling a script
and creating it through a real LocalSite, driven by the real Client over an in-memory network
(no sockets, no JVM). Refused scripts create nothing; a slow compile runs in the server's
compile threads while the peer answers other requests, and is refused when its time is up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from overlay.errors import RemoteProtocolError
from overlay.transport import MemoryNetwork
from peer.client import Client
from peer.errors import InvalidInput, NotFound, SqlError
from peer.model.query import parse_query, query_to_dict
from peer.model.schema import parse_schema
from peer.model.sql import compile_script
from peer.protocol.api import CreateSql, decode_request
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateSqlReply,
    CreateStreamReply,
    LookupReply,
    SetQueryStatusReply,
    decode_result,
)
from peer.server import ApiServer
from peer.server.sql_scripts import MAX_LOOKUPS
from peer.site import LocalSite, SiteConfig
from peer.testing import run_async

NETWORK = MemoryNetwork()
PEOPLE = {
    "name": "person",
    "fields": [{"name": "person_name", "type": "string"}, {"name": "person_id", "type": "int"}],
}
SCRIPT = """\
CREATE STREAM bids (auction BIGINT NOT NULL, price BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL,
  WATERMARK FOR t AS t - INTERVAL '1' SECOND);
CREATE QUERY hot AS
INSERT INTO hot_auctions SELECT window_start, auction, COUNT(*) AS n
FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(t), INTERVAL '10' SECOND))
GROUP BY window_start, window_end, auction;
CREATE QUERY mrx AS INSERT INTO MrX SELECT * FROM people WHERE person_id = 2;
"""


# -- the codec --------------------------------------------------------------------------------


def test_create_sql_round_trips_and_leaves_defaults_off_the_wire() -> None:
    plain = CreateSql("INSERT INTO o SELECT a FROM s")
    assert plain.to_wire(7) == {
        "type": "create_sql",
        "id": 7,
        "sql": "INSERT INTO o SELECT a FROM s",
        "name": "query",
    }
    full = CreateSql("SELECT 1", "q", True, "run1_")
    assert decode_request(full.to_wire(3)) == full
    assert decode_request({"type": "create_sql", "id": 1, "sql": "x"}) == CreateSql("x")


@pytest.mark.parametrize(
    ("frame", "argument"),
    [
        ({}, "sql"),
        ({"sql": b"INSERT"}, "sql"),
        ({"sql": ""}, "sql"),
        ({"sql": "x", "start": 1}, "start"),
        ({"sql": "x", "name": ["q"]}, "name"),
        ({"sql": "x", "name": "q" * 2000}, "name"),
        ({"sql": "x", "namespace": "n" * 2000}, "namespace"),
    ],
)
def test_a_bad_create_sql_frame_names_its_argument(frame: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        decode_request({"type": "create_sql", "id": 1, **frame})
    assert refused.value.details["argument"] == argument


def test_the_reply_is_typed_and_checked() -> None:
    wire = {"streams": ["bids"], "queries": ["hot"], "started": False, "warnings": []}
    reply = decode_result("create_sql", wire)
    assert reply == CreateSqlReply(["bids"], ["hot"], False, [])
    assert reply.to_wire() == wire
    with pytest.raises(RemoteProtocolError, match="missing field 'started'"):
        decode_result("create_sql", {"streams": [], "queries": [], "warnings": []})
    with pytest.raises(RemoteProtocolError, match="'queries' must hold strings"):
        decode_result("create_sql", {**wire, "queries": [1]})


# -- the peer compiling scripts ---------------------------------------------------------------


class Recording:
    """A PeerService in front of a real LocalSite that writes down the requests a script
    became, and takes ``RUNNING`` itself (the site has no engine to run queries on)."""

    def __init__(self, site: LocalSite) -> None:
        self.site = site
        self.calls: list[tuple[str, str]] = []
        self.compiled = asyncio.Event()  # a compile thread reached the service's lookup

    async def create_schema(self, schema: str | dict[str, Any]) -> CreateSchemaReply:
        reply = await self.site.create_schema(schema)
        self.calls.append(("create_schema", reply.schema))
        return reply

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> CreateStreamReply:
        self.calls.append(("create_stream", name))
        return await self.site.create_stream(name, schema)

    async def create_query(self, query: str | dict[str, Any]) -> CreateQueryReply:
        reply = await self.site.create_query(query)
        self.calls.append(("create_query", reply.query))
        return reply

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply:
        self.calls.append((status, name))
        return SetQueryStatusReply(name, status)

    async def push(self, *args: Any) -> Any:
        return await self.site.push(*args)

    def subscribe(self, stream: str, start: str) -> Any:
        return self.site.subscribe(stream, start)

    async def lookup(self, name: str) -> LookupReply:
        self.compiled.set()
        return await self.site.lookup(name)

    async def status(self) -> Any:
        return await self.site.status()


@contextlib.asynccontextmanager
async def peer(root: Path, **options: Any) -> AsyncIterator[tuple[Recording, Client]]:
    site = LocalSite(SiteConfig(data_dir=root))
    service = Recording(site)
    server = ApiServer(service, "127.0.0.1", 0, network=NETWORK, **options)
    try:
        await site.create_schema(PEOPLE)
        await site.create_stream("people", "person")
        await server.start()
        async with Client("127.0.0.1", server.port, timeout_s=30, network=NETWORK) as client:
            yield service, client
    finally:
        await server.close()
        await site.close()


def test_the_peer_compiles_and_creates_a_script(tmp_path: Path) -> None:
    async def go() -> None:
        async with peer(tmp_path) as (service, client):
            done = await client.submit_sql(SCRIPT, name="script", start=True)
            assert (done.streams, done.queries, done.started) == (("bids",), ("hot", "mrx"), True)
            # in script order: the stream, then each query created and then started
            assert service.calls == [
                ("create_schema", "bids"),
                ("create_stream", "bids"),
                ("create_query", "hot"),
                ("RUNNING", "hot"),
                ("create_query", "mrx"),
                ("RUNNING", "mrx"),
            ]
            # the stored queries are what the compiler makes of the script, given the
            # schema of the stream it reads without declaring it
            local = compile_script(
                SCRIPT, name="script", streams={"people": parse_schema(PEOPLE | {"name": "people"})}
            )
            for query in local.queries:
                stored = (await client.lookup_object(query.name))["definition"]
                assert stored == query_to_dict(query)
            found = await client.lookup_object("bids")
            assert [f["name"] for f in found["schema"]["fields"]] == ["auction", "price", "t"]

    run_async(go)


def test_create_query_with_sql_text_goes_through_the_peer(tmp_path: Path) -> None:
    async def go() -> None:
        async with peer(tmp_path) as (_service, client):
            made = await client.create_query(
                "INSERT INTO MrX SELECT * FROM people WHERE person_id = 2", name="FindMrX"
            )
            assert (made.query, made.status) == ("FindMrX", "SETUP")
            assert made.extra == {
                "streams": [],
                "queries": ["FindMrX"],
                "started": False,
                "warnings": [],
            }
            stored = parse_query((await client.lookup_object("FindMrX"))["definition"])
            assert stored.boxes[0].inputs == ("people",) and stored.boxes[-1].outputs == ("MrX",)

    run_async(go)


def test_a_refused_script_names_line_and_column_and_creates_nothing(tmp_path: Path) -> None:
    script = (
        "CREATE STREAM fresh (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"
        "INSERT INTO counted SELECT a, COUNT(*) AS n FROM fresh GROUP BY a;\n"
    )

    async def go() -> None:
        async with peer(tmp_path) as (service, client):
            with pytest.raises(SqlError) as refused:
                await client.submit_sql(script, name="counting")
            assert (refused.value.details["line"], refused.value.details["column"]) == (2, 56)
            with pytest.raises(SqlError, match="unknown stream or view nowhere"):
                await client.submit_sql("INSERT INTO o SELECT * FROM nowhere", name="lost")
            assert service.calls == []
            for name in ("fresh", "counting", "lost", "o"):
                with pytest.raises(NotFound):
                    await client.lookup_object(name)

    run_async(go)


def test_too_many_undeclared_streams_are_refused_before_any_lookup(tmp_path: Path) -> None:
    reads = " UNION ALL ".join(f"SELECT a FROM s{i}" for i in range(MAX_LOOKUPS + 1))

    async def go() -> None:
        async with peer(tmp_path) as (service, client):
            with pytest.raises(SqlError, match=f"at most {MAX_LOOKUPS}") as refused:
                await client.submit_sql(f"INSERT INTO o {reads}")
            assert refused.value.details["limit"] == "max_sql_lookups"
            assert not service.compiled.is_set() and service.calls == []

    run_async(go)


def slow_script(views: int) -> str:
    """A valid script whose compile takes a while (30 views: about a second here): a chain of
    views, each read by the next."""
    lines = ["CREATE VIEW v0 AS SELECT * FROM people WHERE person_id > 0;"]
    lines += [f"CREATE VIEW v{i} AS SELECT * FROM v{i - 1} WHERE person_id > {i};" for i in
              range(1, views)]  # fmt: skip
    lines.append(f"INSERT INTO chained SELECT * FROM v{views - 1};")
    return "\n".join(lines)


def test_the_peer_answers_other_requests_while_a_script_compiles(tmp_path: Path) -> None:
    async def go() -> None:
        async with peer(tmp_path) as (service, client):
            compiling = asyncio.create_task(client.submit_sql(slow_script(30), name="chain"))
            await service.compiled.wait()  # the script is read; its compile is under way
            status = await client.status()  # answered while the compile thread works
            assert [stream["name"] for stream in status.streams] == ["people"]
            assert not compiling.done()
            done = await compiling
            assert done.queries == ("chain",)

    run_async(go, timeout_s=60)


def test_a_compile_over_its_time_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    async def go() -> None:
        async with peer(tmp_path, sql_compile_timeout_s=0.001) as (service, client):
            with pytest.raises(SqlError, match=r"longer than 0\.001 s to compile") as refused:
                await client.submit_sql(slow_script(30), name="chain")
            assert refused.value.details["limit"] == "compile_timeout_s"
            assert service.calls == []
            assert (await client.status()).queries == []  # the connection serves on

    run_async(go, timeout_s=60)
