"""Gossip membership and XOR responsibility (pure: no sockets, no clock)."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.membership import MemberInfo, Membership, MemberState, rank, stream_target


def info(n: int, *, engine: bool = True, inc: int = 1) -> MemberInfo:
    node_id = hashlib.sha1(f"node{n}".encode()).digest()
    return MemberInfo(
        node_id=node_id,
        participant=f"p{n % 3}",
        cert=b"cert%d" % n,
        overlay=("127.0.0.1", 9000 + n),
        api=("127.0.0.1", 8000 + n),
        engine=engine,
        incarnation=inc,
    )


def gossip_round(tables: list[Membership], now: float, rng: random.Random) -> None:
    for table in tables:
        table.beat(now)
    for table in tables:
        other = rng.choice([t for t in tables if t is not table])
        other.merge(table.digest(), now)
        table.merge(other.digest(), now)
    for table in tables:
        table.tick(now)


def test_everyone_learns_everyone_by_gossip() -> None:
    rng = random.Random(7)
    tables = [Membership(info(i), now=0.0) for i in range(12)]
    # seed: each knows only the first member (the bootstrap)
    for t in tables[1:]:
        t.merge([tables[0].me.to_wire()], 0.0)
        tables[0].merge([t.me.to_wire()], 0.0)
    for r in range(1, 8):
        gossip_round(tables, float(r) * 0.5, rng)
    for t in tables:
        assert len(t.live()) == 12


def test_silent_member_is_suspected_then_dead_then_revives() -> None:
    a, b = Membership(info(1), now=0.0), Membership(info(2), now=0.0)
    a.merge(b.digest(), 0.0)
    assert a.state_of(b.me.node_id) is MemberState.ALIVE
    assert [e.kind for e in a.tick(3.5)] == ["suspect"]
    assert b.me in a.live()  # suspected members still count as live
    assert [e.kind for e in a.tick(8.5)] == ["dead"]
    assert b.me.node_id not in {m.node_id for m in a.live()}
    assert b.me.to_wire() not in a.digest()  # the dead are not gossiped on
    # its last entry, relayed late by someone else, does not bring it back
    assert a.merge([b.me.to_wire()], 9.0) == []
    assert a.state_of(b.me.node_id) is MemberState.DEAD
    b.beat(10.0)
    assert [e.kind for e in a.merge(b.digest(), 10.0)] == ["alive"]


def test_restart_with_new_incarnation_supersedes_higher_heartbeat() -> None:
    a = Membership(info(1), now=0.0)
    old = info(2, inc=5)
    for _ in range(50):
        old = MemberInfo(**{**old.__dict__, "heartbeat": old.heartbeat + 1})
    a.merge([old.to_wire()], 0.0)
    restarted = info(2, inc=6)
    a.merge([restarted.to_wire()], 1.0)
    member = a.get(restarted.node_id)
    assert member is not None and member.info.incarnation == 6


def test_leave_is_immediate() -> None:
    a, b = Membership(info(1), now=0.0), Membership(info(2), now=0.0)
    a.merge(b.digest(), 0.0)
    b.leave(1.0)
    assert [e.kind for e in a.merge(b.digest(), 1.0)] == ["left"]
    assert b.me.node_id not in {m.node_id for m in a.live()}


def test_only_a_member_speaks_for_itself() -> None:
    a = Membership(info(1), now=0.0)
    forged = MemberInfo(**{**a.me.__dict__, "heartbeat": 999, "leaving": True})
    a.merge([forged.to_wire()], 1.0)
    assert a.me.heartbeat == 0 and not a.me.leaving


def test_unverifiable_entries_are_refused_and_counted() -> None:
    a = Membership(info(1), now=0.0, verify=lambda m: None if m.cert == b"cert2" else "bad cert")
    events = a.merge([info(2).to_wire(), info(3).to_wire(), {"id": 1}, "junk"], 0.0)
    assert [e.info.node_id for e in events] == [info(2).node_id]
    assert a.refused["bad cert"] == 1
    assert sum(a.refused.values()) == 3


@given(st.lists(st.one_of(st.dictionaries(st.text(max_size=4), st.integers()), st.binary())))
def test_merge_never_raises_on_junk(entries: list[Any]) -> None:
    a = Membership(info(1), now=0.0)
    a.merge(entries, 0.0)
    assert len(a.members()) == 1


def test_rank_is_xor_order_and_stable() -> None:
    members = [info(i) for i in range(20)]
    target = stream_target("cars")
    ranked = rank(target, members)
    distances = [int.from_bytes(m.node_id, "big") ^ int.from_bytes(target, "big") for m in ranked]
    assert distances == sorted(distances)
    assert rank(target, reversed(members)) == ranked
    # removing the responsible member hands responsibility to the next closest
    assert rank(target, ranked[1:])[0] == ranked[1]


def test_bad_timeouts_refused() -> None:
    with pytest.raises(ValueError):
        Membership(info(1), now=0.0, suspect_after_s=5, dead_after_s=2)
