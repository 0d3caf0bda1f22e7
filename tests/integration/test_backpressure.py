"""Backpressure as a client sees it: a running peer (without an engine, over loopback) makes
pushes to a stream with a lagging reader wait, then fail retriably. (The backlog's own rules,
without sockets, are tests/unit/test_backpressure.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from peer.client import Client
from peer.errors import Unavailable
from peer.node import PeerConfig
from peer.storage.spool_format import write_reader_offset
from peer.testing import PeerThread


def test_pushes_wait_for_a_lagging_reader_then_fail_retriably(tmp_path: Path) -> None:
    config = PeerConfig(
        data_dir=tmp_path / "p",
        port=0,
        engine=False,
        overlay=False,
        max_backlog_batches=3,
        backlog_wait_s=0.5,
    )
    with PeerThread(config) as peer:

        async def go() -> None:
            async with Client("127.0.0.1", peer.port) as c:
                await c.create_schema({"name": "n", "fields": [{"name": "x", "type": "long"}]})
                await c.create_stream("s", "n")
                spool = peer.peer.site.spools.get("s")  # type: ignore[union-attr]
                spool.register_reader("lagging")
                for i in range(4):
                    await c.push("s", {"columns": {"x": [i]}})
                with pytest.raises(Unavailable, match="backlogged"):
                    await c.push("s", {"columns": {"x": [4]}})
                assert spool.latest == 3  # the refused batch was not kept
                write_reader_offset(spool.directory, "lagging", 2, fsync=False)
                await c.push("s", {"columns": {"x": [4]}})
                assert spool.latest == 4

        asyncio.run(go())
