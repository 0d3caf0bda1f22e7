"""The NEXMark generator's rules, the queries' shapes, and the reference SQL against plain
Python (no JVM: DuckDB and numpy only)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from peer.examples import compare
from peer.examples.nexmark import (
    OUTPUT_FIELDS,
    QUERIES,
    SCHEMAS,
    SOURCE_STREAMS,
    GeneratorConfig,
    flush,
    generate,
    real_rows,
    sql,
    stages,
)
from peer.examples.nexmark.generator import BLOCK
from peer.model.plan import check_query
from peer.model.query import parse_query
from peer.model.schema import Schema, parse_schema

US = 1_000_000


def micros(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with datetimes as integer microseconds since the epoch."""
    out = []
    for row in rows:
        out.append({k: (int(v.timestamp() * US) if hasattr(v, "timestamp") else v)
                    for k, v in row.items()})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def events() -> dict[str, pa.Table]:
    return generate(GeneratorConfig(event_rate=200, seed=3), 0, 20_000)


# -- the generator ----------------------------------------------------------------------------


def test_proportions_and_ids(events: dict[str, pa.Table]) -> None:
    assert {s: t.num_rows for s, t in events.items()} == {
        "person": 400,
        "auction": 1200,
        "bid": 18_400,
    }
    assert events["person"].column("id").to_pylist() == list(range(1000, 1400))
    assert events["auction"].column("id").to_pylist() == list(range(1000, 2200))


def test_event_time_advances_with_the_rate() -> None:
    cfg = GeneratorConfig(event_rate=300, seed=1)
    tables = generate(cfg, 0, 3000)
    # Event n is at base + floor(n * 1000 / rate) ms: person n = 50 k, auctions 50 k + 1..3.
    people = [int(t.timestamp() * 1000) for t in tables["person"].column("date_time").to_pylist()]
    assert people == [cfg.base_time_ms + (50 * k * 1000) // 300 for k in range(60)]
    for table in tables.values():
        times = table.column("date_time").cast(pa.int64()).to_numpy()
        assert (np.diff(times) >= 0).all()
    bids = tables["bid"].column("date_time").cast(pa.int64()).to_numpy()
    assert (bids[-1] - bids[0]) / US == pytest.approx(3000 / 300, abs=0.1)


def test_deterministic_and_independent_of_how_it_is_cut() -> None:
    cfg = GeneratorConfig(event_rate=1000, seed=7)
    whole = generate(cfg, 0, 2 * BLOCK + 500)
    again = generate(cfg, 0, 2 * BLOCK + 500)
    assert all(whole[s].equals(again[s]) for s in whole)
    # a piece across a block boundary equals the same events cut from the whole
    piece = generate(cfg, BLOCK - 123, 777)
    for stream, table in piece.items():
        times = whole[stream].column("date_time").cast(pa.int64()).to_numpy()
        first = piece[stream].column("date_time").cast(pa.int64()).to_numpy()
        lo = int(np.searchsorted(times, first[0]))
        assert whole[stream].slice(lo, table.num_rows).equals(table), stream
    other = generate(GeneratorConfig(event_rate=1000, seed=8), 0, 2 * BLOCK + 500)
    assert not other["bid"].equals(whole["bid"])


def test_auction_rules(events: dict[str, pa.Table]) -> None:
    cfg = GeneratorConfig(event_rate=200, seed=3)
    a = events["auction"].to_pydict()
    assert set(a["category"]) == {10, 11, 12, 13, 14}
    assert all(100 <= p <= 100_000_000 for p in a["initial_bid"])
    assert all(r > i for r, i in zip(a["reserve"], a["initial_bid"], strict=True))
    lengths = [
        (e - d).total_seconds() * 1000 for e, d in zip(a["expires"], a["date_time"], strict=True)
    ]
    assert min(lengths) >= 1 and max(lengths) <= cfg.max_auction_ms
    assert max(lengths) > 0.8 * cfg.max_auction_ms  # uniform up to twice the horizon
    # sellers: 3 in 4 the first of the last hundred people (ids 1000, 1100, ...), the rest
    # among the last 1000 people or the next 10
    hot = sum(1 for s in a["seller"] if s % 100 == 0)
    assert 0.72 < hot / len(a["seller"]) < 0.80
    for n, seller in enumerate(a["seller"]):
        people_so_far = (n // 3) + 1  # auction k is in epoch k // 3, after that epoch's person
        assert 1000 <= seller < 1000 + people_so_far + 10


def test_bid_rules(events: dict[str, pa.Table]) -> None:
    b = events["bid"].to_pydict()
    assert all(100 <= p <= 100_000_000 for p in b["price"])
    # log-uniform prices: about a sixth in each decade from $1 to $1M
    decades = Counter(min(int(np.log10(p / 100)), 5) for p in b["price"])
    assert all(0.13 < decades[d] / len(b["price"]) < 0.2 for d in range(6))
    hot_auction = sum(1 for x in b["auction"] if x % 100 == 0)
    assert 0.48 < hot_auction / len(b["auction"]) < 0.56
    hot_bidder = sum(1 for x in b["bidder"] if x % 100 == 1)
    assert 0.72 < hot_bidder / len(b["bidder"]) < 0.80
    for i, auction in enumerate(b["auction"]):
        epoch = i // 46  # 46 bids per epoch of 50 events, after the epoch's 3 auctions
        assert auction <= 1000 + 3 * epoch + 2 + 10


def test_event_sizes_follow_the_averages(events: dict[str, pa.Table]) -> None:
    for stream, want in (("person", 200), ("auction", 500), ("bid", 100)):
        table = events[stream]
        sizes = np.zeros(table.num_rows)
        for field in table.schema:
            column = table.column(field.name)
            if pa.types.is_string(field.type):
                sizes += np.array([len(s) for s in column.to_pylist()])
            else:
                sizes += 8
        assert sizes.mean() == pytest.approx(want, rel=0.1), stream


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="event_rate"):
        GeneratorConfig(event_rate=0)
    with pytest.raises(ValueError, match="active_people"):
        GeneratorConfig(active_people=0)
    with pytest.raises(ValueError, match="first >= 0"):
        generate(GeneratorConfig(), -1, 10)


# -- the queries --------------------------------------------------------------------------------


def source_schemas(prefix: str = "") -> dict[str, Schema]:
    by_name = {s["name"]: parse_schema(s) for s in SCHEMAS}
    return {f"{prefix}{stream}": by_name[schema] for stream, schema in SOURCE_STREAMS.items()}


@pytest.mark.parametrize("q", QUERIES)
def test_every_stage_checks_and_writes_the_result(q: str) -> None:
    streams = source_schemas("x:")
    queries = stages(q, prefix="x:")
    for query in queries:
        checked = check_query(parse_query(query), streams)
        streams.update(checked.stream_schemas)
    assert queries[0]["name"] == f"x_nexmark_{q}"
    assert tuple(streams[f"x:{q}"].names) == OUTPUT_FIELDS[q]


def test_unknown_query_is_refused() -> None:
    with pytest.raises(ValueError, match="q6"):
        stages("q6")
    with pytest.raises(ValueError, match="q6"):
        sql("q6")


# -- the reference SQL against plain Python ------------------------------------------------------


def run_sql(q: str, tables: dict[str, pa.Table], cfg: GeneratorConfig) -> list[dict[str, Any]]:
    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    cursor = con.execute(sql(q, cfg))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_flush_rows_are_set_apart() -> None:
    cfg = GeneratorConfig(event_rate=200)
    tail = flush(cfg, 1000)
    assert tail["bid"].column("auction").to_pylist() == [-1, -2]
    first = tail["bid"].column("date_time").to_pylist()[0]
    last_event = generate(cfg, 999, 1)["bid"].column("date_time").to_pylist()[0]
    assert (first - last_event).total_seconds() == 3600
    rows = [{"auction": -1, "price": 1}, {"auction": 1200, "price": 5}]
    assert real_rows("q2", rows) == [{"auction": 1200, "price": 5}]


def test_sql_q2_q5_q7_match_plain_python(events: dict[str, pa.Table]) -> None:
    cfg = GeneratorConfig(event_rate=200, seed=3)
    bids = micros(events["bid"].to_pylist())

    want2 = [
        {"auction": b["auction"], "price": b["price"]} for b in bids if b["auction"] % 123 == 0
    ]
    assert want2 and compare(run_sql("q2", events, cfg), want2) == []

    counts: Counter[tuple[int, int]] = Counter()
    for b in bids:
        first = b["date_time"] // (2 * US) * 2 * US
        for start in range(first, b["date_time"] - 10 * US, -2 * US):
            counts[(start, b["auction"])] += 1
    most: dict[int, int] = defaultdict(int)
    for (start, _), n in counts.items():
        most[start] = max(most[start], n)
    want5 = [
        {"window_start": s, "window_end": s + 10 * US, "auction": a, "num": n}
        for (s, a), n in counts.items()
        if n == most[s]
    ]
    assert compare(run_sql("q5", events, cfg), want5) == []

    highest: dict[int, int] = defaultdict(int)
    for b in bids:
        w = b["date_time"] // (10 * US)
        highest[w] = max(highest[w], b["price"])
    want7 = [
        {k: b[k] for k in OUTPUT_FIELDS["q7"]}
        for b in bids
        if b["price"] == highest[b["date_time"] // (10 * US)]
    ]
    assert compare(run_sql("q7", events, cfg), want7) == []


def test_sql_q3_q4_q8_match_plain_python(events: dict[str, pa.Table]) -> None:
    cfg = GeneratorConfig(event_rate=200, seed=3)
    people = {p["id"]: p for p in micros(events["person"].to_pylist())}
    auctions = micros(events["auction"].to_pylist())
    bids = micros(events["bid"].to_pylist())

    want3 = [
        {"name": p["name"], "city": p["city"], "state": p["state"], "id": a["id"]}
        for a in auctions
        if a["category"] == 10
        and (p := people.get(a["seller"])) is not None
        and p["state"] in ("OR", "ID", "CA")
        and abs(p["date_time"] - a["date_time"]) < 10 * US
    ]
    assert want3 and compare(run_sql("q3", events, cfg), want3) == []

    by_id = {a["id"]: a for a in auctions}
    final: dict[int, int] = {}
    for b in bids:
        a = by_id.get(b["auction"])
        if a is not None and a["date_time"] <= b["date_time"] <= a["expires"]:
            final[a["id"]] = max(final.get(a["id"], 0), b["price"])
    per: dict[tuple[int, int], list[int]] = defaultdict(list)
    for aid, price in final.items():
        a = by_id[aid]
        per[(a["expires"] // (10 * US) * 10 * US, a["category"])].append(price)
    want4 = [
        {"window_start": s, "window_end": s + 10 * US, "category": c,
         "avg_price": sum(v) / len(v), "auctions": len(v)}
        for (s, c), v in per.items()
    ]  # fmt: skip
    assert want4 and compare(run_sql("q4", events, cfg), want4) == []

    windows = {(p["id"], p["date_time"] // (10 * US)) for p in people.values()}
    sellers = {(a["seller"], a["date_time"] // (10 * US)) for a in auctions}
    want8 = [
        {"id": i, "name": people[i]["name"], "starttime": w * 10 * US} for i, w in windows & sellers
    ]
    assert want8 and compare(run_sql("q8", events, cfg), want8) == []
