"""A subscriber following a stream's spool: where it starts, each new batch as it lands.

The subscriber gets :data:`READY` first, once its position is fixed (``latest``, ``earliest``
or ``after:N``, a relay resuming where it was), then the spool's entries as wire items
(:mod:`peer.storage.feed`), a chunk at a time, woken by the spool's append listener. It never
skips: when the next batch it needs has been trimmed (it fell more than the retention behind,
or resumes from an offset no longer kept) it gets :func:`trimmed_gap`, naming the first
missing offset, and may subscribe again; a stream gone from here (moved, dropped) ends it
with a retriable error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from peer.errors import InvalidInput, Unavailable
from peer.protocol.api import READY, START_POSITIONS
from peer.storage.feed import after_offset, trimmed_gap, wire_entries
from peer.storage.spool import SpoolSet
from peer.storage.spool_format import TrimmedError

SUBSCRIBE_CHUNK = 64  # spool files read per wake-up of a subscriber


async def follow(
    spools: SpoolSet, stream: str, start: str, tentative: bool = True
) -> AsyncGenerator[dict[str, Any], None]:
    """The batches of ``stream``'s spool in ``spools`` from ``start`` (``tentative``: with
    the tentative ones and their undos)."""
    after = after_offset(start)
    if start not in START_POSITIONS and after is None:
        raise InvalidInput(f"subscribe: start must be latest or earliest, not {start!r}")
    spool = spools.get(stream)
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def on_append(_offset: int) -> None:
        loop.call_soon_threadsafe(wake.set)

    spool.add_listener(on_append)
    try:
        if after is not None:
            position = after
        else:
            position = spool.latest if start == "latest" else spool.earliest - 1
        if position + 1 < spool.earliest:
            raise trimmed_gap(stream, position + 1, spool.earliest)
        yield {**READY, "after": position}
        while True:
            wake.clear()
            latest = spool.latest
            if latest <= position:
                if stream not in spools:  # moved away (peer.move) or dropped
                    raise Unavailable(
                        f"stream {stream} is no longer here; subscribe again",
                        stream=stream,
                        moved=True,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 1.0)
                continue
            end = min(latest, position + SUBSCRIBE_CHUNK)
            try:
                items = await asyncio.to_thread(wire_entries, spool, position, end, tentative)
            except TrimmedError:  # trimmed before this subscriber read it
                raise trimmed_gap(stream, position + 1, spool.earliest) from None
            for item in items:
                yield item
            position = end
    finally:
        spool.remove_listener(on_append)
