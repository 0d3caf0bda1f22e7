"""Flow control end to end: the downstream peer of a two-peer query is frozen (SIGSTOP, its
JVM too); the upstream fragment stops reading, its stream's backlog stays bounded, pushes slow
down (they wait, then are refused retriably) instead of memory filling up; once the
downstream peer runs again, the output equals plain Python: nothing was dropped."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.keys import generate
from peer.client import Client
from peer.errors import Unavailable
from peer.testing import PeerProcess, collect, members_alive, stream_name_on

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = {"name": "num", "fields": [{"name": "k", "type": "int"}, {"name": "v", "type": "long"}]}
BACKLOG = 4


def query(source: str) -> dict[str, Any]:
    return {
        "name": "fc",
        "boxes": [
            {
                "name": "pos",
                "type": "filter",
                "node": "acme",
                "inputs": [source],
                "outputs": ["fc_pos"],
                "params": {"expression.0": "v >= 0"},
            },
            {
                "name": "neg",
                "type": "map",
                "node": "globex",
                "inputs": ["fc_pos"],
                "outputs": ["fc_out"],
                "params": {
                    "expression.0": "k",
                    "output-field-name.0": "k",
                    "expression.1": "-v",
                    "output-field-name.1": "v",
                },
            },
        ],
    }


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[PeerProcess, PeerProcess]]:
    trust = tmp_path / "trust"
    trust.mkdir()
    keys = {}
    for name in ("acme", "globex"):
        key, pub = generate(name, tmp_path / "keys")
        (trust / pub.name).write_bytes(pub.read_bytes())
        keys[name] = key
    common: tuple[str, ...] = ("--trust", str(trust), "--spark-master", "local[1]")
    common += ("--max-backlog", str(BACKLOG), "--backlog-wait", "2")
    common += ("--dead-after", "600", "--suspect-after", "300")
    a = PeerProcess(tmp_path / "a", "--participant", "acme", "--key", str(keys["acme"]), *common)
    b = PeerProcess(
        tmp_path / "b", "--participant", "globex", "--key", str(keys["globex"]), *common
    )
    try:
        a.start()
        b.extra = (*b.extra, "--bootstrap", a.overlay_addr)
        b.start()
        yield a, b
    finally:
        if b.proc is not None and b.proc.poll() is None:
            os.killpg(b.proc.pid, signal.SIGCONT)
        b.stop(60)
        a.stop(60)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_a_frozen_downstream_peer_slows_its_upstream_and_loses_nothing(
    pair: tuple[PeerProcess, PeerProcess],
) -> None:
    a, b = pair
    rows = [{"k": i % 7, "v": (i * 37) % 101 - 20} for i in range(4000)]
    batches = [rows[i : i + 100] for i in range(0, len(rows), 100)]

    async def setup() -> str:
        async with Client("127.0.0.1", a.port, timeout_s=120) as c:
            await members_alive(c, 2, timeout_s=60)
            await c.create_schema(SCHEMA)
            # a source stream hosted on the upstream peer, so that the frozen one hosts none
            ids = [bytes.fromhex(a.node_id), bytes.fromhex(b.node_id)]
            source = stream_name_on(ids[0], ids, "fc_in")
            made = await c.create_stream(source, "num")
            assert made["host"] == a.node_id
            await c.create_query(query(source))
            await c.start_query("fc")
            await c.push(source, {"rows": batches[0]}, producer="p", seq=0)
            got = await collect(c, "fc_out", 1, timeout_s=120)
            assert got, "the query never ran"
            return source

    source = asyncio.run(setup())
    print("set up", flush=True)
    os.killpg(b.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    rss_before = rss_kb(a.proc.pid)  # type: ignore[union-attr]

    async def push_while_frozen() -> tuple[int, int]:
        sent, refused = 1, 0
        async with Client("127.0.0.1", a.port, timeout_s=120) as c:
            while sent < len(batches) and refused < 3:
                try:
                    await c.push(source, {"rows": batches[sent]}, producer="p", seq=sent)
                    sent += 1
                except Unavailable:
                    refused += 1  # backpressure reached the client
        return sent, refused

    sent, refused = asyncio.run(asyncio.wait_for(push_while_frozen(), 400))
    print("frozen: sent", sent, "refused", refused, flush=True)
    assert refused == 3 and sent < len(batches), "pushes never slowed down"
    rss_growth_mb = (rss_kb(a.proc.pid) - rss_before) / 1024  # type: ignore[union-attr]
    os.killpg(b.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]

    async def finish() -> list[dict[str, Any]]:
        async with Client("127.0.0.1", a.port, timeout_s=120) as c:
            for i in range(sent, len(batches)):
                for _ in range(120):
                    try:
                        await c.push(source, {"rows": batches[i]}, producer="p", seq=i)
                        break
                    except Unavailable:
                        await asyncio.sleep(0.5)
            want = sum(1 for r in rows if r["v"] >= 0)
            return await collect(c, "fc_out", want, timeout_s=240, settle_s=3)

    got = asyncio.run(finish())
    print("finished", len(got), flush=True)
    want = sorted((r["k"], -r["v"]) for r in rows if r["v"] >= 0)
    assert sorted((r["k"], r["v"]) for r in got) == want
    assert rss_growth_mb < 200, f"upstream memory grew by {rss_growth_mb:.0f} MB"
