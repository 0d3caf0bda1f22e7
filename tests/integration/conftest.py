"""Fixtures of the integration tests: the one Spark-backed peer a test module shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.node import PeerConfig
from peer.testing import PeerThread


@pytest.fixture(scope="module")
def peer_options() -> dict[str, Any]:
    """The :class:`PeerConfig` fields a test module sets beyond the defaults of its peer
    (a module overrides this fixture, e.g. ``{"lane_after": 0}``)."""
    return {}


@pytest.fixture(scope="module")
def peer(
    spark: Any,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    peer_options: dict[str, Any],
) -> Iterator[PeerThread]:
    """One real peer on the test process's Spark session, for the whole module: port 0,
    housekeeping every second, plus the module's ``peer_options``."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    data = Path(tmp_path_factory.mktemp(module)) / "peer"
    config = PeerConfig(data_dir=data, port=0, maintenance_interval_s=1.0, **peer_options)
    with PeerThread(config, spark) as running:
        yield running
