"""Delay, Process and Correct across a partition (issue 16), with real processes: two peers
of two participants (``peer join``), acme running a union and a windowed aggregate over one
stream hosted on each side (globex's mirrored to acme), globex's peer cut off while pushes go
on at acme: frozen with
SIGSTOP, or (run as root) partitioned, its peer in a network namespace whose link to acme's
silently drops every frame (:mod:`peer.testing.netns`).

Two queries read the same two streams: one with an availability bound of 5 s, one without.
acme's ``peer subscribe --tentative`` (a real CLI process) of the bounded query's output gets
tentative windows while globex is cut off; once it is back an undo, then the stable windows.
Stable subscribers of both outputs get exactly plain Python's windows over all tuples, and
the query without a bound writes no tentative tuple at all.

The partition lasts ``PARTITION_S`` (30 s, as the issue asks; ``FEDSTREAM_DPC_PARTITION_S``
shortens it) and longer if the first tentative result has not come by then (a fork's first
batch takes several seconds on a busy 2-core machine): how fast is measured by
``scripts/bench_dpc.py``, never asserted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.examples.partition import (
    partition_query,
    partition_reference,
    partition_schema,
    reports,
    second_box,
    second_reference,
    window_key,
)
from peer.model.tentative import UNDO, Entry, TentativeView
from peer.testing import (
    LocalFederation,
    make_participants,
    members_alive,
    netns,
    participant_args,
    stream_name_on,
)
from peer.testing.netns import Cutoff, Island, whole_again

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

PARTITION_S = float(os.environ.get("FEDSTREAM_DPC_PARTITION_S", "30"))
BOUND_S = 5.0


# Tentative results are built for unreplicated fragments only (docs/replication.md,
# "Partitions": forks of replicated fragments are not built yet, they keep waiting), so these
# peers run without a control plane, as every federation did before high availability became
# the default.
PLAIN = ("--no-voter",)


@pytest.fixture(params=["freeze", "partition"])
def federation(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[LocalFederation, Cutoff]]:
    keys = make_participants(tmp_path, ("acme", "globex"))
    trust = tmp_path / "trust"
    # globex runs an engine too, so that streams are placed on it (hosts are chosen among
    # peers with an engine): its stream reaches acme's query over a mirror, which the fault cuts
    args = {
        "acme": [
            *participant_args("acme", keys["acme"], trust),
            *PLAIN,
            "--spark-master",
            "local[2]",
        ],
        "globex": [
            *participant_args("globex", keys["globex"], trust),
            *PLAIN,
            "--spark-master",
            "local[1]",
            "--no-warm-up",
        ],
    }
    with contextlib.ExitStack() as stack:
        island = None
        if request.param == "partition":
            if not netns.available():
                pytest.skip("a partition in network namespaces needs root and iproute2")
            island = stack.enter_context(Island())
        cutoff = Cutoff(island, keys, trust)
        places = cutoff.places("globex", ["acme"])
        yield stack.enter_context(LocalFederation(tmp_path, args, **places)), cutoff


class LineReader:
    """A CLI subscriber's JSON lines, each with the monotonic time it was read."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append((time.monotonic(), json.loads(raw)))


def test_a_participant_cut_off_gives_tentative_results_then_the_exact_ones(
    federation: tuple[LocalFederation, Cutoff], tmp_path: Path
) -> None:
    fed, fault = federation
    acme, globex = fed.procs["acme"], fed.procs["globex"]
    ids = [bytes.fromhex(acme.node_id), bytes.fromhex(globex.node_id)]
    a = stream_name_on(ids[0], ids, "cars_a")
    g = stream_name_on(ids[1], ids, "cars_g")
    pushed: list[dict[str, Any]] = []
    stable: dict[str, list[dict[str, Any]]] = {"bounded": [], "plain": []}
    times: dict[str, float] = {}
    expected: Counter[tuple[int, ...]] = Counter()

    async def run() -> None:
        async with (
            fault.client("acme", acme) as at_acme,
            fault.client("globex", globex) as at_globex,
        ):
            await members_alive(at_acme, 2, timeout_s=60)
            await at_acme.create_schema(partition_schema("tick"))
            await at_acme.create_stream(a, "tick")
            await at_acme.create_stream(g, "tick")
            assert (await at_acme.lookup_object(g))["host"] == globex.node_id
            for name, bound in (("bounded", BOUND_S), ("plain", None)):
                await at_acme.create_query(partition_query(name, a, g, bound_s=bound, node="acme"))
                await at_acme.start_query(name)
            cli_proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "peer.cli",
                    "subscribe",
                    "bounded_out",
                    "--tentative",
                    "--start",
                    "earliest",
                    "--peer",
                    f"{acme.host}:{acme.port}",
                    *fault.cli("acme"),
                ],
                stdout=subprocess.PIPE,
                stderr=(tmp_path / "subscribe.err").open("wb"),
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
            clis.append(LineReader(cli_proc))
            cli = clis[0]

            async def read(name: str) -> None:
                async with await at_acme.subscribe(f"{name}_out", "earliest") as sub:
                    async for batch in sub:
                        assert batch.status == "stable" and batch.undo is None
                        stable[name].extend(batch.rows())

            readers = [asyncio.create_task(read(n)) for n in stable]

            async def push(client: Client, stream: str, rows: list[dict[str, Any]]) -> None:
                await client.push(stream, rows)
                pushed.extend(rows)

            for t in range(0, 40, 5):  # both sides flow
                await push(at_acme, a, reports(t, t + 5, 1))
                await push(at_globex, g, reports(t, t + 5, 2))
                await asyncio.sleep(0.5)
            t = 40
            fault.begin(globex)
            times["frozen"] = time.monotonic()
            try:
                while time.monotonic() - times["frozen"] < PARTITION_S or not any(
                    line.get("_status") == "tentative" for _, line in cli.lines
                ):
                    assert time.monotonic() - times["frozen"] < 180, "no tentative result"
                    await push(at_acme, a, reports(t, t + 5, 1))
                    t += 5
                    await asyncio.sleep(1.0)
            finally:
                fault.end(globex)
            times["thawed"] = time.monotonic()
            # globex's producer sends what it held back once globex's peer sees acme's again
            # (the mirror of g to acme sends its backlog by itself)
            await whole_again(at_globex)
            await push(at_globex, g, reports(40, t, 2))
            end = t + 40  # then both sides flow again
            for u in range(t, end, 5):
                await push(at_acme, a, reports(u, u + 5, 1))
                await push(at_globex, g, reports(u, u + 5, 2))
                await asyncio.sleep(0.5)
            want = partition_reference(pushed, end - 1)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                done = all(Counter(map(window_key, rows)) == want for rows in stable.values())
                if done and any("_undo" in line for _, line in cli.lines):
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)  # anything extra (a duplicate) would show
            expected.update(want)
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    clis: list[LineReader] = []
    try:
        asyncio.run(run())
    finally:
        for reader in clis:
            reader.proc.terminate()
            reader.proc.wait(30)
    cli = clis[0]
    want = expected
    assert want, "no window closed: the scenario did not run"
    # stable subscribers of both queries: exactly plain Python's windows over all tuples
    assert Counter(map(window_key, stable["bounded"])) == want
    assert Counter(map(window_key, stable["plain"])) == want
    # the CLI subscriber with --tentative: tentative windows while globex was frozen, an
    # undo after it thawed, then the stable ones; applying the undos leaves plain Python's
    tentative_at = [at for at, line in cli.lines if line.get("_status") == "tentative"]
    undo_at = [at for at, line in cli.lines if "_undo" in line]
    assert tentative_at and times["frozen"] < min(tentative_at) < times["thawed"]
    assert undo_at and min(undo_at) > times["thawed"]
    kept: list[tuple[int, ...]] = []
    pending: list[tuple[int, ...]] = []
    for _at, line in cli.lines:
        if "_undo" in line:
            pending = []
        elif line["_status"] == "tentative":
            pending.append(window_key(line))
        else:
            assert line["_status"] == "stable"
            kept.append(window_key(line))
    assert pending == [] and Counter(kept) == want
    print(
        f"first tentative result {min(tentative_at) - times['frozen']:.1f} s after the freeze; "
        f"undo {min(undo_at) - times['thawed']:.1f} s after the thaw; "
        f"{len([1 for _, line in cli.lines if line.get('_status') == 'tentative'])} tentative "
        f"windows, {len(undo_at)} undo(s)"
    )


@pytest.fixture
def three(tmp_path: Path) -> Iterator[LocalFederation]:
    keys = make_participants(tmp_path, ("acme", "globex", "initech"))
    trust = tmp_path / "trust"
    args = {
        "acme": [
            *participant_args("acme", keys["acme"], trust),
            *PLAIN,
            "--spark-master",
            "local[1]",
        ],
        "globex": [*participant_args("globex", keys["globex"], trust), *PLAIN, "--no-engine"],
        "initech": [
            *participant_args("initech", keys["initech"], trust),
            *PLAIN,
            "--spark-master",
            "local[1]",
        ],
    }
    with LocalFederation(tmp_path, args) as fed:
        yield fed


def test_a_chain_is_tentative_and_corrected_on_a_third_peer(three: LocalFederation) -> None:
    """acme's fragment (union and 10 s windows) feeds initech's (20 s of those windows) over
    a mirror; while globex is frozen both write tentative results, and after the thaw both
    take them back; initech's stable output is plain Python's."""
    acme, globex, initech = (three.procs[n] for n in ("acme", "globex", "initech"))
    ids = [bytes.fromhex(p.node_id) for p in (acme, globex, initech)]
    a = stream_name_on(ids[0], ids, "chain_a")
    g = stream_name_on(ids[1], ids, "chain_g")
    query = partition_query("chain", a, g, bound_s=BOUND_S, node="acme")
    query["boxes"].append(second_box("chain_out", "chain_final", node="initech"))
    pushed: list[dict[str, Any]] = []
    seen: list[tuple[float, Any]] = []
    stable: list[dict[str, Any]] = []
    times: dict[str, float] = {}
    expected: Counter[tuple[int, ...]] = Counter()

    async def run() -> None:
        async with (
            Client("127.0.0.1", acme.port, timeout_s=120) as at_acme,
            Client("127.0.0.1", globex.port, timeout_s=120) as at_globex,
            Client("127.0.0.1", initech.port, timeout_s=120) as at_initech,
        ):
            await members_alive(at_acme, 3, timeout_s=60)
            await at_acme.create_schema(partition_schema("tick"))
            await at_acme.create_stream(a, "tick")
            await at_acme.create_stream(g, "tick")
            made = await at_acme.create_query(query)
            assert {f["site"] for f in made["fragments"]} == {acme.node_id, initech.node_id}
            await at_acme.start_query("chain")

            async def read(tentative: bool) -> None:
                sub = await at_initech.subscribe("chain_final", "earliest", tentative=tentative)
                async with sub:
                    async for batch in sub:
                        if tentative:
                            seen.append((time.monotonic(), batch))
                        else:
                            stable.extend(batch.rows())

            readers = [asyncio.create_task(read(True)), asyncio.create_task(read(False))]

            async def push(client: Client, stream: str, rows: list[dict[str, Any]]) -> None:
                await client.push(stream, rows)
                pushed.extend(rows)

            for t in range(0, 60, 5):
                await push(at_acme, a, reports(t, t + 5, 1))
                await push(at_globex, g, reports(t, t + 5, 2))
                await asyncio.sleep(0.5)
            t = 60
            assert globex.proc is not None
            os.killpg(globex.proc.pid, signal.SIGSTOP)
            times["frozen"] = time.monotonic()
            try:
                while time.monotonic() - times["frozen"] < PARTITION_S or not any(
                    b.status == "tentative" for _, b in seen
                ):
                    assert time.monotonic() - times["frozen"] < 240, "no tentative result"
                    await push(at_acme, a, reports(t, t + 5, 1))
                    t += 5
                    await asyncio.sleep(1.0)
            finally:
                os.killpg(globex.proc.pid, signal.SIGCONT)
            times["thawed"] = time.monotonic()
            await push(at_globex, g, reports(60, t, 2))
            end = t + 50
            for u in range(t, end, 5):
                await push(at_acme, a, reports(u, u + 5, 1))
                await push(at_globex, g, reports(u, u + 5, 2))
                await asyncio.sleep(0.5)
            want = second_reference(partition_reference(pushed, end - 1))
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if Counter(map(window_key, stable)) == want and any(
                    b.undo is not None for _, b in seen
                ):
                    break
                await asyncio.sleep(1.0)
            await asyncio.sleep(3.0)
            expected.update(want)
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    asyncio.run(run())
    assert expected, "no window closed: the scenario did not run"
    assert Counter(map(window_key, stable)) == expected
    tentative_at = [at for at, b in seen if b.status == "tentative"]
    undo_at = [at for at, b in seen if b.undo is not None]
    assert tentative_at and times["frozen"] < min(tentative_at) < times["thawed"]
    assert undo_at and min(undo_at) > times["thawed"]
    view = TentativeView()
    for _at, b in seen:
        if b.undo is not None:
            view.apply(Entry(b.offset, UNDO, undo=b.undo))
        else:
            view.apply(Entry(b.offset, b.status, tuple(map(window_key, b.rows()))))
    assert view.tentative_rows() == [] and Counter(view.rows()) == expected
    print(
        f"chain: first tentative result at initech {min(tentative_at) - times['frozen']:.1f} s "
        f"after the freeze; undo {min(undo_at) - times['thawed']:.1f} s after the thaw"
    )
