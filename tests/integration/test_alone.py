"""A peer left alone (real sockets, the real kademlia package): when its only other member
leaves, it stays up, keeps trying its seed each gossip round (a seed that does not answer must
not end the peer), and takes over a source stream the other hosted when a client pushes to it,
now that it is the stream's responsible peer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from peer.client import Client
from peer.node import PeerConfig
from peer.protocol.replies import StatusReply
from peer.testing import PeerThread, make_participants, stream_name_on

SCHEMA = {"name": "tick", "fields": [{"name": "k", "type": "int"}, {"name": "t", "type": "long"}]}


def test_a_peer_left_alone_stays_up_serves_and_takes_over(tmp_path: Path) -> None:
    keys = make_participants(tmp_path, ["acme"])
    fast = {"gossip_interval_s": 0.2, "suspect_after_s": 1.0, "dead_after_s": 2.0}
    who = {"participant": "acme", "key_path": keys["acme"], "trust_dir": tmp_path / "trust"}
    settings: dict[str, Any] = {"port": 0, "engine": False, "fsync": False, **who, **fast}
    first = PeerThread(PeerConfig(data_dir=tmp_path / "a", **settings)).__enter__()
    try:
        overlay = first.peer.overlay
        assert overlay is not None
        seed = [("127.0.0.1", overlay.port)]
        with PeerThread(PeerConfig(data_dir=tmp_path / "b", bootstrap=seed, **settings)) as alone:
            assert alone.peer.overlay is not None
            ids = [overlay.node_id, alone.peer.overlay.node_id]
            stream = stream_name_on(overlay.node_id, ids, "gone")

            async def before() -> None:
                async with Client("127.0.0.1", alone.port, timeout_s=30) as c:
                    await c.create_schema(SCHEMA)
                    await c.create_stream(stream, "tick", replicas=1)
                    await c.push(stream, [{"k": 1, "t": 1}])  # forwarded to its host

            asyncio.run(before())
            assert stream in first.peer.fed.hosting.hosted  # type: ignore[union-attr]
            first.close()  # it leaves: the other drops it, then tries its seed every round
            time.sleep(4.0)
            assert alone._thread.is_alive(), "the peer's loop ended"

            async def after() -> StatusReply:
                async with Client("127.0.0.1", alone.port, timeout_s=30) as c:
                    await c.push(stream, [{"k": 2, "t": 2}])
                    return await c.status()

            status = asyncio.run(after())
            assert stream in status["hosted"]
    finally:
        first.close()
