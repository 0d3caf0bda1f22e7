"""The NEXMark streams' schemas: ``person``, ``auction`` and ``bid``, as Flink's suite has
them (snake-case names; times are timestamps, ids and prices longs, prices in cents)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["AUCTION", "BID", "PERSON", "SCHEMAS", "SOURCE_STREAMS", "arrow_schemas"]

PERSON: dict[str, Any] = {
    "name": "nexmark_person",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email_address", "type": "string"},
        {"name": "credit_card", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "state", "type": "string"},
        {"name": "date_time", "type": "timestamp"},
        {"name": "extra", "type": "string"},
    ],
}
AUCTION: dict[str, Any] = {
    "name": "nexmark_auction",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item_name", "type": "string"},
        {"name": "description", "type": "string"},
        {"name": "initial_bid", "type": "long"},
        {"name": "reserve", "type": "long"},
        {"name": "date_time", "type": "timestamp"},
        {"name": "expires", "type": "timestamp"},
        {"name": "seller", "type": "long"},
        {"name": "category", "type": "long"},
        {"name": "extra", "type": "string"},
    ],
}
BID: dict[str, Any] = {
    "name": "nexmark_bid",
    "fields": [
        {"name": "auction", "type": "long"},
        {"name": "bidder", "type": "long"},
        {"name": "price", "type": "long"},
        {"name": "date_time", "type": "timestamp"},
        {"name": "extra", "type": "string"},
    ],
}
SCHEMAS: list[dict[str, Any]] = [PERSON, AUCTION, BID]
SOURCE_STREAMS: dict[str, str] = {"person": "nexmark_person", "auction": "nexmark_auction",
                                  "bid": "nexmark_bid"}  # fmt: skip


def arrow_schemas() -> dict[str, pa.Schema]:
    """The Arrow schema of each source stream, as a peer's spool stores it."""
    from peer.model.schema import parse_schema, to_arrow_schema

    return {
        stream: to_arrow_schema(parse_schema(next(s for s in SCHEMAS if s["name"] == schema)))
        for stream, schema in SOURCE_STREAMS.items()
    }
