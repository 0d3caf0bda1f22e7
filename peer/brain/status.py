"""What others see of the brain: the load figures it gossips and its part of ``peer status``.

Both are built from the brain's state without changing it. The status goes over the wire as
it is (JSON), and ``peer status`` and the spike view read it: its keys and their order are
part of the interface.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

from contracts.book import ContractBook
from contracts.bpm import PeerState
from contracts.contract import format_time, price_range
from peer.brain.offers import Expected, valid_at
from peer.storage.ledger import LedgerEntry, with_durations

__all__ = ["LEDGER_SHOWN", "BrainStatus", "brain_status", "load_figures"]

LEDGER_SHOWN = 50  # the newest ledger entries in the status


class ContractStatus(TypedDict):
    id: str
    partner: str
    price: float  # the top of the range: the price this peer offers and takes at
    min_price: float
    kinds: list[str]  # what the partner takes from this peer
    valid: bool
    not_after: str


class BoxStatus(TypedDict):
    name: str
    kind: str
    load: float


class RefusedContract(TypedDict):
    file: str
    reason: str
    message: str


# A functional TypedDict: "from" is a keyword.
ExpectedStatus = TypedDict(
    "ExpectedStatus",
    {"fragment": str, "from": str, "contract": str, "load": float, "arrived": bool},
)


class BrainStatus(TypedDict):
    """The brain's part of ``peer status``."""

    utilisation: NotRequired[float]  # utilisation and load: not there before a measurement
    load: NotRequired[float]
    capacity: float
    boxes: list[BoxStatus]
    contracts: list[ContractStatus]
    refused_contracts: list[RefusedContract]
    refused_partners: list[str]
    offer_in_flight: str | None
    moving: str | None
    expected: list[ExpectedStatus]  # taken here, until a measurement counts them
    ledger: list[LedgerEntry]


def load_figures(state: PeerState | None) -> dict[str, float]:
    """What the peer gossips about its load: ``util``, ``load`` (cores) and ``cap`` (its
    capacity, cores) of the last measurement; nothing before the first."""
    if state is None:
        return {}
    return {
        "util": round(state.utilisation, 4),
        "load": round(state.load, 4),
        "cap": round(state.capacity, 4),
    }


def brain_status(
    *,
    state: PeerState | None,
    capacity: float,
    book: ContractBook,
    now: float,
    ledger: Sequence[LedgerEntry],
    refused_partners: Sequence[str],
    offer_in_flight: str | None,
    moving: str | None,
    expected: Mapping[str, Expected],
) -> BrainStatus:
    """The status of a brain whose last measurement is ``state`` (None before the first)."""
    contracts: list[ContractStatus] = []
    for c in book.contracts:
        other = c.other(book.me)
        assert other is not None
        low, high = price_range(c)
        contracts.append(
            {
                "id": c.id,
                "partner": other.name,
                "price": high,
                "min_price": low,
                "kinds": list(other.accepts),
                "valid": valid_at(c, now),
                "not_after": format_time(c.not_after),
            }
        )
    status: BrainStatus = {
        "capacity": capacity,
        "boxes": [
            {"name": b.name, "kind": b.kind, "load": round(b.load, 4)}
            for b in (state.boxes if state is not None else ())
        ],
        "contracts": contracts,
        "refused_contracts": [
            {"file": r.path.name, "reason": r.reason, "message": r.error.message}
            for r in book.refused
        ],
        "refused_partners": list(refused_partners),
        "offer_in_flight": offer_in_flight,
        "moving": moving,
        "expected": [
            {
                "fragment": name,
                "from": e.sender,
                "contract": e.contract,
                "load": round(e.load, 4),
                "arrived": e.arrived_at is not None,
            }
            for name, e in sorted(expected.items())
        ],
        "ledger": with_durations(ledger, now)[-LEDGER_SHOWN:],
    }
    if state is None:
        return status
    # The measured figures come first, as they always have in the status.
    measured: BrainStatus = {
        "utilisation": round(state.utilisation, 4),
        "load": round(state.load, 4),
        **status,
    }
    return measured
