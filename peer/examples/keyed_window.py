"""A keyed tumbling window and its plain-Python reference: the workload that moves.

A filter (``v >= at_least``) feeds a 10 s tumbling ``sum(v)`` and ``count()`` per key ``k``
over the event time ``t``. The move and recovery tests, the move benchmark and the spike demo
run it because its state (open windows per key) must survive a move or a restart exactly,
and :func:`keyed_window_sums` says, in plain Python, which windows must come out.

Its input tuples have three integer fields: ``k`` (the key), ``v`` (the value) and ``t``
(event time, seconds).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

__all__ = [
    "keyed_window_batches",
    "keyed_window_box",
    "keyed_window_query",
    "keyed_window_schema",
    "keyed_window_sums",
]


def keyed_window_schema(name: str = "tick") -> dict[str, Any]:
    """The input schema: ``k`` int, ``v`` long, ``t`` long (event time, seconds)."""
    fields = [("k", "int"), ("v", "long"), ("t", "long")]
    return {"name": name, "fields": [{"name": f, "type": t} for f, t in fields]}


def keyed_window_batches(
    seed: int, count: int, per_batch: int, *, keys: int, values: tuple[int, int]
) -> list[dict[str, list[int]]]:
    """``count`` column batches of ``per_batch`` tuples: keys below ``keys``, values in
    ``range(*values)``, event time rising by one second every 40 tuples (seeded)."""
    rng = random.Random(seed)
    out = []
    for b in range(count):
        ts = [(b * per_batch + i) // 40 for i in range(per_batch)]
        k = [rng.randrange(keys) for _ in ts]
        out.append({"k": k, "v": [rng.randrange(*values) for _ in ts], "t": ts})
    return out


def keyed_window_box(
    inp: str, out: str, *, node: str | None = None, name: str = "per_key"
) -> dict[str, Any]:
    """A 10 s tumbling sum(v) as ``s`` and count() as ``n`` per key ``k`` over ``t``."""
    return {
        "name": name,
        "type": "aggregate",
        **({"node": node} if node is not None else {}),
        "inputs": [inp],
        "outputs": [out],
        "params": {
            "aggregate-function.0": "sum(v)",
            "aggregate-function-output-name.0": "s",
            "aggregate-function.1": "count()",
            "aggregate-function-output-name.1": "n",
            "window-size": "10",
            "advance": "10",
            "order-on-field": "t",
            "group-by": "k",
        },
    }


def keyed_window_query(
    name: str,
    source: str,
    out: str,
    *,
    site: str | None = None,
    at_least: int = 0,
    kept: str | None = None,
) -> dict[str, Any]:
    """A filter (``v >= at_least``) then :func:`keyed_window_box`, both boxes placed on
    ``site`` if given: the workload of the move, recovery and spike tests and benchmarks."""
    middle = kept or f"{name}_kept"
    keep = {
        "name": "keep",
        "type": "filter",
        **({"node": site} if site is not None else {}),
        "inputs": [source],
        "outputs": [middle],
        "params": {"expression.0": f"v >= {at_least}"},
    }
    return {"name": name, "boxes": [keep, keyed_window_box(middle, out, node=site)]}


def keyed_window_sums(
    batches: list[dict[str, list[int]]], *, at_least: int = 0, scale: int = 1
) -> Counter[tuple[int, ...]]:
    """Plain Python for :func:`keyed_window_query` (with ``scale``: of ``v * scale``):
    (start, end, k, sum, count) of every window the largest ``t`` closes (the watermark is
    taken over all tuples, so the last batch must pass the filter)."""
    watermark = max(max(b["t"]) for b in batches)
    acc: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for b in batches:
        for k, v, t in zip(b["k"], b["v"], b["t"], strict=True):
            if v >= at_least:
                cell = acc[(t // 10 * 10, k)]
                cell[0] += v * scale
                cell[1] += 1
    return Counter(
        (s, s + 10, k, total, n) for (s, k), (total, n) in acc.items() if s + 10 <= watermark
    )
