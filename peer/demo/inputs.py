"""Feeding the demo's input: generated tuples cut into batches and pushed on a schedule.

Each input stream is cut into batches of the example's ``batch_s`` seconds of event time and
pushed in event-time order, every stream moving through event time at the same pace over the
demo's duration (the flush tuples past the real data last). Each batch goes to a peer picked
at random, which forwards it to the stream's host; it carries a producer id and a sequence
number, so that a batch retried after a lost acknowledgement is kept once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from peer.demo.board import Board, DemoFailed
from peer.examples import Rows, columns

if TYPE_CHECKING:
    from peer.client import Client

ACK_DEADLINE_S = 180  # a batch not acknowledged this long fails the demo
RETRY_S = 0.5


def batches(rows: Rows, batch_s: int, order: str = "t") -> list[tuple[int, Rows]]:
    """``rows`` (in event-time order) cut into (slot, rows) batches of ``batch_s`` seconds of
    event time each; the order is kept."""
    out: list[tuple[int, Rows]] = []
    for row in rows:
        slot = int(row[order]) // batch_s
        if out and out[-1][0] == slot:
            out[-1][1].append(row)
        else:
            out.append((slot, [row]))
    return out


def schedule(
    inputs: Mapping[str, list[tuple[int, Rows]]], real_slots: int, duration_s: float
) -> dict[str, list[float]]:
    """When to push each batch, in seconds from the start, so that every stream moves through
    event time at the same pace over ``duration_s``; batches past the real data (the flush
    tuples) come last."""
    out: dict[str, list[float]] = {}
    for stream, cut in inputs.items():
        out[stream] = [duration_s * min(slot, real_slots) / real_slots for slot, _ in cut]
    return out


async def push_stream(
    board: Board,
    stream: str,
    cut: list[tuple[int, Rows]],
    when: list[float],
    t0: float,
    seed: int,
) -> None:
    """Push ``cut`` in order, batch ``i`` at ``t0 + when[i]``, each batch through a random
    peer, retried until acked; progress goes to ``board.pushes[stream]``."""
    from peer.client import Client
    from peer.errors import FedstreamError

    state = board.pushes[stream]
    rng = random.Random(seed)
    clients: dict[int, Client] = {}
    try:
        for seq, ((_, rows), at) in enumerate(zip(cut, when, strict=True)):
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            payload = {"columns": columns(rows)}
            deadline = time.monotonic() + ACK_DEADLINE_S
            while True:
                i = rng.randrange(board.n)
                try:
                    if i not in clients:
                        clients[i] = Client("127.0.0.1", board.procs[i].port, timeout_s=60)
                        await clients[i].connect()
                    await clients[i].push(stream, payload, producer=f"demo:{stream}", seq=seq)
                    break
                except (FedstreamError, OSError, TimeoutError) as exc:
                    state.retries += 1
                    state.last_error = f"{board.names[i]}: {exc}"[:100]
                    bad = clients.pop(i, None)
                    if bad is not None:
                        with contextlib.suppress(Exception):
                            await bad.close()
                    if time.monotonic() > deadline:
                        raise DemoFailed(
                            f"batch {seq} of {stream} was not acknowledged in "
                            f"{ACK_DEADLINE_S} s (last error: {state.last_error})"
                        ) from None
                    await asyncio.sleep(RETRY_S)
            state.batches += 1
            state.rows += len(rows)
            board.pushed_via[i] += 1
        state.done = True
        state.finished_at = time.monotonic()
    finally:
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.close()
