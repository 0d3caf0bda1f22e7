"""Hand-written schedules in the replication simulation's world (test_replication_world.py):
the walks of docs/replication.md step by step, and two planted bugs the simulation catches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from peer.replication.core import (
    AppendReply,
    EpochEnd,
    EpochEndReply,
    Follower,
    Primary,
    Probe,
    PushRefusal,
    Refused,
    ReplicaAppend,
)
from peer.replication.core.messages import Effect
from tests.unit.test_replication_sim import Step, run
from tests.unit.test_replication_world import CP, Envelope, Push, Sim, Violation


def between(src: str, dst: str, kind: type | None = None) -> Callable[[Envelope], bool]:
    def wanted(envelope: Envelope) -> bool:
        return (
            envelope.src == src
            and envelope.dst == dst
            and (kind is None or isinstance(envelope.payload, kind))
        )

    return wanted


def everything(envelope: Envelope) -> bool:
    return True


def log_ids(sim: Sim, node: str) -> list[str]:
    return [f"{e.origin}/{e.seq}" for e in sim.nodes[node].disk.log]


def isr(sim: Sim) -> tuple[str, ...]:
    return sim.state.in_sync


def started(sim: Sim) -> Sim:
    sim.tick(0.05)  # n0 takes office in epoch 1; every replica is in sync
    assert sim.nodes["n0"].primary is not None
    return sim


def n1_lacks_offset_1() -> Sim:
    """p0/0 acknowledged everywhere; then n0 writes p1/0 at offset 1 and only n2 gets it."""
    sim = started(Sim())
    sim.producers["p0"].start()
    sim.deliver_where(everything)
    sim.producers["p1"].start()
    sim.deliver_where(between("p1", "n0"))
    sim.deliver_where(between("n0", "n2", ReplicaAppend))
    return sim


def test_a_push_is_acknowledged_once_every_in_sync_replica_holds_it() -> None:
    sim = started(Sim())
    sim.producers["p0"].start()
    sim.deliver_where(lambda e: e.dst != "n2" and e.src != "n2")
    assert sim.client_acked == set()  # n0 and n1 hold it; n2 (in sync) does not yet
    assert log_ids(sim, "n1") == ["p0/0"]
    sim.deliver_where(everything)
    assert sim.client_acked == {("p0", 0)}
    assert log_ids(sim, "n2") == ["p0/0"]


def test_a_retried_push_is_kept_once() -> None:
    sim = started(Sim())
    sim.producers["p0"].start()
    sim.deliver_where(lambda e: e.dst != "p0")
    sim.net.clear()  # the acknowledgement is lost
    sim.tick(1.0)  # the producer retries the same id
    sim.deliver_where(everything)
    assert sim.client_acked == {("p0", 0)}
    assert all(log_ids(sim, node) == ["p0/0"] for node in sim.nodes)


def test_failover_keeps_acknowledged_entries_and_cuts_the_unacknowledged_tail() -> None:
    sim = n1_lacks_offset_1()
    sim.net.clear()
    sim.nodes["n0"].crash()
    sim.cuts.add(frozenset(("n2", CP)))
    sim.tick(1.6)  # the control plane elects the only live in-sync member it hears: n1
    assert (sim.state.epoch, sim.state.primary, sim.state.in_sync) == (2, "n1", ("n1", "n2"))
    sim.cuts.clear()
    sim.net = [e for e in sim.net if e.src != "p1"]
    sim.producers["p0"].start()
    sim.deliver_where(everything)  # n2 reconciles with n1 (cuts p1/0), then takes p0/1
    assert log_ids(sim, "n2") == ["p0/0", "p0/1"]
    assert sim.client_acked == {("p0", 0), ("p0", 1)}
    sim.settle()
    sim.final_check()
    assert log_ids(sim, "n0") == log_ids(sim, "n1")
    assert sorted(log_ids(sim, "n1")) == ["p0/0", "p0/1", "p0/2", "p0/3", "p0/4"] + [
        f"p1/{seq}" for seq in range(5)
    ]


def test_the_side_without_min_insync_refuses_pushes() -> None:
    sim = started(Sim())
    sim.cuts |= {frozenset(("n0", "n1")), frozenset(("n0", "n2"))}
    sim.producers["p0"].start()
    sim.deliver_where(everything)  # n0 writes it; nobody else can
    for _ in range(4):
        sim.tick(0.6)  # n1 and n2 lag, and leave the ISR through the control plane
        sim.deliver_where(everything)
        sim.check()
    assert isr(sim) == ("n0",)
    assert sim.client_acked == set() and sim.acked == {}
    primary = sim.nodes["n0"].primary
    assert primary is not None
    refused = primary.append(b"x", origin="p9", seq=0, now=sim.now)
    assert isinstance(refused, Refused) and refused.retriable
    assert refused.reason is PushRefusal.TOO_FEW_IN_SYNC
    sim.settle()
    sim.final_check()
    assert isr(sim) == ("n0", "n1", "n2")


def test_a_planned_hand_over_stops_pushes_and_elects_the_target_once_it_caught_up() -> None:
    sim = n1_lacks_offset_1()
    primary = sim.nodes["n0"].primary
    assert primary is not None
    with pytest.raises(ValueError, match="only to another ISR member"):
        primary.hand_over("n0", sim.now)
    progress = primary.hand_over("n1", sim.now)
    assert progress.hand_to is None  # n1 lacks offset 1, which is not acknowledged either
    refused = primary.append(b"x", origin="p9", seq=0, now=sim.now)
    assert isinstance(refused, Refused) and refused.retriable
    assert refused.reason is PushRefusal.HANDING_OVER
    sim.nodes["n0"].after(progress)
    assert sim.state.epoch == 1
    sim.deliver_where(everything)  # n1 gets offset 1 and answers: the hand-over is ready
    assert (sim.state.epoch, sim.state.primary, sim.handovers) == (2, "n1", 1)
    assert ("p1", 0) in sim.client_acked
    sim.tick(0.1)  # the replicas learn the new epoch: n0 steps down, n1 takes office
    assert sim.nodes["n0"].primary is None and sim.nodes["n1"].primary is not None
    sim.settle()
    sim.final_check()
    assert log_ids(sim, "n0") == log_ids(sim, "n1") == log_ids(sim, "n2")
    assert len(log_ids(sim, "n1")) == 10  # every batch of both producers, once


def test_a_hand_over_to_a_target_that_crashed_is_called_off() -> None:
    sim = n1_lacks_offset_1()  # n1 lacks p1/0
    sim.nodes["n1"].crash()
    primary = sim.nodes["n0"].primary
    assert primary is not None
    sim.nodes["n0"].after(primary.hand_over("n1", sim.now))
    for _ in range(4):  # n1 lags, leaves the ISR: the hand-over cannot complete
        sim.tick(0.6)
        sim.deliver_where(everything)
        sim.check()
    assert isr(sim) == ("n0", "n2") and primary.handing_to is None
    assert (sim.state.epoch, sim.state.primary, sim.handovers) == (1, "n0", 0)
    sim.nodes["n1"].restart()
    sim.settle()
    sim.final_check()
    assert len(log_ids(sim, "n0")) == 10


def test_a_crashed_follower_rejoins_the_isr_after_catching_up() -> None:
    sim = started(Sim())
    sim.nodes["n2"].crash()
    for _ in range(6):
        sim.producers["p0"].start()
        sim.deliver_where(everything)
        sim.tick(0.6)
    assert isr(sim) == ("n0", "n1")
    assert len(sim.client_acked) >= 2
    sim.settle()
    sim.final_check()
    assert isr(sim) == ("n0", "n1", "n2")
    assert log_ids(sim, "n2") == log_ids(sim, "n0")


def test_a_primary_restarted_in_office_does_not_admit_a_follower_without_its_log() -> None:
    """Found by the simulation: n1 dies and leaves the ISR; p0/0 and p1/0 are acknowledged
    by n0 and n2; n0 dies and comes back in office (no failover yet) not knowing what was
    acknowledged; n1 comes back empty and must not re-enter the ISR until it holds n0's log."""
    calm = Step("calm", 1, dt=0.2)
    schedule = [calm, Step("crash", 0, name="n1"), *[calm] * 9, Step("crash", 0, name="n0")]
    schedule += [calm, calm, Step("restart", name="n0"), Step("restart", name="n1"), calm]
    schedule += [Step("deliver", 0), Step("deliver", 1)]
    sim = Sim(min_insync=1)
    run(schedule, sim)
    assert len(sim.acked) == 10


# --------------------------------------------------------------------------- planted bugs


class UnfencedFollower(Follower):
    """Planted bug: takes appends from a lower epoch as if they came from its own."""

    def receive(
        self, append: ReplicaAppend | Probe
    ) -> tuple[AppendReply | EpochEnd, tuple[Effect, ...]]:
        if append.epoch < self.epoch:
            append = replace(append, epoch=self.epoch)
        return super().receive(append)


class HastyPrimary(Primary):
    """Planted bug: stops waiting for a member as soon as it proposes to shrink it."""

    def counted(self) -> tuple[str, ...]:
        pending = self._pending
        members = super().counted()
        if pending is not None and pending.proposal.action == "shrink":
            return tuple(n for n in members if n != pending.proposal.node)
        return members


def deposed_primary_keeps_sending(sim: Sim) -> None:
    """n0 is cut off from the control plane with an unreplicated entry (p1/0 at offset 1);
    n1 is elected, probes n2 and reconciles it, and is about to send n2 its own offset 1
    (p0/1), when n0's old append of offset 1 reaches n2."""
    started(sim)
    sim.producers["p0"].start()
    sim.deliver_where(everything)
    sim.producers["p1"].start()
    sim.deliver_where(between("p1", "n0"))
    sim.net = [e for e in sim.net if e.dst != "n1"]  # n0's append to n2 is delayed
    sim.cuts.add(frozenset(("n0", CP)))
    sim.tick(1.6)
    assert (sim.state.epoch, sim.state.primary) == (2, "n1")
    sim.net = [e for e in sim.net if e.src != "p1"]
    sim.producers["p0"].start()
    sim.deliver_where(between("p0", "n1", Push))
    sim.deliver_where(between("n1", "n2", Probe))  # n2 asks where epoch 1 ends
    sim.deliver_where(between("n2", "n1", EpochEnd))
    sim.deliver_where(between("n1", "n2", EpochEndReply))  # n2 is reconciled
    sim.deliver_where(between("n2", "n1", AppendReply))  # n1 sends offset 1
    sim.deliver_where(between("n0", "n2", ReplicaAppend))  # the stale append
    sim.deliver_where(everything)
    sim.check()


def shrink_proposal_lost(sim: Sim) -> None:
    """n0 cannot reach n2 nor the control plane; n2 lags, and n0's ShrinkIsr(n2) is lost."""
    started(sim)
    sim.producers["p0"].start()
    sim.deliver_where(everything)
    sim.cuts |= {frozenset(("n0", "n2")), frozenset(("n0", CP))}
    sim.producers["p1"].start()
    sim.deliver_where(everything)  # n0 and n1 hold p1/0; n2 does not
    sim.tick(1.2)  # n2 lags: n0 proposes to shrink it, but the proposal is lost
    sim.deliver_where(everything)
    sim.tick(0.1)
    sim.check()


@pytest.mark.parametrize("scenario", [deposed_primary_keeps_sending, shrink_proposal_lost])
def test_the_scenarios_keep_the_properties(scenario: Callable[[Sim], None]) -> None:
    sim = Sim()
    scenario(sim)
    sim.settle()
    sim.final_check()


def test_the_simulation_catches_a_follower_that_does_not_fence() -> None:
    with pytest.raises(Violation, match="ISR member n2 lacks acked offset 1"):
        deposed_primary_keeps_sending(Sim(follower_cls=UnfencedFollower))


def test_the_simulation_catches_a_primary_that_does_not_wait_for_the_shrink() -> None:
    with pytest.raises(Violation, match="ISR member n2 lacks acked offset 1"):
        shrink_proposal_lost(Sim(primary_cls=HastyPrimary))
