"""Pushing batches through random peers of a federation, as a client under failover would."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

from peer.client import Client
from peer.errors import FedstreamError


async def push_anywhere(
    ports: Sequence[int],
    stream: str,
    batches: Sequence[dict[str, list[Any]]],
    seqs: range,
    *,
    producer: str,
    deadline_s: float = 90.0,
) -> None:
    """Each batch through a random peer, retried with the same (producer, seq) elsewhere
    until acknowledged (a retriable refusal, a timeout or a refused connection is retried;
    anything else is raised). ``deadline_s`` bounds each batch."""
    rng = random.Random(seqs.start)
    for seq in seqs:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                async with Client("127.0.0.1", rng.choice(ports), timeout_s=20) as c:
                    await c.push(stream, {"columns": batches[seq]}, producer=producer, seq=seq)
                break
            except (FedstreamError, TimeoutError, OSError) as exc:
                if isinstance(exc, FedstreamError) and not exc.retriable:
                    raise
                if time.monotonic() > deadline:
                    raise AssertionError(f"batch {seq} not acknowledged: {exc}") from exc
                await asyncio.sleep(0.1)
