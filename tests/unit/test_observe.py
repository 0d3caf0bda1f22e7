"""The observer without sockets or a JVM: every metric family of the table is exported with its
type (read back by ``prometheus_client``'s own parser), label sets stay bounded, and the pure
arithmetic of fragment figures and chart points."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from overlay.link import Traffic
from peer.cli.join import http_address
from peer.cli.options import UsageError
from peer.errors import InvalidInput
from peer.observe import Observer
from peer.observe.families import FAMILIES, HISTOGRAMS, LABELS, PREFIX
from peer.observe.samples import FragmentFigures, Reading, point
from peer.protocol.link import ObservePeer, decode
from peer.testing import run_async

NODE = bytes(range(20))
OTHER = bytes(range(1, 21))


def status() -> dict[str, Any]:
    """A peer's status JSON with every part the families read."""
    return {
        "peer": "127.0.0.1:7700",
        "streams": [{"name": "ticks", "latest_offset": 41}, {"name": "out", "latest_offset": 3}],
        "queries": [
            {
                "name": "win",
                "status": "RUNNING",
                "active": True,
                "rows_out": 9,
                "boxes": [
                    {"name": "w", "type": "aggregate", "inputs": ["ticks"], "outputs": ["out"]}
                ],
                "availability": {
                    "tentative": True,
                    "tentative_since": 1.0,
                    "tentative_tuples": 7,
                    "corrections": 2,
                    "corrected_tuples": 5,
                },
            }
        ],
        "overlay": {
            "node_id": NODE.hex(),
            "participant": "acme",
            "members": [
                {"node_id": NODE.hex(), "state": "alive"},
                {"node_id": OTHER.hex(), "state": "suspect"},
            ],
        },
        "hosted": ["ticks"],
        # a cluster engine whose Workers are all gone (peer.engine.executors)
        "executors": {"live": 0, "waiting": True, "waiting_since": 1.0, "checked": True},
        "mirrors": [{"stream": "ticks", "to": OTHER.hex()[:16], "acked": 30, "latest": 41}],
        "replication": {
            "streams": {"ticks": {"role": "primary", "lag": {OTHER.hex(): 2}}},
            "standbys": {
                "win": {"behind_batches": 3, "held": 12, "since_batch_s": 0.4, "promoted": False}
            },
            "promotions": 1,
        },
        "brain": {
            "utilisation": 0.5,
            "load": 1.0,
            "capacity": 2.0,
            "contracts": [{"partner": "globex", "price": 20.0, "valid": True}],
            "ledger": [],
        },
        # an elastic participant's burst leader that is also a launched peer draining
        "elastic": {
            "leading": True,
            "launched": ["acme-e1"],
            "counts": {"lead": 1, "grow": 1},
            "launched_as": "acme-e2",
            "draining": True,
        },
    }


class FakePeer:
    """peer.observe.Observed with fixed answers; ``fragments`` is what the engine runs."""

    def __init__(self) -> None:
        self.fragments = ["win"]
        self.asked: list[bytes] = []

    @property
    def node_id(self) -> bytes | None:
        return NODE

    async def status(self) -> dict[str, Any]:
        return status()

    def engine_counters(self) -> dict[str, dict[str, float]]:
        return {f: {"batches": 3, "rows_out": 9, "last_batch_s": 0.2} for f in self.fragments}

    def stream_rows(self) -> dict[str, int]:
        return {"out": 9}

    async def engine_progress(
        self, marks: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict[str, Any]]]:
        return {f: [report(1, 250, 10)] for f in self.fragments}

    def backlog(self) -> dict[str, int]:
        return {"ticks": 4}

    def mirror_bytes(self) -> dict[str, int]:
        return {"ticks": 2048}

    def link_stats(self) -> dict[str, int]:
        return {"outgoing": 1, "incoming": 2, "sent_bytes": 100, "received_bytes": 200}

    def members(self) -> Sequence[bytes]:
        return [OTHER]

    async def ask(self, node_id: bytes, message: ObservePeer) -> dict[str, Any]:
        self.asked.append(node_id)
        return {"node_id": node_id.hex(), "status": {}, "samples": [], "history": message.history}


def report(batch: int, ms: int, rows: int, *, second: int = 0) -> dict[str, Any]:
    return {
        "timestamp": f"2024-05-01T10:00:{second:02d}.000Z",
        "batchId": batch,
        "durationMs": {"triggerExecution": ms},
        "numInputRows": rows,
        "eventTime": {"watermark": "1970-01-01T00:01:00.000Z", "max": "1970-01-01T00:01:30.000Z"},
        "stateOperators": [{"numRowsTotal": 7, "memoryUsedBytes": 4096}],
    }


def scrape(observer: Observer) -> dict[str, Any]:
    text = run_async(observer.metrics).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def fed(observer: Observer) -> None:
    """The hooks called once each, and one sample taken."""
    observer.pushed("ticks", 10, 0.02)
    observer.refused("unavailable")
    observer.offered("sent", "accepted")
    observer.moved("out", True, 0.8)
    observer.result("win", 1.5)
    observer.dht_lookup(0.004)
    run_async(observer.sample)


def exposed(name: str, kind: str) -> str:
    """The name the parser gives a family (counters without their _total)."""
    return name.removesuffix("_total") if kind == "counter" else name


def test_every_family_of_the_table_is_exported_with_its_type() -> None:
    observer = Observer(FakePeer())
    found = scrape(observer)  # before anything happened: present, maybe without samples
    for family in FAMILIES:
        assert exposed(family.name, family.kind) in found, family.name
        assert found[exposed(family.name, family.kind)].type == family.kind, family.name
    fed(observer)
    found = scrape(observer)
    for family in FAMILIES:
        parsed = found[exposed(family.name, family.kind)]
        assert parsed.type == family.kind
        assert parsed.samples, f"{family.name} has no sample once everything happened once"


def test_the_figures_are_the_peers() -> None:
    observer = Observer(FakePeer())
    fed(observer)
    found = scrape(observer)

    def value(name: str, **labels: str) -> float:
        for sample in found[name].samples:
            if sample.labels == labels and not sample.name.endswith(("_bucket", "_created")):
                return float(sample.value)
        raise AssertionError(f"{name}{labels} not exported: {found[name].samples}")

    assert value("fedstream_records_in", stream="ticks") == 10
    assert value("fedstream_records_out", query="win") == 9
    assert value("fedstream_stream_backlog_batches", stream="ticks") == 4
    assert value("fedstream_mirror_lag_batches", stream="ticks", peer=OTHER.hex()[:16]) == 11
    assert value("fedstream_replication_lag_batches", stream="ticks", peer=OTHER.hex()) == 2
    assert value("fedstream_standby_lag_batches", fragment="win") == 3
    assert value("fedstream_standby_held_results", fragment="win") == 12
    assert value("fedstream_standby_since_batch_seconds", fragment="win") == 0.4
    assert value("fedstream_standby_promotions") == 1
    assert value("fedstream_overlay_members", state="suspect") == 1
    assert value("fedstream_link_bytes", direction="received") == 200
    assert value("fedstream_watermark_lag_seconds", fragment="win") == 30
    assert value("fedstream_state_bytes", fragment="win") == 4096
    assert value("fedstream_contract_price", participant="globex") == 20
    assert value("fedstream_elastic_launched_peers") == 1
    assert value("fedstream_elastic_leader") == 1
    assert value("fedstream_elastic_decisions", outcome="grow") == 1
    assert value("fedstream_elastic_draining") == 1
    assert value("fedstream_refused_requests", code="unavailable") == 1
    assert value("fedstream_moves", direction="out", outcome="ok") == 1
    assert value("fedstream_fragment_tentative", fragment="win") == 1
    assert value("fedstream_tentative_tuples", query="win") == 7
    assert value("fedstream_corrections", query="win") == 2
    assert value("fedstream_corrected_tuples", query="win") == 5
    assert value("fedstream_engine_executors") == 0
    latency = [s for s in found["fedstream_result_latency_seconds"].samples]
    assert any(s.name.endswith("_sum") and s.value == 1.5 for s in latency)


def test_label_sets_are_bounded_and_gone_fragments_leave() -> None:
    peer = FakePeer()
    observer = Observer(peer)
    fed(observer)
    allowed = LABELS | {"le"}
    for family in scrape(observer).values():
        for sample in family.samples:
            assert set(sample.labels) <= allowed, (sample.name, sample.labels)
    for family in FAMILIES:
        assert family.name.startswith(PREFIX)
        assert set(family.labels) <= LABELS
        if family.kind == "counter":
            assert family.name.endswith("_total")
        if family.kind == "histogram":
            assert family.name.endswith("_seconds")
    assert all(buckets == tuple(sorted(buckets)) for buckets in HISTOGRAMS.values())
    peer.fragments = []  # the query was deleted: its labelled children go
    run_async(observer.sample)
    found = scrape(observer)
    for name in ("fedstream_result_latency_seconds", "fedstream_batch_duration_seconds"):
        assert not [
            s for s in found[name].samples if s.labels.get("query", s.labels.get("fragment"))
        ]
    assert not found["fedstream_fragment_busy_seconds"].samples


def test_the_federation_view_asks_every_other_member() -> None:
    peer = FakePeer()
    observer = Observer(peer)
    run_async(observer.sample)
    view = run_async(lambda: observer.federation(history=True))
    assert peer.asked == [OTHER]
    assert [p["node_id"] for p in view["peers"]] == [NODE.hex(), OTHER.hex()]
    assert view["peers"][1]["history"] is True
    assert len(view["peers"][0]["samples"]) == 1
    # the query diagram: this peer's box (the other answered no status: nothing of it drawn)
    (graph,) = view["diagram"]["queries"]
    assert [(b["box"], b["node_id"], b["participant"]) for b in graph["boxes"]] == [
        ("w", NODE.hex(), "acme")
    ]


def test_fragment_figures_count_each_report_once() -> None:
    figures = FragmentFigures()
    durations = figures.add({"q": [report(1, 500, 10, second=1), report(2, 250, 5, second=2)]}, 2)
    assert durations == {"q": [0.5, 0.25]}
    again = figures.add({"q": [report(2, 250, 5, second=2), report(3, 100, 1, second=3)]}, 2)
    assert again == {"q": [0.1]}  # batch 2 was counted already
    assert figures.busy_s["q"] == pytest.approx(0.85)
    assert figures.input_rows["q"] == 16
    assert figures.busy_ratio["q"] == pytest.approx(0.05)
    assert figures.watermark_lag_s["q"] == 30
    figures.add({}, 2)  # the fragment left this peer
    assert figures.by_fragment() == {}


def test_chart_points_are_rates_over_the_interval() -> None:
    first = Reading(100.0, {"s": 10}, {"q": 0}, {"o": 0})
    second = Reading(102.0, {"s": 30}, {"q": 4}, {"o": 3, "p": 1})
    p = point(first, second, latencies={"q": [1.0, 2.0]}, batch_s={}, backlog={}, utilisation=0.5)
    assert p["in_rate"] == {"s": 10.0} and p["out_rate"] == {"q": 2.0}
    assert p["stream_rate"] == {"o": 1.5, "p": 0.5}
    assert p["latency_s"] == {"q": 1.5}
    restarted = Reading(104.0, {"s": 4}, {"q": 4})  # a counter that went down: from zero
    p = point(second, restarted, latencies={}, batch_s={}, backlog={}, utilisation=None)
    assert p["in_rate"] == {"s": 2.0} and p["out_rate"] == {"q": 0.0}


def test_observe_messages_are_checked() -> None:
    assert decode({"op": "observe", "history": True}) == ObservePeer(True)
    assert decode({"op": "observe"}) == ObservePeer(False)
    with pytest.raises(InvalidInput, match="history"):
        decode({"op": "observe", "history": "yes"})


def test_http_address_defaults_to_the_api_port_plus_two() -> None:
    assert http_address(None, "127.0.0.1", 7700) == ("127.0.0.1", 7702)
    assert http_address(None, "127.0.0.1", 0) == ("127.0.0.1", 0)
    assert http_address("off", "127.0.0.1", 7700) is None
    assert http_address("0.0.0.0:9000", "127.0.0.1", 7700) == ("0.0.0.0", 9000)
    with pytest.raises(UsageError):
        http_address("nowhere", "127.0.0.1", 7700)


class FakeLink:
    def __init__(self, sent: int, received: int) -> None:
        self.traffic = (sent, received)


def test_link_traffic_only_grows_as_links_close() -> None:
    traffic = Traffic()
    a, b = FakeLink(10, 20), FakeLink(1, 2)
    assert traffic.totals([a, b]) == (11, 22)
    traffic.close(a)
    assert traffic.totals([b]) == (11, 22)
