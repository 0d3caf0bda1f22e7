"""``peer demo``: its options, and the driver that starts the peers, runs the query and checks.

The driver makes a key pair for each of ``--peers`` participants and a trust directory in a
temporary directory, starts one ``peer join`` process per participant (:mod:`peer.testing.cluster`;
each with its own data directory and a one-core local Spark session), joins them into one
overlay and waits until every peer sees every other one alive. It then creates the
example's schemas and streams, submits the query with its box groups placed on the
participants round-robin, and starts it: the query runs as fragments on several peers,
chained by mirrors. Then the pushers (:mod:`peer.demo.inputs`), the status poller and the
output followers (:mod:`peer.demo.view`) run until everything is pushed and the outputs are
complete or have stalled, the check (:mod:`peer.demo.check`) gives the verdict, and the
peers are stopped whatever happened. ``--spike`` runs :mod:`peer.demo.spike` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from peer.demo.board import Board, DemoFailed, OutputState, PushState, hold
from peer.demo.check import check_outputs
from peer.demo.examples import EXAMPLES, MAX_PEERS, Example, participant_names, placement
from peer.demo.inputs import batches, push_stream, schedule
from peer.demo.view import View, follow, poll, watch
from peer.examples import Rows
from peer.testing.cluster import LocalFederation, PeerProcess, make_participants, participant_args
from peer.timing import wait_until

if TYPE_CHECKING:
    from rich.console import Console

    from peer.client import Client

SEED = 7
DEFAULT_DURATION_S = 40.0  # pushing time: with start-up and checks, about 1.5 minutes
GOSSIP = ("--gossip-interval", "0.5")
READY_TIMEOUT_S = 180
OVERLAY_TIMEOUT_S = 90
STALL_S = 90.0  # all pushed and no new output this long: check what there is


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
    p.add_argument(
        "--example", choices=sorted(EXAMPLES), default="traffic", help="the example query to run"
    )
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
        "--partition",
        action="store_true",
        help="a participant cut off: globex frozen while acme goes on; tentative tolls, "
        "then their corrections, checked against plain Python (2 peers; --duration is the "
        "freeze's length, default 30 s)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="a participant that grows with a load ramp and shrinks after it: peer join "
        "--elastic 1:3 starts peers, load spreads to them, they drain and leave; outputs "
        "checked against plain Python (1 to 3 peers)",
    )
    p.add_argument(
        "--summary",
        metavar="FILE",
        help="with --spike or --elastic: write what happened as JSON to FILE",
    )
    p.add_argument(
        "--hold",
        action="store_true",
        help="after the check, keep the federation (and its dashboards) up until Ctrl-C",
    )


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM end a demo as KeyboardInterrupt, so that its peers are stopped on the
    way out. SIGINT too is set here: a process started in the background by a shell without
    job control inherits it ignored, and Python then installs no handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in wanted}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(args: argparse.Namespace) -> int:
    with interrupts():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.elastic:
        from rich.console import Console

        from peer.demo.elastic import Elastic
        from peer.engine.java import find_java

        find_java()
        console = Console()
        summary = Path(args.summary) if args.summary else None
        return Elastic(console, keep=args.keep, summary=summary, live=console.is_terminal).run()
    if args.partition:
        from peer.demo.partition import run_partition

        return run_partition(freeze_s=args.duration, keep=args.keep)
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
        hold=args.hold,
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
    hold: bool = False,
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
        from peer.demo.spike import Spike

        find_java()
        return Spike(
            console,
            duration_s=40.0 if duration_s is None else max(duration_s, 5.0),
            keep=keep,
            summary=Path(summary) if summary else None,
            live=console.is_terminal,
            hold=hold,
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
        hold=hold,
    )
    return demo.run()


# -- the demo -------------------------------------------------------------------------------------


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
        hold: bool = False,
    ) -> None:
        self.console = console
        self.keep = keep
        self.hold = hold
        self.ex = example
        self.n = peers
        self.duration_s = duration_s
        self.size = size
        self.minutes = minutes
        self.seed = seed
        self.names = participant_names(peers)
        self.workdir = Path(tempfile.mkdtemp(prefix="fedstream-demo-"))
        self.fed: LocalFederation | None = None
        self.board = Board(example, self.names, placement(example.module.BOX_GROUPS, self.names))

    # -- driver (synchronous: the peers are stopped whatever happens) -----------------------

    def run(self) -> int:
        from peer.errors import FedstreamError

        code = 1
        try:
            self._start_peers()
            code = asyncio.run(self._main())
            if self.hold and self.fed is not None:
                hold(self.console, self.fed.procs)
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
            if code in (0, 130) and not self.keep:  # a failure keeps its logs
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                self.console.print(
                    f"keys, peer data and logs kept in {self.workdir}", soft_wrap=True
                )
        return code

    def _start_peers(self) -> None:
        master = "local[1]" if self.n > 1 else "local[2]"  # several JVMs share the cores
        self.console.print(
            f"[bold]fedstream demo[/]: {self.ex.title}\n"
            f"starting {self.n} peer{'s' if self.n > 1 else ''} of {self.n} "
            f"participant{'s' if self.n > 1 else ''} ({', '.join(self.names)}), each a "
            f"`peer join` process with Spark {master}; work directory {self.workdir}",
            soft_wrap=True,
        )
        keys = make_participants(self.workdir, self.names)
        trust = self.workdir / "trust"
        spark = ("--spark-master", master, *GOSSIP)
        self.fed = LocalFederation(
            self.workdir,
            {name: [*participant_args(name, keys[name], trust), *spark] for name in self.names},
        )
        self.fed.start(wait=self._wait_ready)
        self.board.procs = list(self.fed.procs.values())

    def _wait_ready(self, name: str, proc: PeerProcess) -> None:
        try:
            proc.wait_ready(READY_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            raise DemoFailed(f"peer {name} did not start: {exc}") from None
        self.console.print(
            f"  {name:<9} node {proc.node_id[:8]}  API 127.0.0.1:{proc.port}  "
            f"overlay {proc.overlay_addr}  ({self.board.elapsed():.0f} s)"
        )
        if proc.http:
            self.console.print(f"            dashboard {proc.http}", soft_wrap=True, markup=False)

    def _stop_peers(self) -> None:
        if self.fed is None or not self.fed.procs:
            return
        self.console.print("stopping the peers ...")
        self.fed.stop(30)
        self.console.print(f"peers stopped ({self.board.elapsed():.0f} s in all)")

    # -- the asynchronous part --------------------------------------------------------------

    async def _main(self) -> int:
        from peer.client import Client

        board, module = self.board, self.ex.module
        inputs = self.ex.generate(self.seed, self.size, self.minutes)
        want: dict[str, Rows] = module.reference(inputs)
        cut = {s: batches(rows, self.ex.batch_s) for s, rows in inputs.items()}
        real_slots = self.minutes * 60 // self.ex.batch_s
        when = schedule(cut, real_slots, self.duration_s)
        for s, parts in cut.items():
            board.pushes[s] = PushState(s, len(parts), sum(len(r) for _, r in parts))
        for s in module.OUTPUTS:
            board.outputs[s] = OutputState(s, len(want[s]))

        clients = [Client("127.0.0.1", p.port, timeout_s=60) for p in board.procs]
        try:
            for c in clients:
                await c.connect()
            await self._wait_overlay(clients)
            await self._setup(clients[0])
            board.phase = "pushing"
            t0 = time.monotonic()
            # the view's tasks (they handle their own errors) end with the check; the pushers
            # are watched by _show, which raises if one failed
            async with asyncio.TaskGroup() as tg:
                views = [tg.create_task(poll(board, clients))]
                watch_on = self.n - 1  # results are read through the last peer (relayed)
                for s in module.OUTPUTS:
                    views.append(tg.create_task(watch(board, s, board.procs[watch_on].port)))
                pushers = [
                    tg.create_task(
                        push_stream(board, s, cut[s], when[s], t0, seed=self.seed * 1000 + i)
                    )
                    for i, s in enumerate(cut)
                ]
                try:
                    await self._show(pushers)
                    pushed_s = max(p.finished_at for p in board.pushes.values()) - t0
                    board.phase = "checking"
                    return await check_outputs(board, self.console, clients, want, inputs, pushed_s)
                finally:
                    for t in views:
                        t.cancel()
        except* DemoFailed as failed:  # a pusher gave up: say why, as before
            raise failed.exceptions[0] from None
        finally:
            for c in clients:
                with contextlib.suppress(Exception):
                    await c.close()

    async def _wait_overlay(self, clients: list[Client]) -> None:
        self.board.phase = "joining the overlay"
        seen: list[int] = []  # alive members each peer sees, at the last look

        async def all_see_all() -> bool:
            seen.clear()
            for c in clients:
                try:
                    members = (await c.status()).extra.get("overlay", {}).get("members", [])
                except Exception:
                    members = []
                seen.append(sum(1 for m in members if m.get("state") == "alive"))
            return all(k >= self.n for k in seen)

        try:
            await wait_until(all_see_all, "the overlay", OVERLAY_TIMEOUT_S, every_s=0.3)
        except TimeoutError:
            raise DemoFailed(
                f"the peers do not all see each other (alive members: {seen})"
            ) from None
        self.console.print(
            f"overlay formed: every peer sees {self.n} alive ({self.board.elapsed():.0f} s)"
        )

    async def _setup(self, client: Client) -> None:
        board, module = self.board, self.ex.module
        board.phase = "submitting the query"
        for schema in module.SCHEMAS:
            await client.create_schema(schema)
        for stream, schema_name in module.SOURCE_STREAMS.items():
            await client.create_stream(stream, schema_name)
        query = module.query(self.ex.name, board.nodes)
        made = await client.create_query(query)
        board.fragments = list(made.extra.get("fragments", []))
        placed = board.elapsed()
        await client.start_query(self.ex.name)
        by_node = {p.node_id: name for p, name in zip(board.procs, self.names, strict=True)}
        self.console.print(
            f"query [bold]{self.ex.name}[/] submitted by {self.names[0]}: "
            f"{len(board.fragments)} fragments placed ({placed:.0f} s), "
            f"started on their peers ({board.elapsed():.0f} s)",
            soft_wrap=True,
        )
        for name in self.names:
            boxes = [b for b, who in board.nodes.items() if who == name]
            frags = [f["name"] for f in board.fragments if by_node.get(f["site"]) == name]
            if boxes or frags:
                self.console.print(
                    f"  {name:<9} boxes {', '.join(boxes) or '-'}  ->  {', '.join(frags) or '-'}",
                    soft_wrap=True,
                )
        rows = sum(p.total_rows for p in board.pushes.values())
        self.console.print(
            f"pushing {rows} generated tuples ({self.minutes} minutes of event time, "
            f"{self.size} {self.ex.size_name}) over {self.duration_s:g} s, "
            "each batch through a random peer",
            soft_wrap=True,
        )

    def _dead_peer(self) -> str | None:
        for p, name in zip(self.board.procs, self.names, strict=True):
            if p.proc is not None and p.proc.poll() is not None:
                tail = p.log_path.read_text(errors="replace")[-1500:]
                return f"peer {name} exited with code {p.proc.returncode}; its log ends:\n{tail}"
        return None

    async def _show(self, pushers: list[asyncio.Task[None]]) -> None:
        """Refresh the view until everything is pushed and the outputs are complete (or
        have stalled); raise if a pusher failed or a peer died."""
        board = self.board
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
                board.phase = "waiting for the last results"
            if all(o.count >= o.expected for o in board.outputs.values()):
                return True
            last = max([drain_from, *(o.changed_at for o in board.outputs.values())])
            return now - last > STALL_S

        await follow(self.console, View(board), finished)
