"""The query graph the dashboard draws: each query as its boxes and arrows, each box marked with
the peer that runs it and each arrow with its current rate (pure: no I/O).

Theory of operation
-------------------
Every peer's status lists the fragments it runs (``queries``), each with its boxes: name,
operator (``type``), the streams it reads and writes (:meth:`peer.site.local.LocalSite.status`).
The federation view (:meth:`peer.observe.observer.Observer.federation`) holds every live
peer's status and newest sample side by side; :func:`query_diagram` turns them into one graph
per query:

* a *box* for each box of each fragment, marked with the peer whose status lists the fragment
  (its node id and participant): the peer that runs it now, so a fragment that moved is drawn
  on its new peer at the next view, and one whose peer left is no longer drawn. A fragment
  two peers list (a move under way) is drawn where it runs, else where it was seen first.
  A fragment's query is its name up to ``#<n>`` (:mod:`peer.model.fragments` names them so).
* a *stream end* for each stream a query reads that none of its boxes makes (an input) and
  each stream its boxes make that none of them reads (a result).
* an *arrow* for each stream, from the box (or stream end) making it to each box (or stream
  end) reading it, carrying the stream's rate in tuples per second over the newest sample of
  each peer (:func:`peer.observe.samples.point`): the tuples pushed on it (``in_rate``, summed
  over the peers they entered through) plus the tuples fragments wrote on it (``stream_rate``,
  summed over the peers running them: the peer a fragment left writes none). A rate no peer
  measures is None, not zero: so is that of a stream between two boxes of one fragment, which
  Spark never writes out.

Each box and stream end gets a column (the longest path to it from the query's inputs) and a
row (its place in that column), so the page only draws.

The views come from other peers: anything malformed in them (a missing or mistyped field, a
negative or non-finite rate, boxes that feed each other in a loop) is skipped or drawn as it
stands, never raised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

__all__ = ["Arrow", "Diagram", "DiagramBox", "QueryGraph", "StreamEnd", "query_diagram"]

SHORT_ID = 12  # hex digits of a node id shown on a box (the dashboard's other tables agree)
_FRAGMENT = re.compile(r"(.+)#\d+")


class DiagramBox(TypedDict):
    id: str  # "box:<box name>", unique in its query
    box: str
    operator: str  # the box type: filter, map, union, aggregate, join, bsort, ...
    fragment: str
    node_id: str  # the peer running it
    peer: str  # its node id, short
    participant: str | None
    running: bool
    column: int
    row: int


class StreamEnd(TypedDict):
    id: str  # "stream:<stream name>", unique in its query
    stream: str
    role: Literal["input", "result"]
    rate: float | None
    column: int
    row: int


class Arrow(TypedDict):
    source: str  # a box or stream end id
    target: str
    stream: str
    rate: float | None  # tuples per second; None: not measured


class QueryGraph(TypedDict):
    query: str
    boxes: list[DiagramBox]
    streams: list[StreamEnd]
    arrows: list[Arrow]
    columns: int
    rows: int  # of the fullest column


class Diagram(TypedDict):
    queries: list[QueryGraph]


@dataclass(frozen=True)
class _Box:
    name: str
    operator: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class _Fragment:
    """One fragment as one peer lists it."""

    name: str
    query: str
    boxes: tuple[_Box, ...]
    node_id: str
    participant: str | None
    running: bool


# -- reading the views (anything another peer sent) -------------------------------------------
def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _rate(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    rate = float(value)
    return rate if math.isfinite(rate) and rate >= 0 else None


def _names(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list | tuple) or not all(_text(v) for v in value):
        return None
    return tuple(value)


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _newest(view: Mapping[str, Any]) -> Mapping[str, Any]:
    samples = view.get("samples")
    return _map(samples[-1]) if isinstance(samples, list) and samples else {}


def _box(entry: object) -> _Box | None:
    entry = _map(entry)
    name, operator = _text(entry.get("name")), _text(entry.get("type"))
    inputs, outputs = _names(entry.get("inputs")), _names(entry.get("outputs"))
    if name is None or operator is None or inputs is None or outputs is None:
        return None
    return _Box(name, operator, inputs, outputs)


def _fragments(view: Mapping[str, Any]) -> Iterator[_Fragment]:
    node_id = _text(view.get("node_id"))
    status = _map(view.get("status"))
    queries = status.get("queries")
    if node_id is None or not isinstance(queries, list):
        return
    participant = _text(_map(status.get("overlay")).get("participant"))
    for entry in queries:
        entry = _map(entry)
        name, listed = _text(entry.get("name")), entry.get("boxes")
        if name is None or not isinstance(listed, list):
            continue
        boxes = tuple(b for b in map(_box, listed) if b is not None)
        if not boxes:
            continue
        whole = _FRAGMENT.fullmatch(name)
        yield _Fragment(
            name,
            whole.group(1) if whole else name,
            boxes,
            node_id,
            participant,
            entry.get("status") == "RUNNING" and entry.get("active") is True,
        )


def _placed(views: Sequence[object]) -> list[_Fragment]:
    """Each fragment once: where it runs, else on the first peer listing it."""
    chosen: dict[str, _Fragment] = {}
    for view in views:
        for fragment in _fragments(_map(view)):
            seen = chosen.get(fragment.name)
            if seen is None or (fragment.running and not seen.running):
                chosen[fragment.name] = fragment
    return list(chosen.values())


def _stream_rates(views: Sequence[object]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for view in views:
        newest = _newest(_map(view))
        for key in ("in_rate", "stream_rate"):
            for stream, value in _map(newest.get(key)).items():
                rate = _rate(value)
                if isinstance(stream, str) and rate is not None:
                    rates[stream] = rates.get(stream, 0.0) + rate
    return {s: round(r, 3) for s, r in rates.items()}


# -- one query's graph --------------------------------------------------------------------------
def _columns(nodes: list[str], arrows: list[Arrow]) -> dict[str, int]:
    """The longest path to each node from a node nothing feeds (Kahn's order); nodes on a
    loop (only hostile input has one) go one column past the others."""
    feeds: dict[str, list[str]] = {n: [] for n in nodes}
    waiting = dict.fromkeys(nodes, 0)
    for arrow in arrows:
        feeds[arrow["source"]].append(arrow["target"])
        waiting[arrow["target"]] += 1
    column = dict.fromkeys(nodes, 0)
    ready = [n for n in nodes if waiting[n] == 0]
    done: set[str] = set()
    while ready:
        node = ready.pop()
        done.add(node)
        for target in feeds[node]:
            column[target] = max(column[target], column[node] + 1)
            waiting[target] -= 1
            if waiting[target] == 0:
                ready.append(target)
    last = max((column[n] for n in done), default=-1)
    return {n: column[n] if n in done else last + 1 for n in nodes}


def _graph(query: str, fragments: list[_Fragment], rates: Mapping[str, float]) -> QueryGraph:
    boxes: dict[str, tuple[_Box, _Fragment]] = {}
    for fragment in fragments:
        for box in fragment.boxes:
            boxes.setdefault(f"box:{box.name}", (box, fragment))
    producer: dict[str, str] = {}
    read: set[str] = set()
    for box_id, (box, _) in boxes.items():
        read.update(box.inputs)
        for stream in box.outputs:
            producer.setdefault(stream, box_id)
    ends: dict[str, Literal["input", "result"]] = {}
    arrows: dict[tuple[str, str, str], Arrow] = {}

    def arrow(source: str, target: str, stream: str) -> None:
        arrows.setdefault(
            (source, target, stream), Arrow(source=source, target=target, stream=stream, rate=None)
        )

    for box_id, (box, _) in boxes.items():
        for stream in box.inputs:
            source = producer.get(stream)
            if source is None:
                source = f"stream:{stream}"
                ends.setdefault(source, "input")
            arrow(source, box_id, stream)
        for stream in box.outputs:
            if stream not in read and producer[stream] == box_id:
                ends.setdefault(f"stream:{stream}", "result")
                arrow(box_id, f"stream:{stream}", stream)
    drawn = list(arrows.values())
    for a in drawn:
        a["rate"] = rates.get(a["stream"])
    columns = _columns([*ends, *boxes], drawn)
    rows: dict[int, int] = {}

    def row(node: str) -> int:
        at = rows.get(columns[node], 0)
        rows[columns[node]] = at + 1
        return at

    end_list = [
        StreamEnd(
            id=end,
            stream=end.removeprefix("stream:"),
            role=role,
            rate=rates.get(end.removeprefix("stream:")),
            column=columns[end],
            row=row(end),
        )
        for end, role in ends.items()
    ]
    box_list = [
        DiagramBox(
            id=box_id,
            box=box.name,
            operator=box.operator,
            fragment=fragment.name,
            node_id=fragment.node_id,
            peer=fragment.node_id[:SHORT_ID],
            participant=fragment.participant,
            running=fragment.running,
            column=columns[box_id],
            row=row(box_id),
        )
        for box_id, (box, fragment) in boxes.items()
    ]
    return QueryGraph(
        query=query,
        boxes=box_list,
        streams=end_list,
        arrows=drawn,
        columns=max(columns.values(), default=-1) + 1,
        rows=max(rows.values(), default=0),
    )


def query_diagram(views: Sequence[object]) -> Diagram:
    """Every query the peers of ``views`` run, as boxes and arrows (see the module notes).
    ``views`` are :meth:`~peer.observe.observer.Observer.view` maps, this peer's first."""
    if not isinstance(views, list | tuple):
        return Diagram(queries=[])
    fragments = _placed(views)
    rates = _stream_rates(views)
    by_query: dict[str, list[_Fragment]] = {}
    for fragment in fragments:
        by_query.setdefault(fragment.query, []).append(fragment)
    return Diagram(
        queries=[
            _graph(q, sorted(by_query[q], key=lambda f: f.name), rates) for q in sorted(by_query)
        ]
    )
