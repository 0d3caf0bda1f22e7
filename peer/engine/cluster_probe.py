"""``peer doctor --spark-master URL``: whether a Spark cluster can be this peer's engine.

Theory of operation
-------------------
:class:`ClusterProbe` checks, in order, from the peer's host, what the peer will need:

1. ``master``: the master's port answers a TCP connect (a session would retry for a minute);
2. ``driver``: the options give a driver address executors can reach (not loopback for a
   master elsewhere) and the ``--spark-conf`` settings parse;
3. ``executors``: a session with the peer's settings starts and executors register within
   the timeout (they connect back to the driver: a driver they cannot reach never gets one);
4. ``code``: every executor imports the shipped code with this Python and pyarrow
   (:func:`peer.engine.shipping.check_executors`);
5. ``reach``: a task on the executors connects to this peer's listen address, where the
   probe listens for the time of the check;
6. ``checkpoint`` (with ``--checkpoint-dir``): tasks write a file each in the checkpoint
   directory, and the driver must read them: the same place for both.

Each failure says how to fix it; a check whose prerequisite failed says so instead of
running. The executor-side functions (:func:`connect_back`, :func:`write_mark`) import only the
standard library; this module is shipped with the others (``peer.engine.shipping``).
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ClusterProbe", "connect_back", "write_mark"]

HOW_WORKERS = (
    "start a Worker on each worker host with pyspark's `spark-class "
    "org.apache.spark.deploy.worker.Worker {master}`"
)


class NotChecked(RuntimeError):
    """A check that could not run because an earlier one failed."""


def _address_toward(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((host, port or 9))
            return str(sock.getsockname()[0])
        except OSError:
            return socket.gethostname()


def connect_back(host: str, port: int, token: str) -> Callable[[Any], Iterator[tuple[str, str]]]:
    """Executor side: connect to (``host``, ``port``) and send ``token``; yield (executor
    address, error or "")."""

    def task(_: Any) -> Iterator[tuple[str, str]]:
        me = _address_toward(host, port)
        try:
            with socket.create_connection((host, port), timeout=10) as conn:
                conn.sendall(token.encode() + b"\n")
        except OSError as exc:
            yield me, f"{type(exc).__name__}: {exc}"
            return
        yield me, ""

    return task


def write_mark(
    directory: str, token: str, toward: str
) -> Callable[[Any], Iterator[tuple[str, str, str]]]:
    """Executor side: write a file named after this executor into ``directory``; yield
    (executor address, file name, error or "")."""

    def task(_: Any) -> Iterator[tuple[str, str, str]]:
        me = _address_toward(toward, 0)
        name = f"{me}-{uuid.uuid4().hex[:8]}"
        try:
            Path(directory, name).write_text(f"{token} {me}")
        except OSError as exc:
            yield me, name, f"{type(exc).__name__}: {exc}"
            return
        yield me, name, ""

    return task


class ClusterProbe:
    """The cluster checks of one ``peer doctor`` run (module docstring), in order."""

    def __init__(
        self,
        master: str,
        listen: tuple[str, int],
        *,
        driver_host: str | None = None,
        spark_conf: tuple[str, ...] = (),
        checkpoint_dir: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.master = master
        self.listen = listen
        self.driver_host = driver_host
        self.spark_conf = spark_conf
        self.checkpoint_dir = checkpoint_dir
        self.timeout_s = timeout_s
        self.conf: dict[str, str] | None = None
        self.spark: SparkSession | None = None
        self.executors = 0
        self._ship = tempfile.TemporaryDirectory(prefix="fedstream-doctor-")
        self._failed: str | None = None

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        steps = [
            ("master", self.check_master),
            ("driver", self.check_driver),
            ("executors", self.check_executors),
            ("code", self.check_code),
            ("reach", self.check_reach),
        ]
        if self.checkpoint_dir is not None:
            steps.append(("checkpoint", self.check_checkpoint))
        return [(name, self._guarded(name, step)) for name, step in steps]

    def _guarded(self, name: str, step: Callable[[], str]) -> Callable[[], str]:
        def run() -> str:
            if self._failed is not None:
                raise NotChecked(f"not checked: the {self._failed} check failed")
            try:
                return step()
            except BaseException:
                self._failed = name
                raise

        return run

    def check_master(self) -> str:
        from peer.engine.cluster_conf import parse_master

        parse_master(self.master)
        if not self.master.startswith("spark://"):
            return f"{self.master}: not a standalone master, reached through Spark itself"
        for hostport in self.master[len("spark://") :].split(","):
            host, _, port = hostport.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError as exc:
                raise RuntimeError(
                    f"cannot reach the Spark master at {host}:{port} ({exc}): start it there "
                    f"(pyspark's `spark-class org.apache.spark.deploy.master.Master --host "
                    f"{host} --port {port}`), check --spark-master, and let this host reach "
                    f"TCP port {port}"
                ) from exc
        return f"{self.master} answers"

    def check_driver(self) -> str:
        from peer.engine.cluster_conf import driver_conf, parse_spark_conf

        self.conf = {
            **driver_conf(self.master, self.listen[0], self.driver_host),
            **parse_spark_conf(self.spark_conf),
        }
        host = self.conf.get("spark.driver.host", "(Spark's choice)")
        return f"the driver binds {self.conf.get('spark.driver.bindAddress')} as {host}"

    def check_executors(self) -> str:
        from peer.engine.session import build_session
        from peer.engine.shipping import wait_for_executors

        assert self.conf is not None
        self.spark = build_session(
            self.master,
            app_name="fedstream-doctor",
            conf=self.conf,
            warehouse_dir=self._ship.name,
            ship_dir=Path(self._ship.name),
            check=False,
        )
        # executors start one after another: a doctor waits longer for the last than a peer
        self.executors = wait_for_executors(self.spark, self.timeout_s, settle_s=15.0)
        if self.executors == 0:
            sc = self.spark.sparkContext
            driver = (
                f"{sc.getConf().get('spark.driver.host')}:{sc.getConf().get('spark.driver.port')}"
            )
            raise RuntimeError(
                f"no executor registered within {self.timeout_s:.0f} s. Either no Worker "
                f"has free cores and memory ({HOW_WORKERS.format(master=self.master)}; the "
                "master's web UI lists them), or executors cannot connect back to the driver "
                f"at {driver}: give --spark-driver-host an address of this host that the "
                "worker hosts route to, and open spark.driver.port and "
                "spark.blockManager.port to them (fix both with --spark-conf)"
            )
        return f"{self.executors} executor(s) registered"

    def check_code(self) -> str:
        from peer.engine.shipping import check_executors, local_versions

        assert self.spark is not None
        hosts = check_executors(self.spark, wait_s=self.timeout_s, job_s=self.timeout_s * 2)
        return (
            f"executors on {hosts} host(s) import the shipped code ({local_versions().describe()})"
        )

    def check_reach(self) -> str:
        from peer.engine.shipping import run_bounded

        assert self.spark is not None
        host, port = self.listen
        token = uuid.uuid4().hex
        heard: list[str] = []
        try:
            server = socket.create_server((host, port))
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host}:{port} to be reached ({exc})") from exc
        port = server.getsockname()[1]
        server.settimeout(0.5)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    with conn:
                        conn.settimeout(5)
                        heard.append(conn.recv(64).decode(errors="replace").strip())

        listener = threading.Thread(target=accept, name="doctor-reach", daemon=True)
        listener.start()
        try:
            tasks = self.executors * 4
            rdd = self.spark.sparkContext.parallelize(range(tasks), tasks)
            answers = run_bounded(
                self.spark,
                "doctor-reach",
                self.timeout_s,
                lambda: rdd.mapPartitions(connect_back(host, port, token)).collect(),
            )
        finally:
            done.set()
            listener.join(5)
            server.close()
        failed = sorted({f"{who} ({error})" for who, error in answers if error})
        if failed or token not in heard:
            raise RuntimeError(
                f"executors cannot reach this peer at {host}:{port}: {', '.join(failed)}. "
                f"Open TCP port {port} on this host to the worker hosts, and give --listen an "
                "address they route to"
            )
        return f"executors on {', '.join(sorted({w for w, _ in answers}))} reach {host}:{port}"

    def check_checkpoint(self) -> str:
        from peer.engine.checkpoint_home import parse_checkpoint_uri
        from peer.engine.shipping import run_bounded

        assert self.spark is not None and self.checkpoint_dir is not None
        base = parse_checkpoint_uri(self.checkpoint_dir)
        probe = base / f".doctor-{uuid.uuid4().hex[:12]}"
        try:
            probe.mkdir(parents=True)
        except OSError as exc:
            raise RuntimeError(
                f"cannot make {probe} on this host ({exc.strerror}): mount the shared "
                "directory here and make it writable"
            ) from exc
        try:
            token = uuid.uuid4().hex
            tasks = self.executors * 4
            rdd = self.spark.sparkContext.parallelize(range(tasks), tasks)
            marks = run_bounded(
                self.spark,
                "doctor-checkpoint",
                self.timeout_s,
                lambda: rdd.mapPartitions(write_mark(str(probe), token, self.listen[0])).collect(),
            )
            unseen = sorted(
                {
                    f"{who} ({error or 'wrote ' + name + ', not seen here'})"
                    for who, name, error in marks
                    if error or not _holds(probe / name, token)
                }
            )
        finally:
            for entry in probe.glob("*"):
                entry.unlink(missing_ok=True)
            probe.rmdir()
        if unseen:
            raise RuntimeError(
                f"{base} is not the same directory for the executors and this host: executors "
                f"on {', '.join(unseen)}. Mount the same shared directory (NFS or the like) at "
                f"{base} on every worker host and here, writable by the user running the Workers"
            )
        hosts = len({w for w, _, _ in marks})
        return f"{base}: files written by executors on {hosts} host(s) read here"

    def close(self) -> None:
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()
            self.spark = None
        self._ship.cleanup()


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text().startswith(token)
    except OSError:
        return False
