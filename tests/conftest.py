"""Shared fixtures: one Spark session per test process, temporary data directories."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
