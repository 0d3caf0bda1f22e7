"""A peer's observer: its Prometheus registry, the hooks that feed it, and the dashboard's data.

Theory of operation
-------------------
Each peer has its own :class:`~prometheus_client.CollectorRegistry` (several peers share a
process in tests), holding the histograms of :data:`peer.observe.families.HISTOGRAMS`, a
:class:`~peer.observe.families.SnapshotCollector` for every other family, and
``prometheus_client``'s process collector (CPU, memory).

The peer calls the hooks (:meth:`Observer.pushed`, :meth:`refused`, :meth:`offered`,
:meth:`moved`, :meth:`result`, :meth:`dht_lookup`) at the seams it already has: its client
service, its brain port, the engine's result seam, the catalog's lookups. :meth:`Observer.run`
samples every ``SAMPLE_S``: the new Spark progress reports (batch durations, busy time,
watermark, state) and one chart point for the dashboard's history. :meth:`refresh` takes a
snapshot of the status JSON (the very one ``peer status --json`` prints) with the figures it
lacks, just before each scrape.

The dashboard shows the whole federation from any peer: :meth:`federation` asks every live
member over its peer link (:class:`~peer.protocol.link.ObservePeer`) for its :meth:`view` and
puts the answers side by side; a member that does not answer in time is shown with the reason.
From the same answers it draws each query as boxes and arrows (:mod:`peer.observe.diagram`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest

from peer.errors import FedstreamError
from peer.observe.diagram import query_diagram
from peer.observe.families import HISTOGRAMS, PREFIX, Snapshot, SnapshotCollector
from peer.observe.samples import HISTORY_POINTS, SAMPLE_S, FragmentFigures, Reading, point
from peer.protocol.link import ObservePeer
from peer.timing import MONOTONIC, WALL, Clock, every

__all__ = ["Observed", "Observer"]

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 3.0  # a member's view: late ones are shown as such, not waited for


class Observed(Protocol):
    """What the observer reads of its peer (the node implements it)."""

    @property
    def node_id(self) -> bytes | None: ...

    async def status(self) -> dict[str, Any]: ...

    def engine_counters(self) -> dict[str, dict[str, float]]: ...

    def stream_rows(self) -> dict[str, int]:
        """Result rows each stream got from this peer's fragments so far."""
        ...

    async def engine_progress(
        self, marks: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict[str, Any]]]: ...

    def backlog(self) -> dict[str, int]:
        """Batches each stream's slowest reader has not taken (reads files: off the loop)."""
        ...

    def mirror_bytes(self) -> dict[str, int]: ...

    def link_stats(self) -> dict[str, int]: ...

    def members(self) -> Sequence[bytes]:
        """The node ids of the other live members."""
        ...

    async def ask(self, node_id: bytes, message: ObservePeer) -> dict[str, Any]: ...


class Observer:
    """The metrics and dashboard data of one peer."""

    def __init__(
        self,
        peer: Observed,
        *,
        dashboard: Callable[[], str | None] = lambda: None,
        clock: Clock = MONOTONIC,
        wall: Callable[[], float] = WALL,
    ) -> None:
        self.peer = peer
        self.clock = clock  # the sampling period and the intervals between samples
        self.wall = wall  # the time stamps of the history and the federation view
        self.dashboard = dashboard  # this peer's dashboard URL, shown to the others (once served)
        self.registry = CollectorRegistry(auto_describe=True)
        self.collector = SnapshotCollector()
        self.registry.register(self.collector)
        ProcessCollector(namespace=PREFIX.rstrip("_"), registry=self.registry)
        self.histograms: dict[str, Histogram] = {
            f.name.removeprefix(PREFIX): Histogram(
                f.name, f.help, f.labels, buckets=buckets, registry=self.registry
            )
            for f, buckets in HISTOGRAMS.items()
        }
        self._labelled: dict[str, set[str]] = {"result_latency_seconds": set()}
        self._labelled["batch_duration_seconds"] = set()
        self.records_in: dict[str, int] = {}
        self.refusals: dict[str, int] = {}
        self.offers: dict[tuple[str, str], int] = {}
        self.moves: dict[tuple[str, str], int] = {}
        self.figures = FragmentFigures()
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self._reading: Reading | None = None
        self._latencies: dict[str, list[float]] = {}
        self._lock = threading.Lock()  # result() comes from Spark's callback thread
        self._sampled_at = clock()

    # -- hooks: called by the peer where things happen -----------------------------------------
    def pushed(self, stream: str, rows: int, seconds: float) -> None:
        self.records_in[stream] = self.records_in.get(stream, 0) + rows
        self.histograms["push_duration_seconds"].observe(seconds)

    def refused(self, code: str) -> None:
        self.refusals[code] = self.refusals.get(code, 0) + 1

    def offered(self, direction: str, outcome: str) -> None:
        key = (direction, outcome)
        self.offers[key] = self.offers.get(key, 0) + 1

    def moved(self, direction: str, ok: bool, pause_s: float | None = None) -> None:
        key = (direction, "ok" if ok else "failed")
        self.moves[key] = self.moves.get(key, 0) + 1
        if ok and pause_s is not None:
            self.histograms["move_pause_seconds"].observe(pause_s)

    def result(self, query: str, seconds: float) -> None:
        """Push to result of one micro-batch (any thread)."""
        with self._lock:
            self._latencies.setdefault(query, []).append(seconds)
            self._labelled["result_latency_seconds"].add(query)
        self.histograms["result_latency_seconds"].labels(query).observe(seconds)

    def dht_lookup(self, seconds: float) -> None:
        self.histograms["dht_lookup_duration_seconds"].observe(seconds)

    # -- sampling --------------------------------------------------------------------------------
    async def run(self) -> None:
        """Sample every ``SAMPLE_S`` until cancelled."""
        await every(SAMPLE_S, self._sample_once, clock=self.clock, what="metrics sample")

    async def _sample_once(self) -> None:
        try:
            await self.sample()
        except FedstreamError as exc:  # the peer is starting or stopping: not a bug
            log.info("metrics sample skipped: %s", exc.message)

    async def sample(self) -> None:
        """Read the new progress reports, then add one point to the history."""
        now = self.clock()
        interval, self._sampled_at = now - self._sampled_at, now
        reports = await self.peer.engine_progress(dict(self.figures.marks))
        for name, durations in self.figures.add(reports, interval).items():
            self._labelled["batch_duration_seconds"].add(name)
            for seconds in durations:
                self.histograms["batch_duration_seconds"].labels(name).observe(seconds)
        counters = self.peer.engine_counters()
        self._prune(set(counters))
        with self._lock:
            latencies, self._latencies = self._latencies, {}
        reading = Reading(
            self.wall(),
            dict(self.records_in),
            {q: int(c.get("rows_out", 0)) for q, c in counters.items()},
            self.peer.stream_rows(),
        )
        status = await self.peer.status()
        brain = status.get("brain") or {}
        utilisation = brain.get("utilisation")
        self.history.append(
            point(
                self._reading,
                reading,
                latencies=latencies,
                batch_s={q: float(c.get("last_batch_s", 0.0)) for q, c in counters.items()},
                backlog=await asyncio.to_thread(self.peer.backlog),
                utilisation=utilisation if isinstance(utilisation, float | int) else None,
            )
        )
        self._reading = reading

    def _prune(self, fragments: set[str]) -> None:
        """Histogram children of fragments no longer here go: label sets stay bounded."""
        with self._lock:
            for family, seen in self._labelled.items():
                for name in seen - fragments:
                    with contextlib.suppress(KeyError):
                        self.histograms[family].remove(name)
                    seen.discard(name)

    async def refresh(self) -> Snapshot:
        """A snapshot of the peer for the collected families, made the current one."""
        snapshot = Snapshot(
            status=await self.peer.status(),
            records_in=dict(self.records_in),
            refused=dict(self.refusals),
            offers=dict(self.offers),
            moves=dict(self.moves),
            engine=self.peer.engine_counters(),
            fragments=self.figures.by_fragment(),
            backlog=await asyncio.to_thread(self.peer.backlog),
            mirror_bytes=self.peer.mirror_bytes(),
            links=self.peer.link_stats(),
        )
        self.collector.hold(snapshot)
        return snapshot

    async def metrics(self) -> bytes:
        """``/metrics``: the Prometheus text exposition of a fresh snapshot."""
        await self.refresh()
        return generate_latest(self.registry)

    # -- the dashboard ---------------------------------------------------------------------------
    async def view(self, history: bool = False) -> dict[str, Any]:
        """What this peer shows of itself: its status, its dashboard URL and its samples
        (every one kept with ``history``, else the newest)."""
        status = await self.peer.status()
        samples = list(self.history) if history else list(self.history)[-1:]
        node = self.peer.node_id
        return {
            "node_id": None if node is None else node.hex(),
            "dashboard": self.dashboard(),
            "status": status,
            "samples": samples,
        }

    async def federation(self, history: bool = False) -> dict[str, Any]:
        """Every live member's view, this peer's first; a member that cannot answer is
        listed with the reason."""
        own = await self.view(history)
        others = list(self.peer.members())

        async def one(node: bytes) -> dict[str, Any]:
            try:
                async with asyncio.timeout(ASK_TIMEOUT_S):
                    return await self.peer.ask(node, ObservePeer(history))
            except TimeoutError:
                return {"node_id": node.hex(), "error": "no answer in time"}
            except FedstreamError as exc:
                return {"node_id": node.hex(), "error": exc.message}

        views = [own, *await asyncio.gather(*(one(n) for n in others))]
        return {
            "t": round(self.wall(), 3),
            "self": own["node_id"],
            "peers": views,
            "diagram": query_diagram(views),
        }

    async def handle_observe(self, message: ObservePeer, _sender: str) -> dict[str, Any]:
        """The peer-link request of another peer's dashboard."""
        return await self.view(message.history)
