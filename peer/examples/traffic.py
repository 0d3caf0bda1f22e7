"""Medusa's traffic query (figure 1 of the Medusa paper), as boxes over two streams.

Cars on a ring road of ``segments`` one-mile segments report their position every 30 s on
``car_positions``; tow trucks report on ``tow_trucks``. The query::

    car_positions --> per_minute (aggregate) --> segment_stats --> toll (map) --> segment_tolls
    car_positions --> moving (filter speed > 0) --> moving_cars
    segment_tolls + moving_cars --> bill (join on seg) --> toll_notifications
    car_positions --> stopped (filter speed = 0) --> stopped_cars
    tow_trucks + stopped_cars --> dispatch (join on seg) --> tow_dispatch

- ``per_minute``: per segment and 60 s tumbling window of ``t``, the average speed and the
  number of distinct cars (``count_distinct(car_id)``; a car reports twice a minute);
- ``toll``: the toll a car pays for driving on a segment in the minute after: 0 unless the
  segment was congested (average speed under 40 and more than 5 cars), then
  ``2 * (cars - 5)^2``; the toll tuple's ``t`` is the window's end, the first second it applies;
- ``bill``: every position report of a moving car in the minute ``[t, t + 60)`` after a toll
  tuple of its segment is billed that toll (left buffer 60: ``car.t - toll.t < 60``; right
  buffer 1: ``toll.t - car.t < 1``, i.e. ``car.t >= toll.t`` for whole seconds);
- ``dispatch``: a tow-truck report and a stopped-car report on the same segment less than 30 s
  apart (both buffers 30).

Spark cannot run a join downstream of a windowed aggregate in one streaming query (a
stream-stream join needs its own watermark on each input, and a watermark input that has not
seen a tuple yet holds the query's global watermark at zero, so the aggregate never emits and
the join never sees a toll). :data:`STAGES` therefore cuts the query between ``toll`` and
``bill``: on one peer, run :func:`stages` as two queries; spread over peers, keep ``per_minute``
and ``bill`` on different peers (as :data:`BOX_GROUPS` does).

Values are exact in binary floating point where the engine computes with them: speeds are
multiples of 0.5 mph, so window sums and averages are the same in Spark and in Python.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from peer.examples import Rows, band_join, compare, split_query, tumbling_windows, with_nodes

__all__ = [
    "BOX_GROUPS",
    "FLUSH_AFTER_S",
    "INTERMEDIATE",
    "OUTPUTS",
    "SCHEMAS",
    "SOURCE_STREAMS",
    "STAGES",
    "compare",
    "generate",
    "query",
    "reference",
    "reference_streams",
    "stages",
]

CAR_POSITION: dict[str, Any] = {
    "name": "car_position",
    "fields": [
        {"name": "car_id", "type": "int"},
        {"name": "seg", "type": "int"},
        {"name": "x", "type": "double"},
        {"name": "speed", "type": "double"},
        {"name": "t", "type": "long"},
    ],
}
TOW_TRUCK: dict[str, Any] = {
    "name": "tow_truck",
    "fields": [
        {"name": "truck_id", "type": "int"},
        {"name": "seg", "type": "int"},
        {"name": "x", "type": "double"},
        {"name": "t", "type": "long"},
    ],
}
SCHEMAS: list[dict[str, Any]] = [CAR_POSITION, TOW_TRUCK]
SOURCE_STREAMS: dict[str, str] = {"car_positions": "car_position", "tow_trucks": "tow_truck"}
OUTPUTS: tuple[str, ...] = ("toll_notifications", "tow_dispatch")
INTERMEDIATE: tuple[str, ...] = ("segment_stats", "segment_tolls", "moving_cars", "stopped_cars")

WINDOW_S = 60  # statistics per segment and minute
REPORT_S = 30  # every vehicle reports every 30 s
TOLL_SPEED = 40  # a segment is congested below this average speed ...
TOLL_FREE_CARS = 5  # ... with more cars than this in the minute
TOW_BOUND_S = 30  # a truck and a stopped car meet when their reports are < 30 s apart
FLUSH_AFTER_S = 3600  # the flush tuples come this long after the last real one

# One group per participant: statistics and tolls / billing / towing. per_minute and bill are
# apart, so no peer fuses a join behind the aggregate (see the module docstring).
BOX_GROUPS: list[list[str]] = [["per_minute", "toll"], ["moving", "bill"], ["stopped", "dispatch"]]
# The query cut for one peer: (query name suffix, boxes), run in this order.
STAGES: list[tuple[str, list[str]]] = [
    ("stats", ["per_minute", "toll"]),
    ("alerts", ["moving", "bill", "stopped", "dispatch"]),
]

_TOLL = (
    f"CASE WHEN avg_speed < {TOLL_SPEED} AND cars > {TOLL_FREE_CARS} "
    f"THEN 2 * (cars - {TOLL_FREE_CARS}) * (cars - {TOLL_FREE_CARS}) ELSE 0 END"
)

_BOXES: list[dict[str, Any]] = [
    {
        "name": "per_minute",
        "type": "aggregate",
        "inputs": ["car_positions"],
        "outputs": ["segment_stats"],
        "params": {
            "aggregate-function.0": "avg(speed)",
            "aggregate-function-output-name.0": "avg_speed",
            "aggregate-function.1": "count_distinct(car_id)",
            "aggregate-function-output-name.1": "cars",
            "window-size-by": "VALUES",
            "window-size": str(WINDOW_S),
            "advance": str(WINDOW_S),
            "order-on-field": "t",
            "group-by": "seg",
            "slack": "0",
        },
    },
    {
        "name": "toll",
        "type": "map",
        "inputs": ["segment_stats"],
        "outputs": ["segment_tolls"],
        "params": {
            "expression.0": "seg",
            "output-field-name.0": "seg",
            "expression.1": "window_end",
            "output-field-name.1": "t",
            "expression.2": "avg_speed",
            "output-field-name.2": "avg_speed",
            "expression.3": "cars",
            "output-field-name.3": "cars",
            "expression.4": _TOLL,
            "output-field-name.4": "toll",
        },
    },
    {
        "name": "moving",
        "type": "filter",
        "inputs": ["car_positions"],
        "outputs": ["moving_cars"],
        "params": {"expression.0": "speed > 0", "pass-on-false-port": "0"},
    },
    {
        "name": "bill",
        "type": "join",
        "inputs": ["segment_tolls", "moving_cars"],
        "outputs": ["toll_notifications"],
        "params": {
            "predicate": "left.seg = right.seg",
            "left-order-by": "VALUES",
            "left-order-on-field": "t",
            "right-order-by": "VALUES",
            "right-order-on-field": "t",
            "left-buffer-size": str(WINDOW_S),
            "right-buffer-size": "1",
            "out-field.0": "right.car_id",
            "out-field-name.0": "car_id",
            "out-field.1": "right.seg",
            "out-field-name.1": "seg",
            "out-field.2": "right.t",
            "out-field-name.2": "t",
            "out-field.3": "right.speed",
            "out-field-name.3": "speed",
            "out-field.4": "left.toll",
            "out-field-name.4": "toll",
        },
    },
    {
        "name": "stopped",
        "type": "filter",
        "inputs": ["car_positions"],
        "outputs": ["stopped_cars"],
        "params": {"expression.0": "speed = 0", "pass-on-false-port": "0"},
    },
    {
        "name": "dispatch",
        "type": "join",
        "inputs": ["tow_trucks", "stopped_cars"],
        "outputs": ["tow_dispatch"],
        "params": {
            "predicate": "left.seg = right.seg",
            "left-order-by": "VALUES",
            "left-order-on-field": "t",
            "right-order-by": "VALUES",
            "right-order-on-field": "t",
            "left-buffer-size": str(TOW_BOUND_S),
            "right-buffer-size": str(TOW_BOUND_S),
            "out-field.0": "left.truck_id",
            "out-field-name.0": "truck_id",
            "out-field.1": "right.car_id",
            "out-field-name.1": "car_id",
            "out-field.2": "right.seg",
            "out-field-name.2": "seg",
            "out-field.3": "left.x",
            "out-field-name.3": "truck_x",
            "out-field.4": "right.x",
            "out-field-name.4": "car_x",
            "out-field.5": "left.t",
            "out-field-name.5": "truck_t",
            "out-field.6": "right.t",
            "out-field-name.6": "car_t",
        },
    },
]


def query(name: str = "traffic", nodes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole query; ``nodes`` maps box names to the ``"node"`` each should run on."""
    return {"name": name, "boxes": with_nodes(_BOXES, nodes)}


def stages(name: str = "traffic", nodes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The query as the queries of :data:`STAGES` (``<name>_stats``, ``<name>_alerts``):
    create and start them in this order (the second reads ``segment_tolls``, which the first
    produces)."""
    return split_query(query(name, nodes), STAGES)


# -- generator ----------------------------------------------------------------------------------


def _speed(rng: random.Random, jammed: bool) -> float:
    # Multiples of 0.5 mph: exact in binary, so sums and averages have no rounding ties.
    return rng.randrange(10, 41) / 2 if jammed else rng.randrange(90, 151) / 2


def _advance(x: float, miles: float, segments: int) -> float:
    x = round(x + miles, 3)
    return round(x - segments, 3) if x >= segments else x


def generate(
    seed: int = 0,
    cars: int = 40,
    minutes: int = 5,
    *,
    segments: int = 8,
    jams: int = 1,
    breakdowns: int | None = None,
    trucks: int | None = None,
    flush: bool = True,
) -> dict[str, Rows]:
    """Car and tow-truck reports over ``minutes`` minutes, each stream in event-time order.

    Cars start anywhere on the ring and drive at 45-75 mph, at 5-20 mph on the ``jams``
    congested segments (cars pile up there, which makes tolls). ``breakdowns`` cars (default:
    one per 20 cars, at least one) stop for good at some point in the first third; tow truck
    ``k`` waits at a station one to two miles behind breakdown ``k``, leaves 30 s after it
    happens, drives to it at 60 mph and stays; trucks beyond the breakdowns stay at segment 0.
    ``trucks`` defaults to the number of breakdowns. With ``flush``, each stream ends with one
    tuple ``FLUSH_AFTER_S`` after the end, on a segment of its own (-1 for cars, -2 for
    trucks), that joins nothing and moves every watermark past every window.
    """
    if cars < 1 or minutes < 1 or segments < 2 or not 0 <= jams < segments:
        raise ValueError("need cars >= 1, minutes >= 1, segments >= 2, 0 <= jams < segments")
    rng = random.Random(seed)
    end = minutes * 60
    jammed = set(rng.sample(range(1, segments), jams))
    n_breaks = min(cars, max(1, cars // 20) if breakdowns is None else breakdowns)
    n_trucks = n_breaks if trucks is None else trucks
    broken = rng.sample(range(1, cars + 1), n_breaks)
    stops: list[tuple[int, float]] = []  # (first stopped report, x), per breakdown
    positions: Rows = []
    for car in range(1, cars + 1):
        t = rng.randrange(REPORT_S)
        x = round(rng.uniform(0, segments - 0.001), 3)
        breaks_at = rng.randrange(REPORT_S, max(REPORT_S + 1, end // 3)) if car in broken else None
        stopped = False
        while t < end:
            if breaks_at is not None and t >= breaks_at:
                if not stopped:
                    stopped = True
                    stops.append((t, x))
                speed = 0.0
            else:
                speed = _speed(rng, int(x) in jammed)
            positions.append({"car_id": car, "seg": int(x), "x": x, "speed": speed, "t": t})
            x = _advance(x, speed * REPORT_S / 3600, segments)
            t += REPORT_S
    stops.sort(key=lambda s: s[0])
    reports: Rows = []
    for truck in range(1, n_trucks + 1):
        t = rng.randrange(REPORT_S)
        target = stops[truck - 1] if truck <= len(stops) else None
        # A truck waits at a station one to two miles behind its breakdown (or at segment 0).
        behind = rng.randrange(2, 5) / 2
        x = 0.0 if target is None else _advance(target[1], segments - behind, segments)
        while t < end:
            reports.append({"truck_id": truck, "seg": int(x), "x": x, "t": t})
            if target is not None and t >= target[0] + REPORT_S and x != target[1]:
                gap = round((target[1] - x) % segments, 3)
                x = target[1] if gap <= 0.5 else _advance(x, 0.5, segments)
            t += REPORT_S
    positions.sort(key=lambda r: (r["t"], r["car_id"]))
    reports.sort(key=lambda r: (r["t"], r["truck_id"]))
    if flush:
        last = end + FLUSH_AFTER_S
        positions.append({"car_id": -1, "seg": -1, "x": -1.0, "speed": 1.0, "t": last})
        reports.append({"truck_id": -1, "seg": -2, "x": -2.0, "t": last})
    return {"car_positions": positions, "tow_trucks": reports}


# -- reference ----------------------------------------------------------------------------------


def reference_streams(inputs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Rows]:
    """Every stream the query derives from ``inputs``, computed in plain Python."""
    cars = [dict(r) for r in inputs.get("car_positions", [])]
    trucks = [dict(r) for r in inputs.get("tow_trucks", [])]

    stats: Rows = []
    windows = tumbling_windows(cars, order="t", size=WINDOW_S, group_by=["seg"])
    for (start, seg), members in windows.items():
        speeds = [m["speed"] for m in members]
        stats.append(
            {
                "window_start": start,
                "window_end": start + WINDOW_S,
                "seg": seg,
                "avg_speed": sum(speeds) / len(speeds),
                "cars": len({m["car_id"] for m in members}),
            }
        )
    tolls: Rows = []
    for s in stats:
        congested = s["avg_speed"] < TOLL_SPEED and s["cars"] > TOLL_FREE_CARS
        tolls.append(
            {
                "seg": s["seg"],
                "t": s["window_end"],
                "avg_speed": s["avg_speed"],
                "cars": s["cars"],
                "toll": 2 * (s["cars"] - TOLL_FREE_CARS) ** 2 if congested else 0,
            }
        )
    moving = [r for r in cars if r["speed"] > 0]
    stopped = [r for r in cars if r["speed"] == 0]
    bills = [
        {
            "car_id": c["car_id"],
            "seg": c["seg"],
            "t": c["t"],
            "speed": c["speed"],
            "toll": b["toll"],
        }
        for b, c in band_join(
            tolls,
            moving,
            left_key=lambda r: r["seg"],
            right_key=lambda r: r["seg"],
            left_order="t",
            right_order="t",
            left_buffer=WINDOW_S,
            right_buffer=1,
        )
    ]
    dispatch = [
        {
            "truck_id": k["truck_id"],
            "car_id": c["car_id"],
            "seg": c["seg"],
            "truck_x": k["x"],
            "car_x": c["x"],
            "truck_t": k["t"],
            "car_t": c["t"],
        }
        for k, c in band_join(
            trucks,
            stopped,
            left_key=lambda r: r["seg"],
            right_key=lambda r: r["seg"],
            left_order="t",
            right_order="t",
            left_buffer=TOW_BOUND_S,
            right_buffer=TOW_BOUND_S,
        )
    ]
    return {
        "segment_stats": stats,
        "segment_tolls": tolls,
        "moving_cars": moving,
        "stopped_cars": stopped,
        "toll_notifications": bills,
        "tow_dispatch": dispatch,
    }


def reference(inputs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Rows]:
    """The expected rows of every output stream (:data:`OUTPUTS`) for ``inputs``."""
    every = reference_streams(inputs)
    return {stream: every[stream] for stream in OUTPUTS}
