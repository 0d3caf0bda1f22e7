"""A peer whose participant the federation does not trust: `peer join` exits 2 saying so.

Real `peer join --no-engine` processes on loopback: participant a runs alone (no --bootstrap:
a standalone peer still starts); participant b, trusting a, tries to join through it while a
does not trust b, and exits 2 within its --bootstrap-timeout, naming b and the fix. Once a
holds b.pub in its trust directory and is restarted, the same command joins.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peer.client import Client
from peer.testing import PeerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def peer_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peer.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def members(port: int) -> set[str]:
    async with Client("127.0.0.1", port) as c:
        status = await c.status()
    return {m["participant"] for m in status["overlay"]["members"] if m["state"] == "alive"}


def test_a_refused_bootstrap_exits_2_naming_the_participant_and_the_fix(tmp_path: Path) -> None:
    keys, trust_b = tmp_path / "keys", tmp_path / "trust-b"
    for name in ("a", "b"):
        assert peer_cli("keygen", name, "--dir", str(keys)).returncode == 0
    trust_b.mkdir()
    shutil.copy(keys / "a.pub", trust_b / "a.pub")
    a_data = tmp_path / "a"
    a_args = ("--no-engine", "--participant", "a", "--key", str(keys / "a.key"))
    b_args = ["join", "--no-engine", "--participant", "b", "--key", str(keys / "b.key")]
    b_args += [
        "--trust",
        str(trust_b),
        "--data-dir",
        str(tmp_path / "b"),
        "--listen",
        "127.0.0.1:0",
    ]
    with PeerProcess(a_data, *a_args) as a:
        refused = peer_cli(*b_args, "--bootstrap", a.overlay_addr, "--bootstrap-timeout", "5")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "peer ready" not in refused.stdout
        message = " ".join(refused.stderr.split())
        assert "did not admit participant 'b'" in message
        assert "copy b.pub" in message and "trust directory" in message
        assert asyncio.run(members(a.port)) == {"a"}
    # The fix, as the message says: b.pub into a's trust directory, a restarted.
    (a_data / "trust").mkdir()
    shutil.copy(keys / "b.pub", a_data / "trust" / "b.pub")
    with (
        PeerProcess(a_data, *a_args) as a,
        PeerProcess(tmp_path / "b", *b_args[1:-4], "--bootstrap", a.overlay_addr) as b,
    ):
        assert asyncio.run(members(b.port)) >= {"b"}

        async def both() -> bool:
            for _ in range(100):
                if await members(a.port) == {"a", "b"}:
                    return True
                await asyncio.sleep(0.2)
            return False

        assert asyncio.run(both())
