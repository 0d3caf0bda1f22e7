"""A peer's read of a stream's state goes to the leader when a follower may lag it, and the
answer "not replicated" is kept for a while on the client's clock (pure)."""

from __future__ import annotations

import asyncio
from typing import Any

from peer.replication.control import StreamState
from peer.replication.heartbeats import PLAIN_S, ControlClient
from peer.replication.link_messages import ControlRead, state_to_wire
from peer.testing import ManualClock

ME, LEADER, FOLLOWER = "a" * 40, "b" * 40, "c" * 40
STATE = StreamState("ticks", 1, ME, (ME, LEADER), (ME, LEADER), 1, 1)


class Voters:
    """Two voters: the leader has applied the stream's creation, the follower not yet."""

    node_id = bytes.fromhex(ME)

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def ask(self, node: bytes, message: ControlRead) -> dict[str, Any]:
        who = node.hex()
        self.asked.append(who)
        known = who == LEADER
        return {
            "stream": state_to_wire(STATE) if known else None,
            "voters": [FOLLOWER, LEADER],
            "leader": LEADER,
        }


def read(first: str | None) -> tuple[StreamState | None, list[str]]:
    voters = Voters()
    client = ControlClient(voters, lambda: {})  # type: ignore[arg-type]
    client.set_voters([FOLLOWER, LEADER], first)
    state = asyncio.run(client.read("ticks"))
    return state, voters.asked


def test_a_read_answered_by_a_follower_is_asked_of_the_leader_it_names() -> None:
    state, asked = read(first=None)  # the leader unknown here: the first voter is asked
    assert asked == [FOLLOWER, LEADER]
    assert state == STATE


def test_a_read_answered_by_the_leader_is_not_asked_again() -> None:
    state, asked = read(first=LEADER)
    assert asked == [LEADER]
    assert state == STATE


class NoStream(Voters):
    """Voters that know no stream by the name asked: a plain (unreplicated) stream."""

    async def ask(self, node: bytes, message: ControlRead) -> dict[str, Any]:
        self.asked.append(node.hex())
        return {"stream": None, "voters": [LEADER], "leader": LEADER}


def test_a_plain_stream_is_not_asked_about_again_until_the_clocks_window_ends() -> None:
    """The answer "not replicated" is kept for PLAIN_S on the client's clock: lookups of a
    plain stream cost no round trip each meanwhile, and one again once it has passed."""
    clock = ManualClock(50.0)
    voters = NoStream()
    client = ControlClient(voters, lambda: {}, clock=clock)  # type: ignore[arg-type]
    client.set_voters([LEADER], LEADER)

    async def main() -> list[int]:
        asked = []
        assert await client.state_of("plain") is None
        asked.append(len(voters.asked))
        clock.advance(PLAIN_S - 0.5)
        assert await client.state_of("plain") is None
        asked.append(len(voters.asked))
        assert await client.state_of("plain", fresh=True) is None  # fresh always asks
        asked.append(len(voters.asked))
        clock.advance(PLAIN_S + 0.5)
        assert await client.state_of("plain") is None
        asked.append(len(voters.asked))
        return asked

    assert asyncio.run(main()) == [1, 1, 2, 3]
