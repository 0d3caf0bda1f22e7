"""Unbounded state named per query (peer.model.sql.unbounded): NEXMark q3's join without a time
bound in its SQL form, one-sided bounds, box-form joins with their buffers as numbers or
intervals; and the sentence in a real LocalSite's status and in ``peer status``'s tables."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from peer.cli.render import print_status
from peer.examples.nexmark import stages
from peer.examples.nexmark.flink_sql import script
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.sql import compile_script, unbounded_state
from peer.site import LocalSite, SiteConfig

Q3 = "join join2 keeps every auction and person (no time bound)"
DDL = """\
CREATE STREAM a (k BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL, WATERMARK FOR t AS t);
CREATE STREAM b (k BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL, WATERMARK FOR t AS t);
"""


def only(text: str) -> Query:
    compiled = compile_script(text, name="q")
    assert len(compiled.queries) == 1
    return compiled.queries[0]


def test_nexmark_q3_in_sql_keeps_every_auction_and_person() -> None:
    assert unbounded_state(only(script("q3"))) == (Q3,)


def test_bounded_joins_and_joinless_queries_keep_nothing_forever() -> None:
    for q in ("q0", "q1", "q2", "q5", "q7", "q8"):
        compiled = compile_script(script(q), name=q)
        assert all(unbounded_state(query) == () for query in compiled.queries), q
    interval = only(
        DDL + "INSERT INTO o SELECT a.k, b.t AS bt FROM a JOIN b ON a.k = b.k "
        "AND a.t BETWEEN b.t - INTERVAL '5' SECOND AND b.t + INTERVAL '5' SECOND"
    )
    assert unbounded_state(interval) == ()
    # the box form of q3 bounds its join to 10 s both ways (docs/nexmark.md)
    (stage,) = stages("q3")
    boxes = parse_query(stage)
    assert [b.type for b in boxes.boxes].count("join") == 1
    assert unbounded_state(boxes) == ()


def test_a_one_sided_bound_names_the_side_kept_forever() -> None:
    # a.t >= b.t: a tuple of b may meet any later tuple of a, so every b is kept; a tuple of
    # a meets only earlier tuples of b, so a's tuples can go
    later = only(
        DDL + "INSERT INTO o SELECT a.k, b.t AS bt FROM a JOIN b ON a.k = b.k AND a.t >= b.t"
    )
    join = next(b for b in later.boxes if b.type == "join")
    assert unbounded_state(later) == (f"join {join.name} keeps every b (no time bound)",)


def test_box_form_buffers_as_seconds_or_intervals() -> None:
    def join(left: str, right: str) -> Query:
        return parse_query(
            {
                "name": "j",
                "boxes": [
                    {"name": "keep", "type": "filter", "inputs": ["people"],
                     "outputs": ["kept"], "params": {"expression.0": "id > 0"}},
                    {"name": "pair", "type": "join", "inputs": ["kept", "orders"],
                     "outputs": ["paired"], "params": {
                         "left-order-by": "VALUES", "left-order-on-field": "t",
                         "right-order-by": "VALUES", "right-order-on-field": "t",
                         "left-buffer-size": left, "right-buffer-size": right,
                         "predicate": "left.id = right.id"}},
                ],
            }
        )  # fmt: skip

    assert unbounded_state(join("10", "1 minute")) == ()
    assert unbounded_state(join("3650 days", "1")) == (
        "join pair keeps every people (no time bound)",
    )
    assert unbounded_state(join("3.1536e+08", "4000 days")) == (
        "join pair keeps every people and orders (no time bound)",
    )


def test_status_and_peer_status_name_the_unbounded_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    compiled = compile_script(script("q3"), name="q3")
    bounded = compile_script(script("q2"), name="q2")

    async def go() -> dict[str, Any]:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        try:
            for stream in compiled.streams:
                await site.create_schema(stream.schema.to_dict())
                await site.create_stream(stream.name, stream.schema.name)
            for query in (*compiled.queries, *bounded.queries):
                await site.create_query(query_to_dict(query))
            return dict((await site.status()).to_wire())
        finally:
            await site.close()

    status = asyncio.run(asyncio.wait_for(go(), 30))
    by_name = {q["name"]: q for q in status["queries"]}
    assert by_name["q3"]["unbounded_state"] == [Q3]
    assert "unbounded_state" not in by_name["q2"]
    print_status(status)
    printed = " ".join(capsys.readouterr().out.split())
    assert f"warning: query q3: unbounded state: {Q3}" in printed
    assert "query q2: unbounded" not in printed
