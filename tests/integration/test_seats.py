"""High availability by default, in-process (real sockets, real Raft, real kademlia, no Spark).

Peers that volunteer (``peer join``'s default) and are never told who the voters are:

* a lone peer founds the control plane; a stream created on it with three replicas asked for
  has one copy and says why; two peers join and volunteer for the other seats, and the stream
  gets its copies, each holding every batch pushed before they came; the first peer then stops
  and the stream goes on, every row read back once;
* a voter that stops for good is removed once its grace has passed, and a live peer that was
  no voter takes its seat through Raft's membership change.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from peer.client import Client
from peer.node import PeerConfig
from peer.protocol.replies import LookupReply
from peer.replication.plane import SEAT_CHECK_S
from peer.testing import PeerThread, run_async, wait_until_sync
from peer.testing.cluster import make_participants
from tests.integration.test_replication import (
    FAST,
    SCHEMA,
    expected,
    push_all,
    read_all,
    replication_of,
)


class Volunteers:
    """Peers started one by one, each volunteering; the first founds the federation."""

    def __init__(self, tmp_path: Path, names: tuple[str, ...], **settings: Any) -> None:
        self.tmp_path = tmp_path
        self.keys = make_participants(tmp_path, names)
        self.settings = settings
        self.peers: list[PeerThread] = []
        self.closed: list[PeerThread] = []

    def start(self, name: str) -> PeerThread:
        bootstrap = []
        if self.peers:
            first = self.peers[0].peer.overlay
            assert first is not None
            bootstrap = [("127.0.0.1", first.port)]
        config = PeerConfig(
            data_dir=self.tmp_path / name,
            port=0,
            engine=False,
            participant=name,
            key_path=self.keys[name],
            trust_dir=self.tmp_path / "trust",
            bootstrap=bootstrap,
            brain=False,
            volunteer=True,
            **{**FAST, **self.settings},
        )
        peer = PeerThread(config).__enter__()
        self.peers.append(peer)
        return peer

    @property
    def live(self) -> list[PeerThread]:
        return [p for p in self.peers if p not in self.closed]

    def stop(self, peer: PeerThread) -> None:
        peer.close()
        self.closed.append(peer)

    def close(self) -> None:
        for p in reversed(self.live):
            p.close()


def node(p: PeerThread) -> str:
    assert p.peer.overlay is not None
    return p.peer.overlay.node_id.hex()


def voters_of(p: PeerThread) -> set[str]:
    room = p.peer.room
    assert room is not None
    return set(room.plane.client.voters)


def lookup(port: int, name: str) -> LookupReply:
    async def ask() -> LookupReply:
        async with Client("127.0.0.1", port, timeout_s=30) as c:
            return await c.lookup_object(name)

    return run_async(ask, timeout_s=60)


def test_a_lone_peers_stream_gets_its_copies_as_volunteers_join(tmp_path: Path) -> None:
    fed = Volunteers(tmp_path, ("alpha", "beta", "gamma"), repair_after_s=2.0)
    try:
        alpha = fed.start("alpha")
        assert voters_of(alpha) == {node(alpha)}, "the first peer did not found the plane"

        async def create() -> None:
            async with Client("127.0.0.1", alpha.port, timeout_s=30) as c:
                await c.create_schema(SCHEMA)
                created = await c.create_stream("lone", "tick", replicas=3)
            assert created["replicas"] == [node(alpha)]

        run_async(create, timeout_s=60)
        found = lookup(alpha.port, "lone")
        assert (found["epoch"], found["asked"], found["copies"]) == (
            1,
            3,
            "1 of 3 copies: only 1 peer live",
        )
        run_async(lambda: push_all([alpha.port], "lone", range(10)), timeout_s=60)

        fed.start("beta")
        fed.start("gamma")
        everyone = {node(p) for p in fed.peers}
        wait_until_sync(
            lambda: all(voters_of(p) == everyone for p in fed.peers),
            "both newcomers to volunteer and every peer to know the three voters",
            60,
            every_s=0.1,
        )

        def grown() -> bool:
            found = lookup(alpha.port, "lone")
            in_sync = {r["node"] for r in found["replicas"] if r["in_sync"]}
            return in_sync == everyone and found["copies"] == "3 of 3 copies"

        wait_until_sync(grown, "the stream to get its three copies, all in sync", 60, every_s=0.2)
        for p in fed.peers:  # every copy holds every batch pushed before the newcomers came
            spool = p.peer.site.spools.get("lone") if p.peer.site is not None else None
            assert spool is not None and spool.log_end == 9, node(p)
            assert replication_of(p, "lone")["role"] == ("primary" if p is alpha else "follower")

        fed.stop(alpha)  # the founder and primary stops: the stream goes on without it
        ports = [p.port for p in fed.live]
        run_async(lambda: push_all(ports, "lone", range(10, 20)), timeout_s=120)
        rows = run_async(lambda: read_all(ports[0], "lone", 100), timeout_s=60)
        assert sorted(rows) == sorted(expected(range(20)))
        assert lookup(ports[0], "lone")["epoch"] >= 2
    finally:
        fed.close()


def test_a_voter_that_stops_for_good_is_replaced_by_a_volunteer(tmp_path: Path) -> None:
    fed = Volunteers(tmp_path, ("v1", "v2", "v3", "v4"), voter_grace_s=3.0)
    try:
        for name in ("v1", "v2", "v3"):
            fed.start(name)
        first3 = {node(p) for p in fed.peers}
        wait_until_sync(
            lambda: all(voters_of(p) == first3 for p in fed.peers),
            "the first three peers to be the voters",
            60,
            every_s=0.1,
        )
        spare = fed.start("v4")
        plane = spare.peer.room.plane if spare.peer.room is not None else None
        assert plane is not None
        wait_until_sync(
            lambda: voters_of(spare) == first3 and plane.client.seats == 3,
            "the fourth peer to learn the voters and their three seats",
            30,
            every_s=0.1,
        )
        time.sleep(3 * SEAT_CHECK_S)  # it asks every SEAT_CHECK_S: it must not sit
        assert plane.voter is None and voters_of(spare) == first3
        victim = next(p for p in fed.peers[:3] if node(p) != plane.client.leader)
        want = (first3 - {node(victim)}) | {node(spare)}
        fed.stop(victim)
        wait_until_sync(
            lambda: all(voters_of(p) == want for p in fed.live),
            "the stopped voter to be replaced by the fourth peer",
            60,
            every_s=0.2,
        )
        assert plane.voter is not None
    finally:
        fed.close()
