"""peer.brain: the bounded-price mechanism on peers faked down to what the brain uses.

Brains run on fake hosts (``peer.brain.BrainHost``): an offer frame goes straight to the
partner's ``handle_offer``, and a fake ``move_fragment`` hands the fragment over and tells the
partner's brain it arrived. Contracts are real, signed and
loaded from files. No JVM, no network, no sleeping: time is a ManualClock, even an offer's timeout.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import contract as ct
from contracts.book import ContractBook
from contracts.bpm import Box, BpmConfig, PeerState
from contracts.contract import Contract
from overlay.identity import raw_public
from overlay.membership import MemberInfo
from peer.brain import Brain, kind_of
from peer.brain.offers import OfferReply
from peer.elastic.siblings import SiblingBalancer
from peer.errors import InvalidInput, Unavailable
from peer.move import SIBLING
from peer.storage.ledger import Ledger, with_durations
from peer.testing import ManualClock, all_tasks_blocked
from peer.timing import wait_until

NOW = datetime(2026, 7, 1, tzinfo=UTC)
PERIOD_S = 5.0
CAPACITY = 4.0
KEYS = {
    name: Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32) for i, name in enumerate("abc", 1)
}
CONFIG = BpmConfig(period_s=PERIOD_S, offer_timeout_s=5.0)


def signed(
    a: str,
    b: str,
    price: float | None,
    *,
    cid: str,
    b_accepts: Iterable[str] = ("any",),
    not_after: datetime | None = None,
    **kw: Any,
) -> Contract:
    """A contract between ``a`` and ``b`` signed by both; ``b_accepts``: what b takes from a."""
    contract = ct.create(
        a,
        raw_public(KEYS[a]),
        b,
        raw_public(KEYS[b]),
        price=price,
        b_accepts=list(b_accepts),
        not_before=NOW - timedelta(days=30),
        not_after=not_after or NOW + timedelta(days=30),
        contract_id=cid,
        **kw,
    )
    return ct.sign(ct.sign(contract, KEYS[a]), KEYS[b])


class Meter:
    """Says the CPU the test set for the round."""

    def __init__(self) -> None:
        self.cores = 0.0

    def sample(self) -> float:
        return self.cores


class FakePeer:
    """A peer.brain.BrainHost: an offer frame goes straight to the partner's handle_offer."""

    def __init__(self, net: Net, participant: str, data_dir: Path, node: str = "") -> None:
        self.net = net
        self.participant = participant
        self.data_dir = data_dir
        self.node_id = hashlib.sha1((node or participant).encode()).digest()
        self.calls: list[tuple[bytes, dict[str, Any]]] = []  # offers sent
        self.engine = True
        self.hang = False
        self.fragments: dict[str, tuple[str, ...]] = {}
        # replicated fragments: their box types and the peers they may be handed to
        self.replicated: dict[str, tuple[tuple[str, ...], frozenset[bytes]]] = {}
        self.busy: dict[str, float] = {}
        self.backlog = 0
        self.meter = Meter()
        self.moves: list[tuple[str, bytes, str, float, float]] = []
        self.fail_moves: set[str] = set()
        self.moving = 0
        self.most_moving = 0
        self.brain: Brain = None  # type: ignore[assignment]

    def live_members(self) -> list[MemberInfo]:
        return [
            MemberInfo(
                node_id=p.node_id,
                participant=p.participant,
                cert=b"",
                overlay=("127.0.0.1", 1),
                api=("127.0.0.1", 2),
                engine=p.engine,
                incarnation=1,
                load=p.brain.load_figures(),
            )
            for p in self.net.peers.values()
        ]

    async def send_offer(self, node_id: bytes, frame: dict[str, Any]) -> object:
        self.calls.append((node_id, frame))
        target = self.net.by_node(node_id)
        if target.hang:
            await asyncio.Event().wait()
        # Over the wire: msgpack round trip, roughly (a copy; no shared objects).
        reply = await target.brain.handle_offer(copy.deepcopy(frame), sender=self.participant)
        return copy.deepcopy(reply)

    def movable_fragments(self) -> list[tuple[str, tuple[str, ...]]]:
        return list(self.fragments.items())

    def handover_fragments(self) -> list[tuple[str, tuple[str, ...], frozenset[bytes]]]:
        return [(name, types, to) for name, (types, to) in self.replicated.items()]

    async def engine_busy_seconds(self) -> dict[str, float]:
        return dict(self.busy)

    def input_backlog(self) -> int:
        return self.backlog

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> dict[str, object]:
        self.moving += 1
        self.most_moving = max(self.most_moving, self.moving)
        try:
            await asyncio.sleep(0)  # let anything else that wants to run, run
            self.moves.append((name, target, contract, load, price))
            if name in self.fail_moves:
                raise Unavailable(f"peer {target.hex()[:12]} unreachable")
            other = self.net.by_node(target)
            if name in self.replicated:  # handed over: only to an in-sync replica
                types, to = self.replicated.pop(name)
                assert target in to and contract == SIBLING, (name, target, contract)
                other.fragments[name] = types
            else:
                other.fragments[name] = self.fragments.pop(name)
            await other.brain.note_arrival(
                name, self.participant, contract, load, price, from_node=self.node_id
            )
            return {"fragment": name, "to": target.hex(), "pause_s": 0.25}
        finally:
            self.moving -= 1

    def use(self, cores: float, shares: dict[str, float]) -> None:
        """This round: ``cores`` of CPU, and each query busy for that share of the period."""
        self.meter.cores = cores
        for name, share in shares.items():
            self.busy[name] = self.busy.get(name, 0.0) + share * PERIOD_S


class Net:
    def __init__(self, tmp_path: Path, contracts: Iterable[Contract], **config: Any) -> None:
        self.tmp_path = tmp_path
        self.dir = tmp_path / "contracts"
        self.dir.mkdir(parents=True)
        for contract in contracts:
            ct.dump(contract, self.dir / f"{contract.id}.toml")
        self.clock = ManualClock(NOW)
        self.config = BpmConfig(**{"period_s": PERIOD_S, "offer_timeout_s": 5.0, **config})
        self.peers: dict[str, FakePeer] = {}

    def add(self, name: str, participant: str = "", *, balance: bool = False) -> FakePeer:
        """A peer ``name`` of ``participant`` (default: its own, named ``name``); with
        ``balance``, its brain balances load among its participant's peers."""
        peer = FakePeer(self, participant or name, self.tmp_path / name, node=name)
        peer.brain = self.brain_for(peer, balance=balance)
        self.peers[name] = peer
        return peer

    def brain_for(self, peer: FakePeer, *, balance: bool = False) -> Brain:
        return Brain(
            peer,
            self.book(peer.participant),
            self.config,
            CAPACITY,
            meter=peer.meter,
            clock=self.clock,
            siblings=SiblingBalancer(peer.node_id, peer.participant) if balance else None,
        )

    def book(self, me: str) -> ContractBook:
        return ContractBook.load_dir(self.dir, me, NOW, known_keys={me: raw_public(KEYS[me])})

    def by_node(self, node_id: bytes) -> FakePeer:
        for peer in self.peers.values():
            if peer.node_id == node_id:
                return peer
        raise Unavailable(f"peer {node_id.hex()[:12]} unreachable")

    async def round(self, *peers: FakePeer) -> list[Any]:
        """One period passes; each peer, in the order given, takes its round."""
        self.clock.now += PERIOD_S
        return [await p.brain.step() for p in peers]


def overloaded(net: Net) -> tuple[FakePeer, FakePeer, FakePeer]:
    """a runs three movable fragments of 1 core each plus 0.8 cores it cannot move, on 4
    cores; b runs 1 core's worth, c half a core."""
    a, b, c = net.add("a"), net.add("b"), net.add("c")
    a.fragments = {"f1": ("aggregate",), "f2": ("filter", "aggregate"), "f3": ("aggregate",)}
    return a, b, c


def load_round(a: FakePeer, b: FakePeer, c: FakePeer, *, b_cores: float = 1.0) -> None:
    """a at 3.8 cores; b at ``b_cores`` plus a core per fragment it took; c at half a core."""
    a.use(3.8, dict.fromkeys(a.fragments, 1.0) | {"pinned": 0.8})
    b.use(b_cores + len(b.fragments), {})
    c.use(0.5, {})


async def measured(net: Net, a: FakePeer, b: FakePeer, c: FakePeer, **kw: Any) -> None:
    """The first round: every brain sets its marks, and nothing is offered."""
    load_round(a, b, c, **kw)
    assert await net.round(b, c, a) == [None, None, None]
    load_round(a, b, c, **kw)


def offer_frame(**changes: Any) -> dict[str, Any]:
    frame = {
        "op": "offer",
        "contract": "ab",
        "from": "a",
        "price": 2.0,
        "unit_cost": 9.0,
        "boxes": [["f1", "aggregate", 1.0]],
    }
    frame.update(changes)
    return frame


# -- offering and moving -------------------------------------------------------------------------


def test_an_overloaded_peer_offers_to_the_cheapest_partner_and_moves_what_it_takes(
    tmp_path: Path,
) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab"), signed("a", "c", 3.0, cid="ac")])
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c)
        _, _, offer = await net.round(b, c, a)
        assert offer is not None and offer.partner == "b"

    asyncio.run(main())
    [(to, frame)] = a.calls
    assert to == b.node_id
    assert frame["contract"] == "ab" and frame["from"] == "a" and frame["price"] == 2.0
    assert [box[0] for box in frame["boxes"]] == ["f1", "f2", "f3"]
    assert all(box[2] == pytest.approx(1.0) for box in frame["boxes"])
    # b takes two of the three cores offered (the third would cost it more than the price),
    # and they move one at a time, with the contract, load and price they went for.
    assert [(m[0], m[1], m[2]) for m in a.moves] == [
        ("f1", b.node_id, "ab"),
        ("f2", b.node_id, "ab"),
    ]
    assert a.most_moving == 1
    assert set(a.fragments) == {"f3"} and set(b.fragments) == {"f1", "f2"}
    out = a.brain.status()["ledger"]
    assert [(e["direction"], e["fragment"], e["partner"], e["ok"]) for e in out] == [
        ("out", "f1", "b", True),
        ("out", "f2", "b", True),
    ]
    assert out[0]["peer"] == b.node_id.hex() and out[0]["contract"] == "ab"
    assert out[0]["load"] == pytest.approx(1.0) and out[0]["price"] == 2.0
    assert out[0]["pause_s"] == 0.25
    into = b.brain.status()["ledger"]
    assert [(e["direction"], e["fragment"], e["partner"], e["peer"]) for e in into] == [
        ("in", "f1", "a", a.node_id.hex()),
        ("in", "f2", "a", a.node_id.hex()),
    ]
    assert c.brain.status()["ledger"] == [] and not c.calls


def test_a_hot_peer_hands_load_to_an_idle_peer_of_its_own_participant_without_a_contract(
    tmp_path: Path,
) -> None:
    """Issue 28: no contract at all. a1 runs at 3.8 of 4 cores, its sibling a2 at 0.4 and b
    (another participant) idle. After two rounds above the margin a1 moves what fits into half
    the gap to a2, under the sibling contract, at no price, ledgered with its reason; b, idle
    but another participant, gets nothing; and then the two are balanced: nothing moves back."""
    net = Net(tmp_path, [])
    a1, a2 = net.add("a1", "a", balance=True), net.add("a2", "a", balance=True)
    b = net.add("b", balance=True)
    a1.fragments = {"f1": ("aggregate",), "f2": ("filter",), "f3": ("aggregate",)}

    def load() -> None:
        a1.use(3.8, {"f1": 1.0, "f2": 0.5, "f3": 0.3} if "f1" in a1.fragments else {})
        a2.use(0.4 + (1.5 if "f1" in a2.fragments else 0.0), {})
        b.use(0.0, {})

    async def main() -> list[list[Any]]:
        steps = []
        for _ in range(6):
            load()
            steps.append(await net.round(a2, b, a1))
        return steps

    asyncio.run(main())
    # gossip: util 0.95 against 0.1, gap 0.85; room = 0.85 / (1/4 + 1/4) = 1.7 cores. The
    # loads split a1's 3.8 cores by the queries' shares (1.0, 0.5, 0.3 of the period): f1
    # 2.11, f2 1.06, f3 0.63 cores; the largest that fit are f2 and f3 (1.69), f1 does not
    assert [(m[0], m[1], m[2], m[4]) for m in a1.moves] == [
        ("f2", a2.node_id, SIBLING, 0.0),
        ("f3", a2.node_id, SIBLING, 0.0),
    ]
    assert not a2.moves and not b.moves and not a1.calls
    out = a1.brain.status()["ledger"]
    assert [(e["direction"], e["fragment"], e["partner"], e["ok"]) for e in out] == [
        ("out", "f2", "a", True),
        ("out", "f3", "a", True),
    ]
    assert out[0]["contract"] == SIBLING and "a1" not in out[0]["reason"]
    assert "margin" in out[0]["reason"]
    into = a2.brain.status()["ledger"]
    assert [(e["direction"], e["fragment"], e["partner"]) for e in into] == [
        ("in", "f2", "a"),
        ("in", "f3", "a"),
    ]
    assert b.brain.status()["ledger"] == []


@pytest.mark.parametrize("replica_on", ["a2", "a3"])
def test_a_replicated_fragment_goes_to_a_sibling_only_if_it_holds_its_inputs(
    tmp_path: Path, replica_on: str
) -> None:
    """A replicated fragment moves by a hand-over, to an in-sync replica of its inputs only.
    a2 is the least loaded sibling: r1 is handed to it if a2 holds r1's inputs, and stays if
    only a3 does (f2, too big for the gap, stays either way)."""
    net = Net(tmp_path, [])
    a1, a2 = net.add("a1", "a", balance=True), net.add("a2", "a", balance=True)
    a3 = net.add("a3", "a", balance=True)
    a1.fragments = {"f2": ("filter",)}
    a1.replicated = {"r1": (("aggregate",), frozenset({net.peers[replica_on].node_id}))}

    async def main() -> None:
        for _ in range(4):
            a1.use(3.8, {"r1": 0.3, "f2": 0.6} if "r1" in a1.replicated else {"f2": 0.6})
            a2.use(0.4 + (1.3 if "r1" in a2.fragments else 0.0), {})
            a3.use(1.2, {})
            await net.round(a2, a3, a1)

    asyncio.run(main())
    # a1 at 0.95, a2 at 0.1: room = 0.85 / (1/4 + 1/4) = 1.7 cores; r1 is 1.27, f2 2.53
    if replica_on == "a2":
        assert [(m[0], m[1], m[2]) for m in a1.moves] == [("r1", a2.node_id, SIBLING)]
        assert "r1" in a2.fragments
    else:
        assert a1.moves == [] and set(a1.replicated) == {"r1"}
    assert not a3.fragments


def test_gossip_figures_a_sibling_cannot_mean_leave_it_out(tmp_path: Path) -> None:
    """Hostile or missing load figures of a sibling (not numbers, negative, infinite, no
    capacity) leave it out of the balancing: nothing moves to it."""
    balancer = SiblingBalancer(b"\x01" * 20, "a", rounds=1)
    state = PeerState(3.8, (Box("f1", "filter", 1.0),), 4.0)

    def member(load: dict[str, Any]) -> MemberInfo:
        return MemberInfo(
            node_id=b"\x02" * 20, participant="a", cert=b"", overlay=("127.0.0.1", 1),
            api=("127.0.0.1", 2), engine=True, incarnation=1, load=load,
        )  # fmt: skip

    for load in (
        {},
        {"util": 0.1},
        {"util": 0.1, "cap": 0.0},
        {"util": -1.0, "cap": 4.0},
        {"util": math.inf, "cap": 4.0},
        {"util": math.nan, "cap": 4.0},
        {"util": 0.1, "cap": math.inf},
        {"util": "0.1", "cap": 4.0},
    ):
        assert balancer.plan(state, [member(load)]) is None, load
    planned = balancer.plan(state, [member({"util": 0.1, "cap": 4.0})])
    assert planned is not None and planned.target == b"\x02" * 20
    assert planned.fragments == ("f1",) and planned.contract == SIBLING


def test_the_ledger_survives_a_restart(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    moved_at = [e["t"] for e in a.brain.status()["ledger"]]
    net.clock.now += 3600
    with (a.data_dir / "ledger.jsonl").open("a") as f:
        f.write('{"t": 1, "direction": "out", "fragm')  # a crash in the middle of a write
    again = net.brain_for(a).status()["ledger"]
    assert [(e["direction"], e["fragment"], e["ok"]) for e in again] == [
        ("out", "f1", True),
        ("out", "f2", True),
    ]
    assert [e["duration_s"] for e in again] == [pytest.approx(net.clock.now - t) for t in moved_at]


def test_no_offer_until_a_whole_period_after_a_move(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab"), signed("a", "c", 3.0, cid="ac")])
    a, b, c = overloaded(net)

    async def main() -> list[Any]:
        await measured(net, a, b, c)
        await net.round(b, c, a)  # f1 and f2 go to b
        load_round(a, b, c)  # the period that saw the move still counts them here
        during = await net.round(b, c, a)
        load_round(a, b, c)
        after = await net.round(b, c, a)
        return [during[-1], after[-1]]

    during, after = asyncio.run(main())
    assert during is None
    assert after is not None and [box.name for box in after.boxes] == ["f3"]


def test_a_refusing_partner_goes_last(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab"), signed("a", "c", 3.0, cid="ac")])
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c, b_cores=3.9)  # b is as loaded as a
        await net.round(b, c, a)
        assert a.brain.status()["refused_partners"] == ["b"]
        load_round(a, b, c, b_cores=3.9)
        await net.round(b, c, a)

    asyncio.run(main())
    assert [to for to, _ in a.calls] == [b.node_id, c.node_id]
    assert {m[0] for m in a.moves} == {"f1", "f2", "f3"}  # c takes them all
    assert {m[1] for m in a.moves} == {c.node_id}
    assert a.brain.status()["refused_partners"] == ["b"]  # taken by c: b still went last


def test_refusals_are_forgotten_after_some_rounds(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)

    async def main() -> list[list[str]]:
        await measured(net, a, b, c, b_cores=3.9)
        await net.round(b, c, a)  # b refuses
        seen = [a.brain.status()["refused_partners"]]
        for _ in range(10):  # a is idle from now on: no offers
            a.use(0.5, dict.fromkeys(a.fragments, 0.1))
            await net.round(b, c, a)
            seen.append(a.brain.status()["refused_partners"])
        return seen

    seen = asyncio.run(main())
    assert seen[:-1] == [["b"]] * 10
    assert seen[-1] == []
    assert len(a.calls) == 1


def test_no_offer_under_a_contract_that_does_not_cover_the_kind(tmp_path: Path) -> None:
    net = Net(
        tmp_path,
        [signed("a", "b", 2.0, cid="ab", b_accepts=["filter"]), signed("a", "c", 3.0, cid="ac")],
    )
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    assert [to for to, _ in a.calls] == [c.node_id]
    assert b.brain.status()["ledger"] == []
    # Offered anyway (by a brain that does not check), b refuses the whole offer.
    reply = asyncio.run(b.brain.handle_offer(offer_frame(), sender="a"))
    assert reply["accepted"] == [] and "does not let a hand aggregate boxes" in reply["reason"]


def test_no_offer_at_all_when_no_contract_covers_the_kinds(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab", b_accepts=["filter", "map"])])
    a, b, c = overloaded(net)

    async def main() -> list[Any]:
        await measured(net, a, b, c)
        return await net.round(b, c, a)

    assert asyncio.run(main()) == [None, None, None]
    assert not a.calls and not a.moves


def test_an_expired_contract_is_not_used(tmp_path: Path) -> None:
    net = Net(
        tmp_path,
        [
            signed("a", "b", 2.0, cid="ab", not_after=NOW + timedelta(hours=1)),
            signed("a", "c", 3.0, cid="ac"),
        ],
    )
    net.clock.now += 2 * 3600  # valid when the books were loaded; expired since
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    assert [to for to, _ in a.calls] == [c.node_id]
    assert {m[2] for m in a.moves} == {"ac"}
    reply = asyncio.run(b.brain.handle_offer(offer_frame(), sender="a"))
    assert reply["accepted"] == [] and "contract ab is not valid now" in reply["reason"]
    assert b.brain.status()["contracts"][0]["valid"] is False


def test_no_offer_to_a_partner_without_a_live_engine_peer(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab"), signed("a", "c", 3.0, cid="ac")])
    a, b, c = overloaded(net)
    b.engine = False

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    assert [to for to, _ in a.calls] == [c.node_id]


def test_the_partner_peer_with_the_lowest_utilisation_gets_the_offer(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)
    b2 = FakePeer(net, "b", tmp_path / "b2")  # a second peer of participant b
    b2.node_id = b"\x00" * 20  # would come first on a tie
    b2.brain = net.brain_for(b2)
    net.peers["b2"] = b2

    async def main() -> None:
        for _ in range(2):
            load_round(a, b, c)
            b2.use(2.5, {})
            await net.round(b, b2, c, a)

    asyncio.run(main())
    assert b2.brain.load_figures()["util"] > b.brain.load_figures()["util"]
    assert [to for to, _ in a.calls] == [b.node_id]


def test_a_failed_move_stops_the_others_and_is_ledgered(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)
    a.fail_moves = {"f1"}

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    assert [m[0] for m in a.moves] == ["f1"]
    [entry] = a.brain.status()["ledger"]
    assert entry["ok"] is False and "unreachable" in entry["error"]
    assert entry["duration_s"] is None
    assert a.brain.status()["refused_partners"] == ["b"]


def test_a_fragment_that_failed_to_move_is_not_offered_again_for_a_while(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)
    a.fail_moves = {"f1"}

    async def main() -> None:
        await measured(net, a, b, c, b_cores=0.0)
        for _ in range(11):
            b.brain._expected.clear()  # b forgets what it took (the fake moves never arrive)
            load_round(a, b, c, b_cores=0.0)
            await net.round(b, c, a)

    asyncio.run(main())
    offered = [[box[0] for box in frame["boxes"]] for _, frame in a.calls]
    assert offered[0][0] == "f1"
    assert all("f1" not in boxes for boxes in offered[1:-1])
    assert "f1" in offered[-1]  # forgotten after FORGET_REFUSAL_ROUNDS rounds


def test_only_offered_boxes_move_whatever_the_reply_says(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a, b, c = overloaded(net)
    a.fragments["idle"] = ("join",)  # no load: never offered

    async def lying(frame: object, *, sender: str) -> Any:  # what a lying peer might say
        return {"accepted": ["f3", "idle", 7, None], "reason": "sure"}

    b.brain.handle_offer = lying  # type: ignore[method-assign]

    async def main() -> None:
        for _ in range(2):
            a.use(3.8, {"f1": 1.0, "f2": 1.0, "f3": 1.0, "pinned": 0.8})
            await net.round(b, c, a)

    asyncio.run(main())
    assert [box[0] for box in a.calls[0][1]["boxes"]] == ["f1", "f2", "f3"]
    assert [m[0] for m in a.moves] == ["f3"]


def test_an_unanswered_offer_counts_as_failed(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")], offer_timeout_s=5.0)
    a, b, c = overloaded(net)
    b.hang = True

    async def main() -> None:
        await measured(net, a, b, c)
        net.clock.now += PERIOD_S
        await b.brain.step()
        await c.brain.step()
        async with asyncio.TaskGroup() as tg:
            offering = tg.create_task(a.brain.step())  # it measures in a thread, then offers
            await wait_until(lambda: net.clock.sleepers, "the offer's timeout", 10, every_s=0.01)
            assert len(a.calls) == 1 and a.brain.status()["offer_in_flight"] == "b"
            net.clock.advance(4.9)
            await all_tasks_blocked()
            assert not offering.done()  # b still has time to answer
            net.clock.advance(0.1)
        offer = offering.result()  # the offer made, and given up on (no error)
        assert offer is not None and offer.partner == "b"

    asyncio.run(main())
    assert len(a.calls) == 1 and not a.moves
    status = a.brain.status()
    assert status["refused_partners"] == ["b"] and status["offer_in_flight"] is None


# -- taking offers -------------------------------------------------------------------------------


def partner(tmp_path: Path, **config: Any) -> FakePeer:
    """b, measured at 1 core of 4, with contract ab (price 2) with a."""
    net = Net(
        tmp_path,
        [
            signed("a", "b", 2.0, cid="ab"),
            signed("a", "c", 3.0, cid="ac"),
            signed("b", "c", 1.0, cid="bc"),
        ],
        **config,
    )
    b = net.add("b")

    async def main() -> None:
        b.use(1.0, {})
        await net.round(b)
        await net.round(b)

    asyncio.run(main())
    return b


def test_an_offer_before_the_first_measurement_is_refused(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    b = net.add("b")
    reply = asyncio.run(b.brain.handle_offer(offer_frame(), sender="a"))
    assert reply["accepted"] == [] and "not measured" in reply["reason"]
    assert "utilisation" not in b.brain.status() and b.brain.load_figures() == {}


def test_one_move_in_at_a_time(tmp_path: Path) -> None:
    b = partner(tmp_path)

    async def main() -> list[OfferReply]:
        first = await b.brain.handle_offer(offer_frame(), sender="a")
        second = await b.brain.handle_offer(offer_frame(boxes=[["g1", "filter", 0.1]]), sender="a")
        await b.brain.note_arrival("f1", "a", "ab", 1.0, 2.0)
        third = await b.brain.handle_offer(offer_frame(boxes=[["g1", "filter", 0.1]]), sender="a")
        return [first, second, third]

    first, second, third = asyncio.run(main())
    assert first["accepted"] == ["f1"]
    assert second["accepted"] == [] and "under way" in second["reason"]
    # Arrived, and counted as load of its own until a measurement covers it.
    assert third["accepted"] == ["g1"]


def test_accepted_load_counts_until_it_is_measured(tmp_path: Path) -> None:
    b = partner(tmp_path)

    async def main() -> OfferReply:
        assert (
            await b.brain.handle_offer(offer_frame(boxes=[["f1", "aggregate", 2.0]]), sender="a")
        )["accepted"]
        await b.brain.note_arrival("f1", "a", "ab", 2.0, 2.0)
        # b is at 1 core, with 2 more just arrived: 1 more core would cost more than 2.
        return await b.brain.handle_offer(offer_frame(boxes=[["f2", "aggregate", 1.0]]), sender="a")

    reply = asyncio.run(main())
    assert reply["accepted"] == [] and "no room" in reply["reason"]


def test_an_accepted_box_that_never_comes_stops_holding_the_peer_up(tmp_path: Path) -> None:
    b = partner(tmp_path)

    async def main() -> list[str]:
        await b.brain.handle_offer(offer_frame(), sender="a")
        for _ in range(12):
            b.use(1.0, {})
            await b.net.round(b)
        return (await b.brain.handle_offer(offer_frame(), sender="a"))["accepted"]

    assert asyncio.run(main()) == ["f1"]


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"contract": 5}, "contract"),
        ({"contract": ""}, "contract"),
        ({"from": None}, "from"),
        ({"price": "2"}, "price"),
        ({"price": math.nan}, "price"),
        ({"price": math.inf}, "price"),
        ({"price": -1.0}, "price"),
        ({"price": 0}, "price"),
        ({"price": True}, "price"),
        ({"unit_cost": math.nan}, "unit_cost"),
        ({"unit_cost": None}, "unit_cost"),
        ({"boxes": []}, "boxes"),
        ({"boxes": "f1"}, "boxes"),
        ({"boxes": [["f1", "aggregate"]]}, "box 1"),
        ({"boxes": [["f1", "aggregate", math.nan]]}, "load"),
        ({"boxes": [["f1", "aggregate", -0.5]]}, "load"),
        ({"boxes": [["f1", "aggregate", 10**400]]}, "load"),
        ({"boxes": [["f1", "aggregate", "1"]]}, "load"),
        ({"boxes": [["f1", "bogus", 1.0]]}, "kind"),
        ({"boxes": [["f1", "filter+aggregate", 1.0]]}, "kind"),
        ({"boxes": [["f1", "", 1.0]]}, "kind"),
        ({"boxes": [[1, "filter", 1.0]]}, "name"),
        ({"boxes": [["x" * 300, "filter", 1.0]]}, "name"),
        ({"boxes": [["f1", "filter", 0.1], ["f1", "map", 0.1]]}, "twice"),
        ({"boxes": [[f"f{i}", "filter", 0.01] for i in range(9)]}, "at most 8"),
    ],
)
def test_a_malformed_offer_is_invalid_and_changes_nothing(
    tmp_path: Path, changes: dict[str, Any], complaint: str
) -> None:
    b = partner(tmp_path)
    before = b.brain.status()
    with pytest.raises(InvalidInput) as info:
        asyncio.run(b.brain.handle_offer(offer_frame(**changes), sender="a"))
    assert complaint in info.value.message
    assert b.brain.status() == before
    assert asyncio.run(b.brain.handle_offer(offer_frame(), sender="a"))["accepted"] == ["f1"]


@pytest.mark.parametrize(
    ("sender", "changes", "reason"),
    [
        ("a", {"from": "c"}, "it came from a"),  # forged: a says it is c
        ("c", {}, "it came from c"),  # c says it is a
        ("a", {"contract": "nope"}, "no contract nope here"),
        ("a", {"contract": "ac"}, "no contract ac here"),  # a contract b is no party to
        ("c", {"from": "c"}, "between a and b"),  # c offers under a's contract
        ("a", {"price": 1.5}, "outside"),
        ("a", {"price": 2.5}, "outside"),
    ],
)
def test_an_offer_no_contract_allows_is_refused_and_changes_nothing(
    tmp_path: Path, sender: str, changes: dict[str, Any], reason: str
) -> None:
    b = partner(tmp_path)
    before = b.brain.status()
    reply = asyncio.run(b.brain.handle_offer(offer_frame(**changes), sender=sender))
    assert reply["accepted"] == [] and reason in reply["reason"]
    assert b.brain.status() == before
    assert asyncio.run(b.brain.handle_offer(offer_frame(), sender="a"))["accepted"] == ["f1"]


def test_a_price_range_is_taken_at_its_top(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", None, cid="ab", min_price=1.0, max_price=2.0)])
    b = net.add("b")

    async def main() -> list[OfferReply]:
        b.use(1.0, {})
        await net.round(b)
        await net.round(b)
        return [
            await b.brain.handle_offer(offer_frame(price=1.0), sender="a"),
            await b.brain.handle_offer(offer_frame(price=2.0), sender="a"),
        ]

    low, top = asyncio.run(main())
    assert low["accepted"] == [] and "at 2, not 1" in low["reason"]
    assert top["accepted"] == ["f1"]


frames = st.fixed_dictionaries(
    {},
    optional={
        "contract": st.one_of(st.just("ab"), st.text(max_size=4), st.integers()),
        "from": st.one_of(st.just("a"), st.text(max_size=4), st.none()),
        "price": st.one_of(st.floats(), st.integers(), st.just(2.0), st.text(max_size=2)),
        "unit_cost": st.one_of(st.floats(), st.integers(min_value=-(2**70), max_value=2**70)),
        "boxes": st.lists(
            st.one_of(
                st.tuples(
                    st.one_of(st.text(max_size=3), st.integers()),
                    st.one_of(st.sampled_from(["filter", "aggregate+filter", "x", ""]), st.none()),
                    st.one_of(st.floats(), st.integers(), st.booleans()),
                ).map(list),
                st.lists(st.integers(), max_size=4),
                st.none(),
            ),
            max_size=10,
        ),
    },
)


FUZZ: dict[Path, FakePeer] = {}  # one partner per test run, not per example


@settings(
    max_examples=200,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=frames, sender=st.sampled_from(["a", "c", "zz"]))
def test_an_offer_is_answered_or_invalid_never_anything_else(
    tmp_path: Path, frame: dict[str, Any], sender: str
) -> None:
    b = FUZZ.get(tmp_path) or FUZZ.setdefault(tmp_path, partner(tmp_path / "fuzz"))
    try:
        reply = asyncio.run(b.brain.handle_offer(frame, sender=sender))
    except InvalidInput:
        return
    offered = {box[0] for box in frame["boxes"]}
    assert isinstance(reply["reason"], str) and set(reply["accepted"]) <= offered
    b.brain._expected.clear()  # a taken offer: ready for the next one


# -- measuring, gossip and status ----------------------------------------------------------------


def test_a_growing_input_backlog_means_over_capacity(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a = net.add("a")

    async def main() -> list[dict[str, float]]:
        seen = []
        for backlog in (5, 30, 60, 60):
            a.backlog = backlog
            a.use(1.0, {})
            await net.round(a)
            seen.append(a.brain.load_figures())
        return seen

    first, growing, still_growing, steady = asyncio.run(main())
    assert first == {}  # nothing measured yet
    assert growing == {"util": 1.0, "load": 4.0, "cap": 4.0}
    assert still_growing == {"util": 1.0, "load": 4.0, "cap": 4.0}
    assert steady == {"util": 0.25, "load": 1.0, "cap": 4.0}


def test_a_failed_measurement_skips_the_round_and_the_next_ones_recover(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a = net.add("a")
    calls = 0

    async def broken() -> dict[str, float]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("py4j went away")
        return {}

    a.engine_busy_seconds = broken  # type: ignore[method-assign]

    async def main() -> list[dict[str, float]]:
        seen = []
        for _ in range(4):
            a.use(2.0, {})
            await net.round(a)
            seen.append(a.brain.load_figures())
        return seen

    assert asyncio.run(main()) == [{}, {}, {}, {"util": 0.5, "load": 2.0, "cap": 4.0}]


def test_run_keeps_going_through_failures(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", 2.0, cid="ab")])
    a = net.add("a")
    rounds: list[float] = []
    third = asyncio.Event()

    async def step() -> None:
        rounds.append(net.clock())
        if len(rounds) == 3:
            third.set()
        raise RuntimeError("a bug")

    a.brain.step = step  # type: ignore[method-assign]

    async def main() -> None:
        start = net.clock()
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(a.brain.run())
            async with asyncio.timeout(10):
                while not third.is_set():
                    await asyncio.sleep(0)  # the round due now runs (and fails)
                    if net.clock.sleepers:
                        net.clock.advance(PERIOD_S)
            task.cancel()
        assert task.cancelled()  # cancelled, not swallowed
        assert rounds == [start, start + PERIOD_S, start + 2 * PERIOD_S]  # one per period

    asyncio.run(main())


def test_status(tmp_path: Path) -> None:
    net = Net(tmp_path, [signed("a", "b", None, cid="ab", min_price=1.0, max_price=2.0)])
    (net.dir / "zz-junk.toml").write_text("not = [a contract")
    a, b, c = overloaded(net)

    async def main() -> None:
        await measured(net, a, b, c)
        await net.round(b, c, a)

    asyncio.run(main())
    status = a.brain.status()
    json.dumps(status)  # goes over the wire as is
    assert status["capacity"] == CAPACITY
    assert status["utilisation"] == pytest.approx(0.95) and status["load"] == pytest.approx(3.8)
    assert {box["name"]: box["kind"] for box in status["boxes"]} == {
        "f1": "aggregate",
        "f2": "aggregate+filter",
        "f3": "aggregate",
    }
    assert status["contracts"] == [
        {
            "id": "ab",
            "partner": "b",
            "price": 2.0,
            "min_price": 1.0,
            "kinds": ["any"],
            "valid": True,
            "not_after": ct.format_time(NOW + timedelta(days=30)),
        }
    ]
    assert {r["file"]: r["reason"] for r in status["refused_contracts"]} == {
        "zz-junk.toml": "malformed"
    }
    assert status["offer_in_flight"] is None and status["moving"] is None
    assert [e["fragment"] for e in status["ledger"]] == ["f1", "f2"]
    # Both arrived at b, which counts them until a measurement does.
    assert [(e["fragment"], e["arrived"]) for e in b.brain.status()["expected"]] == [
        ("f1", True),
        ("f2", True),
    ]


def test_kind_of() -> None:
    assert kind_of(("filter", "aggregate", "filter")) == "aggregate+filter"


# -- the ledger ----------------------------------------------------------------------------------


def test_durations_run_until_the_fragment_comes_back(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for t, direction, fragment, ok in [
        (100.0, "out", "f1", True),
        (110.0, "out", "f2", False),
        (160.0, "in", "f1", True),  # f1 came back
        (170.0, "out", "f1", True),  # and went again
    ]:
        ledger.append({"t": t, "direction": direction, "fragment": fragment, "ok": ok})
    reloaded = Ledger(tmp_path / "ledger.jsonl")
    reloaded.load()
    assert [e["duration_s"] for e in with_durations(reloaded.entries(), 200.0)] == [
        60.0,
        None,
        10.0,
        30.0,
    ]


def test_a_ledger_skips_lines_that_are_not_entries(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    good = {"t": 1.0, "direction": "in", "fragment": "f", "ok": True}
    lines = [
        json.dumps(good),
        "[]",
        '{"t": true, "direction": "in", "fragment": "f", "ok": true}',
        '{"t": 1, "direction": "sideways", "fragment": "f", "ok": true}',
        '{"t": NaN, "direction": "in", "fragment": "f", "ok": true}',
        "",
        '{"t": 2',
    ]
    path.write_text("\n".join(lines))
    ledger = Ledger(path)
    ledger.load()
    assert ledger.entries() == [good]
