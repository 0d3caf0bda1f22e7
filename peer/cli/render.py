"""How the ``peer`` command prints what a peer answers.

Replies are printed as indented JSON with sorted keys (so that scripts can read them and
people can diff them); ``peer status`` without ``--json`` prints tables instead: the peer and
its queries and streams, then, when it runs in an overlay, the members as its gossip has
them, and, when it has contracts, its brain's load, contracts and ledger of moves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from peer.engine.executors import waiting_text

if TYPE_CHECKING:
    from rich.console import Console


def print_json(data: object) -> None:
    """``data`` (a reply prints as its wire map) as indented JSON with sorted keys."""
    print(json.dumps(data, indent=2, sort_keys=True, default=_plain))


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else str(value)


def print_status(status: Mapping[str, Any]) -> None:
    """The tables of ``peer status``."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    executors = status.get("executors")
    console.print(
        f"peer {status['peer']}  engine={status['engine']}  "
        f"uptime={status['uptime_s']}s  data={status['data_dir']}"
        + (f"  {waiting_text(executors)}" if executors else "")
    )
    table = Table("query", "status", "batches", "rows out", "results", "error")
    for q in status["queries"]:
        table.add_row(
            q["name"],
            q["status"],
            str(q.get("batches", "")),
            str(q.get("rows_out", "")),
            availability_text(q.get("availability")),
            q.get("error", ""),
        )
    console.print(table)
    for q in status["queries"]:
        for state in q.get("unbounded_state", ()):  # a join without a time bound (docs/sql.md)
            line = f"query {q['name']}: unbounded state: {state}"
            console.print(f"[yellow]warning:[/] {escape(line)}")
    streams = Table("stream", "latest offset")
    for s in status["streams"]:
        streams.add_row(s["name"], str(s["latest_offset"]))
    console.print(streams)
    overlay = status.get("overlay")
    if overlay:
        _print_overlay(console, overlay)
    replication = status.get("replication")
    if replication and (replication.get("streams") or replication.get("note")):
        _print_replication(console, replication)
    if replication and (replication.get("standbys") or replication.get("promotions")):
        _print_standbys(console, replication)
    brain = status.get("brain")
    if brain:
        _print_brain(console, brain)
    elastic = status.get("elastic")
    if elastic:
        _print_elastic(console, elastic)


def _print_elastic(console: Console, elastic: Mapping[str, Any]) -> None:
    """An elastic participant's burst leader and its last decisions; a launched peer's drain."""
    from rich.table import Table

    if "leading" in elastic:
        leader = elastic.get("leader")
        who = "none yet" if leader is None else str(leader)[:12]
        if elastic.get("leading"):
            who += " (this peer)"
        launched = elastic.get("launched") or []
        console.print(
            f"elastic {elastic.get('participant')} {elastic.get('min')}:{elastic.get('max')}: "
            f"leader {who}, term {elastic.get('term')}, launched "
            + (", ".join(map(str, launched)) or "none")
        )
        decisions = Table("decided", "action", "peers", "offered rows/s", "rows/busy s", "why")
        for d in elastic.get("decisions") or []:
            decisions.add_row(
                _clock(d.get("t")), str(d.get("action")),
                f"{d.get('current')} -> {d.get('size')}", _figure(d.get("offered")),
                _figure(d.get("true_rate")), str(d.get("reason")),
            )  # fmt: skip
        if elastic.get("decisions"):
            console.print(decisions)
    if "launched_as" in elastic:
        state = "draining" if elastic.get("draining") else "in the plan"
        left = elastic.get("left") or []
        console.print(
            f"launched as {elastic['launched_as']}: {state}"
            + (f"; waiting on: {'; '.join(map(str, left))}" if left else "")
        )


def _clock(t: object) -> str:
    if isinstance(t, bool) or not isinstance(t, int | float):
        return "-"
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M:%S")


def _figure(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:,.0f}"


def availability_text(dpc: Mapping[str, Any] | None, now: float | None = None) -> str:
    """A query's results as ``peer status`` shows them: exact, or tentative since when and
    missing what, with the corrections so far (issue 16)."""
    if not dpc:
        return "exact"
    done = f"{dpc.get('corrections', 0)} corrections, {dpc.get('corrected_tuples', 0)} taken back"
    since = dpc.get("tentative_since")
    if not dpc.get("tentative") or not isinstance(since, int | float):
        return f"exact ({done})" if dpc.get("corrections") else "exact"
    age = (time.time() if now is None else now) - since
    missing = ", ".join(dpc.get("missing_inputs") or ()) or "an input"
    return f"TENTATIVE for {age:.0f} s (missing {missing}); {done}"


def _print_replication(console: Console, replication: Mapping[str, Any]) -> None:
    """Replicated streams held here: role, epoch, log end, acknowledged end, ISR, and
    (on a primary) each replica's lag in batches."""
    from rich.table import Table

    voters = ", ".join(v[:12] for v in replication.get("voters", ()))
    console.print(f"control plane voters: {voters or 'none known'}")
    if replication.get("note"):
        console.print(f"streams: {replication['note']}", style="yellow")
    if not replication.get("streams"):
        return
    table = Table(
        "replicated stream", "role", "epoch", "log end", "acked", "in sync", "copies", "lag"
    )
    for name, s in replication["streams"].items():
        lag = s.get("lag") or {}
        table.add_row(
            name,
            str(s.get("role")),
            str(s.get("epoch")),
            str(s.get("log_end")),
            str(s.get("acknowledged")),
            f"{len(s.get('in_sync', ()))}/{len(s.get('replicas', ()))}",
            str(s.get("copies", "-")),
            ", ".join(f"{n[:8]}:{v}" for n, v in lag.items()) or "-",
        )
    console.print(table)


def _print_standbys(console: Console, replication: Mapping[str, Any]) -> None:
    """Warm standbys here: whose, over which input, how far behind, what they hold."""
    from rich.table import Table

    table = Table("standby of", "role", "input", "behind", "since batch", "held", "batches")
    for name, sb in (replication.get("standbys") or {}).items():
        since = sb.get("since_batch_s")
        table.add_row(
            name,
            "promoted" if sb.get("promoted") else "standby",
            str(sb.get("anchor")),
            "-" if sb.get("behind_batches") is None else f"{sb['behind_batches']} batches",
            "-" if since is None else f"{since:.1f} s",
            str(sb.get("held")),
            str(sb.get("batches")),
        )
    console.print(table)
    console.print(f"standby promotions here: {replication.get('promotions', 0)}")


def _print_overlay(console: Console, overlay: Mapping[str, Any]) -> None:
    from rich.table import Table

    console.print(
        f"node {overlay['node_id'][:16]}  participant={overlay['participant']}  "
        f"overlay={overlay['overlay']}  dht contacts={overlay['dht'].get('contacts')}"
    )
    members = Table("node", "participant", "state", "api", "engine", "load")
    for m in overlay["members"]:
        load = ", ".join(f"{k}={v:g}" for k, v in sorted(m["load"].items()))
        members.add_row(
            m["node_id"][:16] + (" (this peer)" if m["self"] else ""),
            m["participant"],
            m["state"],
            m["api"],
            "spark" if m["engine"] else "none",
            load,
        )
    console.print(members)


def _print_brain(console: Console, brain: Mapping[str, Any]) -> None:
    from rich.table import Table

    util, load = brain.get("utilisation"), brain.get("load")
    measured = (
        "not measured yet" if util is None else f"utilisation={util:.0%}  load={load:.2f} cores"
    )
    offering = brain.get("offer_in_flight")
    console.print(
        f"brain: {measured}  capacity={brain['capacity']:g} cores"
        + (f"  offering to {offering}" if offering else "")
    )
    contracts = Table("contract", "partner", "price", "partner takes", "valid")
    for c in brain.get("contracts", []):
        contracts.add_row(
            c["id"][:8],
            c["partner"],
            f"{c['price']:g}",
            ", ".join(c.get("kinds", [])),
            "yes" if c.get("valid", True) else "no",
        )
    if brain.get("contracts"):
        console.print(contracts)
    for r in brain.get("refused_contracts", []):
        console.print(f"contract file {r['file']} refused: {r['message']}")
    ledger = Table("time", "dir", "fragment", "partner")
    for column in ("contract", "load", "price", "duration", "pause"):
        ledger.add_column(column, no_wrap=True)
    for e in brain.get("ledger", []):
        when = datetime.fromtimestamp(e["t"]).strftime("%m-%d %H:%M")
        duration, pause = e.get("duration_s"), e.get("pause_s")
        ledger.add_row(
            when,
            e["direction"],
            e["fragment"],
            e.get("partner") or "",
            e["contract"][:8] if e.get("contract") else "sibling",
            f"{e.get('load', 0):.3g}",
            f"{e.get('price', 0):g}",
            "" if duration is None else f"{duration:.0f}s",
            "" if pause is None else f"{pause:.2f}s",
            style=None if e.get("ok") else "red",
        )
    if brain.get("ledger"):
        console.print(ledger)
    for e in brain.get("ledger", []):
        if e.get("reason"):  # a move to a peer of this participant, and why
            console.print(f"{e['fragment']} to {str(e.get('peer'))[:12]}: {e['reason']}")
