"""The burst leader killed -9 right after it decided to grow (issue 28): another peer of the
participant takes the lead, finishes what the plan says, and the participant never runs more
peers than MAX.

Participant acme runs two `peer join --elastic 3:3` processes started by hand: fewer than MIN,
so whichever claims the lead decides at once, without any load, to launch a third peer.
Participant globex runs two peers without an engine, so that the control plane keeps three
voters when acme's leader dies. As soon as the leader's decision is in its record
(``elastic.jsonl``: the plan is committed, the provisioner is being asked), the leader is
killed -9, its Spark with it.

Checked, at every look until the end: acme's peers alive (those started by hand, less the dead
one, plus every launched process) never exceed MAX = 3; the other peer claims the lead in a
later term once the killed one is not live, every name of the plan runs, and each launched
name was started once (a name the killed leader started is left alone: its log has one
start line).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.demo.elastic import FAST, kill_launched, launched_pids
from peer.elastic.provision import STARTED
from peer.testing import LocalFederation, PeerProcess, make_participants, participant_args

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]


def test_the_burst_leader_killed_mid_decision_is_replaced_and_max_holds(tmp_path: Path) -> None:
    keys = make_participants(tmp_path, ["acme", "globex"])
    trust = tmp_path / "trust"
    acme = [
        *participant_args("acme", keys["acme"], trust),
        "--elastic", "3:3",
        "--elastic-interval", "3",
        "--spark-master", "local[1]",
        "--http", "off",
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


def decisions(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:  # the line being written
            continue
    return found


async def status(proc: PeerProcess) -> dict[str, Any]:
    async with Client("127.0.0.1", proc.port, timeout_s=30) as c:
        return (await c.status()).to_wire()


async def scenario(fed: LocalFederation, work: Path) -> None:
    acme = [fed.procs["acme1"], fed.procs["acme2"]]

    def alive() -> int:
        manual = sum(1 for p in acme if p.proc is not None and p.proc.poll() is None)
        return manual + len(launched_pids(work))

    # whoever leads decides to grow; it is killed the moment the decision is recorded
    began = time.monotonic()
    grown: list[tuple[PeerProcess, dict[str, Any]]] = []
    while not grown:
        assert time.monotonic() - began < 180, "no acme peer decided to grow"
        assert alive() <= 3
        for proc in acme:
            made = [d for d in decisions(proc.data_dir / "elastic.jsonl") if d["action"] == "grow"]
            if made:
                grown.append((proc, made[-1]))
        await asyncio.sleep(0.05)
    leader, grew = grown[0]
    leader.kill()
    other = acme[1] if leader is acme[0] else acme[0]
    assert grew["launched"] and "held at MIN" in grew["reason"]

    # the other takes the lead in a later term, and every name of its plan runs
    began = time.monotonic()
    while True:
        assert time.monotonic() - began < 240, "nobody took over the lead"
        assert alive() <= 3
        elastic = (await status(other)).get("elastic") or {}
        running = launched_pids(work)
        planned = set(elastic.get("launched") or [])
        if elastic.get("leading") and planned and planned <= set(running):
            break
        await asyncio.sleep(0.5)
    assert elastic["term"] > grew["term"]
    assert elastic["leader"] == other.node_id
    assert set(grew["launched"]) <= planned  # what the dead leader planned was kept
    for _ in range(10):  # and for a while after: never above MAX
        assert alive() <= 3
        await asyncio.sleep(1.0)
    for log in work.glob("*/peer.log"):  # each launched name was started once
        assert log.read_text().count(STARTED) == 1, log.parent.name
