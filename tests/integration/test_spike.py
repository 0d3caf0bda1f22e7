"""Issue 5's live test: `peer demo --spike` as a separate process, which starts three `peer join`
processes of three participants (each with its own Spark) with contracts alpha-beta and
beta-gamma only, and puts a load spike on alpha. Boxes must move from alpha to beta and never to
gamma, alpha's load must fall under its capacity, every output must equal plain Python, and the
ledgers must record the moves on both sides.

Issue 13's browser test rides on the same run (one federation started, not two): the demo
prints each peer's dashboard URL and, with ``--hold``, keeps the peers up after its check.
Headless Chromium, driven by Selenium, opens alpha's dashboard while the spike runs and waits
for live data: every peer's node id, a running fragment, a tuple count and rate that grow while
the pushes run, a move out of alpha after the spike, and (issue 28) the moved fragment's boxes
drawn in the query diagram marked with beta. A screenshot is saved in the test's temporary
directory. Without Chromium (``scripts/test`` installs it where it can), the spike's
checks still run and the browser part is reported as skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RUN_TIMEOUT_S = 1100
STEP_S = 1.0


def test_a_load_spike_moves_boxes_to_the_contract_partner_only(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    out = tmp_path / "demo.out"
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "peer.cli",
                "demo",
                "--spike",
                "--duration",
                "35",
                "--summary",
                str(summary),
                "--hold",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"),
        )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    seen: dict[str, Any] | None = None
    try:
        urls = dashboards(out, demo, deadline)
        assert set(urls) == {"alpha", "beta", "gamma"}, out.read_text()[-3000:]
        if CHROMIUM and CHROMEDRIVER:
            seen = watch_dashboard(urls["alpha"], tmp_path, summary, demo, deadline)
        while not summary.exists() and demo.poll() is None and time.monotonic() < deadline:
            time.sleep(STEP_S)
        assert summary.exists(), out.read_text()[-4000:]
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)  # --hold: Ctrl-C stops the federation
        try:
            demo.wait(120)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(30)
    print(out.read_text()[-4000:])
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
    assert demo.returncode == 0
    if seen is None:
        pytest.skip(
            "the spike's checks passed; the dashboard's browser test needs chromium and "
            "chromedriver (Debian: apt-get install chromium chromium-driver; scripts/test "
            "installs them when it runs as root)"
        )
    assert moved & set(seen["moves"]), seen  # the page showed a move the ledger has
    assert moved & drawn_on(seen, "beta"), seen  # and drew the moved boxes on beta


def dashboards(out: Path, demo: subprocess.Popen[bytes], deadline: float) -> dict[str, str]:
    """The dashboard URL of each peer, as the demo prints them once the peers are up."""
    pattern = re.compile(r"dashboard of (\w+)\s+(http://\S+)")
    while time.monotonic() < deadline and demo.poll() is None:
        found = dict(pattern.findall(out.read_text(errors="replace")))
        if len(found) == 3:
            return found
        time.sleep(STEP_S)
    raise AssertionError(f"no dashboard URLs printed: {out.read_text()[-3000:]}")


def watch_dashboard(
    url: str, tmp_path: Path, summary: Path, demo: subprocess.Popen[bytes], deadline: float
) -> dict[str, Any]:
    """Open ``url`` in headless Chromium and read the page until it has shown everything the
    issue asks for; returns what it saw. A screenshot goes to ``tmp_path``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1500,2200")
    members = node_ids(url)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    seen: dict[str, Any] = {"nodes": set(), "running": set(), "counts": [], "rates": []}
    seen["moves"] = set()
    seen["drawn"] = set()  # (fragment, participant) of each box the query diagram showed
    settled: float | None = None
    try:
        driver.set_page_load_timeout(60)
        driver.set_script_timeout(30)
        driver.get(url)
        while time.monotonic() < deadline and demo.poll() is None:
            page = driver.execute_script(READ_PAGE)
            seen["nodes"] |= set(page["nodes"])
            seen["running"] |= set(page["running"])
            if page["count"] is not None:
                seen["counts"].append(page["count"])
            seen["rates"].append(page["rate"] or 0)
            seen["moves"] |= set(page["moves"])
            seen["drawn"] |= {(f, p) for f, p in page["boxes"]}
            if (
                members <= seen["nodes"]
                and seen["running"]
                and grew(seen["counts"])
                and max(seen["rates"]) > 0
                and seen["moves"]
                and drawn_on(seen, "beta") & seen["moves"]
            ):
                break
            if summary.exists():  # the check is over: the page gets a last half minute
                settled = settled or time.monotonic() + 30
                if time.monotonic() > settled:
                    break
            time.sleep(STEP_S)
        driver.save_screenshot(str(tmp_path / "dashboard.png"))
        (tmp_path / "dashboard.html").write_text(driver.page_source)
    finally:
        driver.quit()
    print("dashboard screenshot:", tmp_path / "dashboard.png")
    assert members <= seen["nodes"], (members, seen["nodes"])
    assert seen["running"], "no running fragment shown"
    assert grew(seen["counts"]), seen["counts"]
    assert max(seen["rates"]) > 0, seen["rates"]
    assert seen["moves"], "no move shown"
    assert drawn_on(seen, "beta") & seen["moves"], ("no moved box drawn on beta", seen["drawn"])
    return seen


def drawn_on(seen: dict[str, Any], participant: str) -> set[str]:
    """The fragments whose boxes the query diagram showed marked with ``participant``."""
    return {f for f, p in seen["drawn"] if p == participant}


def grew(counts: list[float]) -> bool:
    return len(counts) >= 2 and max(counts) > counts[0]


def node_ids(url: str) -> set[str]:
    """Every member's node id, from the peer's own /status (not from the page)."""
    with urllib.request.urlopen(url + "status", timeout=30) as response:
        status = json.loads(response.read())
    return {m["node_id"] for m in status["overlay"]["members"]}


# What the page shows, read from its DOM (data-* attributes the dashboard writes).
READ_PAGE = """
const nodes = [...document.querySelectorAll('.peer[data-node] .node-id')].map(e => e.textContent);
const running = [...document.querySelectorAll('tr[data-fragment][data-running="true"]')]
  .map(e => e.dataset.fragment);
const counts = [...document.querySelectorAll('#streams td.records-in')]
  .map(e => Number(e.dataset.value || 0));
const rates = [...document.querySelectorAll('#streams td.rate')]
  .map(e => Number(e.dataset.value || 0));
const moves = [...document.querySelectorAll('#moves tr.move[data-direction="out"][data-ok="true"]')]
  .map(e => e.dataset.fragment);
const boxes = [...document.querySelectorAll('#diagram g.box[data-fragment]')]
  .map(e => [e.dataset.fragment, e.dataset.participant || ""]);
return {
  nodes: nodes,
  running: running,
  count: counts.length ? counts.reduce((a, b) => a + b, 0) : null,
  rate: rates.length ? Math.max(...rates) : 0,
  moves: moves,
  boxes: boxes,
};
"""
