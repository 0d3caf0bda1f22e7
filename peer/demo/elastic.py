"""``peer demo --elastic``: a participant that grows with a load ramp and shrinks after it.

One ``peer join --elastic 1:3`` process of participant acme, alone in the federation, offering
half a core (``--capacity 0.5``) with its own Spark (``local[1]``), runs three keyed windowed
aggregates over one stream, each in its own streaming query (``--no-lane``). The stream has
one copy (``--replicas 1``): a fragment does not move to a peer holding its input as a
replica, and the control plane would place replicas on the launched peers.

A ramp (batches pushed back to back) overloads the peer. Its burst leader (itself, the only
peer) sizes the participant from the gossiped figures (``peer.elastic.sizing``) and starts
peers with the local provisioner: ``peer join --launched-as acme-eN`` processes in data
directories beside its own. Its brain's balancer moves fragments to them, under no contract.
The ramp ends (the pushes stop: on a small machine a trickle keeps local[1] Spark busy with
each micro-batch's fixed cost, and busy peers are not drained); the leader shrinks the plan
back to the one peer started by hand, and the launched peers drain (their fragments moved
back) and exit. A live table shows the peers, their figures, the fragments each runs and the
leader's decisions; at the end every result stream is compared with plain Python.

Exit 0 only if: the plan grew to three peers, a fragment moved to a launched peer, the plan
shrank back to none and every launched process exited by itself, never more than MAX - 1
launched processes ran at once, and every output is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from peer.demo.board import show_table
from peer.examples.keyed_window import keyed_window_query, keyed_window_schema, keyed_window_sums
from peer.testing.cluster import LocalFederation, collect, make_participants, participant_args
from peer.testing.push import KeyedFeed

__all__ = ["Elastic", "kill_launched", "launched_pids"]

QUERIES = 3
MAXIMUM = 3
SOURCE = "ramp_in"
INTERVAL_S = 3.0  # the burst leader decides every 3 s (peer join's default: 10 s)
FAST = ("--gossip-interval", "0.3", "--suspect-after", "3", "--dead-after", "8")
GROW_S = 420.0  # the ramp goes on until the participant has grown and spread (at most)
SHRINK_S = 420.0  # after the ramp, the wait for the shrink and the drains (at most)


def launched_pids(work: Path) -> dict[str, int]:
    """Launched peers alive now, by name (their ``launch.pid`` files under ``work``)."""
    alive = {}
    for pid_file in work.glob("*/launch.pid"):
        try:
            proc = psutil.Process(int(pid_file.read_text()))
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive[pid_file.parent.name] = proc.pid
        except (OSError, ValueError, psutil.Error):
            continue
    return alive


def kill_launched(work: Path) -> None:
    """SIGKILL every launched peer under ``work`` and what it started (its Spark)."""
    for pid in launched_pids(work).values():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            proc.kill()


class Elastic:
    def __init__(
        self,
        console: Console,
        *,
        keep: bool = False,
        summary: Path | None = None,
        live: bool = True,
        seed: int = 28,
    ) -> None:
        self.console = console
        self.keep = keep
        self.summary_path = summary
        self.live = live
        self.seed = seed
        self.feed = KeyedFeed(SOURCE, producer="ramp", seed=seed)  # (its peer's port once up)
        self.phase = "starting"
        self.status: dict[str, Any] = {}
        self.most_launched = 0
        self.started = time.monotonic()

    def run(self) -> int:
        work = Path(tempfile.mkdtemp(prefix="peer-demo-elastic-"))
        self.console.print(f"work directory {work}")
        keys = make_participants(work, ["acme"])
        args = {
            "acme1": [
                *participant_args("acme", keys["acme"], work / "trust"),
                "--elastic", f"1:{MAXIMUM}",
                "--elastic-interval", str(INTERVAL_S),
                "--capacity", "0.5",
                "--bpm-period", "2",
                "--spark-master", "local[1]",
                "--http", "off",
                "--no-lane",
                "--replicas", "1",
                *FAST,
            ]
        }  # fmt: skip
        fed = LocalFederation(work, args)
        try:
            self.console.print("starting acme1 (peer join --elastic 1:3) ...")
            fed.start(timeout_s=240)
            return asyncio.run(self._main(fed, work))
        finally:
            fed.stop(60)
            kill_launched(work)
            if self.keep:
                self.console.print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)

    # -- the scenario ---------------------------------------------------------------------------
    async def _main(self, fed: LocalFederation, work: Path) -> int:
        from peer.client import Client

        self.port = fed.procs["acme1"].port
        self.feed = KeyedFeed(SOURCE, producer="ramp", port=self.port, seed=self.seed)
        async with Client("127.0.0.1", self.port, timeout_s=120) as cl:
            await cl.create_schema(keyed_window_schema("tick"))
            await cl.create_stream(SOURCE, "tick")
            for i in range(QUERIES):
                q = keyed_window_query(f"ramp{i}", SOURCE, f"ramp_out{i}", at_least=5 * i)
                await cl.create_query(q)
                await cl.start_query(q["name"])
        self.started = time.monotonic()
        viewer = asyncio.create_task(self._view())
        try:
            grew, moved = await self._ramp(work)
            shrank = await self._wind_down(work) if grew and moved else False
            for _ in range(5):
                await self.feed.send(self.feed.batch(50))
            await self.feed.close_windows()
            self.phase = "checking against plain Python"
            return await self._check(grew, moved, shrank)
        finally:
            viewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await viewer

    async def _ramp(self, work: Path) -> tuple[bool, bool]:
        """Batches back to back until the plan holds MAX peers, every launched peer is up,
        and a fragment has moved to one of them."""
        self.phase = "ramp: batches back to back"
        began = time.monotonic()
        while time.monotonic() - began < GROW_S:
            await self.feed.send(self.feed.batch(400))
            if len(self.feed.pushed) % 10:
                continue
            await self._look(work)
            elastic = self.status.get("elastic") or {}
            full = len(elastic.get("launched", [])) == MAXIMUM - 1
            if full and self._moved() and len(launched_pids(work)) == MAXIMUM - 1:
                return True, True
        elastic = self.status.get("elastic") or {}
        return len(elastic.get("launched", [])) == MAXIMUM - 1, bool(self._moved())

    async def _wind_down(self, work: Path) -> bool:
        """No more pushes until the plan is back to the peer started by hand and every
        launched process has drained and exited."""
        self.phase = "ramp over: no pushes"
        began = time.monotonic()
        while time.monotonic() - began < SHRINK_S:
            await asyncio.sleep(2.0)
            alive = await self._look(work)
            if not (self.status.get("elastic") or {}).get("launched") and not alive:
                return True
        return False

    async def _look(self, work: Path) -> dict[str, int]:
        from peer.client import Client

        alive = launched_pids(work)
        self.most_launched = max(self.most_launched, len(alive))
        with contextlib.suppress(Exception):
            async with Client("127.0.0.1", self.port, timeout_s=30) as cl:
                self.status = (await cl.status()).to_wire()
        return alive

    def _moved(self) -> list[dict[str, Any]]:
        ledger = (self.status.get("brain") or {}).get("ledger", [])
        return [e for e in ledger if e.get("direction") == "out" and e.get("ok")]

    # -- the view -------------------------------------------------------------------------------
    def _table(self) -> Table:
        elapsed = time.monotonic() - self.started
        elastic = self.status.get("elastic") or {}
        lines = [
            f"{d.get('action')}: {d.get('current')} -> {d.get('size')} peers ({d.get('reason')})"
            for d in (elastic.get("decisions") or [])[-4:]
        ]
        table = Table(
            title=f"elastic acme 1:{MAXIMUM}: {self.phase} ({elapsed:.0f} s)",
            caption="\n".join(lines) or None,
        )
        for col in ("peer", "launched", "busy", "rows/s", "backlog rows", "state"):
            table.add_column(col)
        members = (self.status.get("overlay") or {}).get("members", [])
        for m in members:
            load = m.get("load") or {}
            table.add_row(
                str(m.get("node_id", ""))[:12],
                "yes" if load.get("launched") else "by hand",
                f"{load.get('busy', 0):.2f}",
                f"{load.get('tps', 0):,.0f}",
                f"{load.get('lag', 0):,.0f}",
                "draining" if load.get("drain") else str(m.get("state", "")),
            )
        return table

    async def _view(self) -> None:
        await show_table(self.console, self._table, live=self.live, what="the elastic demo's table")

    # -- checking -------------------------------------------------------------------------------
    async def _check(self, grew: bool, moved: bool, shrank: bool) -> int:
        from peer.client import Client

        exact = {}
        async with Client("127.0.0.1", self.port, timeout_s=120) as cl:
            for i in range(QUERIES):
                want = keyed_window_sums(self.feed.pushed, at_least=5 * i)
                rows = await collect(
                    cl, f"ramp_out{i}", sum(want.values()), timeout_s=240, settle_s=3
                )
                got = Counter(
                    (r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows
                )
                exact[f"ramp{i}"] = got == want
                self.console.print(
                    f"ramp{i}: {sum(got.values())} windows, plain Python "
                    f"{sum(want.values())}: {'exact' if got == want else 'MISMATCH'}"
                )
            status = (await cl.status()).to_wire()
        elastic = status.get("elastic") or {}
        decisions = elastic.get("decisions") or []
        moves = self._moved() or [
            e for e in (status.get("brain") or {}).get("ledger", []) if e.get("direction") == "out"
        ]
        checks = {
            f"grew to {MAXIMUM} peers": grew,
            "a fragment moved to a launched peer, under no contract": moved
            and all(e.get("contract") == "" for e in moves if e.get("ok")),
            "shrank back to one peer; every launched peer drained and exited": shrank,
            f"never more than {MAXIMUM - 1} launched peers at once": self.most_launched
            <= MAXIMUM - 1,
            "outputs exact": all(exact.values()),
        }
        for what, passed in checks.items():
            self.console.print(f"{'ok  ' if passed else 'FAIL'} {what}")
        for d in decisions:
            self.console.print(
                f"  {d.get('action')}: {d.get('current')} -> {d.get('size')} peers, offered "
                f"{d.get('offered')} rows/s, true rate {d.get('true_rate')}: {d.get('reason')}"
            )
        summary = {
            "checks": checks,
            "exact": exact,
            "decisions": decisions,
            "moves": moves,
            "most_launched": self.most_launched,
            "batches": len(self.feed.pushed),
            "tuples": sum(len(b["t"]) for b in self.feed.pushed),
        }
        if self.summary_path is not None:
            self.summary_path.write_text(json.dumps(summary, indent=1, default=str))
        return 0 if all(checks.values()) else 1
