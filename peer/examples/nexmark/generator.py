"""The NEXMark event generator: persons, auctions and bids, deterministic for a seed.

It follows the generator of the NEXMark suites (Apache Beam's and Flink's ``GeneratorConfig``,
``PersonGenerator``, ``AuctionGenerator``, ``BidGenerator``), rule for rule; it draws its random
numbers with numpy, so the same rules give other values than the Java generator's
``java.util.Random`` would.

Theory of operation
-------------------
Events are numbered ``n = 0, 1, 2, ...``. In every run of 50 numbers (the proportions
1 : 3 : 46), number 0 is a person, 1-3 are auctions and 4-49 are bids. Event ``n`` happens at
``base_time + floor(n * 1e6 / event_rate) / 1000`` milliseconds: event time advances with the
event rate, one event every ``1 / event_rate`` seconds, in whole milliseconds.

Ids follow from the numbers alone: person ``n`` is the ``n // 50``-th person
(id ``1000 + n // 50``), auction ``n`` the ``3 * (n // 50) + (n % 50 - 1)``-th auction (id from
1000). Everything else is drawn at random:

- a person's name (11 first names x 9 last names), e-mail, credit card, city (10) and state
  (AZ, CA, ID, OR, WA, WY);
- an auction's seller: with probability 3/4 a *hot* seller (the first person of the last
  hundred), else one of the last 1000 *active* people or one of the next 10 to come; its
  category (10-14), its initial bid and reserve (a price each, the reserve added to the
  initial bid), and its length: uniform in ``[1, 2h]`` ms, where ``h`` is the time the
  generator takes to make the next 100 auctions (the in-flight auctions), so that about 100
  auctions are open at any time;
- a bid's auction: with probability 1/2 a *hot* auction (the first of the last hundred
  auctions), else one of the last 100 auctions or the next 10; its bidder: with probability
  3/4 a hot bidder (the second person of the last hundred), else an active person; its price.

A price is ``round(10 ** (6u) * 100)`` for ``u`` uniform in [0, 1) (cents: $1 to $1M,
log-uniform). Strings are cut from a fixed pseudo-random text at random places, with the
lengths the Java generator gives them; ``extra`` pads each event to an average size of 200
(person), 500 (auction) and 100 (bid) bytes, as there.

Events are made in blocks of :data:`BLOCK` numbers; each block draws from its own random
generator, seeded with ``(seed, block)``. Event ``n`` is therefore the same whichever range
it is generated in, which lets a benchmark make its events piece by piece.

Not reproduced: the Java generator's out-of-order groups and delayed events (both off by
default in Flink's suite: events come in time order), several generators on parallel
timelines, rate shapes other than a constant rate, and the ``channel``/``url`` bid fields of
later NEXMark versions (no query here reads them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from peer.examples.nexmark.schemas import arrow_schemas

__all__ = [
    "BLOCK",
    "FIRST_AUCTION_ID",
    "FIRST_CATEGORY_ID",
    "FIRST_PERSON_ID",
    "GeneratorConfig",
    "chunks",
    "generate",
    "kind_of",
]

PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
PERSON_ID_LEAD = 10  # ids of people (and auctions) not made yet that may be referred to
AUCTION_ID_LEAD = 10
HOT_RATIO = 100  # a hot seller/bidder/auction is the first (second) of the last hundred
BLOCK = 5_000  # events per random-number block (a multiple of TOTAL_PROPORTION)

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
    "Seattle", "Kent", "Cheyenne",
)  # fmt: skip
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")  # fmt: skip
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")  # fmt: skip

US = pa.timestamp("us", tz="UTC")


def _text(seed: int, size: int, spaces: bool) -> str:
    rng = np.random.default_rng(seed)
    letters = rng.integers(0, 26, size) + ord("a")
    if spaces:  # one character in 13 a space, as the Java generator's nextString
        letters[rng.integers(0, 13, size) == 0] = ord(" ")
    return bytes(letters.astype(np.uint8)).decode()


_WORDS = _text(0x4E4558, 1 << 16, spaces=True)  # cut into names and descriptions
_LETTERS = _text(0x4D41524B, 1 << 16, spaces=False)  # cut into the extra padding


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generator is told (defaults: Flink's NEXMark suite, one generator)."""

    event_rate: float = 10_000.0  # events per second of event time
    seed: int = 0
    base_time_ms: int = 1_436_918_400_000  # 2015-07-15T00:00:00Z
    active_people: int = 1000
    in_flight_auctions: int = 100
    hot_auction_ratio: int = 2  # P(hot auction) = 1 - 1/2
    hot_sellers_ratio: int = 4  # P(hot seller) = 1 - 1/4
    hot_bidders_ratio: int = 4  # P(hot bidder) = 1 - 1/4
    person_bytes: int = 200
    auction_bytes: int = 500
    bid_bytes: int = 100

    def __post_init__(self) -> None:
        if not self.event_rate > 0:
            raise ValueError(f"event_rate must be positive, got {self.event_rate!r}")
        for name in ("active_people", "in_flight_auctions", "hot_auction_ratio",
                     "hot_sellers_ratio", "hot_bidders_ratio"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")

    @property
    def inter_event_us(self) -> float:
        return 1_000_000.0 / self.event_rate

    def time_ms(self, n: np.ndarray) -> np.ndarray:
        """Event time (ms since the epoch) of event numbers ``n``."""
        return self.base_time_ms + np.floor(n * self.inter_event_us / 1000).astype(np.int64)

    @property
    def auction_horizon_ms(self) -> int:
        """An upper bound of how long the generator takes to make ``in_flight_auctions``
        auctions: an auction lasts at most twice this."""
        events = self.in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
        return int(np.floor(events * self.inter_event_us / 1000)) + 1

    @property
    def max_auction_ms(self) -> int:
        """The longest an auction can last (``expires - date_time``)."""
        return 2 * self.auction_horizon_ms


def kind_of(n: np.ndarray) -> np.ndarray:
    """0 for a person, 1 for an auction, 2 for a bid, per event number."""
    offset = n % TOTAL_PROPORTION
    kinds: np.ndarray = np.where(offset < PERSON_PROPORTION, 0, np.where(offset < 4, 1, 2))
    return kinds


def _last_person(n: np.ndarray) -> np.ndarray:
    """The base-0 id of the last person made at or before event ``n``."""
    people: np.ndarray = n // TOTAL_PROPORTION  # one person per 50 events, at offset 0
    return people


def _last_auction(n: np.ndarray) -> np.ndarray:
    """The base-0 id of the last auction made at or before event ``n`` (-1 before the first)."""
    epoch, offset = n // TOTAL_PROPORTION, n % TOTAL_PROPORTION
    in_epoch = np.clip(offset - PERSON_PROPORTION, -1, AUCTION_PROPORTION - 1)
    auctions: np.ndarray = epoch * AUCTION_PROPORTION + in_epoch
    return auctions


def _below(rng: np.random.Generator, bound: np.ndarray) -> np.ndarray:
    """Uniform integers in ``[0, bound)``, elementwise (``bound >= 1``)."""
    drawn: np.ndarray = np.floor(rng.random(len(bound)) * bound).astype(np.int64)
    return drawn


def _active_person(cfg: GeneratorConfig, rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    people = _last_person(n) + 1
    active = np.minimum(people, cfg.active_people)
    chosen: np.ndarray = people - active + _below(rng, active + PERSON_ID_LEAD)
    return chosen


def _price(rng: np.random.Generator, size: int) -> np.ndarray:
    cents: np.ndarray = np.round(10.0 ** (rng.random(size) * 6.0) * 100.0).astype(np.int64)
    return cents


def _strings(rng: np.random.Generator, pool: str, lengths: np.ndarray, strip: bool) -> list[str]:
    starts = rng.integers(0, len(pool) - int(lengths.max(initial=0)) - 1, len(lengths))
    cut = [pool[s : s + ln] for s, ln in zip(starts.tolist(), lengths.tolist(), strict=True)]
    return [s.strip() for s in cut] if strip else cut


def _words(rng: np.random.Generator, size: int, longest: int) -> list[str]:
    """Strings of 3 to ``longest - 1`` characters (letters and spaces, trimmed)."""
    return _strings(rng, _WORDS, 3 + rng.integers(0, longest - 3, size), strip=True)


def _extra(rng: np.random.Generator, current: np.ndarray, average: int) -> list[str]:
    """Padding that brings events of ``current`` bytes to ``average`` bytes on average."""
    want = np.maximum(average - current, 0)
    delta = np.round(want * 0.2).astype(np.int64)
    lengths = want - delta + np.floor(rng.random(len(want)) * 2 * delta).astype(np.int64)
    return _strings(rng, _LETTERS, lengths, strip=False)


def _persons(cfg: GeneratorConfig, rng: np.random.Generator, n: np.ndarray) -> dict[str, Any]:
    size = len(n)
    first = rng.integers(0, len(FIRST_NAMES), size).tolist()
    last = rng.integers(0, len(LAST_NAMES), size).tolist()
    names = [f"{FIRST_NAMES[a]} {LAST_NAMES[b]}" for a, b in zip(first, last, strict=True)]
    user, host = _words(rng, size, 7), _words(rng, size, 5)
    emails = [f"{u}@{h}.com" for u, h in zip(user, host, strict=True)]
    digits = rng.integers(0, 10_000, (size, 4)).tolist()
    cards = [f"{a:04d} {b:04d} {c:04d} {d:04d}" for a, b, c, d in digits]
    cities = [US_CITIES[i] for i in rng.integers(0, len(US_CITIES), size).tolist()]
    states = [US_STATES[i] for i in rng.integers(0, len(US_STATES), size).tolist()]
    current = 8 + np.array(
        [len(a) + len(b) + len(c) + len(d) + len(e)
         for a, b, c, d, e in zip(names, emails, cards, cities, states, strict=True)],
        dtype=np.int64,
    )  # fmt: skip
    return {
        "id": _last_person(n) + FIRST_PERSON_ID,
        "name": names,
        "email_address": emails,
        "credit_card": cards,
        "city": cities,
        "state": states,
        "date_time": cfg.time_ms(n) * 1000,
        "extra": _extra(rng, current, cfg.person_bytes),
    }


def _auctions(cfg: GeneratorConfig, rng: np.random.Generator, n: np.ndarray) -> dict[str, Any]:
    size = len(n)
    hot = rng.integers(0, cfg.hot_sellers_ratio, size) > 0
    hot_seller = _last_person(n) // HOT_RATIO * HOT_RATIO
    seller = np.where(hot, hot_seller, _active_person(cfg, rng, n)) + FIRST_PERSON_ID
    category = FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, size)
    initial = _price(rng, size)
    reserve = initial + _price(rng, size)
    now = cfg.time_ms(n)
    ahead = cfg.in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon = cfg.time_ms(n + ahead) - now
    expires = now + 1 + _below(rng, np.maximum(horizon * 2, 1))
    item, description = _words(rng, size, 20), _words(rng, size, 100)
    current = 48 + np.array([len(a) + len(b) for a, b in zip(item, description, strict=True)])
    return {
        "id": _last_auction(n) + FIRST_AUCTION_ID,
        "item_name": item,
        "description": description,
        "initial_bid": initial,
        "reserve": reserve,
        "date_time": now * 1000,
        "expires": expires * 1000,
        "seller": seller,
        "category": category,
        "extra": _extra(rng, current, cfg.auction_bytes),
    }


def _bids(cfg: GeneratorConfig, rng: np.random.Generator, n: np.ndarray) -> dict[str, Any]:
    size = len(n)
    last = _last_auction(n)
    hot_auction = rng.integers(0, cfg.hot_auction_ratio, size) > 0
    low = np.maximum(last - cfg.in_flight_auctions, 0)
    recent = low + _below(rng, last - low + 1 + AUCTION_ID_LEAD)
    auction = np.where(hot_auction, last // HOT_RATIO * HOT_RATIO, recent) + FIRST_AUCTION_ID
    hot_bidder = rng.integers(0, cfg.hot_bidders_ratio, size) > 0
    bidder_hot = _last_person(n) // HOT_RATIO * HOT_RATIO + 1
    bidder = np.where(hot_bidder, bidder_hot, _active_person(cfg, rng, n)) + FIRST_PERSON_ID
    return {
        "auction": auction,
        "bidder": bidder,
        "price": _price(rng, size),
        "date_time": cfg.time_ms(n) * 1000,
        "extra": _extra(rng, np.full(size, 32, dtype=np.int64), cfg.bid_bytes),
    }


_MAKERS = (("person", _persons), ("auction", _auctions), ("bid", _bids))


def _block(cfg: GeneratorConfig, block: int) -> dict[str, dict[str, Any]]:
    rng = np.random.default_rng([cfg.seed & 0xFFFFFFFF, cfg.seed >> 32, block])
    n = np.arange(block * BLOCK, (block + 1) * BLOCK, dtype=np.int64)
    kinds = kind_of(n)
    return {stream: make(cfg, rng, n[kinds == k]) for k, (stream, make) in enumerate(_MAKERS)}


def generate(cfg: GeneratorConfig, first: int, count: int) -> dict[str, pa.Table]:
    """Events ``first`` to ``first + count - 1`` as one table per stream (``person``,
    ``auction``, ``bid``; each in event-time order), in the schemas of
    :mod:`peer.examples.nexmark.schemas`."""
    if first < 0 or count < 0:
        raise ValueError(f"need first >= 0 and count >= 0, got {first}, {count}")
    schemas = arrow_schemas()
    parts: dict[str, list[pa.Table]] = {stream: [] for stream, _ in _MAKERS}
    end = first + count
    for block in range(first // BLOCK, -(-end // BLOCK)):
        columns = _block(cfg, block)
        lo, hi = max(first, block * BLOCK), min(end, (block + 1) * BLOCK)
        n = np.arange(block * BLOCK, (block + 1) * BLOCK, dtype=np.int64)
        kinds = kind_of(n)
        for k, (stream, _) in enumerate(_MAKERS):
            numbers = n[kinds == k]
            keep = slice(int(np.searchsorted(numbers, lo)), int(np.searchsorted(numbers, hi)))
            table = _table(columns[stream], schemas[stream])
            parts[stream].append(table.slice(keep.start, keep.stop - keep.start))
    return {
        stream: pa.concat_tables(tables) if tables else schemas[stream].empty_table()
        for stream, tables in parts.items()
    }


def _table(columns: dict[str, Any], schema: pa.Schema) -> pa.Table:
    arrays = []
    for field in schema:
        values = columns[field.name]
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(np.asarray(values, dtype=np.int64)).view(US))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def chunks(
    cfg: GeneratorConfig, count: int, size: int, first: int = 0
) -> Iterator[tuple[int, dict[str, pa.Table]]]:
    """``(first event number, tables)`` for consecutive pieces of ``size`` events."""
    for start in range(first, first + count, size):
        yield start, generate(cfg, start, min(size, first + count - start))
