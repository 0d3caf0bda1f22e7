"""Pushing batches through random peers of a federation, as a client under failover would."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from peer.client import Client
from peer.errors import FedstreamError


async def push_one(
    ports: Sequence[int],
    rng: random.Random,
    stream: str,
    batch: Any,
    *,
    producer: str,
    seq: int,
    deadline_s: float = 90.0,
    timeout_s: float = 20.0,
) -> int:
    """One batch (anything :meth:`Client.push` takes) through a random peer, retried with the
    same (producer, seq) elsewhere until acknowledged (a retriable refusal, a timeout or a
    refused connection is retried; anything else is raised), within ``deadline_s``. Returns
    how many tries were retried."""
    deadline = time.monotonic() + deadline_s
    retries = 0
    while True:
        try:
            async with Client("127.0.0.1", rng.choice(ports), timeout_s=timeout_s) as c:
                await c.push(stream, batch, producer=producer, seq=seq)
            return retries
        except (FedstreamError, TimeoutError, OSError) as exc:
            if isinstance(exc, FedstreamError) and not exc.retriable:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"batch {seq} not acknowledged: {exc}") from exc
            retries += 1
            await asyncio.sleep(0.1)


async def push_anywhere(
    ports: Sequence[int],
    stream: str,
    batches: Sequence[dict[str, list[Any]]],
    seqs: range,
    *,
    producer: str,
    deadline_s: float = 90.0,
) -> None:
    """Each batch of ``seqs`` through :func:`push_one`; ``deadline_s`` bounds each batch."""
    rng = random.Random(seqs.start)
    for seq in seqs:
        await push_one(
            ports,
            rng,
            stream,
            {"columns": batches[seq]},
            producer=producer,
            seq=seq,
            deadline_s=deadline_s,
        )


Batch = dict[str, list[int]]


async def push_acknowledged(
    port: int, stream: str, batch: Batch, *, producer: str, seq: int, tries: int
) -> None:
    """Push ``batch`` (columns) to the peer at ``port`` with (``producer``, ``seq``), again
    every 0.5 s on any refusal or lost connection, until acknowledged (RuntimeError after
    ``tries``): a demo's or a test's pusher, which must not lose a batch to a busy peer."""
    for _ in range(tries):
        try:
            async with Client("127.0.0.1", port, timeout_s=60) as cl:
                await cl.push(stream, {"columns": batch}, producer=producer, seq=seq)
            return
        except (FedstreamError, OSError, TimeoutError):
            await asyncio.sleep(0.5)
    raise RuntimeError(f"batch {seq} was never acknowledged")


class KeyedFeed:
    """The keyed-window workload (``peer.examples.keyed_window``) pushed to one peer under one
    producer id, as the balancing test and the elastic demo push it: each batch holds ``rows``
    tuples over 8 keys, values in [-10, 50), event time rising 2 s a batch. A batch refused or
    lost is pushed again with the same seq; one acknowledged is in ``pushed`` (what the
    plain-Python reference, ``keyed_window_sums``, takes)."""

    def __init__(self, stream: str, *, producer: str, port: int = 0, seed: int = 28) -> None:
        self.stream, self.producer, self.port = stream, producer, port
        self.rng = random.Random(seed)
        self.pushed: list[Batch] = []
        self.t = 0  # the event time of the next batch

    def batch(self, rows: int) -> Batch:
        rng, t = self.rng, self.t
        self.t += 2
        return {
            "k": [rng.randrange(8) for _ in range(rows)],
            "v": [rng.randrange(-10, 50) for _ in range(rows)],
            "t": [t + i * 2 // rows for i in range(rows)],
        }

    async def send(self, batch: Batch, *, tries: int = 240) -> None:
        """Push ``batch`` to ``port`` until acknowledged (RuntimeError after ``tries``)."""
        seq = len(self.pushed)
        await push_acknowledged(
            self.port, self.stream, batch, producer=self.producer, seq=seq, tries=tries
        )
        self.pushed.append(batch)

    async def close_windows(self) -> None:
        """A last tuple far ahead (passing every filter of the workload): the watermark passes
        every window pushed."""
        await self.send({"k": [0], "v": [49], "t": [self.t + 100]})
