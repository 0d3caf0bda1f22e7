"""Borealis' own query-file forms: its box parameters, ``<borealis>`` documents and deploy files.

Borealis (and Aurora before it) gives its intrinsic boxes parameters that fedstream's boxes
either read with the same meaning or refuse, naming the value and why. The rule: a parameter
whose Borealis meaning equals fedstream's behaviour is accepted; a value that asks for
something fedstream does not do is refused. fedstream's results must equal what a batch
engine computes over the same input, so it cannot follow a setting that makes results depend
on arrival time or chance:

- aggregate ``order-by``: ``FIELD`` (windows on ``order-on-field``, required then) or
  ``TUPLENUM`` (count windows take tuples in arrival order; ``order-on-field`` is not read,
  as in Borealis).
- aggregate ``independent-window-alignment``: fedstream always aligns windows to multiples of
  ``advance``, which is this parameter set to 1. Borealis' default (0) aligns each group's
  windows to its first tuple, which differs between a replica, a moved box and a replay.
- aggregate ``drop-empty-outputs``: fedstream emits nothing for a window no tuple fell in
  (value 1); Borealis' default (0) emits such windows.
- aggregate and join ``timeout``: a negative value means no timeout in Borealis, as here; any
  other value closes windows (drops buffered tuples) by the wall-clock time tuples arrived.
- aggregate ``drop-mode`` (0 only) and ``last-agg`` (read only in drop mode): window-drop
  load shedding's protocol.
- ``random_drop`` and ``window_drop`` boxes (load shedding): ``drop_rate`` (or ``drop``) 0
  passes every tuple, which is how Borealis' load shedder inserts them; a higher rate drops
  tuples at random and is refused. ``window_drop``'s window parameters are checked as
  Borealis checks them (``window-slide`` <= ``window-size``).

A ``<borealis>`` document holds ``<schema>``, ``<input stream schema/>``,
``<output stream schema/>`` and any number of ``<query>`` elements; :func:`parse_document`
reads all of it (a ``<!DOCTYPE borealis SYSTEM ...>`` line included). A deploy file
(``<deploy><node endpoint query/></deploy>``) places a query's boxes on the peer at that
address (:func:`parse_deploy`); its ``publish``/``subscribe`` lines are for clients and are
not read.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace

from peer.errors import QueryError
from peer.model.params import BoxParams
from peer.model.query import Query, parse_query
from peer.model.schema import Schema, check_name, parse_schema, parse_xml, source_text

AGGREGATE_PARAMS = (
    "order-by",
    "independent-window-alignment",
    "drop-empty-outputs",
    "drop-mode",
    "last-agg",
)
DROP_PARAMS = (
    "drop_rate",
    "drop",
    "max_batch_size",
    "window-size",
    "window-slide",
    "window-size-by",
    "order-by",
    "order-on-field",
    "group-by",
)
ORDER_BY = ("FIELD", "TUPLENUM")


def aggregate_order_by(p: BoxParams) -> str | None:
    """Check the aggregate's Borealis-only parameters; return ``order-by`` (upper case) or
    None when not given."""
    order_by = p.get("order-by")
    if order_by is not None:
        order_by = order_by.strip().upper()
        if order_by not in ORDER_BY:
            raise p.error(f"must be FIELD or TUPLENUM, got {p.get('order-by')!r}", "order-by")
    if not p.boolean("independent-window-alignment", True):
        raise p.error(
            "0 is not supported: windows aligned to each group's first tuple depend on which "
            "tuple a peer sees first (a replica, a moved box or a replay may see another); "
            "fedstream aligns windows to multiples of advance, which is the value 1",
            "independent-window-alignment",
        )
    if not p.boolean("drop-empty-outputs", True):
        raise p.error(
            "0 is not supported: fedstream emits no tuple for a window that no tuple fell in "
            "(the value 1)",
            "drop-empty-outputs",
        )
    if p.boolean("drop-mode", False):
        raise p.error(
            "1 is not supported: drop mode is Borealis' window-drop load shedding, and "
            "fedstream sheds no load (its results equal a batch computation)",
            "drop-mode",
        )
    p.boolean("last-agg", True)  # read by Borealis in drop mode only
    check_timeout(p)
    return order_by


def check_timeout(p: BoxParams) -> None:
    """Borealis' ``timeout``: negative (no timeout) is accepted, anything else refused."""
    text = p.get("timeout")
    if text is None:
        return
    try:
        value = float(text)
    except ValueError:
        raise p.error(f"must be a number of seconds, got {text!r}", "timeout") from None
    if math.isnan(value) or value >= 0:
        raise p.error(
            f"{text.strip()} is not supported: a timeout closes windows by the wall-clock time "
            "tuples arrive, so results would depend on timing that no batch engine can "
            "reproduce; fedstream closes a window when its order field passes the window's "
            "end plus slack (a negative timeout, Borealis' 'no timeout', is accepted)",
            "timeout",
        )


def check_drop(p: BoxParams) -> None:
    """A load-shedding box: pass-through at drop rate 0, refused at any other rate."""
    if p.get("drop") is not None and p.get("drop_rate") is not None:
        raise p.error("give drop_rate or drop, not both", "drop")
    param = "drop" if p.get("drop") is not None else "drop_rate"
    rate = p.number(param, p.get(param) or "0", zero_ok=True)
    if rate > 1:
        raise p.error(f"is a fraction of tuples, 0 to 1, got {p.get(param)!r}", param)
    if rate > 0:
        raise p.error(
            f"{p.get(param)} is not supported: dropping a fraction of tuples at random makes "
            "results depend on chance; fedstream sheds no load (Borealis' load shedder starts "
            "its drop boxes at rate 0, which passes every tuple)",
            param,
        )
    if p.get("max_batch_size") is not None:
        p.number("max_batch_size", p.require("max_batch_size"), integral=True)
    size = p.get("window-size")
    slide = p.get("window-slide")
    if size is not None and slide is not None:
        size_n = p.number("window-size", size)
        if p.number("window-slide", slide) > size_n:
            raise p.error(f"must not exceed window-size ({slide} > {size})", "window-slide")
    by = p.get("window-size-by")
    if by is not None and by.strip().upper() not in ("VALUES", "TUPLES"):
        raise p.error(f"must be VALUES or TUPLES, got {by!r}", "window-size-by")
    order_by = p.get("order-by")
    if order_by is not None and order_by.strip().upper() not in ORDER_BY:
        raise p.error(f"must be FIELD or TUPLENUM, got {order_by!r}", "order-by")


# -- documents ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    """What a ``<borealis>`` document declares, in document order."""

    schemas: tuple[Schema, ...]
    inputs: tuple[tuple[str, str], ...]  # (stream, schema name)
    outputs: tuple[tuple[str, str], ...]
    queries: tuple[Query, ...]


def is_document(text: str) -> bool:
    """Whether ``text`` is a whole ``<borealis>`` document (not a single query)."""
    root = parse_xml(text, QueryError, "query")
    return root.tag == "borealis" and any(child.tag != "query" for child in root)


def parse_document(source: str | bytes) -> Document:
    """Read a ``<borealis>`` document: its schemas, declared streams and queries."""
    root = parse_xml(source_text(source, QueryError, "query"), QueryError, "query")
    if root.tag != "borealis":
        raise QueryError(f"a Borealis document has a <borealis> root element, got <{root.tag}>")
    schemas: list[Schema] = []
    inputs: list[tuple[str, str]] = []
    outputs: list[tuple[str, str]] = []
    queries: list[Query] = []
    for child in root:
        if child.tag == "schema":
            schemas.append(parse_schema(ET.tostring(child, encoding="unicode")))
        elif child.tag in ("input", "output"):
            stream = check_name(child.get("stream"), "stream", QueryError, prefix=f"<{child.tag}> ")
            schema = check_name(child.get("schema"), "schema", QueryError, prefix=f"<{child.tag}> ")
            (inputs if child.tag == "input" else outputs).append((stream, schema))
        elif child.tag == "query":
            queries.append(parse_query(ET.tostring(child, encoding="unicode")))
        elif child.tag in ("view", "table"):
            raise QueryError(
                f"<{child.tag}> elements are not supported: fedstream has no {child.tag}s"
            )
        else:
            raise QueryError(f"<borealis>: unexpected element <{child.tag}>")
    known = {s.name for s in schemas}
    for stream, schema in inputs:
        if schema not in known:
            raise QueryError(f"<input stream={stream!r}>: schema {schema!r} is not declared here")
    return Document(tuple(schemas), tuple(inputs), tuple(outputs), tuple(queries))


def parse_deploy(source: str | bytes) -> dict[str, str]:
    """A Borealis deploy file's placements: query name -> peer address (HOST:PORT)."""
    root = parse_xml(source_text(source, QueryError, "deploy"), QueryError, "deploy")
    if root.tag != "deploy":
        raise QueryError(f"a deploy file has a <deploy> root element, got <{root.tag}>")
    placed: dict[str, str] = {}
    for child in root:
        if child.tag in ("publish", "subscribe", "client"):
            continue  # where clients send and receive: not the peers' business
        if child.tag != "node" or child.get("query") is None:
            raise QueryError(f"<deploy>: unexpected element <{child.tag}> (expected <node query>)")
        endpoint = check_name(child.get("endpoint"), "node", QueryError, prefix="<node> ")
        for query in (child.get("query") or "").split():
            placed[query] = endpoint
    return placed


def deployed(query: Query, placed: dict[str, str]) -> Query:
    """``query`` with its boxes placed by a deploy file (a box's own ``node`` wins)."""
    endpoint = placed.get(query.name)
    if endpoint is None:
        return query
    boxes = tuple(b if b.node else replace(b, node=endpoint) for b in query.boxes)
    return replace(query, boxes=boxes)
