"""A local federation: participants with keys that trust each other, each running a peer.

``peer demo`` (and its spike), the multi-process tests and the benchmarks all need the same
thing: a key pair per participant in ``WORK/keys``, every public key in one trust directory
``WORK/trust`` (all of them before any peer reads it), optionally contracts signed by both
parties in ``WORK/contracts``, and one ``peer join`` process per participant on an ephemeral
loopback port, its data in ``WORK/NAME`` and its log in ``WORK/NAME.log``.

:class:`PeerProcess` is one such process: it announces itself through the ``peer.json``
marker that ``peer join`` writes once it serves (port, overlay port, node id).
:class:`LocalFederation` starts several: the first alone (the others bootstrap through its
overlay address), then the rest together, and stops them all at once (SIGTERM, then SIGKILL
to whatever outlived it). :func:`stream_name_on` picks a stream name the overlay places on a
chosen peer, and :func:`collect` reads a stream's tuples from a peer until a count arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from peer.timing import wait_until as poll
from peer.timing import wait_until_sync as poll_sync

__all__ = [
    "LocalFederation",
    "PeerProcess",
    "collect",
    "make_participants",
    "participant_args",
    "signed_contracts",
    "stream_name_on",
    "trust_all",
    "wait_until",
]


class PeerProcess:
    """``peer join`` as a separate process on an ephemeral loopback port."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
        verbose: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.log_path = log_path or data_dir.with_suffix(".log")
        self.host = host  # the address it listens on (API and overlay, ephemeral ports)
        self.prefix = tuple(prefix)  # runs the command (e.g. ip netns exec NAME)
        self.verbose = verbose  # peer -v join: its log has the INFO lines
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.overlay_port = 0
        self.node_id = ""
        self.http = ""  # the dashboard's URL (peer join --http), once ready

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
                *self.prefix,
                sys.executable,
                "-m",
                "peer.cli",
                *(["-v"] if self.verbose else []),
                "join",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"{self.host}:0",
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
        proc, marker = self.proc, self.data_dir / "peer.json"

        def ready() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"peer exited with {proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            if not marker.exists():
                return None
            try:
                found: dict[str, Any] = json.loads(marker.read_text())
            except ValueError:  # being written
                return None
            return found

        try:
            info = poll_sync(ready, "peer ready", timeout_s, every_s=0.05)
        except TimeoutError:
            self.kill()
            raise TimeoutError(f"peer not ready after {timeout_s} s") from None
        self.port = int(info["port"])
        self.overlay_port = int(info.get("overlay_port", 0))
        self.node_id = str(info.get("node_id", ""))
        self.http = str(info.get("http", ""))
        return self

    @property
    def overlay_addr(self) -> str:
        return f"{self.host}:{self.overlay_port}"

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


# -- participants: keys, trust, contracts -------------------------------------------------------


def trust_all(trust: Path, keys: Iterable[Path]) -> Path:
    """Copy the public key (``NAME.pub`` beside ``NAME.key``) of every key into ``trust``."""
    trust.mkdir(parents=True, exist_ok=True)
    for key in keys:
        pub = key.with_suffix(".pub")
        shutil.copyfile(pub, trust / pub.name)
    return trust


def make_participants(work: Path, names: Iterable[str]) -> dict[str, Path]:
    """A key pair per participant in ``work/keys`` and every public key in ``work/trust``;
    returns each participant's private key file."""
    from contracts.keys import generate

    keys = {name: generate(name, work / "keys")[0] for name in names}
    trust_all(work / "trust", keys.values())
    return keys


def participant_args(name: str, key: Path, trust: Path) -> list[str]:
    """The ``peer join`` options of participant ``name``."""
    return ["--participant", name, "--key", str(key), "--trust", str(trust)]


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


# -- the processes --------------------------------------------------------------------------------

Wait = Callable[[str, PeerProcess], None]


class LocalFederation:
    """One ``peer join`` process per participant, joined into one overlay through the first.

    ``args`` gives, in start order, each participant's ``peer join`` options (its identity,
    see :func:`participant_args`, and anything else); the federation adds ``--bootstrap``.
    ``hosts`` and ``prefixes`` place some of them elsewhere than loopback (see
    :class:`PeerProcess`; :mod:`peer.testing.netns` makes such places).
    """

    def __init__(
        self,
        work: Path,
        args: Mapping[str, Sequence[str]],
        *,
        hosts: Mapping[str, str] | None = None,
        prefixes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.work = work
        self.args = dict(args)
        self.hosts = dict(hosts or {})
        self.prefixes = dict(prefixes or {})
        self.procs: dict[str, PeerProcess] = {}

    @property
    def names(self) -> list[str]:
        return list(self.args)

    def start(self, *, timeout_s: float = 180, wait: Wait | None = None) -> LocalFederation:
        """Launch the first peer and wait until it serves, then the others together.

        ``wait(name, proc)`` waits for one peer (default: ``proc.wait_ready(timeout_s)``); a
        caller that shows each peer as it comes up, or words a failure its own way, passes
        its own. Started peers stay in :attr:`procs` for :meth:`stop` whatever happens.
        """

        def ready(name: str, proc: PeerProcess) -> None:
            proc.wait_ready(timeout_s)

        wait = wait or ready
        first: PeerProcess | None = None
        for name, options in self.args.items():
            extra = ["--bootstrap", first.overlay_addr] if first is not None else []
            proc = PeerProcess(
                self.work / name,
                *options,
                *extra,
                log_path=self.work / f"{name}.log",
                host=self.hosts.get(name, "127.0.0.1"),
                prefix=self.prefixes.get(name, ()),
            )
            self.procs[name] = proc.launch()
            if first is None:  # the others bootstrap through it: start them once it is up
                first = proc
                wait(name, proc)
        for name, proc in list(self.procs.items())[1:]:
            wait(name, proc)
        return self

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM every peer at once, wait up to ``timeout_s`` for each (a second Ctrl-C
        ends the waiting), then SIGKILL whatever is left of them."""

        def stop(proc: PeerProcess) -> None:
            with contextlib.suppress(Exception):
                proc.stop(timeout_s)

        procs = list(self.procs.values())
        threads = [threading.Thread(target=stop, args=(p,), daemon=True) for p in procs]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout_s + 15)
        except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
            pass
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()

    def __enter__(self) -> LocalFederation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- reading the federation -----------------------------------------------------------------------


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


class RowBatch(Protocol):
    def rows(self) -> list[dict[str, Any]]: ...


class Subscriber(Protocol):
    """What :func:`collect` needs of a client (``peer.client.Client`` is one)."""

    def subscribe(self, stream: str, start: str = ...) -> AsyncIterable[RowBatch]: ...


async def collect(
    client: Subscriber,
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


async def wait_until(
    probe: Callable[[], Any], what: str, timeout_s: float, *, every_s: float = 0.1
) -> Any:
    """Await ``probe()`` every ``every_s`` until it returns something true (returned) or
    ``timeout_s`` has passed (TimeoutError naming ``what`` and the last outcome). Errors of a
    federation in flux (a peer not up yet, refusing, timing out) count as a false outcome:
    :func:`peer.timing.wait_until` with those tolerated."""
    from peer.errors import FedstreamError

    return await poll(
        probe, what, timeout_s, every_s=every_s, tolerate=(FedstreamError, TimeoutError, OSError)
    )
