"""``peer join``: run a peer until SIGINT or SIGTERM.

The options become a :class:`peer.node.PeerConfig`; Java is looked for first (exit 3 with how
to install it, unless ``--no-engine``). Once the peer serves, ``DATA_DIR/peer.json`` says
where (API port, overlay port, node id, participant, pid), written whole or not at all, so
that scripts and :class:`peer.testing.cluster.PeerProcess` can wait for it; it is removed when the
peer leaves. Failures to start are worded for the person who typed the command: an overlay
that cannot be joined is exit 2 (a federation that refuses our participant too: the message
says which participant and how to fix it), a bad identity or contract directory a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.cli.options import UsageError, parse_addr
from peer.errors import Unavailable
from peer.model.limits import DEFAULT_LIMITS, ContentLimits
from peer.storage.datadir import hold

if TYPE_CHECKING:
    from overlay.node import NotAdmitted
    from peer.node import Peer, PeerConfig


async def cmd_join(args: argparse.Namespace) -> int:
    from peer.node import Peer, PeerConfig

    host, port = parse_addr(args.listen, what="--listen")
    overlay_host: str | None = None
    overlay_port: int | None = None
    if args.overlay:
        overlay_host, overlay_port = parse_addr(args.overlay, what="--overlay")
    bootstrap = [parse_addr(b, what="--bootstrap") for b in args.bootstrap]
    http = http_address(args.http, host, port)
    if (args.key is None) != (args.participant is None):
        raise UsageError("--participant and --key go together (the key is that participant's)")
    if not args.repair_after > 0:
        raise UsageError(
            f"--repair-after must be a number of seconds above 0, not {args.repair_after}"
        )
    spark_conf, checkpoint_root = engine_options(args, host)
    elastic = elastic_options(args)
    if not args.no_engine:
        from peer.engine.java import find_java

        find_java()
    try:
        limits = ContentLimits(
            max_push_bytes=args.max_push_bytes, max_query_bytes=args.max_query_bytes
        )
    except ValueError as exc:
        raise UsageError(f"--max-push-bytes/--max-query-bytes: {exc}") from exc
    config = PeerConfig(
        data_dir=Path(args.data_dir),
        host=host,
        port=port,
        engine=not args.no_engine,
        fuse_stateless=not args.no_lane,
        warm_up=not args.no_warm_up,
        standby=args.standby,
        spark_master=args.spark_master,
        spark_conf=spark_conf,
        checkpoint_root=checkpoint_root,
        overlay_host=overlay_host,
        overlay_port=overlay_port,
        bootstrap=bootstrap,
        bootstrap_timeout_s=args.bootstrap_timeout,
        participant=args.participant,
        key_path=Path(args.key) if args.key else None,
        trust_dir=Path(args.trust) if args.trust else None,
        gossip_interval_s=args.gossip_interval,
        suspect_after_s=args.suspect_after,
        dead_after_s=args.dead_after,
        max_backlog_batches=args.max_backlog,
        backlog_wait_s=args.backlog_wait,
        contracts_dir=Path(args.contracts) if args.contracts else None,
        capacity=args.capacity,
        bpm_period_s=args.bpm_period,
        offer_margin=args.offer_margin,
        accept_margin=args.accept_margin,
        voter=args.voter,
        volunteer=args.volunteer and args.launched_as is None,
        replicas=args.replicas,
        min_insync=args.min_insync,
        repair_after_s=args.repair_after,
        http=http,
        limits=limits,
        elastic=elastic,
        provisioner=args.provisioner,
        launch_args=launch_args(args),
        launched_as=args.launched_as,
        elastic_interval_s=args.elastic_interval,
    )
    held = hold(config.data_dir)  # one peer per data directory (peer.storage.datadir)
    try:
        return await run_peer(Peer(config), config, args, host)
    finally:
        held.release()


async def run_peer(node: Peer, config: PeerConfig, args: argparse.Namespace, host: str) -> int:
    """Start ``node``, say where it listens (``DATA_DIR/peer.json``), run it until stopped."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, node.stop)
    try:
        await node.start()
    except BaseException as exc:
        await node.close()
        from overlay.identity import IdentityError
        from overlay.node import NotAdmitted, OverlayError

        if isinstance(exc, NotAdmitted):
            raise Unavailable(refused_message(exc, args.data_dir)) from exc
        if isinstance(exc, OverlayError):
            raise Unavailable(f"cannot join the overlay: {exc}") from exc
        if isinstance(exc, IdentityError):
            raise UsageError(f"identity: {exc}") from exc
        from contracts.contract import ContractError

        if isinstance(exc, ContractError):
            raise UsageError(f"--contracts: {exc}") from exc
        raise
    address: dict[str, Any] = {"host": host, "port": node.port, "pid": os.getpid()}
    if node.overlay is not None:
        address["overlay_port"] = node.overlay.port
        address["node_id"] = node.overlay.node_id.hex()
        address["participant"] = node.overlay.identity.participant
    if node.http is not None:
        address["http"] = node.http.url
    marker = config.data_dir / "peer.json"
    marker.with_suffix(".tmp").write_text(json.dumps(address))
    marker.with_suffix(".tmp").replace(marker)  # readers never see half a file
    print(f"peer ready on {host}:{node.port} (data {config.data_dir}); Ctrl-C to leave", flush=True)
    if node.http is not None:
        print(f"dashboard {node.http.url}  metrics {node.http.url}metrics", flush=True)
    await node.run()
    with contextlib.suppress(OSError):
        (config.data_dir / "peer.json").unlink()
    return 0


def engine_options(args: argparse.Namespace, listen_host: str) -> tuple[dict[str, str], Path]:
    """The Spark settings and the checkpoint directory that the options give, or a usage
    error saying what to give instead (peer.engine.cluster_conf, peer.engine.checkpoint_home)."""
    from peer.engine.checkpoint_home import CheckpointDirError, resolve
    from peer.engine.cluster_conf import ClusterError, driver_conf, parse_master, parse_spark_conf

    try:
        master = parse_master(args.spark_master)
        conf = {
            **driver_conf(master, listen_host, args.spark_driver_host),
            **parse_spark_conf(args.spark_conf),
        }
        home = resolve(Path(args.data_dir), args.checkpoint_dir)
    except (ClusterError, CheckpointDirError) as exc:
        raise UsageError(str(exc)) from exc
    return conf, home.root


ELASTIC_INTERVAL_S = 10.0


def elastic_options(args: argparse.Namespace) -> tuple[int, int] | None:
    """``--elastic MIN:MAX`` (and ``--provisioner``, ``--launched-as``) checked, or a usage
    error naming what is wrong."""
    from peer.elastic.provision import check_template
    from peer.elastic.sizing import SizingPolicy

    if args.launched_as is not None and not args.launched_as.strip():
        raise UsageError("--launched-as must name the peer")
    if args.elastic is None:
        if args.launched_as is not None:
            raise UsageError("--launched-as goes with --elastic MIN:MAX")
        return None
    text = args.elastic.strip()
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None:
        raise UsageError(f"--elastic must be MIN:MAX (two whole numbers), not {text!r}")
    try:
        SizingPolicy(*bounds)
    except ValueError as exc:
        raise UsageError(f"--elastic: {exc}") from None
    if not (math.isfinite(args.elastic_interval) and args.elastic_interval > 0):
        raise UsageError(
            f"--elastic-interval must be a number of seconds above 0, not {args.elastic_interval}"
        )
    if args.participant is None or args.no_engine:
        raise UsageError(
            "--elastic needs --participant and --key (the peers it starts are that "
            "participant's) and an engine (not --no-engine)"
        )
    if args.provisioner.strip() != "local":
        try:
            check_template(args.provisioner)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return bounds


def launch_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The options peers launched by this one share with it."""
    shared: list[str] = []
    if args.capacity is not None:
        shared += ["--capacity", str(args.capacity)]
    if args.spark_master is not None and args.spark_master != "local[*]":
        shared += ["--spark-master", args.spark_master]
    if args.no_lane:
        shared.append("--no-lane")
    if args.elastic_interval != ELASTIC_INTERVAL_S:
        shared += ["--elastic-interval", str(args.elastic_interval)]
    shared += ["--replicas", str(args.replicas), "--min-insync", str(args.min_insync)]
    return tuple(shared)


def refused_message(exc: NotAdmitted, data_dir: str) -> str:
    """What to do when the federation refused this peer's participant."""
    name = exc.participant
    return (
        f"refused: {exc}. Fix: copy {name}.pub "
        f"(written by `peer keygen {name}` beside {name}.key; for a peer started without "
        f"--participant, {data_dir}/keys/participant.pub renamed {name}.pub) into the trust "
        "directory of the peers you join (their `peer join --trust DIR`, or their "
        "DATA_DIR/trust/), restart them, then start this peer again"
    )


def http_address(value: str | None, api_host: str, api_port: int) -> tuple[str, int] | None:
    """``--http``: HOST:PORT, ``off``, or by default the API host on the API port + 2 (an
    ephemeral port when the API's is)."""
    if value is None:
        return api_host, api_port + 2 if api_port else 0
    if value.strip().lower() == "off":
        return None
    return parse_addr(value, what="--http")


def add_join_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("join", help="run a peer until SIGINT/SIGTERM")
    p.add_argument(
        "--data-dir",
        default="./peer-data",
        metavar="DIR",
        help="where the peer keeps its keys, catalog, spools, checkpoints and ledger",
    )
    p.add_argument(
        "--participant",
        help="participant name (with --key; default: a standalone participant of its own)",
    )
    p.add_argument(
        "--key", metavar="FILE", help="the participant's private key file (from `peer keygen`)"
    )
    p.add_argument(
        "--listen", default="127.0.0.1:7700", metavar="HOST:PORT", help="client API address"
    )
    p.add_argument(
        "--overlay",
        help="overlay address: UDP (DHT) and TCP (peer links) on one port "
        "(default: the --listen host, its port + 1)",
    )
    p.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="overlay address of a peer to join through (repeat: tried in turn; default: "
        "none, start a federation alone)",
    )
    p.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="exit 2 when no --bootstrap peer admits this one within S seconds",
    )
    p.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus), /status and the dashboard here (default: the "
        "--listen host, its port + 2; 'off': none); off loopback it takes TLS like the API",
    )
    p.add_argument(
        "--contracts",
        metavar="DIR",
        help="directory of signed contract files (*.toml): partners this peer shares load with",
    )
    p.add_argument(
        "--capacity",
        type=float,
        metavar="CORES",
        help="CPU cores this peer's load is measured against (default: all of them)",
    )
    p.add_argument(
        "--bpm-period", type=float, default=5.0, metavar="S", help="seconds between load checks"
    )
    p.add_argument(
        "--offer-margin",
        type=float,
        default=0.05,
        help="offer load to a partner when its cost is above price*(1+margin)",
    )
    p.add_argument(
        "--accept-margin",
        type=float,
        default=0.05,
        help="accept a partner's load while its cost is below price*(1-margin)",
    )
    p.add_argument(
        "--trust",
        metavar="DIR",
        help="directory of trusted participants' public keys (NAME.pub) (default: DATA_DIR/trust)",
    )
    p.add_argument(
        "--gossip-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between liveness and load gossip rounds",
    )
    p.add_argument(
        "--suspect-after",
        type=float,
        default=3.0,
        metavar="S",
        help="seconds of silence before a peer is suspected",
    )
    p.add_argument(
        "--dead-after",
        type=float,
        default=8.0,
        metavar="S",
        help="seconds of silence before a peer is declared dead",
    )
    p.add_argument(
        "--max-backlog",
        type=int,
        default=1000,
        metavar="BATCHES",
        help="backpressure: batches a stream may hold that its slowest reader has not taken",
    )
    p.add_argument(
        "--backlog-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="how long a push waits for room before a retriable refusal",
    )
    p.add_argument(
        "--max-push-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_push_bytes,
        metavar="BYTES",
        help="refuse a pushed Arrow batch larger than this once decompressed",
    )
    p.add_argument(
        "--max-query-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_query_bytes,
        metavar="BYTES",
        help="refuse a query definition larger than this (XML or JSON text, or a map)",
    )
    seat = p.add_mutually_exclusive_group()
    seat.add_argument(
        "--voter",
        action="store_true",
        help="hold a seat in the control plane (Raft) that names each stream's primary, "
        "whatever the number of voters",
    )
    seat.add_argument(
        "--no-voter",
        dest="volunteer",
        action="store_false",
        help="never sit in the control plane (by default a peer volunteers while it has "
        "fewer than 3 voters, 5 once five peers are live)",
    )
    p.set_defaults(volunteer=True)
    p.add_argument(
        "--replicas",
        type=int,
        default=3,
        metavar="R",
        help="how many peers hold each stream created through this peer (default 3)",
    )
    p.add_argument(
        "--min-insync",
        type=int,
        default=2,
        metavar="N",
        help="a push is acknowledged once N replicas hold it (default 2)",
    )
    p.add_argument(
        "--repair-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a replica silent this long is replaced by a live peer in its streams' replica "
        "sets (default 30)",
    )
    p.add_argument(
        "--spark-master",
        default="local[*]",
        metavar="URL",
        help="the Spark master of this peer's engine: local[N], or spark://HOST:PORT for a "
        "standalone cluster whose executors run on other hosts (docs/operations.md, "
        "'Running a peer on a Spark cluster')",
    )
    p.add_argument(
        "--spark-driver-host",
        metavar="HOST",
        help="with a cluster master: the address executors reach this peer's Spark driver at "
        "(default: the --listen host)",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeat), e.g. spark.driver.port=7078, "
        "spark.blockManager.port=7079, spark.executor.memory=2g; overrides the peer's own",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="URI",
        help="where Spark checkpoints and state go: a directory every cluster host mounts at "
        "the same path (/shared/dir or file:///shared/dir); each peer takes a directory of "
        "its own beneath it (default: DATA_DIR/checkpoints)",
    )
    p.add_argument("--no-engine", action="store_true", help="serve without Spark")
    p.add_argument(
        "--elastic",
        metavar="MIN:MAX",
        help="grow and shrink this participant between MIN and MAX peers with its load: one "
        "of its --elastic peers leads, starting peers through --provisioner and draining "
        "them (docs/operations.md, 'Elastic participants')",
    )
    p.add_argument(
        "--provisioner",
        default="local",
        metavar="SPEC",
        help="how --elastic starts a peer: 'local' (peer join on this machine, data beside "
        "this peer's; the default) or a shell command template with {participant}, "
        "{bootstrap} and {name}",
    )
    p.add_argument(
        "--elastic-interval",
        type=float,
        default=ELASTIC_INTERVAL_S,
        metavar="SECONDS",
        help="how often the burst leader decides the participant's size; it waits three "
        "times as long after a change, and before it counts a new peer's rates "
        f"(default {ELASTIC_INTERVAL_S:g})",
    )
    p.add_argument(
        "--launched-as",
        metavar="NAME",
        help="(set by the provisioner) this peer was started as NAME by the burst leader: "
        "it never takes a voter's seat, and drains and exits when NAME leaves the plan",
    )
    p.add_argument(
        "--no-lane",
        action="store_true",
        help="run every query as its own Spark streaming query (no shared lane for per-tuple "
        "queries and small windowed aggregates)",
    )
    p.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip running a small windowed query once after Spark starts (by default the "
        "peer warms its engine up so that the first fragment it takes over starts fast)",
    )
    p.add_argument(
        "--standby",
        action="store_true",
        help="give the queries this peer coordinates a warm standby of their stateful "
        'fragments unless they say otherwise (a query\'s "standby": true|false)',
    )
    p.set_defaults(run=cmd_join)
