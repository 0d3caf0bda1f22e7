"""A network namespace joined to this one by a veth pair, and a partition between the two.

Theory of operation
-------------------
:class:`Island` makes a namespace ``fs<tag>`` and a veth pair, ``fsh<tag>`` here with
``outside`` (``10.213.X.1/30``) and ``fsn<tag>`` in the namespace with ``inside``
(``10.213.X.2/30``), loopback up in both. A process started with :attr:`Island.prefix`
(``ip netns exec fs<tag>``) lives on the island; a peer here that listens on ``outside`` and
one there on ``inside`` reach each other over the pair, as two hosts on one link would.

:meth:`Island.cut` partitions them the way a failed switch does: silently. Each side's
neighbour entry for the other is pinned to a MAC address nobody has, so every frame either
side sends is dropped by the receiving veth (it is not addressed to it): no reset, no
unreachable error, no carrier change; connections hang and their timeouts fire, as in a real
partition. :meth:`Island.heal` removes the pinned entries; ARP finds the real addresses again
and TCP's retransmissions carry on. (Taking the link down instead would fail every send at
once with ENETUNREACH, a kinder fault than a partition.)

:class:`Cutoff` drives either fault (this partition, or SIGSTOP) for a test or benchmark of a
``LocalFederation``. It needs root and ``ip`` (iproute2); :func:`available` says whether
this machine has both.
Everything made is removed on exit, also when a step of making it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from peer.client import Client
from peer.testing.cluster import PeerProcess

__all__ = ["Cutoff", "Island", "available", "whole_again"]

NOBODY_MAC = "02:00:00:00:00:01"  # locally administered; no interface here has it
_serial = itertools.count()


def available() -> bool:
    """Whether this process may make namespaces (root, with iproute2)."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


class Island:
    """A namespace reachable from here over one veth pair (see the module docstring)."""

    def __init__(self) -> None:
        n = next(_serial)
        tag = f"{os.getpid() % 100000}{n}"
        self.name = f"fs{tag}"
        self.here = f"fsh{tag}"
        self.there = f"fsn{tag}"
        block = (os.getpid() + n) % 250 + 1
        self.outside = f"10.213.{block}.1"
        self.inside = f"10.213.{block}.2"
        self.prefix: tuple[str, ...] = ("ip", "netns", "exec", self.name)

    def __enter__(self) -> Island:
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.here, "type", "veth", "peer", "name", self.there)
            _ip("link", "set", self.there, "netns", self.name)
            _ip("addr", "add", f"{self.outside}/30", "dev", self.here)
            _ip("link", "set", self.here, "up")
            _ip("-n", self.name, "addr", "add", f"{self.inside}/30", "dev", self.there)
            _ip("-n", self.name, "link", "set", self.there, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def cut(self) -> None:
        """Drop every frame between the two sides, both ways, silently."""
        _ip("neigh", "replace", self.inside, "lladdr", NOBODY_MAC, "dev", self.here,
            "nud", "permanent")  # fmt: skip
        _ip("-n", self.name, "neigh", "replace", self.outside, "lladdr", NOBODY_MAC,
            "dev", self.there, "nud", "permanent")  # fmt: skip

    def heal(self) -> None:
        """Let frames through again (ARP relearns the real addresses)."""
        with contextlib.suppress(RuntimeError):
            _ip("neigh", "del", self.inside, "dev", self.here)
        with contextlib.suppress(RuntimeError):
            _ip("-n", self.name, "neigh", "del", self.outside, "dev", self.there)

    def remove(self) -> None:
        """Delete the namespace and the pair (whatever of them exists)."""
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            _ip("netns", "del", self.name)
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            _ip("link", "del", self.here)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class Cutoff:
    """How a test or benchmark cuts one participant's peer off from the others, and speaks to
    the peers meanwhile: partitioned (``island``: that peer runs on it, the others listen on
    its outside address) or, with no island, frozen with SIGSTOP (everyone on loopback).
    Clients of peers off loopback speak TLS as their participant, as such peers require."""

    def __init__(self, island: Island | None, keys: Mapping[str, Path], trust: Path) -> None:
        self.island = island
        self.keys = keys
        self.trust = trust

    def places(self, cut: str, others: Iterable[str]) -> dict[str, Any]:
        """``LocalFederation``'s ``hosts`` and ``prefixes``: participant ``cut`` on the island."""
        if self.island is None:
            return {"hosts": {}, "prefixes": {}}
        hosts = {name: self.island.outside for name in others}
        hosts[cut] = self.island.inside
        return {"hosts": hosts, "prefixes": {cut: self.island.prefix}}

    def client(self, name: str, proc: PeerProcess) -> Client:
        """A client of participant ``name``'s peer ``proc``."""
        if self.island is None:
            return Client(proc.host, proc.port, timeout_s=120)
        return Client(
            proc.host, proc.port, timeout_s=120, participant=name, key_path=self.keys[name],
            trust_dir=self.trust,
        )  # fmt: skip

    def cli(self, name: str) -> list[str]:
        """The same, as ``peer`` command options."""
        if self.island is None:
            return []
        return ["--participant", name, "--key", str(self.keys[name]), "--trust", str(self.trust)]

    def begin(self, proc: PeerProcess) -> None:
        self._fault(proc, on=True)

    def end(self, proc: PeerProcess) -> None:
        self._fault(proc, on=False)

    def _fault(self, proc: PeerProcess, *, on: bool) -> None:
        if self.island is not None:
            (self.island.cut if on else self.island.heal)()
            return
        assert proc.proc is not None
        os.killpg(proc.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)


async def whole_again(client: Client, timeout_s: float = 60) -> None:
    """Wait until the peer ``client`` speaks to sees every member alive again."""
    async with asyncio.timeout(timeout_s):
        while any(
            m["state"] != "alive" for m in (await client.status()).extra["overlay"]["members"]
        ):
            await asyncio.sleep(0.2)
