"""Every box kind on real Spark, through a real peer, against plain-Python computations.

One peer (on the shared Spark session) serves the whole module; each test makes its own
streams and query, pushes generated tuples through the real client over loopback, reads the
result stream back and compares it, as a multiset, with an independent computation.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from typing import Any

import pytest

from peer.client import Client
from peer.testing import PeerThread, collect

pytestmark = pytest.mark.spark

READINGS = {
    "name": "reading",
    "fields": [
        {"name": "sensor", "type": "int"},
        {"name": "kind", "type": "string"},
        {"name": "v", "type": "long"},
        {"name": "x", "type": "double"},
        {"name": "t", "type": "long"},
    ],
}


@pytest.fixture(scope="module", autouse=True)
def readings_schema(peer: PeerThread) -> None:
    """The module's peer (tests/integration/conftest.py) knows the readings schema."""
    asyncio.run(_setup(peer.port))


async def _setup(port: int) -> None:
    async with Client("127.0.0.1", port) as c:
        await c.create_schema(READINGS)


def readings(n: int, seed: int, *, per_t: int = 5, kinds: str = "abc") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "sensor": rng.randrange(4),
            "kind": rng.choice(kinds),
            "v": rng.randrange(-20, 100),
            "x": round(rng.uniform(0, 10), 3),
            "t": i // per_t,
        }
        for i in range(n)
    ]


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {k: [r[k] for r in rows] for k in rows[0]}


def run_query(
    port: int,
    query: dict[str, Any],
    pushes: dict[str, list[dict[str, Any]]],
    expect: dict[str, int],
    *,
    batch: int = 400,
    settle_s: float = 3.0,
) -> dict[str, list[dict[str, Any]]]:
    """Create input streams, start the query, push in batches, return each result stream."""

    async def go() -> dict[str, list[dict[str, Any]]]:
        async with Client("127.0.0.1", port, timeout_s=120) as c:
            for stream in pushes:
                await c.create_stream(stream, "reading")
            await c.create_query(query)
            await c.start_query(query["name"])
            for stream, rows in pushes.items():
                for i in range(0, len(rows), batch):
                    await c.push(stream, {"columns": columns(rows[i : i + batch])})
            results = {}
            for stream, count in expect.items():
                results[stream] = await collect(c, stream, count, timeout_s=120, settle_s=settle_s)
            await c.set_query_status(query["name"], "DELETED")
            return results

    return asyncio.run(go())


def box(
    name: str, type_: str, inputs: list[str], outputs: list[str], **params: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "type": type_,
        "inputs": inputs,
        "outputs": outputs,
        "params": {k.replace("_", "-"): str(v) for k, v in params.items()},
    }


def key(row: dict[str, Any], fields: list[str]) -> tuple[Any, ...]:
    return tuple(round(row[f], 6) if isinstance(row[f], float) else row[f] for f in fields)


def same(got: list[dict[str, Any]], want: list[tuple[Any, ...]], fields: list[str]) -> None:
    assert Counter(key(r, fields) for r in got) == Counter(want)


def test_filter_case_statement_with_false_port(peer: PeerThread) -> None:
    rows = readings(3000, seed=1)
    query = {
        "name": "f1",
        "boxes": [
            {
                "name": "split",
                "type": "filter",
                "inputs": ["f1_in"],
                "outputs": ["f1_hot", "f1_warm", "f1_rest"],
                "params": {
                    "expression.0": "v > 80",
                    "expression.1": "v > 40 AND kind = 'a'",
                    "pass-on-false-port": "1",
                },
            }
        ],
    }
    hot = [r for r in rows if r["v"] > 80]
    warm = [r for r in rows if not r["v"] > 80 and r["v"] > 40 and r["kind"] == "a"]
    rest = [r for r in rows if r not in hot and r not in warm]
    fields = list(READINGS_FIELDS)
    got = run_query(
        peer.port,
        query,
        {"f1_in": rows},
        {"f1_hot": len(hot), "f1_warm": len(warm), "f1_rest": len(rest)},
    )
    same(got["f1_hot"], [key(r, fields) for r in hot], fields)
    same(got["f1_warm"], [key(r, fields) for r in warm], fields)
    same(got["f1_rest"], [key(r, fields) for r in rest], fields)


READINGS_FIELDS = ("sensor", "kind", "v", "x", "t")


def test_map_expressions(peer: PeerThread) -> None:
    rows = readings(2000, seed=2)
    query = {
        "name": "m1",
        "boxes": [
            box(
                "calc",
                "map",
                ["m1_in"],
                ["m1_out"],
                **{
                    "expression.0": "sensor",
                    "output-field-name.0": "sensor",
                    "expression.1": "v * 2 + 1",
                    "output-field-name.1": "v2",
                    "expression.2": "CASE WHEN x > 5 THEN 'high' ELSE upper(kind) END",
                    "output-field-name.2": "label",
                    "expression.3": "x / 2",
                    "output-field-name.3": "half",
                },
            )
        ],
    }
    want = [
        (
            r["sensor"],
            r["v"] * 2 + 1,
            "high" if r["x"] > 5 else r["kind"].upper(),
            round(r["x"] / 2, 6),
        )
        for r in rows
    ]
    got = run_query(peer.port, query, {"m1_in": rows}, {"m1_out": len(rows)})
    same(got["m1_out"], want, ["sensor", "v2", "label", "half"])


def test_union_keeps_every_tuple(peer: PeerThread) -> None:
    a, b = readings(1500, seed=3), readings(1200, seed=4)
    query = {"name": "u1", "boxes": [box("both", "union", ["u1_a", "u1_b"], ["u1_out"])]}
    got = run_query(peer.port, query, {"u1_a": a, "u1_b": b}, {"u1_out": len(a) + len(b)})
    same(got["u1_out"], [key(r, list(READINGS_FIELDS)) for r in a + b], list(READINGS_FIELDS))


def windows_of(t: float, size: float, advance: float) -> list[float]:
    """Window starts (multiples of advance from zero) whose [start, start+size) holds t."""
    first = (t - size) // advance * advance + advance
    starts, s = [], first
    while s <= t:
        if s + size > t:
            starts.append(s)
        s += advance
    return starts


def reference_aggregate(
    rows: list[dict[str, Any]], size: int, advance: int, slack: int
) -> list[tuple[Any, ...]]:
    watermark = max(r["t"] for r in rows) - slack
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:  # rows arrive in t order, so nothing is late
        for start in windows_of(r["t"], size, advance):
            groups[(int(start), r["sensor"])].append(r)
    out = []
    for (start, sensor), members in groups.items():
        if start + size > watermark:
            continue  # the watermark has not passed this window's end: not emitted yet
        vs = [m["v"] for m in members]
        out.append(
            (
                start,
                start + size,
                sensor,
                len(members),
                sum(vs),
                round(sum(m["x"] for m in members) / len(members), 6),
                min(vs),
                max(vs),
                members[0]["v"],
                members[-1]["v"],
                len({m["kind"] for m in members}),
            )
        )
    return out


AGG_PARAMS = {
    "aggregate-function.0": "count()",
    "aggregate-function-output-name.0": "n",
    "aggregate-function.1": "sum(v)",
    "aggregate-function-output-name.1": "total",
    "aggregate-function.2": "avg(x)",
    "aggregate-function-output-name.2": "mean_x",
    "aggregate-function.3": "min(v)",
    "aggregate-function-output-name.3": "lo",
    "aggregate-function.4": "max(v)",
    "aggregate-function-output-name.4": "hi",
    "aggregate-function.5": "firstval(v)",
    "aggregate-function-output-name.5": "first_v",
    "aggregate-function.6": "lastval(v)",
    "aggregate-function-output-name.6": "last_v",
    "aggregate-function.7": "count_distinct(kind)",
    "aggregate-function-output-name.7": "kinds",
    "group-by": "sensor",
    "order-on-field": "t",
    "window-size-by": "VALUES",
}
AGG_FIELDS = [
    "window_start",
    "window_end",
    "sensor",
    "n",
    "total",
    "mean_x",
    "lo",
    "hi",
    "first_v",
    "last_v",
    "kinds",
]


@pytest.mark.parametrize(
    ("size", "advance", "slack"), [(10, 10, 0), (12, 4, 2)], ids=["tumbling", "sliding"]
)
def test_aggregate_values_windows(peer: PeerThread, size: int, advance: int, slack: int) -> None:
    rows = readings(4000, seed=5 + size)
    name = f"agg{size}_{advance}"
    params = {**AGG_PARAMS, "window-size": str(size), "advance": str(advance), "slack": str(slack)}
    query = {
        "name": name,
        "boxes": [
            {
                "name": "agg",
                "type": "aggregate",
                "inputs": [f"{name}_in"],
                "outputs": [f"{name}_out"],
                "params": params,
            }
        ],
    }
    want = reference_aggregate(rows, size, advance, slack)
    got = run_query(peer.port, query, {f"{name}_in": rows}, {f"{name}_out": len(want)})
    same(got[f"{name}_out"], want, AGG_FIELDS)


def test_aggregate_tuple_windows(peer: PeerThread) -> None:
    rows = readings(1200, seed=9)
    params = {
        "aggregate-function.0": "sum(v)",
        "aggregate-function-output-name.0": "total",
        "aggregate-function.1": "lastval(kind)",
        "aggregate-function-output-name.1": "k",
        "window-size-by": "TUPLES",
        "window-size": "5",
        "advance": "3",
        "group-by": "sensor",
    }
    query = {
        "name": "tw",
        "boxes": [
            {
                "name": "agg",
                "type": "aggregate",
                "inputs": ["tw_in"],
                "outputs": ["tw_out"],
                "params": params,
            }
        ],
    }
    want = []
    by_sensor: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_sensor[r["sensor"]].append(r)
    for sensor, members in by_sensor.items():
        start = 0
        while start + 5 <= len(members):
            w = members[start : start + 5]
            want.append((start, start + 5, sensor, sum(m["v"] for m in w), w[-1]["kind"]))
            start += 3
    got = run_query(peer.port, query, {"tw_in": rows}, {"tw_out": len(want)}, batch=97)
    same(got["tw_out"], want, ["window_start", "window_end", "sensor", "total", "k"])


def test_join_with_time_bound(peer: PeerThread) -> None:
    left, right = readings(600, seed=11, per_t=2), readings(600, seed=12, per_t=2)
    params = {
        "predicate": "left.sensor = right.sensor AND left.v > right.v",
        "left-order-by": "VALUES",
        "left-order-on-field": "t",
        "right-order-by": "VALUES",
        "right-order-on-field": "t",
        "left-buffer-size": "3",
        "right-buffer-size": "2",
    }
    query = {
        "name": "j1",
        "boxes": [
            {
                "name": "join",
                "type": "join",
                "inputs": ["j1_l", "j1_r"],
                "outputs": ["j1_out"],
                "params": params,
            }
        ],
    }
    want = [
        (a["sensor"], a["v"], a["t"], b["v"], b["t"])
        for a in left
        for b in right
        if a["sensor"] == b["sensor"]
        and a["v"] > b["v"]
        and a["t"] - b["t"] < 2
        and b["t"] - a["t"] < 3
    ]

    # Interleave both sides in event-time order so no tuple is behind the watermark.
    async def go() -> list[dict[str, Any]]:
        async with Client("127.0.0.1", peer.port, timeout_s=120) as c:
            await c.create_stream("j1_l", "reading")
            await c.create_stream("j1_r", "reading")
            await c.create_query(query)
            await c.start_query("j1")
            for i in range(0, 600, 100):
                await c.push("j1_l", {"columns": columns(left[i : i + 100])})
                await c.push("j1_r", {"columns": columns(right[i : i + 100])})
            got = await collect(c, "j1_out", len(want), timeout_s=120, settle_s=3)
            await c.set_query_status("j1", "DELETED")
            return got

    got = asyncio.run(go())
    same(got, want, ["sensor", "v", "t", "right_v", "right_t"])


def test_bsort_bounded_reordering(peer: PeerThread) -> None:
    rng = random.Random(13)
    rows = readings(800, seed=13)
    for r in rows:
        r["t"] = r["t"] + rng.randrange(-3, 4)  # disorder
    query = {
        "name": "bs",
        "boxes": [box("sort", "bsort", ["bs_in"], ["bs_out"], **{"order-on": "t", "slack": "4"})],
    }
    buffer: list[tuple[int, int, dict[str, Any]]] = []
    want_order = []
    for seq, r in enumerate(rows):
        buffer.append((r["t"], seq, r))
        if len(buffer) > 4:
            buffer.sort(key=lambda e: (e[0], e[1]))
            want_order.append(buffer.pop(0)[2])
    got = run_query(peer.port, query, {"bs_in": rows}, {"bs_out": len(want_order)}, batch=53)
    fields = list(READINGS_FIELDS)
    same(got["bs_out"], [key(r, fields) for r in want_order], fields)
    assert [key(r, fields) for r in got["bs_out"]] == [key(r, fields) for r in want_order]


def test_chain_filter_map_aggregate(peer: PeerThread) -> None:
    rows = readings(3000, seed=17)
    query = {
        "name": "chain",
        "boxes": [
            box("keep", "filter", ["ch_in"], ["ch_kept"], **{"expression.0": "kind <> 'c'"}),
            box(
                "scale",
                "map",
                ["ch_kept"],
                ["ch_scaled"],
                **{
                    "expression.0": "sensor",
                    "output-field-name.0": "sensor",
                    "expression.1": "v * 10",
                    "output-field-name.1": "v10",
                    "expression.2": "t",
                    "output-field-name.2": "t",
                },
            ),
            box(
                "sum",
                "aggregate",
                ["ch_scaled"],
                ["ch_out"],
                **{
                    "aggregate-function.0": "sum(v10)",
                    "aggregate-function-output-name.0": "s",
                    "window-size": "20",
                    "advance": "20",
                    "order-on-field": "t",
                    "group-by": "sensor",
                },
            ),
        ],
    }
    watermark = max(r["t"] for r in rows)
    sums: dict[tuple[int, int], int] = defaultdict(int)
    for r in rows:
        if r["kind"] != "c":
            sums[(r["t"] // 20 * 20, r["sensor"])] += r["v"] * 10
    want = [
        (s, s + 20, sensor, total) for (s, sensor), total in sums.items() if s + 20 <= watermark
    ]
    got = run_query(peer.port, query, {"ch_in": rows}, {"ch_out": len(want)})
    same(got["ch_out"], want, ["window_start", "window_end", "sensor", "s"])
