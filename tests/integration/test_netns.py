"""The partition of peer.testing.netns: a process in the namespace is reachable over the veth
pair, not at all (silently: a connect times out) while cut, and again once healed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from peer.testing import netns
from peer.testing.netns import Island

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and iproute2")

SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""


def greet(host: str, port: int, timeout_s: float) -> str:
    """What the server says, or the error connecting to it."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as c:
            return c.recv(2).decode()
    except OSError as exc:
        return type(exc).__name__


def test_a_cut_drops_everything_silently_and_a_heal_lets_it_through() -> None:
    with Island() as island:
        server = subprocess.Popen(
            [*island.prefix, sys.executable, "-c", SERVER, island.inside],
            stdout=subprocess.PIPE,
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            assert greet(island.inside, port, 5) == "hi"
            island.cut()
            began = time.monotonic()
            assert greet(island.inside, port, 1.5) == "TimeoutError"  # no reset, no error
            assert time.monotonic() - began >= 1.4
            island.heal()
            assert greet(island.inside, port, 5) == "hi"
        finally:
            server.kill()
            server.wait(10)
        name = island.name
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed.split()
