"""NEXMark on fedstream: the benchmark's event generator, its queries as boxes, reference SQL.

NEXMark models an online auction: people register (``person``), open auctions (``auction``)
and bid (``bid``). :mod:`.generator` makes the three streams as the NEXMark generator
defines them; :mod:`.queries` holds the streams' schemas, the queries q0-q5, q7 and q8 as
fedstream queries (JSON, Aurora's boxes) and each query in SQL for DuckDB; :mod:`.schemas`
the streams' schemas.

=====  ======================================  ===============================================
query  NEXMark (Flink's SQL)                   here
=====  ======================================  ===============================================
q0     pass-through of bids                    a map (the same)
q1     price in euros (0.908 * price)          a map (the same; the price is a double)
q2     bids on auctions id % 123 = 0           a filter and a map (the same)
q3     people in OR, ID, CA selling in         two filters and a join whose person and
       category 10: an unbounded join          auction are less than 10 s apart (**differs**)
q4     average closing price per category,     join, max per auction, average per category
       over all auctions closed so far         and 10 s window of closing time (**differs**)
q5     hot items: auctions with the most       count per auction in 10 s windows sliding by
       bids per sliding window                 2 s, max per window, join (the same)
q7     highest bid per 10 s window             max per tumbling window, join with bids (same)
q8     people who registered and opened an     count per person and per seller and window,
       auction in the same 10 s window         join on id and window (the same)
=====  ======================================  ===============================================

How q3 and q4 differ, exactly (the reference SQL computes these semantics, not NEXMark's):

- **q3** joins every auction with its seller however far apart they are; fedstream's join
  keeps each side for a bounded time, so here a person and an auction join only when
  ``person.date_time - auction.date_time < 10 s`` and ``auction.date_time -
  person.date_time < 10 s``. A seller is one of the last 1000 people, or a hot seller
  (the first of the last hundred) or one of the next ten, so at 10,000 events/s (one person
  every 5 ms) every seller is less than 5.1 s from its auction and the bound loses nothing;
  at lower rates it loses the matches further apart.
- **q4** takes each auction's closing price as NEXMark does: the highest bid made between
  the auction's start and its expiry (joined with a bound of the longest auction the
  generator makes, :attr:`GeneratorConfig.max_auction_ms`, so no such bid is missed), kept
  per auction once a watermark passes its expiry (an aggregate over 1 s windows of
  ``expires`` grouped by auction, with a slack of the longest auction plus 10 s). NEXMark
  then keeps one running average per category over every auction closed so far, updated with
  each closing; a windowed aggregate cannot update an emitted row, so here the average is
  per category and 10 s tumbling window of closing time (``expires``), as Beam's NEXMark
  does with its windows. Fields: ``window_start``, ``window_end``, ``category``,
  ``avg_price``, ``auctions``.

Why some queries run as several fedstream queries (:func:`.queries.stages`): inside one Spark
streaming query, every windowed box holds one global watermark; an aggregate fed by another
aggregate (q5's maximum over counts, q4's average over closing prices) only sees tuples once
that watermark has passed the first one's windows, and its own input then holds the watermark
back, so neither emits. Each such aggregate therefore reads its input stream as a query of
its own, and a join behind an aggregate runs in a fragment of its own (the planner does that
within one query: q7, q8).

End of input. A window is emitted once a later tuple moves the watermark past it; a finite
test input ends with :func:`flush` tuples, an hour and two hours after the last event, which
move every watermark of every stage past every real window. Rows they produce themselves
have a negative key (:data:`.queries.FLUSH_KEYS`) and are not compared
(:func:`real_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from peer.examples.nexmark.generator import GeneratorConfig, chunks, generate, kind_of
from peer.examples.nexmark.queries import FLUSH_KEYS, OUTPUT_FIELDS, QUERIES, sql, stages
from peer.examples.nexmark.schemas import SCHEMAS, SOURCE_STREAMS, arrow_schemas

__all__ = [
    "FLUSH_KEYS",
    "OUTPUT_FIELDS",
    "QUERIES",
    "SCHEMAS",
    "SOURCE_STREAMS",
    "GeneratorConfig",
    "arrow_schemas",
    "chunks",
    "flush",
    "generate",
    "kind_of",
    "real_rows",
    "sql",
    "stages",
]

FLUSH_AFTER_S = (3600, 7200)


def flush(cfg: GeneratorConfig, events: int) -> dict[str, pa.Table]:
    """Tuples that close every window of every stage after ``events`` events: per stream one
    an hour and one two hours after the last event. Flush person ``-k`` and auction ``-k``
    (seller ``-10 - k``, category -1, lasting 1 ms) join nothing real; flush bid ``-k`` bids
    on auction ``-k``, so that q4's join makes a closing time that moves its later stages."""
    last_ms = int(cfg.time_ms(np.array([max(events - 1, 0)]))[0])
    times = [(last_ms + s * 1000) * 1000 for s in FLUSH_AFTER_S]
    ids = [-(k + 1) for k in range(len(times))]
    columns: dict[str, dict[str, list[Any]]] = {
        "person": {"id": ids, "name": ["flush"] * 2, "email_address": [""] * 2,
                   "credit_card": [""] * 2, "city": [""] * 2, "state": ["--"] * 2,
                   "date_time": times, "extra": [""] * 2},
        "auction": {"id": ids, "item_name": [""] * 2, "description": [""] * 2,
                    "initial_bid": [1] * 2, "reserve": [1] * 2, "date_time": times,
                    "expires": [t + 1000 for t in times], "seller": [i - 10 for i in ids],
                    "category": [-1] * 2, "extra": [""] * 2},
        "bid": {"auction": ids, "bidder": ids, "price": [1] * 2, "date_time": times,
                "extra": [""] * 2},
    }  # fmt: skip
    out = {}
    for stream, schema in arrow_schemas().items():
        arrays = [
            pa.array(columns[stream][f.name], type=pa.int64()).view(f.type)
            if pa.types.is_timestamp(f.type)
            else pa.array(columns[stream][f.name], type=f.type)
            for f in schema
        ]
        out[stream] = pa.Table.from_arrays(arrays, schema=schema)
    return out


def real_rows(q: str, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` of query ``q``'s result without those the flush tuples made."""
    key = FLUSH_KEYS[q]
    return [dict(row) for row in rows if row[key] >= 0]
