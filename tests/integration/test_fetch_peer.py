"""A peer whose executors fetch their input (``PeerConfig.fetch_remote``, as a peer on a Spark
cluster does; here on the shared ``local[2]`` session): the node starts the fetch server and
the engine reads every query's input through it. A filter and a windowed aggregate pushed
through the real client equal plain Python, tuple for tuple."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from peer.client import Client
from peer.testing import PeerThread
from tests.integration.test_boxes import (
    AGG_FIELDS,
    AGG_PARAMS,
    READINGS,
    READINGS_FIELDS,
    key,
    readings,
    reference_aggregate,
    run_query,
    same,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def peer_options() -> dict[str, Any]:
    return {"fetch_remote": True}  # executors fetch the spool files from the peer


@pytest.fixture(scope="module", autouse=True)
def _schema(peer: PeerThread) -> None:
    asyncio.run(_setup(peer.port))


async def _setup(port: int) -> None:
    async with Client("127.0.0.1", port) as c:
        await c.create_schema(READINGS)


def test_queries_read_their_input_through_the_peers_fetch_server(peer: PeerThread) -> None:
    fetch = peer.peer.fetch
    assert fetch is not None  # the node started it, and the engine was given its endpoint
    engine = peer.peer.engine
    assert engine is not None and engine.fetch == fetch.endpoint

    rows = readings(3000, seed=11)
    query = {
        "name": "ff",
        "boxes": [
            {
                "name": "hot",
                "type": "filter",
                "inputs": ["ff_in"],
                "outputs": ["ff_out"],
                "params": {"expression.0": "v > 60 AND kind <> 'b'"},
            }
        ],
    }
    fields = list(READINGS_FIELDS)
    want = [key(r, fields) for r in rows if r["v"] > 60 and r["kind"] != "b"]
    got = run_query(peer.port, query, {"ff_in": rows}, {"ff_out": len(want)})
    same(got["ff_out"], want, fields)
    filtered = fetch.served_files
    assert filtered > 0

    rows = readings(4000, seed=12)
    params = {**AGG_PARAMS, "window-size": "10", "advance": "10", "slack": "0"}
    query = {
        "name": "fa",
        "boxes": [
            {
                "name": "agg",
                "type": "aggregate",
                "inputs": ["fa_in"],
                "outputs": ["fa_out"],
                "params": params,
            }
        ],
    }
    want = reference_aggregate(rows, 10, 10, 0)
    got = run_query(peer.port, query, {"fa_in": rows}, {"fa_out": len(want)})
    same(got["fa_out"], want, AGG_FIELDS)
    assert fetch.served_files > filtered and fetch.refused == 0
