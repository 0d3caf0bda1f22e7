"""check_query: every box kind into its spec and output schemas; every error names the query,
the box and the parameter."""

from __future__ import annotations

from typing import Any

import pytest

from peer.errors import ExpressionError, QueryError
from peer.model.plan import (
    AggregateCall,
    AggregateSpec,
    BSortSpec,
    CheckedQuery,
    FilterSpec,
    JoinSpec,
    MapSpec,
    UnionSpec,
    check_query,
)
from peer.model.query import parse_query
from peer.model.schema import Field, Schema

from .test_model_query import MEDUSA_QUERY_XML

PERSON = Schema("person", (Field("person_name", "string", 32), Field("person_id", "int")))
CARS = Schema(
    "car",
    (
        Field("car_id", "int"),
        Field("speed", "double"),
        Field("seg", "int"),
        Field("t", "timestamp"),
        Field("seq", "long"),
    ),
)
TOLLS = Schema("toll", (Field("seg", "int"), Field("toll", "double"), Field("t", "timestamp")))
STREAMS = {
    "medusa://nms.lcs.mit.edu/locator/people": PERSON,
    "people": PERSON,
    "cars": CARS,
    "cars2": CARS.renamed("car2"),
    "tolls": TOLLS,
}


def check(box: dict[str, Any], streams: dict[str, Schema] | None = None) -> CheckedQuery:
    spelled = {"name": "b", "inputs": ["cars"], "outputs": ["out"], **box}
    return check_query(parse_query({"name": "Q", "boxes": [spelled]}), streams or STREAMS)


def fails(box: dict[str, Any], fragment: str, param: str | None = None) -> QueryError:
    with pytest.raises(QueryError) as info:
        check(box)
    message = info.value.message
    prefix = f"query Q, box b, parameter {param}: " if param else "query Q, box b"
    assert message.startswith(prefix), message
    assert fragment in message, message
    return info.value


def fields(checked: CheckedQuery, stream: str = "out") -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in checked.stream_schemas[stream].fields]


def test_medusa_appendix_query() -> None:
    checked = check_query(parse_query(MEDUSA_QUERY_XML), STREAMS)
    (box,) = checked.boxes
    assert isinstance(box.spec, FilterSpec)
    assert [p.sql for p in box.spec.predicates] == ["`person_id` = 2"]
    assert not box.spec.pass_on_false
    assert checked.inputs == ("medusa://nms.lcs.mit.edu/locator/people",)
    assert checked.outputs == ("medusa://nms.lcs.mit.edu/locator/MrX",)
    mr_x = checked.stream_schemas["medusa://nms.lcs.mit.edu/locator/MrX"]
    assert mr_x.name == "medusa://nms.lcs.mit.edu/locator/MrX"
    assert mr_x.fields == PERSON.fields
    assert box.input_schemas == (PERSON,)
    assert box.output_schemas == (mr_x,)


def test_unknown_column_error_names_query_box_and_parameter() -> None:
    query = parse_query(
        {
            "name": "FindMrX",
            "boxes": [
                {
                    "name": "foo",
                    "type": "filter",
                    "inputs": ["people"],
                    "outputs": ["MrX"],
                    "params": {"expression.0": "persn_id = 2"},
                }
            ],
        }
    )
    with pytest.raises(ExpressionError) as info:
        check_query(query, STREAMS)
    assert info.value.message == (
        "query FindMrX, box foo, parameter expression.0: unknown column 'persn_id' "
        "(columns: person_name, person_id)"
    )


def test_filter_with_pass_on_false_port() -> None:
    checked = check(
        {
            "type": "filter",
            "outputs": ["fast", "slow", "rest"],
            "params": {
                "expression.0": "speed > 100",
                "expression.1": "speed < 10",
                "pass-on-false-port": "1",
            },
        }
    )
    spec = checked.boxes[0].spec
    assert isinstance(spec, FilterSpec)
    assert spec.pass_on_false
    assert [p.sql for p in spec.predicates] == ["`speed` > 100", "`speed` < 10"]
    assert checked.outputs == ("fast", "slow", "rest")
    assert all(fields(checked, s) == fields(checked, "fast") for s in ("slow", "rest"))


@pytest.mark.parametrize(
    ("box", "fragment", "param"),
    [
        (
            {"params": {"expression.0": "speed"}},
            "a filter predicate must be bool, got double",
            "expression.0",
        ),
        ({"params": {}}, "is required", "expression.0"),
        (
            {"params": {"expression.1": "speed > 1"}},
            "is missing, but expression.1 is given",
            "expression.0",
        ),
        (
            {"params": {"expression.0": "speed > 1", "pass-on-false-port": "1"}},
            "declares 1 outputs but has 1 expressions plus the pass-on-false output: needs 2",
            "pass-on-false-port",
        ),
        (
            {"outputs": ["a", "b"], "params": {"expression.0": "speed > 1"}},
            "declares 2 outputs but has 1 expressions: needs 1",
            None,
        ),
        (
            {"params": {"expression.0": "speed > 1", "pass-on-false-port": "maybe"}},
            "0/1 or true/false",
            "pass-on-false-port",
        ),
        (
            {"params": {"expression.0": "speed > 1", "predicate": "x"}},
            "unknown parameter for a box of type filter (known: pass-on-false-port, expression.N)",
            "predicate",
        ),
        (
            {"params": {"expression.0": "reflect('java.lang.Runtime', 'getRuntime')"}},
            "function 'reflect'",
            "expression.0",
        ),
    ],
)
def test_filter_errors(box: dict[str, Any], fragment: str, param: str | None) -> None:
    fails({"type": "filter", **box}, fragment, param)


def test_map() -> None:
    checked = check(
        {
            "type": "map",
            "params": {
                "expression.0": "car_id",
                "expression.1": "speed * 3.6",
                "output-field-name.1": "kmh",
                "expression.2": "Seg",
            },
        }
    )
    spec = checked.boxes[0].spec
    assert isinstance(spec, MapSpec)
    assert [(n, e.sql) for n, e in spec.outputs] == [
        ("car_id", "`car_id`"),
        ("kmh", "`speed` * CAST(3.6 AS DOUBLE)"),
        ("seg", "`seg`"),
    ]
    assert fields(checked) == [("car_id", "int"), ("kmh", "double"), ("seg", "int")]


@pytest.mark.parametrize(
    ("params", "fragment", "param"),
    [
        (
            {"expression.0": "speed * 2"},
            "is required for an expression that is not a bare column",
            "output-field-name.0",
        ),
        (
            {"expression.0": "speed", "output-field-name.0": "1x"},
            "not an identifier",
            "output-field-name.0",
        ),
        (
            {"expression.0": "speed", "output-field-name.0": "__x"},
            "reserved",
            "output-field-name.0",
        ),
        (
            {"expression.0": "speed", "expression.1": "car_id", "output-field-name.1": "SPEED"},
            "produced twice",
            "output-field-name.1",
        ),
        (
            {"expression.0": "speed", "output-field-name.3": "x"},
            "has no matching expression.3",
            "output-field-name.3",
        ),
        (
            {"expression.0": "sum(speed)", "output-field-name.0": "x"},
            "aggregate function 'sum'",
            "expression.0",
        ),
    ],
)
def test_map_errors(params: dict[str, str], fragment: str, param: str) -> None:
    fails({"type": "map", "params": params}, fragment, param)


def test_union() -> None:
    checked = check({"type": "union", "inputs": ["cars", "cars2"]})
    assert isinstance(checked.boxes[0].spec, UnionSpec)
    assert fields(checked) == [(f.name, f.type) for f in CARS.fields]
    assert checked.inputs == ("cars", "cars2")


def test_union_of_different_schemas_names_both_streams() -> None:
    error = fails({"type": "union", "inputs": ["cars", "tolls"]}, "input streams cars (")
    assert (
        "and tolls (seg int, toll double, t timestamp) must have identical fields" in error.message
    )
    assert error.details["stream"] == "tolls"
    fails({"type": "union", "inputs": ["cars"], "params": {"x": "1"}}, "known: none", "x")


def test_aggregate_over_timestamps() -> None:
    checked = check(
        {
            "type": "aggregate",
            "params": {
                "aggregate-function.0": "avg(speed)",
                "aggregate-function-output-name.0": "avg_speed",
                "aggregate-function.1": "count()",
                "aggregate-function.2": "count_distinct(car_id)",
                "aggregate-function.3": "sum(car_id)",
                "aggregate-function.4": "max(t)",
                "aggregate-function.5": "firstval(speed)",
                "aggregate-function.6": "lastval(car_id)",
                "aggregate-function.7": "MIN ( speed )",
                "aggregate-function.8": "count(*)",
                "window-size": "1 minute",
                "advance": "30 seconds",
                "order-on-field": "t",
                "group-by": "seg",
                "slack": "5",
            },
        }
    )
    spec = checked.boxes[0].spec
    assert spec == AggregateSpec(
        calls=(
            AggregateCall("avg", "speed", "avg_speed", "double"),
            AggregateCall("count", None, "agg_1", "long"),
            AggregateCall("count_distinct", "car_id", "agg_2", "long"),
            AggregateCall("sum", "car_id", "agg_3", "long"),
            AggregateCall("max", "t", "agg_4", "timestamp"),
            AggregateCall("firstval", "speed", "agg_5", "double"),
            AggregateCall("lastval", "car_id", "agg_6", "int"),
            AggregateCall("min", "speed", "agg_7", "double"),
            AggregateCall("count", None, "agg_8", "long"),
        ),
        window_by="VALUES",
        window_size=60.0,
        advance=30.0,
        order_on="t",
        group_by=("seg",),
        slack=5.0,
        order_type="timestamp",
    )
    assert fields(checked)[:4] == [
        ("window_start", "timestamp"),
        ("window_end", "timestamp"),
        ("seg", "int"),
        ("avg_speed", "double"),
    ]


def test_aggregate_tumbling_over_a_long_field_and_by_tuples() -> None:
    params = {"aggregate-function.0": "sum(speed)", "window-size": "10", "order-on-field": "seq"}
    spec = check({"type": "aggregate", "params": params}).boxes[0].spec
    assert isinstance(spec, AggregateSpec)
    assert (spec.window_size, spec.advance, spec.slack, spec.order_type) == (10, 10, 0, "long")
    assert spec.calls[0].output_type == "double"

    params = {
        "aggregate-function.0": "count()",
        "window-size": "5",
        "advance": "2",
        "window-size-by": "tuples",
        "slack": "1",
        "timeout": "-1",
    }
    checked = check({"type": "aggregate", "params": params})
    spec = checked.boxes[0].spec
    assert isinstance(spec, AggregateSpec)
    assert (spec.window_by, spec.order_on, spec.order_type, spec.slack) == (
        "TUPLES",
        None,
        "long",
        1,
    )
    assert fields(checked) == [("window_start", "long"), ("window_end", "long"), ("agg_0", "long")]


AGG = {"aggregate-function.0": "count()", "window-size": "60", "order-on-field": "t"}


@pytest.mark.parametrize(
    ("params", "fragment", "param"),
    [
        ({**AGG, "window-size": "abc"}, "must be seconds or an interval", "window-size"),
        ({**AGG, "window-size": "0"}, "must be positive", "window-size"),
        ({**AGG, "window-size": "-1 minute"}, "must be seconds or an interval", "window-size"),
        ({**AGG, "window-size": "nan"}, "finite", "window-size"),
        ({**AGG, "advance": "2 minutes"}, "must not exceed window-size (120 > 60)", "advance"),
        ({**AGG, "slack": "-1"}, "must be non-negative", "slack"),
        ({**AGG, "timeout": "1"}, "1 is not supported: a timeout closes windows", "timeout"),
        (
            {**AGG, "order-on-field": "speedo"},
            "unknown field 'speedo' (fields: car_id",
            "order-on-field",
        ),
        ({**AGG, "order-on-field": "car_id", "window-size": "1.5"}, "whole number", "window-size"),
        (
            {k: v for k, v in AGG.items() if k != "order-on-field"},
            "is required for VALUES windows",
            "order-on-field",
        ),
        ({k: v for k, v in AGG.items() if k != "window-size"}, "is required", "window-size"),
        ({**AGG, "window-size-by": "ROWS"}, "must be VALUES or TUPLES", "window-size-by"),
        ({**AGG, "window-size-by": "TUPLES", "window-size": "2.5"}, "whole number", "window-size"),
        ({**AGG, "group-by": "seg, nope"}, "unknown field 'nope'", "group-by"),
        ({**AGG, "group-by": "seg,,car_id"}, "empty entry", "group-by"),
        ({**AGG, "group-by": "seg, SEG"}, "twice", "group-by"),
        (
            {**AGG, "aggregate-function.0": "median(speed)"},
            "unknown aggregate function 'median'",
            "aggregate-function.0",
        ),
        ({**AGG, "aggregate-function.0": "sum(seg + 1)"}, "must look like", "aggregate-function.0"),
        ({**AGG, "aggregate-function.0": "sum()"}, "sum() needs a field", "aggregate-function.0"),
        (
            {**AGG, "aggregate-function.0": "avg(t)"},
            "field 't' is timestamp, needs double or int or long",
            "aggregate-function.0",
        ),
        (
            {**AGG, "aggregate-function.0": "max(nope)"},
            "unknown field 'nope'",
            "aggregate-function.0",
        ),
        (
            {**AGG, "aggregate-function-output-name.0": "window_end"},
            "clashes with a window field",
            "aggregate-function-output-name.0",
        ),
        (
            {**AGG, "group-by": "seg", "aggregate-function-output-name.0": "seg"},
            "clashes with a group-by field",
            "aggregate-function-output-name.0",
        ),
        (
            {**AGG, "aggregate-function.1": "count()", "aggregate-function-output-name.1": "agg_0"},
            "clashes with a previous aggregate",
            "aggregate-function-output-name.1",
        ),
        ({**AGG, "window": "1"}, "unknown parameter for a box of type aggregate", "window"),
    ],
)
def test_aggregate_errors(params: dict[str, str], fragment: str, param: str) -> None:
    fails({"type": "aggregate", "params": params}, fragment, param)


JOIN = {
    "predicate": "left.seg = right.seg",
    "left-order-on-field": "t",
    "right-order-on-field": "t",
    "left-buffer-size": "10",
    "right-buffer-size": "1 minute",
}


def test_join_with_default_outputs() -> None:
    checked = check({"type": "join", "inputs": ["cars", "tolls"], "params": JOIN})
    spec = checked.boxes[0].spec
    assert isinstance(spec, JoinSpec)
    assert spec.predicate is not None
    assert spec.predicate.sql == "`left`.`seg` = `right`.`seg`"
    assert (spec.left_order_on, spec.right_order_on) == ("t", "t")
    assert (spec.left_buffer, spec.right_buffer) == (10.0, 60.0)
    assert spec.out_fields[-3:] == (
        ("right.seg", "right_seg"),
        ("right.toll", "toll"),
        ("right.t", "right_t"),
    )
    assert fields(checked)[-3:] == [
        ("right_seg", "int"),
        ("toll", "double"),
        ("right_t", "timestamp"),
    ]


def test_join_with_chosen_outputs_and_no_predicate() -> None:
    params = {k: v for k, v in JOIN.items() if k != "predicate"}
    params |= {
        "out-field.0": "left.car_id",
        "out-field.1": "RIGHT.toll",
        "out-field-name.1": "price",
    }
    checked = check({"type": "join", "inputs": ["cars", "tolls"], "params": params})
    spec = checked.boxes[0].spec
    assert isinstance(spec, JoinSpec)
    assert spec.predicate is None
    assert spec.out_fields == (("left.car_id", "car_id"), ("right.toll", "price"))
    assert fields(checked) == [("car_id", "int"), ("price", "double")]


@pytest.mark.parametrize(
    ("params", "fragment", "param"),
    [
        (
            {**JOIN, "left-order-by": "TUPLES"},
            "TUPLES join buffers are not supported",
            "left-order-by",
        ),
        ({**JOIN, "right-order-by": "ROWS"}, "must be VALUES", "right-order-by"),
        ({**JOIN, "left-buffer-size": "0"}, "must be positive", "left-buffer-size"),
        (
            {k: v for k, v in JOIN.items() if k != "right-buffer-size"},
            "is required",
            "right-buffer-size",
        ),
        (
            {k: v for k, v in JOIN.items() if k != "left-order-on-field"},
            "is required",
            "left-order-on-field",
        ),
        (
            {**JOIN, "right-order-on-field": "seg"},
            "both must be timestamps or both numbers",
            "right-order-on-field",
        ),
        (
            {**JOIN, "left-order-on-field": "speedx"},
            "unknown field 'speedx'",
            "left-order-on-field",
        ),
        ({**JOIN, "predicate": "seg = 1"}, "column 'seg' is ambiguous", "predicate"),
        (
            {**JOIN, "predicate": "left.seg + right.seg"},
            "a join predicate must be bool, got int",
            "predicate",
        ),
        (
            {**JOIN, "out-field.0": "middle.seg"},
            "must be 'left.<field>' or 'right.<field>'",
            "out-field.0",
        ),
        ({**JOIN, "out-field.0": "left.nope"}, "unknown field 'nope'", "out-field.0"),
        (
            {**JOIN, "out-field.0": "left.seg", "out-field.1": "right.seg"},
            "output field 'seg' is produced twice",
            "out-field-name.1",
        ),
        ({**JOIN, "out-field-name.0": "x"}, "has no matching out-field.0", "out-field-name.0"),
    ],
)
def test_join_errors(params: dict[str, str], fragment: str, param: str) -> None:
    fails({"type": "join", "inputs": ["cars", "tolls"], "params": params}, fragment, param)


def test_bsort() -> None:
    checked = check(
        {"type": "bsort", "params": {"order-on": "seq", "slack": "3", "group-by": "seg"}}
    )
    assert checked.boxes[0].spec == BSortSpec("seq", 3, ("seg",))
    assert fields(checked) == [(f.name, f.type) for f in CARS.fields]
    spec = check({"type": "bsort", "params": {"order-on": "t"}}).boxes[0].spec
    assert spec == BSortSpec("t", 0, ())


@pytest.mark.parametrize(
    ("params", "fragment", "param"),
    [
        ({}, "is required", "order-on"),
        ({"order-on": "speed", "slack": "1.5"}, "whole number", "slack"),
        ({"order-on": "speed", "slack": "-1"}, "non-negative", "slack"),
        ({"order-on": "speed", "slack": "x"}, "must be a number", "slack"),
        ({"order-on": "car_id", "group-by": "nope"}, "unknown field 'nope'", "group-by"),
    ],
)
def test_bsort_errors(params: dict[str, str], fragment: str, param: str) -> None:
    fails({"type": "bsort", "params": params}, fragment, param)


def test_unknown_input_stream_is_named() -> None:
    error = fails(
        {"type": "map", "inputs": ["nowhere"], "params": {"expression.0": "x"}},
        "input stream nowhere does not exist",
    )
    assert error.details == {"query": "Q", "box": "b", "stream": "nowhere"}


def test_existing_output_stream_must_match() -> None:
    box = {"type": "map", "outputs": ["people"], "params": {"expression.0": "car_id"}}
    error = fails(
        box,
        "output stream people exists with fields (person_name string, person_id int) "
        "but the box produces (car_id int)",
    )
    assert error.details["stream"] == "people"
    matching = {**STREAMS, "out": Schema("ids", (Field("car_id", "int"),))}
    checked = check({"type": "map", "params": {"expression.0": "car_id"}}, matching)
    assert checked.stream_schemas["out"] is matching["out"]


def test_pipeline_inputs_outputs_and_intermediates() -> None:
    query = parse_query(
        {
            "name": "toll",
            "boxes": [
                {
                    "name": "notify",
                    "type": "join",
                    "inputs": ["fast", "segspeed"],
                    "outputs": ["bills"],
                    "params": {
                        "predicate": "left.seg = right.seg",
                        "left-order-on-field": "t",
                        "right-order-on-field": "window_end",
                        "left-buffer-size": "60",
                        "right-buffer-size": "60",
                        "out-field.0": "left.car_id",
                        "out-field.1": "right.avg_speed",
                    },
                },
                {
                    "name": "speeds",
                    "type": "aggregate",
                    "inputs": ["cars"],
                    "outputs": ["segspeed"],
                    "params": {
                        "aggregate-function.0": "avg(speed)",
                        "aggregate-function-output-name.0": "avg_speed",
                        "window-size": "60",
                        "order-on-field": "t",
                        "group-by": "seg",
                    },
                },
                {
                    "name": "moving",
                    "type": "filter",
                    "inputs": ["cars"],
                    "outputs": ["fast", "stopped"],
                    "params": {"expression.0": "speed > 0", "pass-on-false-port": "true"},
                },
            ],
        }
    )
    checked = check_query(query, STREAMS)
    assert [b.box.name for b in checked.boxes] == ["speeds", "moving", "notify"]
    assert checked.inputs == ("cars",)
    assert checked.outputs == ("stopped", "bills")
    assert set(checked.stream_schemas) == {"cars", "segspeed", "fast", "stopped", "bills"}
    assert fields(checked, "bills") == [("car_id", "int"), ("avg_speed", "double")]


def test_directly_built_queries_are_checked_too() -> None:
    from peer.model.query import Box, Query

    odd = Query("Q", (Box("b", "sort", ("cars",), ("out",), ()),))
    with pytest.raises(QueryError, match="unknown box type 'sort'"):
        check_query(odd, STREAMS)
    two = Query("Q", (Box("b", "map", ("cars",), ("x", "y"), (("expression.0", "seg"),)),))
    with pytest.raises(QueryError, match="takes 1 outputs, got 2"):
        check_query(two, STREAMS)
