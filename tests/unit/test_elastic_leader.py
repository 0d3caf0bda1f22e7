"""peer.elastic.leader: the burst leader's claims, sizing decisions and provisioning, against
the real control-plane state machine (no Raft, no processes) and an injected clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from peer.elastic.leader import BurstLeader
from peer.elastic.sizing import SizingPolicy
from peer.replication.control import ClaimBurst, ControlState, PlanBurst
from peer.replication.control.state import BurstState

A, B = "a" * 40, "b" * 40


class Plane:
    """The control plane: commands applied in submission order to one ControlState."""

    def __init__(self) -> None:
        self.state = ControlState()
        self.submitted: list[ClaimBurst | PlanBurst] = []

    async def read_burst(self, participant: str) -> BurstState | None:
        return self.state.burst(participant)

    async def submit(self, command: ClaimBurst | PlanBurst) -> Mapping[str, Any]:
        self.submitted.append(command)
        applied = self.state.apply(command)
        return {"ok": applied.ok, "reason": applied.reason}


class Provisioner:
    def __init__(self) -> None:
        self.running: set[str] = set()
        self.starts: list[str] = []

    def start(self, name: str) -> str:
        if name in self.running:
            return f"{name} runs already"
        self.running.add(name)
        self.starts.append(name)
        return f"started {name}"

    def used(self) -> set[str]:
        return set(self.starts)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def peer_figures(tps: float, busy: float, lag: float = 0.0, **extra: float) -> dict[str, float]:
    return {"tps": tps, "busy": busy, "lag": lag, **extra}


def make(
    plane: Plane,
    node: str,
    figures: dict[str, Mapping[str, object]],
    provisioner: Provisioner,
    clock: Clock,
    live: set[str],
    record: Path | None = None,
    maximum: int = 3,
    **damping: Any,
) -> BurstLeader:
    return BurstLeader(
        node=node,
        participant="acme",
        policy=SizingPolicy(1, maximum),
        control=plane,
        figures=lambda: figures,
        is_live=lambda n: n in live,
        provisioner=provisioner,
        record=record,
        clock=clock,
        wall=lambda: 1.7e9,
        decide_s=10.0,
        settle_s=60.0,
        **({"cooldown_s": 0.0, "warmup_s": 0.0, "confirm": 1} | damping),
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_one_peer_claims_the_lead_and_a_second_does_not_while_the_first_is_live() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(0, 0), B: peer_figures(0, 0)}
    a = make(plane, A, figures, prov, clock, {A, B})
    b = make(plane, B, figures, prov, clock, {A, B})
    run(a.round())
    run(b.round())
    run(a.round())
    state = plane.state.burst("acme")
    assert state is not None and (state.leader, state.term) == (A, 1)
    assert a.leading and not b.leading
    assert [type(c).__name__ for c in plane.submitted] == ["ClaimBurst"]


def test_an_overloaded_participant_grows_in_one_step_to_what_ds2_says(tmp_path: Path) -> None:
    # one peer busy all the time reading 10,000 rows/s while its backlog grows by
    # 14,000 rows/s: 24,000 rows/s arrive, a peer does 10,000 per busy second, so at 70 %
    # it needs ceil(24,000 / 7,000) = 4 peers, held at MAX = 3
    plane, prov, clock = Plane(), Provisioner(), Clock()
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(6_000, 0.6, lag=0)}
    leader = make(plane, A, figures, prov, clock, {A}, record=tmp_path / "elastic.jsonl")
    run(leader.round())  # claims
    run(leader.round())  # leads; first look at the load (no growth seen yet)
    figures[A] = peer_figures(10_000, 1.0, lag=140_000)
    clock.now += 10
    run(leader.round())
    state = plane.state.burst("acme")
    assert state is not None and state.launched == ("acme-e1", "acme-e2")
    assert prov.starts == ["acme-e1", "acme-e2"]
    grow = [d for d in leader.decisions if d.action == "grow"]
    assert len(grow) == 1 and (grow[0].current, grow[0].size) == (1, 3)
    assert "held at MAX" in grow[0].reason
    lines = [json.loads(x) for x in (tmp_path / "elastic.jsonl").read_text().splitlines()]
    assert [x["action"] for x in lines] == ["lead", "grow"]
    assert lines[-1]["launched"] == ["acme-e1", "acme-e2"]


def test_no_decision_while_launched_peers_are_still_coming_up() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(6_000, 0.6, lag=0)}
    leader = make(plane, A, figures, prov, clock, {A})
    run(leader.round())
    run(leader.round())
    figures[A] = peer_figures(10_000, 1.0, lag=200_000)
    clock.now += 10
    run(leader.round())
    version = plane.state.burst("acme").version  # type: ignore[union-attr]
    # the two launched peers are not live yet: shrinking figures are not acted on
    figures[A] = peer_figures(100, 0.05, lag=0)
    clock.now += 20
    run(leader.round())
    assert plane.state.burst("acme").version == version  # type: ignore[union-attr]


def test_it_shrinks_when_the_load_falls_and_keeps_the_size_under_a_constant_load() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    assert plane.state.apply(ClaimBurst("acme", A, 0, 1, 3)).ok
    assert plane.state.apply(PlanBurst("acme", 1, 1, ("acme-e1", "acme-e2"))).ok
    e1, e2 = "1" * 40, "2" * 40
    figures: dict[str, Mapping[str, object]] = {
        A: peer_figures(1_000, 0.1),
        e1: peer_figures(1_000, 0.1, launched=1),
        e2: peer_figures(1_000, 0.1, launched=1),
    }
    leader = make(plane, A, figures, prov, clock, {A, e1, e2})
    for _ in range(3):
        run(leader.round())
        clock.now += 10
    state = plane.state.burst("acme")
    # 3,000 rows/s at 10,000 rows per busy second: one peer at 30 % is enough
    assert state is not None and state.launched == ()
    shrink = [d for d in leader.decisions if d.action == "shrink"]
    assert len(shrink) == 1 and (shrink[0].current, shrink[0].size) == (3, 1)
    # the launched peers drained and left; the same load on one peer keeps it at one
    figures.pop(e1), figures.pop(e2)
    figures[A] = peer_figures(3_000, 0.3)
    for _ in range(5):
        run(leader.round())
        clock.now += 10
    assert [d.action for d in leader.decisions].count("shrink") == 1
    assert not [d for d in leader.decisions if d.action == "grow"]


class Interleaved(Plane):
    """A plane where another peer's claim lands between a leader's read and its plan."""

    def __init__(self) -> None:
        super().__init__()
        self.before_next_submit: ClaimBurst | None = None

    async def submit(self, command: ClaimBurst | PlanBurst) -> Mapping[str, Any]:
        if self.before_next_submit is not None:
            assert self.state.apply(self.before_next_submit).ok
            self.before_next_submit = None
        return await super().submit(command)


def test_a_leader_deposed_while_it_decides_has_its_plan_refused() -> None:
    plane, clock, prov = Interleaved(), Clock(), Provisioner()
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(6_000, 0.6)}
    a = make(plane, A, figures, prov, clock, {A, B})
    run(a.round())
    run(a.round())
    assert a.leading
    figures[A] = peer_figures(10_000, 1.0, lag=140_000)
    clock.now += 10
    plane.before_next_submit = ClaimBurst("acme", B, 1, 1, 3)  # B took over meanwhile
    run(a.round())
    state = plane.state.burst("acme")
    assert state is not None and (state.leader, state.launched) == (B, ())
    assert prov.starts == []
    assert [d.action for d in a.decisions] == ["lead", "refused"]
    run(a.round())  # a sees it no longer leads
    assert not a.leading


def test_a_new_leader_provisions_the_plan_idempotently() -> None:
    plane, clock, prov = Plane(), Clock(), Provisioner()
    assert plane.state.apply(ClaimBurst("acme", A, 0, 1, 3)).ok
    assert plane.state.apply(PlanBurst("acme", 1, 1, ("acme-e1", "acme-e2"))).ok
    prov.running.add("acme-e1")  # the dead leader started one before it died
    b = make(plane, B, {B: peer_figures(0, 0)}, prov, clock, {B})
    run(b.round())  # A is not live: B claims
    run(b.round())  # B leads: every planned name runs
    run(b.round())
    assert prov.starts == ["acme-e2"] and prov.running == {"acme-e1", "acme-e2"}


def test_hostile_gossip_is_left_out_of_the_sizing() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    figures: dict[str, Mapping[str, object]] = {
        A: peer_figures(1_000, 0.2),
        B: {"tps": float("inf"), "busy": -1, "lag": "lots"},
    }
    leader = make(plane, A, figures, prov, clock, {A, B})
    for _ in range(4):
        run(leader.round())
        clock.now += 10
    assert prov.starts == []
    assert not [d for d in leader.decisions if d.action in ("grow", "shrink")]


def test_shrinking_waits_for_confirmations_and_a_dip_resets_them() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    assert plane.state.apply(ClaimBurst("acme", A, 0, 1, 3)).ok
    assert plane.state.apply(PlanBurst("acme", 1, 1, ("acme-e1",))).ok
    e1 = "1" * 40
    low = {A: peer_figures(1_000, 0.1), e1: peer_figures(1_000, 0.1, launched=1)}
    busy = {A: peer_figures(6_000, 0.6), e1: peer_figures(6_000, 0.6, launched=1)}
    figures: dict[str, Mapping[str, object]] = dict(low)
    leader = make(plane, A, figures, prov, clock, {A, e1}, confirm=3)
    for shape in (low, low, busy, low, low):  # the busy round resets the count
        figures.clear(), figures.update(shape)
        run(leader.round())
        clock.now += 10
    assert plane.state.burst("acme").launched == ("acme-e1",)  # type: ignore[union-attr]
    figures.clear(), figures.update(low)
    run(leader.round())  # the third low decision in a row
    assert plane.state.burst("acme").launched == ()  # type: ignore[union-attr]


def grown_with(warmup_s: float) -> bool:
    """A is saturated at 7,000 rows/s with 1,000 rows/s more arriving (its backlog grew to
    60,000 rows in 60 s, to be worked off in 60 s: 9,000 rows/s offered); launched e1 has just
    come up, busy warming its Spark up and processing nothing. Counted, e1 halves the true
    rate (7,000 rows per two busy seconds) and 9,000 rows/s would seem to need
    ceil(9,000 / 2,450) = 4 peers (3, at MAX); left out, ceil(9,000 / 4,900) = 2, the two
    there are."""
    plane, prov, clock = Plane(), Provisioner(), Clock()
    assert plane.state.apply(ClaimBurst("acme", A, 0, 1, 3)).ok
    assert plane.state.apply(PlanBurst("acme", 1, 1, ("acme-e1",))).ok
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(7_000, 1.0)}
    leader = make(plane, A, figures, prov, clock, {A, "1" * 40}, warmup_s=warmup_s)
    run(leader.round())  # A's figures first seen
    clock.now += 60
    figures[A] = peer_figures(7_000, 1.0, lag=60_000)
    figures["1" * 40] = peer_figures(0, 1.0, launched=1)
    run(leader.round())
    return any(d.action == "grow" for d in leader.decisions)


def test_a_peer_still_warming_up_is_left_out_of_the_rates() -> None:
    assert not grown_with(warmup_s=30.0)
    assert grown_with(warmup_s=0.0)  # the same figures, e1 counted at once


def test_no_decision_during_the_cooldown_after_a_change() -> None:
    plane, prov, clock = Plane(), Provisioner(), Clock()
    assert plane.state.apply(ClaimBurst("acme", A, 0, 1, 3)).ok
    figures: dict[str, Mapping[str, object]] = {A: peer_figures(10_000, 1.0, lag=500_000)}
    leader = make(plane, A, figures, prov, clock, {A}, cooldown_s=30.0)
    run(leader.round())  # the state was just seen change (the claim): cooling down
    clock.now += 20
    run(leader.round())
    assert plane.state.burst("acme").launched == ()  # type: ignore[union-attr]
    clock.now += 10
    run(leader.round())
    assert plane.state.burst("acme").launched == ("acme-e1", "acme-e2")  # type: ignore[union-attr]
