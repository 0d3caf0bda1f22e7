"""How a peer's Spark driver is set up for a master: local, or a cluster on other hosts.

Pure (no pyspark, no I/O): ``peer join`` and ``peer doctor`` read their options through it,
:mod:`peer.engine.session` applies what it returns. A local master (``local``, ``local[N]``)
keeps the driver on loopback, exactly as before. A cluster master (``spark://``, ``yarn``,
``k8s://``) gets a driver that binds the peer's listen host (or ``--spark-driver-host``) and
advertises it, since executors on other hosts connect back to the driver; ``--spark-conf``
settings come last and override anything here (fixed ports for firewalls, executor memory).
Spark Connect (``sc://``) is refused: its driver runs inside the Connect server, so the
peer's Python data sources and ``foreachBatch`` sink would run in a process of the server's,
not in the peer, which the engine is built around (docs/operations.md).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ClusterError",
    "Versions",
    "driver_conf",
    "is_cluster",
    "parse_master",
    "parse_spark_conf",
    "version_mismatch",
]

_LOCAL = re.compile(r"local(\[(\*|[1-9][0-9]*)(,[1-9][0-9]*)?\])?")
_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
WILDCARDS = ("0.0.0.0", "::", "")

CONNECT_REFUSED = (
    "Spark Connect (sc://) is not supported: with Connect the driver runs in the Connect "
    "server, so this peer's spool source and its result sink (foreachBatch) would run in a "
    "process of the server's, not in the peer. Give the cluster's master instead "
    "(--spark-master spark://HOST:PORT) and let the peer be the driver"
)


class ClusterError(ValueError):
    """A Spark option that cannot work, with what to give instead."""


def parse_master(url: str) -> str:
    """``url`` if this peer can drive it, else ClusterError saying why and what to give."""
    text = url.strip()
    if text.startswith("sc://"):
        raise ClusterError(f"--spark-master {url}: {CONNECT_REFUSED}")
    if _LOCAL.fullmatch(text):
        return text
    if text.startswith("spark://"):
        hosts = text[len("spark://") :].split(",")
        if all(re.fullmatch(r"[^:/\s]+:[0-9]{1,5}", h) for h in hosts):
            return text
        raise ClusterError(f"--spark-master {url}: a standalone master is spark://HOST:PORT")
    if text == "yarn" or text.startswith("k8s://"):
        return text
    raise ClusterError(
        f"--spark-master {url}: give local, local[N], local[*] or spark://HOST:PORT "
        "(also yarn or k8s://URL)"
    )


def is_cluster(master: str) -> bool:
    """Whether executors of ``master`` may live on other hosts (anything but local)."""
    return not _LOCAL.fullmatch(master.strip())


def parse_spark_conf(items: Sequence[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options, in order (a later one wins), or ClusterError."""
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            raise ClusterError(
                f"--spark-conf {item!r}: give KEY=VALUE with a Spark setting as KEY, "
                "e.g. --spark-conf spark.executor.memory=2g"
            )
        if not key.startswith(("spark.", "hive.")):
            raise ClusterError(
                f"--spark-conf {item!r}: {key} is not a Spark setting (they start with spark.)"
            )
        if value == "":
            raise ClusterError(f"--spark-conf {item!r}: {key} has no value")
        conf[key] = value
    return conf


def driver_conf(master: str, listen_host: str, driver_host: str | None) -> dict[str, str]:
    """The driver's address settings for ``master``: none for a local master (the session's
    loopback defaults stand), else bind and advertise an address executors can reach."""
    if not is_cluster(master):
        if driver_host is not None:
            raise ClusterError(
                f"--spark-driver-host {driver_host}: only for a cluster master "
                f"(--spark-master spark://...), not {master}"
            )
        return {}
    advertised = driver_host if driver_host is not None else listen_host
    if advertised.strip("[]") in WILDCARDS:
        raise ClusterError(
            f"--listen {listen_host} is every address: give --spark-driver-host HOST, the "
            "address at which executors on other hosts reach this peer"
        )
    if _loopback(advertised) and not _master_on_loopback(master):
        raise ClusterError(
            f"the driver would advertise {advertised}, a loopback address that executors on "
            f"other hosts of {master} cannot reach: give --spark-driver-host HOST (this "
            "host's address on the cluster's network) or --listen on that address"
        )
    bind = listen_host if driver_host is None or listen_host in WILDCARDS else driver_host
    return {"spark.driver.bindAddress": bind, "spark.driver.host": advertised}


def _master_on_loopback(master: str) -> bool:
    """A standalone master on loopback: its workers share this host (loopback reaches)."""
    if not master.startswith("spark://"):
        return False
    hosts = [h.rpartition(":")[0] for h in master[len("spark://") :].split(",")]
    return all(_loopback(h) for h in hosts)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Versions:
    """The Python and pyarrow a process runs (major.minor each)."""

    python: str
    pyarrow: str

    def describe(self) -> str:
        return f"Python {self.python} and pyarrow {self.pyarrow}"


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_mismatch(driver: Versions, executors: Sequence[tuple[str, Versions]]) -> str | None:
    """Why the executors (host, versions) cannot run this driver's code, or None. Arrow IPC
    and pickled functions cross between them, so major.minor must agree."""
    bad = [
        (host, v)
        for host, v in executors
        if _major_minor(v.python) != _major_minor(driver.python)
        or _major_minor(v.pyarrow) != _major_minor(driver.pyarrow)
    ]
    if not bad:
        return None
    hosts = ", ".join(sorted({f"{host} ({v.describe()})" for host, v in bad}))
    return (
        f"executors on {hosts} do not match this peer's driver ({driver.describe()}): "
        "install the same Python and pyarrow major.minor versions on every worker host "
        "(docs/operations.md, 'Running a peer on a Spark cluster')"
    )
