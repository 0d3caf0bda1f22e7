"""The network-intrusion query of Medusa's SIGMOD demo, as boxes over connection records.

A monitor reports every connection attempt it sees on ``connections`` (source and destination
address, destination port, protocol, second). The query::

    connections --> inbound (filter) --> inbound_connections
                --> per_source (aggregate) --> source_activity
                --> label (map) --> labelled_activity
                --> flag (filter) --> intrusion_alerts

- ``inbound``: attempts on the monitored network, ``dst_ip LIKE '10.%'``;
- ``per_source``: per source address and 10 s tumbling window of ``t``: attempts
  (``count()``), distinct destination ports, hosts and protocols (``count_distinct``);
- ``label``: the window's fields plus ``kind``: ``scan`` when the source touched more than 10
  ports or more than 10 hosts, else ``flood`` when it made more than 20 attempts, else ``ok``;
- ``flag``: the suspicious windows, ``kind <> 'ok'``.

The classification is a map and one filter rather than Aurora's case-statement filter with a
``scan_alerts`` and a ``flood_alerts`` port because, at the time of writing, the engine loses
the tuples of every port but the first when such a filter runs behind an aggregate in the same
Spark query (each port re-plans the aggregate; Spark reuses the first copy's shuffle, and the
other copies never see a watermark, so their windows never close).

The generator mixes ordinary clients (a few attempts per window on web, mail and DNS ports of
a handful of servers), outbound traffic of the monitored hosts (which ``inbound`` drops), and
planted attackers: port scanners, host sweepers and floods (SSH brute force with pings),
each attack packed into one window so that it is flagged.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from peer.examples import Rows, compare, split_query, tumbling_windows, with_nodes

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

CONNECTION: dict[str, Any] = {
    "name": "connection",
    "fields": [
        {"name": "src_ip", "type": "string", "size": 15},
        {"name": "dst_ip", "type": "string", "size": 15},
        {"name": "dst_port", "type": "int"},
        {"name": "protocol", "type": "string", "size": 4},
        {"name": "t", "type": "long"},
    ],
}
SCHEMAS: list[dict[str, Any]] = [CONNECTION]
SOURCE_STREAMS: dict[str, str] = {"connections": "connection"}
OUTPUTS: tuple[str, ...] = ("intrusion_alerts",)
INTERMEDIATE: tuple[str, ...] = ("inbound_connections", "source_activity", "labelled_activity")

NETWORK = "10."  # the monitored network: destination addresses starting with this
WINDOW_S = 10
SCAN_PORTS = 10  # more distinct ports than this in a window: a port scan
SCAN_HOSTS = 10  # more distinct hosts than this in a window: a host sweep
FLOOD_ATTEMPTS = 20  # more attempts than this in a window (and no scan): a flood
FLUSH_AFTER_S = 3600

BOX_GROUPS: list[list[str]] = [["inbound"], ["per_source"], ["label", "flag"]]
STAGES: list[tuple[str, list[str]]] = [("", ["inbound", "per_source", "label", "flag"])]

_ACTIVITY = ["window_start", "window_end", "src_ip", "attempts", "ports", "hosts", "protocols"]
_BOXES: list[dict[str, Any]] = [
    {
        "name": "inbound",
        "type": "filter",
        "inputs": ["connections"],
        "outputs": ["inbound_connections"],
        "params": {"expression.0": f"dst_ip LIKE '{NETWORK}%'", "pass-on-false-port": "0"},
    },
    {
        "name": "per_source",
        "type": "aggregate",
        "inputs": ["inbound_connections"],
        "outputs": ["source_activity"],
        "params": {
            "aggregate-function.0": "count()",
            "aggregate-function-output-name.0": "attempts",
            "aggregate-function.1": "count_distinct(dst_port)",
            "aggregate-function-output-name.1": "ports",
            "aggregate-function.2": "count_distinct(dst_ip)",
            "aggregate-function-output-name.2": "hosts",
            "aggregate-function.3": "count_distinct(protocol)",
            "aggregate-function-output-name.3": "protocols",
            "window-size-by": "VALUES",
            "window-size": str(WINDOW_S),
            "advance": str(WINDOW_S),
            "order-on-field": "t",
            "group-by": "src_ip",
            "slack": "0",
        },
    },
    {
        "name": "label",
        "type": "map",
        "inputs": ["source_activity"],
        "outputs": ["labelled_activity"],
        "params": {
            **{f"expression.{i}": f for i, f in enumerate(_ACTIVITY)},
            **{f"output-field-name.{i}": f for i, f in enumerate(_ACTIVITY)},
            f"expression.{len(_ACTIVITY)}": (
                f"CASE WHEN ports > {SCAN_PORTS} OR hosts > {SCAN_HOSTS} THEN 'scan' "
                f"WHEN attempts > {FLOOD_ATTEMPTS} THEN 'flood' ELSE 'ok' END"
            ),
            f"output-field-name.{len(_ACTIVITY)}": "kind",
        },
    },
    {
        "name": "flag",
        "type": "filter",
        "inputs": ["labelled_activity"],
        "outputs": ["intrusion_alerts"],
        "params": {"expression.0": "kind <> 'ok'", "pass-on-false-port": "0"},
    },
]


def query(name: str = "intrusion", nodes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole query; ``nodes`` maps box names to the ``"node"`` each should run on."""
    return {"name": name, "boxes": with_nodes(_BOXES, nodes)}


def stages(name: str = "intrusion", nodes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The queries to run on one peer: here the whole query, which Spark runs fused."""
    return split_query(query(name, nodes), STAGES)


# -- generator ----------------------------------------------------------------------------------

_SERVICES = [(80, "tcp"), (443, "tcp"), (443, "tcp"), (25, "tcp"), (53, "udp"), (22, "tcp")]
_OUTSIDE = ["93.184.216.34", "142.250.74.46", "151.101.1.69", "8.8.8.8"]


def generate(
    seed: int = 0,
    seconds: int = 120,
    *,
    clients: int = 20,
    servers: int = 6,
    scanners: int = 1,
    sweepers: int = 1,
    floods: int = 1,
    flush: bool = True,
) -> dict[str, Rows]:
    """Connection records over ``seconds`` seconds, in event-time order.

    ``clients`` outside addresses each open a connection every 1-6 s to one of ``servers``
    monitored hosts (10.0.0.x) on a common service; monitored hosts open outbound connections
    too. Planted in one random window each: ``scanners`` sources probing 12-40 ports of one
    host, ``sweepers`` sources probing port 22 on 12-30 hosts of 10.0.1.x, and ``floods``
    sources making 21-60 SSH attempts mixed with pings on one host. With ``flush``, the stream
    ends with one inbound attempt ``FLUSH_AFTER_S`` after the end, from 0.0.0.0, which moves
    the watermark past every real window and is never reported.
    """
    if seconds < WINDOW_S or clients < 0 or servers < 1:
        raise ValueError(f"need seconds >= {WINDOW_S}, clients >= 0, servers >= 1")
    rng = random.Random(seed)
    hosts = [f"10.0.0.{i}" for i in range(1, servers + 1)]
    rows: list[tuple[int, int, dict[str, Any]]] = []  # (t, draw order, row): a stable sort

    def add(src: str, dst: str, port: int, protocol: str, t: int) -> None:
        row = {"src_ip": src, "dst_ip": dst, "dst_port": port, "protocol": protocol, "t": t}
        rows.append((t, len(rows), row))

    for c in range(clients):
        src = f"198.18.{c // 250}.{c % 250 + 1}"
        t = rng.randrange(6)
        while t < seconds:
            port, protocol = rng.choice(_SERVICES)
            add(src, rng.choice(hosts), port, protocol, t)
            t += rng.randrange(1, 7)
    for host in hosts:  # outbound traffic of the monitored hosts: not inbound
        for t in sorted(rng.sample(range(seconds), min(seconds, 8))):
            add(host, rng.choice(_OUTSIDE), rng.choice((53, 443)), "udp" if t % 2 else "tcp", t)
    windows = seconds // WINDOW_S

    def attack_times(count: int) -> list[int]:
        start = rng.randrange(windows) * WINDOW_S
        return sorted(start + rng.randrange(WINDOW_S) for _ in range(count))

    for i in range(scanners):
        src, target = f"203.0.113.{i + 1}", rng.choice(hosts)
        count = rng.randrange(SCAN_PORTS + 2, 41)
        ports = rng.sample(range(1, 1025), count)
        for port, t in zip(ports, attack_times(count), strict=True):
            add(src, target, port, "tcp", t)
    for i in range(sweepers):
        src = f"203.0.113.{101 + i}"
        count = rng.randrange(SCAN_HOSTS + 2, 31)
        targets = [f"10.0.1.{h}" for h in rng.sample(range(1, 255), count)]
        for dst, t in zip(targets, attack_times(count), strict=True):
            add(src, dst, 22, "tcp", t)
    for i in range(floods):
        src, target = f"198.51.100.{i + 1}", rng.choice(hosts)
        count = rng.randrange(FLOOD_ATTEMPTS + 1, 61)
        for t in attack_times(count):
            port, protocol = (0, "icmp") if rng.random() < 0.25 else (22, "tcp")
            add(src, target, port, protocol, t)
    rows.sort(key=lambda entry: (entry[0], entry[1]))
    out = [row for _, _, row in rows]
    if flush:
        last = seconds + FLUSH_AFTER_S
        out.append(
            {"src_ip": "0.0.0.0", "dst_ip": "10.0.0.0", "dst_port": 0, "protocol": "tcp", "t": last}
        )
    return {"connections": out}


# -- reference ----------------------------------------------------------------------------------


def reference_streams(inputs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Rows]:
    """Every stream the query derives from ``inputs``, computed in plain Python."""
    inbound = [dict(r) for r in inputs.get("connections", []) if r["dst_ip"].startswith(NETWORK)]
    activity: Rows = []
    windows = tumbling_windows(inbound, order="t", size=WINDOW_S, group_by=["src_ip"])
    for (start, src), members in windows.items():
        activity.append(
            {
                "window_start": start,
                "window_end": start + WINDOW_S,
                "src_ip": src,
                "attempts": len(members),
                "ports": len({m["dst_port"] for m in members}),
                "hosts": len({m["dst_ip"] for m in members}),
                "protocols": len({m["protocol"] for m in members}),
            }
        )
    labelled: Rows = []
    for row in activity:  # the first condition that holds names the kind
        if row["ports"] > SCAN_PORTS or row["hosts"] > SCAN_HOSTS:
            kind = "scan"
        elif row["attempts"] > FLOOD_ATTEMPTS:
            kind = "flood"
        else:
            kind = "ok"
        labelled.append({**row, "kind": kind})
    return {
        "inbound_connections": inbound,
        "source_activity": activity,
        "labelled_activity": labelled,
        "intrusion_alerts": [row for row in labelled if row["kind"] != "ok"],
    }


def reference(inputs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Rows]:
    """The expected rows of every output stream (:data:`OUTPUTS`) for ``inputs``."""
    every = reference_streams(inputs)
    return {stream: every[stream] for stream in OUTPUTS}
