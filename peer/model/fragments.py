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

from collections.abc import Callable, Iterator
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
    availability_bound_s: float | None = None  # the query's (every fragment keeps it)
    standby: bool | None = None  # the query's

    def as_query(self) -> Query:
        return Query(self.name, self.boxes, self.availability_bound_s, self.standby)


def topological_boxes(query: Query) -> list[Box]:
    """The boxes in an order where every box comes after the boxes making its inputs: a
    depth-first walk upstream from each box in turn, on an explicit stack (a chain of a
    thousand boxes needs no thousand Python frames)."""
    producer = {stream: box.name for box in query.boxes for stream in box.outputs}
    by_name = {box.name: box for box in query.boxes}
    done: set[str] = set()
    order: list[Box] = []

    def upstream(box: Box) -> Iterator[str]:
        for stream in box.inputs:
            name = producer.get(stream)
            if name is not None and name != box.name:
                yield name

    for start in query.boxes:
        if start.name in done:
            continue
        path = {start.name}
        stack = [(start, upstream(start))]
        while stack:
            box, feeders = stack[-1]
            for name in feeders:
                if name in done:
                    continue
                if name in path:
                    raise QueryError(f"query {query.name}: boxes form a loop through {name}")
                path.add(name)
                stack.append((by_name[name], upstream(by_name[name])))
                break
            else:
                stack.pop()
                path.discard(box.name)
                done.add(box.name)
                order.append(box)
    return order


def _ordered(groups: list[list[Box]], producer: dict[str, Box]) -> list[list[Box]]:
    """Groups ordered so that each comes after the groups making its inputs (fragments are
    installed in this order); a cycle between groups is refused."""
    group_of = {box.name: i for i, boxes in enumerate(groups) for box in boxes}
    needs = [
        {
            group_of[producer[s].name]
            for b in boxes
            for s in b.inputs
            if s in producer and group_of[producer[s].name] != i
        }
        for i, boxes in enumerate(groups)
    ]
    done: list[int] = []
    while len(done) < len(groups):
        ready = [i for i in range(len(groups)) if i not in done and needs[i] <= set(done)]
        if not ready:
            raise QueryError("the query's placement makes its fragments feed each other in a loop")
        done.append(ready[0])
    return [groups[i] for i in done]


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

    # Boxes downstream of an aggregate (within what would be one fragment): a join there
    # starts a new fragment. In one Spark query the join's other input would hold the global
    # watermark at zero until it sees a tuple, and the aggregate would never emit.
    after_aggregate: dict[str, bool] = {}
    for box in order:
        for stream in box.inputs:
            upstream = producer.get(stream)
            if upstream is None or site[upstream.name] != site[box.name]:
                continue
            if box.type == "join" and after_aggregate[upstream.name]:
                continue
            parent[root(box.name)] = root(upstream.name)
        after_aggregate[box.name] = box.type == "aggregate" or any(
            after_aggregate[producer[s].name]
            for s in box.inputs
            if s in producer
            and site[producer[s].name] == site[box.name]
            and root(producer[s].name) == root(box.name)
        )

    groups: dict[str, list[Box]] = {}
    for box in order:
        groups.setdefault(root(box.name), []).append(box)
    fragments = []
    for n, boxes in enumerate(_ordered(list(groups.values()), producer)):
        written = {s for b in boxes for s in b.outputs}
        inputs: list[str] = []
        for b in boxes:
            for stream in b.inputs:
                if stream not in written and stream not in inputs:
                    inputs.append(stream)
        outputs = tuple(s for b in boxes for s in b.outputs)
        # a query that is not split keeps its own name on its peer
        name = query.name if len(groups) == 1 else f"{query.name}#{n}"
        fragments.append(
            Fragment(
                name,
                site[boxes[0].name],
                tuple(boxes),
                tuple(inputs),
                outputs,
                query.availability_bound_s,
                query.standby,
            )
        )
    return fragments
