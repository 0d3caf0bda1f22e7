"""Queries: loop-free graphs of boxes over named streams (Aurora boxes and arrows).

A query arrives in one of three spellings that all yield equal :class:`Query` objects:

- Medusa XML: ``<query name><box name type [node]><input port stream/>
  <output port stream/><param name value/></box></query>`` (ports order the arrows);
- Borealis XML: the same with ``<in stream/>``, ``<out stream/>`` and ``<parameter name
  value/>``, optionally inside a ``<borealis>`` or ``<network>`` element holding one query
  (its other children, such as schema and stream declarations, are ignored here; a whole
  document is read by :mod:`peer.model.borealis`);
- JSON text or a mapping: ``{"name", "boxes": [{"name", "type", "inputs", "outputs",
  "params": {...}, "node"?}], "availability_bound"?, "standby"?}``.

A query may state an *availability bound* (Borealis' Delay, Process and Correct): the most
seconds a new input tuple's effect may be delayed at an output by a missing input, after
which the query goes on with the inputs it has and marks its results tentative
(``"availability_bound": SECONDS`` in JSON, a query-level ``<parameter
name="availability-bound" value="SECONDS"/>`` in XML). Without one, a query waits for every
input and its results stay exact.

A query may ask for warm standbys of its stateful fragments (process pairs,
:mod:`peer.replication.standby`): ``"standby": true`` in JSON, a query-level ``<parameter
name="standby" value="1"/>`` in XML (``0``/``1``/``false``/``true``). Not stated (None), the
coordinating peer's default holds (``peer join --standby``).

Parsing checks the structure only: names, box types and their number of arrows, unique box
names, one producer per stream, no cycle. Parameters are kept as text, sorted by name, with
the Medusa appendix's ``nexpression.N`` spelling read as ``expression.N``; their meaning is
checked against stream schemas by :mod:`peer.model.plan`.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from peer.errors import QueryError
from peer.model.limits import DEFAULT_LIMITS, ContentLimits, definition_size
from peer.model.schema import check_name, parse_json, parse_xml, source_text

# random_drop and window_drop are Borealis' load-shedding boxes (pass-through at rate 0).
BOX_TYPES = ("filter", "map", "union", "aggregate", "join", "bsort", "random_drop", "window_drop")
MAX_BOXES = 1000

# (min inputs, max inputs, min outputs, max outputs); None means unbounded.
_ARITY: dict[str, tuple[int, int | None, int, int | None]] = {
    "filter": (1, 1, 1, None),
    "map": (1, 1, 1, 1),
    "union": (1, None, 1, 1),
    "aggregate": (1, 1, 1, 1),
    "join": (2, 2, 1, 1),
    "bsort": (1, 1, 1, 1),
    "random_drop": (1, 1, 1, 1),
    "window_drop": (1, 1, 1, 1),
}
_PARAM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Box:
    name: str
    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[tuple[str, str], ...]
    node: str | None = None

    def param(self, name: str, default: str | None = None) -> str | None:
        for key, value in self.params:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class Query:
    name: str
    boxes: tuple[Box, ...]
    # seconds a missing input may delay results before they go on, tentative (None: wait)
    availability_bound_s: float | None = None
    # warm standbys for its stateful fragments (None: as the coordinating peer decides)
    standby: bool | None = None


BOUND_PARAM = "availability-bound"
STANDBY_PARAM = "standby"
QUERY_PARAMS = (BOUND_PARAM, STANDBY_PARAM)
MAX_BOUND_S = 86_400.0
_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def check_standby(qname: str, value: object) -> bool | None:
    """Whether a query asks for standbys, as given (JSON bool or XML text); None when not
    given."""
    if value is None or isinstance(value, bool):
        return value
    flag = _FLAGS.get(value.strip().lower()) if isinstance(value, str) else None
    if flag is None:
        raise QueryError(
            f"query {qname}: standby must be true or false (XML: 1 or 0), got {value!r:.40}",
            query=qname,
            parameter="standby",
        )
    return flag


def check_bound(qname: str, value: object) -> float | None:
    """An availability bound as given (JSON number or XML text): seconds, > 0 and at most a
    day; None when not given."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = repr(value)
    try:
        seconds = float(value) if isinstance(value, int | float | str) else math.nan
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_BOUND_S):  # NaN fails too
        raise QueryError(
            f"query {qname}: availability bound must be a number of seconds above 0 and at "
            f"most {MAX_BOUND_S:.0f}, got {value!r}",
            query=qname,
            parameter="availability_bound",
        )
    return seconds


def parse_query(
    source: str | bytes | Mapping[str, Any], *, limits: ContentLimits = DEFAULT_LIMITS
) -> Query:
    """Parse a query from Medusa or Borealis XML, JSON text or a mapping, within ``limits``
    (its size in any form, boxes, arrows per box, parameter text)."""
    if isinstance(source, Mapping):
        size = definition_size(source, limits.max_query_bytes)
        if size > limits.max_query_bytes:
            raise _over(
                f"query definition is larger than {limits.max_query_bytes} bytes (as JSON text)",
                "max_query_bytes",
                limits.max_query_bytes,
            )
        query = _query_from_mapping(source, limits.max_boxes)
    else:
        text = source_text(source, QueryError, "query")
        if len(text) > limits.max_query_bytes or (
            len(text.encode("utf-8", "surrogatepass")) > limits.max_query_bytes
        ):
            raise _over(
                f"query definition is larger than {limits.max_query_bytes} bytes",
                "max_query_bytes",
                limits.max_query_bytes,
            )
        if text.lstrip().startswith("<"):
            query = _query_from_xml(parse_xml(text, QueryError, "query"), limits.max_boxes)
        else:
            query = _query_from_mapping(parse_json(text, QueryError, "query"), limits.max_boxes)
    check_budget(query, limits)
    return query


def check_budget(query: Query, limits: ContentLimits) -> None:
    """Refuse a query over ``limits`` (boxes, arrows per box, parameter text), naming it."""
    where = f"query {query.name}"
    if len(query.boxes) > limits.max_boxes:
        raise _over(
            f"{where}: has more than {limits.max_boxes} boxes",
            "max_boxes",
            limits.max_boxes,
            query=query.name,
        )
    text = 0
    for box in query.boxes:
        for what, arrows in (("inputs", box.inputs), ("outputs", box.outputs)):
            if len(arrows) > limits.max_arrows_per_box:
                raise _over(
                    f"{where}, box {box.name}: has {len(arrows)} {what}, more than "
                    f"{limits.max_arrows_per_box}",
                    "max_arrows_per_box",
                    limits.max_arrows_per_box,
                    query=query.name,
                    box=box.name,
                )
        text += sum(len(value.encode("utf-8", "surrogatepass")) for _, value in box.params)
        if text > limits.max_expression_bytes:
            raise _over(
                f"{where}: its box parameters (expressions, predicates, ...) hold more than "
                f"{limits.max_expression_bytes} bytes of text (up to box {box.name})",
                "max_expression_bytes",
                limits.max_expression_bytes,
                query=query.name,
                box=box.name,
            )


def _over(message: str, limit: str, value: int, **details: Any) -> QueryError:
    return QueryError(message, limit=limit, **{limit: value}, **details)


def query_to_dict(query: Query) -> dict[str, Any]:
    boxes = []
    for box in query.boxes:
        d: dict[str, Any] = {
            "name": box.name,
            "type": box.type,
            "inputs": list(box.inputs),
            "outputs": list(box.outputs),
            "params": dict(box.params),
        }
        if box.node is not None:
            d["node"] = box.node
        boxes.append(d)
    out: dict[str, Any] = {"name": query.name, "boxes": boxes}
    if query.availability_bound_s is not None:
        out["availability_bound"] = query.availability_bound_s
    if query.standby is not None:
        out["standby"] = query.standby
    return out


def make_query(
    name: object,
    boxes: list[Box],
    availability_bound_s: float | None = None,
    standby: bool | None = None,
) -> Query:
    """Check a query's structure and return it."""
    qname = check_name(name, "query", QueryError)
    where = f"query {qname}"
    if not boxes:
        raise QueryError(f"{where}: has no boxes", query=qname)
    if len(boxes) > MAX_BOXES:
        raise QueryError(f"{where}: has more than {MAX_BOXES} boxes", query=qname)
    producers: dict[str, str] = {}
    seen: set[str] = set()
    for box in boxes:
        if box.name in seen:
            raise QueryError(f"{where}: two boxes are named {box.name}", query=qname, box=box.name)
        seen.add(box.name)
        _check_arity(where, box)
        for stream in box.outputs:
            other = producers.get(stream)
            if other is not None:
                raise QueryError(
                    f"{where}: stream {stream} is produced by both box {other} and box {box.name}",
                    query=qname,
                    box=box.name,
                    stream=stream,
                )
            producers[stream] = box.name
    query = Query(qname, tuple(boxes), availability_bound_s, standby)
    topological_order(query)
    return query


def _check_arity(where: str, box: Box) -> None:
    if box.type not in _ARITY:
        raise QueryError(
            f"{where}, box {box.name}: unknown box type {box.type!r} "
            f"(types: {', '.join(BOX_TYPES)})",
            box=box.name,
        )
    low_in, high_in, low_out, high_out = _ARITY[box.type]
    for what, count, low, high in (
        ("inputs", len(box.inputs), low_in, high_in),
        ("outputs", len(box.outputs), low_out, high_out),
    ):
        if count < low or (high is not None and count > high):
            wanted = (
                f"{low}" if low == high else f"at least {low}" if high is None else f"{low}-{high}"
            )
            raise QueryError(
                f"{where}, box {box.name}: a {box.type} box takes {wanted} {what}, got {count}",
                box=box.name,
            )


def topological_order(query: Query) -> tuple[Box, ...]:
    """The boxes, each after the boxes feeding it (declaration order among equals): round by
    round, every box whose feeders were all placed in earlier rounds (Kahn's algorithm, no
    recursion, linear in boxes and arrows)."""
    producer = {stream: box.name for box in query.boxes for stream in box.outputs}
    feeds = {
        box.name: sorted({producer[s] for s in box.inputs if s in producer}) for box in query.boxes
    }
    fed: dict[str, list[str]] = {box.name: [] for box in query.boxes}
    for name, feeders in feeds.items():
        for feeder in feeders:
            fed[feeder].append(name)
    index = {box.name: i for i, box in enumerate(query.boxes)}
    waiting = {name: len(feeders) for name, feeders in feeds.items()}
    done: list[Box] = []
    ready = [box for box in query.boxes if not waiting[box.name]]
    while ready:
        done.extend(ready)
        unblocked = []
        for box in ready:
            for name in fed[box.name]:
                waiting[name] -= 1
                if not waiting[name]:
                    unblocked.append(name)
        ready = [query.boxes[i] for i in sorted(index[name] for name in unblocked)]
    if len(done) < len(query.boxes):
        placed = {box.name for box in done}
        pending = [box for box in query.boxes if box.name not in placed]
        raise QueryError(
            f"query {query.name}: boxes form a cycle: {_cycle(feeds, pending)}",
            query=query.name,
        )
    return tuple(done)


def _cycle(feeds: dict[str, list[str]], pending: list[Box]) -> str:
    # Every unplaced box waits on an unplaced box, so walking upstream must revisit one.
    unplaced = {b.name for b in pending}
    path = [pending[0].name]
    while True:
        nxt = next(f for f in feeds[path[-1]] if f in unplaced)
        if nxt in path:
            loop = path[path.index(nxt) :]
            loop.reverse()
            return " -> ".join([*loop, loop[0]])
        path.append(nxt)


# -- building boxes -----------------------------------------------------------------------------


def _make_box(
    query: str,
    name: object,
    type_: object,
    inputs: list[object],
    outputs: list[object],
    params: list[tuple[object, object]],
    node: object,
) -> Box:
    where = f"query {query}, "
    bname = check_name(name, "box", QueryError, prefix=where)
    where = f"query {query}, box {bname}: "
    if not isinstance(type_, str) or type_.strip().lower() not in BOX_TYPES:
        raise QueryError(
            f"{where}unknown box type {type_!r} (types: {', '.join(BOX_TYPES)})",
            query=query,
            box=bname,
        )
    streams_in = tuple(check_name(s, "stream", QueryError, prefix=where) for s in inputs)
    streams_out = tuple(check_name(s, "stream", QueryError, prefix=where) for s in outputs)
    if len(set(streams_out)) != len(streams_out):
        raise QueryError(f"{where}names the same output stream twice", query=query, box=bname)
    checked: dict[str, str] = {}
    for key, value in params:
        pname = _param_name(where, key)
        if pname in checked:
            raise QueryError(f"{where}parameter {pname} is given twice", query=query, box=bname)
        checked[pname] = _param_value(where, pname, value)
    return Box(
        name=bname,
        type=type_.strip().lower(),
        inputs=streams_in,
        outputs=streams_out,
        params=tuple(sorted(checked.items(), key=lambda kv: _natural(kv[0]))),
        node=None if node is None else check_name(node, "node", QueryError, prefix=where),
    )


def _param_name(where: str, key: object) -> str:
    if not isinstance(key, str) or not _PARAM_NAME.fullmatch(key):
        raise QueryError(f"{where}bad parameter name {key!r}")
    # The Medusa paper's sample query spells the filter parameter "nexpression.0".
    return key[1:] if key.startswith("nexpression.") else key


def _param_value(where: str, name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise QueryError(f"{where}parameter {name} must be text or a number, got {value!r}")
    return value


def _natural(name: str) -> tuple[str, int]:
    base, _, index = name.rpartition(".")
    return (base, int(index)) if base and index.isdigit() else (name, -1)


# -- JSON ---------------------------------------------------------------------------------------


def _query_from_mapping(data: Mapping[str, Any], max_boxes: int = MAX_BOXES) -> Query:
    unknown = set(data) - {"name", "boxes", "availability_bound", "standby"}
    if unknown:
        raise QueryError(
            f"query: unknown keys {sorted(map(str, unknown))} "
            "(known: name, boxes, availability_bound, standby)"
        )
    qname = check_name(data.get("name"), "query", QueryError)
    bound = check_bound(qname, data.get("availability_bound"))
    standby = data.get("standby")
    if standby is not None and not isinstance(standby, bool):
        raise QueryError(
            f"query {qname}: standby must be true or false, got {standby!r:.40}",
            query=qname,
            parameter="standby",
        )
    raw_boxes = data.get("boxes")
    if not isinstance(raw_boxes, list | tuple):
        raise QueryError(f"query {qname}: 'boxes' must be a list", query=qname)
    if len(raw_boxes) > max_boxes:
        raise _over(
            f"query {qname}: has more than {max_boxes} boxes", "max_boxes", max_boxes, query=qname
        )
    boxes = []
    for i, raw in enumerate(raw_boxes):
        if not isinstance(raw, Mapping):
            raise QueryError(f"query {qname}: box #{i} must be an object", query=qname)
        extra = set(raw) - {"name", "type", "inputs", "outputs", "params", "node"}
        if extra:
            raise QueryError(
                f"query {qname}: box #{i} has unknown keys {sorted(map(str, extra))}", query=qname
            )
        params = raw.get("params", {})
        inputs, outputs = raw.get("inputs", []), raw.get("outputs", [])
        if not isinstance(params, Mapping):
            raise QueryError(f"query {qname}: box #{i}: 'params' must be an object", query=qname)
        if not isinstance(inputs, list | tuple) or not isinstance(outputs, list | tuple):
            raise QueryError(f"query {qname}: box #{i}: inputs/outputs must be lists", query=qname)
        boxes.append(
            _make_box(
                qname,
                raw.get("name"),
                raw.get("type"),
                list(inputs),
                list(outputs),
                list(params.items()),
                raw.get("node"),
            )
        )
    return make_query(qname, boxes, bound, standby)


# -- XML ----------------------------------------------------------------------------------------


def _query_from_xml(root: ET.Element, max_boxes: int = MAX_BOXES) -> Query:
    if root.tag in ("borealis", "network"):
        queries = [child for child in root if child.tag == "query"]
        if len(queries) != 1:
            raise QueryError(
                f"<{root.tag}> must hold exactly one <query> here, found {len(queries)}; "
                "`peer query submit FILE` takes a whole Borealis document (its schemas, input "
                "streams and every query)"
            )
        root = queries[0]
    if root.tag != "query":
        raise QueryError(f"query XML must have a <query> root element, got <{root.tag}>")
    qname = check_name(root.get("name"), "query", QueryError)
    boxes: list[Box] = []
    given: dict[str, str] = {}
    for child in root:
        if child.tag in ("param", "parameter"):
            name = child.get("name")
            if name not in QUERY_PARAMS:
                raise QueryError(
                    f"query {qname}: unknown query parameter {name!r} (a query takes "
                    f"{' or '.join(map(repr, QUERY_PARAMS))}; box parameters go inside a <box>)",
                    query=qname,
                )
            if name in given:
                raise QueryError(f"query {qname}: {name} is given twice", query=qname)
            value = child.get("value")
            given[name] = value if value is not None else (child.text or "").strip()
            continue
        if child.tag != "box":
            raise QueryError(f"query {qname}: unexpected element <{child.tag}>", query=qname)
        if len(boxes) == max_boxes:
            raise _over(
                f"query {qname}: has more than {max_boxes} boxes",
                "max_boxes",
                max_boxes,
                query=qname,
            )
        boxes.append(_box_from_xml(qname, child))
    bound = check_bound(qname, given.get(BOUND_PARAM))
    return make_query(qname, boxes, bound, check_standby(qname, given.get(STANDBY_PARAM)))


def _box_from_xml(qname: str, element: ET.Element) -> Box:
    where = f"query {qname}, box {element.get('name')}"
    arrows: dict[str, list[tuple[str | None, object]]] = {"in": [], "out": []}
    params: list[tuple[object, object]] = []
    for child in element:
        if child.tag in ("input", "in", "output", "out"):
            kind = "in" if child.tag in ("input", "in") else "out"
            arrows[kind].append((child.get("port"), child.get("stream")))
        elif child.tag in ("param", "parameter"):
            value = child.get("value")
            if value is None:
                value = (child.text or "").strip() or None
            if value is None:
                raise QueryError(f"{where}: parameter {child.get('name')} has no value")
            params.append((child.get("name"), value))
        else:
            raise QueryError(f"{where}: unexpected element <{child.tag}>", query=qname)
    return _make_box(
        qname,
        element.get("name"),
        element.get("type"),
        _by_port(where, arrows["in"]),
        _by_port(where, arrows["out"]),
        params,
        element.get("node"),
    )


def _by_port(where: str, arrows: list[tuple[str | None, object]]) -> list[object]:
    ports = [port for port, _ in arrows]
    if all(port is None for port in ports):
        return [stream for _, stream in arrows]
    numbers = []
    for port in ports:
        if port is None or not port.strip().isdigit():
            raise QueryError(f"{where}: every arrow needs a numeric port when one has it")
        numbers.append(int(port))
    if len(set(numbers)) != len(numbers):
        raise QueryError(f"{where}: two arrows use the same port")
    ordered = sorted(
        zip(numbers, (stream for _, stream in arrows), strict=True), key=lambda a: a[0]
    )
    return [stream for _, stream in ordered]
