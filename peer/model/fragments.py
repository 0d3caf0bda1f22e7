"""Splitting a query into fragments, one per peer (pure: no I/O).

Theory of operation
-------------------
A fragment is a connected piece of a query placed on one peer (DESIGN.md section 1). Each box
gets a *site* (a peer's node id), in topological order:

* a box that names a place (Borealis' ``node=`` attribute, ``"node"`` in JSON) goes there; the
  caller's ``resolve(node, stream)`` turns the name (a participant, a node id prefix, an
  address) into a site, choosing among that participant's peers by the box's first input;
* a box whose first input is made by another box of the query goes with that box, so chains
  stay on one peer unless told otherwise;
* a box reading only streams from outside the query goes to ``default(stream)`` for its first
  input: the peer responsible for that stream among the submitting participant's peers.

Boxes with the same site joined by a stream of the query form one fragment. A stream made in
one fragment and read in another crosses peers (the caller mirrors it); each fragment lists
the streams it reads from outside itself and the streams it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peer.errors import QueryError
from peer.model.query import Box, Query

__all__ = ["Fragment", "fragment_query", "topological_boxes"]


@dataclass(frozen=True)
class Fragment:
    name: str  # "<query>#<n>", or the query's name if it is the only fragment
    site: str
    boxes: tuple[Box, ...]
    inputs: tuple[str, ...]  # streams read from outside this fragment, in first-use order
    outputs: tuple[str, ...]  # every stream its boxes write

    def as_query(self) -> Query:
        return Query(self.name, self.boxes)


def topological_boxes(query: Query) -> list[Box]:
    """The boxes in an order where every box comes after the boxes making its inputs."""
    producer = {stream: box.name for box in query.boxes for stream in box.outputs}
    by_name = {box.name: box for box in query.boxes}
    done: set[str] = set()
    order: list[Box] = []

    def visit(box: Box, path: tuple[str, ...]) -> None:
        if box.name in done:
            return
        if box.name in path:
            raise QueryError(f"query {query.name}: boxes form a loop through {box.name}")
        for stream in box.inputs:
            upstream = producer.get(stream)
            if upstream is not None and upstream != box.name:
                visit(by_name[upstream], (*path, box.name))
        done.add(box.name)
        order.append(box)

    for box in query.boxes:
        visit(box, ())
    return order


def fragment_query(
    query: Query,
    *,
    default: Callable[[str], str],
    resolve: Callable[[str, str], str],
) -> list[Fragment]:
    """Place every box and group them into fragments (see the module notes)."""
    producer = {stream: box for box in query.boxes for stream in box.outputs}
    order = topological_boxes(query)
    site: dict[str, str] = {}
    for box in order:
        first = box.inputs[0]
        if box.node:
            site[box.name] = resolve(box.node, first)
        elif first in producer:
            site[box.name] = site[producer[first].name]
        else:
            site[box.name] = default(first)

    # union-find over boxes joined by a stream with the same site at both ends
    parent = {box.name: box.name for box in order}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for box in order:
        for stream in box.inputs:
            upstream = producer.get(stream)
            if upstream is not None and site[upstream.name] == site[box.name]:
                parent[root(box.name)] = root(upstream.name)

    groups: dict[str, list[Box]] = {}
    for box in order:
        groups.setdefault(root(box.name), []).append(box)
    fragments = []
    for n, boxes in enumerate(groups.values()):
        written = {s for b in boxes for s in b.outputs}
        inputs: list[str] = []
        for b in boxes:
            for stream in b.inputs:
                if stream not in written and stream not in inputs:
                    inputs.append(stream)
        outputs = tuple(s for b in boxes for s in b.outputs)
        # a query that is not split keeps its own name on its peer
        name = query.name if len(groups) == 1 else f"{query.name}#{n}"
        fragments.append(Fragment(name, site[boxes[0].name], tuple(boxes), tuple(inputs), outputs))
    return fragments
