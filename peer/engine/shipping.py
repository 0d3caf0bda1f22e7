"""The peer's Spark-side code, shipped to a cluster's executors; and a check that they can run it.

Executors unpickle what the driver sends them (the ``fedspool`` and lane data sources, the
stateful boxes' functions, the lane's window code) and import the modules those name. On a
local master they find this package where the peer does; on a cluster a worker host has only
Python, pyarrow and pyspark. :func:`build_zip` walks the import statements of
:data:`EXECUTOR_ROOTS` (every ``import`` and ``from ... import`` in the module, functions and
``TYPE_CHECKING`` blocks included: a superset is harmless) through this project's packages
and writes the modules found, with their packages' ``__init__.py``, into one zip;
:func:`ship` hands it to Spark (``SparkContext.addPyFile``: Spark serves it from the driver
and puts it on every executor's ``sys.path``).

:func:`check_executors` then runs a task on each executor that imports the shipped modules
and reports its Python and pyarrow versions: a mismatch with the driver (or an executor that
cannot import the code) fails at engine start with both versions named, not later inside a
query as a pickling trace. It waits a bounded time for executors to register; with none, the
check is left to the queries (which wait for executors as Spark does).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import platform
import socket
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.engine.cluster_conf import Versions, version_mismatch
from peer.errors import EngineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PACKAGES = ("peer", "overlay", "contracts")
# What executors import: the spool and lane sources, the boxes' functions, the lane's window
# code, and this module and the doctor's probe (their checks run there).
EXECUTOR_ROOTS = (
    "peer.engine.source",
    "peer.engine.lane_source",
    "peer.engine.lanesql",
    "peer.engine.lanewin",
    "peer.engine.stateful",
    "peer.engine.compile",
    "peer.engine.shipping",
    "peer.engine.cluster_probe",
)
ZIP_NAME = "fedstream-executor.zip"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # the same modules make the same bytes


def _origin(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imports(module: str, path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # maybe submodules


def executor_modules(roots: Sequence[str] = EXECUTOR_ROOTS) -> dict[str, Path]:
    """Module name -> source file of everything ``roots`` import from this project."""
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in found or name.split(".")[0] not in PACKAGES:
            continue
        path = _origin(name)
        if path is None:
            continue
        found[name] = path
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        todo.extend(_imports(name, path))
    return found


def build_zip(directory: Path, roots: Sequence[str] = EXECUTOR_ROOTS) -> Path:
    """Write the executors' modules to ``directory/fedstream-executor.zip`` (atomically)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / ZIP_NAME
    partial = directory / f".{ZIP_NAME}.{uuid.uuid4().hex}"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in sorted(executor_modules(roots).items()):
            arcname = name.replace(".", "/")
            arcname += "/__init__.py" if path.name == "__init__.py" else ".py"
            info = zipfile.ZipInfo(arcname, _FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    partial.replace(target)
    return target


def ship(spark: SparkSession, directory: Path) -> Path:
    """Build the zip in ``directory`` and have Spark put it on every executor's path."""
    archive = build_zip(directory)
    spark.sparkContext.addPyFile(str(archive))
    log.info("shipped %s to the executors", archive)
    return archive


def local_versions() -> Versions:
    import pyarrow

    return Versions(platform.python_version(), pyarrow.__version__)


def executor_report(_: Any) -> Iterator[tuple[str, str, str]]:
    """Run on an executor: import the shipped modules, then say (host, Python, pyarrow)."""
    import importlib

    for name in EXECUTOR_ROOTS:
        importlib.import_module(name)
    versions = local_versions()
    yield socket.gethostname(), versions.python, versions.pyarrow


def executor_count(spark: SparkSession) -> int:
    """Executors registered now (the driver is not counted)."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)


def wait_for_executors(spark: SparkSession, timeout_s: float, settle_s: float = 5.0) -> int:
    """How many executors registered: once one has, until no other came for ``settle_s``
    (executors of one cluster start together, not at once), within ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    count, since = 0, time.monotonic()
    while time.monotonic() < deadline:
        now = executor_count(spark)
        if now != count:
            count, since = now, time.monotonic()
        elif count and time.monotonic() - since >= settle_s:
            break
        time.sleep(0.5)
    return count


def run_bounded(spark: SparkSession, what: str, timeout_s: float, job: Any) -> Any:
    """``job()`` (Spark jobs started on this thread), cancelled after ``timeout_s``."""
    sc = spark.sparkContext
    group = f"fedstream-{what}-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, what, interruptOnCancel=True)
    timer = threading.Timer(timeout_s, sc.cancelJobGroup, (group,))
    timer.start()
    try:
        return job()
    finally:
        timer.cancel()
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


def check_executors(spark: SparkSession, *, wait_s: float = 60.0, job_s: float = 120.0) -> int:
    """Fail with EngineError unless every registered executor imports the shipped code with
    this driver's Python and pyarrow major.minor; say how many were checked (0: none came
    within ``wait_s``, nothing checked)."""
    count = wait_for_executors(spark, wait_s)
    if count == 0:
        log.warning(
            "no Spark executor registered within %.0f s: the code and version check waits for "
            "the queries (see `peer doctor --spark-master`)",
            wait_s,
        )
        return 0
    sc = spark.sparkContext

    def job() -> list[tuple[str, str, str]]:
        rdd = sc.parallelize(range(count * 2), count * 2).mapPartitions(executor_report)
        return list(rdd.distinct().collect())

    try:
        reports = run_bounded(spark, "executor-check", job_s, job)
    except Exception as exc:
        raise EngineError(
            f"the cluster's executors cannot run this peer's code: {_first_line(exc)} "
            f"(this peer runs {local_versions().describe()}; install the same major.minor "
            "versions on every worker host: docs/operations.md, 'Running a peer on a Spark "
            "cluster')"
        ) from exc
    executors = [(host, Versions(py, arrow)) for host, py, arrow in reports]
    problem = version_mismatch(local_versions(), executors)
    if problem is not None:
        raise EngineError(problem)
    return len({host for host, _ in executors})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "error" in line or "version" in line:
            return line.strip()[:400]
    return (text.splitlines() or [type(exc).__name__])[0][:400]
