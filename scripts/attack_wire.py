"""Re-run the wire and connection attacks of issue 12 from outside, against real peers.

Starts two ``peer join --no-engine`` processes (participants ``a`` and ``b``, trusting each
other) on loopback with ephemeral ports, then runs each attack against ``a`` while measuring:

* the slowest ``hello`` answer of a concurrent client of ``a`` (a blocking-socket probe in a
  thread, one hello every 50 ms),
* ``a``'s RSS growth (peak during the attack minus before, from /proc),
* whether ``b`` still sees ``a`` alive (its overlay status, polled during the attack),
* and the outcome (what ``a`` answered, or what happened).

    PYTHONPATH=. .venv/bin/python scripts/attack_wire.py [--only NAME ...] [--json]

Everything it started is stopped at the end (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from peer.client import Client
from peer.testing.cluster import (
    LocalFederation,
    PeerProcess,
    make_participants,
    participant_args,
    stream_name_on,
)
from peer.testing.probe import HelloProbe, connect, frame_bytes, read_frame

MB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@dataclass
class Outcome:
    attack: str
    result: str = ""
    hello_max_s: float = 0.0
    hello_failures: int = 0
    rss_growth_mb: float = 0.0
    partner_saw_alive: bool = True
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


async def _members(port: int) -> dict[str, str]:
    async with Client("127.0.0.1", port, timeout_s=5) as client:
        status = await client.status()
    return {m["participant"]: m["state"] for m in status["overlay"]["members"]}


class Watch:
    """Samples the attacked peer's RSS and its partner's view of it while an attack runs."""

    def __init__(self, attacked: PeerProcess, partner: PeerProcess) -> None:
        assert attacked.proc is not None
        self.pid = attacked.proc.pid
        self.partner = partner
        self.before = rss_bytes(self.pid)
        self.peak = self.before
        self.alive_all_along = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        next_view = 0.0
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_bytes(self.pid))
            if time.monotonic() >= next_view:
                next_view = time.monotonic() + 1.0
                try:
                    state = asyncio.run(_members(self.partner.port)).get("a")
                except Exception:
                    state = None
                if state not in ("alive",):
                    self.alive_all_along = False
            self._stop.wait(0.05)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@contextlib.contextmanager
def measured(name: str, a: PeerProcess, b: PeerProcess) -> Iterator[Outcome]:
    outcome = Outcome(name)
    started = time.monotonic()
    with HelloProbe(a.port) as probe, Watch(a, b) as watch:
        time.sleep(0.3)
        yield outcome
        time.sleep(1.0)
    outcome.seconds = round(time.monotonic() - started, 1)
    outcome.hello_max_s = round(probe.slowest_s, 3)
    outcome.hello_failures = len(probe.failures)
    outcome.rss_growth_mb = round((watch.peak - watch.before) / MB, 1)
    outcome.partner_saw_alive = watch.alive_all_along
    print(json.dumps(outcome.__dict__), flush=True)


def exchange(port: int, data: bytes, timeout_s: float = 60) -> str:
    with connect(port, timeout_s=timeout_s) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        reply = read_frame(sock)
    if reply is None:
        return "connection closed without a reply"
    return f"{reply.get('code')}: {str(reply.get('message'))[:160]}"


# -- the attacks ------------------------------------------------------------------------------


def maps_67m(a: PeerProcess, out: Outcome) -> None:
    n = 64 * MB - 32
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    out.result = exchange(a.port, struct.pack(">I", len(body)) + body)


def maps_many_arrays(a: PeerProcess, out: Outcome) -> None:
    one = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x80" * 1_000_000
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\xdc\x00\x3c" + one * 60
    out.result = exchange(a.port, struct.pack(">I", len(body)) + body)


def deep_nesting(a: PeerProcess, out: Outcome) -> None:
    body = b"\x82\xa4type\xa4push\xa4rows" + b"\x91" * 1000 + b"\xc0"
    out.result = exchange(a.port, struct.pack(">I", len(body)) + body)


def half_frames(a: PeerProcess, out: Outcome) -> None:
    socks = [connect(a.port, timeout_s=90) for _ in range(8)]
    started = time.monotonic()
    for sock in socks:
        sock.sendall(struct.pack(">I", 64 * MB) + b"\x82" + b"\x00" * (60 * MB))
    replies = [read_frame(sock) for sock in socks]
    for sock in socks:
        sock.close()
    dropped = sum(1 for r in replies if r is not None and "frame_timeout_s" in str(r))
    out.result = f"{dropped}/8 dropped (frame_timeout_s) after {time.monotonic() - started:.0f} s"


def idle_api(a: PeerProcess, out: Outcome) -> None:
    hogs = [connect(a.port) for _ in range(256)]
    time.sleep(3.0)
    started = time.perf_counter()
    with connect(a.port) as newcomer:
        newcomer.sendall(frame_bytes({"type": "hello", "id": 1, "client": "newcomer"}))
        reply = read_frame(newcomer)
    took = time.perf_counter() - started
    for hog in hogs:
        hog.close()
    out.result = f"newcomer hello: {(reply or {}).get('type')} in {took:.2f} s"


def idle_link(a: PeerProcess, out: Outcome, join: Callable[[], PeerProcess]) -> None:
    hogs = [socket.create_connection(("127.0.0.1", a.overlay_port)) for _ in range(256)]
    time.sleep(3.0)
    started = time.monotonic()
    c = join()
    try:
        deadline = time.monotonic() + 30
        members: dict[str, str] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                members = asyncio.run(_members(c.port))
            if members.get("a") == "alive":
                break
            time.sleep(0.5)
        seen = members.get("a") == "alive"
        out.result = (
            f"joining peer c sees a alive after {time.monotonic() - started:.1f} s"
            if seen
            else f"joining peer c does not see a ({members})"
        )
    finally:
        c.stop(30)
        for hog in hogs:
            hog.close()


def big_echo(a: PeerProcess, out: Outcome) -> None:
    name = "n" * (40 * MB)
    with connect(a.port, timeout_s=60) as sock:
        sock.sendall(frame_bytes({"type": "lookup", "id": 7, "name": name}))
        reply = read_frame(sock) or {}
    out.result = f"{reply.get('code')}, reply of {len(json.dumps(reply))} bytes"


def relay_quota(a: PeerProcess, b: PeerProcess, out: Outcome) -> None:
    async def main() -> str:
        node_ids = [bytes.fromhex(a.node_id), bytes.fromhex(b.node_id)]
        async with Client("127.0.0.1", a.port, timeout_s=30) as admin:
            await admin.create_schema({"name": "s", "fields": [{"name": "x", "type": "int"}]})
            names = []
            for i in range(65):
                name = stream_name_on(bytes.fromhex(a.node_id), node_ids, f"r{i}_")
                await admin.create_stream(name, "s")
                names.append(name)
        refused, last = 0, ""
        async with Client("127.0.0.1", b.port, timeout_s=30) as hog:
            subs = []
            for name in names[:64]:
                try:
                    subs.append(await hog.subscribe(name))
                except Exception as exc:
                    refused += 1
                    last = str(exc)
            async with Client("127.0.0.1", b.port, timeout_s=30) as other:
                sub = await other.subscribe(names[64])
                other_ok = sub is not None
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.aclose()
        return (
            f"{64 - refused} relayed, {refused} refused ({last[:90]}...); "
            f"another client's subscription: {'ok' if other_ok else 'failed'}"
        )

    out.result = asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attack-wire-"))
    keys = make_participants(work, ["a", "b", "c"])
    trust = work / "trust"
    fed = LocalFederation(
        work,
        {name: [*participant_args(name, keys[name], trust), "--no-engine"] for name in "ab"},
    )
    fed.start()
    a, b = fed.procs["a"], fed.procs["b"]
    joined: list[PeerProcess] = []

    def join_c() -> PeerProcess:
        c_args = [*participant_args("c", keys["c"], trust), "--no-engine"]
        c = PeerProcess(work / "c", *c_args, "--bootstrap", a.overlay_addr, log_path=work / "c.log")
        joined.append(c)
        return c.start(120)

    attacks: dict[str, Callable[[Outcome], None]] = {
        "maps_67m": lambda out: maps_67m(a, out),
        "maps_many_arrays": lambda out: maps_many_arrays(a, out),
        "deep_nesting": lambda out: deep_nesting(a, out),
        "half_frames": lambda out: half_frames(a, out),
        "idle_api": lambda out: idle_api(a, out),
        "idle_link": lambda out: idle_link(a, out, join_c),
        "big_echo": lambda out: big_echo(a, out),
        "relay_quota": lambda out: relay_quota(a, b, out),
    }
    try:
        deadline = time.monotonic() + 60
        while asyncio.run(_members(b.port)).get("a") != "alive":
            if time.monotonic() > deadline:
                raise TimeoutError("b never saw a alive")
            time.sleep(0.5)
        for name, attack in attacks.items():
            if args.only and name not in args.only:
                continue
            with measured(name, a, b) as out:
                try:
                    attack(out)
                except Exception as exc:
                    out.result = f"attack failed: {exc!r}"
    finally:
        for proc in joined:
            with contextlib.suppress(Exception):
                proc.stop(10)
        fed.stop()
    print(f"logs in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
