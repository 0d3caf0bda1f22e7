"""The examples ``peer demo`` runs, and how their boxes are dealt to the participants.

Each :class:`Example` wraps one workload of :mod:`peer.examples` (schemas, query, seeded
generator, plain-Python reference) with what the demo needs besides: how much event time one
pushed batch covers, which output fields the live view shows, and how the size option reads.
The participants are named after the usual fictional companies (acme, globex, ...), and the
example's box groups are dealt to them round-robin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from peer.examples import Rows, intrusion, traffic

__all__ = ["EXAMPLES", "MAX_PEERS", "Example", "participant_names", "placement"]

PARTICIPANTS = ("acme", "globex", "initech", "umbrella", "hooli", "wonka", "tyrell", "soylent")
MAX_PEERS = 8


@dataclasses.dataclass(frozen=True)
class Example:
    name: str
    module: ModuleType
    title: str
    batch_s: int  # event-time seconds per pushed batch
    generate: Callable[[int, int, int], dict[str, Rows]]  # (seed, size, minutes)
    show: Mapping[str, Sequence[str]]  # output stream -> fields shown live
    size_name: str
    # output stream -> (which of its tuples the live view shows, what that means)
    show_only: Mapping[str, tuple[Callable[[Mapping[str, Any]], bool], str]] = dataclasses.field(
        default_factory=dict
    )


def _traffic(seed: int, size: int, minutes: int) -> dict[str, Rows]:
    return traffic.generate(seed, cars=size, minutes=minutes)


def _intrusion(seed: int, size: int, minutes: int) -> dict[str, Rows]:
    attacks = max(1, minutes // 2)
    return intrusion.generate(
        seed,
        seconds=minutes * 60,
        clients=size,
        scanners=attacks,
        sweepers=attacks,
        floods=attacks,
    )


EXAMPLES: dict[str, Example] = {
    "traffic": Example(
        "traffic",
        traffic,
        "Medusa's traffic query: segment statistics and tolls, toll notifications, tow trucks",
        30,
        _traffic,
        {
            "toll_notifications": ("car_id", "seg", "t", "speed", "toll"),
            "tow_dispatch": ("truck_id", "car_id", "seg", "truck_t", "car_t"),
        },
        "cars",
        {"toll_notifications": (lambda row: bool(row.get("toll")), "toll > 0")},
    ),
    "intrusion": Example(
        "intrusion",
        intrusion,
        "network intrusion (Medusa's SIGMOD demo): port scans, host sweeps and floods",
        10,
        _intrusion,
        {"intrusion_alerts": ("window_start", "src_ip", "kind", "attempts", "ports", "hosts")},
        "client hosts",
    ),
}


def participant_names(n: int) -> list[str]:
    return [PARTICIPANTS[i] if i < len(PARTICIPANTS) else f"org{i + 1}" for i in range(n)]


def placement(groups: Sequence[Sequence[str]], names: Sequence[str]) -> dict[str, str]:
    """Box name -> participant: the example's box groups dealt to ``names`` round-robin."""
    return {box: names[i % len(names)] for i, group in enumerate(groups) for box in group}
