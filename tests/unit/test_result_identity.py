"""The result-identity rule and the hand-over of a promoted standby (issue 26).

Two plain-Python micro-batch runs of a fragment (a keyed tumbling-window aggregate under a
watermark; a filter with a pass-on-false output and a map; two maps into a union, so that one
input tuple makes two results) over the same spool files, cut into
different micro-batches, name the same results alike and equal an independent batch
computation. A primary that published any prefix of its batches (the last one maybe only in
part), a standby that held any prefix of its own and trimmed them against any earlier state of
the result streams: after the hand-over every result is published exactly once. Hostile rows
and fragments get an IdentityError that names what is wrong.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.model.plan import CheckedQuery, MapSpec, check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema
from peer.replication.result_identity import (
    ROUTE_COLUMN,
    Frontier,
    Held,
    IdentityError,
    IdentityRule,
    InputTuple,
    Published,
    ResultId,
    Unnamed,
    WindowGroup,
    hand_over,
    identity_rule,
    trim,
)

EVENTS = Schema("events", (Field("k", "string"), Field("t", "long"), Field("v", "long")))
STREAMS = {"events": EVENTS, "others": EVENTS.renamed("others")}
SIZE, SLACK = 10, 3
OFFSET, ROW = "__lineage0_offset", "__lineage0_row"

Row = dict[str, Any]
SpoolFile = tuple[int, list[tuple[str, int, int]]]  # (offset, rows of (k, t, v))


def checked(*boxes: dict[str, Any], name: str = "frag") -> CheckedQuery:
    return check_query(parse_query({"name": name, "boxes": list(boxes)}), STREAMS)


def rule_of(query: CheckedQuery) -> IdentityRule:
    rule = identity_rule(query)
    assert isinstance(rule, IdentityRule), rule
    return rule


AGGREGATE_BOX: dict[str, Any] = {
    "name": "win",
    "type": "aggregate",
    "inputs": ["events"],
    "outputs": ["totals"],
    "params": {
        "window-size": str(SIZE),
        "order-on-field": "t",
        "group-by": "k",
        "slack": str(SLACK),
        "aggregate-function.0": "count()",
        "aggregate-function-output-name.0": "n",
        "aggregate-function.1": "sum(v)",
        "aggregate-function-output-name.1": "total",
    },
}
AGGREGATE = checked(AGGREGATE_BOX)
PER_TUPLE = checked(
    {
        "name": "keep",
        "type": "filter",
        "inputs": ["events"],
        "outputs": ["big", "rest"],
        "params": {"expression.0": "v > 4", "pass-on-false-port": "1"},
    },
    {
        "name": "double",
        "type": "map",
        "inputs": ["rest"],
        "outputs": ["small"],
        "params": {
            "expression.0": "k",
            "expression.1": "v * 2",
            "output-field-name.1": "doubled",
        },
    },
)


# -- plain-Python references ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Batch:
    """One micro-batch's results, per result stream in emit order, and the frontier after it."""

    results: dict[str, list[Row]]
    frontier: Frontier


def next_offsets(files: Sequence[SpoolFile], batches: Sequence[Sequence[SpoolFile]]) -> list[int]:
    """Per batch, the offset the next batch starts at (past the last file: its offset + 1)."""
    ends, seen = [], 0
    for batch in batches:
        seen += len(batch)
        ends.append(files[seen][0] if seen < len(files) else files[-1][0] + 1)
    return ends


def run_aggregate(
    files: Sequence[SpoolFile], batches: Sequence[Sequence[SpoolFile]]
) -> list[Batch]:
    """A keyed tumbling-window count and sum, micro-batch by micro-batch under a watermark of
    the highest event time seen minus the slack; a window is emitted once the watermark
    reaches its end."""
    state: dict[tuple[int, str], list[int]] = {}
    highest: int | None = None
    out = []
    for batch, end in zip(batches, next_offsets(files, batches), strict=True):
        watermark = None if highest is None else highest - SLACK
        for _, rows in batch:
            for k, t, v in rows:
                assert watermark is None or t >= watermark, "the generator made a late tuple"
                cell = state.setdefault((t // SIZE * SIZE, k), [0, 0])
                cell[0] += 1
                cell[1] += v
                highest = t if highest is None else max(highest, t)
        watermark = None if highest is None else highest - SLACK
        closed = [w for w in state if watermark is not None and w[0] + SIZE <= watermark]
        rows_out = [
            {"window_start": s, "window_end": s + SIZE, "k": k, "n": n, "total": total}
            for (s, k) in closed
            for n, total in [state.pop((s, k))]
        ]
        marks = {} if watermark is None else {"win": watermark}
        out.append(Batch({"totals": rows_out}, Frontier.of({"events": end}, marks)))
    return out


def batch_aggregate(files: Sequence[SpoolFile]) -> list[Row]:
    """The same aggregate computed at once: the windows the whole input's watermark closed."""
    times = [t for _, rows in files for _, t, _ in rows]
    if not times:
        return []
    watermark = max(times) - SLACK
    groups: dict[tuple[int, str], list[int]] = {}
    for _, rows in files:
        for k, t, v in rows:
            groups.setdefault((t // SIZE * SIZE, k), []).append(v)
    return [
        {"window_start": s, "window_end": s + SIZE, "k": k, "n": len(vs), "total": sum(vs)}
        for (s, k), vs in groups.items()
        if s + SIZE <= watermark
    ]


def per_tuple(offset: int, index: int, k: str, t: int, v: int) -> tuple[str, Row]:
    """The filter/map fragment on one input tuple: its result stream and row."""
    lineage = {OFFSET: offset, ROW: index}
    if v > 4:
        return "big", {"k": k, "t": t, "v": v, **lineage}
    return "small", {"k": k, "doubled": v * 2, **lineage}


def run_per_tuple(
    files: Sequence[SpoolFile], batches: Sequence[Sequence[SpoolFile]]
) -> list[Batch]:
    out = []
    for batch, end in zip(batches, next_offsets(files, batches), strict=True):
        results: dict[str, list[Row]] = {"big": [], "small": []}
        for offset, rows in batch:
            for index, (k, t, v) in enumerate(rows):
                stream, row = per_tuple(offset, index, k, t, v)
                results[stream].append(row)
        out.append(Batch(results, Frontier.of({"events": end})))
    return out


def batch_per_tuple(files: Sequence[SpoolFile]) -> dict[str, list[Row]]:
    results: dict[str, list[Row]] = {"big": [], "small": []}
    for offset, rows in files:
        for index, (k, t, v) in enumerate(rows):
            stream, row = per_tuple(offset, index, k, t, v)
            results[stream].append(row)
    return results


DIAMOND = checked(
    {"name": "m1", "type": "map", "inputs": ["events"], "outputs": ["x"],
     "params": {"expression.0": "k", "expression.1": "t", "expression.2": "v"}},
    {"name": "m2", "type": "map", "inputs": ["events"], "outputs": ["y"],
     "params": {"expression.0": "k", "expression.1": "t", "expression.2": "v + 1",
                "output-field-name.2": "v"}},
    {"name": "u", "type": "union", "inputs": ["x", "y", "others"], "outputs": ["out"]},
)  # fmt: skip


def union_rows(offset: int, index: int, k: str, t: int, v: int) -> list[Row]:
    """The diamond fragment on one input tuple: a result by each of the union's first ports."""
    lineage = {OFFSET: offset, ROW: index}
    return [
        {"k": k, "t": t, "v": v, ROUTE_COLUMN: "u[0]", **lineage},
        {"k": k, "t": t, "v": v + 1, ROUTE_COLUMN: "u[1]", **lineage},
    ]


def run_union(files: Sequence[SpoolFile], batches: Sequence[Sequence[SpoolFile]]) -> list[Batch]:
    out = []
    for batch, end in zip(batches, next_offsets(files, batches), strict=True):
        rows = [
            row
            for offset, tuples in batch
            for index, (k, t, v) in enumerate(tuples)
            for row in union_rows(offset, index, k, t, v)
        ]
        out.append(Batch({"out": rows}, Frontier.of({"events": end})))
    return out


def batch_union(files: Sequence[SpoolFile]) -> dict[str, list[Row]]:
    rows = []
    for offset, tuples in files:
        for index, (k, t, v) in enumerate(tuples):
            rows += union_rows(offset, index, k, t, v)
    return {"out": rows}


def batch_totals(files: Sequence[SpoolFile]) -> dict[str, list[Row]]:
    return {"totals": batch_aggregate(files)}


FRAGMENTS = {
    "aggregate": (AGGREGATE, run_aggregate, batch_totals),
    "per_tuple": (PER_TUPLE, run_per_tuple, batch_per_tuple),
    "union": (DIAMOND, run_union, batch_union),
}


def named(rule: IdentityRule, results: Mapping[str, list[Row]]) -> list[Held]:
    return [h for stream, rows in results.items() for h in rule.held(stream, rows)]


def by_identity(held: Sequence[Held]) -> dict[ResultId, Mapping[str, object]]:
    table = {h.identity: h.row for h in held}
    assert len(table) == len(held), "one identity names two results"
    return table


# -- generated input -----------------------------------------------------------------------------


@st.composite
def spools(draw: st.DrawFn) -> list[SpoolFile]:
    """Spool files at increasing offsets (with gaps) holding tuples out of order by at most
    the slack, so that no micro-batch boundary makes one late."""
    files: list[SpoolFile] = []
    offset, base = draw(st.integers(0, 5)), 0
    for _ in range(draw(st.integers(1, 8))):
        rows = []
        for _ in range(draw(st.integers(0, 5))):
            base += draw(st.integers(0, 4))
            t = base + draw(st.integers(0, SLACK))
            rows.append((draw(st.sampled_from("abc")), t, draw(st.integers(0, 9))))
        files.append((offset, rows))
        offset += draw(st.integers(1, 3))
    return files


def cut(data: st.DataObject, files: Sequence[SpoolFile]) -> list[list[SpoolFile]]:
    """The files cut into consecutive micro-batches at drawn places."""
    cuts = data.draw(st.lists(st.booleans(), min_size=len(files) - 1, max_size=len(files) - 1))
    batches = [[files[0]]]
    for file, new in zip(files[1:], cuts, strict=True):
        if new:
            batches.append([])
        batches[-1].append(file)
    return batches


# -- (a) two runs, other micro-batch boundaries, the same names ----------------------------------


@pytest.mark.parametrize("kind", sorted(FRAGMENTS))
@settings(max_examples=200, deadline=None)
@given(files=spools(), data=st.data())
def test_two_runs_name_the_same_results_alike(
    kind: str, files: list[SpoolFile], data: st.DataObject
) -> None:
    query, run, at_once = FRAGMENTS[kind]
    rule = rule_of(query)
    first = [h for b in run(files, cut(data, files)) for h in named(rule, b.results)]
    second = [h for b in run(files, cut(data, files)) for h in named(rule, b.results)]
    reference = named(rule, at_once(files))
    assert by_identity(first) == by_identity(second) == by_identity(reference)


# -- (b) promotion at every point of the primary's progress --------------------------------------


def published(
    rule: IdentityRule,
    run: Sequence[Batch],
    done: int,
    mark: int,
    part: Mapping[str, bool] | None = None,
) -> Published:
    """The result streams after the primary published ``done`` batches and, of the next one,
    the streams in ``part``. Each stream's frontier is that after ``mark`` <= ``done``
    batches, the results since then held as explicit identities (the trimmed suffix); a
    stream of the partly published batch is known by its rows' identities (``part[stream]``
    true) or by its own frontier, that after the batch."""

    def frontier(batches: int) -> Frontier:
        return run[batches - 1].frontier if batches else Frontier()

    frontiers = {s: frontier(mark) for s in run[0].results}
    suffix = [h for b in run[mark:done] for h in named(rule, b.results)]
    for stream, explicit in (part or {}).items():
        if explicit:
            suffix += rule.held(stream, run[done].results[stream])
        else:
            frontiers[stream] = frontier(done + 1)
    return Published.of(frontiers, (h.identity for h in suffix))


@pytest.mark.parametrize("kind", sorted(FRAGMENTS))
@settings(max_examples=200, deadline=None)
@given(files=spools(), data=st.data())
def test_promotion_publishes_every_result_once(
    kind: str, files: list[SpoolFile], data: st.DataObject
) -> None:
    query, run, at_once = FRAGMENTS[kind]
    rule = rule_of(query)
    primary, standby = run(files, cut(data, files)), run(files, cut(data, files))
    streams = sorted(primary[0].results)

    done = data.draw(st.integers(0, len(primary)), label="primary's published batches")
    partly = done < len(primary)
    part = data.draw(
        st.dictionaries(st.sampled_from(streams), st.booleans()) if partly else st.just({}),
        label="streams of the next batch published, by identities (true) or their frontier",
    )
    mark = data.draw(st.integers(0, done), label="batches under the frontier")
    seen = data.draw(st.integers(0, done), label="primary's batches when the standby trimmed")
    seen_mark = data.draw(st.integers(0, seen), label="frontier then")
    held_batches = data.draw(st.integers(0, len(standby)), label="standby's held batches")

    by_primary = [h for b in primary[:done] for h in named(rule, b.results)]
    if partly:
        by_primary += named(rule, {s: primary[done].results[s] for s in part})
    held = [h for b in standby[:held_batches] for h in named(rule, b.results)]
    if held_batches and data.draw(st.booleans(), label="standby restarted, re-ran a batch"):
        held += named(rule, standby[held_batches - 1].results)  # its replay, held again
    held = trim(rule, published(rule, primary, seen, seen_mark), held)
    later = [h for b in standby[held_batches:] for h in named(rule, b.results)]
    by_standby = hand_over(rule, published(rule, primary, done, mark, part), [*held, *later])

    everything = [h.identity for h in by_primary + by_standby]
    assert set(Counter(everything).values()) <= {1}, "a result was published twice"
    assert by_identity(by_primary + by_standby) == by_identity(named(rule, at_once(files)))
    # The hand-over keeps the standby's order.
    order: dict[ResultId, int] = {}
    for place, h in enumerate([*held, *later]):
        order.setdefault(h.identity, place)
    places = [order[h.identity] for h in by_standby]
    assert places == sorted(places)


# -- the rule per box kind -----------------------------------------------------------------------


def test_an_aggregate_result_names_itself_by_its_window_and_group() -> None:
    rule = rule_of(AGGREGATE)
    assert rule.columns("totals") == {"window_start", "window_end", "k"}
    row = {"window_start": 10, "window_end": 20, "k": "a", "n": 3, "total": 7}
    assert rule.name("totals", row) == ResultId("totals", "", (WindowGroup("win", 10, 20, ("a",)),))
    nan = {**row, "k": float("nan")}  # a group keyed NaN is one group, as Spark groups it
    assert rule.name("totals", nan) == rule.name("totals", dict(nan))


def test_a_per_tuple_result_names_its_input_tuple_and_a_frontier_covers_it_below_the_offset() -> (
    None
):
    rule = rule_of(PER_TUPLE)
    assert rule.columns("big") == rule.columns("small") == {OFFSET, ROW}
    name = rule.name("small", {"k": "a", "doubled": 4, OFFSET: 7, ROW: 2})
    assert name == ResultId("small", "", (InputTuple("events", 7, 2),))
    assert rule.covered(name, Published.of({"small": Frontier.of({"events": 8})}))
    assert not rule.covered(name, Published.of({"small": Frontier.of({"events": 7})}))
    assert not rule.covered(name, Published.of({"small": Frontier.of({"others": 100})}))
    assert not rule.covered(name, Published.of({"big": Frontier.of({"events": 8})}))
    assert rule.covered(name, Published.of(identities=[name]))


def test_a_join_result_names_both_input_tuples_not_its_key_and_times() -> None:
    rule = rule_of(
        checked(
            {
                "name": "j",
                "type": "join",
                "inputs": ["events", "others"],
                "outputs": ["pairs"],
                "params": {
                    "predicate": "left.k = right.k",
                    "left-order-on-field": "t",
                    "right-order-on-field": "t",
                    "left-buffer-size": "5",
                    "right-buffer-size": "5",
                },
            }
        )
    )
    columns = {OFFSET, ROW, "__lineage1_offset", "__lineage1_row"}
    assert rule.columns("pairs") == columns
    pair = {"k": "a", "t": 3, "v": 1, "right_k": "a", "right_t": 3, "right_v": 1}
    one = rule.name(
        "pairs", {**pair, OFFSET: 0, ROW: 0, "__lineage1_offset": 4, "__lineage1_row": 0}
    )
    two = rule.name(
        "pairs", {**pair, OFFSET: 0, ROW: 1, "__lineage1_offset": 4, "__lineage1_row": 0}
    )
    assert one.roots == (InputTuple("events", 0, 0), InputTuple("others", 4, 0))
    assert one != two  # equal key and times, two results
    assert rule.covered(one, Published.of({"pairs": Frontier.of({"events": 1, "others": 5})}))
    assert not rule.covered(one, Published.of({"pairs": Frontier.of({"events": 1, "others": 4})}))


def test_a_union_names_the_port_a_tuple_came_by() -> None:
    rule = rule_of(DIAMOND)
    assert {p.route for p in rule.paths("out")} == {"u[0]", "u[1]", "u[2]"}
    assert rule.columns("out") == {OFFSET, ROW, ROUTE_COLUMN}
    row = {"k": "a", "t": 2, "v": 1, OFFSET: 3, ROW: 0}
    left, right = (rule.name("out", {**row, ROUTE_COLUMN: r}) for r in ("u[0]", "u[1]"))
    assert left.roots == right.roots == (InputTuple("events", 3, 0),)
    assert left != right  # one input tuple, two results
    other = rule.name("out", {**row, ROUTE_COLUMN: "u[2]"})
    assert other.roots == (InputTuple("others", 3, 0),)


def test_a_map_after_an_aggregate_keeps_the_window_visible_or_hides_it() -> None:
    def after(expressions: dict[str, str]) -> tuple[str, ...]:
        query = checked(
            AGGREGATE_BOX,
            {"name": "m", "type": "map", "inputs": ["totals"], "outputs": ["shown"],
             "params": expressions},
        )  # fmt: skip
        (path,) = rule_of(query).paths("shown")
        return path.columns()[0]

    renamed = {"expression.0": "window_start", "output-field-name.0": "ws",
               "expression.1": "window_end", "expression.2": "k", "expression.3": "n"}  # fmt: skip
    assert after(renamed) == ("ws", "window_end", "k")
    dropped = {"expression.0": "k", "expression.1": "n"}
    assert after(dropped) == ("__lineage0_start", "__lineage0_end", "__lineage0_group0")


def test_bsort_and_count_windows_are_named_but_no_frontier_covers_them() -> None:
    bsort = rule_of(
        checked({"name": "s", "type": "bsort", "inputs": ["events"], "outputs": ["sorted"],
                 "params": {"order-on": "t", "slack": "2"}})
    )  # fmt: skip
    name = bsort.name("sorted", {"k": "a", "t": 1, "v": 1, OFFSET: 0, ROW: 0})
    assert not bsort.covered(name, Published.of({"sorted": Frontier.of({"events": 99})}))
    assert bsort.covered(name, Published.of(identities=[name]))
    counts = rule_of(
        checked({"name": "c", "type": "aggregate", "inputs": ["events"], "outputs": ["runs"],
                 "params": {"window-size": "3", "window-size-by": "TUPLES", "group-by": "k",
                            "aggregate-function.0": "sum(v)"}})
    )  # fmt: skip
    run = counts.name("runs", {"window_start": 0, "window_end": 3, "k": "a", "agg_0": 5})
    assert not counts.covered(run, Published.of({"runs": Frontier.of({"events": 99}, {"c": 99})}))


@pytest.mark.parametrize(
    ("box", "what"),
    [
        ({"type": "bsort", "params": {"order-on": "t"}}, "bsort depends on arrival order"),
        (
            {"type": "aggregate", "params": {"window-size": "3", "window-size-by": "TUPLES",
                                             "aggregate-function.0": "count()"}},
            "TUPLES windows depends on arrival order",
        ),
        (
            {"type": "aggregate", "params": {"window-size": "3", "order-on-field": "t",
                                             "aggregate-function.0": "firstval(v)"}},
            "firstval() depends on arrival order",
        ),
    ],
)  # fmt: skip
def test_an_arrival_order_box_over_two_streams_has_no_names(box: dict[str, Any], what: str) -> None:
    merged = {"name": "u", "type": "union", "inputs": ["events", "others"], "outputs": ["both"]}
    answer = identity_rule(
        checked(merged, {"name": "b", "inputs": ["both"], "outputs": ["out"], **box})
    )
    assert isinstance(answer, Unnamed)
    assert answer.box == "b" and what in answer.reason
    assert answer.message.startswith("fragment frag, box b: ")
    alone = {"name": "b", "inputs": ["events"], "outputs": ["out"], **box}
    assert isinstance(identity_rule(checked(alone)), IdentityRule)


# -- (c) hostile and edge input ------------------------------------------------------------------


def refused(match: str, call: Any, *args: Any) -> IdentityError:
    with pytest.raises(IdentityError, match=match) as info:
        call(*args)
    return info.value


@pytest.mark.parametrize("missing", [OFFSET, ROW])
def test_a_row_without_its_identity_columns_is_refused_by_name(missing: str) -> None:
    rule = rule_of(PER_TUPLE)
    row = {"k": "a", "t": 1, "v": 9, OFFSET: 0, ROW: 0}
    del row[missing]
    error = refused(f"fragment frag, result stream big: a result row has no column '{missing}'",
                    rule.name, "big", row)  # fmt: skip
    assert error.details == {"stream": "big", "field": missing}


@pytest.mark.parametrize("value", [True, -1, 2**63, "3", 1.0, None])
def test_an_offset_that_is_no_offset_is_refused(value: object) -> None:
    refused(f"column '{OFFSET}' must be an offset or row index",
            rule_of(PER_TUPLE).name, "big", {OFFSET: value, ROW: 0})  # fmt: skip


def test_a_route_or_stream_or_key_the_rule_does_not_know_is_refused() -> None:
    rule = rule_of(DIAMOND)
    row = {OFFSET: 0, ROW: 0}
    refused(f"no column '{ROUTE_COLUMN}'", rule.name, "out", row)
    refused(r"column __route is 'u\[9\]', not one of its routes", rule.name, "out",
            {**row, ROUTE_COLUMN: "u[9]"})  # fmt: skip
    refused("fragment frag has no result stream x ", rule.name, "x", row)
    window = {"window_start": 0, "window_end": 10, "k": ["a"]}
    refused("column 'k' holds list", rule_of(AGGREGATE).name, "totals", window)


def test_an_unknown_box_kind_is_refused_by_name() -> None:
    box = PER_TUPLE.boxes[1]
    strange = dataclasses.replace(box, box=dataclasses.replace(box.box, type="teleport"))
    query = dataclasses.replace(PER_TUPLE, boxes=(PER_TUPLE.boxes[0], strange))
    refused("fragment frag, box double: unknown box kind 'teleport'", identity_rule, query)
    wrong = dataclasses.replace(box, spec=AGGREGATE.boxes[0].spec)
    query = dataclasses.replace(PER_TUPLE, boxes=(PER_TUPLE.boxes[0], wrong))
    refused("a map box carries a AggregateSpec, not a MapSpec", identity_rule, query)
    assert isinstance(box.spec, MapSpec)


def test_an_identity_or_a_frontier_that_does_not_fit_is_refused() -> None:
    rule = rule_of(PER_TUPLE)
    foreign = ResultId("big", "", (WindowGroup("win", 0, 10, ()),))
    refused("does not have the roots of route", rule.covered, foreign, Published())
    refused("no route 'x'", rule.covered, ResultId("big", "x", ()), Published())
    refused("offset must be an int from 0", Frontier.of, {"events": -1})
    refused("given twice", Frontier, (("events", 1), ("events", 2)))
    window = rule_of(AGGREGATE).name("totals", {"window_start": 0, "window_end": 10, "k": "a"})
    refused("cannot be compared", rule_of(AGGREGATE).covered, window,
            Published.of({"totals": Frontier.of(windows={"win": "late"})}))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    row=st.dictionaries(
        st.sampled_from([OFFSET, ROW, ROUTE_COLUMN, "window_start", "window_end", "k", "v"]),
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
        | st.lists(st.integers(), max_size=2),
    ),
    stream=st.sampled_from(["big", "small", "out", "totals", "nowhere"]),
)  # fmt: skip
def test_any_row_is_named_or_refused_with_an_identity_error(row: Row, stream: str) -> None:
    for rule in (rule_of(PER_TUPLE), rule_of(DIAMOND), rule_of(AGGREGATE)):
        try:
            name = rule.name(stream, row)
        except IdentityError:
            continue
        assert name.stream == stream
        assert rule.covered(name, Published.of(identities=[name]))
