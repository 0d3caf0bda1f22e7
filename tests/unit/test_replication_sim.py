"""A deterministic simulation of replicated streams (docs/replication.md, "Properties").

Hypothesis chooses fault schedules for the world of tests/unit/test_replication_world.py (three
nodes replicating one stream through the sans-IO cores of :mod:`peer.replication.core` and
:mod:`peer.replication.control`): which message arrives next, which is lost or duplicated, how much
time passes, which node crashes (at once, or between two effects of a later step), which links are
cut (the control plane's included) or mended, and when the primary plans to hand the stream
over to another replica (Primary.hand_over). Producers push whenever time passes. After every
step the world checks that

(a) at most one node takes office per epoch, and only that one acknowledges in it;
(b) every acknowledged entry is in the log of every later primary, at the same offset;
(c) no (producer, seq) appears twice in any replica's log;
(d) every member of the control plane's ISR holds every acknowledged entry;

and once the schedule is over, every fault is healed and the world runs until every producer
has pushed all its batches: then all replicas hold the same log, containing every batch a
producer was told was acknowledged.

Hand-written schedules (tests/unit/test_replication_scenarios.py) walk through failover,
fencing and partitions step by step, and show that the simulation catches two planted bugs: a
follower that does not fence stale epochs, and a primary that acknowledges without a lagging
member before the control plane has committed the smaller ISR. This random search finds them
too (the second within a few hundred examples, the first within a few thousand).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.unit.test_replication_world import LINKS, NODES, PRIMARY_LINKS, Crash, Sim

# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Step:
    kind: str
    index: int = 0
    dt: float = 0.0
    name: str = ""
    link: frozenset[str] = frozenset()


def play(sim: Sim, step: Step) -> None:
    # "primary" names whichever node the control plane names at that moment
    name = sim.state.primary if step.name == "primary" else step.name
    link = frozenset(sim.state.primary if n == "primary" else n for n in step.link)
    if step.kind in ("deliver", "drop", "dup") and not sim.net:
        return
    if step.kind == "deliver":
        sim.deliver(step.index % len(sim.net))
    elif step.kind == "flush":
        for _ in range(min(step.index, len(sim.net))):
            sim.deliver(0)
    elif step.kind == "drop":
        sim.net.pop(step.index % len(sim.net))
    elif step.kind == "dup":
        sim.net.append(sim.net[step.index % len(sim.net)])
    elif step.kind in ("tick", "calm"):
        for _ in range(step.index if step.kind == "calm" else 1):
            if step.kind == "calm":  # a quiet spell: everything in flight arrives
                sim.deliver_where(lambda _: True)
            sim.tick(step.dt)
            for producer in sim.producers.values():
                producer.start()
    elif step.kind == "crash" and step.index < 0:
        sim.nodes[name].crash()
    elif step.kind == "crash":  # after that many more effects
        sim.nodes[name].crash_after = step.index
    elif step.kind == "restart":
        sim.nodes[name].restart()
    elif step.kind == "cut" and len(link) == 2:
        sim.cuts.add(link)
    elif step.kind == "mend":
        sim.cuts.discard(link)
    elif step.kind == "handover":  # the primary's peer plans to hand the stream to ``name``
        node = sim.nodes[sim.state.primary]
        primary = node.primary
        can = primary is not None and node.up and not primary.deposed and name != node.name
        if can and primary is not None and primary.handing_to is None and name in primary.in_sync:
            node.after(primary.hand_over(name, sim.now))


def run(steps: list[Step], sim: Sim) -> tuple[int, int, int, int]:
    """Play a schedule, checking the properties after every step, then settle. Producers
    push whenever time passes and they are idle."""
    sim.tick(0.05)  # the first primary takes office
    for step in steps:
        try:
            play(sim, step)
        except Crash as crash:
            sim.nodes[str(crash)].crash()
        sim.check()
    faulty = (sim.state.epoch, len(sim.acked), sim.cut_entries, sim.refusals)
    sim.settle()
    sim.final_check()
    return faulty


indexes = st.integers(0, 40)
steps = st.one_of(
    st.builds(Step, st.just("calm"), st.integers(1, 4), dt=st.just(0.2)),
    st.builds(Step, st.just("deliver"), indexes),
    st.builds(Step, st.just("flush"), st.integers(1, 12)),
    st.builds(Step, st.sampled_from(("drop", "dup")), indexes),
    st.builds(Step, st.just("tick"), dt=st.sampled_from((0.1, 0.5, 1.0, 2.0))),
    st.builds(
        Step, st.just("crash"), st.integers(-2, 3), name=st.sampled_from(("primary", *NODES))
    ),
    st.builds(Step, st.just("restart"), name=st.sampled_from(NODES)),
    st.builds(Step, st.sampled_from(("cut", "mend")), link=st.sampled_from(LINKS)),
    st.builds(Step, st.just("cut"), link=st.sampled_from(PRIMARY_LINKS)),
    st.builds(Step, st.just("handover"), name=st.sampled_from(NODES)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=12, max_size=40), st.sampled_from((1, 2, 2, 3)))
def test_replication_keeps_its_promises_under_faults(schedule: list[Step], min_insync: int) -> None:
    sim = Sim(min_insync=min_insync)
    epoch, acked, cut, refused = run(schedule, sim)
    # what the faults did before the heal (hypothesis --hypothesis-show-statistics)
    event(f"epochs reached under faults: {min(epoch, 3)}{'+' if epoch >= 3 else ''}")
    event(f"acknowledged under faults: {'none' if not acked else 'some'}")
    event(f"divergent tails cut: {'yes' if cut else 'no'}")
    event(f"pushes refused: {'yes' if refused else 'no'}")
    event(f"planned hand-overs: {'yes' if sim.handovers else 'no'}")
