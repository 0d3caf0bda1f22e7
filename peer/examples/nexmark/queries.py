"""NEXMark's streams and queries q0-q5, q7, q8 as fedstream queries, with their reference SQL.

Every query reads the streams ``person``, ``auction`` and ``bid`` (optionally behind a
prefix) and writes one result stream ``q<N>``. :func:`stages` gives a query as the fedstream
queries to create and start in order: a stateful box that reads the output of another
windowed box runs as a query of its own (see the package docstring for why). :func:`sql` gives
the same computation in SQL over tables ``person``, ``auction`` and ``bid`` (DuckDB's dialect;
times as microseconds since the epoch), including the differences from the benchmark's
definition that windowed boxes make, so that results compare tuple for tuple.
"""

from __future__ import annotations

from typing import Any

from peer.examples.nexmark.generator import FIRST_CATEGORY_ID, GeneratorConfig

__all__ = [
    "FLUSH_KEYS",
    "OUTPUT_FIELDS",
    "QUERIES",
    "sql",
    "stages",
]

QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")

WINDOW_S = 10  # q7, q8 (tumbling) and q5 (sliding) windows, q4's average: as Flink's suite
SLIDE_S = 2  # q5's windows advance by this (Flink's suite: 2 s)
Q2_SKIP = 123  # q2 keeps the auctions whose id is a multiple of this
Q3_BOUND_S = 10  # q3 joins a person and an auction less than this apart (both ways)
Q3_STATES = ("OR", "ID", "CA")
Q4_FINAL_WINDOW_S = 1  # windows on the closing time in which q4 takes each auction's maximum
Q4_SKEW_S = 10  # how far a winning bid may come behind the newest closing time q4 has seen
EPSILON_S = "0.001"  # one millisecond: event times are whole milliseconds
US_PER_S = 1_000_000

# The field of each result that is negative exactly for rows made from flush tuples.
FLUSH_KEYS: dict[str, str] = {
    "q0": "auction", "q1": "auction", "q2": "auction", "q3": "id", "q4": "category",
    "q5": "auction", "q7": "auction", "q8": "id",
}  # fmt: skip

OUTPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "q0": ("auction", "bidder", "price", "date_time", "extra"),
    "q1": ("auction", "bidder", "price", "date_time", "extra"),
    "q2": ("auction", "price"),
    "q3": ("name", "city", "state", "id"),
    "q4": ("window_start", "window_end", "category", "avg_price", "auctions"),
    "q5": ("window_start", "window_end", "auction", "num"),
    "q7": ("auction", "price", "bidder", "date_time", "extra"),
    "q8": ("id", "name", "starttime"),
}


# -- boxes --------------------------------------------------------------------------------------


def _box(name: str, kind: str, inputs: list[str], output: str, **params: str) -> dict[str, Any]:
    return {"name": name, "type": kind, "inputs": inputs, "outputs": [output],
            "params": {k.replace("_", "-"): v for k, v in params.items()}}  # fmt: skip


def _indexed(base: str, values: list[str]) -> dict[str, str]:
    return {f"{base}.{i}": v for i, v in enumerate(values)}


def _map(name: str, inp: str, out: str, fields: list[tuple[str, str]]) -> dict[str, Any]:
    box = _box(name, "map", [inp], out)
    box["params"] = {**_indexed("expression", [e for e, _ in fields]),
                     **_indexed("output-field-name", [n for _, n in fields])}  # fmt: skip
    return box


def _filter(name: str, inp: str, out: str, expression: str) -> dict[str, Any]:
    return _box(name, "filter", [inp], out, **{"expression.0": expression})


def _aggregate(
    name: str,
    inp: str,
    out: str,
    calls: list[tuple[str, str]],
    *,
    order: str,
    size: float,
    advance: float | None = None,
    group_by: str = "",
    slack: float = 0,
) -> dict[str, Any]:
    box = _box(name, "aggregate", [inp], out)
    params = {**_indexed("aggregate-function", [c for c, _ in calls]),
              **_indexed("aggregate-function-output-name", [n for _, n in calls]),
              "window-size-by": "VALUES", "window-size": f"{size:g}",
              "advance": f"{size if advance is None else advance:g}",
              "order-on-field": order, "slack": f"{slack:g}"}  # fmt: skip
    if group_by:
        params["group-by"] = group_by
    box["params"] = params
    return box


def _join(
    name: str,
    left: str,
    right: str,
    out: str,
    predicate: str,
    *,
    orders: tuple[str, str],
    buffers: tuple[str, str],
    fields: list[tuple[str, str]],
) -> dict[str, Any]:
    box = _box(name, "join", [left, right], out)
    box["params"] = {
        "predicate": predicate,
        "left-order-by": "VALUES", "left-order-on-field": orders[0],
        "right-order-by": "VALUES", "right-order-on-field": orders[1],
        "left-buffer-size": buffers[0], "right-buffer-size": buffers[1],
        **_indexed("out-field", [src for src, _ in fields]),
        **_indexed("out-field-name", [n for _, n in fields]),
    }  # fmt: skip
    return box


_BID_OUT = [("auction", "auction"), ("bidder", "bidder"), ("price", "price"),
            ("date_time", "date_time"), ("extra", "extra")]  # fmt: skip


def _max_auction_s(cfg: GeneratorConfig) -> float:
    return cfg.max_auction_ms / 1000


def _stage_boxes(q: str, s: dict[str, str], cfg: GeneratorConfig) -> list[list[dict[str, Any]]]:
    """The boxes of query ``q``, per stage; ``s`` names every stream."""
    if q == "q0":
        return [[_map("pass", s["bid"], s["q0"], _BID_OUT)]]
    if q == "q1":
        fields = [(e, n) for e, n in _BID_OUT if n != "price"]
        fields.insert(2, ("0.908 * price", "price"))  # dollars to euros
        return [[_map("euro", s["bid"], s["q1"], fields)]]
    if q == "q2":
        return [[_filter("pick", s["bid"], s["q2_kept"], f"auction % {Q2_SKIP} = 0"),
                 _map("cut", s["q2_kept"], s["q2"], [("auction", "auction"),
                                                     ("price", "price")])]]  # fmt: skip
    if q == "q3":
        states = ", ".join(f"'{x}'" for x in Q3_STATES)
        return [[
            _filter("local", s["person"], s["q3_people"], f"state IN ({states})"),
            _filter("in_category", s["auction"], s["q3_auctions"],
                    f"category = {FIRST_CATEGORY_ID}"),
            _join("sellers", s["q3_people"], s["q3_auctions"], s["q3"],
                  "left.id = right.seller", orders=("date_time", "date_time"),
                  buffers=(str(Q3_BOUND_S), str(Q3_BOUND_S)),
                  fields=[("left.name", "name"), ("left.city", "city"),
                          ("left.state", "state"), ("right.id", "id")]),
        ]]  # fmt: skip
    if q == "q4":
        longest = _max_auction_s(cfg)
        return [
            [_join("in_lifetime", s["auction"], s["bid"], s["q4_won"],
                   "left.id = right.auction AND right.date_time >= left.date_time "
                   "AND right.date_time <= left.expires",
                   orders=("date_time", "date_time"),
                   buffers=(f"{longest + 0.001:g}", EPSILON_S),
                   fields=[("left.id", "id"), ("left.category", "category"),
                           ("left.expires", "expires"), ("right.price", "price")])],
            [_aggregate("closing", s["q4_won"], s["q4_final"], [("max(price)", "final")],
                        order="expires", size=Q4_FINAL_WINDOW_S,
                        group_by="id, category, expires", slack=longest + Q4_SKEW_S)],
            [_aggregate("average", s["q4_final"], s["q4"],
                        [("avg(final)", "avg_price"), ("count()", "auctions")],
                        order="expires", size=WINDOW_S, group_by="category",
                        slack=Q4_FINAL_WINDOW_S)],
        ]  # fmt: skip
    if q == "q5":
        return [
            [_aggregate("per_auction", s["bid"], s["q5_counts"], [("count()", "num")],
                        order="date_time", size=WINDOW_S, advance=SLIDE_S,
                        group_by="auction")],
            [_aggregate("most", s["q5_counts"], s["q5_max"], [("max(num)", "maxn")],
                        order="window_start", size=SLIDE_S, slack=SLIDE_S)],
            [_join("hottest", s["q5_counts"], s["q5_max"], s["q5"],
                   # = rather than NEXMark's >= (the same rows, as maxn is the maximum):
                   # an equi-join on (window, count) keeps few tuples per key in Spark's
                   # join state, where a key of a whole window's counts stalled it
                   "left.window_start = right.window_start AND left.num = right.maxn",
                   orders=("window_start", "window_start"), buffers=(EPSILON_S, EPSILON_S),
                   fields=[("left.window_start", "window_start"),
                           ("left.window_end", "window_end"),
                           ("left.auction", "auction"), ("left.num", "num")])],
        ]  # fmt: skip
    if q == "q7":
        return [[
            _aggregate("highest", s["bid"], s["q7_max"], [("max(price)", "maxprice")],
                       order="date_time", size=WINDOW_S),
            _join("bid_of", s["q7_max"], s["bid"], s["q7"],
                  "left.maxprice = right.price AND right.date_time >= left.window_start "
                  "AND right.date_time < left.window_end",
                  orders=("window_end", "date_time"),
                  buffers=(EPSILON_S, f"{WINDOW_S + 0.001:g}"),
                  fields=[("right.auction", "auction"), ("right.price", "price"),
                          ("right.bidder", "bidder"), ("right.date_time", "date_time"),
                          ("right.extra", "extra")]),
        ]]  # fmt: skip
    if q == "q8":
        return [[
            _aggregate("new_people", s["person"], s["q8_people"], [("count()", "n")],
                       order="date_time", size=WINDOW_S, group_by="id, name"),
            _aggregate("new_sellers", s["auction"], s["q8_sellers"], [("count()", "n")],
                       order="date_time", size=WINDOW_S, group_by="seller"),
            _join("new_users", s["q8_people"], s["q8_sellers"], s["q8"],
                  "left.id = right.seller AND left.window_start = right.window_start",
                  orders=("window_start", "window_start"), buffers=(EPSILON_S, EPSILON_S),
                  fields=[("left.id", "id"), ("left.name", "name"),
                          ("left.window_start", "starttime")]),
        ]]  # fmt: skip
    raise ValueError(f"unknown NEXMark query {q!r} (queries: {', '.join(QUERIES)})")


class _Streams(dict[str, str]):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def __missing__(self, key: str) -> str:
        return f"{self.prefix}{key}"


def stages(q: str, *, prefix: str = "", cfg: GeneratorConfig | None = None) -> list[dict[str, Any]]:
    """Query ``q`` as the fedstream queries (JSON form) to create and start in this order,
    named ``<prefix>nexmark_<q>`` (with ``_1``, ``_2``, ... for later stages), over the streams
    ``<prefix>person``, ``<prefix>auction``, ``<prefix>bid``, writing ``<prefix><q>``.
    ``cfg`` (the generator's configuration) sets q4's bound on auction lengths."""
    boxes = _stage_boxes(q, _Streams(prefix), cfg or GeneratorConfig())
    base = f"{prefix.replace(':', '_')}nexmark_{q}"
    return [{"name": base if i == 0 else f"{base}_{i}", "boxes": stage}
            for i, stage in enumerate(boxes)]  # fmt: skip


# -- the reference SQL (DuckDB) -------------------------------------------------------------------


def sql(q: str, cfg: GeneratorConfig | None = None) -> str:
    """Query ``q`` in SQL over tables ``person``, ``auction``, ``bid`` (DuckDB), with the same
    semantics as :func:`stages`; times come out as microseconds since the epoch."""
    cfg = cfg or GeneratorConfig()
    w, slide = WINDOW_S * US_PER_S, SLIDE_S * US_PER_S
    t = "epoch_us(date_time)"
    if q == "q0":
        return f"SELECT auction, bidder, price, {t} AS date_time, extra FROM bid"
    if q == "q1":
        return (f"SELECT auction, bidder, 0.908::DOUBLE * price AS price, {t} AS date_time, "
                "extra FROM bid")  # fmt: skip
    if q == "q2":
        return f"SELECT auction, price FROM bid WHERE auction % {Q2_SKIP} = 0"
    if q == "q3":
        bound = Q3_BOUND_S * US_PER_S
        states = ", ".join(f"'{x}'" for x in Q3_STATES)
        return f"""
            SELECT p.name, p.city, p.state, a.id
            FROM auction a JOIN person p ON a.seller = p.id
            WHERE a.category = {FIRST_CATEGORY_ID} AND p.state IN ({states})
              AND epoch_us(p.date_time) - epoch_us(a.date_time) < {bound}
              AND epoch_us(a.date_time) - epoch_us(p.date_time) < {bound}"""
    if q == "q4":
        return f"""
            WITH won AS (
                SELECT a.id, a.category, epoch_us(a.expires) AS expires, b.price
                FROM auction a JOIN bid b ON a.id = b.auction
                WHERE b.date_time >= a.date_time AND b.date_time <= a.expires),
            final AS (
                SELECT id, category, expires, max(price) AS final
                FROM won GROUP BY id, category, expires)
            SELECT expires // {w} * {w} AS window_start, expires // {w} * {w} + {w} AS window_end,
                   category, avg(final) AS avg_price, count(*) AS auctions
            FROM final GROUP BY 1, 2, 3"""
    if q == "q5":
        hops = WINDOW_S // SLIDE_S
        return f"""
            WITH counts AS (
                SELECT {t} // {slide} * {slide} - k * {slide} AS ws, auction, count(*) AS num
                FROM bid, range({hops}) AS r(k) GROUP BY 1, 2),
            most AS (SELECT ws, max(num) AS maxn FROM counts GROUP BY ws)
            SELECT c.ws AS window_start, c.ws + {w} AS window_end, c.auction, c.num
            FROM counts c JOIN most m ON c.ws = m.ws AND c.num >= m.maxn"""
    if q == "q7":
        return f"""
            WITH highest AS (SELECT {t} // {w} * {w} AS ws, max(price) AS maxprice
                             FROM bid GROUP BY 1)
            SELECT b.auction, b.price, b.bidder, epoch_us(b.date_time) AS date_time, b.extra
            FROM bid b JOIN highest h ON b.price = h.maxprice
             AND epoch_us(b.date_time) >= h.ws AND epoch_us(b.date_time) < h.ws + {w}"""
    if q == "q8":
        return f"""
            WITH p AS (SELECT DISTINCT id, name, {t} // {w} * {w} AS ws FROM person),
                 a AS (SELECT DISTINCT seller, {t} // {w} * {w} AS ws FROM auction)
            SELECT p.id, p.name, p.ws AS starttime FROM p JOIN a ON p.id = a.seller
             AND p.ws = a.ws"""
    raise ValueError(f"unknown NEXMark query {q!r} (queries: {', '.join(QUERIES)})")
