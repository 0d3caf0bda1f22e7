"""The brain's rounds (measure, offer, move) and its bookkeeping of offers taken: :class:`Brain`.

The theory of operation is in :mod:`peer.brain`. This module holds the brain's state and
carries out what the pure decisions (:mod:`contracts.bpm`, :mod:`peer.brain.offers`) say;
it reaches its peer only through :class:`peer.brain.host.BrainHost`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts.book import ContractBook
from contracts.bpm import (
    Box,
    BpmConfig,
    ContractView,
    Offer,
    PeerState,
    choose_offer,
    remember_outcome,
)
from contracts.contract import Contract, price_range
from peer.brain.host import BrainHost, SiblingMove, Siblings
from peer.brain.load import LoadMeter, Meter, fragment_loads
from peer.brain.offers import (
    Expected,
    OfferReply,
    accepted_boxes,
    answer_offer,
    covered,
    kind_of,
    names,
    offer_frame,
    parse_offer,
    pause_s,
    pause_steps,
    sent_bytes,
    valid_at,
)
from peer.brain.status import BrainStatus, brain_status, load_figures
from peer.errors import FedstreamError
from peer.storage.ledger import Ledger, LedgerEntry
from peer.timing import WALL, Clock, every, within

__all__ = ["Brain"]

log = logging.getLogger(__name__)

OVERLOAD_BACKLOG = 20  # input batches waiting, and growing: the peer is falling behind
# After this many rounds, a partner that refused and a fragment that failed to move are tried
# again in their turn.
FORGET_REFUSAL_ROUNDS = 10
EXPECT_ROUNDS = 10  # an accepted box that has not arrived after this no longer holds us up


@dataclass
class _Mark:
    t: float
    busy: dict[str, float]
    backlog: int


class Brain:
    """The bounded-price mechanism for one peer (see :mod:`peer.brain`)."""

    def __init__(
        self,
        host: BrainHost,
        book: ContractBook,
        config: BpmConfig,
        capacity: float,
        *,
        meter: Meter | None = None,
        clock: Clock = WALL,
        overload_backlog: int = OVERLOAD_BACKLOG,
        siblings: Siblings | None = None,
    ) -> None:
        """``capacity`` is in cores, like the loads; ``siblings``: balancing inside this
        peer's participant, asked each round before any offer (None: none). Reads the
        ledger (a blocking read, once, at peer start)."""
        if not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(f"capacity must be a positive number of cores, not {capacity}")
        self.host = host
        self.book = book
        self.me = book.me
        self.config = config
        self.capacity = float(capacity)
        self.meter: Meter = meter if meter is not None else LoadMeter()
        self.clock = clock
        self.overload_backlog = overload_backlog
        self.siblings = siblings
        self.ledger = Ledger(Path(host.data_dir) / "ledger.jsonl")
        self.ledger.load()
        self._contracts = {c.id: c for c in book.contracts}
        self._mark: _Mark | None = None
        self._state: PeerState | None = None
        self._measured_from = 0.0  # start of the period the last measurement covers
        self._round = 0
        self._refused: tuple[str, ...] = ()  # bpm refusal memory, oldest refusal first
        self._refused_round: dict[str, int] = {}
        self._failed_round: dict[str, int] = {}  # fragments whose move failed, and when
        self._offer_to: str | None = None  # partner of the offer in flight
        self._moving: str | None = None  # fragment of the move out in flight
        self._moved_at: float | None = None  # when the last move out ended
        self._expected: dict[str, Expected] = {}
        # the replicated fragments of the last measurement, and the peers each may go to
        self._pinned: tuple[Box, ...] = ()
        self._only_to: dict[str, frozenset[bytes]] = {}

    # -- the rounds ----------------------------------------------------------------------------

    async def run(self) -> None:
        """A round every ``period_s`` (the first at once) until cancelled; a failed round is
        logged and the next one comes as usual."""
        await every(
            self.config.period_s, self.step, clock=self.clock, first_s=0, what="brain round"
        )

    async def step(self) -> Offer | None:
        """One round: measure, then make (and carry out) at most one offer. Returns it."""
        self._round += 1
        self._forget_old_refusals()
        try:
            state = await self.measure()
        except Exception as exc:
            log.warning("brain: measuring load failed, skipping this round: %s", exc)
            self._mark = None  # the next round starts the marks afresh
            return None
        if state is None:
            return None
        if self._moved_at is not None and self._measured_from <= self._moved_at:
            return None  # the period measured still holds load that moved away
        if self.siblings is not None and not self._busy():
            # replicated fragments too: they move to a sibling by a hand-over
            both = PeerState(state.load, (*state.boxes, *self._pinned), state.capacity)
            mine = self._without_failed(both)
            plan = self.siblings.plan(mine, self.host.live_members(), self._only_to)
            if plan is not None:
                await self._hand_to_sibling(plan, mine)
                return None
        now = self.clock()
        options = self._options(state, now)
        state = self._without_failed(state)
        offer = choose_offer(
            state,
            [view for view, _, _ in options],
            config=self.config,
            refused_or_failed=self._refused,
            in_flight=self._busy(),
        )
        if offer is None:
            return None
        # Any contract of that partner at that price covering every box allows the offer; the
        # book lists each partner's cheapest first.
        for view, contract, target in options:
            if (
                view.partner == offer.partner
                and view.price == offer.price
                and all(view.covers(b.kind) for b in offer.boxes)
            ):
                await self._offer(offer, contract, target)
                return offer
        raise AssertionError("choose_offer made an offer under no contract it was given")

    def _without_failed(self, state: PeerState) -> PeerState:
        """``state`` without the fragments whose move failed lately (not offered again yet)."""
        if not self._failed_round:
            return state
        boxes = tuple(b for b in state.boxes if b.name not in self._failed_round)
        return PeerState(state.load, boxes, state.capacity)

    async def measure(self) -> PeerState | None:
        """This peer's state over the period since the last call (None on the first call)."""
        now = self.clock()
        cpu = await asyncio.to_thread(self.meter.sample)
        busy = {
            name: float(seconds)
            for name, seconds in (await self.host.engine_busy_seconds()).items()
            if math.isfinite(seconds) and seconds >= 0
        }
        backlog = self.host.input_backlog()
        fragments = self.host.movable_fragments()
        handover = self.host.handover_fragments()
        last, self._mark = self._mark, _Mark(now, busy, backlog)
        if last is None:
            return None
        elapsed = now - last.t
        if elapsed <= 0:
            log.warning("brain: the clock went back %.3f s; skipping this round", -elapsed)
            return None
        shares = {}
        for name, total in busy.items():
            before = last.busy.get(name, 0.0)
            # A counter that went back belongs to a query that restarted: count it from zero.
            shares[name] = (total - before if total >= before else total) / elapsed
        loads = fragment_loads(cpu, shares)
        util = cpu / self.capacity
        if backlog > self.overload_backlog and backlog > last.backlog:
            util = max(util, 1.0)
        boxes = tuple(Box(name, kind_of(types), loads.get(name, 0.0)) for name, types in fragments)
        state = PeerState(util * self.capacity, boxes, self.capacity)
        self._pinned = tuple(
            Box(name, kind_of(types), loads.get(name, 0.0)) for name, types, _ in handover
        )
        self._only_to = {name: targets for name, _, targets in handover}
        self._state, self._measured_from = state, last.t
        self._settle_expected(last.t, now)
        return state

    def _settle_expected(self, period_start: float, now: float) -> None:
        """Forget accepted boxes that a whole measured period now counts, or that never came."""
        expire_s = EXPECT_ROUNDS * self.config.period_s + self.config.offer_timeout_s
        for name, e in list(self._expected.items()):
            arrived = e.arrived_at is not None and e.arrived_at <= period_start
            if arrived or (e.arrived_at is None and now - e.accepted_at > expire_s):
                del self._expected[name]

    def _busy(self) -> bool:
        """An offer or a move, in or out, is under way here."""
        incoming = any(e.arrived_at is None for e in self._expected.values())
        return self._offer_to is not None or self._moving is not None or incoming

    def _forget_old_refusals(self) -> None:
        old = {
            p for p, r in self._refused_round.items() if self._round - r >= FORGET_REFUSAL_ROUNDS
        }
        if old:
            self._refused = tuple(p for p in self._refused if p not in old)
            for partner in old:
                del self._refused_round[partner]
        for name, r in list(self._failed_round.items()):
            if self._round - r >= FORGET_REFUSAL_ROUNDS:
                del self._failed_round[name]

    def _remember(self, partner: str, *, accepted: bool) -> None:
        self._refused = remember_outcome(self._refused, partner, accepted=accepted)
        if accepted:
            self._refused_round.pop(partner, None)
        else:
            self._refused_round[partner] = self._round

    # -- offering and moving out ---------------------------------------------------------------

    def _options(self, state: PeerState, now: float) -> list[tuple[ContractView, Contract, bytes]]:
        """A view of each valid contract that covers one of our fragments, with the partner
        peer an offer under it would go to; partners without a live engine peer are left out."""
        kinds = {box.kind for box in state.boxes}
        options: list[tuple[ContractView, Contract, bytes]] = []
        for partner in self.book.partners():
            contracts = [c for c in self.book.contracts_with(partner) if valid_at(c, now)]
            if not contracts:
                continue
            target = self._target(partner)
            if target is None:
                continue
            for contract in contracts:
                kinds_covered = frozenset(k for k in kinds if covered(contract, self.me, k))
                price = price_range(contract)[1]
                if kinds_covered and price > 0:
                    options.append((ContractView(partner, price, kinds_covered), contract, target))
        return options

    def _target(self, partner: str) -> bytes | None:
        """The partner's live engine peer with the lowest gossiped utilisation."""
        best: tuple[float, bytes] | None = None
        for member in self.host.live_members():
            if (
                member.participant != partner
                or not member.engine
                or member.node_id == self.host.node_id
            ):
                continue
            util = member.load.get("util", math.inf)
            rank = (util if math.isfinite(util) else math.inf, member.node_id)
            if best is None or rank < best:
                best = rank
        return None if best is None else best[1]

    async def _offer(self, offer: Offer, contract: Contract, target: bytes) -> None:
        frame = offer_frame(offer, contract.id, self.me)
        partner = offer.partner
        self._offer_to = partner
        try:
            try:
                reply = await within(
                    self.config.offer_timeout_s, self.host.send_offer(target, frame), self.clock
                )
            except (FedstreamError, TimeoutError) as exc:
                reason = exc.message if isinstance(exc, FedstreamError) else "no answer in time"
                log.info("offer to %s under contract %s failed: %s", partner, contract.id, reason)
                self._remember(partner, accepted=False)
                return
            taken = accepted_boxes(reply, offer)
            if not taken:
                said = reply.get("reason") if isinstance(reply, dict) else None
                log.info("%s refused the offer of %s: %s", partner, names(offer.boxes), said)
                self._remember(partner, accepted=False)
                return
            moved, failed = await self._move_all(
                taken, target, partner=partner, contract=contract.id, price=offer.price
            )
            self._remember(partner, accepted=moved > 0 and not failed)
        finally:
            self._offer_to = None

    async def _hand_to_sibling(self, plan: SiblingMove, state: PeerState) -> None:
        """Move what ``plan`` says to a peer of this participant: no offer, no price."""
        assert self.siblings is not None
        log.info("handing %s to a sibling peer: %s", list(plan.fragments), plan.reason)
        boxes = [b for b in state.boxes if b.name in plan.fragments]
        try:
            await self._move_all(
                boxes, plan.target, partner=self.me, contract=plan.contract, price=0.0,
                reason=plan.reason,
            )  # fmt: skip
        finally:
            self.siblings.moved()

    async def _move_all(
        self,
        boxes: Sequence[Box],
        target: bytes,
        *,
        partner: str,
        contract: str,
        price: float,
        reason: str | None = None,
    ) -> tuple[int, bool]:
        """Move the boxes one at a time to ``target``, a peer of ``partner``; stop at the
        first failure. Returns how many moved, and whether one failed."""
        moved = 0
        for box in boxes:
            self._moving = box.name
            error: str | None = None
            result: Mapping[str, object] | None = None
            try:
                result = await self.host.move_fragment(
                    box.name, target, contract=contract, load=box.load, price=price
                )
            except FedstreamError as exc:
                error = exc.message
            except Exception as exc:
                log.exception("moving fragment %s to %s failed", box.name, partner)
                error = str(exc) or type(exc).__name__
            finally:
                self._moving = None
                self._moved_at = self.clock()
            entry: LedgerEntry = {
                "t": self._moved_at,
                "direction": "out",
                "fragment": box.name,
                "partner": partner,
                "peer": target.hex(),
                "contract": contract,
                "load": box.load,
                "price": price,
                "pause_s": pause_s(result),
                "bytes": sent_bytes(result, "bytes"),
                "precopy_bytes": sent_bytes(result, "precopy_bytes"),
                "pause_steps": pause_steps(result),
                "ok": error is None,
            }
            if reason is not None:
                entry["reason"] = reason
            if error is not None:
                entry["error"] = error
            await self._record(entry)
            if error is not None:
                log.warning("fragment %s did not move to %s: %s", box.name, partner, error)
                self._failed_round[box.name] = self._round
                return moved, True
            moved += 1
            log.info(
                "fragment %s (%.3g cores) moved to %s (peer %s) under contract %r at %g",
                box.name, box.load, partner, target.hex()[:12], contract, price,
            )  # fmt: skip
        return moved, False

    async def _record(self, entry: LedgerEntry) -> None:
        try:
            await asyncio.to_thread(self.ledger.append, entry)
        except (OSError, ValueError) as exc:
            log.error("ledger entry not written (%s): %s", exc, entry)

    # -- taking offers -------------------------------------------------------------------------

    async def handle_offer(self, frame: Mapping[str, object], *, sender: str) -> OfferReply:
        """Answer an offer from a peer of participant ``sender`` (the link's authenticated
        participant): ``{"accepted": [names], "reason": str}``. A malformed offer raises
        ``InvalidInput``; nothing here awaits, so the decision and its bookkeeping are atomic."""
        terms = parse_offer(frame, self.config.max_offer_boxes)
        now = self.clock()
        answer = answer_offer(
            terms,
            sender,
            me=self.me,
            contracts=self._contracts,
            now=now,
            state=self._state,
            pending=math.fsum(e.load for e in self._expected.values()),
            busy=self._busy(),
            config=self.config,
        )
        if not answer.taken:
            log.info("offer from %s refused: %s", sender, answer.reason)
            return answer.reply()
        for box in answer.taken:
            self._expected[box.name] = Expected(sender, terms.contract, box.load, now)
        log.info(
            "offer from %s: taking %s under contract %s",
            sender,
            [b.name for b in answer.taken],
            terms.contract,
        )
        return answer.reply()

    async def note_arrival(
        self,
        fragment: str,
        from_participant: str,
        contract: str,
        load: float,
        price: float,
        *,
        from_node: bytes | None = None,
    ) -> None:
        """A fragment moved here (called by the move handler once it runs here): ledger it."""
        now = self.clock()
        expected = self._expected.get(fragment)
        if expected is not None:
            expected.arrived_at = now
        else:
            log.info(
                "fragment %s arrived from %s without an offer taken here",
                fragment,
                from_participant,
            )
        await self._record(
            {
                "t": now,
                "direction": "in",
                "fragment": fragment,
                "partner": from_participant,
                "peer": from_node.hex() if from_node is not None else None,
                "contract": contract,
                "load": float(load),
                "price": float(price),
                "ok": True,
            }
        )

    # -- what others see -----------------------------------------------------------------------

    def load_figures(self) -> dict[str, float]:
        """What the peer gossips about its load (:func:`peer.brain.status.load_figures`)."""
        return load_figures(self._state)

    def status(self) -> BrainStatus:
        """The brain's part of ``peer status`` (:func:`peer.brain.status.brain_status`)."""
        return brain_status(
            state=self._state,
            capacity=self.capacity,
            book=self.book,
            now=self.clock(),
            ledger=self.ledger.entries(),
            refused_partners=self._refused,
            offer_in_flight=self._offer_to,
            moving=self._moving,
            expected=self._expected,
        )
