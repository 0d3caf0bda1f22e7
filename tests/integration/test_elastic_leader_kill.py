"""The burst leader killed -9 right after it decided to grow (issue 28): another peer of the
participant takes the lead, finishes what the plan says, and the participant never runs more
peers than MAX.

Participant acme runs two `peer join --elastic 1:3` processes started by hand (acme1 first,
so it leads); participant globex runs two peers without an engine, so that the control plane
keeps three voters when acme1 dies. A ramp on acme1's stream makes acme1 decide to grow; as
soon as its decision is in its record (``elastic.jsonl``: the plan is committed, the
provisioner is being asked), acme1 is killed -9, its Spark with it.

Checked, at every look until the end: acme's peers alive (the two started by hand, less the
dead one, plus every launched process) never exceed MAX = 3; acme2 claims the lead in the next
term once acme1 is not live, and every name of the plan runs (started once: a name acme1
started is left alone: its log says it came up once).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.errors import FedstreamError
from peer.testing import (
    LocalFederation,
    keyed_window_query,
    keyed_window_schema,
    make_participants,
    participant_args,
)
from tests.integration.test_elastic_processes import FAST, batch, kill_launched, launched_pids

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]


def test_the_burst_leader_killed_mid_decision_is_replaced_and_max_holds(tmp_path: Path) -> None:
    keys = make_participants(tmp_path, ["acme", "globex"])
    trust = tmp_path / "trust"
    acme = [
        *participant_args("acme", keys["acme"], trust),
        "--elastic", "1:3",
        "--capacity", "0.5",
        "--spark-master", "local[1]",
        "--http", "off",
        "--no-lane",
        "--replicas", "1",
        *FAST,
    ]  # fmt: skip
    globex = [*participant_args("globex", keys["globex"], trust), "--no-engine", *FAST]
    args = {"globex1": globex, "globex2": globex, "acme1": acme, "acme2": acme}
    fed = LocalFederation(tmp_path, args)
    fed.start(timeout_s=240)
    try:
        asyncio.run(scenario(fed, tmp_path))
    finally:
        fed.stop(60)
        kill_launched(tmp_path)


async def scenario(fed: LocalFederation, work: Path) -> None:
    acme1, acme2 = fed.procs["acme1"], fed.procs["acme2"]
    record = acme1.data_dir / "elastic.jsonl"
    async with Client("127.0.0.1", acme1.port, timeout_s=120) as cl:
        await cl.create_schema(keyed_window_schema("tick"))
        await cl.create_stream("kill_in", "tick")
        for i in range(3):
            q = keyed_window_query(f"kill{i}", "kill_in", f"kill_out{i}", at_least=i)
            await cl.create_query(q)
            await cl.start_query(q["name"])

    def acme_alive() -> int:
        manual = sum(1 for p in (acme1, acme2) if p.proc is not None and p.proc.poll() is None)
        return manual + len(launched_pids(work))

    def decisions(path: Path) -> list[dict[str, Any]]:
        try:
            return [json.loads(line) for line in path.read_text().splitlines()]
        except FileNotFoundError:
            return []

    # the ramp, on acme1, until it has decided to grow; then acme1 is killed at once
    rng, t, seq = random.Random(5), 0, 0
    began = time.monotonic()
    while not any(d["action"] == "grow" for d in decisions(record)):
        assert time.monotonic() - began < 300, "acme1 never decided to grow"
        try:
            async with Client("127.0.0.1", acme1.port, timeout_s=60) as c:
                await c.push("kill_in", {"columns": batch(rng, t, 400)}, producer="k", seq=seq)
            seq, t = seq + 1, t + 2
        except (FedstreamError, OSError, TimeoutError):
            await asyncio.sleep(0.5)
        assert acme_alive() <= 3
    acme1.kill()
    grew = [d for d in decisions(record) if d["action"] == "grow"][-1]
    planned = grew["launched"]
    assert len(planned) == 1  # two peers started by hand: one more makes MAX

    # acme2 takes the lead in the next term and every planned name runs
    async def status() -> dict[str, Any]:
        async with Client("127.0.0.1", acme2.port, timeout_s=30) as c:
            return (await c.status()).to_wire()

    began = time.monotonic()
    while True:
        assert time.monotonic() - began < 240, "nobody took over the lead"
        assert acme_alive() <= 3
        elastic = (await status()).get("elastic") or {}
        running = launched_pids(work)
        if elastic.get("leading") and set(planned) <= set(running):
            break
        await asyncio.sleep(1.0)
    assert elastic["term"] >= grew["term"] + 1
    assert elastic["leader"] == acme2.node_id
    assert set(elastic["launched"]) >= set(planned)
    # for a while after: still never above MAX, and no name started twice
    for _ in range(15):
        assert acme_alive() <= 3
        await asyncio.sleep(1.0)
    for log in work.glob("acme-e*/peer.log"):  # each launched name came up once
        assert log.read_text().count("peer ready on") == 1, log.parent.name
