"""``peer demo``: a local federation of real peers runs one of the example queries, checked.

The demo makes a key pair for each of ``--peers`` participants (acme, globex, initech, ...)
and a trust directory in a temporary directory, starts one ``peer join`` process per
participant (each with its own data directory and a one-core local Spark session), joins them
into one overlay and waits until every peer sees every other one alive. It then creates an
example's schemas and streams (:mod:`peer.examples`: Medusa's traffic query by default, the
network-intrusion query with ``--example intrusion``), submits the query with its box groups
placed on the participants round-robin, and starts it: the query runs as fragments on several
peers, chained by mirrors.

One pusher per input stream pushes the generated tuples in event-time order, in batches, each
batch to a peer picked at random (which forwards it to the stream's host), with a producer id
and sequence number so that a retried batch is kept once. Meanwhile the demo shows, live, what
each peer runs (its fragments, hosted streams and mirrors, its state and load as gossip has
it) and what comes out. At the end it reads every output stream from the earliest tuple on a
peer that does not host it, compares it with the example's plain-Python reference, stops the
peers, and exits 0 only if every output stream matches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from peer.examples import Rows, columns, intrusion, traffic

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from peer.client import Client
    from peer.testing import PeerProcess

__all__ = ["EXAMPLES", "add_arguments", "main", "run_demo"]

PARTICIPANTS = ("acme", "globex", "initech", "umbrella", "hooli", "wonka", "tyrell", "soylent")
MAX_PEERS = 8
SEED = 7
DEFAULT_DURATION_S = 40.0  # pushing time: with start-up and checks, about 1.5 minutes
GOSSIP = ("--gossip-interval", "0.5")
REFRESH_S = 0.5
PLAIN_EVERY_S = 5.0
STALL_S = 90.0  # all pushed and no new output this long: check what there is
LATEST = 4  # latest output tuples shown per stream


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


# -- command line ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``peer demo`` (the CLI's demo sub-parser calls this)."""
    p.add_argument(
        "--peers",
        type=int,
        default=3,
        help=f"peers to start, one participant each (1-{MAX_PEERS}; default 3)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds over which to push the input (default {DEFAULT_DURATION_S:g}; "
        "0: as fast as the peers take it)",
    )
    p.add_argument("--example", choices=sorted(EXAMPLES), default="traffic")
    p.add_argument(
        "--cars",
        type=int,
        default=None,
        metavar="N",
        help="input size: cars (traffic, default 60) or client hosts (intrusion, default 20)",
    )
    p.add_argument(
        "--minutes", type=int, default=20, help="minutes of event time to generate (default 20)"
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the work directory (keys, peer data and logs)"
    )
    p.add_argument("--seed", type=int, default=SEED, help=argparse.SUPPRESS)
    p.add_argument("--tuples", type=int, default=None, help=argparse.SUPPRESS)  # old: sets --cars
    p.add_argument(
        "--spike",
        action="store_true",
        help="a load spike on one participant: its boxes move, with their state, to its "
        "contract partner (3 peers; --duration is the spike's length, default 40 s)",
    )
    p.add_argument(
        "--summary", metavar="FILE", help="with --spike: write what happened as JSON to FILE"
    )


def main(args: argparse.Namespace) -> int:
    return run_demo(
        peers=args.peers,
        duration_s=args.duration,
        example=args.example,
        size=args.cars,
        minutes=args.minutes,
        seed=args.seed,
        tuples=args.tuples,
        spike=args.spike,
        keep=args.keep,
        summary=args.summary,
    )


def run_demo(
    *,
    peers: int = 3,
    duration_s: float | None = None,
    example: str = "traffic",
    size: int | None = None,
    minutes: int = 20,
    seed: int = SEED,
    tuples: int | None = None,
    spike: bool = False,
    keep: bool = False,
    summary: str | None = None,
) -> int:
    from rich.console import Console

    from peer.engine.java import find_java

    console = Console()
    if not 1 <= peers <= MAX_PEERS:
        console.print(f"error: --peers must be between 1 and {MAX_PEERS}")
        return 2
    if example not in EXAMPLES:
        console.print(f"error: unknown example {example!r} (one of {', '.join(EXAMPLES)})")
        return 2
    if minutes < 1 or (size is not None and size < 1) or (duration_s or 0) < 0:
        console.print("error: --minutes and --cars must be positive, --duration not negative")
        return 2
    ex = EXAMPLES[example]
    if size is None:
        if tuples is not None:  # the old single-peer demo's option: about this many inputs
            size = max(2, tuples // (minutes * 2))
        else:
            size = 60 if example == "traffic" else 20
    if spike:
        from peer.spike import Spike

        find_java()
        return Spike(
            console,
            duration_s=40.0 if duration_s is None else max(duration_s, 5.0),
            keep=keep,
            summary=Path(summary) if summary else None,
            live=console.is_terminal,
        ).run()
    find_java()  # the same actionable message as `peer join`, before any process starts
    demo = Demo(
        console,
        ex,
        peers=peers,
        duration_s=DEFAULT_DURATION_S if duration_s is None else duration_s,
        size=size,
        minutes=minutes,
        seed=seed,
        keep=keep,
    )
    return demo.run()


# -- the demo -------------------------------------------------------------------------------------


def participant_names(n: int) -> list[str]:
    return [PARTICIPANTS[i] if i < len(PARTICIPANTS) else f"org{i + 1}" for i in range(n)]


def placement(groups: Sequence[Sequence[str]], names: Sequence[str]) -> dict[str, str]:
    """Box name -> participant: the example's box groups dealt to ``names`` round-robin."""
    return {box: names[i % len(names)] for i, group in enumerate(groups) for box in group}


def batches(rows: Rows, batch_s: int, order: str = "t") -> list[tuple[int, Rows]]:
    """``rows`` (in event-time order) cut into (slot, rows) batches of ``batch_s`` seconds of
    event time each; the order is kept."""
    out: list[tuple[int, Rows]] = []
    for row in rows:
        slot = int(row[order]) // batch_s
        if out and out[-1][0] == slot:
            out[-1][1].append(row)
        else:
            out.append((slot, [row]))
    return out


def schedule(
    inputs: Mapping[str, list[tuple[int, Rows]]], real_slots: int, duration_s: float
) -> dict[str, list[float]]:
    """When to push each batch, in seconds from the start, so that every stream moves through
    event time at the same pace over ``duration_s``; batches past the real data (the flush
    tuples) come last."""
    out: dict[str, list[float]] = {}
    for stream, cut in inputs.items():
        out[stream] = [duration_s * min(slot, real_slots) / real_slots for slot, _ in cut]
    return out


@dataclasses.dataclass
class PushState:
    stream: str
    total_batches: int
    total_rows: int
    batches: int = 0
    rows: int = 0
    retries: int = 0
    done: bool = False
    finished_at: float = 0.0
    last_error: str = ""


@dataclasses.dataclass
class OutputState:
    stream: str
    expected: int
    count: int = 0
    latest: deque[dict[str, Any]] = dataclasses.field(default_factory=lambda: deque(maxlen=LATEST))
    changed_at: float = 0.0
    error: str = ""


class DemoFailed(Exception):
    pass


class Demo:
    def __init__(
        self,
        console: Console,
        example: Example,
        *,
        peers: int,
        duration_s: float,
        size: int,
        minutes: int,
        seed: int,
        keep: bool = False,
    ) -> None:
        self.console = console
        self.keep = keep
        self.ex = example
        self.n = peers
        self.duration_s = duration_s
        self.size = size
        self.minutes = minutes
        self.seed = seed
        self.names = participant_names(peers)
        self.nodes = placement(example.module.BOX_GROUPS, self.names)
        self.procs: list[PeerProcess] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="fedstream-demo-"))
        self.started = time.monotonic()
        self.phase = "starting peers"
        self.status: list[dict[str, Any] | None] = [None] * peers
        self.status_error: list[str] = [""] * peers
        self.pushed_via = [0] * peers
        self.pushes: dict[str, PushState] = {}
        self.outputs: dict[str, OutputState] = {}
        self.fragments: list[dict[str, Any]] = []

    # -- driver (synchronous: the peers are stopped whatever happens) -----------------------

    def run(self) -> int:
        from peer.errors import FedstreamError

        code = 1
        previous = None
        if threading.current_thread() is threading.main_thread():
            # SIGTERM ends the demo like Ctrl-C does: the peers are stopped on the way out
            previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            self._start_peers()
            code = asyncio.run(self._main())
        except KeyboardInterrupt:
            self.console.print("[yellow]interrupted[/]")
            code = 130
        except DemoFailed as exc:
            self.console.print(f"demo failed: {exc}", style="red", soft_wrap=True, markup=False)
            code = 1
        except FedstreamError as exc:  # a request the peers refused
            self.console.print(
                f"demo failed: {exc.message}", style="red", soft_wrap=True, markup=False
            )
            code = 1
        finally:
            self._stop_peers()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if code in (0, 130) and not self.keep:  # a failure keeps its logs
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                self.console.print(
                    f"keys, peer data and logs kept in {self.workdir}", soft_wrap=True
                )
        return code

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _start_peers(self) -> None:
        from contracts.keys import generate
        from peer.testing import PeerProcess

        trust = self.workdir / "trust"
        trust.mkdir()
        master = "local[1]" if self.n > 1 else "local[2]"  # several JVMs share the cores
        self.console.print(
            f"[bold]fedstream demo[/]: {self.ex.title}\n"
            f"starting {self.n} peer{'s' if self.n > 1 else ''} of {self.n} "
            f"participant{'s' if self.n > 1 else ''} ({', '.join(self.names)}), each a "
            f"`peer join` process with Spark {master}; work directory {self.workdir}",
            soft_wrap=True,
        )
        keys = {}
        for name in self.names:
            key, pub = generate(name, self.workdir / "keys")
            shutil.copyfile(pub, trust / pub.name)
            keys[name] = key
        for i, name in enumerate(self.names):
            extra = ["--bootstrap", self.procs[0].overlay_addr] if i else []
            proc = PeerProcess(
                self.workdir / name,
                "--participant",
                name,
                "--key",
                str(keys[name]),
                "--trust",
                str(trust),
                "--spark-master",
                master,
                *GOSSIP,
                *extra,
                log_path=self.workdir / f"{name}.log",
            )
            self.procs.append(proc.launch())
            if i == 0:  # the others bootstrap through the first: start them once it is up
                self._wait_ready(proc, name)
        for proc, name in zip(self.procs[1:], self.names[1:], strict=True):
            self._wait_ready(proc, name)

    def _wait_ready(self, proc: PeerProcess, name: str) -> None:
        try:
            proc.wait_ready(180)
        except (RuntimeError, TimeoutError) as exc:
            raise DemoFailed(f"peer {name} did not start: {exc}") from None
        self.console.print(
            f"  {name:<9} node {proc.node_id[:8]}  API 127.0.0.1:{proc.port}  "
            f"overlay {proc.overlay_addr}  ({self._elapsed():.0f} s)"
        )

    def _stop_peers(self) -> None:
        if not self.procs:
            return
        self.console.print("stopping the peers ...")
        threads = [threading.Thread(target=p.stop, args=(30,), daemon=True) for p in self.procs]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(45)
        except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
            pass
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()
        self.console.print(f"peers stopped ({self._elapsed():.0f} s in all)")

    # -- the asynchronous part --------------------------------------------------------------

    async def _main(self) -> int:
        from peer.client import Client

        module = self.ex.module
        inputs = self.ex.generate(self.seed, self.size, self.minutes)
        want: dict[str, Rows] = module.reference(inputs)
        cut = {s: batches(rows, self.ex.batch_s) for s, rows in inputs.items()}
        real_slots = self.minutes * 60 // self.ex.batch_s
        when = schedule(cut, real_slots, self.duration_s)
        for s, parts in cut.items():
            self.pushes[s] = PushState(s, len(parts), sum(len(r) for _, r in parts))
        for s in module.OUTPUTS:
            self.outputs[s] = OutputState(s, len(want[s]))

        clients = [Client("127.0.0.1", p.port, timeout_s=60) for p in self.procs]
        tasks: list[asyncio.Task[Any]] = []
        try:
            for c in clients:
                await c.connect()
            await self._wait_overlay(clients)
            await self._setup(clients[0])
            self.phase = "pushing"
            t0 = time.monotonic()
            tasks.append(asyncio.create_task(self._poll(clients)))
            watch_on = self.n - 1  # results are read through the last peer (relayed)
            for s in module.OUTPUTS:
                tasks.append(asyncio.create_task(self._watch(s, self.procs[watch_on].port)))
            pushers = [
                asyncio.create_task(self._push(s, cut[s], when[s], t0, i))
                for i, s in enumerate(cut)
            ]
            await self._show(pushers)
            pushed_s = max(p.finished_at for p in self.pushes.values()) - t0
            self.phase = "checking"
            return await self._check(clients, want, inputs, pushed_s)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            for c in clients:
                with contextlib.suppress(Exception):
                    await c.close()

    async def _wait_overlay(self, clients: list[Client]) -> None:
        self.phase = "joining the overlay"
        deadline = time.monotonic() + 90
        while True:
            seen = []
            for c in clients:
                try:
                    members = (await c.status()).get("overlay", {}).get("members", [])
                except Exception:
                    members = []
                seen.append(sum(1 for m in members if m.get("state") == "alive"))
            if all(k >= self.n for k in seen):
                break
            if time.monotonic() > deadline:
                raise DemoFailed(f"the peers do not all see each other (alive members: {seen})")
            await asyncio.sleep(0.3)
        self.console.print(
            f"overlay formed: every peer sees {self.n} alive ({self._elapsed():.0f} s)"
        )

    async def _setup(self, client: Client) -> None:
        module = self.ex.module
        self.phase = "submitting the query"
        for schema in module.SCHEMAS:
            await client.create_schema(schema)
        for stream, schema_name in module.SOURCE_STREAMS.items():
            await client.create_stream(stream, schema_name)
        query = module.query(self.ex.name, self.nodes)
        made = await client.create_query(query)
        self.fragments = list(made.get("fragments", []))
        placed = self._elapsed()
        await client.start_query(self.ex.name)
        by_node = {p.node_id: name for p, name in zip(self.procs, self.names, strict=True)}
        self.console.print(
            f"query [bold]{self.ex.name}[/] submitted by {self.names[0]}: "
            f"{len(self.fragments)} fragments placed ({placed:.0f} s), "
            f"started on their peers ({self._elapsed():.0f} s)",
            soft_wrap=True,
        )
        for name in self.names:
            boxes = [b for b, who in self.nodes.items() if who == name]
            frags = [f["name"] for f in self.fragments if by_node.get(f["site"]) == name]
            if boxes or frags:
                self.console.print(
                    f"  {name:<9} boxes {', '.join(boxes) or '-'}  ->  {', '.join(frags) or '-'}",
                    soft_wrap=True,
                )
        rows = sum(p.total_rows for p in self.pushes.values())
        self.console.print(
            f"pushing {rows} generated tuples ({self.minutes} minutes of event time, "
            f"{self.size} {self.ex.size_name}) over {self.duration_s:g} s, "
            "each batch through a random peer",
            soft_wrap=True,
        )

    async def _poll(self, clients: list[Client]) -> None:
        async def one(i: int, c: Client) -> None:
            try:
                self.status[i] = await asyncio.wait_for(c.status(), 5)
                self.status_error[i] = ""
            except TimeoutError:
                self.status_error[i] = "slow"
            except Exception as exc:  # connection lost: try again next round
                self.status_error[i] = type(exc).__name__
                with contextlib.suppress(Exception):
                    await c.close()
                    await c.connect()

        while True:
            await asyncio.gather(*(one(i, c) for i, c in enumerate(clients)))
            await asyncio.sleep(REFRESH_S)

    async def _watch(self, stream: str, port: int) -> None:
        """Follow ``stream`` from its earliest tuple (for the live view only)."""
        from peer.client import Client

        state = self.outputs[stream]
        while True:
            try:
                async with Client("127.0.0.1", port, timeout_s=60) as c:
                    state.count = 0
                    state.latest.clear()
                    async for batch in c.subscribe(stream, start="earliest"):
                        rows = batch.rows()
                        state.count += len(rows)
                        if stream in self.ex.show_only:
                            keep = self.ex.show_only[stream][0]
                            rows = [r for r in rows if keep(r)]
                        state.latest.extend(rows[-LATEST:])
                        state.changed_at = time.monotonic()
                        state.error = ""
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                state.error = f"{type(exc).__name__}: {exc}"[:80]
            await asyncio.sleep(1.0)

    async def _push(
        self, stream: str, cut: list[tuple[int, Rows]], when: list[float], t0: float, k: int
    ) -> None:
        """Push ``cut`` in order, each batch through a random peer, retried until acked."""
        from peer.client import Client
        from peer.errors import FedstreamError

        state = self.pushes[stream]
        rng = random.Random(self.seed * 1000 + k)
        clients: dict[int, Client] = {}
        try:
            for seq, ((_, rows), at) in enumerate(zip(cut, when, strict=True)):
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                payload = {"columns": columns(rows)}
                deadline = time.monotonic() + 180
                while True:
                    i = rng.randrange(self.n)
                    try:
                        if i not in clients:
                            clients[i] = Client("127.0.0.1", self.procs[i].port, timeout_s=60)
                            await clients[i].connect()
                        await clients[i].push(stream, payload, producer=f"demo:{stream}", seq=seq)
                        break
                    except (FedstreamError, OSError, TimeoutError) as exc:
                        state.retries += 1
                        state.last_error = f"{self.names[i]}: {exc}"[:100]
                        bad = clients.pop(i, None)
                        if bad is not None:
                            with contextlib.suppress(Exception):
                                await bad.close()
                        if time.monotonic() > deadline:
                            raise DemoFailed(
                                f"batch {seq} of {stream} was not acknowledged in 180 s "
                                f"(last error: {state.last_error})"
                            ) from None
                        await asyncio.sleep(0.5)
                state.batches += 1
                state.rows += len(rows)
                self.pushed_via[i] += 1
            state.done = True
            state.finished_at = time.monotonic()
        finally:
            for c in clients.values():
                with contextlib.suppress(Exception):
                    await c.close()

    def _dead_peer(self) -> str | None:
        for p, name in zip(self.procs, self.names, strict=True):
            if p.proc is not None and p.proc.poll() is not None:
                tail = p.log_path.read_text(errors="replace")[-1500:]
                return f"peer {name} exited with code {p.proc.returncode}; its log ends:\n{tail}"
        return None

    async def _show(self, pushers: list[asyncio.Task[None]]) -> None:
        """Refresh the view until everything is pushed and the outputs are complete (or
        have stalled); raise if a pusher failed or a peer died."""
        live_view = self.console.is_terminal
        next_line = 0.0
        drain_from: float | None = None

        def finished() -> bool:
            nonlocal drain_from
            for t in pushers:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            dead = self._dead_peer()
            if dead is not None:
                raise DemoFailed(dead)
            if not all(t.done() for t in pushers):
                return False
            now = time.monotonic()
            if drain_from is None:
                drain_from = now
                self.phase = "waiting for the last results"
            if all(o.count >= o.expected for o in self.outputs.values()):
                return True
            last = max([drain_from, *(o.changed_at for o in self.outputs.values())])
            return now - last > STALL_S

        if live_view:
            from rich.live import Live

            with Live(
                self._render(), console=self.console, auto_refresh=False, transient=False
            ) as live:
                while not finished():
                    live.update(self._render(), refresh=True)
                    await asyncio.sleep(REFRESH_S)
                live.update(self._render(), refresh=True)
        else:
            while not finished():
                if time.monotonic() >= next_line:
                    self.console.print(self._line(), soft_wrap=True, highlight=False)
                    next_line = time.monotonic() + PLAIN_EVERY_S
                await asyncio.sleep(REFRESH_S)
            self.console.print(self._line(), soft_wrap=True, highlight=False)

    # -- views ----------------------------------------------------------------------------------

    def _who(self, node: str) -> str:
        for p, name in zip(self.procs, self.names, strict=True):
            if node and p.node_id.startswith(node):
                return name
        return node[:8]

    def _host(self, stream: str) -> str:
        for st, name in zip(self.status, self.names, strict=True):
            if st is not None and stream in st.get("hosted", []):
                return name
        return "?"

    def _gossip(self, i: int) -> tuple[str, str]:
        """State and load of peer ``i`` as another peer's gossip has it (its own if alone)."""
        node = self.procs[i].node_id
        views = [(i + d) % self.n for d in range(1, self.n)] or [i]
        for j in views:
            st = self.status[j]
            if st is None:
                continue
            for m in st.get("overlay", {}).get("members", []):
                if m.get("node_id") == node:
                    load = m.get("load") or {}
                    text = f"cpu {float(load.get('cpu', 0.0)):.2f}"
                    counts = []
                    if "queries" in load:
                        q = int(load["queries"])
                        counts.append(f"{q} quer{'y' if q == 1 else 'ies'}")
                    if "streams" in load:
                        k = int(load["streams"])
                        counts.append(f"{k} stream{'' if k == 1 else 's'}")
                    if counts:
                        text += "\n" + ", ".join(counts)
                    return str(m.get("state", "?")), text
        return "?", ""

    def _fragments(self, st: Mapping[str, Any] | None) -> list[str]:
        out = []
        for q in st.get("queries", []) if st else []:
            if not str(q.get("name", "")).startswith(self.ex.name):
                continue
            text = f"{q['name']} {q.get('status', '?')}"
            if "batches" in q:
                text += f": {q['batches']} batches, {q.get('rows_out', 0)} out"
            if q.get("error"):
                text += f" error: {str(q['error'])[:60]}"
            out.append(text)
        return out

    def _mirrors(self, st: Mapping[str, Any] | None) -> list[str]:
        return [
            f"{m['stream']} → {self._who(str(m.get('to', '')))} {m.get('acked')}/{m.get('latest')}"
            for m in (st.get("mirrors", []) if st else [])
        ]

    def _render(self) -> RenderableType:
        from rich.columns import Columns
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        head = Text.assemble(
            ("fedstream demo", "bold"),
            f" · {self.ex.name} on {self.n} peer{'s' if self.n > 1 else ''} · ",
            (self.phase, "bold cyan"),
            f" · {self._elapsed():.0f} s",
        )
        peers = Table(title="peers", title_justify="left", expand=True)
        peers.add_column("peer", no_wrap=True)
        peers.add_column("gossip", no_wrap=True)
        peers.add_column("boxes / fragments", ratio=3)
        peers.add_column("hosts", ratio=2, overflow="fold")
        peers.add_column("mirrors (acked/latest)", ratio=3, overflow="fold")
        peers.add_column("pushes in", justify="right", no_wrap=True)
        for i, (p, name) in enumerate(zip(self.procs, self.names, strict=True)):
            st = self.status[i]
            state, load = self._gossip(i)
            if self.status_error[i]:
                state += f" (status: {self.status_error[i]})"
            boxes = [b for b, who in self.nodes.items() if who == name]
            work = Text(", ".join(boxes) or "-", style="dim")
            for line in self._fragments(st):
                work.append("\n" + line, style="red" if "error" in line else "")
            peers.add_row(
                Text.assemble((name, "bold"), "\n", (p.node_id[:8], "dim")),
                Text.assemble((state, "green" if state == "alive" else "yellow"), "\n", load),
                work,
                "\n".join(st.get("hosted", [])) if st else "",
                "\n".join(self._mirrors(st)),
                str(self.pushed_via[i]),
            )
        streams = Table(title="streams", title_justify="left")
        for col in ("stream", "host", "progress", "notes"):
            streams.add_column(col)
        for ps in self.pushes.values():
            notes = f"{ps.retries} retries" if ps.retries else ""
            if ps.retries and ps.last_error:
                notes += f" (last: {ps.last_error})"
            streams.add_row(
                f"in  {ps.stream}",
                self._host(ps.stream),
                f"{ps.batches}/{ps.total_batches} batches, {ps.rows}/{ps.total_rows} tuples",
                notes,
            )
        for o in self.outputs.values():
            done = o.count >= o.expected
            streams.add_row(
                f"out {o.stream}",
                self._host(o.stream),
                Text(f"{o.count}/{o.expected} tuples", style="green" if done else ""),
                o.error,
            )
        latest = []
        for stream, fields in self.ex.show.items():
            title = f"latest {stream}"
            if stream in self.ex.show_only:
                title += f" ({self.ex.show_only[stream][1]})"
            t = Table(*fields, title=title, title_justify="left", min_width=len(title))
            for row in list(self.outputs[stream].latest):
                t.add_row(*(_cell(row.get(f)) for f in fields))
            latest.append(t)
        return Group(head, peers, streams, Columns(latest))

    def _line(self) -> str:
        ins = ", ".join(f"{p.stream} {p.batches}/{p.total_batches}" for p in self.pushes.values())
        outs = ", ".join(f"{o.stream} {o.count}/{o.expected}" for o in self.outputs.values())
        frags = [
            f"{name}: " + ("; ".join(self._fragments(st)) or "-")
            for st, name in zip(self.status, self.names, strict=True)
            if st is not None
        ]
        return " | ".join(
            [f"[{self._elapsed():4.0f} s] {self.phase}", f"in: {ins}", f"out: {outs}", *frags]
        )

    # -- the check ------------------------------------------------------------------------------

    async def _check(
        self,
        clients: list[Client],
        want: dict[str, Rows],
        inputs: Mapping[str, Rows],
        pushed_s: float,
    ) -> int:
        from rich.table import Table

        from peer.testing import collect

        statuses = await asyncio.gather(*(c.status() for c in clients), return_exceptions=True)
        for i, st in enumerate(statuses):
            if isinstance(st, dict):
                self.status[i] = st
        self.console.print(
            f"all {sum(len(r) for r in inputs.values())} input tuples acknowledged "
            f"({pushed_s:.0f} s of pushing); reading every output stream from the earliest "
            "tuple on a peer that does not host it",
            soft_wrap=True,
        )
        ok = True
        table = Table("stream", "host", "read on", "got", "expected", "result", title="summary")
        lines = []
        for stream, rows in want.items():
            host = self._host(stream)
            reader = next((i for i, n in enumerate(self.names) if n != host), 0)
            got = await collect(
                clients[reader], stream, len(rows), timeout_s=60, settle_s=2, start="earliest"
            )
            problems = self.ex.module.compare(got, rows)
            match = not problems
            ok = ok and match
            table.add_row(
                stream,
                host,
                self.names[reader],
                str(len(got)),
                str(len(rows)),
                "[green]MATCH[/]" if match else "[red]MISMATCH[/]",
            )
            lines.append(
                f"{'MATCH' if match else 'MISMATCH'} {stream}: {len(got)} tuples read on "
                f"{self.names[reader]} (host {host}), {len(rows)} expected by the plain-Python "
                "reference"
            )
            lines.extend(f"    {p}" for p in problems[:12])
        self.console.print(table)
        for line in lines:
            self.console.print(line, soft_wrap=True, highlight=False, markup=False)
        verdict = (
            "every output stream equals the plain-Python reference"
            if ok
            else "some output stream differs from the plain-Python reference"
        )
        self.console.print(
            f"[bold {'green' if ok else 'red'}]{'PASS' if ok else 'FAIL'}[/]: {verdict} "
            f"({self._elapsed():.0f} s)",
            soft_wrap=True,
        )
        return 0 if ok else 1


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(prog="peer demo")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
