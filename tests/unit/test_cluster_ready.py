"""PeerProcess.wait_ready polls the peer's marker file through the one poll helper: it reads
the ports once the file is whole, names a peer that exited, and kills one that is too slow
(real child processes stand in for peers: no JVM, no sockets)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from peer.testing.cluster import PeerProcess


def stand_in(tmp_path: Path, script: str) -> PeerProcess:
    data = tmp_path / "peer"
    data.mkdir()
    process = PeerProcess(data)
    process.log_path.write_text("the peer's log\n")
    # its own process group, as launch() starts a peer: kill() ends the group
    process.proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=data, start_new_session=True
    )
    return process


def test_the_ports_are_read_once_the_marker_is_whole(tmp_path: Path) -> None:
    info = {"port": 4101, "overlay_port": 4102, "node_id": "ab" * 20, "http": ""}
    script = (
        "import json, pathlib, signal, time\n"
        "pathlib.Path('peer.json').write_text('{\"port\": 41')\n"  # half written first
        "time.sleep(0.3)\n"
        f"pathlib.Path('peer.json').write_text({json.dumps(json.dumps(info))})\n"
        "signal.pause()\n"  # up until killed
    )
    process = stand_in(tmp_path, script)
    try:
        assert process.wait_ready(20) is process
        assert (process.port, process.overlay_port, process.node_id) == (4101, 4102, "ab" * 20)
    finally:
        process.kill()


def test_a_peer_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    process = stand_in(tmp_path, "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"peer exited with 3: the peer's log"):
        process.wait_ready(20)


def test_a_peer_too_slow_is_killed(tmp_path: Path) -> None:
    process = stand_in(tmp_path, "import signal; signal.pause()")
    with pytest.raises(TimeoutError, match=r"peer not ready after 0\.5 s"):
        process.wait_ready(0.5)
    assert process.proc is not None and process.proc.wait(10) != 0  # killed
