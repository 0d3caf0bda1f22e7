"""A Spark standalone cluster whose Workers live on other "hosts": network and mount namespaces.

Theory of operation
-------------------
:class:`SparkCluster` starts, from pyspark's own ``bin/spark-class``, a standalone Master here
and ``workers`` Workers of ``cores`` cores each, every Worker on a host of its own:

- **network**: a bridge ``fsb<tag>`` here holds ``driver_host`` (``10.215.X.1/24``); each
  Worker runs in a namespace ``fsw<tag>n<i>`` joined to the bridge by a veth pair, with the
  address ``10.215.X.(10+i)`` and a default route through the bridge. The Master listens on
  ``driver_host``; a driver that binds ``driver_host`` is reachable from every Worker and its
  executors, one that binds loopback is not (as on real hosts);
- **file system**: each Worker also runs in its own mount namespace (``unshare -m``) in which
  every directory of ``hidden`` (the tests' temporary root, holding the peer's data
  directory) is covered by an empty tmpfs, as are the directories this package is imported
  from (so executors import only the code the peer ships them). ``shared`` is bind-mounted
  back at the same path in every namespace, the way an NFS export is mounted on every host:
  the one directory driver and executors both see (the checkpoint directory).

Workers run with the interpreter of this process (``PYSPARK_PYTHON``) and without
``PYTHONPATH``. :meth:`kill_worker` kills a Worker and its executors with SIGKILL (a host
that dies); :meth:`start_worker` starts it again. Everything is removed on exit, also when a
step of making it failed. Needs root, iproute2, ``unshare`` and a Java for Spark:
:func:`missing` names what this machine lacks (tests skip with it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["SparkCluster", "WorkerHost", "missing", "spark_class"]

_serial = itertools.count()
PACKAGES = ("peer", "overlay", "contracts")


def spark_class() -> Path:
    """pyspark's own ``bin/spark-class`` (the pip wheel ships it with Spark's jars)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def missing() -> str | None:
    """What this machine lacks to run a :class:`SparkCluster` (None: nothing)."""
    if os.geteuid() != 0:
        return "a Spark cluster in namespaces needs root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"a Spark cluster in namespaces needs `{tool}` on PATH"
    try:
        from peer.engine.java import find_java

        find_java()
    except Exception as exc:
        return f"a Spark cluster needs Java: {exc}"
    if not spark_class().is_file():
        return f"pyspark has no {spark_class()}"
    return None


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _code_dirs() -> list[Path]:
    """Where a fresh interpreter (no PYTHONPATH) and this one import this project from."""
    found: set[Path] = set()
    for name in PACKAGES:
        module = sys.modules.get(name)
        if module is not None and module.__file__:
            found.add(Path(module.__file__).parent)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        "import importlib.util as u\n"
        f"for n in {PACKAGES!r}:\n"
        " s = u.find_spec(n)\n"
        " if s and s.origin: print(s.origin)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60, cwd="/"
    )
    found.update(Path(line).parent for line in done.stdout.split() if line.endswith(".py"))
    return sorted(found)


@dataclass
class WorkerHost:
    """One Worker's "host": its namespace, address and process."""

    index: int
    netns: str
    veth_here: str
    veth_there: str
    address: str
    work_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None


class SparkCluster:
    """A standalone Master here and Workers on hosts of their own (module docstring)."""

    def __init__(
        self,
        *,
        shared: Path,
        hidden: Sequence[Path] = (),
        workers: int = 2,
        cores: int = 1,
        worker_memory: str = "1g",
        base: Path | None = None,
        hide_code: bool = True,
    ) -> None:
        n = next(_serial)
        tag = f"{os.getpid() % 10000}{n}"
        block = (os.getpid() * 7 + n) % 250 + 1
        self.tag = tag
        self.bridge = f"fsb{tag}"
        self.driver_host = f"10.215.{block}.1"
        self._prefix = f"10.215.{block}"
        self.shared = shared
        self.hidden = [Path(p) for p in hidden]
        self.cores = cores
        self.worker_memory = worker_memory
        self.hide_code = hide_code
        self._own_base = base is None  # removed on exit (logs and work directories)
        self.base = base or Path(tempfile.mkdtemp(prefix=f"fscluster{tag}-"))
        self.master_port = 0
        self.master_proc: subprocess.Popen[bytes] | None = None
        self.hosts = [
            WorkerHost(
                i,
                f"fsw{tag}n{i}",
                f"fsv{tag}h{i}",
                f"fsv{tag}n{i}",
                f"{self._prefix}.{10 + i}",
                self.base / f"worker{i}",
                self.base / f"worker{i}.log",
            )
            for i in range(workers)
        ]

    @property
    def master_url(self) -> str:
        return f"spark://{self.driver_host}:{self.master_port}"

    # lifecycle
    def __enter__(self) -> SparkCluster:
        try:
            self._network()
            self._start_master()
            for host in self.hosts:
                self.start_worker(host.index)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.driver_host}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            _run("ip", "netns", "add", h.netns)
            _run("ip", "link", "add", h.veth_here, "type", "veth", "peer", "name", h.veth_there)
            _run("ip", "link", "set", h.veth_there, "netns", h.netns)
            _run("ip", "link", "set", h.veth_here, "master", self.bridge)
            _run("ip", "link", "set", h.veth_here, "up")
            _run("ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", h.veth_there)
            _run("ip", "-n", h.netns, "link", "set", h.veth_there, "up")
            _run("ip", "-n", h.netns, "link", "set", "lo", "up")
            _run("ip", "-n", h.netns, "route", "add", "default", "via", self.driver_host)

    def _env(self, local_ip: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
        env.update(
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP=local_ip,
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _start_master(self) -> None:
        self.master_port = _free_port(self.driver_host)
        log = (self.base / "master.log").open("ab")
        self.master_proc = subprocess.Popen(
            [
                str(spark_class()),
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.driver_host,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(_free_port(self.driver_host)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(self.driver_host),
            start_new_session=True,
        )
        self._wait_log(self.base / "master.log", "ALIVE", self.master_proc, "the Master")

    def _worker_script(self, host: WorkerHost) -> str:
        stage = self.base / f"stage{host.index}"
        stage.mkdir(exist_ok=True)
        host.work_dir.mkdir(exist_ok=True)
        hide = [*self.hidden, *(_code_dirs() if self.hide_code else [])]
        q = shlex.quote
        lines = ["set -e", f"mount --bind {q(str(self.shared))} {q(str(stage))}"]
        lines += [f"mount -t tmpfs -o size=1m fshidden {q(str(d))}" for d in hide]
        lines += [
            f"mkdir -p {q(str(self.shared))}",
            f"mount --move {q(str(stage))} {q(str(self.shared))}",
            "exec "
            + shlex.join(
                [
                    str(spark_class()),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    host.address,
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(host.work_dir),
                    "--webui-port",
                    "0",
                    f"spark://{self.driver_host}:{self.master_port}",
                ]
            ),
        ]
        return "\n".join(lines)

    def start_worker(self, index: int, timeout_s: float = 240) -> WorkerHost:
        """Start Worker ``index`` on its host and wait until the Master registered it."""
        host = self.hosts[index]
        if host.proc is not None and host.proc.poll() is None:
            raise RuntimeError(f"worker {index} runs already")
        mark = host.log_path.stat().st_size if host.log_path.exists() else 0
        log = host.log_path.open("ab")
        host.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                self._worker_script(host),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(host.address),
            start_new_session=True,
        )
        self._wait_log(
            host.log_path,
            "Successfully registered with master",
            host.proc,
            f"worker {index}",
            timeout_s,
            since=mark,
        )
        return host

    def kill_worker(self, index: int) -> None:
        """SIGKILL Worker ``index`` and its executors, as when its host dies."""
        proc = self.hosts[index].proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self.hosts[index].proc = None

    def run_on(
        self, index: int, *argv: str, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on Worker ``index``'s host (its network namespace; not its mounts)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[index].netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def _wait_log(
        self,
        path: Path,
        needle: str,
        proc: subprocess.Popen[bytes],
        what: str,
        timeout_s: float = 240,
        since: int = 0,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = path.read_bytes()[since:].decode(errors="replace") if path.exists() else ""
            if needle in text:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited ({proc.returncode}): {text[-2000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"{what}: no {needle!r} in {path} after {timeout_s:.0f} s")

    def close(self) -> None:
        """Stop every process and remove the namespaces, links and the bridge."""
        for host in self.hosts:
            self.kill_worker(host.index)
        if self.master_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.master_proc.pid, signal.SIGKILL)
            self.master_proc.wait(30)
            self.master_proc = None
        for host in self.hosts:
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _run("ip", "netns", "del", host.netns)
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _run("ip", "link", "del", host.veth_here)
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            _run("ip", "link", "del", self.bridge)
        if self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def logs(self) -> str:
        """The tails of the Master's and Workers' logs (for a failing test's message)."""
        parts = []
        for path in [self.base / "master.log", *(h.log_path for h in self.hosts)]:
            if path.exists():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)
