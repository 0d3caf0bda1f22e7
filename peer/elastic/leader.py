"""The burst leader: the one peer of an elastic participant that grows and shrinks it
(``peer join --elastic MIN:MAX``; issue 28, Stormy's cloud bursting with DS2's sizing).

Theory of operation
-------------------
Every elastic peer of the participant runs a :class:`BurstLeader`; each ``round_s`` it reads
the participant's :class:`~peer.replication.control.BurstState` from the control plane.

- **Who leads.** If the participant has no leader, or its leader is not live (the overlay's
  failure detector), the peer submits ``ClaimBurst`` in the term it saw. Claims are decided
  in the Raft log: of two peers claiming on the same term one wins, and the term rises. A
  leader acts only through ``PlanBurst`` commands, which hold only in its term: a leader
  that was deposed while it decided (killed, cut off) has its plan refused, so two leaders
  never both act.
- **What it decides.** Every ``decide_s``, once the participant has settled, the leader reads
  the participant's gossiped figures (:mod:`peer.elastic.figures`) and lets
  :func:`peer.elastic.sizing.decide_size` choose the size. Settled: every launched name is
  live and ``cooldown_s`` has passed since the plan last changed (or ``settle_s`` passed, if a
  launched peer never came up); the rates leave out a peer seen for less than ``warmup_s``
  (a peer starting its Spark is busy without processing anything: its useful time would
  make the true rate look low). Growing acts on one decision (DS2 scales up in one step);
  shrinking only once ``confirm`` decisions in a row ask for it (a dip in the load, or in
  the measured rates, drains nobody). Growing adds names to the plan (``PARTICIPANT-eN``,
  never one used before); shrinking takes the newest launched names out. Peers started by
  hand are never drained, so the plan holds at most ``MAX - 1`` names. The plan is committed
  first, then acted on.
- **Acting on the plan.** Every round the leader asks its provisioner to start each name of
  the plan (idempotent: a name that runs is left alone), so a new leader finishes what a dead
  one began and the participant never runs more names than the plan, nor the plan more than
  MAX allows. A name that left the plan drains itself and stops (:mod:`peer.elastic.drain`).

Every decision, with its reason and figures, goes to ``DATA_DIR/elastic.jsonl`` and the last
ones to ``peer status`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from peer.elastic.figures import Arrivals, participant_load
from peer.elastic.provision import Provisioner, launch_names
from peer.elastic.sizing import SizingPolicy, decide_size
from peer.errors import FedstreamError
from peer.replication.bursts import BurstState, ClaimBurst, PlanBurst
from peer.timing import MONOTONIC, Clock

__all__ = ["BurstControl", "BurstLeader", "Decision", "LeaderStatus"]

log = logging.getLogger(__name__)

ROUND_S = 2.0
DECIDE_S = 10.0
COOLDOWN_S = 30.0
WARMUP_S = 30.0
CONFIRM = 3
SETTLE_S = 120.0
KEEP = 50


class BurstControl(Protocol):
    """The control plane as the burst leader uses it (peer.replication.ControlClient)."""

    async def read_burst(self, participant: str) -> BurstState | None: ...

    async def submit(self, command: ClaimBurst | PlanBurst) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Decision:
    """One thing the leader did or decided, for the record."""

    t: float  # unix time
    action: str  # lead, grow, shrink, keep, refused
    term: int
    current: int
    size: int
    reason: str
    offered: float | None = None  # rows/s, backlog included
    true_rate: float | None = None  # rows per busy second of one peer
    launched: tuple[str, ...] = ()


class LeaderStatus(TypedDict):
    """An elastic peer's part of ``peer status``: its participant's leader and plan, and the
    last decisions this peer made as leader (each a :class:`Decision` as a map)."""

    participant: str
    min: int
    max: int
    leader: str | None
    leading: bool
    term: int | None
    launched: list[str]
    counts: dict[str, int]
    decisions: list[dict[str, Any]]


class BurstLeader:
    def __init__(
        self,
        *,
        node: str,
        participant: str,
        policy: SizingPolicy,
        control: BurstControl,
        figures: Callable[[], Mapping[str, Mapping[str, object]]],
        is_live: Callable[[str], bool],
        provisioner: Provisioner,
        record: Path | None = None,
        clock: Clock = MONOTONIC,
        wall: Callable[[], float] = time.time,
        decide_s: float = DECIDE_S,
        settle_s: float = SETTLE_S,
        cooldown_s: float = COOLDOWN_S,
        warmup_s: float = WARMUP_S,
        confirm: int = CONFIRM,
    ) -> None:
        self.node = node
        self.participant = participant
        self.policy = policy
        self.control = control
        self.figures = figures  # node id hex -> its gossiped figures, this peer's included
        self.is_live = is_live
        self.provisioner = provisioner
        self.record = record
        self.clock = clock
        self.wall = wall
        self.decide_s = decide_s
        self.settle_s = settle_s
        self.cooldown_s = cooldown_s
        self.warmup_s = warmup_s
        self.confirm = confirm
        self.first_seen: dict[str, float] = {}  # node -> when its figures were first seen
        self.shrink_asks = 0  # decisions in a row that asked to shrink
        self.state: BurstState | None = None
        self.leading = False
        self.changed_at = clock()  # the last change of the plan seen (settling)
        self.decided_at = clock() - decide_s
        self.arrivals = Arrivals()
        self.decisions: deque[Decision] = deque(maxlen=KEEP)
        self.counts: dict[str, int] = {}  # decisions by action, since this peer started

    async def run(self, round_s: float = ROUND_S) -> None:
        while True:
            try:
                await self.round()
            except FedstreamError as exc:  # the control plane is away: try next round
                log.info("elastic %s: %s", self.participant, exc)
            except Exception:
                log.exception("elastic %s: a round failed", self.participant)
            await asyncio.sleep(round_s)

    async def round(self) -> None:
        state = await self.control.read_burst(self.participant)
        if state is not None and (self.state is None or state.version != self.state.version):
            self.changed_at = self.clock()
        self.state = state
        if state is None or (state.leader != self.node and not self.is_live(state.leader)):
            await self._claim(state)
            return
        if state.leader != self.node:
            self.leading = False
            return
        if not self.leading:
            self.leading = True
            load = participant_load(self.figures())
            size = max(1, load.serving - load.launched_live) + len(state.launched)
            self._note("lead", state, size, f"took the lead in term {state.term}")
        await self._provision(state)
        now = self.clock()
        if now - self.decided_at >= self.decide_s:
            self.decided_at = now
            await self._decide(state)

    async def _claim(self, state: BurstState | None) -> None:
        term = 0 if state is None else state.term
        command = ClaimBurst(
            self.participant, self.node, term, self.policy.minimum, self.policy.maximum
        )
        reply = await self.control.submit(command)
        if reply.get("ok"):
            log.info("elastic %s: claimed the lead in term %d", self.participant, term + 1)

    async def _provision(self, state: BurstState) -> None:
        for name in state.launched:
            try:
                done = await asyncio.to_thread(self.provisioner.start, name)
            except Exception as exc:
                log.warning("elastic %s: starting %s failed: %s", self.participant, name, exc)
                continue
            if done.startswith("started") or done.startswith("ran"):
                log.info("elastic %s: %s", self.participant, done)

    async def _decide(self, state: BurstState) -> None:
        now = self.clock()
        figures = self.figures()
        for node in list(self.first_seen):
            if node not in figures:
                del self.first_seen[node]
        for node in figures:
            self.first_seen.setdefault(node, now)
        load = participant_load(figures)
        arriving = self.arrivals.update(now, load)
        manual = max(1, load.serving - load.launched_live)
        current = manual + len(state.launched)
        since = now - self.changed_at
        settled = load.launched_live >= len(state.launched) and since >= self.cooldown_s
        if not settled and since < self.settle_s:
            return  # peers are still coming up (or draining): their load is not seen yet
        warm = tuple(p for p in load.peers if now - self.first_seen[p.node] >= self.warmup_s)
        decision = decide_size(current, warm, arriving, load.backlog, self.policy)
        if decision is None or decision.size == current:
            self.shrink_asks = 0
            return
        if decision.size < current:
            self.shrink_asks += 1
            if self.shrink_asks < self.confirm:
                return
        self.shrink_asks = 0
        if decision.size > current:
            taken = set(state.launched) | self.provisioner.used()
            new = launch_names(self.participant, sorted(taken), decision.size - current)
            launched = (*state.launched, *new)
            action = "grow"
        else:
            drop = min(current - decision.size, len(state.launched))
            if drop == 0:
                return  # only peers started by hand are left
            launched = state.launched[: len(state.launched) - drop]
            action = "shrink"
        size = manual + len(launched)
        reply = await self.control.submit(
            PlanBurst(self.participant, state.term, state.version, launched)
        )
        if not reply.get("ok"):
            self._note("refused", state, size, str(reply.get("reason", "")))
            return
        self.changed_at = self.clock()
        self._note(
            action, state, size, decision.reason, decision.offered, decision.true_rate, launched,
            current=current,
        )  # fmt: skip
        await self._provision(
            BurstState(
                state.participant, state.leader, state.term, state.minimum, state.maximum,
                launched, state.version + 1,
            )
        )  # fmt: skip

    def _note(
        self,
        action: str,
        state: BurstState,
        size: int,
        reason: str,
        offered: float | None = None,
        true_rate: float | None = None,
        launched: tuple[str, ...] | None = None,
        *,
        current: int | None = None,
    ) -> None:
        decision = Decision(
            round(self.wall(), 3), action, state.term, size if current is None else current,
            size, reason, None if offered is None else round(offered, 1),
            None if true_rate is None else round(true_rate, 1),
            state.launched if launched is None else launched,
        )  # fmt: skip
        self.decisions.append(decision)
        self.counts[action] = self.counts.get(action, 0) + 1
        log.info("elastic %s: %s to %d: %s", self.participant, action, size, reason)
        if self.record is not None:
            line = json.dumps({**asdict(decision), "launched": list(decision.launched)})
            with self.record.open("a", encoding="utf-8") as f:
                f.write(line + "\n")

    def status(self) -> LeaderStatus:
        """``peer status``'s ``elastic`` section."""
        state = self.state
        return {
            "participant": self.participant,
            "min": self.policy.minimum,
            "max": self.policy.maximum,
            "leader": None if state is None else state.leader,
            "leading": self.leading,
            "term": None if state is None else state.term,
            "launched": [] if state is None else list(state.launched),
            "counts": dict(self.counts),
            "decisions": [
                {**asdict(d), "launched": list(d.launched)} for d in list(self.decisions)[-10:]
            ],
        }
