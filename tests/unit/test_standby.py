"""Warm standbys (peer.replication.standby), the pure parts: which fragments get one, what a
checkpoint's offset log says of a batch, how a standby names its results, and the query's
``standby`` parameter in JSON, XML, fragments and round trips. No Spark, no sockets."""

from __future__ import annotations

import datetime as dt
import io
import json
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.errors import QueryError
from peer.model.fragments import fragment_query
from peer.model.plan import check_query
from peer.model.query import parse_query, query_to_dict
from peer.model.schema import parse_schema
from peer.replication.result_identity import (
    Frontier,
    InputTuple,
    Published,
    Unnamed,
    WindowGroup,
    identity_rule,
)
from peer.replication.standby import StandbyRun, batch_marks, named, refusal, window_mark
from peer.storage.bundle import bundle, member
from peer.storage.spool_format import SEQ_COLUMN, SEQ_SHIFT

TICK = parse_schema(
    {"name": "tick", "fields": [{"name": n, "type": "int"} for n in ("k", "v", "t")]}
)
FILTER: dict[str, Any] = {
    "name": "keep",
    "type": "filter",
    "inputs": ["ticks"],
    "outputs": ["kept"],
    "params": {"expression.0": "v >= 0"},
}
WINDOW: dict[str, Any] = {
    "name": "per_key",
    "type": "aggregate",
    "inputs": ["kept"],
    "outputs": ["sums"],
    "params": {
        "aggregate-function.0": "sum(v)",
        "aggregate-function-output-name.0": "s",
        "window-size": "10",
        "advance": "10",
        "order-on-field": "t",
        "group-by": "k",
    },
}

JOIN: dict[str, Any] = {
    "name": "j",
    "type": "join",
    "inputs": ["ticks", "other"],
    "outputs": ["pairs"],
    "params": {
        "predicate": "left.k = right.k",
        "left-order-on-field": "t",
        "right-order-on-field": "t",
        "left-buffer-size": "5",
        "right-buffer-size": "5",
    },
}


def checked(boxes: list[dict[str, Any]], inputs: tuple[str, ...] = ("ticks",)) -> Any:
    query = parse_query({"name": "q", "boxes": boxes})
    return check_query(query, dict.fromkeys(inputs, TICK))


def why(boxes: list[dict[str, Any]], inputs: tuple[str, ...] = ("ticks",)) -> str | None:
    fragment = checked(boxes, inputs)
    return refusal(fragment, identity_rule(fragment))


def test_a_filtered_window_gets_a_standby_and_stateful_others_say_why_not() -> None:
    assert why([FILTER, WINDOW]) is None
    assert why([FILTER]) is None  # per-tuple over one input: named by the input tuple
    assert why([JOIN], ("ticks", "other")) is None  # named by both input tuples
    window_after = {**WINDOW, "inputs": ["pairs"]}
    said = why([JOIN, window_after], ("ticks", "other"))
    assert said is not None and "one aggregate or one join" in said
    tuples = {**WINDOW, "params": {**WINDOW["params"], "window-size-by": "TUPLES"}}
    assert why([FILTER, tuples]) is not None
    union = {"name": "u", "type": "union", "inputs": ["ticks", "other"], "outputs": ["both"]}
    said = why([union], ("ticks", "other"))
    assert said is not None and "route" in said
    other = {**FILTER, "name": "keep2", "inputs": ["other"], "outputs": ["kept2"]}
    assert why([FILTER, other], ("ticks", "other")) is None  # (offsets name their stream)


def offset_log(tmp_path: Path, batches: dict[int, str]) -> bytes:
    for batch, text in batches.items():
        (tmp_path / "offsets").mkdir(exist_ok=True)
        (tmp_path / "offsets" / str(batch)).write_text(text)
    return bundle(tmp_path)


def test_the_offset_log_gives_a_batchs_watermark_and_source_ends(tmp_path: Path) -> None:
    meta = {"batchWatermarkMs": 20_000, "batchTimestampMs": 5, "conf": {"a": "b"}}
    data = offset_log(tmp_path, {7: f'v1\n{json.dumps(meta)}\n{{"offset":41}}\n'})
    marks = batch_marks(data, 7)
    assert marks is not None and (marks.watermark_ms, marks.ends) == (20_000, ((None, 41),))
    assert marks.input_ends(("ticks",)) == {"ticks": 41}  # an unnamed source: the one input
    assert marks.input_ends(("ticks", "other")) == {}
    named_log = (
        f'v1\n{json.dumps(meta)}\n{{"offset":4,"stream":"b"}}\n{{"offset":9,"stream":"a"}}\n'
    )
    (tmp_path / "offsets" / "8").write_text(named_log)
    marks = batch_marks(bundle(tmp_path), 8)
    assert marks is not None and marks.input_ends(("a", "b")) == {"a": 9, "b": 4}
    assert batch_marks(data, 8) is None
    assert member(data, "offsets/7") is not None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "v1\n",
        "v1\nnot json\n",
        'v1\n{"batchTimestampMs": 1}\n',
        'v1\n{"batchWatermarkMs": "soon"}\n',
        'v1\n{"batchWatermarkMs": 1}\n{"offset": true}\n',
        'v1\n{"batchWatermarkMs": 1}\n[1]\n',
        'v1\n{"batchWatermarkMs": 1}\n{"offset": 1, "stream": 5}\n',
        'x\n{"batchWatermarkMs": 1}\n',
    ],
)
def test_a_hostile_offset_log_entry_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    data = offset_log(tmp_path, {3: text})
    with pytest.raises(ValueError, match="offset log entry 3"):
        batch_marks(data, 3)


def test_a_damaged_bundle_is_refused() -> None:
    with pytest.raises(ValueError, match="damaged"):
        member(b"PK\x03\x04 not a zip", "offsets/1")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("offsets/1", "x" * 100)
    with pytest.raises(ValueError, match="bytes"):
        member(out.getvalue(), "offsets/1", limit=10)


def test_window_marks_take_the_window_bounds_unit() -> None:
    assert window_mark(20_500, "long") == 20.5
    assert window_mark(20_000, "int") == 20  # 10 <= 20: the window [10, 20) is covered
    assert window_mark(0, "timestamp") == dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def test_a_standby_names_per_tuple_results_by_their_input_tuple_and_drops_seq() -> None:
    rule = identity_rule(checked([FILTER]))
    seqs = [(5 << SEQ_SHIFT) + 0, (5 << SEQ_SHIFT) + 1, (6 << SEQ_SHIFT) + 0]
    kept = pa.table({"k": [1, 2, 3], "v": [4, 5, 6], "t": [7, 8, 9], SEQ_COLUMN: seqs})
    table, names = named(rule, "kept", kept)  # type: ignore[arg-type]
    assert table.column_names == ["k", "v", "t"]
    assert [n.roots for n in names] == [
        (InputTuple("ticks", 5, 0),),
        (InputTuple("ticks", 5, 1),),
        (InputTuple("ticks", 6, 0),),
    ]
    published = Published.of({"kept": Frontier.of({"ticks": 6})})  # files through 5 hold
    assert [rule.covered(n, published) for n in names] == [True, True, False]  # type: ignore[union-attr]
    rule = identity_rule(checked([FILTER, WINDOW]))
    sums = pa.table({"window_start": [0, 10], "window_end": [10, 20], "k": [1, 1], "s": [3, 4]})
    table, names = named(rule, "sums", sums)  # type: ignore[arg-type]
    assert table.equals(sums)
    assert [n.roots for n in names] == [
        (WindowGroup("per_key", 0, 10, (1,)),),
        (WindowGroup("per_key", 10, 20, (1,)),),
    ]
    published = Published.of({"sums": Frontier.of(windows={"per_key": window_mark(15_000, "int")})})
    assert [rule.covered(n, published) for n in names] == [True, False]  # type: ignore[union-attr]


QUERY = {"name": "q", "boxes": [FILTER, WINDOW]}
XML = """
<query name="q">
  {param}
  <box name="keep" type="filter"><in stream="ticks"/><out stream="kept"/>
    <parameter name="expression.0" value="v &gt;= 0"/></box>
  <box name="per_key" type="aggregate"><in stream="kept"/><out stream="sums"/>
    <parameter name="aggregate-function.0" value="sum(v)"/>
    <parameter name="aggregate-function-output-name.0" value="s"/>
    <parameter name="window-size" value="10"/><parameter name="advance" value="10"/>
    <parameter name="order-on-field" value="t"/><parameter name="group-by" value="k"/></box>
</query>
"""


@pytest.mark.parametrize(("given", "xml"), [(True, "1"), (False, "0"), (True, "true")])
def test_json_and_xml_ask_for_a_standby_alike(given: bool, xml: str) -> None:
    from_json = parse_query({**QUERY, "standby": given})
    from_xml = parse_query(XML.format(param=f'<parameter name="standby" value="{xml}"/>'))
    assert from_json.standby is given and from_json == from_xml
    again = parse_query(json.dumps(query_to_dict(from_json)))
    assert again == from_json
    fragments = fragment_query(from_json, default=lambda _s: "n", resolve=lambda n, _s: n)
    assert all(f.as_query().standby is given for f in fragments)
    unsaid = parse_query(XML.format(param=""))
    assert unsaid.standby is None and "standby" not in query_to_dict(unsaid)


@pytest.mark.parametrize("bad", [1, 0, "yes", "true", [True], {}])
def test_a_bad_json_standby_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(QueryError, match="standby must be true or false"):
        parse_query({**QUERY, "standby": bad})


@pytest.mark.parametrize("bad", ["yes", "2", "", "on"])
def test_a_bad_xml_standby_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(QueryError, match="standby must be true or false"):
        parse_query(XML.format(param=f'<parameter name="standby" value="{bad}"/>'))
    twice = '<parameter name="standby" value="1"/><parameter name="standby" value="0"/>'
    with pytest.raises(QueryError, match="given twice"):
        parse_query(XML.format(param=twice))


# -- a standby's run: hold, trim, promote (Hypothesis over batch boundaries) --------------------

FILES = 12  # input spool files 0..11, ROWS rows each; the filter keeps rows with v >= 0


def boundaries(draw: st.DrawFn) -> list[int]:
    """Batch ends (last offset of each batch) of one run over FILES files."""
    cuts = draw(st.sets(st.integers(0, FILES - 2), max_size=FILES - 1))
    return [*sorted(cuts), FILES - 1]


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "primary": boundaries(draw),
        "standby": boundaries(draw),
        "rows": draw(st.lists(st.integers(0, 3), min_size=FILES, max_size=FILES)),
        "signs": draw(st.lists(st.booleans(), min_size=FILES * 3, max_size=FILES * 3)),
        "published": draw(st.integers(0, FILES)),  # primary batches whose results are in
        "ran": draw(st.integers(0, FILES)),  # standby batches run before promotion
        "trims": draw(st.lists(st.integers(0, FILES), max_size=3)),
    }


def kept_part(run: dict[str, Any], first: int, last: int) -> pa.Table:
    """The filter's results of files first..last, with __seq (a standby compiled with
    lineage)."""
    k, v, seq = [], [], []
    for offset in range(first, last + 1):
        for row in range(run["rows"][offset]):
            keep = run["signs"][(offset * 3 + row) % len(run["signs"])]
            if keep:
                k.append(offset)
                v.append(row)
                seq.append((offset << SEQ_SHIFT) + row)
    return pa.table(
        {"k": pa.array(k, pa.int32()), "v": pa.array(v, pa.int32()), "t": pa.array(v, pa.int32()),
         SEQ_COLUMN: pa.array(seq, pa.int64())}
    )  # fmt: skip


def rows_of(rule: Any, table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.values()) for r in named(rule, "kept", table)[0].to_pylist())


def frontier_after(ends: list[int], batches: int) -> Published:
    if batches == 0:
        return Published.of()
    return Published.of({"kept": Frontier.of({"ticks": ends[batches - 1] + 1})})


@settings(max_examples=300, deadline=None)
@given(run=runs())
def test_a_promoted_standby_completes_the_primarys_results_exactly_once(
    run: dict[str, Any],
) -> None:
    rule = identity_rule(checked([FILTER]))
    assert not isinstance(rule, Unnamed)
    standby = StandbyRun("q", "ticks", (1,), "standby-x", checked([FILTER]), rule, {})
    every = Counter(
        tuple(r.values()) for r in named(rule, "kept", kept_part(run, 0, FILES - 1))[0].to_pylist()
    )
    # what the primary published: its first `published` batches
    pends = run["primary"][: run["published"]]
    out: Counter[tuple[Any, ...]] = Counter()
    if pends:
        out.update(
            tuple(r.values())
            for r in named(rule, "kept", kept_part(run, 0, pends[-1]))[0].to_pylist()
        )
    sends = run["standby"]
    ran = min(run["ran"], len(sends))
    trims = sorted(min(t, run["published"], len(run["primary"])) for t in run["trims"])
    first = 0
    for seq, end in enumerate(sends[:ran]):
        table, names = named(rule, "kept", kept_part(run, first, end))
        assert standby.take("kept", seq, table, names, float(seq)) is None  # held
        first = end + 1
        if trims and seq % 2:
            standby.trim(frontier_after(run["primary"], trims.pop(0)))
    for part in standby.promote(frontier_after(run["primary"], len(pends))):
        out.update(tuple(r.values()) for r in part.table.to_pylist())
    for seq, end in enumerate(sends[ran:], start=ran):
        table, names = named(rule, "kept", kept_part(run, first, end))
        passed = standby.take("kept", seq, table, names, float(seq))
        assert passed is not None
        out.update(tuple(r.values()) for r in passed.to_pylist())
        first = end + 1
    assert out == every  # none lost, none twice
    assert standby.held == [] and standby.batches == len(sends)


def test_a_standby_names_a_join_result_by_both_input_tuples() -> None:
    rule = identity_rule(checked([JOIN], ("ticks", "other")))
    assert not isinstance(rule, Unnamed)
    out = rule.paths("pairs")
    assert len(out) == 1
    fields = {f: [1] for f in checked([JOIN], ("ticks", "other")).stream_schemas["pairs"].names}
    table = pa.table(
        {
            **fields,
            "__lineage0_seq": [(3 << SEQ_SHIFT) + 2],
            "__lineage1_seq": [(7 << SEQ_SHIFT) + 0],
        }
    )
    plain, names = named(rule, "pairs", table)
    assert plain.column_names == list(fields)
    assert names[0].roots == (InputTuple("ticks", 3, 2), InputTuple("other", 7, 0))
    both = Published.of({"pairs": Frontier.of({"ticks": 4, "other": 8})})
    one = Published.of({"pairs": Frontier.of({"ticks": 4, "other": 7})})
    assert rule.covered(names[0], both) and not rule.covered(names[0], one)
