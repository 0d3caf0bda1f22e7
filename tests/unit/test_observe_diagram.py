"""The dashboard's query diagram (peer.observe.diagram) without sockets or a JVM: boxes marked
with the peer whose status lists them, arrows from each stream's maker to its readers with the
stream's rate, a moved fragment drawn on its new peer, and hostile views skipped, never raised.

Expectations are built here from the federation the test describes (which peer runs which
fragment, what was pushed where), by a different route than the module's: pairs of boxes
compared directly for the arrows, sums written out for the rates."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from peer.observe.diagram import SHORT_ID, Diagram, QueryGraph, query_diagram

ALPHA = "a1" * 20
BETA = "b2" * 20
GAMMA = "c3" * 20
PARTICIPANT = {ALPHA: "alpha", BETA: "beta", GAMMA: "gamma"}


@dataclass(frozen=True)
class Box:
    name: str
    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
        }


# query "trips": two fragments; "fares" reads trips' result and pushes of its own
CLEAN = Box("clean", "filter", ("rides",), ("clean_rides",))
COUNT = Box("count", "aggregate", ("clean_rides",), ("per_zone",))
TOP = Box("top", "bsort", ("per_zone",), ("top_zones",))
PRICE = Box("price", "map", ("fares_in",), ("priced",))
JOIN = Box("match", "join", ("priced", "top_zones"), ("matched", "unmatched"))
FRAGMENTS: dict[str, tuple[Box, ...]] = {
    "trips#0": (CLEAN, COUNT),
    "trips#1": (TOP,),
    "fares": (PRICE, JOIN),
}


def view(
    node: str,
    fragments: dict[str, str],
    *,
    in_rate: dict[str, Any] | None = None,
    stream_rate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A peer's observe answer: ``fragments`` maps each fragment it lists to its status."""
    queries = [
        {
            "name": name,
            "status": state,
            "active": state == "RUNNING",
            "boxes": [b.wire() for b in FRAGMENTS[name]],
        }
        for name, state in fragments.items()
    ]
    return {
        "node_id": node,
        "status": {"overlay": {"participant": PARTICIPANT[node]}, "queries": queries},
        "samples": [
            {"in_rate": {"rides": 999.0}, "stream_rate": {"top_zones": 999.0}},  # older
            {"in_rate": in_rate or {}, "stream_rate": stream_rate or {}, "out_rate": {"x": 1.0}},
        ],
    }


WRITTEN_ON_ALPHA = {"clean_rides": 8.0, "per_zone": 3.0, "priced": 2.5, "matched": 1.25}


def federation() -> list[dict[str, Any]]:
    return [
        view(
            ALPHA,
            {"trips#0": "RUNNING", "fares": "RUNNING"},
            in_rate={"rides": 10.0, "fares_in": 2.5},
            stream_rate=WRITTEN_ON_ALPHA,
        ),
        view(BETA, {"trips#1": "RUNNING"}, in_rate={"rides": 5.0}, stream_rate={"top_zones": 1.5}),
        {"node_id": GAMMA, "error": "no answer in time"},
    ]


def graphs(diagram: Diagram) -> dict[str, QueryGraph]:
    return {g["query"]: g for g in diagram["queries"]}


def marks(graph: QueryGraph) -> dict[str, tuple[str, str, str | None, str]]:
    return {
        b["box"]: (b["node_id"], b["peer"], b["participant"], b["fragment"]) for b in graph["boxes"]
    }


def expected_arrows(boxes: list[Box]) -> set[tuple[str, str, str]]:
    """Every (source, target, stream) of a query, box pair by box pair."""
    made = {s for b in boxes for s in b.outputs}
    read = {s for b in boxes for s in b.inputs}
    out = set()
    for maker in boxes:
        for reader in boxes:
            for stream in set(maker.outputs) & set(reader.inputs):
                out.add((f"box:{maker.name}", f"box:{reader.name}", stream))
    for box in boxes:
        out |= {(f"stream:{s}", f"box:{box.name}", s) for s in box.inputs if s not in made}
        out |= {(f"box:{box.name}", f"stream:{s}", s) for s in box.outputs if s not in read}
    return out


def test_each_box_is_marked_with_the_peer_that_lists_its_fragment() -> None:
    found = graphs(query_diagram(federation()))
    assert set(found) == {"trips", "fares"}
    placement = {"trips#0": ALPHA, "trips#1": BETA, "fares": ALPHA}
    for query, graph in found.items():
        expected = {
            box.name: (node, node[:SHORT_ID], PARTICIPANT[node], fragment)
            for fragment, node in placement.items()
            if fragment.split("#")[0] == query
            for box in FRAGMENTS[fragment]
        }
        assert marks(graph) == expected
        assert all(b["running"] for b in graph["boxes"])


def test_arrows_join_each_stream_maker_to_its_readers_with_the_stream_rate() -> None:
    found = graphs(query_diagram(federation()))
    trips = [*FRAGMENTS["trips#0"], *FRAGMENTS["trips#1"]]
    for query, boxes in (("trips", trips), ("fares", list(FRAGMENTS["fares"]))):
        arrows = found[query]["arrows"]
        assert {(a["source"], a["target"], a["stream"]) for a in arrows} == expected_arrows(boxes)
    rates = {a["stream"]: a["rate"] for g in found.values() for a in g["arrows"]}
    # pushes through alpha and beta add up (the older samples are not counted)
    assert rates["rides"] == 10.0 + 5.0
    assert rates["fares_in"] == 2.5
    # what fragments wrote, where they run; fares reads trips' top_zones at beta's rate
    for stream, rate in WRITTEN_ON_ALPHA.items():
        assert rates[stream] == rate
    assert rates["top_zones"] == 1.5
    assert rates["unmatched"] is None  # measured by no peer: not zero
    ends = {(q, s["id"]): (s["role"], s["rate"]) for q, g in found.items() for s in g["streams"]}
    assert ends["trips", "stream:rides"] == ("input", 15.0)
    assert ends["trips", "stream:top_zones"] == ("result", 1.5)
    assert ends["fares", "stream:top_zones"] == ("input", 1.5)
    assert ends["fares", "stream:matched"] == ("result", 1.25)
    assert ends["fares", "stream:unmatched"] == ("result", None)
    assert len(ends) == 6  # rides, top_zones; fares_in, top_zones, matched, unmatched


def test_columns_follow_the_arrows_and_rows_do_not_collide() -> None:
    for graph in query_diagram(federation())["queries"]:
        nodes = [*graph["boxes"], *graph["streams"]]
        column = {n["id"]: n["column"] for n in nodes}
        for a in graph["arrows"]:
            assert column[a["source"]] < column[a["target"]], a
        places = [(n["column"], n["row"]) for n in nodes]
        assert len(set(places)) == len(places)
        assert graph["columns"] == 1 + max(column.values())
        assert graph["rows"] == max(n["row"] for n in nodes) + 1
        inputs = [s for s in graph["streams"] if s["role"] == "input"]
        assert {s["column"] for s in inputs} == {0}


def test_a_moved_fragment_is_drawn_on_its_new_peer_and_a_gone_peer_takes_its_boxes() -> None:
    before = federation()
    after = [
        view(ALPHA, {"trips#0": "RUNNING"}, stream_rate={"matched": 0.0}),  # its last tuples
        view(BETA, {"trips#1": "RUNNING", "fares": "RUNNING"}, stream_rate={"matched": 3.0}),
    ]
    assert marks(graphs(query_diagram(before))["fares"])["match"][0] == ALPHA
    moved = graphs(query_diagram(after))["fares"]
    assert marks(moved)["match"][0] == BETA
    assert {a["rate"] for a in moved["arrows"] if a["stream"] == "matched"} == {0.0 + 3.0}
    # while it moves both list it: it is drawn where it runs, whichever peer comes first
    moving = [
        view(ALPHA, {"trips#0": "RUNNING", "fares": "STOPPED"}),
        view(BETA, {"trips#1": "RUNNING", "fares": "RUNNING"}),
    ]
    for views in (moving, moving[::-1]):
        assert marks(graphs(query_diagram(views))["fares"])["match"][0] == BETA
    # beta leaves: its fragments are no longer drawn; trips' reader of top_zones has no maker
    gone = graphs(query_diagram([after[0]]))
    assert set(gone) == {"trips"}
    assert set(marks(gone["trips"])) == {b.name for b in FRAGMENTS["trips#0"]}


HOSTILE: list[object] = [
    None,
    "peers",
    42,
    {"node_id": 7, "status": {"queries": [{"name": "x", "boxes": [CLEAN.wire()]}]}},
    {"node_id": BETA, "status": "up"},
    {"node_id": BETA, "status": {"queries": {"name": "x"}}},
    {"node_id": BETA, "status": {"queries": [None, 3, {"name": 5}, {"name": "x", "boxes": 1}]}},
    {
        "node_id": GAMMA,
        "status": {
            "overlay": ["not", "a", "map"],
            "queries": [
                {
                    "name": "bad",
                    "status": "RUNNING",
                    "boxes": [
                        {"name": "n1", "type": "map", "inputs": "s", "outputs": ["o"]},
                        {"name": "n2", "type": "map", "inputs": [1], "outputs": ["o"]},
                        {"name": "", "type": "map", "inputs": ["s"], "outputs": ["o"]},
                        {"name": "n3", "type": None, "inputs": ["s"], "outputs": ["o"]},
                        {"name": "n4", "type": "map", "inputs": ["s"]},
                        "box",
                    ],
                },
                # boxes feeding each other in a loop, and one feeding itself
                {
                    "name": "loop",
                    "boxes": [
                        {"name": "l1", "type": "map", "inputs": ["b"], "outputs": ["a"]},
                        {"name": "l2", "type": "map", "inputs": ["a"], "outputs": ["b"]},
                        {"name": "l3", "type": "map", "inputs": ["c"], "outputs": ["c"]},
                    ],
                },
            ],
        },
        "samples": [
            {
                "in_rate": {"rides": math.nan, "fares_in": -1, "x": True, "y": "9", 5: 1.0},
                "stream_rate": {"top_zones": math.inf, "unmatched": None},
            }
        ],
    },
    {"node_id": GAMMA, "status": {"queries": []}, "samples": "many"},
    {"node_id": GAMMA, "status": {"queries": []}, "samples": [None]},
]


def test_hostile_views_are_skipped_and_the_good_ones_still_drawn() -> None:
    good = federation()
    diagram = query_diagram([*HOSTILE, *good])
    json.dumps(diagram, allow_nan=False)  # what the dashboard is sent
    found = graphs(diagram)
    clean = graphs(query_diagram(good))
    for query in ("trips", "fares"):
        assert marks(found[query]) == marks(clean[query])
        rates = {a["stream"]: a["rate"] for a in found[query]["arrows"]}
        assert rates == {a["stream"]: a["rate"] for a in clean[query]["arrows"]}
    assert "bad" not in found  # no box of it was whole
    loop = found["loop"]
    assert {b["box"] for b in loop["boxes"]} == {"l1", "l2", "l3"}
    assert {(a["source"], a["target"]) for a in loop["arrows"]} == {
        ("box:l1", "box:l2"),
        ("box:l2", "box:l1"),
        ("box:l3", "box:l3"),
    }
    for views in (None, "x", {"peers": good}, [None], []):
        assert query_diagram(views) == {"queries": []}  # type: ignore[arg-type]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=40,
)
NEAR_VIEW = st.fixed_dictionaries(
    {
        "node_id": st.sampled_from([ALPHA, BETA]) | JSONISH,
        "status": st.fixed_dictionaries(
            {"queries": st.lists(st.fixed_dictionaries({"name": JSONISH, "boxes": JSONISH}))}
        )
        | JSONISH,
        "samples": st.lists(st.dictionaries(st.sampled_from(["in_rate", "out_rate"]), JSONISH))
        | JSONISH,
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(NEAR_VIEW | JSONISH, max_size=4))
def test_any_view_is_drawn_or_skipped_never_raised(views: list[object]) -> None:
    json.dumps(query_diagram(views), allow_nan=False)
