"""Tolls over a partition: a union of two participants' streams into a windowed aggregate.

The workload of the Delay, Process and Correct tests, benchmark and demo (issue 16): acme's
and globex's car reports (``k`` the road segment, ``t`` event time in seconds, ``v`` a value
that says whose report it is) go into one union, then a 10 s tumbling ``sum(v)`` as
``total`` and ``count()`` as ``n`` per segment. With an availability bound, the query goes on
without a participant that is cut off and marks its windows tentative; :func:`reference`
says in plain Python which windows must come out once the partition has healed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

__all__ = [
    "SIZE",
    "partition_query",
    "partition_reference",
    "partition_schema",
    "reports",
    "second_box",
    "second_reference",
    "window_key",
]

SIZE = 10  # seconds of event time per window


def partition_schema(name: str = "report") -> dict[str, Any]:
    """``k`` int (segment), ``t`` long (event time, s), ``v`` long."""
    fields = [("k", "int"), ("t", "long"), ("v", "long")]
    return {"name": name, "fields": [{"name": f, "type": t} for f, t in fields]}


def partition_query(
    name: str, mine: str, theirs: str, *, bound_s: float | None, node: str | None = None
) -> dict[str, Any]:
    """Union of ``mine`` and ``theirs``, then the tumbling window, as ``<name>_out``; on
    ``node`` when given (a participant or peer), with ``bound_s`` as its availability bound."""
    where = {"node": node} if node is not None else {}
    query: dict[str, Any] = {
        "name": name,
        "boxes": [
            {
                "name": "both",
                "type": "union",
                **where,
                "inputs": [mine, theirs],
                "outputs": [f"{name}_all"],
            },
            {
                "name": "tolls",
                "type": "aggregate",
                **where,
                "inputs": [f"{name}_all"],
                "outputs": [f"{name}_out"],
                "params": {
                    "aggregate-function.0": "sum(v)",
                    "aggregate-function-output-name.0": "total",
                    "aggregate-function.1": "count()",
                    "aggregate-function-output-name.1": "n",
                    "window-size-by": "VALUES",
                    "window-size": str(SIZE),
                    "advance": str(SIZE),
                    "order-on-field": "t",
                    "group-by": "k",
                },
            },
        ],
    }
    if bound_s is not None:
        query["availability_bound"] = bound_s
    return query


def reports(first: int, last: int, origin: int, *, segments: int = 3) -> list[dict[str, Any]]:
    """One report per second of event time in ``[first, last)``; ``origin`` tells whose."""
    return [{"k": t % segments, "t": t, "v": origin * 10_000 + t} for t in range(first, last)]


def partition_reference(rows: list[dict[str, Any]], watermark: int) -> Counter[tuple[int, ...]]:
    """The windows (start, end, k, total, n) whose end the watermark has reached."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in rows:
        start = r["t"] // SIZE * SIZE
        if start + SIZE <= watermark:
            groups[(start, r["k"])].append(r["v"])
    return Counter((s, s + SIZE, k, sum(vs), len(vs)) for (s, k), vs in groups.items())


def window_key(row: dict[str, Any]) -> tuple[int, ...]:
    """A result row as :func:`partition_reference` counts it."""
    return (row["window_start"], row["window_end"], row["k"], row["total"], row["n"])


def second_box(source: str, out: str, *, node: str | None = None) -> dict[str, Any]:
    """A box over :func:`partition_query`'s windows: 20 s of them per segment (``sum(total)``
    as ``total``, ``count()`` as ``n``), for chains of fragments."""
    return {
        "name": "per_20s",
        "type": "aggregate",
        **({"node": node} if node is not None else {}),
        "inputs": [source],
        "outputs": [out],
        "params": {
            "aggregate-function.0": "sum(total)",
            "aggregate-function-output-name.0": "total",
            "aggregate-function.1": "count()",
            "aggregate-function-output-name.1": "n",
            "window-size-by": "VALUES",
            "window-size": str(2 * SIZE),
            "advance": str(2 * SIZE),
            "order-on-field": "window_start",
            "group-by": "k",
        },
    }


def second_reference(windows: Counter[tuple[int, ...]]) -> Counter[tuple[int, ...]]:
    """What :func:`second_box` emits over ``windows`` (its watermark: the newest start)."""
    size = 2 * SIZE
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for (start, _end, k, total, _n), count in windows.items():
        groups[(start // size * size, k)].extend([total] * count)
    top = max((w[0] for w in windows), default=0)
    return Counter(
        (s, s + size, k, sum(ts), len(ts)) for (s, k), ts in groups.items() if s + size <= top
    )
