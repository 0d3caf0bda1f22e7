"""What state of a query grows without bound: the sentence ``peer status`` shows per query.

A stream-stream join keeps each side's tuples for its buffer (``left-buffer-size``,
``right-buffer-size``: how long the other side may look back). A join that SQL writes without
a time bound (NEXMark q3's ``auction JOIN person ON seller = id``) is compiled with buffers of
ten years (:data:`UNBOUNDED_S`): it keeps every tuple of that side for
as long as the query runs. A join box of any form (SQL, XML, JSON) with a buffer that long is
named, with the query inputs it keeps (followed back through the boxes before the join, so
the sentence says ``auction`` rather than ``q3.filter0``). Pure: no Spark, no I/O.
"""

from __future__ import annotations

from peer.errors import QueryError
from peer.model.params import BoxParams
from peer.model.query import Box, Query

UNBOUNDED_S = 10 * 365 * 86400.0  # ten years: a join without a time bound keeps everything

__all__ = ["unbounded_state"]

_SIDES = (("left", 0), ("right", 1))


def unbounded_state(query: Query) -> tuple[str, ...]:
    """One sentence per join of ``query`` that keeps a side's tuples without a time bound,
    e.g. ``"join join2 keeps every auction and person (no time bound)"``; empty if none."""
    made_by = {stream: box for box in query.boxes for stream in box.outputs}
    found: list[str] = []
    for box in query.boxes:
        if box.type != "join" or len(box.inputs) != 2:
            continue
        kept: list[str] = []
        for side, i in _SIDES:
            # ``left-buffer-size`` is how long the join keeps a left tuple (how far back a
            # right tuple looks into the left side), and the other way round
            if _seconds(query, box, f"{side}-buffer-size") >= UNBOUNDED_S:
                for name in _sources(box.inputs[i], made_by):
                    if name not in kept:
                        kept.append(name)
        if kept:
            found.append(f"join {box.name} keeps every {' and '.join(kept)} (no time bound)")
    return tuple(found)


def _seconds(query: Query, box: Box, param: str) -> float:
    """The buffer ``param`` in seconds (a number or an interval); 0 if it cannot be read (a
    query is checked before it is stored, so only a hand-made one has such a buffer)."""
    value = dict(box.params).get(param)
    if value is None:
        return 0.0
    reader = BoxParams(query.name, box, tuple(dict(box.params)), ())
    try:
        return reader.duration(param, value, "timestamp")
    except QueryError:
        return 0.0


def _sources(stream: str, made_by: dict[str, Box]) -> list[str]:
    """The query inputs ``stream`` is made from, in order (itself if it is one)."""
    sources: list[str] = []
    pending = [stream]
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        box = made_by.get(name)
        if box is None:
            sources.append(name)
        else:
            pending.extend(box.inputs)
    return sources
