#!/usr/bin/env python3
"""Simulation of the bounded-price mechanism on a federation of many nodes (Medusa, NSDI'04).

Usage (from the repository root)::

    .venv/bin/python scripts/bpm_sim.py                 # 995 nodes, full sweep, plots, ~3 min
    .venv/bin/python scripts/bpm_sim.py --quick         # 200 nodes, fewer points, seconds
    .venv/bin/python scripts/bpm_sim.py --seeds 5 --json bpm.json
    .venv/bin/python scripts/bpm_sim.py --replot bpm.json   # tables and plots again, no runs

Every decision is made by ``contracts.bpm`` (``choose_offer``, ``accept``,
``remember_outcome``), the code a peer's brain runs; this script only keeps the books.

The federation
--------------
``--nodes`` nodes of capacity 1.0. Contracts are symmetric and join random pairs until every
node has at least C of them (so a node has C or C + 1: 995 nodes cannot all have an odd number).
Each contract's price is drawn uniformly from ``base * [1 - W/2, 1 + W/2]``: W = 0 gives every
contract the same fixed price. ``base`` is the marginal cost at ``--operating-util`` (0.95
gives 400 per unit load), the load level at which a node starts to shed and stops taking load:
what the contracts call capacity. It sits below saturation (u = 1) by about one box, so that the
last box a node takes does not put it over. Contracts cover every box kind.

A node's load is made of boxes with loads uniform in ``--box-load`` (0.005-0.05). In a
scenario with total load T (a fraction of total capacity), a fraction of the nodes is "hot",
with load uniform in [1, hot_max]; the others share the rest, uniformly spread around their mean.

Rounds
------
In each round the nodes act in a fresh random order. A node that has not yet taken part in a
move this round asks ``choose_offer`` for one offer; the partner answers with ``accept``, refusing
if it has already moved load this round. Each node thus makes at most one offer and takes part
in at most one move per round. ``remember_outcome`` keeps each node's refusal memory. The run
stops at a quiescent allocation, where no contract pair could trade any more (checked with the
same two functions), or at ``--max-rounds``.

Measured after each round: total excess load (sum of max(0, u - 1)), overloaded nodes (u > 1),
moves. An allocation is *acceptable* (Medusa) when, if the federation has capacity
(total load < total capacity), no node is over capacity; otherwise when every node is at or
above capacity or *full*: it would refuse a box of the smallest size at the base price. A node
stops taking load at the load level its prices stand for, below saturation, so "at capacity"
means at that level; nodes under capacity that are not full are counted as "with room".
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts.bpm import (
    DEFAULT_CONFIG,
    Box,
    BpmConfig,
    ContractView,
    Offer,
    PeerState,
    accept,
    choose_offer,
    marginal_cost,
    remember_outcome,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    total_load: float  # fraction of total capacity
    hot_fraction: float  # fraction of nodes starting over capacity
    hot_max: float  # hot nodes' load is uniform in [1, hot_max]


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("moderate", 0.8, 0.2, 1.5),  # a fifth of the nodes up to 1.5x capacity
        Scenario("heavy", 0.8, 0.2, 2.0),  # the same nodes up to 2x capacity
        Scenario("tight", 0.9, 0.2, 1.5),  # less spare capacity to go round
        Scenario("overloaded", 1.1, 0.3, 2.5),  # more load than the federation's capacity
    )
}


@dataclass(frozen=True)
class RunSpec:
    scenario: Scenario
    nodes: int
    contracts: int
    width: float
    seed: int
    base_price: float
    box_load: tuple[float, float]
    max_rounds: int
    config: BpmConfig


@dataclass
class World:
    names: list[str]
    boxes: list[list[Box]]
    loads: list[float]
    views: list[list[ContractView]]  # each node's contracts
    view_of: list[dict[str, ContractView]]  # node -> partner name -> its view
    index: dict[str, int]
    base_price: float
    smallest_box: float  # the low end of the box load range (a node's last box may be less)
    refused: list[tuple[str, ...]] = field(default_factory=list)
    states: dict[int, PeerState] = field(default_factory=dict)  # cache, dropped on a move

    def state(self, i: int) -> PeerState:
        st = self.states.get(i)
        if st is None:
            st = self.states[i] = PeerState(self.loads[i], tuple(self.boxes[i]))
        return st


# --------------------------------------------------------------------------- building


def _node_loads(rng: random.Random, n: int, sc: Scenario) -> list[float]:
    hot = round(n * sc.hot_fraction)
    hot_loads = [rng.uniform(1.0, sc.hot_max) for _ in range(hot)]
    cool = n - hot
    mean = (sc.total_load * n - sum(hot_loads)) / cool
    if not 0 < mean < 1:
        raise SystemExit(f"scenario {sc.name}: the cool nodes would need mean load {mean:.2f}")
    lo, hi = max(0.0, 2 * mean - 1), min(1.0, 2 * mean)
    loads = hot_loads + [rng.uniform(lo, hi) for _ in range(cool)]
    rng.shuffle(loads)
    return loads


def _boxes(rng: random.Random, node: str, load: float, box_load: tuple[float, float]) -> list[Box]:
    out: list[Box] = []
    left = load
    while left > 1e-12:
        size = min(rng.uniform(*box_load), left)
        out.append(Box(f"{node}/b{len(out)}", "box", size))
        left -= size
    return out


def _contract_graph(rng: random.Random, n: int, c: int) -> list[set[int]]:
    """Random symmetric pairs until every node has at least ``c`` partners."""
    adj: list[set[int]] = [set() for _ in range(n)]
    needy = list(range(n))  # nodes with fewer than c partners
    order = list(range(n))
    rng.shuffle(order)
    for i in order:
        while len(adj[i]) < c:
            j = -1
            for _ in range(32):  # a random needy node, almost always found at once
                k = rng.choice(needy)
                if k != i and k not in adj[i]:
                    j = k
                    break
            if j < 0:  # the last few needy nodes: any node that is not a partner yet
                pool = [k for k in needy if k != i and k not in adj[i]]
                pool = pool or [k for k in range(n) if k != i and k not in adj[i]]
                j = rng.choice(pool)
            adj[i].add(j)
            adj[j].add(i)
            for k in (i, j):
                if len(adj[k]) == c:
                    needy.remove(k)
    return adj


def build(spec: RunSpec) -> World:
    n = spec.nodes
    names = [f"n{i}" for i in range(n)]
    # One seed gives the same loads for every C and W, and the same contract graph for every W.
    rng = random.Random(f"loads/{spec.scenario.name}/{n}/{spec.seed}")
    loads = _node_loads(rng, n, spec.scenario)
    boxes = [_boxes(rng, names[i], loads[i], spec.box_load) for i in range(n)]
    adj = _contract_graph(
        random.Random(f"graph/{n}/{spec.contracts}/{spec.seed}"), n, spec.contracts
    )
    # The same draws for every W: a contract's price moves away from the base as W grows.
    price_rng = random.Random(f"prices/{n}/{spec.contracts}/{spec.seed}")
    view_of: list[dict[str, ContractView]] = [{} for _ in range(n)]
    for i in range(n):
        for j in sorted(adj[i]):
            if j > i:
                price = spec.base_price * (1 + spec.width * (price_rng.random() - 0.5))
                view_of[i][names[j]] = ContractView(names[j], price)
                view_of[j][names[i]] = ContractView(names[i], price)
    return World(
        names=names,
        boxes=boxes,
        loads=[math.fsum(b.load for b in bs) for bs in boxes],
        views=[list(v.values()) for v in view_of],
        view_of=view_of,
        index={name: i for i, name in enumerate(names)},
        base_price=spec.base_price,
        smallest_box=spec.box_load[0],
        refused=[() for _ in range(n)],
    )


# --------------------------------------------------------------------------- running


def _full(world: World, i: int, config: BpmConfig) -> bool:
    """Would node i refuse a box of the smallest size at the base price?

    The base price stands for the load level the federation calls capacity in its contracts
    (``--operating-util``); contracts priced around it put single nodes a little above or below.
    """
    view = ContractView("probe", world.base_price)
    probe = Offer("probe", world.base_price, (Box("probe", "box", world.smallest_box),), math.inf)
    return not accept(world.state(i), probe, view, config=config)


def snapshot(world: World, config: BpmConfig, overloaded_federation: bool) -> dict[str, Any]:
    """Excess load, nodes over capacity, and (only if the federation is overloaded) the nodes
    under capacity that still have room: an acceptable allocation has none of either kind."""
    over = [u - 1.0 for u in world.loads if u > 1.0 + 1e-9]
    room = None
    if overloaded_federation:
        room = sum(1 for i, u in enumerate(world.loads) if u < 1.0 and not _full(world, i, config))
    return {
        "excess": math.fsum(over),
        "overloaded": len(over),
        "with_room": room,
        "acceptable": room == 0 if overloaded_federation else not over,
    }


def quiescent(world: World, config: BpmConfig) -> bool:
    """No contract pair could trade: every offer any node could make would be refused.

    Each contract is tried with both kinds of offer ``choose_offer`` makes: the one for a partner
    that has not refused (largest boxes first) and the one for a partner that has.
    """
    cap = config.cost_cap_util
    for i in range(len(world.names)):
        for view in world.views[i]:
            j = world.index[view.partner]
            # A shortcut only: a partner already at the price refuses every offer, because no
            # set costs it less per unit than its marginal cost now (D is convex).
            if marginal_cost(world.loads[j], cap) >= view.price * (1 - config.accept_margin):
                continue
            taker = world.view_of[j][world.names[i]]
            for refused in ((), (view.partner,)):
                offer = choose_offer(
                    world.state(i), (view,), config=config, refused_or_failed=refused
                )
                if offer is None:
                    break
                if accept(world.state(j), offer, taker, config=config):
                    return False
    return True


def _move(world: World, i: int, j: int, boxes: tuple[Box, ...]) -> None:
    names = {b.name for b in boxes}
    world.boxes[i] = [b for b in world.boxes[i] if b.name not in names]
    world.boxes[j].extend(boxes)
    world.loads[i] = math.fsum(b.load for b in world.boxes[i])
    world.loads[j] = math.fsum(b.load for b in world.boxes[j])
    world.states.pop(i, None)
    world.states.pop(j, None)


def run(spec: RunSpec) -> dict[str, Any]:
    world = build(spec)
    config = spec.config
    n = spec.nodes
    total = math.fsum(world.loads)
    overloaded_federation = total >= n
    rng = random.Random(f"order/{spec.seed}")
    first = snapshot(world, config, overloaded_federation)
    series = [{"round": 0, "moves": 0, "offers": 0, **first}]
    load_moved = 0.0
    converged = False
    for rnd in range(1, spec.max_rounds + 1):
        order = list(range(n))
        rng.shuffle(order)
        busy = [False] * n  # took part in a move this round
        moves = offers = 0
        for i in order:
            if busy[i]:
                continue
            offer = choose_offer(
                world.state(i), world.views[i], config=config, refused_or_failed=world.refused[i]
            )
            if offer is None:
                continue
            offers += 1
            j = world.index[offer.partner]
            taker_view = world.view_of[j][world.names[i]]
            taken = accept(world.state(j), offer, taker_view, config=config, busy=busy[j])
            world.refused[i] = remember_outcome(
                world.refused[i], offer.partner, accepted=bool(taken)
            )
            if taken:
                _move(world, i, j, taken)
                busy[i] = busy[j] = True
                moves += 1
                load_moved += math.fsum(b.load for b in taken)
        series.append(
            {
                "round": rnd,
                "moves": moves,
                "offers": offers,
                **snapshot(world, config, overloaded_federation),
            }
        )
        if moves == 0 and quiescent(world, config):
            converged = True
            break
    last = series[-1]
    # The first round from which the allocation stays acceptable (a relay shedding load can
    # leave room under capacity again in an overloaded federation).
    reached = None
    for snap in reversed(series):
        if not snap["acceptable"]:
            break
        reached = snap["round"]
    return {
        "scenario": spec.scenario.name,
        "nodes": n,
        "contracts": spec.contracts,
        "width": spec.width,
        "seed": spec.seed,
        "total_load": total / n,
        "overloaded_federation": overloaded_federation,
        "initial_excess": first["excess"],
        "initial_overloaded": first["overloaded"],
        "final_excess": last["excess"],
        "final_overloaded": last["overloaded"],
        "final_with_room": last["with_room"],
        "acceptable": last["acceptable"],
        "rounds_to_acceptable": reached,
        "last_move_round": max((s["round"] for s in series if s["moves"] > 0), default=0),
        "rounds": last["round"],
        "converged": converged,
        "moves": sum(s["moves"] for s in series),
        "load_moved": load_moved,
        "max_load": max(world.loads),
        "series": series,
    }


# --------------------------------------------------------------------------- report


def _fmt(x: float) -> str:
    return f"{x:.3f}" if x >= 0.001 or x == 0 else f"{x:.1e}"


def summarise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int, float], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["scenario"], r["contracts"], r["width"]), []).append(r)
    rank = {name: k for k, name in enumerate(SCENARIOS)}
    rows = []
    for (sc, c, w), rs in sorted(groups.items(), key=lambda g: (rank.get(g[0][0], 99), g[0])):
        ok = [r for r in rs if r["acceptable"]]
        room = [r["final_with_room"] for r in rs if r["final_with_room"] is not None]
        rows.append(
            {
                "scenario": sc,
                "contracts": c,
                "width": w,
                "runs": len(rs),
                "total_load": statistics.mean(r["total_load"] for r in rs),
                "success": len(ok) / len(rs),
                "initial_excess": statistics.mean(r["initial_excess"] for r in rs),
                "final_excess": statistics.mean(r["final_excess"] for r in rs),
                "final_overloaded": statistics.mean(r["final_overloaded"] for r in rs),
                "final_with_room": statistics.mean(room) if room else None,
                "rounds_to_acceptable": (
                    statistics.median(r["rounds_to_acceptable"] for r in ok) if ok else None
                ),
                "last_move_round": statistics.median(r["last_move_round"] for r in rs),
                "moves": statistics.mean(r["moves"] for r in rs),
                "load_moved": statistics.mean(r["load_moved"] for r in rs),
                "converged": sum(r["converged"] for r in rs) / len(rs),
            }
        )
    return rows


def markdown_long(rows: list[dict[str, Any]]) -> str:
    """Every measure of every point, one row per (scenario, C, W)."""
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        rr = [r for r in rows if r["scenario"] == sc]
        overloaded = rr[0]["final_with_room"] is not None
        out.append(f"\n{sc} (total load {rr[0]['total_load']:.2f} of capacity):\n")
        header = [
            "C",
            "W",
            "acceptable",
            "final excess (initial)",
            "nodes over capacity",
            *(["nodes with room"] if overloaded else []),
            "rounds to acceptable",
            "rounds to last move",
            "moves",
            "load moved",
            "quiescent",
        ]
        out.append("| " + " | ".join(header) + " |")
        out.append("|---" * len(header) + "|")
        for r in rr:
            rta = r["rounds_to_acceptable"]
            room = f" | {r['final_with_room']:.1f}" if overloaded else ""
            out.append(
                f"| {r['contracts']} | {r['width']:g} | {r['success']:.0%} "
                f"| {_fmt(r['final_excess'])} ({r['initial_excess']:.1f}) "
                f"| {r['final_overloaded']:.1f}{room} | {'-' if rta is None else f'{rta:g}'} "
                f"| {r['last_move_round']:g} | {r['moves']:.0f} | {r['load_moved']:.1f} "
                f"| {r['converged']:.0%} |"
            )
    return "\n".join(out)


def _sig(x: float) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table per scenario: a row per C, a column per W."""
    out = []
    widths = sorted({r["width"] for r in rows})
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        rr = {(r["contracts"], r["width"]): r for r in rows if r["scenario"] == sc}
        first = next(iter(rr.values()))
        overloaded = first["final_with_room"] is not None
        spec = SCENARIOS.get(sc)
        where = (
            f"; {spec.hot_fraction:.0%} of the nodes start at 1-{spec.hot_max:g}x capacity"
            if spec
            else ""
        )
        out.append(
            f"\n**{sc}** (total load {first['total_load']:.2f} of capacity{where}; "
            f"initial excess {first['initial_excess']:.1f}). Each cell: "
            + ("nodes with room left" if overloaded else "runs ending acceptable")
            + " · final excess load · rounds to the last move · moves\n"
        )
        out.append("| C | " + " | ".join(f"W = {w:g}" for w in widths) + " |")
        out.append("|---" * (len(widths) + 1) + "|")
        for c in sorted({k[0] for k in rr}):
            cells = []
            for w in widths:
                r = rr.get((c, w))
                if r is None:
                    cells.append("")
                    continue
                head = f"{r['final_with_room']:.1f}" if overloaded else f"{r['success']:.0%}"
                cells.append(
                    f"{head} · {_sig(r['final_excess'])} · {r['last_move_round']:g} "
                    f"· {r['moves']:.0f}"
                )
            out.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _mean_series(rs: list[dict[str, Any]], key: str) -> list[float]:
    """Mean over runs, round by round; a run that has stopped keeps its last value."""
    length = max(len(r["series"]) for r in rs)
    return [
        statistics.mean(r["series"][min(t, len(r["series"]) - 1)][key] for r in rs)
        for t in range(length)
    ]


def plot(results: list[dict[str, Any]], rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    overloaded = {r["scenario"] for r in rows if r["final_with_room"] is not None}
    widths = sorted({r["width"] for r in rows})
    cs = sorted({r["contracts"] for r in rows})
    size = (4.2 * len(scenarios), 3.6)

    # Against rounds, a few C at the narrowest width: the excess load, or in an overloaded
    # federation the nodes that still have room.
    pick = [c for c in (1, 3, 5, 7, 10) if c in cs] or cs[:5]
    fig, axes = plt.subplots(1, len(scenarios), figsize=size, squeeze=False)
    for ax, sc in zip(axes[0], scenarios, strict=True):
        key = "with_room" if sc in overloaded else "excess"
        for k, c in enumerate(pick):
            rs = [
                r
                for r in results
                if r["scenario"] == sc and r["contracts"] == c and r["width"] == widths[0]
            ]
            if rs:
                mean = _mean_series(rs, key)
                ax.plot(range(len(mean)), mean, color=f"C{k}", label=f"C={c}")
        ax.set_title(
            f"{sc}: {'nodes with room' if sc in overloaded else 'total excess load'}, "
            f"W={widths[0]:g}",
            fontsize=10,
        )
        ax.set_xlabel("round")
        ax.set_ylabel(
            "nodes under capacity, not full" if sc in overloaded else "sum of max(0, u-1)"
        )
        ax.set_yscale("symlog", linthresh=1 if sc in overloaded else 0.01)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    convergence = out_dir / "bpm_convergence.png"
    fig.savefig(convergence, dpi=110)
    plt.close(fig)

    # Against contracts per node, one line per width: the final excess (nodes with room in an
    # overloaded federation) and the share of runs that end acceptable.
    fig, axes = plt.subplots(2, len(scenarios), figsize=(size[0], 6.4), squeeze=False)
    for col, sc in enumerate(scenarios):
        key = "final_with_room" if sc in overloaded else "final_excess"
        for k, w in enumerate(widths):
            rr = [r for r in rows if r["scenario"] == sc and r["width"] == w]
            xs = [r["contracts"] for r in rr]
            axes[0][col].plot(xs, [r[key] for r in rr], "o-", color=f"C{k}", label=f"W={w:g}")
            axes[1][col].plot(
                xs, [100 * r["success"] for r in rr], "o-", color=f"C{k}", label=f"W={w:g}"
            )
        axes[0][col].set_title(
            f"{sc}: {'nodes with room' if sc in overloaded else 'final excess load'}", fontsize=10
        )
        axes[0][col].set_yscale("symlog", linthresh=1 if sc in overloaded else 0.01)
        axes[1][col].set_title(f"{sc}: runs ending acceptable", fontsize=10)
        axes[1][col].set_ylabel("%")
        axes[1][col].set_ylim(-5, 105)
        for row in (0, 1):
            axes[row][col].set_xlabel("contracts per node (minimum)")
            axes[row][col].set_xticks(cs)
            axes[row][col].grid(alpha=0.3)
        axes[0][col].legend(fontsize=8)
    fig.tight_layout()
    contracts = out_dir / "bpm_contracts.png"
    fig.savefig(contracts, dpi=110)
    plt.close(fig)
    return [convergence, contracts]


def machine() -> str:
    distro = "?"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                distro = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores, {distro}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


# --------------------------------------------------------------------------- main


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=995)
    p.add_argument("--seeds", type=int, default=3, help="runs per point")
    p.add_argument("--contracts", type=_ints, default=_ints("1-10"), help="e.g. 1-10 or 2,4,7")
    p.add_argument("--widths", type=_floats, default=_floats("0,0.1,0.25,0.5"))
    p.add_argument("--scenarios", help=f"comma-separated, of {','.join(SCENARIOS)} (all)")
    p.add_argument(
        "--operating-util",
        type=float,
        default=0.95,
        help="contract base price = marginal cost at this utilisation",
    )
    p.add_argument("--box-load", type=_floats, default=_floats("0.005,0.05"), help="min,max")
    p.add_argument("--max-rounds", type=int, default=100)
    p.add_argument("--offer-margin", type=float, default=DEFAULT_CONFIG.offer_margin)
    p.add_argument("--accept-margin", type=float, default=DEFAULT_CONFIG.accept_margin)
    p.add_argument("--max-offer-boxes", type=int, default=DEFAULT_CONFIG.max_offer_boxes)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--quick",
        action="store_true",
        help="200 nodes, 2 seeds, C in 1,2,4,7,10, W in 0,0.5, moderate and overloaded",
    )
    p.add_argument("--json", type=Path, help="write every run (with per-round series) here")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "img")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--long", action="store_true", help="print every measure of every point")
    p.add_argument(
        "--replot", type=Path, metavar="JSON", help="tables and plots from a --json file, no runs"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.seeds = min(args.nodes, 200), min(args.seeds, 2)
        args.contracts, args.widths = [1, 2, 4, 7, 10], [0.0, 0.5]
        args.scenarios = args.scenarios or "moderate,overloaded"
    args.scenarios = args.scenarios or ",".join(SCENARIOS)
    return args


def specs(args: argparse.Namespace) -> Iterator[RunSpec]:
    config = BpmConfig(
        offer_margin=args.offer_margin,
        accept_margin=args.accept_margin,
        max_offer_boxes=args.max_offer_boxes,
    )
    base = marginal_cost(args.operating_util, config.cost_cap_util)
    for name in args.scenarios.split(","):
        for c in args.contracts:
            for w in args.widths:
                for seed in range(args.seeds):
                    yield RunSpec(
                        scenario=SCENARIOS[name],
                        nodes=args.nodes,
                        contracts=c,
                        width=w,
                        seed=seed,
                        base_price=base,
                        box_load=(args.box_load[0], args.box_load[1]),
                        max_rounds=args.max_rounds,
                        config=config,
                    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        saved = json.loads(args.replot.read_text())
        print(markdown_long(saved["rows"]) if args.long else markdown(saved["rows"]))
        if not args.no_plots:
            for path in plot(saved["runs"], saved["rows"], args.out_dir):
                print(f"wrote {path}", file=sys.stderr)
        return 0
    todo = list(specs(args))
    started = time.monotonic()
    print(
        f"bpm_sim: {len(todo)} runs of {args.nodes} nodes on {args.workers} workers "
        f"(base price {todo[0].base_price:.1f} = D'({args.operating_util}))",
        file=sys.stderr,
    )
    results = []
    with multiprocessing.Pool(args.workers) as pool:
        for k, result in enumerate(pool.imap(run, todo, chunksize=1), 1):
            results.append(result)
            if k % max(1, len(todo) // 10) == 0:
                print(
                    f"  {k}/{len(todo)} runs, {time.monotonic() - started:.0f} s", file=sys.stderr
                )
    elapsed = time.monotonic() - started
    rows = summarise(results)
    print(f"# bpm_sim ({machine()}), {elapsed:.0f} s wall")
    print("command: " + " ".join(["scripts/bpm_sim.py", *(argv or sys.argv[1:])]))
    print(markdown_long(rows) if args.long else markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": results}, indent=1))
    if not args.no_plots:
        for path in plot(results, rows, args.out_dir):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
