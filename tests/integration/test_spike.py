"""Issue 5's live test: `peer demo --spike` as a separate process, which starts three `peer join`
processes of three participants (each with its own Spark) with contracts alpha-beta and
beta-gamma only, and puts a load spike on alpha. Boxes must move from alpha to beta and never to
gamma, alpha's load must fall under its capacity, every output must equal plain Python, and the
ledgers must record the moves on both sides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_load_spike_moves_boxes_to_the_contract_partner_only(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "peer.cli",
            "demo",
            "--spike",
            "--duration",
            "25",
            "--summary",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=1100,
        cwd=tmp_path,
    )
    print(done.stdout[-4000:], done.stderr[-4000:])
    result = json.loads(summary.read_text())
    checks = result["checks"]
    assert checks["outputs exact"], result["exact"]
    assert checks["boxes moved alpha -> beta"], result["ledgers"]
    assert checks["nothing moved to gamma"], result["running_on"]
    assert checks["alpha under capacity at the end"], result["alpha_util_end"]
    assert result["alpha_util_peak"] > 1.0  # there was a spike to shed
    moved = {e["fragment"] for e in result["moves"]}
    arrived = {
        e["fragment"] for e in result["ledgers"]["beta"] if e["direction"] == "in" and e["ok"]
    }
    assert moved and moved <= arrived  # both sides' ledgers record each move
    assert all(e["pause_s"] > 0 and e["contract"] for e in result["moves"])
    assert not result["ledgers"]["gamma"]
    assert done.returncode == 0
