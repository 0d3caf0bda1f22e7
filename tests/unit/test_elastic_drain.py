"""peer.elastic.drain: a launched peer that left the plan hands its roles over, moves its
fragments and stops; what cannot move keeps it up."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from peer.elastic.drain import Drainer
from peer.errors import Unavailable
from peer.move import SIBLING
from peer.replication.control.state import BurstState

S1, S2 = b"\x01" * 20, b"\x02" * 20


class Port:
    def __init__(self, launched: tuple[str, ...]) -> None:
        self.burst = BurstState("acme", "a" * 40, 1, 1, 3, launched, 2)
        self.live = [S2, S1]  # least loaded first
        self.led = [("clicks", (S1.hex(), S2.hex()))]
        self.movable = [("q1", ("filter",)), ("q2", ("aggregate",))]
        self.handover = [("q3", ("clicks",), frozenset({S1}))]
        self.stuck: list[str] = []
        self.calls: list[tuple[str, str, str]] = []
        self.fail_once: set[str] = set()
        self.incoming = False  # a sibling's move into this peer under way

    async def read_burst(self, participant: str) -> BurstState | None:
        assert participant == "acme"
        return self.burst

    def siblings(self) -> Sequence[bytes]:
        return list(self.live)

    def led_streams(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        return list(self.led)

    async def hand_over_stream(self, name: str, to: str) -> object:
        self.calls.append(("stream", name, to))
        self.led = [x for x in self.led if x[0] != name]
        return None

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        return list(self.movable)

    def handover_fragments(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        return list(self.handover)

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]:
        assert contract == SIBLING
        if name in self.fail_once:
            self.fail_once.discard(name)
            raise Unavailable(f"fragment {name}: the target is busy")
        self.calls.append(("fragment", name, target.hex()))
        self.movable = [m for m in self.movable if m[0] != name]
        self.handover = [h for h in self.handover if h[0] != name]
        return {"ok": True}

    def unmovable(self) -> Sequence[str]:
        return list(self.stuck)

    def moving(self) -> bool:
        return self.incoming


def drain(port: Port) -> tuple[Drainer, list[bool]]:
    stopped: list[bool] = []
    return Drainer(port, "acme", "acme-e1", lambda: stopped.append(True)), stopped


def test_a_peer_in_the_plan_stays_and_says_it_was_launched() -> None:
    port = Port(("acme-e1",))
    drainer, stopped = drain(port)
    assert asyncio.run(drainer.round()) is False
    assert not stopped and port.calls == []
    assert drainer.figures() == {"launched": 1.0}


def test_a_peer_out_of_the_plan_hands_over_moves_everything_and_stops() -> None:
    port = Port(())
    drainer, stopped = drain(port)
    assert asyncio.run(drainer.round()) is True
    assert stopped == [True]
    assert drainer.figures() == {"launched": 1.0, "drain": 1.0}
    # the stream goes to an in-sync replica that is a live sibling; the replicated fragment
    # only where its inputs' replica is; the others to the least loaded sibling
    assert port.calls == [
        ("stream", "clicks", S1.hex()),
        ("fragment", "q3", S1.hex()),
        ("fragment", "q1", S2.hex()),
        ("fragment", "q2", S2.hex()),
    ]


def test_a_failed_move_or_an_unmovable_fragment_keeps_the_peer_up_until_it_can_go() -> None:
    port = Port(())
    port.fail_once = {"q2"}
    port.stuck = ["another query here reads its result stream q9_out"]
    drainer, stopped = drain(port)
    assert asyncio.run(drainer.round()) is False
    assert not stopped
    assert any("q2" in x for x in drainer.left) and any("q9" in x for x in drainer.left)
    port.stuck = []
    assert asyncio.run(drainer.round()) is True  # q2 moves now; nothing else is left
    assert stopped == [True]
    assert drainer.status() == {"launched_as": "acme-e1", "draining": True, "left": []}


def test_without_a_live_sibling_nothing_moves() -> None:
    port = Port(())
    port.live = []
    drainer, stopped = drain(port)
    assert asyncio.run(drainer.round()) is False
    assert port.calls == [] and not stopped
    assert drainer.left == ["no live sibling to take the load"]


def test_a_move_into_the_draining_peer_keeps_it_up_until_it_landed() -> None:
    """A sibling chose this peer before it gossiped ``drain``: stopping mid-install would leave
    that move in doubt for good (the sender keeps the fragment stopped until we answer). Once
    it landed, the next pass moves it on, and the peer stops."""
    port = Port(())
    port.incoming = True
    drainer, stopped = drain(port)
    assert asyncio.run(drainer.round()) is False
    assert not stopped and drainer.left == ["a move into this peer is under way"]
    port.incoming = False
    port.movable = [("arrived", ("aggregate",))]
    assert asyncio.run(drainer.round()) is True
    assert stopped == [True] and ("fragment", "arrived", S2.hex()) in port.calls
