"""``peer doctor``: what is wrong with this machine for running a peer, and how to fix it.

With ``--spark-master`` of a cluster, the cluster is checked instead of a local Spark
(:mod:`peer.engine.cluster_probe`): master, driver address, executors, shipped code,
executors reaching this peer, and the shared checkpoint directory."""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from peer.cli.options import UsageError, parse_addr
from peer.engine.cluster_conf import is_cluster
from peer.engine.cluster_probe import ClusterProbe
from peer.engine.java import HOW_TO_FIX, find_java
from peer.errors import FedstreamError
from peer.storage.spool_format import STREAM_FILE, scan_spools


def _python() -> str:
    # setup.cfg requires 3.11, so an older interpreter never gets here: report which one runs.
    return f"{sys.version.split()[0]} at {sys.executable}"


def _packages() -> str:
    missing = [
        m
        for m in ("pyspark", "pyarrow", "pandas", "msgpack", "kademlia", "sqlglot")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise RuntimeError(
            f"missing Python packages {', '.join(missing)}: run "
            "`pip install fedstream` (or `pip install -e .` in a checkout)"
        )
    import pyspark

    return f"pyspark {pyspark.__version__}"


def _java() -> str:
    info = find_java()
    return f"Java {info.version} at {info.executable}"


def _data_dir(path: Path) -> Callable[[], str]:
    def check() -> str:
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path) as probe:
                probe.write(b"ok")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as exc:
            raise RuntimeError(
                f"data directory {path} is not writable ({exc.strerror}): choose "
                "another with --data-dir or fix its permissions"
            ) from exc
        return f"{path} writable"

    return check


def _spools(data_dir: Path) -> Callable[[], str]:
    """The spools a peer on ``data_dir`` would quarantine (read only: nothing is changed)."""

    def check() -> str:
        root = data_dir / "spool"
        bad = scan_spools(root)
        if bad:
            lines = [f"{q.reason}\n          fix: {q.fix}" for q in bad]
            raise RuntimeError(
                f"{len(bad)} spool(s) will be quarantined (not served) when the peer starts:\n"
                + "\n".join(f"          {line}" for line in lines)
            )
        count = len(list(root.glob(f"*/{STREAM_FILE}"))) if root.is_dir() else 0
        return f"{count} spool(s) in {root} open cleanly"

    return check


def _port(listen: str) -> Callable[[], str]:
    def check() -> str:
        host, _, port = listen.rpartition(":")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, int(port)))
            except OSError as exc:
                raise RuntimeError(
                    f"cannot listen on {listen} ({exc.strerror}): another peer "
                    "may run there; stop it or pick --listen HOST:PORT"
                ) from exc
        return f"{listen} free"

    return check


def _spark() -> str:
    from peer.engine.session import build_session

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        spark = build_session("local[1]", app_name="fedstream-doctor", warehouse_dir=tmp)
        try:
            value = spark.range(10).selectExpr("sum(id)").collect()[0][0]
            if value != 45:
                raise RuntimeError(f"Spark computed sum(0..9) = {value}")
            version = spark.version
        finally:
            spark.stop()
    return f"Spark {version} started and ran a job in {time.monotonic() - started:.1f} s"


def run_doctor(
    *, data_dir: Path, listen: str, spark: bool = True, cluster: ClusterProbe | None = None
) -> int:
    """Print each check's outcome; 0 when all passed. With ``cluster``, the cluster's checks
    (peer.engine.cluster_probe) replace the local Spark start-up check."""
    checks: list[tuple[str, Callable[[], str]]] = [
        ("python", _python),
        ("packages", _packages),
        ("java", _java),
        ("data dir", _data_dir(data_dir)),
        ("spools", _spools(data_dir)),
        ("port", _port(listen)),
    ]
    if cluster is not None:
        checks.extend(cluster.checks())
    elif spark:
        checks.append(("spark", _spark))
    try:
        failed = _report(checks)
    finally:
        if cluster is not None:
            cluster.close()
    print("all good" if not failed else f"{failed} problem(s) found")
    return 0 if not failed else 1


def _report(checks: list[tuple[str, Callable[[], str]]]) -> int:
    failed = 0
    for name, check in checks:
        try:
            detail = check()
            print(f"ok    {name:9} {detail}")
        except FedstreamError as exc:
            failed += 1
            print(f"FAIL  {name:9} {exc.message}")
        except Exception as exc:
            failed += 1
            hint = f" {HOW_TO_FIX}" if name == "spark" else ""
            print(f"FAIL  {name:9} {exc}{hint}")
    return failed


def cmd_doctor(args: argparse.Namespace) -> int:
    cluster = None
    if args.spark_master is not None and is_cluster(args.spark_master):
        cluster = ClusterProbe(
            args.spark_master,
            parse_addr(args.listen, what="--listen"),
            driver_host=args.spark_driver_host,
            spark_conf=tuple(args.spark_conf),
            checkpoint_dir=args.checkpoint_dir,
            timeout_s=args.cluster_timeout,
        )
    elif args.checkpoint_dir is not None:
        raise UsageError("--checkpoint-dir is checked with a cluster: give --spark-master too")
    return run_doctor(
        data_dir=Path(args.data_dir), listen=args.listen, spark=not args.quick, cluster=cluster
    )


def add_doctor_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check Java, Spark, data directory, spools and ports")
    p.add_argument(
        "--data-dir", default="./peer-data", metavar="DIR", help="the data directory to check"
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:7700",
        metavar="HOST:PORT",
        help="the client API address that must be free to listen on",
    )
    p.add_argument("--quick", action="store_true", help="skip the Spark start-up check")
    p.add_argument(
        "--spark-master",
        metavar="URL",
        help="check this cluster instead of a local Spark: the master answers, executors "
        "start, import the peer's code, reach the --listen address, and share --checkpoint-dir",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="URI",
        help="with --spark-master: the directory that must be the same for this host and "
        "every executor",
    )
    p.add_argument(
        "--spark-driver-host",
        metavar="HOST",
        help="with --spark-master: the driver address executors reach (as for `peer join`)",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --spark-master: a Spark setting, as for `peer join` (repeat)",
    )
    p.add_argument(
        "--cluster-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to wait for executors to register, and for each cluster check",
    )
    p.set_defaults(sync=cmd_doctor)
