"""What the demo knows while it runs: the board its parts write and its view reads.

The driver (:mod:`peer.demo.run`) writes the phase and each peer's latest status, the
pushers (:mod:`peer.demo.inputs`) their progress, the stream followers (:mod:`peer.demo.view`)
the outputs seen so far; the live view and the final check (:mod:`peer.demo.check`) read it.
Everything runs on one event loop, so nothing here is locked.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from peer.demo.examples import Example
from peer.testing.cluster import PeerProcess

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

LATEST = 4  # latest output tuples shown per stream


async def show_table(
    console: Console, table: Callable[[], Table], *, live: bool, what: str
) -> None:
    """Show ``table()`` until cancelled: redrawn in place twice a second on a terminal,
    printed every 5 s otherwise (a log)."""
    from rich.live import Live

    from peer.timing import every

    async def show() -> None:
        console.print(table())

    if not live:
        await every(5.0, show, what=what)
    with Live(table(), console=console, refresh_per_second=2) as shown:

        async def refresh() -> None:
            shown.update(table())

        await every(0.5, refresh, what=what)


def print_dashboards(console: Console, procs: Mapping[str, PeerProcess]) -> None:
    """Each peer's dashboard URL (its ``/metrics`` is beside it)."""
    for name, proc in procs.items():
        if proc.http:
            console.print(f"  dashboard of {name:<9} {proc.http}", soft_wrap=True, markup=False)


def hold(console: Console, procs: Mapping[str, PeerProcess]) -> None:
    """``--hold``: keep the peers up (their dashboards live) until Ctrl-C or SIGTERM (both
    KeyboardInterrupt in every demo: ``peer.demo.run.main``)."""
    console.print("[bold]--hold[/]: the federation stays up; Ctrl-C stops it. Dashboards:")
    print_dashboards(console, procs)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        console.print("Ctrl-C: stopping the federation")


class DemoFailed(Exception):
    """The demo cannot go on: a peer did not start or died, a batch was never acknowledged."""


@dataclasses.dataclass
class PushState:
    stream: str
    total_batches: int
    total_rows: int
    batches: int = 0
    rows: int = 0
    retries: int = 0
    done: bool = False
    finished_at: float = 0.0
    last_error: str = ""


@dataclasses.dataclass
class OutputState:
    stream: str
    expected: int
    count: int = 0
    latest: deque[dict[str, Any]] = dataclasses.field(default_factory=lambda: deque(maxlen=LATEST))
    changed_at: float = 0.0
    error: str = ""


@dataclasses.dataclass
class Board:
    ex: Example
    names: list[str]
    nodes: dict[str, str]  # box -> participant it is placed on
    procs: list[PeerProcess] = dataclasses.field(default_factory=list)  # in the order of names
    phase: str = "starting peers"
    started: float = dataclasses.field(default_factory=time.monotonic)
    status: list[dict[str, Any] | None] = dataclasses.field(default_factory=list)
    status_error: list[str] = dataclasses.field(default_factory=list)
    pushed_via: list[int] = dataclasses.field(default_factory=list)  # batches pushed per peer
    pushes: dict[str, PushState] = dataclasses.field(default_factory=dict)
    outputs: dict[str, OutputState] = dataclasses.field(default_factory=dict)
    fragments: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.names)
        self.status = [None] * n
        self.status_error = [""] * n
        self.pushed_via = [0] * n

    @property
    def n(self) -> int:
        return len(self.names)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def who(self, node: str) -> str:
        """The participant whose peer has node id ``node`` (or a prefix of it)."""
        for p, name in zip(self.procs, self.names, strict=True):
            if node and p.node_id.startswith(node):
                return name
        return node[:8]

    def host(self, stream: str) -> str:
        """The participant whose peer hosts ``stream``, as the latest statuses say."""
        for st, name in zip(self.status, self.names, strict=True):
            if st is not None and stream in st.get("hosted", []):
                return name
        return "?"
