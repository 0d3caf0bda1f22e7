"""The world of the replication simulation (tests/unit/test_replication_sim.py): the drivers
the sans-IO cores expect, with faults, and the property checks; no sockets, no threads, no
clock. Its own tests, at the end, show that each check fires.

The sans-IO cores (:mod:`peer.replication.core`, :mod:`peer.replication.control`) run on three
simulated nodes that replicate one stream:

- a network that holds messages until a step delivers one (any of them: reordering; or never:
  delay and loss), duplicates or drops them, and cuts links between any two of the nodes and
  the control plane (non-transitive partitions);
- nodes whose disks keep only what the effects wrote (each effect is durable once performed),
  and which crash (losing every in-memory state; also between two effects of one step) and
  restart from their disks;
- a control plane: one :class:`ControlState` applied in one total order (the Raft log), which
  hears heartbeats (with log ends) from the nodes it is connected to, elects a new primary
  when the primary has been silent for ``FAILOVER_S``, commits the primary's ISR proposals,
  and tells connected nodes the state;
- producers that push numbered batches (producer, seq) one at a time to the primary the control
  plane names, and retry refusals and silence with the same id.

The properties (docs/replication.md), checked as they happen (:class:`Violation`):

(a) at most one node takes office per epoch, and only that one acknowledges in it;
(b) every acknowledged entry is in the log of every later primary, at the same offset;
(c) no (producer, seq) appears twice in any replica's log;
(d) every member of the control plane's ISR holds every acknowledged entry at every step
    (which is what makes (b) hold whoever is elected), and once settled all replicas hold the
    same log, which contains every batch a producer was told was acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import pytest

from peer.replication.control import (
    ControlState,
    CreateStream,
    Elect,
    ExpandIsr,
    ShrinkIsr,
    StreamState,
    failover_decisions,
)
from peer.replication.core import (
    Appended,
    AppendReply,
    Duplicate,
    Effect,
    EpochEnd,
    EpochEndReply,
    EpochStart,
    Follower,
    History,
    Primary,
    Probe,
    Progress,
    ReplicaAppend,
    SaveEpoch,
    SaveHistory,
    Truncate,
    WriteEntry,
    begin_epoch,
)

STREAM = "s"
NODES = ("n0", "n1", "n2")
CP = "cp"
PRODUCERS = ("p0", "p1")
LINKS = tuple(frozenset(pair) for pair in combinations((*NODES, CP), 2))
PRIMARY_LINKS = tuple(frozenset(("primary", other)) for other in (*NODES, CP))
MAX_SEQ = 5
LAG_S = 1.0
RESEND_S = 0.2
PROPOSE_RETRY_S = 0.5
FAILOVER_S = 1.5
CLIENT_RETRY_S = 1.0


class Violation(AssertionError):
    """A property of replication does not hold."""


class Crash(Exception):
    """A node dies in the middle of a step."""


@dataclass(frozen=True)
class Entry:
    epoch: int
    origin: str
    seq: int
    body: bytes


@dataclass
class Disk:
    """What survives a crash."""

    log: list[Entry] = field(default_factory=list)
    epoch: int = 0
    history: History = ()


@dataclass(frozen=True)
class Push:
    producer: str
    seq: int
    body: bytes


@dataclass(frozen=True)
class PushReply:
    seq: int
    ok: bool


Payload = ReplicaAppend | Probe | AppendReply | EpochEnd | EpochEndReply | Push | PushReply


@dataclass(frozen=True)
class Envelope:
    src: str
    dst: str
    payload: Payload


# --------------------------------------------------------------------------- nodes


class Node:
    """One node's driver: performs effects on its disk, sends what the cores say."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim = sim
        self.name = name
        self.disk = Disk()
        self.up = True
        self.primary: Primary | None = None
        self.follower: Follower | None = None
        self.waiting: list[tuple[int, str, int]] = []  # (offset, producer, seq) to answer
        self.reported = -1  # acknowledged end already recorded
        self.crash_after: int | None = None  # effects until it dies mid-step
        self.restore()

    @property
    def log_end(self) -> int:
        return len(self.disk.log) - 1

    def restore(self) -> None:
        self.primary = None
        self.waiting = []
        self.follower = self.sim.follower_cls(
            STREAM,
            self.name,
            epoch=self.disk.epoch,
            log_end=self.log_end,
            history=self.disk.history,
        )

    def crash(self) -> None:
        self.up = False
        self.primary = self.follower = None
        self.waiting = []
        self.crash_after = None

    def restart(self) -> None:
        if not self.up:
            self.up = True
            self.restore()

    def perform(self, effects: tuple[Effect, ...]) -> None:
        for effect in effects:
            if self.crash_after is not None:
                self.crash_after -= 1
                if self.crash_after < 0:
                    raise Crash(self.name)
            if isinstance(effect, WriteEntry):
                assert effect.offset == len(self.disk.log), (self.name, effect, self.log_end)
                assert effect.origin is not None and effect.seq is not None
                self.disk.log.append(
                    Entry(effect.entry_epoch, effect.origin, effect.seq, effect.body)
                )
            elif isinstance(effect, Truncate):
                self.sim.cut_entries += len(self.disk.log) - effect.after - 1
                del self.disk.log[effect.after + 1 :]
            elif isinstance(effect, SaveEpoch):
                assert effect.epoch >= self.disk.epoch, (self.name, effect, self.disk.epoch)
                self.disk.epoch = effect.epoch
            elif isinstance(effect, SaveHistory):
                self.disk.history = effect.history

    def send(self, dst: str, payload: Payload) -> None:
        self.sim.send(self.name, dst, payload)

    # ----------------------------------------------------------------------- roles

    def learn(self, state: StreamState) -> None:
        """The control plane's state reached this node."""
        if self.primary is not None and state.epoch > self.primary.epoch:
            self.step_down()
        if state.primary != self.name:
            assert self.follower is not None
            self.perform(self.follower.on_new_epoch(state.epoch))
        elif self.primary is None:
            self.take_office(state)
        else:
            self.after(
                self.primary.on_isr(
                    state.epoch,
                    state.version,
                    state.in_sync,
                    replicas=state.replicas,
                    min_insync=state.required_insync,
                )
            )

    def take_office(self, state: StreamState) -> None:
        history, effects = begin_epoch(self.disk.history, state.epoch, self.log_end)
        self.perform(effects)
        seqs: dict[str, int] = {}
        for entry in self.disk.log:
            seqs[entry.origin] = max(seqs.get(entry.origin, -1), entry.seq)
        self.primary = self.sim.primary_cls(
            STREAM,
            self.name,
            epoch=state.epoch,
            version=state.version,
            replicas=state.replicas,
            in_sync=state.in_sync,
            min_insync=state.required_insync,
            log_end=self.log_end,
            history=history,
            now=self.sim.now,
            seqs=seqs,
            replica_lag_s=LAG_S,
            resend_s=RESEND_S,
            propose_retry_s=PROPOSE_RETRY_S,
        )
        self.follower = None
        self.reported = -1
        self.sim.took_office(self, state.epoch)

    def step_down(self) -> None:
        for _, producer, seq in self.waiting:
            self.send(producer, PushReply(seq, ok=False))
        self.restore()

    def after(self, progress: Progress) -> None:
        primary = self.primary
        assert primary is not None
        for ship in progress.ships:
            for offset in range(ship.first, ship.last + 1):
                entry = self.disk.log[offset]
                message = primary.entry_message(offset, entry.body, entry.origin, entry.seq)
                self.send(ship.to, message)
        for outgoing in progress.messages:
            self.send(outgoing.to, outgoing.message)
        for proposal in progress.proposals:
            command = ShrinkIsr if proposal.action == "shrink" else ExpandIsr
            if self.sim.connected(self.name, CP):
                self.sim.control.apply(
                    command(STREAM, proposal.epoch, proposal.version, proposal.node)
                )
        if progress.hand_to is not None and self.sim.connected(self.name, CP):
            # a planned hand-over is ready: the control plane elects the target
            elect = Elect(STREAM, primary.epoch, progress.hand_to)
            self.sim.handovers += self.sim.control.apply(elect).ok
        self.acknowledge()
        if progress.deposed:
            self.step_down()

    def acknowledge(self) -> None:
        primary = self.primary
        assert primary is not None
        assert primary.log_end == self.log_end, "the primary's log end is its disk's"
        for offset in range(self.reported + 1, primary.acknowledged + 1):
            self.sim.acknowledged(self, primary.epoch, offset)
        self.reported = max(self.reported, primary.acknowledged)
        done = [w for w in self.waiting if w[0] <= primary.acknowledged]
        self.waiting = [w for w in self.waiting if w[0] > primary.acknowledged]
        for _, producer, seq in done:
            self.send(producer, PushReply(seq, ok=True))

    # ----------------------------------------------------------------------- messages

    def handle(self, envelope: Envelope) -> None:
        message = envelope.payload
        if isinstance(message, ReplicaAppend | Probe):
            if self.primary is not None:
                refusal = self.primary.fence(message)
                if refusal is not None:
                    self.send(envelope.src, refusal)
                    return
                self.step_down()
            assert self.follower is not None
            reply, effects = self.follower.receive(message)
            self.perform(effects)
            self.send(envelope.src, reply)
        elif isinstance(message, EpochEndReply):
            if self.follower is not None:
                answer, effects = self.follower.on_epoch_end(message)
                self.perform(effects)
                if answer is not None:
                    self.send(envelope.src, answer)
        elif isinstance(message, AppendReply):
            if self.primary is not None:
                self.after(self.primary.on_reply(message, self.sim.now))
        elif isinstance(message, EpochEnd):
            if self.primary is not None:
                end = self.primary.on_epoch_end(message)
                if end is not None:
                    self.send(envelope.src, end)
                if self.primary.deposed:
                    self.step_down()
        elif isinstance(message, Push):
            self.push(message)

    def push(self, push: Push) -> None:
        if self.primary is None:
            self.send(push.producer, PushReply(push.seq, ok=False))
            return
        outcome = self.primary.append(
            push.body, origin=push.producer, seq=push.seq, now=self.sim.now
        )
        if isinstance(outcome, Appended):
            self.perform(outcome.effects)
            for outgoing in outcome.messages:
                self.send(outgoing.to, outgoing.message)
            self.waiting.append((outcome.offset, push.producer, push.seq))
        elif isinstance(outcome, Duplicate):
            self.waiting.append((outcome.covered_through, push.producer, push.seq))
        else:
            self.sim.refusals += 1
            self.send(push.producer, PushReply(push.seq, ok=False))
            return
        self.acknowledge()

    def tick(self) -> None:
        if self.primary is not None:
            self.after(self.primary.tick(self.sim.now))


@dataclass
class Producer:
    """Pushes seq 0, 1, ... one at a time; retries the same seq until it is acknowledged."""

    sim: Sim
    name: str
    next_seq: int = 0
    outstanding: int | None = None
    sent_at: float = 0.0

    def start(self) -> None:
        if self.outstanding is None and self.next_seq < MAX_SEQ:
            self.outstanding = self.next_seq
            self.send()

    def send(self) -> None:
        assert self.outstanding is not None
        body = f"{self.name}/{self.outstanding}".encode()
        self.sim.send(self.name, self.sim.state.primary, Push(self.name, self.outstanding, body))
        self.sent_at = self.sim.now

    def tick(self) -> None:
        if self.outstanding is not None and self.sim.now - self.sent_at >= CLIENT_RETRY_S:
            self.send()

    def handle(self, reply: PushReply) -> None:
        if reply.seq != self.outstanding:
            return
        if reply.ok:
            self.sim.client_acked.add((self.name, reply.seq))
            self.outstanding = None
            self.next_seq += 1
        else:
            self.sent_at = -CLIENT_RETRY_S  # retry at the next tick


# --------------------------------------------------------------------------- the world


class Sim:
    def __init__(
        self,
        follower_cls: type[Follower] = Follower,
        primary_cls: type[Primary] = Primary,
        min_insync: int = 2,
    ) -> None:
        self.follower_cls = follower_cls
        self.primary_cls = primary_cls
        self.now = 0.0
        self.control = ControlState()
        self.control.apply(CreateStream(STREAM, NODES, min_insync))
        self.last_heard = dict.fromkeys(NODES, 0.0)
        self.log_ends: dict[str, int] = {}
        self.cuts: set[frozenset[str]] = set()
        self.net: list[Envelope] = []
        self.nodes = {name: Node(self, name) for name in NODES}
        self.producers = {name: Producer(self, name) for name in PRODUCERS}
        self.acked: dict[int, Entry] = {}  # offset -> the entry acknowledged there
        self.acked_by: dict[int, str] = {}  # epoch -> the node that acknowledged in it
        self.leaders: dict[int, str] = {}  # epoch -> the node that took office in it
        self.client_acked: set[tuple[str, int]] = set()
        self.cut_entries = 0  # entries cut from divergent tails
        self.refusals = 0  # pushes a primary refused
        self.handovers = 0  # elections a planned hand-over asked for

    @property
    def state(self) -> StreamState:
        state = self.control.stream(STREAM)
        assert state is not None
        return state

    def connected(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cuts

    def send(self, src: str, dst: str, payload: Payload) -> None:
        if self.connected(src, dst):
            self.net.append(Envelope(src, dst, payload))

    def deliver(self, index: int) -> None:
        envelope = self.net.pop(index)
        if envelope.dst in self.producers:
            payload = envelope.payload
            assert isinstance(payload, PushReply)
            self.producers[envelope.dst].handle(payload)
            return
        node = self.nodes[envelope.dst]
        if node.up and self.connected(envelope.src, envelope.dst):
            node.handle(envelope)

    def deliver_where(self, wanted: Callable[[Envelope], bool]) -> None:
        """Deliver, oldest first, every message that ``wanted`` picks (and those they cause)."""
        while (found := next((i for i, e in enumerate(self.net) if wanted(e)), None)) is not None:
            self.deliver(found)

    def tick(self, dt: float) -> None:
        self.now += dt
        for name, node in self.nodes.items():
            if node.up and self.connected(name, CP):
                self.last_heard[name] = self.now
                self.log_ends[name] = node.log_end
        for elect in failover_decisions(
            self.control.streams(), self.last_heard, self.now, FAILOVER_S, {STREAM: self.log_ends}
        ):
            self.control.apply(elect)
        for name, node in self.nodes.items():
            if node.up and self.connected(name, CP):
                node.learn(self.state)
        for node in self.nodes.values():
            if node.up:
                node.tick()
        for producer in self.producers.values():
            producer.tick()

    # ----------------------------------------------------------------------- properties

    def took_office(self, node: Node, epoch: int) -> None:
        if self.leaders.setdefault(epoch, node.name) != node.name:
            raise Violation(f"epoch {epoch}: {node.name} and {self.leaders[epoch]} both lead")
        for offset, entry in self.acked.items():
            if offset > node.log_end or node.disk.log[offset] != entry:
                raise Violation(f"{node.name} leads epoch {epoch} without acked offset {offset}")

    def acknowledged(self, node: Node, epoch: int, offset: int) -> None:
        if self.acked_by.setdefault(epoch, node.name) != node.name:
            raise Violation(f"epoch {epoch}: {node.name} and {self.acked_by[epoch]} acknowledge")
        entry = node.disk.log[offset]
        if self.acked.setdefault(offset, entry) != entry:
            raise Violation(f"offset {offset} acknowledged as {entry} and {self.acked[offset]}")

    def check(self) -> None:
        """The properties that hold after every step."""
        for node in self.nodes.values():
            ids = [(entry.origin, entry.seq) for entry in node.disk.log]
            if len(ids) != len(set(ids)):
                raise Violation(f"{node.name}'s log repeats an id: {ids}")
        for member in self.state.in_sync:
            log = self.nodes[member].disk.log
            for offset, entry in self.acked.items():
                if offset >= len(log) or log[offset] != entry:
                    raise Violation(f"ISR member {member} lacks acked offset {offset}: {log}")

    def settle(self, rounds: int = 100) -> None:
        """Heal every fault, then run until every producer has pushed all its batches and
        the replicas agree."""
        self.cuts.clear()
        for node in self.nodes.values():
            node.restart()
            node.crash_after = None
        for _ in range(rounds):
            for _ in range(2000):
                if not self.net:
                    break
                self.deliver(0)
            self.check()
            if self.quiet():
                return
            self.tick(0.25)
            for producer in self.producers.values():
                producer.start()
        raise AssertionError(f"did not settle: {self.describe()}")

    def quiet(self) -> bool:
        primary = self.nodes[self.state.primary].primary
        logs = [node.disk.log for node in self.nodes.values()]
        return (
            all(p.outstanding is None and p.next_seq == MAX_SEQ for p in self.producers.values())
            and primary is not None
            and primary.acknowledged == primary.log_end
            and all(log == logs[0] for log in logs)
        )

    def final_check(self) -> None:
        log = self.nodes[self.state.primary].disk.log
        for offset, entry in self.acked.items():
            assert log[offset] == entry
        ids = {(entry.origin, entry.seq) for entry in log}
        assert self.client_acked <= ids, self.client_acked - ids

    def describe(self) -> str:
        lines = [f"t={self.now:.2f} {self.state}"]
        for node in self.nodes.values():
            role = "primary" if node.primary else "follower" if node.follower else "down"
            log = [f"{e.origin}/{e.seq}@{e.epoch}" for e in node.disk.log]
            lines.append(f"{node.name} {role} epoch={node.disk.epoch} {log}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the checks fire


def test_a_crash_between_effects_keeps_only_the_effects_before_it() -> None:
    sim = Sim()
    sim.tick(0.05)
    node = sim.nodes["n1"]
    node.crash_after = 1
    sim.producers["p0"].start()
    with pytest.raises(Crash, match="n1"):
        sim.deliver_where(lambda _: True)  # n1 saves its history, dies before the write
    assert (node.disk.epoch, node.disk.history, node.disk.log) == (1, (EpochStart(1, 0),), [])


def test_a_cut_link_loses_messages_both_ways() -> None:
    sim = Sim()
    sim.cuts.add(frozenset(("n0", "n1")))
    sim.send("n0", "n1", PushReply(0, True))
    sim.send("n1", "n0", PushReply(0, True))
    sim.send("n0", "n2", PushReply(0, True))
    assert [(e.src, e.dst) for e in sim.net] == [("n0", "n2")]


def test_two_leaders_in_one_epoch_are_caught() -> None:
    sim = Sim()
    sim.tick(0.05)
    with pytest.raises(Violation, match="epoch 1: n1 and n0 both lead"):
        sim.took_office(sim.nodes["n1"], 1)


def test_an_offset_acknowledged_twice_with_different_entries_is_caught() -> None:
    sim = Sim()
    sim.nodes["n0"].disk.log.append(Entry(1, "p0", 0, b"a"))
    sim.nodes["n1"].disk.log.append(Entry(2, "p1", 0, b"b"))
    sim.acknowledged(sim.nodes["n0"], 1, 0)
    with pytest.raises(Violation, match="offset 0 acknowledged as"):
        sim.acknowledged(sim.nodes["n1"], 2, 0)


def test_a_repeated_id_and_an_isr_member_without_an_acked_entry_are_caught() -> None:
    sim = Sim()
    sim.nodes["n2"].disk.log += [Entry(1, "p0", 0, b"a"), Entry(1, "p0", 0, b"a")]
    with pytest.raises(Violation, match="n2's log repeats an id"):
        sim.check()
    sim = Sim()
    sim.nodes["n0"].disk.log.append(Entry(1, "p0", 0, b"a"))
    sim.acknowledged(sim.nodes["n0"], 1, 0)
    with pytest.raises(Violation, match="ISR member n1 lacks acked offset 0"):
        sim.check()
