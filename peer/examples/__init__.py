"""Example workloads: schemas, a query, a seeded generator and a plain-Python reference each.

Workloads ship here as library code, so that tests, demos and benchmarks on
one peer or on many run the same queries and check them the same way:

- :mod:`peer.examples.traffic`: the traffic query of the Medusa paper's figure 1 (per road
  segment and minute: average speed and car count; tolls from both; tolls joined with moving
  cars; tow trucks joined with stopped cars);
- :mod:`peer.examples.intrusion`: the network-intrusion query of Medusa's SIGMOD demo
  (connection attempts, distinct ports, hosts and protocols per source address and window;
  port scans, host sweeps and floods labelled by a map and flagged by a filter);
- :mod:`peer.examples.nexmark`: the NEXMark benchmark's generator and queries q0-q5, q7, q8,
  with each query's SQL for DuckDB as its reference (a package with an API of its own: see
  its docstring and docs/nexmark.md).

Every example module exposes the same API:

``SCHEMAS``
    schema definitions (JSON form) to create first;
``SOURCE_STREAMS``
    ``{input stream: schema name}``, the streams to create and push to;
``OUTPUTS`` / ``INTERMEDIATE``
    the query's result streams (streams it produces and does not read itself) / the streams
    it produces and reads;
``query(name, nodes=None)``
    the query as a JSON mapping with Aurora/Borealis parameter names; ``nodes`` maps a box
    name to the ``"node"`` (participant name or peer id) that box should run on;
``BOX_GROUPS``
    a suggested split of the boxes over three participants;
``STAGES`` / ``stages(name, nodes=None)``
    the query cut into queries that each run as one fused Spark streaming query on one peer
    (see the traffic module: Spark cannot run a join downstream of a windowed aggregate inside
    a single streaming query);
``generate(seed, ...)``
    ``{input stream: rows}``, every stream in nondecreasing event time and ending, by default,
    with a flush tuple far in the future that moves the watermark past every real window;
``reference(inputs)``
    ``{output stream: rows}``, the exact expected output multiset, computed in plain Python
    from the semantics of DESIGN.md section 5 (``reference_streams`` adds the intermediate
    streams);
``compare(got, expected, float_places=6)``
    the differences between two row multisets, as messages (empty when equal).

The references assume what the generators guarantee: each input stream is pushed in its row
order, so that no tuple arrives behind a watermark and none is dropped as late.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

Row = dict[str, Any]
Rows = list[Row]

EXAMPLES = ("traffic", "intrusion")

__all__ = [
    "EXAMPLES",
    "Row",
    "Rows",
    "band_join",
    "columns",
    "compare",
    "split_query",
    "tumbling_windows",
    "with_nodes",
]


def columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows as the columnar batch ``Client.push`` takes (``{"columns": columns(rows)}``)."""
    if not rows:
        return {}
    return {name: [row[name] for row in rows] for name in rows[0]}


# -- checking -----------------------------------------------------------------------------------


def _normal(value: Any, places: int) -> Any:
    if isinstance(value, float):
        rounded = round(value, places)
        return 0.0 if rounded == 0 else rounded  # -0.0 and 0.0 print alike
    return value


def _key(row: Mapping[str, Any], places: int) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), _normal(v, places)) for k, v in row.items()))


def _show(key: tuple[tuple[str, Any], ...], order: Sequence[str]) -> str:
    values = dict(key)
    names = [n for n in order if n in values] + sorted(n for n in values if n not in order)
    return "{" + ", ".join(f"{n}: {values[n]!r}" for n in names) + "}"


def compare(
    got_rows: Iterable[Mapping[str, Any]],
    expected_rows: Iterable[Mapping[str, Any]],
    float_places: int = 6,
    *,
    limit: int = 10,
) -> list[str]:
    """How ``got_rows`` differs from ``expected_rows`` as multisets of rows (floats rounded
    to ``float_places``): one message per missing or unexpected row (at most ``limit`` of
    each, then a count), and one for a field-name mismatch. Empty when they are equal."""
    got_list, want_list = list(got_rows), list(expected_rows)
    problems: list[str] = []
    got_fields = sorted({str(k) for row in got_list for k in row})
    want_fields = sorted({str(k) for row in want_list for k in row})
    if got_list and want_list and got_fields != want_fields:
        problems.append(f"fields differ: got {got_fields}, expected {want_fields}")
    order = [str(k) for k in (want_list[0] if want_list else got_list[0] if got_list else {})]
    got = Counter(_key(row, float_places) for row in got_list)
    want = Counter(_key(row, float_places) for row in want_list)
    if len(got_list) != len(want_list):
        problems.append(f"got {len(got_list)} rows, expected {len(want_list)}")
    for what, extra in (("missing", want - got), ("unexpected", got - want)):
        items = sorted(extra.items(), key=lambda kv: repr(kv[0]))
        for key, count in items[:limit]:
            times = f" (x{count})" if count > 1 else ""
            problems.append(f"{what}{times}: {_show(key, order)}")
        rest = sum(count for _, count in items[limit:])
        if rest:
            problems.append(f"... and {rest} more {what} rows")
    return problems


# -- building queries ---------------------------------------------------------------------------


def with_nodes(
    boxes: Sequence[Mapping[str, Any]], nodes: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    """Copies of ``boxes``; those named in ``nodes`` get its value as their ``"node"``."""
    names = {str(box["name"]) for box in boxes}
    unknown = sorted(set(nodes or {}) - names)
    if unknown:
        raise ValueError(f"nodes names unknown boxes {unknown} (boxes: {sorted(names)})")
    out = []
    for box in boxes:
        copy = {k: (dict(v) if isinstance(v, dict) else v) for k, v in box.items()}
        copy["inputs"], copy["outputs"] = list(box["inputs"]), list(box["outputs"])
        if nodes and box["name"] in nodes:
            copy["node"] = nodes[box["name"]]
        out.append(copy)
    return out


def split_query(
    query: Mapping[str, Any], stages: Sequence[tuple[str, Sequence[str]]]
) -> list[dict[str, Any]]:
    """``query`` cut into one query per ``(suffix, box names)`` stage, named
    ``<name>_<suffix>`` (or ``<name>`` for an empty suffix). Every box must be in exactly one
    stage; streams that cross stages become outputs of one query and inputs of a later one."""
    boxes = {str(box["name"]): box for box in query["boxes"]}
    placed = [name for _, names in stages for name in names]
    if sorted(placed) != sorted(boxes):
        raise ValueError(f"stages must hold every box once: {placed} vs {sorted(boxes)}")
    out = []
    for suffix, names in stages:
        name = f"{query['name']}_{suffix}" if suffix else str(query["name"])
        out.append({"name": name, "boxes": [boxes[n] for n in names]})
    return out


# -- reference building blocks ------------------------------------------------------------------


def tumbling_windows(
    rows: Iterable[Mapping[str, Any]],
    *,
    order: str,
    size: int,
    group_by: Sequence[str],
    slack: int = 0,
) -> dict[tuple[Any, ...], Rows]:
    """Rows per ``(window_start, *group values)`` for the windows an aggregate emits: windows
    ``[k*size, (k+1)*size)`` whose end the final watermark (max order value - slack) has
    reached. Rows keep their order within a window."""
    groups: dict[tuple[Any, ...], Rows] = defaultdict(list)
    watermark: Any = None
    for row in rows:
        t = row[order]
        watermark = t - slack if watermark is None else max(watermark, t - slack)
        start = t // size * size
        groups[(start, *(row[g] for g in group_by))].append(dict(row))
    return {key: members for key, members in groups.items() if key[0] + size <= watermark}


def band_join(
    left: Iterable[Mapping[str, Any]],
    right: Iterable[Mapping[str, Any]],
    *,
    left_key: Callable[[Mapping[str, Any]], Hashable],
    right_key: Callable[[Mapping[str, Any]], Hashable],
    left_order: str,
    right_order: str,
    left_buffer: int,
    right_buffer: int,
    where: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None,
) -> list[tuple[Row, Row]]:
    """Pairs ``(l, r)`` with equal keys, ``where(l, r)`` if given, and order values that
    differ by less than the other side's buffer (DESIGN.md section 5):
    ``l.order - r.order < right_buffer`` and ``r.order - l.order < left_buffer``.
    Order values must be integers (the bounds are then exact)."""
    by_key: dict[Hashable, list[tuple[int, int, Row]]] = defaultdict(list)
    for i, r in enumerate(right):
        by_key[right_key(r)].append((int(r[right_order]), i, dict(r)))
    for entries in by_key.values():
        entries.sort(key=lambda e: (e[0], e[1]))
    pairs: list[tuple[Row, Row]] = []
    for l_row in left:
        entries = by_key.get(left_key(l_row), [])
        t = int(l_row[left_order])
        # t - rt < right_buffer  <=>  rt > t - right_buffer;  rt - t < left_buffer.
        lo = bisect.bisect_right(entries, t - right_buffer, key=lambda e: e[0])
        hi = bisect.bisect_left(entries, t + left_buffer, key=lambda e: e[0])
        for _, _, r_row in entries[lo:hi]:
            if where is None or where(l_row, r_row):
                pairs.append((dict(l_row), r_row))
    return pairs
