"""``peer demo --spike``: a load spike on one participant, and the bounded-price mechanism at work.

Three ``peer join`` processes of three participants, each with its own Spark. Contracts:
alpha-beta (price 20 per unit of load, any box) and beta-gamma (price 1000); no contract between
alpha and gamma. alpha offers half a core (``--capacity 0.5``) and runs three windowed
aggregates over a stream it hosts. Pushes go from a trickle to a spike and back: alpha's load
rises over its capacity, its brain offers boxes to beta (its only partner), beta takes them
while its own cost stays under the price, and the fragments move with their state. alpha's
first aggregate runs as its own streaming query; the other two share the lane
(``peer.engine.lane``), whose busy time the brain shares equally among them. Each may move
(a lane member with its windows, the lane held at a batch boundary meanwhile); once one lane
member is on beta, beta's lane reads the stream at its own position, so the other stays. The live
view shows each peer's utilisation, fragments and ledger. At the end every result stream is
read (through gamma, which runs none of them) and compared tuple for tuple with plain Python.

Exit 0 only if: every output is exact, at least one box moved, every move went from alpha to
beta (none to gamma, none in breach of a contract), and alpha ended under its capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from peer.demo.board import hold, print_dashboards, show_table
from peer.examples.keyed_window import keyed_window_query, keyed_window_sums
from peer.testing.cluster import (
    LocalFederation,
    PeerProcess,
    collect,
    participant_args,
    signed_contracts,
    stream_name_on,
    trust_all,
)
from peer.testing.push import push_acknowledged
from peer.timing import every

NAMES = ("alpha", "beta", "gamma")
QUERIES = 3
SCHEMA = {
    "name": "spike_tick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}
FAST = ("--gossip-interval", "0.5", "--suspect-after", "4", "--dead-after", "10")
Batch = dict[str, list[int]]


def spike_query(i: int, source: str) -> dict[str, Any]:
    return keyed_window_query(
        f"spike{i}", source, f"spike_out{i}", site="alpha", at_least=5 * i, kept=f"spike_kept{i}"
    )


def reference(batches: list[Batch], i: int) -> Counter[tuple[int, ...]]:
    """Plain Python: the windows query ``spike{i}`` must output for these batches."""
    return keyed_window_sums(batches, at_least=5 * i)


class Spike:
    def __init__(
        self,
        console: Console,
        *,
        duration_s: float = 40.0,
        rows: int = 2000,
        workdir: Path | None = None,
        keep: bool = False,
        summary: Path | None = None,
        live: bool = True,
        seed: int = 7,
        hold: bool = False,
    ) -> None:
        self.console = console
        self.duration_s = duration_s
        self.rows = rows
        self.keep = keep or workdir is not None
        self.work = workdir or Path(tempfile.mkdtemp(prefix="fedstream-spike-"))
        self.summary_path = summary
        self.live = live
        self.hold = hold
        self.rng = random.Random(seed)
        self.fed: LocalFederation | None = None
        self.procs: dict[str, PeerProcess] = {}
        self.status: dict[str, dict[str, Any]] = {}
        self.pushed: list[Batch] = []
        self.t = 0
        self.phase = "starting"
        self.util_history: dict[str, list[tuple[float, float]]] = {n: [] for n in NAMES}
        self.started = time.monotonic()

    # -- set-up -------------------------------------------------------------------------------
    def _prepare(self) -> dict[str, list[str]]:
        keys, _ids = signed_contracts(
            self.work, [("alpha", "beta", 20.0), ("beta", "gamma", 1000.0)]
        )
        trust = trust_all(self.work / "trust", (keys[name] for name in NAMES))
        contracts = self.work / "contracts"
        capacity = {"alpha": "0.5", "beta": "2", "gamma": "2"}
        return {
            name: [
                *participant_args(name, keys[name], trust),
                "--contracts",
                str(contracts),
                "--capacity",
                capacity[name],
                "--bpm-period",
                "2",
                "--spark-master",
                "local[1]",
                # no control plane: with peer join's default seats, alpha's stream and its
                # fragments' results would be replicated, and a fragment that writes replicated
                # streams runs where their primary is and is never offered (peer.move.candidates)
                "--no-voter",
                *FAST,
            ]
            for name in NAMES
        }

    def _start(self) -> None:
        self.fed = LocalFederation(self.work, self._prepare())  # alpha first: the others join it
        self.procs = self.fed.procs
        self.fed.start(timeout_s=240)
        print_dashboards(self.console, self.procs)

    def _stop(self) -> None:
        if self.fed is not None:
            self.fed.stop(60)

    # -- running ------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.console.print(f"starting 3 peers (work directory {self.work}) ...")
            self._start()
            code = asyncio.run(self._main())
            if self.hold:
                hold(self.console, self.procs)
            return code
        except KeyboardInterrupt:
            self.console.print("[yellow]interrupted[/]")
            return 130
        finally:
            self._stop()
            if not self.keep:
                shutil.rmtree(self.work, ignore_errors=True)

    def _batch(self, rows: int) -> Batch:
        ks, vs, ts = [], [], []
        for _ in range(rows):
            self.t += self.rng.randrange(0, 2) if self.rng.random() < 0.05 else 0
            ks.append(self.rng.randrange(8))
            vs.append(self.rng.randrange(-10, 50))
            ts.append(self.t)
        return {"k": ks, "v": vs, "t": ts}

    async def _main(self) -> int:
        from peer.client import Client

        alpha = self.procs["alpha"]
        ids = [bytes.fromhex(p.node_id) for p in self.procs.values()]
        source = stream_name_on(bytes.fromhex(alpha.node_id), ids, "spike_in")
        async with Client("127.0.0.1", alpha.port, timeout_s=120) as cl:
            async with asyncio.timeout(90):
                while len((await cl.status()).extra["overlay"]["members"]) < 3:
                    await asyncio.sleep(0.3)
            await cl.create_schema(SCHEMA)
            await cl.create_stream(source, "spike_tick")
            for i in range(QUERIES):
                await cl.create_query(spike_query(i, source))
                await cl.start_query(f"spike{i}")
        async with asyncio.TaskGroup() as tg:
            poller = tg.create_task(self._poll())
            viewer = tg.create_task(self._view())
            try:
                await self._push(source, "warm-up", 8.0, rows=200, pause_s=0.25)
                await self._push(source, "spike", self.duration_s, rows=self.rows, pause_s=0.0)
                await self._push(source, "cool-down", 16.0, rows=100, pause_s=0.5)
                # closes every window: it must pass every filter, since each fragment's
                # watermark comes from the tuples that reach it
                closing = {"k": [0], "v": [49], "t": [self.t + 100]}
                await self._send(source, closing)
                self.phase = "checking"
                result = await self._check()
            finally:
                poller.cancel()
                viewer.cancel()
        return result

    async def _send(self, source: str, batch: Batch) -> None:
        port, seq = self.procs["alpha"].port, len(self.pushed)
        await push_acknowledged(port, source, batch, producer="spike", seq=seq, tries=120)
        self.pushed.append(batch)

    async def _push(
        self, source: str, phase: str, seconds: float, *, rows: int, pause_s: float
    ) -> None:
        self.phase = phase
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await self._send(source, self._batch(rows))
            await asyncio.sleep(pause_s)

    async def _poll(self) -> None:
        from peer.client import Client

        async def once() -> None:
            for name, proc in self.procs.items():
                with contextlib.suppress(Exception):
                    async with Client("127.0.0.1", proc.port, timeout_s=10) as cl:
                        st = (await cl.status()).to_wire()
                    self.status[name] = st
                    brain = st.get("brain") or {}
                    if "utilisation" in brain:
                        self.util_history[name].append(
                            (time.monotonic() - self.started, float(brain["utilisation"]))
                        )

        await every(1.0, once, first_s=0, what="the spike's status poll")

    def _table(self) -> Table:
        table = Table(title=f"load spike: {self.phase} ({time.monotonic() - self.started:.0f} s)")
        for col in ("peer", "utilisation", "capacity", "fragments", "moves out", "moves in"):
            table.add_column(col)
        for name in NAMES:
            st = self.status.get(name, {})
            brain = st.get("brain") or {}
            ledger = brain.get("ledger", [])
            frags = [q["name"] for q in st.get("queries", []) if q.get("status") == "RUNNING"]
            table.add_row(
                name,
                f"{brain.get('utilisation', 0):.2f}",
                str(brain.get("capacity", "")),
                ", ".join(frags) or "-",
                str(sum(1 for e in ledger if e.get("direction") == "out" and e.get("ok"))),
                str(sum(1 for e in ledger if e.get("direction") == "in")),
            )
        return table

    async def _view(self) -> None:
        await show_table(self.console, self._table, live=self.live, what="the spike's table")

    # -- checking -----------------------------------------------------------------------------
    async def _check(self) -> int:
        from peer.client import Client

        ok = True
        exact = {}
        async with Client("127.0.0.1", self.procs["gamma"].port, timeout_s=120) as cl:
            for i in range(QUERIES):
                want = reference(self.pushed, i)
                rows = await collect(
                    cl, f"spike_out{i}", sum(want.values()), timeout_s=240, settle_s=3
                )
                got = Counter(
                    (r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows
                )
                exact[f"spike{i}"] = got == want
                self.console.print(
                    f"spike{i}: {sum(got.values())} windows, plain Python "
                    f"{sum(want.values())}: {'exact' if got == want else 'MISMATCH'}"
                )
                ok &= got == want
        await asyncio.sleep(5)  # one more measurement of alpha after the spike
        finals = {}
        for name, proc in self.procs.items():
            async with Client("127.0.0.1", proc.port, timeout_s=30) as cl:
                finals[name] = (await cl.status()).to_wire()
        ledgers = {n: (finals[n].get("brain") or {}).get("ledger", []) for n in NAMES}
        moves = [e for e in ledgers["alpha"] if e.get("direction") == "out" and e.get("ok")]
        to_gamma = [
            e for n in NAMES for e in ledgers[n] if e.get("partner") == "gamma" and e.get("ok")
        ]
        running_on = {
            n: [q["name"] for q in finals[n].get("queries", []) if q.get("status") == "RUNNING"]
            for n in NAMES
        }
        alpha_util = float((finals["alpha"].get("brain") or {}).get("utilisation", 99))
        peak = max((u for _t, u in self.util_history["alpha"]), default=0.0)
        checks = {
            "outputs exact": ok,
            "boxes moved alpha -> beta": bool(moves)
            and all(e.get("partner") == "beta" for e in moves),
            "nothing moved to gamma": not to_gamma and not running_on["gamma"],
            "alpha under capacity at the end": alpha_util < 1.0,
        }
        for what, passed in checks.items():
            self.console.print(f"{'ok  ' if passed else 'FAIL'} {what}")
        pauses = [e.get("pause_s") for e in moves]
        sent = [(e.get("precopy_bytes"), e.get("bytes")) for e in moves]
        self.console.print(
            f"alpha utilisation: peak {peak:.2f}, end {alpha_util:.2f}; "
            f"{len(moves)} move(s), pauses {pauses} s, bytes (pre-copied, during the pause) "
            f"{sent}"
        )
        summary = {
            "checks": checks,
            "exact": exact,
            "moves": moves,
            "ledgers": ledgers,
            "running_on": running_on,
            "alpha_util_peak": peak,
            "alpha_util_end": alpha_util,
            "util_history": self.util_history,
            "batches": len(self.pushed),
            "tuples": sum(len(b["t"]) for b in self.pushed),
        }
        if self.summary_path is not None:
            self.summary_path.write_text(json.dumps(summary, indent=1, default=str))
        return 0 if all(checks.values()) else 1
