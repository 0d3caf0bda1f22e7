"""Helpers for testing code that talks to peers (shipped, as trio.testing is).

``PeerThread`` runs a real Peer (real sockets, real spools, the given or a new Spark session) on
its own event loop in a background thread, so that a synchronous test can drive it with the
real ``Client`` through ``asyncio.run``. ``collect`` gathers a stream's tuples until a count is
reached or a deadline passes. ``start_peer_process`` runs ``peer join`` as a separate process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from peer.node import Peer, PeerConfig


class PeerThread:
    def __init__(self, config: PeerConfig, spark: Any = None, *, ready_timeout_s: float = 180):
        self.config = config
        self.spark = spark
        self.ready_timeout_s = ready_timeout_s
        self.peer = Peer(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="peer-loop", daemon=True)

    def _main(self) -> None:
        async def body() -> None:
            self._loop = asyncio.get_running_loop()
            try:
                await self.peer.start(self.spark)
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                await self.peer.close()
                return
            self._ready.set()
            await self.peer.run()

        asyncio.run(body())

    @property
    def port(self) -> int:
        return self.peer.port

    def __enter__(self) -> PeerThread:
        self._thread.start()
        if not self._ready.wait(self.ready_timeout_s):
            raise TimeoutError(f"peer not ready after {self.ready_timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 60) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.peer.stop)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"peer did not stop within {timeout_s} s")

    def call(self, coro: Any, timeout_s: float = 60) -> Any:
        """Run a coroutine on the peer's own loop (for reaching into the peer in tests)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)


async def collect(
    client: Any,
    stream: str,
    count: int,
    *,
    timeout_s: float = 60,
    settle_s: float = 0.0,
    start: str = "earliest",
) -> list[dict[str, Any]]:
    """Rows of ``stream`` until ``count`` arrived or ``timeout_s`` passed; with ``settle_s``,
    the same subscription then goes on that long, so that extra rows (duplicates) show."""
    rows: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            settling = False
            async for batch in client.subscribe(stream, start=start):
                rows.extend(batch.rows())
                if len(rows) >= count and not settling:
                    if settle_s <= 0:
                        break
                    settling = True
                    deadline.reschedule(loop.time() + settle_s)
    except TimeoutError:
        pass
    return rows


def stream_name_on(host: bytes, node_ids: Iterable[bytes], prefix: str) -> str:
    """A stream name ``<prefix><i>`` the overlay places on ``host``: of ``node_ids``, ``host``
    is the XOR-closest to its stream target (so ``host`` hosts it once it is created)."""
    from overlay.membership import stream_target

    ids = [int.from_bytes(n, "big") for n in node_ids]
    mine = int.from_bytes(host, "big")
    for i in range(100_000):
        name = f"{prefix}{i}"
        target = int.from_bytes(stream_target(name), "big")
        if min(ids, key=lambda n: n ^ target) == mine:
            return name
    raise ValueError(f"no stream name {prefix}N lands on {host.hex()[:12]}")


def keyed_window_box(
    inp: str, out: str, *, node: str | None = None, name: str = "per_key"
) -> dict[str, Any]:
    """A 10 s tumbling sum(v) as ``s`` and count() as ``n`` per key ``k`` over ``t``."""
    return {
        "name": name,
        "type": "aggregate",
        **({"node": node} if node is not None else {}),
        "inputs": [inp],
        "outputs": [out],
        "params": {
            "aggregate-function.0": "sum(v)",
            "aggregate-function-output-name.0": "s",
            "aggregate-function.1": "count()",
            "aggregate-function-output-name.1": "n",
            "window-size": "10",
            "advance": "10",
            "order-on-field": "t",
            "group-by": "k",
        },
    }


def keyed_window_query(
    name: str,
    source: str,
    out: str,
    *,
    site: str | None = None,
    at_least: int = 0,
    kept: str | None = None,
) -> dict[str, Any]:
    """A filter (``v >= at_least``) then :func:`keyed_window_box`, both boxes placed on
    ``site`` if given: the workload of the move, recovery and spike tests and benchmarks."""
    middle = kept or f"{name}_kept"
    keep = {
        "name": "keep",
        "type": "filter",
        **({"node": site} if site is not None else {}),
        "inputs": [source],
        "outputs": [middle],
        "params": {"expression.0": f"v >= {at_least}"},
    }
    return {"name": name, "boxes": [keep, keyed_window_box(middle, out, node=site)]}


def keyed_window_sums(
    batches: list[dict[str, list[int]]], *, at_least: int = 0, scale: int = 1
) -> Counter[tuple[int, ...]]:
    """Plain Python for :func:`keyed_window_query` (with ``scale``: of ``v * scale``):
    (start, end, k, sum, count) of every window the largest ``t`` closes (the watermark is
    taken over all tuples, so the last batch must pass the filter)."""
    watermark = max(max(b["t"]) for b in batches)
    acc: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for b in batches:
        for k, v, t in zip(b["k"], b["v"], b["t"], strict=True):
            if v >= at_least:
                cell = acc[(t // 10 * 10, k)]
                cell[0] += v * scale
                cell[1] += 1
    return Counter(
        (s, s + 10, k, total, n) for (s, k), (total, n) in acc.items() if s + 10 <= watermark
    )


def signed_contracts(
    work: Path, pairs: list[tuple[str, str, float]], *, days: float = 1.0
) -> tuple[dict[str, Path], dict[tuple[str, str], str]]:
    """Keys in ``work/keys`` for every participant named, and one contract per ``(a, b, price)``
    signed by both, in ``work/contracts/a-b.toml``; returns the key files and contract ids."""
    from contracts import contract as ct
    from contracts.keys import generate, load_private
    from overlay.identity import raw_public

    names = sorted({n for a, b, _ in pairs for n in (a, b)})
    keys: dict[str, Path] = {}
    for name in names:
        keys[name], _pub = generate(name, work / "keys", overwrite=True)
    private = {n: load_private(keys[n]) for n in names}
    (work / "contracts").mkdir(parents=True, exist_ok=True)
    ids: dict[tuple[str, str], str] = {}
    for a, b, price in pairs:
        made = ct.create(
            a,
            raw_public(private[a].public_key()),
            b,
            raw_public(private[b].public_key()),
            price=price,
            days=days,
        )
        signed = ct.sign(ct.sign(made, private[a]), private[b])
        ct.dump(signed, work / "contracts" / f"{a}-{b}.toml")
        ids[(a, b)] = signed.id
    return keys, ids


class PeerProcess:
    """``peer join`` as a separate process on an ephemeral loopback port."""

    def __init__(self, data_dir: Path, *extra: str, log_path: Path | None = None) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.log_path = log_path or data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.overlay_port = 0
        self.node_id = ""

    def start(self, timeout_s: float = 180) -> PeerProcess:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> PeerProcess:
        """Start the process without waiting (start several, then ``wait_ready`` each)."""
        marker = self.data_dir / "peer.json"
        if marker.exists():
            marker.unlink()
        log = self.log_path.open("ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "peer.cli",
                "join",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                "127.0.0.1:0",
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        return self

    def wait_ready(self, timeout_s: float = 180) -> PeerProcess:
        assert self.proc is not None, "launch() first"
        marker = self.data_dir / "peer.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"peer exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            if marker.exists():
                try:
                    info = json.loads(marker.read_text())
                except ValueError:  # being written
                    time.sleep(0.05)
                    continue
                self.port = int(info["port"])
                self.overlay_port = int(info.get("overlay_port", 0))
                self.node_id = str(info.get("node_id", ""))
                return self
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(f"peer not ready after {timeout_s} s")

    @property
    def overlay_addr(self) -> str:
        return f"127.0.0.1:{self.overlay_port}"

    def kill(self) -> None:
        """SIGKILL the peer and the JVM it started (its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def __enter__(self) -> PeerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
