"""Hostile request content, and how to watch a peer while it is refused (issue 12).

The corpus (what ``tests/integration/test_hostile_input.py`` and ``scripts/attack_input.py``
send): requests valid in shape but expensive in content. :class:`Watch` measures what such a
request costs the peer under attack: how long a concurrent client waits for its ``hello``
(a new connection every 100 ms), and how much the peer's resident memory grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import psutil
import pyarrow as pa

__all__ = [
    "Watch",
    "arrow_bomb",
    "big_schema",
    "long_schema_name",
    "reverse_chain_query",
    "wide_filter_query",
]


def arrow_bomb(inflated_bytes: int = 268 * 1024 * 1024, field_name: str = "s") -> bytes:
    """An Arrow IPC stream of one string of ``inflated_bytes`` zeros, zstd at level 19: a few
    kilobytes on the wire (13 KB for 268 MB)."""
    table = pa.table({field_name: pa.array(["0" * inflated_bytes])})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=19))
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write(table)
    return bytes(sink.getvalue())


def wide_filter_query(
    name: str, stream: str, field_name: str = "x", outputs: int = 1000
) -> dict[str, Any]:
    """One filter box with ``outputs`` outputs, each with a 3.3 KB expression: a 3.3 MB map
    (the query the issue found stalling a peer for 24 s)."""
    expression = " OR ".join(f"{field_name} = {i:09d}" for i in range(250))
    return {
        "name": name,
        "boxes": [
            {
                "name": "wide",
                "type": "filter",
                "inputs": [stream],
                "outputs": [f"{name}_out{i}" for i in range(outputs)],
                "params": {f"expression.{i}": expression for i in range(outputs)},
            }
        ],
    }


def reverse_chain_query(
    name: str, stream: str, field_name: str = "x", boxes: int = 1000
) -> dict[str, Any]:
    """A chain of ``boxes`` filter boxes, declared downstream first."""
    chain = [
        {
            "name": f"{name}_b{i}",
            "type": "filter",
            "inputs": [stream if i == 0 else f"{name}_s{i}"],
            "outputs": [f"{name}_s{i + 1}"],
            "params": {"expression.0": f"{field_name} > 1"},
        }
        for i in range(boxes)
    ]
    chain.reverse()
    return {"name": name, "boxes": chain}


def long_schema_name() -> dict[str, Any]:
    """A schema whose name is valid (256 characters) but whose DHT key is too long."""
    return {"name": "n" * 256, "fields": [{"name": "x", "type": "int"}]}


def big_schema(name: str = "big") -> dict[str, Any]:
    """A valid schema whose catalog record is over the DHT's record size."""
    return {
        "name": name,
        "fields": [{"name": f"f{i:04d}_" + "x" * 40, "type": "int"} for i in range(300)],
    }


@dataclass
class Watch:
    """While a request is under way: the slowest ``hello`` a concurrent client got (a new
    connection every ``every_s``) and the peer's resident memory growth (sampled)."""

    host: str
    port: int
    pid: int
    every_s: float = 0.1
    timeout_s: float = 10.0
    hellos: list[float] = field(default_factory=list)
    failures: int = 0
    rss_before: int = 0
    rss_peak: int = 0
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Watch:
        self.rss_before = self.rss_peak = self._rss()
        self._task = asyncio.create_task(self._probe())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        await asyncio.sleep(self.every_s * 2)  # one more probe after the request
        self._stop.set()
        await self._task
        self.rss_peak = max(self.rss_peak, self._rss())

    @property
    def worst_hello_s(self) -> float:
        return max(self.hellos, default=float("inf"))

    @property
    def rss_growth(self) -> int:
        return self.rss_peak - self.rss_before

    def _rss(self) -> int:
        process = psutil.Process(self.pid)
        total: int = process.memory_info().rss
        return total

    async def _probe(self) -> None:
        from peer.client import Client

        while not self._stop.is_set():
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout_s):
                    async with Client(self.host, self.port):
                        pass
                self.hellos.append(time.monotonic() - started)
            except (OSError, TimeoutError, ConnectionError):
                self.failures += 1
                self.hellos.append(time.monotonic() - started)
            self.rss_peak = max(self.rss_peak, self._rss())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.every_s)
