"""``peer demo --elastic`` as a user runs it (issue 28): a participant that grows with a load
ramp and shrinks after it, as separate processes (peer.demo.elastic says how).

One ``peer join --elastic 1:3`` process of participant acme, alone, offering half a core,
runs three keyed windowed aggregates in their own streaming queries; a ramp overloads it, its
burst leader starts ``peer join --launched-as`` processes through the local provisioner, its
balancer moves fragments to them under no contract, the ramp ends, the plan shrinks and the
launched peers drain and exit; every result stream is compared with plain Python.

Checked here from the demo's exit status and its summary: every check passed; the leader
grew the plan (to three peers, held at MAX at most) and shrank it back to one, each decision
with its figures; fragments moved out only to peers of acme under no contract (``""``);
never more than two launched processes at a look; every output exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peer.demo.elastic import kill_launched

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(1200)]


def test_peer_demo_elastic_grows_spreads_shrinks_and_stays_exact(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    out = tmp_path / "demo.out"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", TMPDIR=str(tmp_path))
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "peer.cli", "demo", "--elastic", "--summary", str(summary)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
        try:
            code = demo.wait(1100)
        except subprocess.TimeoutExpired:
            demo.kill()
            code = demo.wait(30)
        finally:
            for work in tmp_path.glob("peer-demo-elastic-*"):
                kill_launched(work)
    log = out.read_text()[-4000:]
    assert code == 0, log
    found = json.loads(summary.read_text())
    assert all(found["checks"].values()), found["checks"]
    assert found["exact"] == {f"ramp{i}": True for i in range(3)}
    actions = [(d["action"], d["current"], d["size"]) for d in found["decisions"]]
    grows = [a for a in actions if a[0] == "grow"]
    shrinks = [a for a in actions if a[0] == "shrink"]
    assert grows and max(size for _, _, size in grows) == 3, actions
    assert shrinks and shrinks[-1][2] == 1, actions
    assert all(d["reason"] and d["offered"] is not None for d in found["decisions"][1:])
    moved = [m for m in found["moves"] if m["ok"]]
    assert moved and all(m["contract"] == "" and m["partner"] == "acme" for m in moved)
    assert found["most_launched"] <= 2
