"""The example workloads without a JVM: their queries pass check_query against their schemas,
their generators are deterministic and valid, their references give non-empty outputs with
the fields and types the query derives, and compare() finds every difference."""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import Any

import pytest

from peer.examples import (
    band_join,
    columns,
    compare,
    intrusion,
    split_query,
    traffic,
    tumbling_windows,
)
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query
from peer.model.schema import Schema, parse_schema
from peer.model.tuples import batch_from_wire

EXAMPLES = [traffic, intrusion]
IDS = ["traffic", "intrusion"]
SMALL: dict[str, dict[str, Any]] = {
    "traffic": {"cars": 30, "minutes": 4, "segments": 6},
    "intrusion": {"seconds": 60, "clients": 10},
}


def small(example: ModuleType, seed: int, **extra: Any) -> dict[str, list[dict[str, Any]]]:
    inputs: dict[str, list[dict[str, Any]]] = example.generate(
        seed, **SMALL[example.__name__.rpartition(".")[2]], **extra
    )
    return inputs


def source_schemas(example: ModuleType) -> dict[str, Schema]:
    by_name = {s["name"]: parse_schema(s) for s in example.SCHEMAS}
    return {stream: by_name[schema] for stream, schema in example.SOURCE_STREAMS.items()}


def checked(example: ModuleType, **kwargs: Any) -> CheckedQuery:
    return check_query(parse_query(example.query(**kwargs)), source_schemas(example))


PYTHON_TYPES = {"int": int, "long": int, "double": float, "string": str, "bool": bool}


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_query_checks_against_the_schemas(example: ModuleType) -> None:
    plan = checked(example)
    assert set(plan.inputs) == set(example.SOURCE_STREAMS)
    assert set(plan.outputs) == set(example.OUTPUTS)
    derived = set(plan.stream_schemas) - set(example.SOURCE_STREAMS)
    assert derived == set(example.OUTPUTS) | set(example.INTERMEDIATE)
    # BOX_GROUPS: three groups that hold every box exactly once.
    boxes = [b.box.name for b in plan.boxes]
    assert len(example.BOX_GROUPS) == 3
    assert sorted(n for group in example.BOX_GROUPS for n in group) == sorted(boxes)


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_stages_check_in_order_and_cover_the_query(example: ModuleType) -> None:
    streams = source_schemas(example)
    whole = checked(example)
    outputs: list[str] = []
    for stage in example.stages("q"):
        plan = check_query(parse_query(stage), streams)
        streams.update({s: plan.stream_schemas[s] for s in plan.outputs})
        outputs += plan.outputs
        # The same stream schemas as in the whole query.
        for name, schema in plan.stream_schemas.items():
            assert schema.fields == whole.stream_schemas[name].fields
    assert set(example.OUTPUTS) <= set(outputs)
    # On one peer, a join never runs behind an aggregate inside one stage (see traffic).
    for stage in example.stages("q"):
        kinds = [b["type"] for b in stage["boxes"]]
        assert not ("aggregate" in kinds and "join" in kinds)


def test_traffic_box_groups_keep_the_aggregate_and_the_joins_apart() -> None:
    group_of = {box: i for i, group in enumerate(traffic.BOX_GROUPS) for box in group}
    assert group_of["per_minute"] != group_of["bill"]
    assert group_of["per_minute"] != group_of["dispatch"]


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_nodes_are_copied_into_boxes(example: ModuleType) -> None:
    nodes = {box: f"participant{i}" for i, group in enumerate(example.BOX_GROUPS) for box in group}
    q = example.query("placed", nodes=nodes)
    assert q["name"] == "placed"
    assert {b["name"]: b["node"] for b in q["boxes"]} == nodes
    parsed = parse_query(q)
    assert {b.name: b.node for b in parsed.boxes} == nodes
    assert all("node" not in b for b in example.query()["boxes"])  # the template is untouched
    with pytest.raises(ValueError, match="unknown boxes"):
        example.query(nodes={"no_such_box": "x"})


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_outputs_are_non_empty_and_typed_as_the_query_derives(
    example: ModuleType, seed: int
) -> None:
    plan = checked(example)
    inputs = small(example, seed)
    everything = example.reference_streams(inputs)
    assert set(everything) == set(example.OUTPUTS) | set(example.INTERMEDIATE)
    outputs = example.reference(inputs)
    assert set(outputs) == set(example.OUTPUTS)
    for stream, rows in everything.items():
        schema = plan.stream_schemas[stream]
        if stream in example.OUTPUTS:
            assert rows, f"{stream} is empty for seed {seed}"
            assert outputs[stream] == rows
        for row in rows:
            assert list(row) == list(schema.names), stream
            for f in schema.fields:
                assert isinstance(row[f.name], PYTHON_TYPES[f.type]), (stream, f.name, row)


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_generator_is_deterministic_ordered_and_valid(example: ModuleType) -> None:
    a, b, c = small(example, 7), small(example, 7), small(example, 8)
    assert a == b
    assert a != c
    assert set(a) == set(example.SOURCE_STREAMS)
    schemas = source_schemas(example)
    for stream, rows in a.items():
        assert rows, stream
        times = [r["t"] for r in rows]
        assert times == sorted(times), f"{stream} is not in event-time order"
        assert times[-1] - times[-2] >= example.FLUSH_AFTER_S  # ends with the flush tuple
        # The peer accepts the rows as they are (types, string sizes).
        table = batch_from_wire(schemas[stream], {"columns": columns(rows)}, stream=stream)
        assert table.num_rows == len(rows)
        assert table.column_names == list(schemas[stream].names)


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_flush_tuples_only_close_windows(example: ModuleType) -> None:
    """The flush tuples never show up in an output; without them the last windows stay open."""
    flushed = example.reference_streams(small(example, 4))
    unflushed = example.reference_streams(small(example, 4, flush=False))
    for stream, rows in flushed.items():
        as_set = Counter(tuple(row.items()) for row in rows)
        as_set.subtract(tuple(row.items()) for row in unflushed[stream])
        assert min(as_set.values(), default=0) >= 0, f"{stream}: flushing lost rows"
    assert sum(map(len, unflushed.values())) < sum(map(len, flushed.values()))
    flushed = example.reference(small(example, 4))
    for rows in flushed.values():
        for row in rows:
            assert all(row.get(k) not in (-1, -2, "0.0.0.0") for k in ("seg", "car_id", "src_ip"))


def test_traffic_semantics_by_hand() -> None:
    cars = [
        # seg 3, minute [0, 60): six cars slow -> congested: toll 2 * (6 - 5)^2 = 2
        *({"car_id": i, "seg": 3, "x": 3.5, "speed": 10.0, "t": i} for i in range(1, 7)),
        {"car_id": 1, "seg": 3, "x": 3.6, "speed": 12.5, "t": 59},
        # minute [60, 120): billed with the toll of [0, 60) on seg 3 (t = 60 .. 119)
        {"car_id": 7, "seg": 3, "x": 3.7, "speed": 30.0, "t": 60},
        {"car_id": 8, "seg": 3, "x": 3.8, "speed": 0.0, "t": 61},  # stopped: not billed
        {"car_id": 9, "seg": 4, "x": 4.1, "speed": 50.0, "t": 62},  # no toll tuple for seg 4
        {"car_id": 7, "seg": 3, "x": 3.9, "speed": 30.0, "t": 119},
        {"car_id": 7, "seg": 3, "x": 3.95, "speed": 30.0, "t": 121},  # window [60, 120) open
    ]
    trucks = [
        {"truck_id": 1, "seg": 3, "x": 3.0, "t": 31},  # 61 - 31 = 30: not < 30
        {"truck_id": 1, "seg": 3, "x": 3.5, "t": 32},  # 29 apart: joins
        {"truck_id": 2, "seg": 4, "x": 4.0, "t": 61},  # other segment
        {"truck_id": 1, "seg": 3, "x": 3.8, "t": 90},  # 29 apart: joins
        {"truck_id": 1, "seg": 3, "x": 3.8, "t": 91},  # 30 apart: not
    ]
    every = traffic.reference_streams({"car_positions": cars, "tow_trucks": trucks})
    stats = {(r["window_start"], r["seg"]): r for r in every["segment_stats"]}
    assert set(stats) == {(0, 3), (60, 3), (60, 4)}  # watermark 121 closed [60, 120)
    assert stats[(0, 3)]["cars"] == 6
    assert stats[(0, 3)]["avg_speed"] == pytest.approx((6 * 10.0 + 12.5) / 7)
    tolls = {(r["t"], r["seg"]): r["toll"] for r in every["segment_tolls"]}
    assert tolls == {(60, 3): 2, (120, 3): 0, (120, 4): 0}
    bills = sorted((r["car_id"], r["t"], r["toll"]) for r in every["toll_notifications"])
    assert bills == [(7, 60, 2), (7, 119, 2), (7, 121, 0)]
    tows = sorted((r["truck_id"], r["car_id"], r["truck_t"]) for r in every["tow_dispatch"])
    assert tows == [(1, 8, 32), (1, 8, 90)]


def test_intrusion_semantics_by_hand() -> None:
    def conn(src: str, dst: str, port: int, t: int, protocol: str = "tcp") -> dict[str, Any]:
        return {"src_ip": src, "dst_ip": dst, "dst_port": port, "protocol": protocol, "t": t}

    rows = [
        *(conn("1.1.1.1", "10.0.0.1", p, 0) for p in range(1, 12)),  # 11 ports: a scan
        *(conn("2.2.2.2", "10.0.0.2", 22, 5) for _ in range(21)),  # 21 attempts: a flood
        *(conn("3.3.3.3", "10.0.0.3", p, 9) for p in range(1, 31)),  # scan and flood: scan
        *(conn("4.4.4.4", "8.8.8.8", p, 9) for p in range(1, 31)),  # outbound: ignored
        *(conn("5.5.5.5", "10.0.0.4", 22, 9) for _ in range(20)),  # 20 attempts: fine
        conn("2.2.2.2", "10.0.0.2", 0, 10, "icmp"),  # window [10, 20) never closes
    ]
    alerts = intrusion.reference({"connections": rows})["intrusion_alerts"]
    assert sorted((r["src_ip"], r["kind"], r["attempts"], r["ports"]) for r in alerts) == [
        ("1.1.1.1", "scan", 11, 11),
        ("2.2.2.2", "flood", 21, 1),
        ("3.3.3.3", "scan", 30, 30),
    ]
    activity = intrusion.reference_streams({"connections": rows})["source_activity"]
    assert {r["window_start"] for r in activity} == {0}


def test_compare_is_a_multiset_comparison_with_rounded_floats() -> None:
    want = [{"a": 1, "x": 0.1 + 0.2}, {"a": 1, "x": 0.3}, {"a": 2, "x": 1.0}]
    assert (
        compare([{"a": 2, "x": 1.0000000001}, {"x": 0.3, "a": 1}, {"a": 1, "x": 0.3}], want) == []
    )
    assert compare([], []) == []
    assert compare([{"a": 1, "x": 0.3}, {"a": 3, "x": 1.0}], want) == [
        "got 2 rows, expected 3",
        "missing: {a: 1, x: 0.3}",  # want holds it twice (0.1 + 0.2 rounds to 0.3), got once
        "missing: {a: 2, x: 1.0}",
        "unexpected: {a: 3, x: 1.0}",
    ]
    # Multiplicity counts: the same rows, as many of them, in other numbers differ.
    a, b = {"a": 1, "x": 0.5}, {"a": 2, "x": 0.5}
    assert compare([a, a, b], [a, b, b]) == [
        "missing: {a: 2, x: 0.5}",
        "unexpected: {a: 1, x: 0.5}",
    ]
    assert compare([a], [a, a, a]) == ["got 1 rows, expected 3", "missing (x2): {a: 1, x: 0.5}"]
    assert compare([b, b, b, a], [a]) == [
        "got 4 rows, expected 1",
        "unexpected (x3): {a: 2, x: 0.5}",
    ]
    assert compare([{"a": 1, "x": 0.3, "b": 0}], [{"a": 1, "x": 0.3}])[0].startswith("fields")
    # Float rounding is to float_places.
    assert compare([{"x": 1.04}], [{"x": 1.0}], float_places=1) == []
    assert compare([{"x": 1.04}], [{"x": 1.0}], float_places=2) != []
    many = compare([{"a": i} for i in range(30)], [], limit=5)
    assert many[-1] == "... and 25 more unexpected rows"


def test_building_blocks() -> None:
    rows = [{"k": k, "t": t} for k, t in [(1, 0), (1, 9), (2, 10), (1, 10), (1, 25), (2, 40)]]
    windows = tumbling_windows(rows, order="t", size=10, group_by=["k"], slack=5)
    # watermark 40 - 5 = 35: windows ending at or before 35 are emitted
    assert sorted(windows) == [(0, 1), (10, 1), (10, 2), (20, 1)]
    assert [r["t"] for r in windows[(0, 1)]] == [0, 9]
    left = [{"k": 1, "t": 10}]
    right = [{"k": 1, "t": t} for t in range(0, 25)] + [{"k": 2, "t": 10}]
    pairs = band_join(
        left,
        right,
        left_key=lambda r: r["k"],
        right_key=lambda r: r["k"],
        left_order="t",
        right_order="t",
        left_buffer=5,
        right_buffer=3,
    )
    # 10 - rt < 3 and rt - 10 < 5: rt in 8..14
    assert [r["t"] for _, r in pairs] == list(range(8, 15))
    q = {"name": "q", "boxes": [{"name": "a"}, {"name": "b"}]}
    assert [s["name"] for s in split_query(q, [("x", ["a"]), ("", ["b"])])] == ["q_x", "q"]
    with pytest.raises(ValueError, match="every box once"):
        split_query(q, [("x", ["a"])])
