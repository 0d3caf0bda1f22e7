"""What the demo shows while it runs, and where that comes from.

Two kinds of tasks fill the board: :func:`poll` asks every peer for its status (fragments,
hosted streams, mirrors, and the overlay's members as gossip has them) twice a second, and
:func:`watch` follows each output stream from its earliest tuple. :class:`View` turns the
board into a rich live view (a table of peers, one of streams, the latest output tuples) on
a terminal, or into one plain progress line otherwise; :func:`follow` refreshes either until
the driver says it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from peer.demo.board import LATEST, Board
from peer.timing import every

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from peer.client import Client

REFRESH_S = 0.5
PLAIN_EVERY_S = 5.0


async def poll(board: Board, clients: list[Client]) -> None:
    """Keep ``board.status`` fresh: each peer's status every ``REFRESH_S``."""

    async def one(i: int, c: Client) -> None:
        try:
            board.status[i] = (await asyncio.wait_for(c.status(), 5)).to_wire()
            board.status_error[i] = ""
        except TimeoutError:
            board.status_error[i] = "slow"
        except Exception as exc:  # connection lost: try again next round
            board.status_error[i] = type(exc).__name__
            with contextlib.suppress(Exception):
                await c.close()
                await c.connect()

    async def all_of_them() -> None:
        await asyncio.gather(*(one(i, c) for i, c in enumerate(clients)))

    await every(REFRESH_S, all_of_them, first_s=0, what="the demo's status poll")


async def watch(board: Board, stream: str, port: int) -> None:
    """Follow ``stream`` from its earliest tuple (for the live view only)."""
    from peer.client import Client

    state = board.outputs[stream]
    show_only = board.ex.show_only
    while True:
        try:
            async with Client("127.0.0.1", port, timeout_s=60) as c:
                state.count = 0
                state.latest.clear()
                async for batch in c.subscribe(stream, start="earliest"):
                    rows = batch.rows()
                    state.count += len(rows)
                    if stream in show_only:
                        keep = show_only[stream][0]
                        rows = [r for r in rows if keep(r)]
                    state.latest.extend(rows[-LATEST:])
                    state.changed_at = time.monotonic()
                    state.error = ""
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            state.error = f"{type(exc).__name__}: {exc}"[:80]
        await asyncio.sleep(1.0)


async def follow(console: Console, view: View, finished: Callable[[], bool]) -> None:
    """Refresh the view until ``finished()`` (which may raise to end the demo): live on a
    terminal, else a plain line every ``PLAIN_EVERY_S``; the last state is shown either way."""
    if console.is_terminal:
        from rich.live import Live

        with Live(view.render(), console=console, auto_refresh=False, transient=False) as live:
            while not finished():
                live.update(view.render(), refresh=True)
                await asyncio.sleep(REFRESH_S)
            live.update(view.render(), refresh=True)
    else:
        next_line = 0.0
        while not finished():
            if time.monotonic() >= next_line:
                console.print(view.line(), soft_wrap=True, highlight=False)
                next_line = time.monotonic() + PLAIN_EVERY_S
            await asyncio.sleep(REFRESH_S)
        console.print(view.line(), soft_wrap=True, highlight=False)


class View:
    def __init__(self, board: Board) -> None:
        self.board = board

    def fragments(self, st: Mapping[str, Any] | None) -> list[str]:
        """One line per fragment of the example's query in status ``st``."""
        out = []
        for q in st.get("queries", []) if st else []:
            if not str(q.get("name", "")).startswith(self.board.ex.name):
                continue
            text = f"{q['name']} {q.get('status', '?')}"
            if "batches" in q:
                text += f": {q['batches']} batches, {q.get('rows_out', 0)} out"
            if q.get("error"):
                text += f" error: {str(q['error'])[:60]}"
            out.append(text)
        return out

    def _gossip(self, i: int) -> tuple[str, str]:
        """State and load of peer ``i`` as another peer's gossip has it (its own if alone)."""
        b = self.board
        node = b.procs[i].node_id
        views = [(i + d) % b.n for d in range(1, b.n)] or [i]
        for j in views:
            st = b.status[j]
            if st is None:
                continue
            for m in st.get("overlay", {}).get("members", []):
                if m.get("node_id") == node:
                    load = m.get("load") or {}
                    text = f"cpu {float(load.get('cpu', 0.0)):.2f}"
                    counts = []
                    if "queries" in load:
                        q = int(load["queries"])
                        counts.append(f"{q} quer{'y' if q == 1 else 'ies'}")
                    if "streams" in load:
                        k = int(load["streams"])
                        counts.append(f"{k} stream{'' if k == 1 else 's'}")
                    if counts:
                        text += "\n" + ", ".join(counts)
                    return str(m.get("state", "?")), text
        return "?", ""

    def _mirrors(self, st: Mapping[str, Any] | None) -> list[str]:
        who = self.board.who
        return [
            f"{m['stream']} → {who(str(m.get('to', '')))} {m.get('acked')}/{m.get('latest')}"
            for m in (st.get("mirrors", []) if st else [])
        ]

    def render(self) -> RenderableType:
        from rich.columns import Columns
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        b = self.board
        head = Text.assemble(
            ("fedstream demo", "bold"),
            f" · {b.ex.name} on {b.n} peer{'s' if b.n > 1 else ''} · ",
            (b.phase, "bold cyan"),
            f" · {b.elapsed():.0f} s",
        )
        peers = Table(title="peers", title_justify="left", expand=True)
        peers.add_column("peer", no_wrap=True)
        peers.add_column("gossip", no_wrap=True)
        peers.add_column("boxes / fragments", ratio=3)
        peers.add_column("hosts", ratio=2, overflow="fold")
        peers.add_column("mirrors (acked/latest)", ratio=3, overflow="fold")
        peers.add_column("pushes in", justify="right", no_wrap=True)
        for i, (p, name) in enumerate(zip(b.procs, b.names, strict=True)):
            st = b.status[i]
            state, load = self._gossip(i)
            if b.status_error[i]:
                state += f" (status: {b.status_error[i]})"
            boxes = [box for box, who in b.nodes.items() if who == name]
            work = Text(", ".join(boxes) or "-", style="dim")
            for line in self.fragments(st):
                work.append("\n" + line, style="red" if "error" in line else "")
            peers.add_row(
                Text.assemble((name, "bold"), "\n", (p.node_id[:8], "dim")),
                Text.assemble((state, "green" if state == "alive" else "yellow"), "\n", load),
                work,
                "\n".join(st.get("hosted", [])) if st else "",
                "\n".join(self._mirrors(st)),
                str(b.pushed_via[i]),
            )
        streams = Table(title="streams", title_justify="left")
        for col in ("stream", "host", "progress", "notes"):
            streams.add_column(col)
        for ps in b.pushes.values():
            notes = f"{ps.retries} retries" if ps.retries else ""
            if ps.retries and ps.last_error:
                notes += f" (last: {ps.last_error})"
            streams.add_row(
                f"in  {ps.stream}",
                b.host(ps.stream),
                f"{ps.batches}/{ps.total_batches} batches, {ps.rows}/{ps.total_rows} tuples",
                notes,
            )
        for o in b.outputs.values():
            done = o.count >= o.expected
            streams.add_row(
                f"out {o.stream}",
                b.host(o.stream),
                Text(f"{o.count}/{o.expected} tuples", style="green" if done else ""),
                o.error,
            )
        latest = []
        for stream, fields in b.ex.show.items():
            title = f"latest {stream}"
            if stream in b.ex.show_only:
                title += f" ({b.ex.show_only[stream][1]})"
            t = Table(*fields, title=title, title_justify="left", min_width=len(title))
            for row in list(b.outputs[stream].latest):
                t.add_row(*(_cell(row.get(f)) for f in fields))
            latest.append(t)
        return Group(head, peers, streams, Columns(latest))

    def line(self) -> str:
        b = self.board
        ins = ", ".join(f"{p.stream} {p.batches}/{p.total_batches}" for p in b.pushes.values())
        outs = ", ".join(f"{o.stream} {o.count}/{o.expected}" for o in b.outputs.values())
        frags = [
            f"{name}: " + ("; ".join(self.fragments(st)) or "-")
            for st, name in zip(b.status, b.names, strict=True)
            if st is not None
        ]
        return " | ".join(
            [f"[{b.elapsed():4.0f} s] {b.phase}", f"in: {ins}", f"out: {outs}", *frags]
        )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)
