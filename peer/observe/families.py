"""The metric families a peer exports at ``/metrics``: one table, and the families built from a
snapshot of the peer.

Names follow Prometheus' conventions: the ``fedstream_`` prefix, base units (seconds, bytes),
``_total`` on counters. Labels name things of the federation only (stream, query, fragment,
peer, participant) or one of a few fixed words (state, direction, outcome, code), so a label
set is as large as the federation and no larger: nothing per tuple, per batch or per client.

Two kinds of family live here. Those in :data:`HISTOGRAMS` are ``prometheus_client``
histograms the peer observes as things happen (a push acknowledged, a move's pause). All the
others are read at scrape time from state the peer keeps anyway (its status, the engine's
counters, the links' byte counts): :func:`build` turns a :class:`Snapshot` of that state into
metric families, and :class:`SnapshotCollector` hands the newest snapshot to the registry.
Nothing here does I/O; the snapshot is taken by :mod:`peer.observe.observer`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["FAMILIES", "HISTOGRAMS", "LABELS", "Family", "Snapshot", "SnapshotCollector", "build"]

PREFIX = "fedstream_"
# every label a family may carry; values are names from the federation or fixed words
LABELS = frozenset(
    {"stream", "query", "fragment", "peer", "participant", "state", "direction", "outcome", "code"}
)


@dataclass(frozen=True)
class Family:
    name: str  # as exposed (counters with their _total)
    kind: str  # counter, gauge or histogram
    help: str
    labels: tuple[str, ...] = ()


def _f(name: str, kind: str, help: str, *labels: str) -> Family:
    return Family(PREFIX + name, kind, help, labels)


# Histograms, with their buckets (seconds): observed as things happen.
HISTOGRAMS: dict[Family, tuple[float, ...]] = {
    _f(
        "push_duration_seconds",
        "histogram",
        "Time to acknowledge a push through this peer's client API (forwarding, durable append "
        "and replication included)",
    ): (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    _f(
        "result_latency_seconds",
        "histogram",
        "Push to result: from the append here of the newest input a micro-batch took to its "
        "result rows in the output spools",
        "query",
    ): (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
    _f(
        "batch_duration_seconds",
        "histogram",
        "Duration of a fragment's Spark micro-batch (its trigger's execution)",
        "fragment",
    ): (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16),
    _f(
        "dht_lookup_duration_seconds",
        "histogram",
        "Duration of a catalog lookup that went to the DHT (cache misses)",
    ): (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    _f(
        "move_pause_seconds",
        "histogram",
        "How long a fragment moved out of this peer did not run",
    ): (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
}

# Read at scrape time from a Snapshot.
COLLECTED: tuple[Family, ...] = (
    _f("peer_info", "gauge", "This peer (1): its node id and participant", "peer", "participant"),
    _f("records_in_total", "counter", "Tuples pushed through this peer and acknowledged", "stream"),
    _f("records_out_total", "counter", "Result tuples a query here has emitted", "query"),
    _f("refused_requests_total", "counter", "Client requests refused, by error code", "code"),
    _f("fragment_running", "gauge", "1 if the fragment's streaming query runs here", "fragment"),
    _f("fragment_batches_total", "counter", "Micro-batches a fragment here has run", "fragment"),
    _f(
        "fragment_busy_seconds_total",
        "counter",
        "Seconds a fragment's streaming query spent running micro-batches",
        "fragment",
    ),
    _f(
        "fragment_busy_ratio",
        "gauge",
        "Share of the last sampling interval a fragment spent in micro-batches",
        "fragment",
    ),
    _f(
        "fragment_input_records_total",
        "counter",
        "Input tuples a fragment's micro-batches have read",
        "fragment",
    ),
    _f(
        "watermark_lag_seconds",
        "gauge",
        "Newest event time seen by a fragment minus its watermark (event-time seconds)",
        "fragment",
    ),
    _f(
        "fragment_tentative",
        "gauge",
        "1 while a fragment runs without a missing input and writes tentative results",
        "fragment",
    ),
    _f(
        "tentative_tuples_total",
        "counter",
        "Tentative result tuples a query here has written (its input missing beyond its "
        "availability bound)",
        "query",
    ),
    _f(
        "corrections_total",
        "counter",
        "Undo entries a query here has written, each taking its tentative results back",
        "query",
    ),
    _f(
        "corrected_tuples_total",
        "counter",
        "Tentative result tuples a query here has taken back",
        "query",
    ),
    _f("state_rows", "gauge", "Rows in a fragment's Spark state store", "fragment"),
    _f("state_bytes", "gauge", "Memory used by a fragment's Spark state store", "fragment"),
    _f(
        "stream_backlog_batches",
        "gauge",
        "Batches of a stream here its slowest reader has not taken",
        "stream",
    ),
    _f("stream_latest_offset", "gauge", "Newest offset of a stream's log here", "stream"),
    _f(
        "mirror_lag_batches",
        "gauge",
        "Batches of a stream not yet acknowledged by the peer it is mirrored to",
        "stream",
        "peer",
    ),
    _f("mirror_sent_bytes_total", "counter", "Bytes of a stream mirrored to other peers", "stream"),
    _f(
        "replication_lag_batches",
        "gauge",
        "Batches a replica of a stream this peer is primary of lacks",
        "stream",
        "peer",
    ),
    _f(
        "standby_lag_batches",
        "gauge",
        "Input batches a warm standby here has yet to read (of its copy of the input)",
        "fragment",
    ),
    _f(
        "standby_held_results",
        "gauge",
        "Results a warm standby here holds back, not yet in its primary's result streams",
        "fragment",
    ),
    _f(
        "standby_since_batch_seconds",
        "gauge",
        "Seconds since a warm standby here last ran a batch",
        "fragment",
    ),
    _f("standby_promotions_total", "counter", "Warm standbys promoted on this peer"),
    _f("overlay_members", "gauge", "Overlay members as gossip has them, by state", "state"),
    _f("links", "gauge", "Peer links open, by direction (outgoing, incoming)", "direction"),
    _f("link_bytes_total", "counter", "Bytes over peer links, by direction", "direction"),
    _f(
        "engine_executors",
        "gauge",
        "Executors registered with the peer's Spark driver on a cluster master (0: the engine "
        "waits for executors; its queries resume when a Worker returns)",
    ),
    _f(
        "elastic_launched_peers",
        "gauge",
        "Peers the burst leader's plan has launched for this elastic participant",
    ),
    _f("elastic_leader", "gauge", "1 if this peer is its elastic participant's burst leader"),
    _f(
        "elastic_decisions_total",
        "counter",
        "The burst leader's decisions on this peer, by outcome (lead, grow, shrink, refused)",
        "outcome",
    ),
    _f("elastic_draining", "gauge", "1 while this launched peer drains before it leaves"),
    _f("brain_utilisation_ratio", "gauge", "The brain's last measured utilisation (load/capacity)"),
    _f("brain_load_cores", "gauge", "The brain's last measured load, in cores"),
    _f("brain_capacity_cores", "gauge", "Cores this peer offers (its capacity)"),
    _f(
        "contract_price",
        "gauge",
        "Price per unit of load of the valid contract with a partner",
        "participant",
    ),
    _f(
        "offers_total",
        "counter",
        "Offers of load, by direction (sent, received) and outcome",
        "direction",
        "outcome",
    ),
    _f(
        "moves_total",
        "counter",
        "Fragment moves, by direction (out, in) and outcome (ok, failed)",
        "direction",
        "outcome",
    ),
)

# The process collector of prometheus_client (namespace fedstream): CPU and memory.
PROCESS: tuple[Family, ...] = (
    _f("process_cpu_seconds_total", "counter", "CPU time of the peer process (user + system)"),
    _f("process_resident_memory_bytes", "gauge", "Resident memory of the peer process"),
)

FAMILIES: tuple[Family, ...] = (*HISTOGRAMS, *COLLECTED, *PROCESS)


@dataclass
class Snapshot:
    """What the collected families are built from: the status JSON (``peer status --json``)
    and the figures the status does not carry."""

    status: dict[str, Any] = field(default_factory=dict)
    records_in: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    offers: dict[tuple[str, str], int] = field(default_factory=dict)
    moves: dict[tuple[str, str], int] = field(default_factory=dict)
    engine: dict[str, dict[str, float]] = field(default_factory=dict)  # Engine.counters()
    fragments: dict[str, dict[str, float]] = field(default_factory=dict)  # samples.Fragments
    backlog: dict[str, int] = field(default_factory=dict)
    mirror_bytes: dict[str, int] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)  # Overlay.link_stats()


def _family(f: Family) -> CounterMetricFamily | GaugeMetricFamily:
    if f.kind == "counter":
        return CounterMetricFamily(f.name, f.help, labels=f.labels)
    return GaugeMetricFamily(f.name, f.help, labels=f.labels)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def build(snapshot: Snapshot) -> list[Metric]:
    """The collected families (:data:`COLLECTED`) of ``snapshot``, each present even when it
    has no sample yet."""
    fams = {f.name.removeprefix(PREFIX): _family(f) for f in COLLECTED}
    status = snapshot.status

    def add(name: str, labels: list[str], value: object) -> None:
        number = _number(value)
        if number is not None:
            fams[name].add_metric(labels, number)

    overlay = status.get("overlay") or {}
    if overlay:
        add("peer_info", [str(overlay.get("node_id", "")), str(overlay.get("participant", ""))], 1)
    for stream, n in sorted(snapshot.records_in.items()):
        add("records_in_total", [stream], n)
    for code, n in sorted(snapshot.refused.items()):
        add("refused_requests_total", [code], n)
    for name, counters in sorted(snapshot.engine.items()):
        add("records_out_total", [name], counters.get("rows_out"))
        add("fragment_batches_total", [name], counters.get("batches"))
    for query in status.get("queries") or ():
        name = str(query.get("name"))
        add("fragment_running", [name], 1 if query.get("active") else 0)
        dpc = query.get("availability")
        if isinstance(dpc, Mapping):
            add("fragment_tentative", [name], 1 if dpc.get("tentative") else 0)
            add("tentative_tuples_total", [name], dpc.get("tentative_tuples"))
            add("corrections_total", [name], dpc.get("corrections"))
            add("corrected_tuples_total", [name], dpc.get("corrected_tuples"))
    _fragments(snapshot.fragments, add)
    for stream in status.get("streams") or ():
        add("stream_latest_offset", [str(stream.get("name"))], stream.get("latest_offset"))
    for stream, n in sorted(snapshot.backlog.items()):
        add("stream_backlog_batches", [stream], n)
    for mirror in status.get("mirrors") or ():
        acked, latest = _number(mirror.get("acked")), _number(mirror.get("latest"))
        if acked is not None and latest is not None:
            labels = [str(mirror.get("stream")), str(mirror.get("to"))]
            add("mirror_lag_batches", labels, max(0.0, latest - acked))
    for stream, n in sorted(snapshot.mirror_bytes.items()):
        add("mirror_sent_bytes_total", [stream], n)
    _replication(status.get("replication") or {}, add)
    states: dict[str, int] = {}
    for member in overlay.get("members") or ():
        state = str(member.get("state"))
        states[state] = states.get(state, 0) + 1
    for state, n in sorted(states.items()):
        add("overlay_members", [state], n)
    links = snapshot.links
    for direction in ("outgoing", "incoming"):
        add("links", [direction], links.get(direction))
    add("link_bytes_total", ["sent"], links.get("sent_bytes"))
    add("link_bytes_total", ["received"], links.get("received_bytes"))
    executors = status.get("executors")
    if isinstance(executors, Mapping) and executors.get("checked"):
        add("engine_executors", [], executors.get("live"))
    _brain(status.get("brain") or {}, add)
    _elastic(status.get("elastic") or {}, add)
    for (direction, outcome), n in sorted(snapshot.offers.items()):
        add("offers_total", [direction, outcome], n)
    for (direction, outcome), n in sorted(snapshot.moves.items()):
        add("moves_total", [direction, outcome], n)
    return list(fams.values())


def _fragments(fragments: Mapping[str, Mapping[str, float]], add: Any) -> None:
    for name, figures in sorted(fragments.items()):
        add("fragment_busy_seconds_total", [name], figures.get("busy_s"))
        add("fragment_busy_ratio", [name], figures.get("busy_ratio"))
        add("fragment_input_records_total", [name], figures.get("input_rows"))
        add("watermark_lag_seconds", [name], figures.get("watermark_lag_s"))
        add("state_rows", [name], figures.get("state_rows"))
        add("state_bytes", [name], figures.get("state_bytes"))


def _replication(replication: Mapping[str, Any], add: Any) -> None:
    standbys = replication.get("standbys")
    if isinstance(standbys, dict):
        for name, info in sorted(standbys.items()):
            if isinstance(info, dict) and not info.get("promoted"):
                add("standby_lag_batches", [str(name)], info.get("behind_batches"))
                add("standby_held_results", [str(name)], info.get("held"))
                add("standby_since_batch_seconds", [str(name)], info.get("since_batch_s"))
    if "promotions" in replication:
        add("standby_promotions_total", [], replication.get("promotions"))
    streams = replication.get("streams")
    if not isinstance(streams, dict):
        return
    for stream, info in sorted(streams.items()):
        lag = info.get("lag") if isinstance(info, dict) else None
        if isinstance(lag, dict):
            for node, n in sorted(lag.items()):
                add("replication_lag_batches", [str(stream), str(node)], n)


def _elastic(elastic: Mapping[str, Any], add: Any) -> None:
    if "leading" in elastic:
        launched = elastic.get("launched")
        add("elastic_launched_peers", [], len(launched) if isinstance(launched, list) else None)
        add("elastic_leader", [], 1 if elastic.get("leading") else 0)
        counts = elastic.get("counts")
        if isinstance(counts, Mapping):
            for action, n in sorted(counts.items()):
                add("elastic_decisions_total", [str(action)], n)
    if "draining" in elastic:
        add("elastic_draining", [], 1 if elastic.get("draining") else 0)


def _brain(brain: Mapping[str, Any], add: Any) -> None:
    add("brain_utilisation_ratio", [], brain.get("utilisation"))
    add("brain_load_cores", [], brain.get("load"))
    add("brain_capacity_cores", [], brain.get("capacity"))
    prices: dict[str, float] = {}
    for contract in brain.get("contracts") or ():
        price = _number(contract.get("price"))
        if contract.get("valid") and price is not None:
            partner = str(contract.get("partner"))
            prices[partner] = max(price, prices.get(partner, price))
    for partner, price in sorted(prices.items()):
        add("contract_price", [partner], price)


class SnapshotCollector(Collector):
    """Gives the registry the families of the newest snapshot (see :meth:`hold`)."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def hold(self, snapshot: Snapshot) -> None:
        """Collect ``snapshot`` from now on (the observer takes a new one before a scrape)."""
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from build(self.snapshot)
