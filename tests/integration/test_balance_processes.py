"""Balancing inside a participant with real processes (issue 28): three `peer join` processes
of one participant, one of them hot; load spreads to the other two under no contract, and every
output equals plain Python.

Participant acme runs three peers, each with its own Spark (``local[1]``) and no contract
file. acme1 offers a fifth of a core (``--capacity 0.2``), acme2 and acme3 four cores: the same
work is a high utilisation on acme1 and a low one on the others (on one machine, the stand-in
for a small host beside two large ones). Three keyed windowed aggregates run on acme1 over a
stream it hosts (one copy: ``--replicas 1``): the first in its own streaming query, the other
two in the shared lane, so lane members move too (held at a batch boundary, their windows and
position travel). Batches are pushed back to back until acme1's brain has handed fragments to
both other peers (peer.elastic.siblings: above them by the margin for two rounds, it hands
what fits to the least loaded). Checked: every move out of acme1 went to a peer of acme under
no contract (``contract`` empty, price 0, a reason naming the margin), the receiving peers'
ledgers record them, the fragments run on all three peers, and each result stream, read on a
peer that does not run its fragment, equals plain Python tuple for tuple.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.examples.keyed_window import keyed_window_query, keyed_window_schema, keyed_window_sums
from peer.testing import (
    KeyedFeed,
    LocalFederation,
    PeerProcess,
    collect,
    make_participants,
    member_states,
    participant_args,
    stream_name_on,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]

FAST = ("--gossip-interval", "0.3", "--suspect-after", "3", "--dead-after", "8")
CAPACITY = {"acme1": "0.2", "acme2": "4", "acme3": "4"}
QUERIES = 3
SPREAD_S = 300.0  # the pushes go on until the load has spread (at most)


def test_a_hot_peer_spreads_its_load_over_its_participants_other_peers(tmp_path: Path) -> None:
    keys = make_participants(tmp_path, ["acme"])
    common = [
        *participant_args("acme", keys["acme"], tmp_path / "trust"),
        "--bpm-period", "1",
        "--spark-master", "local[1]",
        "--http", "off",
        "--replicas", "1",
        *FAST,
    ]  # fmt: skip
    args = {name: [*common, "--capacity", cores] for name, cores in CAPACITY.items()}
    fed = LocalFederation(tmp_path, args)
    try:
        fed.start(timeout_s=300)
        asyncio.run(scenario(fed.procs))
    finally:
        fed.stop(60)


async def status(proc: PeerProcess) -> dict[str, Any]:
    async with Client("127.0.0.1", proc.port, timeout_s=60) as c:
        return (await c.status()).to_wire()


async def scenario(procs: dict[str, PeerProcess]) -> None:
    hot, *others = (procs[name] for name in CAPACITY)
    ids = [bytes.fromhex(p.node_id) for p in procs.values()]
    source = stream_name_on(ids[0], ids, "hot_in")

    async def ready() -> bool:  # queries are placed through the control plane
        voters: set[tuple[str, ...]] = set()
        for p in procs.values():
            found = await status(p)
            if member_states(found)["alive"] < len(procs):
                return False
            voters.add(tuple(sorted(found["replication"]["voters"])))
        return voters == {tuple(sorted(p.node_id for p in procs.values()))}

    await wait_until(ready, "three live peers, all three voters of one plane", 120, every_s=0.3)
    async with Client("127.0.0.1", hot.port, timeout_s=120) as cl:
        await cl.create_schema(keyed_window_schema("tick"))
        await cl.create_stream(source, "tick")
        for i in range(QUERIES):
            q = keyed_window_query(f"hot{i}", source, f"hot_out{i}", at_least=5 * i)
            await cl.create_query(q)
            await cl.start_query(q["name"])
    pusher = KeyedFeed(source, producer="hot", port=hot.port)

    def moves(found: dict[str, Any]) -> list[dict[str, Any]]:
        ledger = (found.get("brain") or {}).get("ledger", [])
        return [e for e in ledger if e.get("direction") == "out" and e.get("ok")]

    # batches back to back until the hot peer has handed fragments to both other peers
    began, out = time.monotonic(), list[dict[str, Any]]()
    while {e["peer"] for e in out} != {p.node_id for p in others}:
        assert time.monotonic() - began < SPREAD_S, f"the load did not spread: moves {out}"
        for _ in range(10):
            await pusher.send(pusher.batch(400))
        out = moves(await status(hot))
    await pusher.close_windows()

    # hot0 runs on its own, hot1 and hot2 in acme1's lane: spreading to two peers took a lane
    # member's move at least
    moved = {str(e["fragment"]).partition("#")[0] for e in out}
    assert moved & {"hot1", "hot2"}, f"no lane member moved: {sorted(moved)}"
    for move in out:  # under no contract, at no price, for the margin's sake
        assert (move["partner"], move["contract"], move["price"]) == ("acme", "", 0.0), move
        assert "margin" in move["reason"], move
    arrived: dict[str, list[str]] = {}
    for proc in others:
        ledger = ((await status(proc)).get("brain") or {}).get("ledger", [])
        arrived[proc.node_id] = [e["fragment"] for e in ledger if e["direction"] == "in"]
    assert sorted(f for names in arrived.values() for f in names) == sorted(
        e["fragment"] for e in out
    )
    runs_on = {}
    for proc in procs.values():
        for query in (await status(proc)).get("queries", []):
            name = str(query.get("name")).partition("#")[0]  # a fragment of query hotN
            if query.get("status") == "RUNNING" and name.startswith("hot"):
                runs_on[name] = proc
    assert set(runs_on.values()) == set(procs.values()), f"fragments run on {runs_on}"

    for i in range(QUERIES):  # each output, read on a peer that does not run its fragment
        reader = next(p for p in procs.values() if p is not runs_on[f"hot{i}"])
        want = keyed_window_sums(pusher.pushed, at_least=5 * i)
        async with Client("127.0.0.1", reader.port, timeout_s=120) as cl:
            rows = await collect(cl, f"hot_out{i}", sum(want.values()), timeout_s=240, settle_s=3)
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        assert got == want, f"hot{i}: {sum(got.values())} windows, plain Python {len(want)}"
