"""The peer's brain: Medusa's bounded-price mechanism on a live peer (DESIGN.md section 7).

Theory of operation
-------------------
The decisions are pure and live in :mod:`contracts.bpm`; this module feeds them measurements,
carries out what they decide and keeps the ledger. Every ``period_s`` the brain takes a round:

1. *Measure.* The CPU of the peer's process tree (:class:`peer.load.LoadMeter`, in cores) and
   the share of the period each fragment's streaming query spent in micro-batches (deltas of
   ``Engine.busy_seconds``) give a load per fragment (:func:`peer.load.fragment_loads`) and a
   utilisation ``u = cpu / capacity``. CPU alone misses one kind of overload: a peer whose
   queries cannot keep up (one busy core of many, Spark waiting on its disk) while the CPU is
   not saturated. So when the batches waiting in the fragments' inputs exceed
   ``overload_backlog`` and grew over the period, ``u`` is raised to at least 1: the peer takes
   in more than it gets through, which is what being over capacity means. The first round only
   sets the marks; a round whose measuring fails is skipped.
2. *Offer.* Each valid contract (checked against the clock every round: the book is loaded
   once) whose partner has a live engine peer becomes a ``ContractView`` at its highest price,
   covering the kinds of the fragments this peer may hand over under it. ``bpm.choose_offer``
   picks at most one offer; it goes to the partner's live engine peer with the lowest gossiped
   utilisation, and an answer must come within ``offer_timeout_s``.
3. *Move.* The fragments the partner accepted (only those that were offered) move one at a
   time, each recorded in the ledger. A refusal, an unanswered offer or a failed move puts the
   partner last in the refusal memory (``bpm.remember_outcome``); refusals are forgotten after
   ``FORGET_REFUSAL_ROUNDS`` rounds. A fragment whose move failed is not offered again for as
   many rounds: a failed move pauses the fragment, and what made it fail may well last. After
   a move, no offer is made until a whole measured period lies after it: the period that saw
   the move still counts the load that left.

The other side, :meth:`Brain.handle_offer`, validates an offer (malformed: ``InvalidInput``),
refuses one that no valid contract with its sender allows, and takes with ``bpm.accept`` what
its last measurement leaves room for, counting the boxes it already accepted that have not yet
shown in a measurement. One thing happens at a time per peer: while this peer's own offer is
out, a move is under way, or boxes it accepted have not all arrived, it takes nothing (and
offers nothing). ``handle_offer`` decides without awaiting anything, so two offers arriving
together cannot both be taken.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from contracts.book import ContractBook
from contracts.bpm import (
    Box,
    BpmConfig,
    ContractView,
    Offer,
    PeerState,
    accept,
    choose_offer,
    remember_outcome,
    unit_take_cost,
)
from contracts.contract import BOX_TYPES, Contract, covers, format_time, price_range
from peer.errors import FedstreamError, InvalidInput
from peer.ledger import Ledger, with_durations
from peer.load import LoadMeter, fragment_loads

__all__ = ["Brain", "BrainPeer", "kind_of"]

log = logging.getLogger(__name__)

OVERLOAD_BACKLOG = 20  # input batches waiting, and growing: the peer is falling behind
# After this many rounds, a partner that refused and a fragment that failed to move are tried
# again in their turn.
FORGET_REFUSAL_ROUNDS = 10
EXPECT_ROUNDS = 10  # an accepted box that has not arrived after this no longer holds us up
LEDGER_SHOWN = 50  # ledger entries in status()
MAX_NAME_CHARS = 256


class BrainPeer(Protocol):
    """The members of peer.node.Peer the brain uses."""

    data_dir: Path
    fed: Any  # peer.federation.Federation: call(), node_id, overlay.live_members()

    def movable_fragments(self) -> list[tuple[str, tuple[str, ...]]]: ...

    async def engine_busy_seconds(self) -> dict[str, float]: ...

    def input_backlog(self) -> int: ...

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> dict[str, Any]: ...


def kind_of(box_types: Sequence[str]) -> str:
    """A fragment's kind: its box types, each once, sorted and joined by '+'."""
    return "+".join(sorted(set(box_types)))


def _covered(contract: Contract, sender: str, kind: str) -> bool:
    """Whether ``sender`` may hand a fragment of ``kind`` to the other party."""
    try:
        return all(covers(contract, sender, t) for t in kind.split("+"))
    except ValueError:  # a box type contracts do not know
        return False


def _valid_at(contract: Contract, now: float) -> bool:
    at = datetime.fromtimestamp(now, UTC)
    return contract.not_before <= at < contract.not_after


@dataclass
class _Mark:
    t: float
    busy: dict[str, float]
    backlog: int


@dataclass
class _Expected:
    """A box this peer accepted whose move has not yet shown in a measurement."""

    sender: str
    contract: str
    load: float
    accepted_at: float
    arrived_at: float | None = None


class Brain:
    """The bounded-price mechanism for one peer (see the module's theory of operation)."""

    def __init__(
        self,
        peer: BrainPeer,
        book: ContractBook,
        config: BpmConfig,
        capacity: float,
        *,
        meter: LoadMeter | None = None,
        clock: Callable[[], float] = time.time,
        overload_backlog: int = OVERLOAD_BACKLOG,
    ) -> None:
        """``capacity`` is in cores, like the loads. Reads the ledger (a blocking read, once,
        at peer start)."""
        if not (math.isfinite(capacity) and capacity > 0):
            raise ValueError(f"capacity must be a positive number of cores, not {capacity}")
        self.peer = peer
        self.book = book
        self.me = book.me
        self.config = config
        self.capacity = float(capacity)
        self.meter = meter if meter is not None else LoadMeter()
        self.clock = clock
        self.overload_backlog = overload_backlog
        self.ledger = Ledger(Path(peer.data_dir) / "ledger.jsonl")
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
        self._expected: dict[str, _Expected] = {}

    # -- the rounds ----------------------------------------------------------------------------

    async def run(self) -> None:
        """A round every ``period_s`` until cancelled; never raises anything else."""
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("brain round failed; trying again next round")
            await asyncio.sleep(self.config.period_s)

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
        if state is None or self.peer.fed is None:
            return None
        if self._moved_at is not None and self._measured_from <= self._moved_at:
            return None  # the period measured still holds load that moved away
        now = self.clock()
        options = self._options(state, now)
        if self._failed_round:
            boxes = tuple(b for b in state.boxes if b.name not in self._failed_round)
            state = PeerState(state.load, boxes, state.capacity)
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

    async def measure(self) -> PeerState | None:
        """This peer's state over the period since the last call (None on the first call)."""
        now = self.clock()
        cpu = await asyncio.to_thread(self.meter.sample)
        busy = {
            name: float(seconds)
            for name, seconds in (await self.peer.engine_busy_seconds()).items()
            if math.isfinite(seconds) and seconds >= 0
        }
        backlog = self.peer.input_backlog()
        fragments = self.peer.movable_fragments()
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

    # -- offering ------------------------------------------------------------------------------

    def _options(self, state: PeerState, now: float) -> list[tuple[ContractView, Contract, bytes]]:
        """A view of each valid contract that covers one of our fragments, with the partner
        peer an offer under it would go to; partners without a live engine peer are left out."""
        kinds = {box.kind for box in state.boxes}
        options: list[tuple[ContractView, Contract, bytes]] = []
        for partner in self.book.partners():
            contracts = [c for c in self.book.contracts_with(partner) if _valid_at(c, now)]
            if not contracts:
                continue
            target = self._target(partner)
            if target is None:
                continue
            for contract in contracts:
                covered = frozenset(k for k in kinds if _covered(contract, self.me, k))
                price = price_range(contract)[1]
                if covered and price > 0:
                    options.append((ContractView(partner, price, covered), contract, target))
        return options

    def _target(self, partner: str) -> bytes | None:
        """The partner's live engine peer with the lowest gossiped utilisation."""
        fed = self.peer.fed
        best: tuple[float, bytes] | None = None
        for member in fed.overlay.live_members():
            if member.participant != partner or not member.engine or member.node_id == fed.node_id:
                continue
            util = member.load.get("util", math.inf)
            rank = (util if math.isfinite(util) else math.inf, member.node_id)
            if best is None or rank < best:
                best = rank
        return None if best is None else best[1]

    async def _offer(self, offer: Offer, contract: Contract, target: bytes) -> None:
        frame = {
            "op": "offer",
            "contract": contract.id,
            "from": self.me,
            "price": offer.price,
            "unit_cost": offer.unit_cost,
            "boxes": [[b.name, b.kind, b.load] for b in offer.boxes],
        }
        partner = offer.partner
        self._offer_to = partner
        try:
            try:
                async with asyncio.timeout(self.config.offer_timeout_s):
                    reply = await self.peer.fed.call(target, frame)
            except (FedstreamError, TimeoutError) as exc:
                reason = exc.message if isinstance(exc, FedstreamError) else "no answer in time"
                log.info("offer to %s under contract %s failed: %s", partner, contract.id, reason)
                self._remember(partner, accepted=False)
                return
            taken = _accepted(reply, offer)
            if not taken:
                said = reply.get("reason") if isinstance(reply, dict) else None
                log.info("%s refused the offer of %s: %s", partner, _names(offer.boxes), said)
                self._remember(partner, accepted=False)
                return
            moved, failed = await self._move_all(taken, offer, contract, target)
            self._remember(partner, accepted=moved > 0 and not failed)
        finally:
            self._offer_to = None

    async def _move_all(
        self, boxes: Sequence[Box], offer: Offer, contract: Contract, target: bytes
    ) -> tuple[int, bool]:
        """Move the accepted boxes one at a time; stop at the first failure."""
        moved = 0
        for box in boxes:
            self._moving = box.name
            error: str | None = None
            result: Any = None
            try:
                result = await self.peer.move_fragment(
                    box.name, target, contract=contract.id, load=box.load, price=offer.price
                )
            except FedstreamError as exc:
                error = exc.message
            except Exception as exc:
                log.exception("moving fragment %s to %s failed", box.name, offer.partner)
                error = str(exc) or type(exc).__name__
            finally:
                self._moving = None
                self._moved_at = self.clock()
            entry = {
                "t": self._moved_at,
                "direction": "out",
                "fragment": box.name,
                "partner": offer.partner,
                "peer": target.hex(),
                "contract": contract.id,
                "load": box.load,
                "price": offer.price,
                "pause_s": _pause_s(result),
                "ok": error is None,
            }
            if error is not None:
                entry["error"] = error
            await self._record(entry)
            if error is not None:
                log.warning("fragment %s did not move to %s: %s", box.name, offer.partner, error)
                self._failed_round[box.name] = self._round
                return moved, True
            moved += 1
            log.info(
                "fragment %s (%.3g cores) moved to %s under contract %s at %g",
                box.name,
                box.load,
                offer.partner,
                contract.id,
                offer.price,
            )
        return moved, False

    async def _record(self, entry: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(self.ledger.append, entry)
        except (OSError, ValueError) as exc:
            log.error("ledger entry not written (%s): %s", exc, entry)

    # -- taking offers -------------------------------------------------------------------------

    async def handle_offer(self, frame: Mapping[str, Any], *, sender: str) -> dict[str, Any]:
        """Answer an offer from a peer of participant ``sender`` (the link's authenticated
        participant): ``{"accepted": [names], "reason": str}``. A malformed offer raises
        ``InvalidInput``; nothing here awaits, so the decision and its bookkeeping are atomic."""
        contract_id, claimed, price, boxes = _parse_offer(frame, self.config.max_offer_boxes)
        reason = self._refusal(contract_id, claimed, sender, price, boxes)
        if reason is not None:
            log.info("offer from %s refused: %s", sender, reason)
            return {"accepted": [], "reason": reason}
        assert self._state is not None
        now = self.clock()
        pending = math.fsum(e.load for e in self._expected.values())
        here = PeerState(self._state.load + pending, (), self.capacity)
        view = ContractView(sender, price_range(self._contracts[contract_id])[1])
        offer = Offer(sender, price, boxes, 0.0)
        taken = accept(here, offer, view, config=self.config, busy=self._busy())
        if not taken:
            first = next((b for b in boxes if b.load > 0), None)
            if first is None:
                reason = "no box in the offer has any load"
            else:
                unit = unit_take_cost(here, first.load, self.config.cost_cap_util)
                reason = (
                    f"no room at {price:g} per core: taking {first.name} ({first.load:.3g} "
                    f"cores) would cost {unit:.3g} per core here, at utilisation "
                    f"{here.utilisation:.2f}"
                )
            log.info("offer from %s refused: %s", sender, reason)
            return {"accepted": [], "reason": reason}
        for box in taken:
            self._expected[box.name] = _Expected(sender, contract_id, box.load, now)
        names = [b.name for b in taken]
        log.info("offer from %s: taking %s under contract %s", sender, names, contract_id)
        return {
            "accepted": names,
            "reason": f"taking {len(taken)} of {len(boxes)} boxes at {price:g} per core",
        }

    def _refusal(
        self, contract_id: str, claimed: str, sender: str, price: float, boxes: Sequence[Box]
    ) -> str | None:
        """Why no box of this offer can be taken, or None."""
        if claimed != sender:
            return f"the offer says it is from {claimed}, but it came from {sender}"
        contract = self._contracts.get(contract_id)
        if contract is None:
            return f"no contract {contract_id} here"
        if contract.party(sender) is None:
            return f"contract {contract_id} is between {' and '.join(contract.names)}"
        now = self.clock()
        if not _valid_at(contract, now):
            return (
                f"contract {contract_id} is not valid now (from {format_time(contract.not_before)}"
                f" to {format_time(contract.not_after)})"
            )
        for box in boxes:
            if not _covered(contract, sender, box.kind):
                return (
                    f"contract {contract_id} does not let {sender} hand {box.kind} boxes "
                    f"({box.name}) to {self.me}"
                )
        low, high = price_range(contract)
        if not low <= price <= high:
            return f"price {price:g} is outside contract {contract_id}'s range [{low:g}, {high:g}]"
        if price < high:
            return f"this peer takes load under contract {contract_id} at {high:g}, not {price:g}"
        if self._state is None:
            return "this peer has not measured its load yet"
        if self._busy():
            return "an offer or a move is under way here"
        return None

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
        """What the peer gossips about its load: ``util`` and ``load`` (cores) of the last
        measurement; nothing before the first."""
        state = self._state
        if state is None:
            return {}
        return {"util": round(state.utilisation, 4), "load": round(state.load, 4)}

    def status(self) -> dict[str, Any]:
        state = self._state
        now = self.clock()
        contracts = []
        for c in self.book.contracts:
            other = c.other(self.me)
            assert other is not None
            low, high = price_range(c)
            contracts.append(
                {
                    "id": c.id,
                    "partner": other.name,
                    "price": high,
                    "min_price": low,
                    "kinds": list(other.accepts),
                    "valid": _valid_at(c, now),
                    "not_after": format_time(c.not_after),
                }
            )
        ledger = with_durations(self.ledger.entries(), now)[-LEDGER_SHOWN:]
        measured = (  # not there before the first measurement
            {}
            if state is None
            else {"utilisation": round(state.utilisation, 4), "load": round(state.load, 4)}
        )
        return {
            **measured,
            "capacity": self.capacity,
            "boxes": [
                {"name": b.name, "kind": b.kind, "load": round(b.load, 4)}
                for b in (state.boxes if state is not None else ())
            ],
            "contracts": contracts,
            "refused_contracts": [
                {"file": r.path.name, "reason": r.reason, "message": r.error.message}
                for r in self.book.refused
            ],
            "refused_partners": list(self._refused),
            "offer_in_flight": self._offer_to,
            "moving": self._moving,
            "expected": [  # taken here, until a measurement counts them
                {
                    "fragment": name,
                    "from": e.sender,
                    "contract": e.contract,
                    "load": round(e.load, 4),
                    "arrived": e.arrived_at is not None,
                }
                for name, e in sorted(self._expected.items())
            ],
            "ledger": ledger,
        }


# -- offers on the wire --------------------------------------------------------------------------


def _pause_s(result: object) -> float | None:
    """How long a moved fragment did not run, from peer.move_fragment's reply."""
    pause = result.get("pause_s") if isinstance(result, dict) else None
    if isinstance(pause, int | float) and not isinstance(pause, bool) and math.isfinite(pause):
        return float(pause)
    return None


def _shown(value: object) -> str:
    """A value from a hostile frame, fit for a message: escaped by repr, and bounded."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _names(boxes: Sequence[Box]) -> str:
    return ", ".join(b.name for b in boxes)


def _accepted(reply: object, offer: Offer) -> list[Box]:
    """The offered boxes a reply accepts, in the offer's order; anything else is ignored."""
    if not isinstance(reply, dict) or not isinstance(reply.get("accepted"), list):
        log.warning("offer to %s: malformed reply %r", offer.partner, reply)
        return []
    names = {n for n in reply["accepted"] if isinstance(n, str)}
    return [b for b in offer.boxes if b.name in names]


def _parse_offer(
    frame: Mapping[str, Any], max_boxes: int
) -> tuple[str, str, float, tuple[Box, ...]]:
    """(contract id, sender participant, price, boxes) of an offer frame, or InvalidInput."""
    if not isinstance(frame, Mapping):
        raise InvalidInput("offer: the frame must be a map")
    contract_id = _text(frame.get("contract"), "offer: contract", 128)
    claimed = _text(frame.get("from"), "offer: from", 128)
    where = f"offer from {claimed} under contract {contract_id}"
    price = _amount(frame.get("price"), f"{where}: price")
    if price <= 0:
        raise InvalidInput(f"{where}: price must be > 0, not {price:g}")
    _amount(frame.get("unit_cost"), f"{where}: unit_cost")
    raw = frame.get("boxes")
    if not isinstance(raw, list | tuple) or not raw:
        raise InvalidInput(f"{where}: boxes must be a non-empty list of [name, kind, load]")
    if len(raw) > max_boxes:
        raise InvalidInput(f"{where}: {len(raw)} boxes offered; at most {max_boxes} per offer")
    boxes: list[Box] = []
    for i, item in enumerate(raw, 1):
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise InvalidInput(f"{where}: box {i} must be [name, kind, load]")
        name = _text(item[0], f"{where}: box {i}: name", MAX_NAME_CHARS)
        if any(b.name == name for b in boxes):
            raise InvalidInput(f"{where}: box {name} is offered twice")
        kind = item[1]
        types = kind.split("+") if isinstance(kind, str) else []
        if not types or any(t not in BOX_TYPES for t in types) or kind != kind_of(types):
            raise InvalidInput(
                f"{where}: box {name}: kind must be box types ({', '.join(BOX_TYPES)}) sorted "
                f"and joined by '+', not {_shown(kind)}"
            )
        boxes.append(Box(name, kind, _amount(item[2], f"{where}: box {name}: load")))
    return contract_id, claimed, price, tuple(boxes)


def _text(value: object, what: str, most: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= most:
        raise InvalidInput(f"{what} must be a string of 1-{most} characters, not {_shown(value)}")
    return value


def _amount(value: object, what: str) -> float:
    """A finite number >= 0 from a frame."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidInput(f"{what} must be a number, not {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range
        number = math.inf
    if not (math.isfinite(number) and number >= 0):
        raise InvalidInput(f"{what} must be a finite number >= 0, not {_shown(value)}")
    return number
