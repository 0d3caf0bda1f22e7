"""``peer demo``: the local federation demo, run as a user runs it (a subprocess, stdout not a
terminal, so plain progress lines), on small inputs; plus its pure helpers."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from peer.demo.examples import participant_names, placement
from peer.demo.inputs import batches, schedule
from peer.examples import traffic


def run_demo(*args: str, timeout_s: float = 420) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peer.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        check=False,
    )


def check_passed(proc: subprocess.CompletedProcess[str], outputs: tuple[str, ...]) -> None:
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}\n{proc.stderr[-3000:]}"
    for stream in outputs:
        assert re.search(rf"^MATCH {stream}: \d+ tuples read on \w+ \(host \w+\)", out, re.M), out
    assert "MISMATCH" not in out
    assert "PASS: every output stream equals the plain-Python reference" in out
    assert "peers stopped" in out
    # every peer is gone: its API port refuses connections
    ports = [int(p) for p in re.findall(r"API 127\.0\.0\.1:(\d+)", out)]
    assert ports
    for port in ports:
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_traffic_demo_on_three_peers_matches_the_reference() -> None:
    proc = run_demo("--cars", "20", "--minutes", "6", "--duration", "6")
    check_passed(proc, traffic.OUTPUTS)
    out = proc.stdout
    assert "overlay formed: every peer sees 3 alive" in out
    assert "3 fragments placed" in out
    # results are read on a peer that does not host them
    for reader, host in re.findall(
        r"^MATCH \w+: \d+ tuples read on (\w+) \(host (\w+)\)", out, re.M
    ):
        assert reader != host


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_intrusion_demo_on_one_peer_matches_the_reference() -> None:
    proc = run_demo(
        "--example", "intrusion", "--peers", "1", "--cars", "8", "--minutes", "3", "--duration", "4"
    )
    check_passed(proc, ("intrusion_alerts",))
    assert "every peer sees 1 alive" in proc.stdout


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_partition_demo_shows_tentative_tolls_then_the_corrections() -> None:
    proc = run_demo("--partition", "--duration", "10")
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}\n{proc.stderr[-3000:]}"
    frozen, thawed = out.index("globex frozen (SIGSTOP)"), out.index("globex thawed (SIGCONT)")
    assert "TENTATIVE" in out[frozen:thawed] or "TENTATIVE" in out[thawed : out.index("UNDO")]
    assert out.index("UNDO") > thawed
    assert re.search(r"^MATCH: (\d+) stable toll windows against plain Python's \1;", out, re.M)
    assert "left open" in out and ", 0 left open" in out


def test_a_bad_option_is_refused_before_anything_starts() -> None:
    proc = run_demo("--peers", "0", timeout_s=60)
    assert proc.returncode == 2
    assert "--peers must be between 1 and" in proc.stdout


# -- the pure helpers --


def test_box_groups_are_dealt_to_the_participants_round_robin() -> None:
    names = participant_names(2)
    assert names == ["acme", "globex"]
    nodes = placement(traffic.BOX_GROUPS, names)
    assert nodes == {
        "per_minute": "acme",
        "toll": "acme",
        "moving": "globex",
        "bill": "globex",
        "stopped": "acme",
        "dispatch": "acme",
    }
    assert set(placement(traffic.BOX_GROUPS, ["solo"]).values()) == {"solo"}
    assert participant_names(10)[-1] == "org10"


def test_batches_keep_order_and_schedule_keeps_streams_in_step() -> None:
    inputs = traffic.generate(3, cars=10, minutes=4)
    cut = {s: batches(rows, 30) for s, rows in inputs.items()}
    for stream, parts in cut.items():
        assert [r for _, part in parts for r in part] == inputs[stream]  # nothing reordered
        assert [slot for slot, _ in parts] == sorted({slot for slot, _ in parts})
    when = schedule(cut, 8, 16.0)
    assert when["car_positions"][:3] == [0.0, 2.0, 4.0]
    assert when["car_positions"][-1] == 16.0  # the flush batch comes last
    assert when["car_positions"] == when["tow_trucks"]
