"""The Node.js client of tests/node/, written from docs/protocol.md, against a real peer.

``node --test`` runs it as a subprocess against a ``peer join --no-engine`` process on a
loopback port; every check of the document's promises is a test there, and this test fails
with node's report when one of them fails. Skipped, saying so, only where ``node`` is absent
(scripts/env.sh installs it where it can).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from peer.testing import PeerProcess

CLIENT = Path(__file__).parent.parent / "node" / "client.test.mjs"


def test_node_client_written_from_the_protocol_document(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js protocol client was not run")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    major = re.match(r"v(\d+)", version.stdout.strip())
    if major is None or int(major.group(1)) < 18:
        pytest.skip(f"node {version.stdout.strip()} has no test runner (needs 18 or later)")
    with PeerProcess(tmp_path / "data", "--no-engine", log_path=tmp_path / "peer.log") as peer:
        done = subprocess.run(
            [node, "--test", "--test-reporter=tap", str(CLIENT)],
            env=dict(os.environ, PEER_ADDR=f"127.0.0.1:{peer.port}"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    passed = re.search(r"^# pass (\d+)$", report, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= 7, report
    assert re.search(r"^# fail 0$", report, re.MULTILINE), report
