"""The client's SQL path against a real peer without Spark (``engine=False``): the README's
SQL form of FindMrX reads a stream the script does not declare (its schema looked up on the
peer) and makes the same boxes a JSON query would; a refused script creates nothing; ``peer
query explain`` prints boxes and fragments without a peer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from peer.client import Client
from peer.errors import NotFound, SqlError
from peer.model.limits import ContentLimits
from peer.model.query import parse_query
from peer.node import PeerConfig
from peer.testing import PeerThread

FIND_MR_X = """\
CREATE QUERY FindMrX AS
INSERT INTO MrX SELECT * FROM people WHERE person_id = 2;
"""


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerThread]:
    data = Path(tmp_path_factory.mktemp("sql_client")) / "peer"
    with PeerThread(PeerConfig(data_dir=data, port=0, engine=False)) as running:
        yield running


def test_readme_sql_form_reads_an_existing_stream(peer: PeerThread) -> None:
    async def go() -> None:
        async with Client("127.0.0.1", peer.port, timeout_s=60) as c:
            await c.create_schema(
                {"name": "person", "fields": [{"name": "person_name", "type": "string"},
                                              {"name": "person_id", "type": "int"}]}
            )  # fmt: skip
            await c.create_stream("people", "person")
            made = await c.create_query(FIND_MR_X)
            assert (made.query, made.status) == ("FindMrX", "SETUP")  # the script's last query
            assert made.extra == {"streams": [], "queries": ["FindMrX"], "started": False,
                                  "warnings": []}  # fmt: skip
            stored = parse_query((await c.lookup_object("FindMrX"))["definition"])
            assert [b.type for b in stored.boxes] == ["filter", "map"]
            assert stored.boxes[0].inputs == ("people",) and stored.boxes[-1].outputs == ("MrX",)
            assert dict(stored.boxes[0].params) == {"expression.0": "`person_id` = 2"}

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_refused_script_creates_nothing(peer: PeerThread) -> None:
    script = (
        "CREATE STREAM fresh (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"
        "INSERT INTO counted SELECT a, COUNT(*) AS n FROM fresh GROUP BY a;\n"
    )

    async def go() -> None:
        async with Client("127.0.0.1", peer.port, timeout_s=60) as c:
            with pytest.raises(SqlError) as refused:
                await c.create_query(script, name="counting")
            assert (refused.value.details["line"], refused.value.details["column"]) == (2, 56)
            for name in ("fresh", "counting"):
                with pytest.raises(NotFound):
                    await c.lookup_object(name)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_explain_prints_boxes_and_fragments(tmp_path: Path) -> None:
    path = tmp_path / "hot.sql"
    path.write_text(
        "CREATE STREAM bid (auction BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"
        "INSERT INTO hot SELECT /*+ OPTIONS('node'='peer-b') */ window_start, auction, "
        "COUNT(*) AS n FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(t), INTERVAL '10' SECOND)) "
        "GROUP BY window_start, window_end, auction;\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "peer.cli", "query", "explain", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "stream bid (auction long not null, t timestamp not null)"
    assert "query hot" in lines
    assert "  box aggregate0 aggregate bid -> hot.aggregate0 node=peer-b" in lines
    assert "      window-size = 10" in lines
    assert lines[-1] == "  fragment hot [aggregate0, map1] runs on peer peer-b"


def test_the_peer_holds_a_script_to_its_own_query_budget(tmp_path: Path) -> None:
    """``peer join --max-query-bytes``'s budget applies to a SQL script sent to the peer."""
    limits = ContentLimits(max_query_bytes=200)
    config = PeerConfig(data_dir=tmp_path / "peer", port=0, engine=False, limits=limits)
    script = (
        "CREATE STREAM wide (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);\n"
        "INSERT INTO narrow SELECT a FROM wide WHERE a > 1 AND a < 1000000 AND a <> 77;\n"
        "-- a comment that takes the script past two hundred bytes ........................\n"
    )
    assert len(script) > 200

    async def go() -> None:
        async with Client("127.0.0.1", running.port, timeout_s=60) as c:
            with pytest.raises(SqlError, match="larger than 200 bytes") as refused:
                await c.submit_sql(script, name="narrowing")
            assert refused.value.details["limit"] == "max_query_bytes"
            with pytest.raises(NotFound):
                await c.lookup_object("wide")
            done = await c.submit_sql(script.splitlines()[0], name="decl")  # within budget
            assert done.streams == ("wide",)

    with PeerThread(config) as running:
        asyncio.run(asyncio.wait_for(go(), 60))
