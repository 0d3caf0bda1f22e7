"""How a fragment's result is named across runs, and what a promoted standby publishes.

Theory of operation
-------------------
A replicated fragment's results are tagged (origin, batch id) today, and a replay is dropped by
that tag (:mod:`peer.replication.fragment_failover`). A standby runs the same fragment over its
own replica of the input with its own micro-batch boundaries, so its batch ids name other
results than the primary's. This module names each result by what it is made of, which no
micro-batch boundary changes: two runs of one fragment over the same input (the same spool
files at the same offsets, as every in-sync replica holds them) give each result the same
:class:`ResultId`.

A :class:`ResultId` is the result stream, a *route* and one or more *roots*:

* an :class:`InputTuple` (a fragment input stream, the spool offset of the file holding the
  tuple and its row index there) for the per-tuple boxes, whose every result comes from one
  input tuple;
* a :class:`WindowGroup` (the aggregate box, the window's start and end, the group key values)
  for an aggregate, whose result is the one row of its window and group.

The rule per box kind (:func:`identity_rule` derives it from the checked fragment):

* **filter, map, union, random_drop/window_drop at rate 0**: the input tuple behind the result.
  A filter sends a tuple to one output only; a union of several inputs adds the input port to
  the route (``box[port]``), because one input tuple may reach a result stream twice (a map
  each way into a union).
* **aggregate, VALUES windows**: the window (start, end) and the group key values, the
  aggregate's own output columns, so the result stream's rows name themselves.
* **aggregate, TUPLES windows**: the same (window bounds are tuple counts per group).
* **join**: both sides' identities (the input tuples behind the pair), not the join key and
  event times: two input tuples with equal key and time make two results, which key and times
  would name alike. The route records both sides' routes (``box(left|right)``).
* **bsort**: the input tuple behind the result (a bounded sort only reorders tuples).
* Chains compose: a map after an aggregate keeps the window's identity, a join after maps the
  input tuples behind both sides.

What a row carries (:meth:`IdentityRule.columns`): an aggregate's window and group columns are
its output fields while they are there (a filter keeps them, a map keeps them if it projects
them bare). Everything else is hidden columns the engine adds, for root ``k`` of the row:
``__lineage<k>_offset`` and ``__lineage<k>_row`` (an input tuple; the sources' ``__seq`` holds
both), or ``__lineage<k>_start``, ``__lineage<k>_end``, ``__lineage<k>_group<j>`` (a window
that a map dropped); and ``__route`` (text) when the stream has more than one route.

Undefined, answered :class:`Unnamed` (the fragment keeps today's path, no standby): a box that
depends on arrival order (bsort, TUPLES windows, firstval/lastval) over anything but one input
stream's tuples. Arrival order across streams, or after a join, is not fixed by the spools, so
two runs could make different results under one name.

Promotion
---------
What the replicated result streams hold is given as :class:`Published`: per result stream a
:class:`Frontier` (a low-water mark), plus explicit identities above it (a trimmed suffix). A
stream's frontier is that of the primary's last batch appended to it: per input stream the
offset its next batch starts at (every input tuple below it has been through a batch whose
results the stream holds), per VALUES aggregate the watermark that closed its windows (every
window ending at or before it is in the stream). A result is *covered* if its identity is
among the explicit ones, or if its stream's frontier covers all of its roots and its route
passes no bsort and no TUPLES window (those hold results back past the batch their input came
in, so no frontier covers them: their identities must stay explicit until no standby can
still make them).

Where the wiring finds a frontier without changing a format: a result stream's newest entry is
tagged (origin, batch id); the fragment's checkpoint record written before that batch
(:class:`~peer.replication.checkpoint_record.FragmentRecord`) holds Spark's offset log of the
batch, with its end offsets and its watermark. Frontiers are per stream because a batch's
results are appended stream by stream, and a crash may fall between two appends. An
aggregate's rows carry their own identities, so its streams can also be read for explicit
ones; a per-tuple row's hidden lineage columns are not published.

* :func:`trim`: the standby drops the held results that are covered; a covered result is in
  the replicated result stream, which keeps it.
* :func:`hand_over`: on promotion, the held results that are not covered, in the standby's
  order, each identity once. The promoted standby passes each later batch through it too (with
  the same :class:`Published`): a standby that lagged makes results the primary published.

Nothing here reads a clock, a socket or Spark.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from peer.errors import InvalidInput
from peer.model.plan import (
    AggregateSpec,
    BSortSpec,
    CheckedBox,
    CheckedQuery,
    FilterSpec,
    JoinSpec,
    MapSpec,
    Spec,
    UnionSpec,
)

__all__ = [
    "ROUTE_COLUMN",
    "FromInput",
    "FromWindow",
    "Frontier",
    "Held",
    "IdentityError",
    "IdentityRule",
    "InputTuple",
    "Path",
    "Published",
    "ResultId",
    "Unnamed",
    "WindowGroup",
    "hand_over",
    "identity_rule",
    "trim",
]

ROUTE_COLUMN = "__route"
WINDOW_COLUMNS = ("window_start", "window_end")
ORDERED_FUNCTIONS = ("firstval", "lastval")


class IdentityError(InvalidInput):
    """A fragment, a row or an identity that the rule cannot name; the message says what."""


@dataclass(frozen=True)
class _NaN:
    """A NaN key value: equal to itself, so a group keyed NaN has one name (as Spark groups)."""


NAN = _NaN()

# -- identities ----------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class InputTuple:
    """One tuple of a fragment input: spool file ``offset``, row ``row`` within it."""

    stream: str
    offset: int
    row: int


@dataclass(frozen=True)
class WindowGroup:
    """One window of one group of an aggregate box."""

    box: str
    start: Hashable
    end: Hashable
    group: tuple[Hashable, ...]


Root = InputTuple | WindowGroup


@dataclass(frozen=True)
class ResultId:
    """The name of one result, the same in every run of the fragment over the same input."""

    stream: str  # the result stream
    route: str  # the way it came: box[port] at a union, box(left|right) at a join; or ""
    roots: tuple[Root, ...]  # the input tuples (or the window) it is made of, left side first


# -- the rule ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FromInput:
    """A root that is a tuple of the fragment input ``stream``."""

    stream: str


@dataclass(frozen=True)
class FromWindow:
    """A root that is a window of aggregate ``box`` with ``groups`` key values; ``visible``:
    the row's columns holding (start, end, *group) while they are output fields, None once
    hidden columns carry them."""

    box: str
    groups: int
    visible: tuple[str, ...] | None


Source = FromInput | FromWindow


@dataclass(frozen=True)
class Path:
    """One way results reach a stream: its route, its roots' sources, and whether a frontier
    covers them (``marked``: no bsort or TUPLES window on the way)."""

    route: str
    sources: tuple[Source, ...]
    marked: bool

    def columns(self) -> tuple[tuple[str, ...], ...]:
        """Per root, the columns of a row that hold it."""
        out: list[tuple[str, ...]] = []
        for k, source in enumerate(self.sources):
            if isinstance(source, FromInput):
                out.append((f"__lineage{k}_offset", f"__lineage{k}_row"))
            elif source.visible is not None:
                out.append(source.visible)
            else:
                hidden = [f"__lineage{k}_start", f"__lineage{k}_end"]
                out.append((*hidden, *(f"__lineage{k}_group{j}" for j in range(source.groups))))
        return tuple(out)


@dataclass(frozen=True)
class Unnamed:
    """A fragment whose results cannot be named across runs: it keeps today's path."""

    fragment: str
    box: str
    reason: str

    @property
    def message(self) -> str:
        return f"fragment {self.fragment}, box {self.box}: {self.reason}"


@dataclass(frozen=True)
class IdentityRule:
    """How the results of one fragment are named: per result stream, its paths."""

    fragment: str
    streams: tuple[tuple[str, tuple[Path, ...]], ...]
    _routes: dict[str, dict[str, Path]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        routes: dict[str, dict[str, Path]] = {}
        for stream, paths in self.streams:
            by_route = {path.route: path for path in paths}
            if not paths or len(by_route) != len(paths):
                raise IdentityError(
                    f"fragment {self.fragment}: result stream {stream} needs one or more paths "
                    f"with distinct routes, got {[p.route for p in paths]}",
                    stream=stream,
                )
            routes[stream] = by_route
        object.__setattr__(self, "_routes", routes)

    def paths(self, stream: str) -> tuple[Path, ...]:
        return tuple(self._paths_of(stream).values())

    def columns(self, stream: str) -> frozenset[str]:
        """The columns a row of ``stream`` must carry to be named."""
        paths = self._paths_of(stream)
        wanted = {c for path in paths.values() for root in path.columns() for c in root}
        return frozenset(wanted | ({ROUTE_COLUMN} if len(paths) > 1 else set()))

    def name(self, stream: str, row: Mapping[str, object]) -> ResultId:
        """The identity of a result ``row`` of ``stream``; IdentityError names a missing or
        wrong column."""
        paths = self._paths_of(stream)
        if len(paths) == 1:
            (path,) = paths.values()
        else:
            route = _column(self.fragment, stream, row, ROUTE_COLUMN)
            if not isinstance(route, str) or route not in paths:
                raise IdentityError(
                    f"fragment {self.fragment}, result stream {stream}: column {ROUTE_COLUMN} "
                    f"is {route!r}, not one of its routes {sorted(paths)}",
                    stream=stream,
                    field=ROUTE_COLUMN,
                )
            path = paths[route]
        roots = tuple(
            _root(self.fragment, stream, source, columns, row)
            for source, columns in zip(path.sources, path.columns(), strict=True)
        )
        return ResultId(stream, path.route, roots)

    def held(self, stream: str, rows: Iterable[Mapping[str, object]]) -> list[Held]:
        """``rows`` of ``stream`` with their identities, in their order."""
        return [Held(self.name(stream, row), row) for row in rows]

    def covered(self, identity: ResultId, published: Published) -> bool:
        """Whether the replicated result stream is known to hold the result ``identity``."""
        path = self._path_of(identity)
        if identity in published.identities:
            return True
        frontier = published.frontier(identity.stream)
        return path.marked and all(frontier.covers(root) for root in identity.roots)

    def _paths_of(self, stream: str) -> dict[str, Path]:
        paths = self._routes.get(stream)
        if paths is None:
            raise IdentityError(
                f"fragment {self.fragment} has no result stream {stream} "
                f"(its results: {', '.join(sorted(self._routes)) or 'none'})",
                stream=stream,
            )
        return paths

    def _path_of(self, identity: ResultId) -> Path:
        paths = self._paths_of(identity.stream)
        path = paths.get(identity.route)
        where = f"fragment {self.fragment}, result stream {identity.stream}"
        if path is None:
            raise IdentityError(
                f"{where}: no route {identity.route!r} (its routes: {sorted(paths)})",
                stream=identity.stream,
            )
        shaped = len(identity.roots) == len(path.sources) and all(
            (isinstance(s, FromInput) and isinstance(r, InputTuple) and r.stream == s.stream)
            or (isinstance(s, FromWindow) and isinstance(r, WindowGroup) and r.box == s.box)
            for r, s in zip(identity.roots, path.sources, strict=False)
        )
        if not shaped:
            raise IdentityError(
                f"{where}: identity {identity} does not have the roots of route "
                f"{identity.route!r} ({path.sources})",
                stream=identity.stream,
            )
        return path


def _column(fragment: str, stream: str, row: Mapping[str, object], column: str) -> object:
    if column not in row:
        raise IdentityError(
            f"fragment {fragment}, result stream {stream}: a result row has no column "
            f"{column!r}, which names it (its columns: {', '.join(sorted(map(str, row)))})",
            stream=stream,
            field=column,
        )
    return row[column]


def _root(
    fragment: str,
    stream: str,
    source: Source,
    columns: tuple[str, ...],
    row: Mapping[str, object],
) -> Root:
    values = [_column(fragment, stream, row, c) for c in columns]
    if isinstance(source, FromInput):
        for column, value in zip(columns, values, strict=True):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise IdentityError(
                    f"fragment {fragment}, result stream {stream}: column {column!r} must be "
                    f"an offset or row index (an int from 0), got {value!r}",
                    stream=stream,
                    field=column,
                )
        offset, index = values
        assert isinstance(offset, int) and isinstance(index, int)
        return InputTuple(source.stream, offset, index)
    keys = [_key(fragment, stream, c, v) for c, v in zip(columns, values, strict=True)]
    return WindowGroup(source.box, keys[0], keys[1], tuple(keys[2:]))


def _key(fragment: str, stream: str, column: str, value: object) -> Hashable:
    if isinstance(value, float) and math.isnan(value):
        return NAN
    try:
        hash(value)
    except TypeError:
        raise IdentityError(
            f"fragment {fragment}, result stream {stream}: column {column!r} holds "
            f"{type(value).__name__} {value!r}, which is no key value",
            stream=stream,
            field=column,
        ) from None
    return value


# -- what the result streams hold; the hand-over --------------------------------------------------


@dataclass(frozen=True)
class Frontier:
    """The low-water mark of the primary's published batches: ``offsets``, per input stream,
    the offset its next batch starts at; ``windows``, per VALUES aggregate box, the watermark
    that closed its windows (each ending at or before it is published)."""

    offsets: tuple[tuple[str, int], ...] = ()
    windows: tuple[tuple[str, Hashable], ...] = ()
    _ends: dict[str, int] = field(init=False, repr=False, compare=False)
    _marks: dict[str, Hashable] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for what, pairs in (("input stream", self.offsets), ("aggregate box", self.windows)):
            names = [name for name, _ in pairs]
            if len(set(names)) != len(names):
                raise IdentityError(f"frontier: an {what} is given twice in {names}")
        for stream, offset in self.offsets:
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise IdentityError(
                    f"frontier: input stream {stream}'s offset must be an int from 0, "
                    f"got {offset!r}",
                    stream=stream,
                )
        object.__setattr__(self, "_ends", dict(self.offsets))
        object.__setattr__(self, "_marks", dict(self.windows))

    @staticmethod
    def of(
        offsets: Mapping[str, int] | None = None, windows: Mapping[str, Hashable] | None = None
    ) -> Frontier:
        return Frontier(
            tuple(sorted((offsets or {}).items())), tuple(sorted((windows or {}).items()))
        )

    def covers(self, root: Root) -> bool:
        if isinstance(root, InputTuple):
            end = self._ends.get(root.stream)
            return end is not None and root.offset < end
        mark = self._marks.get(root.box)
        if mark is None:
            return False
        try:
            return bool(root.end <= mark)  # type: ignore[operator]
        except TypeError:
            raise IdentityError(
                f"frontier: aggregate box {root.box}'s mark {mark!r} cannot be compared with "
                f"the window end {root.end!r}",
                box=root.box,
            ) from None


EMPTY = Frontier()


@dataclass(frozen=True)
class Published:
    """What the replicated result streams hold, as a standby reads them: per result stream a
    frontier (streams not named have none), and the identities of results above them (or on
    routes no frontier covers)."""

    frontiers: tuple[tuple[str, Frontier], ...] = ()
    identities: frozenset[ResultId] = frozenset()
    _by_stream: dict[str, Frontier] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        streams = [stream for stream, _ in self.frontiers]
        if len(set(streams)) != len(streams):
            raise IdentityError(
                f"published: a result stream's frontier is given twice in {streams}"
            )
        object.__setattr__(self, "_by_stream", dict(self.frontiers))

    @staticmethod
    def of(
        frontiers: Mapping[str, Frontier] | None = None, identities: Iterable[ResultId] = ()
    ) -> Published:
        return Published(tuple(sorted((frontiers or {}).items())), frozenset(identities))

    def frontier(self, stream: str) -> Frontier:
        return self._by_stream.get(stream, EMPTY)


@dataclass(frozen=True)
class Held:
    """A result the standby holds back: its identity and its row."""

    identity: ResultId
    row: Mapping[str, object]


def trim(rule: IdentityRule, published: Published, held: Sequence[Held]) -> list[Held]:
    """The standby's held results without those the result streams are known to hold."""
    return [h for h in held if not rule.covered(h.identity, published)]


def hand_over(rule: IdentityRule, published: Published, results: Iterable[Held]) -> list[Held]:
    """On promotion: of ``results`` (the held ones, then each later batch's), those to publish,
    in order: the ones not covered by ``published``, each identity once."""
    seen: set[ResultId] = set()
    out: list[Held] = []
    for result in results:
        if result.identity in seen or rule.covered(result.identity, published):
            continue
        seen.add(result.identity)
        out.append(result)
    return out


# -- deriving the rule from a checked fragment ----------------------------------------------------

_KINDS: dict[str, type[Spec]] = {
    "filter": FilterSpec,
    "map": MapSpec,
    "union": UnionSpec,
    "random_drop": UnionSpec,
    "window_drop": UnionSpec,
    "aggregate": AggregateSpec,
    "join": JoinSpec,
    "bsort": BSortSpec,
}

Paths = tuple[Path, ...]


def identity_rule(checked: CheckedQuery) -> IdentityRule | Unnamed:
    """The identity rule of a checked fragment, or why it has none (see the module notes)."""
    fragment = checked.query.name
    paths: dict[str, Paths] = {s: (Path("", (FromInput(s),), True),) for s in checked.inputs}
    for box in checked.boxes:
        inputs = []
        for stream in box.box.inputs:
            if stream not in paths:
                raise IdentityError(
                    f"fragment {fragment}, box {box.box.name}: input stream {stream} is neither "
                    "an input of the fragment nor made by a box before it",
                    box=box.box.name,
                    stream=stream,
                )
            inputs.append(paths[stream])
        made = _box_paths(fragment, box, inputs)
        if isinstance(made, Unnamed):
            return made
        paths.update(zip(box.box.outputs, made, strict=True))
    return IdentityRule(fragment, tuple((s, paths[s]) for s in checked.outputs))


def _box_paths(fragment: str, checked: CheckedBox, inputs: list[Paths]) -> list[Paths] | Unnamed:
    box, spec = checked.box, checked.spec
    expected = _KINDS.get(box.type)
    where = f"fragment {fragment}, box {box.name}"
    if expected is None:
        raise IdentityError(
            f"{where}: unknown box kind {box.type!r} (kinds: {', '.join(_KINDS)})", box=box.name
        )
    if not isinstance(spec, expected):
        raise IdentityError(
            f"{where}: a {box.type} box carries a {type(spec).__name__}, not a {expected.__name__}",
            box=box.name,
        )
    if isinstance(spec, FilterSpec):  # a tuple leaves by one output only
        return [inputs[0]] * len(box.outputs)
    if isinstance(spec, MapSpec):
        return [tuple(_mapped(path, spec) for path in inputs[0])]
    if isinstance(spec, UnionSpec):
        if len(inputs) == 1:
            return [inputs[0]]
        return [
            tuple(
                Path(f"{path.route}{box.name}[{port}]", path.sources, path.marked)
                for port, paths in enumerate(inputs)
                for path in paths
            )
        ]
    if isinstance(spec, JoinSpec):
        left, right = inputs
        simple = len(left) == len(right) == 1 and not left[0].route and not right[0].route
        return [
            tuple(
                Path(
                    "" if simple else f"{box.name}({lp.route}|{rp.route})",
                    tuple(_hidden(s) for s in (*lp.sources, *rp.sources)),
                    lp.marked and rp.marked,
                )
                for lp in left
                for rp in right
            )
        ]
    if isinstance(spec, BSortSpec):
        if (why := _arrival_order(inputs[0])) is not None:
            return Unnamed(fragment, box.name, f"bsort {why}")
        return [tuple(Path(path.route, path.sources, False) for path in inputs[0])]
    assert isinstance(spec, AggregateSpec)
    ordered = [c.function for c in spec.calls if c.function in ORDERED_FUNCTIONS]
    if spec.window_by == "TUPLES" or ordered:
        what = "TUPLES windows" if spec.window_by == "TUPLES" else f"{ordered[0]}()"
        if (why := _arrival_order(inputs[0])) is not None:
            return Unnamed(fragment, box.name, f"an aggregate with {what} {why}")
    window = FromWindow(box.name, len(spec.group_by), (*WINDOW_COLUMNS, *spec.group_by))
    return [(Path("", (window,), spec.window_by == "VALUES"),)]


def _arrival_order(paths: Paths) -> str | None:
    """Why a box depending on arrival order cannot be named over ``paths``, or None."""
    if (
        len(paths) == 1
        and len(paths[0].sources) == 1
        and isinstance(paths[0].sources[0], FromInput)
    ):
        return None
    return (
        "depends on arrival order, which only a single input stream's spool fixes; its input "
        "merges several streams or comes out of a join or an aggregate, so two runs with other "
        "micro-batch boundaries may make other results under one name"
    )


def _mapped(path: Path, spec: MapSpec) -> Path:
    """A path through a map: a window's columns follow bare projections, else go hidden."""
    bare: dict[str, str] = {}
    for name, expr in spec.outputs:
        if len(expr.columns) == 1:
            (column,) = expr.columns
            if expr.sql == f"`{column}`":
                bare.setdefault(column, name)
    sources: list[Source] = []
    for source in path.sources:
        if isinstance(source, FromWindow) and source.visible is not None:
            kept = tuple(bare.get(c) for c in source.visible)
            visible = None if None in kept else tuple(c for c in kept if c is not None)
            source = FromWindow(source.box, source.groups, visible)
        sources.append(source)
    return Path(path.route, tuple(sources), path.marked)


def _hidden(source: Source) -> Source:
    """A join renames its fields: a window's identity travels in hidden columns past it."""
    if isinstance(source, FromWindow):
        return FromWindow(source.box, source.groups, None)
    return source
