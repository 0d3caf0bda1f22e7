"""Offers on the wire, and the decision to take one: the brain's negotiation, without I/O.

Theory of operation
-------------------
An offer travels over a peer link as one request frame, and its answer as the reply::

    {"op": "offer", "contract": ID, "from": PARTICIPANT, "price": P, "unit_cost": C,
     "boxes": [[NAME, KIND, LOAD], ...]}
    {"accepted": [NAME, ...], "reason": TEXT}

``price`` is per core of load and ``LOAD`` is in cores; a ``KIND`` is the fragment's box types,
each once, sorted and joined by ``+`` (:func:`kind_of`). Both sides treat what comes from the
other as hostile: :func:`parse_offer` turns a malformed offer into ``InvalidInput`` (and
nothing else), and :func:`accepted_boxes` keeps from a reply only names that were offered.

:func:`answer_offer` is the taking side's decision, pure: an offer that no valid contract with
its sender allows is refused with the reason; otherwise ``bpm.accept`` takes what the last
measurement, plus the boxes already taken that have not yet shown in one, leaves room for.
:class:`peer.brain.Brain` does the bookkeeping around it (see :mod:`peer.brain`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

from contracts.bpm import (
    Box,
    BpmConfig,
    ContractView,
    Offer,
    PeerState,
    accept,
    unit_take_cost,
)
from contracts.contract import BOX_TYPES, Contract, covers, format_time, price_range
from peer.errors import InvalidInput

__all__ = [
    "Answer",
    "Expected",
    "OfferReply",
    "OfferTerms",
    "accepted_boxes",
    "answer_offer",
    "covered",
    "kind_of",
    "offer_frame",
    "parse_offer",
    "pause_s",
    "pause_steps",
    "sent_bytes",
    "valid_at",
]

log = logging.getLogger(__name__)

MAX_NAME_CHARS = 256


def kind_of(box_types: Sequence[str]) -> str:
    """A fragment's kind: its box types, each once, sorted and joined by '+'."""
    return "+".join(sorted(set(box_types)))


def covered(contract: Contract, sender: str, kind: str) -> bool:
    """Whether ``sender`` may hand a fragment of ``kind`` to the other party."""
    try:
        return all(covers(contract, sender, t) for t in kind.split("+"))
    except ValueError:  # a box type contracts do not know
        return False


def valid_at(contract: Contract, now: float) -> bool:
    """Whether ``contract`` is in force at unix time ``now``."""
    at = datetime.fromtimestamp(now, UTC)
    return contract.not_before <= at < contract.not_after


@dataclass
class Expected:
    """A box this peer accepted whose move has not yet shown in a measurement."""

    sender: str
    contract: str
    load: float
    accepted_at: float
    arrived_at: float | None = None


# -- the offering side ---------------------------------------------------------------------------


def offer_frame(offer: Offer, contract_id: str, me: str) -> dict[str, object]:
    """The request frame that carries ``offer`` from participant ``me`` under a contract."""
    return {
        "op": "offer",
        "contract": contract_id,
        "from": me,
        "price": offer.price,
        "unit_cost": offer.unit_cost,
        "boxes": [[b.name, b.kind, b.load] for b in offer.boxes],
    }


def accepted_boxes(reply: object, offer: Offer) -> list[Box]:
    """The offered boxes a reply accepts, in the offer's order; anything else is ignored."""
    if not isinstance(reply, dict) or not isinstance(reply.get("accepted"), list):
        log.warning("offer to %s: malformed reply %r", offer.partner, reply)
        return []
    names = {n for n in reply["accepted"] if isinstance(n, str)}
    return [b for b in offer.boxes if b.name in names]


def pause_s(result: object) -> float | None:
    """How long a moved fragment did not run, from the move's report."""
    pause = result.get("pause_s") if isinstance(result, Mapping) else None
    if isinstance(pause, int | float) and not isinstance(pause, bool) and math.isfinite(pause):
        return float(pause)
    return None


def pause_steps(result: object) -> dict[str, float]:
    """The pause of a move step by step, from the move's report (peer.move.sender)."""
    steps = result.get("steps") if isinstance(result, Mapping) else None
    if not isinstance(steps, Mapping):
        return {}
    return {
        k: float(v)
        for k, v in steps.items()
        if isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
    }


def sent_bytes(result: object, key: str) -> int | None:
    """What a move sent (``bytes``: during the pause, ``precopy_bytes``: before it)."""
    sent = result.get(key) if isinstance(result, Mapping) else None
    return sent if isinstance(sent, int) and not isinstance(sent, bool) and sent >= 0 else None


def names(boxes: Sequence[Box]) -> str:
    return ", ".join(b.name for b in boxes)


# -- the taking side -----------------------------------------------------------------------------


class OfferReply(TypedDict):
    """The reply to an offer, as it goes on the wire."""

    accepted: list[str]
    reason: str


@dataclass(frozen=True, slots=True)
class OfferTerms:
    """A well-formed offer: what :func:`parse_offer` makes of a frame."""

    contract: str
    sender: str  # the participant the offer says it is from
    price: float
    boxes: tuple[Box, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """What to do with an offer: the boxes to take (none: refused) and why."""

    taken: tuple[Box, ...]
    reason: str

    def reply(self) -> OfferReply:
        return {"accepted": [b.name for b in self.taken], "reason": self.reason}


def answer_offer(
    terms: OfferTerms,
    sender: str,
    *,
    me: str,
    contracts: Mapping[str, Contract],
    now: float,
    state: PeerState | None,
    pending: float,
    busy: bool,
    config: BpmConfig,
) -> Answer:
    """The answer of participant ``me`` to an offer that came from participant ``sender`` (the
    link's authenticated participant). ``state`` is the last measurement (None before the
    first), ``pending`` the load of boxes taken that it does not count yet, ``busy`` whether
    an offer or a move is under way here."""
    reason = _refusal(terms, sender, me, contracts, now, state, busy)
    if reason is not None:
        return Answer((), reason)
    assert state is not None
    here = PeerState(state.load + pending, (), state.capacity)
    view = ContractView(sender, price_range(contracts[terms.contract])[1])
    offer = Offer(sender, terms.price, terms.boxes, 0.0)
    taken = accept(here, offer, view, config=config, busy=busy)
    if taken:
        return Answer(
            taken,
            f"taking {len(taken)} of {len(terms.boxes)} boxes at {terms.price:g} per core",
        )
    first = next((b for b in terms.boxes if b.load > 0), None)
    if first is None:
        return Answer((), "no box in the offer has any load")
    unit = unit_take_cost(here, first.load, config.cost_cap_util)
    return Answer(
        (),
        f"no room at {terms.price:g} per core: taking {first.name} ({first.load:.3g} "
        f"cores) would cost {unit:.3g} per core here, at utilisation "
        f"{here.utilisation:.2f}",
    )


def _refusal(
    terms: OfferTerms,
    sender: str,
    me: str,
    contracts: Mapping[str, Contract],
    now: float,
    state: PeerState | None,
    busy: bool,
) -> str | None:
    """Why no box of this offer can be taken, or None."""
    contract_id, price = terms.contract, terms.price
    if terms.sender != sender:
        return f"the offer says it is from {terms.sender}, but it came from {sender}"
    contract = contracts.get(contract_id)
    if contract is None:
        return f"no contract {contract_id} here"
    if contract.party(sender) is None:
        return f"contract {contract_id} is between {' and '.join(contract.names)}"
    if not valid_at(contract, now):
        return (
            f"contract {contract_id} is not valid now (from {format_time(contract.not_before)}"
            f" to {format_time(contract.not_after)})"
        )
    for box in terms.boxes:
        if not covered(contract, sender, box.kind):
            return (
                f"contract {contract_id} does not let {sender} hand {box.kind} boxes "
                f"({box.name}) to {me}"
            )
    low, high = price_range(contract)
    if not low <= price <= high:
        return f"price {price:g} is outside contract {contract_id}'s range [{low:g}, {high:g}]"
    if price < high:
        return f"this peer takes load under contract {contract_id} at {high:g}, not {price:g}"
    if state is None:
        return "this peer has not measured its load yet"
    if busy:
        return "an offer or a move is under way here"
    return None


def parse_offer(frame: object, max_boxes: int) -> OfferTerms:
    """The terms of an offer frame, or InvalidInput saying what is wrong with it."""
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
    return OfferTerms(contract_id, claimed, price, tuple(boxes))


def _shown(value: object) -> str:
    """A value from a hostile frame, fit for a message: escaped by repr, and bounded."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
