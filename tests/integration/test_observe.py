"""Observability on real peers (issue 13): two peers of two participants in this process, with
the shared Spark session, an overlay, a query and pushes through both.

``/metrics`` is read by ``prometheus_client``'s own parser and holds every family of the table
with its type and real figures; ``/status`` is what the client API's ``status`` returns; any
peer's ``/api/federation`` and its Server-Sent Events show both peers; the dashboard page and
its script are served by the peer itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from peer.client import Client
from peer.node import PeerConfig
from peer.observe.families import FAMILIES
from peer.testing import (
    PeerThread,
    make_participants,
    members_alive,
    run_async,
    stream_name_on,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SCHEMA = {
    "name": "otick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}
WAIT_S = 200


@pytest.fixture
def peers(tmp_path: Path, spark: Any) -> Iterator[list[PeerThread]]:
    keys = make_participants(tmp_path, ("alpha", "beta"))
    trust = tmp_path / "trust"
    started: list[PeerThread] = []
    try:
        for name in ("alpha", "beta"):
            bootstrap = []
            if started:
                first = started[0].peer.overlay
                assert first is not None
                bootstrap = [("127.0.0.1", first.port)]
            config = PeerConfig(
                data_dir=tmp_path / name,
                port=0,
                participant=name,
                key_path=keys[name],
                trust_dir=trust,
                bootstrap=bootstrap,
                gossip_interval_s=0.3,
                http=("127.0.0.1", 0),
                replicas=1,
                min_insync=1,
            )
            started.append(PeerThread(config, spark).__enter__())
        yield started
    finally:
        for p in reversed(started):
            p.close()


def url(p: PeerThread, path: str) -> str:
    assert p.peer.http is not None
    return p.peer.http.url + path.lstrip("/")


async def get_text(session: aiohttp.ClientSession, address: str) -> str:
    async with session.get(address) as response:
        assert response.status == 200, address
        return await response.text()


def samples(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_status_and_the_federation_view(peers: list[PeerThread]) -> None:
    alpha, beta = peers
    ids = [p.peer.overlay.node_id for p in peers if p.peer.overlay is not None]
    assert alpha.peer.overlay is not None
    source = stream_name_on(alpha.peer.overlay.node_id, ids, "oin")
    query = {  # a filter (per tuple): results follow each pushed batch, no watermark to wait for
        "name": "watched",
        "boxes": [
            {
                "name": "keep",
                "type": "filter",
                "inputs": [source],
                "outputs": ["watched_out"],
                "params": {"expression.0": "v >= 0"},
            }
        ],
    }

    async def body() -> None:
        async with (
            Client("127.0.0.1", alpha.port, timeout_s=120) as a,
            Client("127.0.0.1", beta.port, timeout_s=120) as b,
        ):
            await members_alive(a, 2, timeout_s=60)
            await a.create_schema(SCHEMA)
            await a.create_stream(source, "otick")
            await a.create_query(query)
            await a.start_query("watched")
            t = 0
            for i in range(20):
                columns = {"k": [i % 3] * 10, "v": list(range(10)), "t": list(range(t, t + 10))}
                t += 10
                await (a if i % 2 else b).push(source, {"columns": columns})
            await a.push(source, {"columns": {"k": [0], "v": [1], "t": [t + 100]}})

            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:

                async def results_counted() -> dict[str, Any] | None:
                    found = samples(await get_text(http, url(alpha, "/metrics")))
                    out = found["fedstream_records_out"]
                    latency = found["fedstream_result_latency_seconds"]
                    counted = [s for s in latency.samples if s.name.endswith("_count")]
                    has_out = any(s.value > 0 for s in out.samples)
                    return found if has_out and any(s.value > 0 for s in counted) else None

                found = await wait_until(
                    results_counted, "alpha's query never counted a result", WAIT_S, every_s=0.5
                )
                check_families(found, source)

                status = json.loads(await get_text(http, url(alpha, "/status")))
                direct = await a.status()
                assert set(status) == set(direct)
                for key in ("peer", "pid", "engine", "data_dir", "hosted", "moved"):
                    assert status[key] == direct[key], key
                assert status["overlay"]["node_id"] == direct["overlay"]["node_id"]
                assert {q["name"] for q in status["queries"]} == {"watched"}

                async def sampled() -> dict[str, Any] | None:
                    # the sampler runs every 2 s: wait for alpha's first sample
                    got = json.loads(await get_text(http, url(beta, "/api/federation?history=1")))
                    peers = {p["node_id"]: p for p in got["peers"]}
                    return got if peers.get(ids[0].hex(), {}).get("samples") else None

                view = await wait_until(
                    sampled, "alpha keeps samples for the charts", WAIT_S, every_s=0.5
                )
                by_node = {p["node_id"]: p for p in view["peers"]}
                assert set(by_node) == {i.hex() for i in ids}
                assert view["self"] == beta.peer.overlay.node_id.hex()  # type: ignore[union-attr]
                alpha_view = by_node[ids[0].hex()]
                assert [q["name"] for q in alpha_view["status"]["queries"]] == ["watched"]
                assert alpha_view["dashboard"] == url(alpha, "/")
                assert alpha_view["samples"], "alpha keeps samples for the charts"

                async def written() -> dict[str, Any] | None:
                    # a sample of alpha's over an interval in which its fragment wrote results
                    got = json.loads(await get_text(http, url(beta, "/api/federation?history=1")))
                    (alpha_now,) = [p for p in got["peers"] if p["node_id"] == ids[0].hex()]
                    rates = [s["stream_rate"].get("watched_out", 0) for s in alpha_now["samples"]]
                    return got if any(r > 0 for r in rates) else None

                view = await wait_until(
                    written, "alpha's samples show the rate of watched_out", WAIT_S, every_s=0.5
                )
                # the query diagram: the box marked with alpha, arrows from source to result
                (graph,) = view["diagram"]["queries"]
                assert graph["query"] == "watched"
                assert [(b["box"], b["node_id"], b["participant"]) for b in graph["boxes"]] == [
                    ("keep", ids[0].hex(), "alpha")
                ]
                assert {(a["source"], a["target"]) for a in graph["arrows"]} == {
                    (f"stream:{source}", "box:keep"),
                    ("box:keep", "stream:watched_out"),
                }

                async with http.get(url(beta, "/events")) as events:
                    assert events.headers["Content-Type"].startswith("text/event-stream")
                    first = await read_event(events)
                assert first["self"] == view["self"]
                assert len(first["peers"]) == 2

                page = await get_text(http, url(alpha, "/"))
                assert "/static/dashboard.js" in page and "<script" in page
                script = await get_text(http, url(alpha, "/static/dashboard.js"))
                assert "EventSource" in script

    run_async(body, timeout_s=WAIT_S * 2)


async def read_event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The data of the first Server-Sent Event of ``response``."""
    data = []
    async with asyncio.timeout(30):
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                data.append(line[6:])
            elif not line and data:
                break
    value: dict[str, Any] = json.loads("\n".join(data))
    return value


def check_families(found: dict[str, Any], source: str) -> None:
    """Every family of the table, with its type; the figures of what ran."""
    for family in FAMILIES:
        name = family.name.removesuffix("_total") if family.kind == "counter" else family.name
        assert name in found, f"{family.name} missing from /metrics"
        assert found[name].type == family.kind, family.name
    records_in = {s.labels["stream"]: s.value for s in found["fedstream_records_in"].samples}
    assert records_in.get(source, 0) > 0  # pushed through alpha (half the batches)
    members = {s.labels["state"]: s.value for s in found["fedstream_overlay_members"].samples}
    assert members.get("alive") == 2
    pushes = [
        s for s in found["fedstream_push_duration_seconds"].samples if s.name.endswith("_count")
    ]
    assert pushes[0].value > 0
    sent = {s.labels["direction"]: s.value for s in found["fedstream_link_bytes"].samples}
    assert sent["sent"] > 0 and sent["received"] > 0
    cpu = found["fedstream_process_cpu_seconds"].samples
    assert cpu[0].value > 0
