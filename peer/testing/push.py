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
