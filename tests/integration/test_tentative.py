"""Delay, Process and Correct on one real peer (real Spark): an input of a union falls silent
while the other goes on; with an availability bound the query forks and writes tentative
results, and when the silent input is back it takes them back and writes the exact ones."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.client.payload import Batch
from peer.examples.partition import (
    partition_query,
    partition_reference,
    partition_schema,
    reports,
    second_box,
    second_reference,
    window_key,
)
from peer.model.tentative import STABLE, TENTATIVE, UNDO, Entry, TentativeView
from peer.testing import PeerThread

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def peer_options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Checkpoints beneath a shared directory, as ``--checkpoint-dir`` puts them on a Spark
    cluster (issue 25 item 3): a fork copies the stable checkpoint, and its inputs, there."""
    return {"checkpoint_root": tmp_path_factory.mktemp("nfs") / "host-1" / "checkpoints"}


async def record(
    client: Client, stream: str, tentative: bool, into: list[tuple[float, Batch]]
) -> None:
    async with await client.subscribe(stream, "earliest", tentative=tentative) as sub:
        async for batch in sub:
            into.append((time.monotonic(), batch))


def entries(batches: list[tuple[float, Batch]]) -> list[Entry]:
    out = []
    for _at, b in batches:
        if b.undo is not None:
            out.append(Entry(b.offset, UNDO, undo=b.undo))
        else:
            out.append(Entry(b.offset, b.status, tuple(window_key(r) for r in b.rows())))
    return out


async def scenario(
    port: int, name: str, bound: float | None, checkpoints: Path | None = None
) -> dict[str, Any]:
    a, g, out = f"{name}_a", f"{name}_g", f"{name}_out"  # the query writes <name>_out
    second = f"{name}c"  # reads <name>_out, writes <name>c_out
    pushed: list[dict[str, Any]] = []
    tentative_seen: list[tuple[float, Batch]] = []
    stable_seen: list[tuple[float, Batch]] = []
    chain_tentative: list[tuple[float, Batch]] = []
    chain_stable: list[tuple[float, Batch]] = []
    async with Client("127.0.0.1", port, timeout_s=120) as c:
        await c.create_schema(partition_schema("tick"))
        await c.create_stream(a, "tick")
        await c.create_stream(g, "tick")
        await c.create_query(partition_query(name, a, g, bound_s=bound))
        chain: dict[str, Any] = {"name": second, "boxes": [second_box(out, f"{second}_out")]}
        if bound is not None:
            chain["availability_bound"] = bound
        await c.create_query(chain)
        await c.start_query(name)
        await c.start_query(second)

        async def push(stream: str, rows: list[dict[str, Any]]) -> None:
            await c.push(stream, rows)
            pushed.extend(rows)

        tasks = [
            asyncio.create_task(record(c, out, True, tentative_seen)),
            asyncio.create_task(record(c, out, False, stable_seen)),
            asyncio.create_task(record(c, f"{second}_out", True, chain_tentative)),
            asyncio.create_task(record(c, f"{second}_out", False, chain_stable)),
        ]
        # both inputs flow: t 0..29
        for t in range(0, 30, 5):
            await push(a, reports(t, t + 5, 1))
            await push(g, reports(t, t + 5, 2))
            await asyncio.sleep(0.3)
        # g falls silent while a goes on, one batch a second, for at least 12 s and until a
        # tentative result has come (a fork's first batch takes seconds on a busy machine)
        silent_at = time.monotonic()
        t = 30
        while time.monotonic() - silent_at < 12 or (
            bound is not None
            and not all(
                any(b.status == TENTATIVE for _, b in seen)
                for seen in (tentative_seen, chain_tentative)
            )
        ):
            assert time.monotonic() - silent_at < 180, "no tentative result in 180 s"
            await push(a, reports(t, t + 5, 1))
            t += 5
            await asyncio.sleep(1.0)
        status = await c.status()
        during = next(q for q in status["queries"] if q["name"] == name)
        # what the peer's checkpoint directory holds while the forks run
        held = sorted(d.name for d in checkpoints.iterdir()) if checkpoints is not None else []
        healed_at = time.monotonic()
        # g comes back with its late tuples, then both go on for 30 more
        await push(g, reports(30, t, 2))
        end = t + 30
        for u in range(t, end, 5):
            await push(a, reports(u, u + 5, 1))
            await push(g, reports(u, u + 5, 2))
            await asyncio.sleep(0.5)
        want = partition_reference(
            pushed, end - 1
        )  # the watermark is the last t: windows below it closed
        want_chain = second_reference(want)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = Counter(k for e in entries(stable_seen) for k in e.rows)
            got_chain = Counter(k for e in entries(chain_stable) for k in e.rows)
            if got == want and got_chain == want_chain:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        status = await c.status()
        await c.set_query_status(second, "DELETED")
        await c.set_query_status(name, "DELETED")
    return {
        "want_chain": want_chain,
        "chain_stable": entries(chain_stable),
        "chain_tentative": entries(chain_tentative),
        "want": want,
        "stable": entries(stable_seen),
        "tentative": entries(tentative_seen),
        "tentative_at": [at for at, b in tentative_seen if b.status == TENTATIVE],
        "undo_at": [at for at, b in tentative_seen if b.undo is not None],
        "silent_at": silent_at,
        "healed_at": healed_at,
        "status": status,
        "during": during,
        "checkpoints_during": held,
    }


def test_a_silent_input_gives_tentative_results_then_an_undo_and_the_exact_ones(
    peer: PeerThread,
) -> None:
    bound = 3.0
    engine = peer.peer.engine
    assert engine is not None
    run = asyncio.run(scenario(peer.port, "dpc1", bound, engine.checkpoint_root))
    want = run["want"]
    # the stable subscriber saw stable batches only, and exactly the failure-free output
    assert all(e.status == STABLE for e in run["stable"])
    assert Counter(k for e in run["stable"] for k in e.rows) == want
    # the tentative subscriber got tentative results while g was silent ...
    tentative_at = run["tentative_at"]
    assert tentative_at, "no tentative result while an input was silent"
    assert min(tentative_at) < run["healed_at"]
    # ... then an undo, after which its view is the failure-free output
    assert run["undo_at"] and min(run["undo_at"]) > min(tentative_at)
    view = TentativeView()
    for entry in run["tentative"]:
        view.apply(entry)
    assert view.tentative_rows() == []
    assert Counter(view.rows()) == want
    assert view.undone > 0
    (info,) = [q for q in run["status"]["queries"] if q["name"] == "dpc1"]
    dpc = info["availability"]
    assert dpc["tentative"] is False and dpc["corrections"] >= 1
    assert run["during"]["availability"]["tentative"] is True
    assert run["during"]["availability"]["missing_inputs"] == ["dpc1_g"]
    print("fork to first tentative result:", dpc["fork_first_result_s"], "s")
    assert dpc["tentative_tuples"] >= dpc["corrected_tuples"] > 0
    # the chain: the second query, fed tentative windows, was tentative too and corrected
    want_chain = run["want_chain"]
    assert want_chain
    assert all(e.status == STABLE for e in run["chain_stable"])
    assert Counter(k for e in run["chain_stable"] for k in e.rows) == want_chain
    chain = run["chain_tentative"]
    assert any(e.status == TENTATIVE for e in chain), "the second query was never tentative"
    assert any(e.status == UNDO for e in chain)
    view = TentativeView()
    for entry in chain:
        view.apply(entry)
    assert view.tentative_rows() == [] and Counter(view.rows()) == want_chain
    # the forks copied the stable checkpoints, and ran, beneath the shared directory
    assert engine.checkpoint_root.parent.name == "host-1"
    forks = [d for d in run["checkpoints_during"] if d.startswith(("dpc1-", "dpc1c-"))]
    assert any("-t" in d.split("-", 2)[2] for d in forks), run["checkpoints_during"]
    assert not (peer.peer.data_dir / "checkpoints").exists()


def test_without_a_bound_the_query_waits_and_stays_exact(peer: PeerThread) -> None:
    run = asyncio.run(scenario(peer.port, "dpc0", None))
    assert run["tentative_at"] == [] and run["undo_at"] == []
    assert Counter(k for e in run["stable"] for k in e.rows) == run["want"]
    assert Counter(k for e in run["tentative"] for k in e.rows) == run["want"]
    assert run["chain_tentative"] == run["chain_stable"] or all(
        e.status == STABLE for e in run["chain_tentative"]
    )
    assert Counter(k for e in run["chain_stable"] for k in e.rows) == run["want_chain"]
