"""Shared fixtures: one Spark session per test process, temporary data directories; and the
machine share of a test when the suite runs in several pytest-xdist workers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The one Spark session of this test process (starting one costs 6-16 s here)."""
    from peer.engine.session import build_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = build_session(
        master="local[2]", app_name="fedstream-tests", warehouse_dir=str(warehouse)
    )
    from peer.engine.source import register_sources

    register_sources(session)
    yield session
    session.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "peer-data"
    d.mkdir()
    return d


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # FEDSTREAM_SKIP_SPARK=1 runs only the JVM-free layers (handy on machines without Java).
    if os.environ.get("FEDSTREAM_SKIP_SPARK") == "1":
        skip = pytest.mark.skip(reason="FEDSTREAM_SKIP_SPARK=1")
        for item in items:
            if "spark" in item.keywords:
                item.add_marker(skip)


# A test marked ``solo`` has the machine to itself when the suite runs in several workers
# (scripts/test): a hundred peer processes leave too little of 2 cores for another test's
# peers to answer in time. Every test of the run takes a shared lock on one file; a solo test
# takes it exclusively. A second file, taken in turn before the first, keeps the other
# workers' next tests from starving a solo test that waits. The locks are taken outside
# pytest-timeout's timer (tryfirst: the outer wrapper), so waiting does not count.
def _lock_files(run: str) -> tuple[Path, Path]:
    base = Path(tempfile.gettempdir()) / f"fedstream-tests-{run}"
    return Path(f"{base}.turn"), Path(f"{base}.machine")


@contextlib.contextmanager
def _machine_share(run: str, *, solo: bool) -> Iterator[None]:
    turn_path, machine_path = _lock_files(run)
    with open(turn_path, "a+b") as turn, open(machine_path, "a+b") as machine:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if solo else fcntl.LOCK_SH)
        finally:
            if not solo:
                fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if solo:
                fcntl.flock(turn, fcntl.LOCK_UN)


@pytest.hookimpl(tryfirst=True, wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    worker: dict[str, Any] | None = getattr(item.config, "workerinput", None)
    if worker is None:  # one process: nothing runs beside this test
        return (yield)
    solo = item.get_closest_marker("solo") is not None
    with _machine_share(str(worker["testrunuid"]), solo=solo):
        return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # the worker that ends last leaves nothing (one that ends first has no test left to share)
    worker: dict[str, Any] | None = getattr(session.config, "workerinput", None)
    if worker is not None:
        for path in _lock_files(str(worker["testrunuid"])):
            path.unlink(missing_ok=True)
