"""The demo's verdict: every output stream, read back, equals the plain-Python reference.

Once every input batch is acknowledged and the outputs are complete (or have stalled), each
output stream is read from its earliest tuple on a peer that does not host it (so the read
crosses the overlay) and compared, as a multiset of rows, with what the example's reference
computes from the same generated input. A summary table, one MATCH or MISMATCH line per
stream (with the first differences) and PASS or FAIL follow; the demo exits 0 only on PASS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from peer.demo.board import Board
from peer.examples import Rows
from peer.protocol.replies import StatusReply
from peer.testing.cluster import collect

if TYPE_CHECKING:
    from rich.console import Console

    from peer.client import Client

READ_TIMEOUT_S = 60
SETTLE_S = 2  # read on this long after the count is reached, so that duplicates show
SHOWN_PROBLEMS = 12


async def check_outputs(
    board: Board,
    console: Console,
    clients: list[Client],
    want: Mapping[str, Rows],
    inputs: Mapping[str, Rows],
    pushed_s: float,
) -> int:
    """Read every output stream, compare it with ``want`` and print the verdict; 0 if all
    match, else 1."""
    from rich.table import Table

    statuses = await asyncio.gather(*(c.status() for c in clients), return_exceptions=True)
    for i, st in enumerate(statuses):
        if isinstance(st, StatusReply):
            board.status[i] = st.to_wire()
    console.print(
        f"all {sum(len(r) for r in inputs.values())} input tuples acknowledged "
        f"({pushed_s:.0f} s of pushing); reading every output stream from the earliest "
        "tuple on a peer that does not host it",
        soft_wrap=True,
    )
    ok = True
    table = Table("stream", "host", "read on", "got", "expected", "result", title="summary")
    lines = []
    for stream, rows in want.items():
        host = board.host(stream)
        reader = next((i for i, n in enumerate(board.names) if n != host), 0)
        got = await collect(
            clients[reader],
            stream,
            len(rows),
            timeout_s=READ_TIMEOUT_S,
            settle_s=SETTLE_S,
            start="earliest",
        )
        problems = board.ex.module.compare(got, rows)
        match = not problems
        ok = ok and match
        table.add_row(
            stream,
            host,
            board.names[reader],
            str(len(got)),
            str(len(rows)),
            "[green]MATCH[/]" if match else "[red]MISMATCH[/]",
        )
        lines.append(
            f"{'MATCH' if match else 'MISMATCH'} {stream}: {len(got)} tuples read on "
            f"{board.names[reader]} (host {host}), {len(rows)} expected by the plain-Python "
            "reference"
        )
        lines.extend(f"    {p}" for p in problems[:SHOWN_PROBLEMS])
    console.print(table)
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    verdict = (
        "every output stream equals the plain-Python reference"
        if ok
        else "some output stream differs from the plain-Python reference"
    )
    console.print(
        f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/]: {verdict} "
        f"({board.elapsed():.0f} s)",
        soft_wrap=True,
    )
    return 0 if ok else 1
