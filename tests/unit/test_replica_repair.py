"""Replacing a replica that died for good (peer.replication.control.repair) and seeding the new one:
the pure decision, the follower core's seed, the spool's seed and the seed on the wire."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peer.errors import InvalidInput
from peer.replication.control import StreamState, repaired_replicas
from peer.replication.core import (
    AppendReply,
    EpochEnd,
    EpochStart,
    Follower,
    Refusal,
    ReplicaAppend,
    SaveHistory,
    Seed,
    SeedLog,
)
from peer.replication.link_messages import message_from_wire, message_to_wire
from peer.storage.spool import Spool
from tests.unit.test_spool_replica import SCHEMA, batch, ks, primary_with

NODES = [f"{i:040x}" for i in range(8)]


def state(replicas: tuple[str, ...], *, anchor: str | None = None) -> StreamState:
    return StreamState("s", 3, replicas[0], replicas, replicas[:2], 2, 7, anchor)


# --------------------------------------------------------------------------- the decision


def test_a_dead_follower_is_replaced_by_the_closest_peer_not_yet_a_replica() -> None:
    a, b, c, d, e = NODES[:5]
    now = state((a, b, c))
    # candidates in XOR order: b is a replica already, d is the closest outsider
    assert repaired_replicas(now, {c}, [b, d, e]) == (a, b, d)
    assert repaired_replicas(now, set(), [d]) is None  # nobody dead: nothing moves
    assert repaired_replicas(now, {c}, [a, b]) is None  # nobody to take over
    assert repaired_replicas(now, {a}, [d]) is None  # the primary fails over, not repaired
    assert repaired_replicas(now, {b, c}, [d]) == (a, d, c)  # as many as there are
    assert repaired_replicas(now, {c}, [e, e, d]) == (a, b, e)


def test_an_anchored_stream_takes_its_anchors_replicas() -> None:
    a, b, c, d = NODES[:4]
    anchored = state((a, b, c), anchor="in")
    assert repaired_replicas(anchored, {c}, [d], state((a, b, d))) == (a, b, d)
    assert repaired_replicas(anchored, {c}, [d], state((b, a, c))) is None  # the same set
    assert repaired_replicas(anchored, set(), [], state((b, c, d))) is None  # not its primary


@given(
    st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True),
    st.sets(st.sampled_from(NODES)),
    st.lists(st.sampled_from(NODES), max_size=10),
)
def test_a_repaired_set_keeps_its_size_its_primary_and_no_dead_newcomer(
    replicas: list[str], dead: set[str], candidates: list[str]
) -> None:
    now = state(tuple(replicas))
    wanted = repaired_replicas(now, dead, candidates)
    if wanted is None:
        return
    assert len(wanted) == len(set(wanted)) == len(replicas)
    assert wanted[0] == now.primary
    newcomers = set(wanted) - set(replicas)
    assert newcomers and not newcomers & dead and newcomers <= set(candidates)
    assert set(replicas) - set(wanted) <= dead


# --------------------------------------------------------------------------- the core


def seed(epoch: int = 2, through: int = 9) -> Seed:
    history = (EpochStart(1, 0), EpochStart(2, 4))
    return Seed("s", epoch, through, (("p", 8), ("q", 9)), history)


def test_an_empty_follower_takes_a_seed_and_then_the_entries_after_it() -> None:
    follower = Follower("s", "f", epoch=2)
    reply, effects = follower.seed(seed())
    assert reply == AppendReply("s", 2, "f", 9, None)
    assert effects == (
        SeedLog(9, (("p", 8), ("q", 9))),
        SaveHistory((EpochStart(1, 0), EpochStart(2, 4))),
    )
    reply, effects = follower.receive(ReplicaAppend("s", 2, 10, 2, b"x"))
    assert isinstance(reply, AppendReply) and reply.log_end == 10 and reply.refused is None
    # a second seed (resent) changes nothing
    assert follower.seed(seed()) == (AppendReply("s", 2, "f", 10, None), ())


def test_a_seed_from_a_deposed_primary_is_fenced_and_one_before_reconciling_asks() -> None:
    follower = Follower("s", "f", epoch=3)
    reply, effects = follower.seed(seed(epoch=2))
    assert isinstance(reply, AppendReply) and reply.refused is Refusal.STALE_EPOCH
    assert effects == () and follower.log_end == -1
    holding = Follower("s", "f", epoch=2, log_end=3, history=(EpochStart(1, 0),))
    reply, effects = holding.seed(seed(epoch=2))
    assert isinstance(reply, EpochEnd) and holding.log_end == 3  # reconcile first


# --------------------------------------------------------------------------- the spool


def test_a_seeded_spool_starts_after_the_trimmed_entries_and_remembers_their_seqs(
    tmp_path: Path,
) -> None:
    primary = primary_with(tmp_path, 8)
    primary.trim(max_age_s=0.0, keep_after=4)  # no readers, all aged out: through 4
    through, seqs = primary.trimmed_state()
    assert through == 4 and primary.earliest == 5
    follower = Spool(tmp_path / "follower", SCHEMA, fsync=False)
    follower.append_file(0, primary_with(tmp_path / "other", 1).read_file_bytes(0))
    follower.seed(through, seqs)
    assert (follower.log_end, follower.earliest) == (4, 5)
    for offset in range(5, 8):
        follower.append_file(offset, primary.read_file_bytes(offset))
    for reopened in (follower, Spool(tmp_path / "follower", SCHEMA, fsync=False)):
        assert ks(reopened) == ks(primary)
        assert reopened.seqs() == primary.seqs()
        # a retry of a batch trimmed before the seed is still a duplicate here
        assert reopened.append(batch(99), origin="q", seq=4) is None
    with pytest.raises(ValueError, match="holds offsets through 7"):
        follower.seed(5, {})


# --------------------------------------------------------------------------- the wire


def test_a_seed_goes_over_the_wire_whole() -> None:
    message = seed()
    assert message_from_wire("s", message_to_wire(message)) == message


@pytest.mark.parametrize(
    "frame",
    [
        {"t": "seed", "epoch": 2, "through": 9, "seqs": [["p"]], "history": []},
        {"t": "seed", "epoch": 2, "through": 9, "seqs": [], "history": [[1, 10]]},
        {"t": "seed", "epoch": 2, "through": 9, "seqs": [], "history": [[3, 0]]},
        {"t": "seed", "epoch": 2, "through": 9, "seqs": [[5, 1]], "history": []},
        {"t": "seed", "epoch": 2, "through": -1, "seqs": [], "history": []},
        {"t": "seed", "epoch": 2, "through": 9, "seqs": {}, "history": []},
    ],
)
def test_a_malformed_seed_is_refused(frame: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        message_from_wire("s", frame)


# --------------------------------------------------------------------------- the pump


def test_a_followers_pump_outlives_a_batch_that_cannot_be_read() -> None:
    """An entry trimmed between queueing and sending (LookupError) used to end the pump for
    good, leaving the follower out of sync with nothing logged; now the next batch goes."""
    import asyncio
    from types import SimpleNamespace
    from typing import Any

    from peer.replication.core import Probe
    from peer.replication.driver import RESEND_S, _Outbox
    from peer.testing import ManualClock, all_tasks_blocked
    from peer.timing import OwnedTasks

    sent: list[Any] = []
    answered: list[Any] = []
    calls = {"n": 0}

    async def materialize(items: list[Any]) -> tuple[Any, ...]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise LookupError("offset 3 was trimmed")
        return (Probe("s", 2),)

    async def call(_node: bytes, exchange: Any) -> dict[str, Any]:
        sent.append(exchange)
        return {"messages": []}

    replica = SimpleNamespace(
        name="s",
        me=NODES[0],
        materialize=materialize,
        router=SimpleNamespace(call=call),
        on_answers=lambda node, answers: answered.append((node, answers)),
    )

    async def go() -> None:
        clock = ManualClock()
        tasks = OwnedTasks("the replica")
        outbox = _Outbox(replica, NODES[1], tasks, clock=clock)  # type: ignore[arg-type]
        try:
            outbox.put(3)
            await all_tasks_blocked()
            # the failed batch holds its slot for RESEND_S on the clock
            assert calls["n"] == 1 and clock.sleepers == 1 and not sent
            clock.advance(RESEND_S)
            await all_tasks_blocked()
            assert clock.sleepers == 0
            outbox.put(4)
            await all_tasks_blocked()
        finally:
            outbox.close()
            await tasks.aclose()
        assert len(tasks) == 0

    asyncio.run(go())
    assert len(sent) == 1 and sent[0].messages == (Probe("s", 2),)
    assert answered == [(NODES[1], ())]
