"""A running fragment moves, with its Spark state, to a partner's peer (issue 5).

Two peers of two participants that trust each other only through a signed contract (no
--trust directory) share this test process's Spark session. A filter + windowed aggregate runs
on peer A; mid-stream it moves to peer B (checkpoint, uncommitted input, result spool). Pushes
go on through both peers, a subscription opened on A before the move goes on across it, and
both end equal to plain Python: no window lost, none twice.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from contracts.keys import generate
from peer.client import Client
from peer.errors import FedstreamError
from peer.node import PeerConfig
from peer.protocol.replies import CreateQueryReply, LookupReply
from peer.testing import (
    PeerThread,
    collect,
    keyed_window_query,
    keyed_window_sums,
    members_alive,
    signed_contracts,
    stream_name_on,
)

if TYPE_CHECKING:
    from overlay.node import Overlay
    from peer.engine.runner import Engine
    from peer.federation import Federation
    from peer.site import LocalSite

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = {
    "name": "mtick",
    "fields": [
        {"name": "k", "type": "int"},
        {"name": "v", "type": "long"},
        {"name": "t", "type": "long"},
    ],
}


# A running peer's parts (None only before it starts or after it stops).
def overlay_of(p: PeerThread) -> Overlay:
    assert p.peer.overlay is not None
    return p.peer.overlay


def site_of(p: PeerThread) -> LocalSite:
    assert p.peer.site is not None
    return p.peer.site


def fed_of(p: PeerThread) -> Federation:
    assert p.peer.fed is not None
    return p.peer.fed


def engine_of(p: PeerThread) -> Engine:
    assert p.peer.engine is not None
    return p.peer.engine


def query(source: str) -> dict[str, Any]:
    return keyed_window_query("mover", source, "moved_out", site="alpha", kept="kept")


BATCHES = 45


def make_batches(seed: int = 5) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    batches, t = [], 0
    for _ in range(BATCHES):
        ts = []
        for _ in range(30):
            t += rng.randrange(0, 2)
            ts.append(t)
        batches.append(
            {
                "k": [rng.randrange(3) for _ in ts],
                "v": [rng.randrange(-10, 50) for _ in ts],
                "t": ts,
            }
        )
    batches.append({"k": [0], "v": [0], "t": [batches[-1]["t"][-1] + 100]})
    return batches


def reference(batches: list[dict[str, list[int]]]) -> Counter[tuple[int, ...]]:
    return keyed_window_sums(batches)


def write_contract(tmp_path: Path) -> tuple[dict[str, Path], str, Path]:
    keys, ids = signed_contracts(tmp_path, [("alpha", "beta", 2.0)])
    return keys, ids[("alpha", "beta")], tmp_path / "contracts"


@pytest.fixture
def pair(
    tmp_path: Path, spark: Any, request: pytest.FixtureRequest
) -> Iterator[tuple[PeerThread, PeerThread, str]]:
    """Two partners; with the parameter "shared", their checkpoints in one shared directory
    (``--checkpoint-dir``: a directory of its own each, beneath it), as on a cluster; with
    "lane", every windowed aggregate in the shared lane."""
    from peer.engine.checkpoint_home import resolve

    mode = getattr(request, "param", "data-dir")
    shared, lane = mode == "shared", mode == "lane"
    keys, contract_id, contracts = write_contract(tmp_path)
    fast = {"gossip_interval_s": 0.3, "suspect_after_s": 3.0, "dead_after_s": 8.0}
    started: list[PeerThread] = []
    try:
        for name in ("alpha", "beta"):
            bootstrap = []
            if started:
                a = started[0].peer
                assert a.overlay is not None
                bootstrap = [("127.0.0.1", a.overlay.port)]
            home = resolve(tmp_path / name, str(tmp_path / "nfs")) if shared else None
            config = PeerConfig(
                data_dir=tmp_path / name,
                checkpoint_root=home.root if home is not None else None,
                port=0,
                participant=name,
                key_path=keys[name],
                contracts_dir=contracts,
                bootstrap=bootstrap,
                brain=False,
                # Each windowed aggregate in its own streaming query (the lane's members are
                # moved by the "lane" tests), or every one of them in the lane.
                fuse_stateless=lane,
                lane_after=0,
                **fast,  # type: ignore[arg-type]
            )
            started.append(PeerThread(config, spark).__enter__())
        yield started[0], started[1], contract_id
    finally:
        for p in reversed(started):
            p.close()


async def push(port: int, stream: str, batches: list[dict[str, list[int]]], first: int) -> None:
    async with Client("127.0.0.1", port, timeout_s=60) as c:
        for i, columns in enumerate(batches, first):
            for _ in range(60):
                try:
                    await c.push(stream, {"columns": columns}, producer="mover-test", seq=i)
                    break
                except FedstreamError:
                    await asyncio.sleep(0.5)
            else:
                raise AssertionError(f"batch {i} never acknowledged")
            await asyncio.sleep(0.02)


def on_peer(peer: PeerThread, coro: Any, timeout_s: float = 180) -> asyncio.Future[Any]:
    """Run ``coro`` on ``peer``'s own loop, awaitable from the test's loop."""
    return asyncio.get_running_loop().run_in_executor(None, lambda: peer.call(coro, timeout_s))


async def set_up(
    port: int, members: int, source: str, *queries: dict[str, Any]
) -> list[CreateQueryReply]:
    """Once ``members`` peers are in the overlay: the schema, ``source`` and the queries,
    started; the replies of ``create_query``."""
    made = []
    async with Client("127.0.0.1", port, timeout_s=120) as cl:
        await members_alive(cl, members, timeout_s=60)
        await cl.create_schema(SCHEMA)
        await cl.create_stream(source, "mtick")
        for q in queries:
            made.append(await cl.create_query(q))
            await cl.start_query(q["name"])
    return made


@pytest.mark.parametrize("pair", ["data-dir", "shared"], indirect=True)
def test_a_fragment_moves_with_its_state_and_the_output_stays_exact(
    pair: tuple[PeerThread, PeerThread, str],
) -> None:
    a, b, contract_id = pair
    assert a.peer.overlay is not None and b.peer.overlay is not None
    a_id, b_id = a.peer.overlay.node_id, b.peer.overlay.node_id
    # the partners trust each other through the contract alone
    assert b.peer.identity is not None
    assert a.peer.trust is not None and a.peer.trust.is_trusted(b.peer.identity.participant_pub)

    source = stream_name_on(a_id, (a_id, b_id), "mticks")
    batches = make_batches()
    want = reference(batches)
    third = BATCHES // 3

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        await set_up(a.port, 2, source, query(source))
        # a subscriber on A from the start: it must go on across the move
        early = Client("127.0.0.1", a.port, timeout_s=120)
        await early.__aenter__()
        watcher = asyncio.create_task(
            collect(early, "moved_out", sum(want.values()), timeout_s=400, settle_s=3)
        )
        await push(a.port, source, batches[:third], 0)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            first = await collect(cl, "moved_out", 1, timeout_s=120)
            assert first, "no result before the move"
        await push(a.port, source, batches[third : 2 * third], third)
        moved = await on_peer(a, a.peer.move_fragment("mover", b_id, contract=contract_id))
        await push(b.port, source, batches[2 * third :], 2 * third)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            rows = await collect(cl, "moved_out", sum(want.values()), timeout_s=300, settle_s=3)
        try:
            seen = await watcher
        finally:
            await early.__aexit__(None, None, None)
        return moved, rows, seen

    started = time.monotonic()
    moved, rows, seen = asyncio.run(scenario())
    print("move:", moved, "test took", round(time.monotonic() - started, 1), "s")
    assert moved["to"] == b_id.hex() and moved["pause_s"] > 0
    # the result spool (and any backlog) went ahead while the fragment ran: the pre-copy
    assert moved["precopy_bytes"] > 0 and moved["precopy_s"] > 0
    # A let go of it, B runs it with the state it had
    assert site_of(a).catalog.find_query("mover") is None
    assert site_of(a).catalog.moved() == {"mover": b_id.hex()}
    assert site_of(b).catalog.query("mover").status == "RUNNING"
    assert "moved_out" in fed_of(b).hosting.hosted and "moved_out" not in fed_of(a).hosting.hosted

    def as_counter(got: list[dict[str, Any]]) -> Counter[tuple[int, ...]]:
        return Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in got)

    assert as_counter(rows) == want
    assert as_counter(seen) == want
    engine_a, engine_b = site_of(a).engine, site_of(b).engine
    assert engine_a is not None and engine_b is not None
    assert engine_a.checkpoint_root != engine_b.checkpoint_root
    assert any(engine_b.checkpoint_root.iterdir())  # B runs it from its own directory


@pytest.mark.parametrize("pair", ["lane"], indirect=True)
def test_a_lane_member_moves_with_its_windows_and_both_outputs_stay_exact(
    pair: tuple[PeerThread, PeerThread, str],
) -> None:
    """Two windowed aggregates share A's lane over one stream (issue 28: lane members move).
    One moves to B mid-stream: A's lane holds at a batch boundary without stopping Spark, the
    member's windows and position travel, and B's lane starts the stream there. The other
    member cannot follow (B's lane reads the stream now, at its own position): refused before
    anything stops, it goes on in A's lane. Both outputs equal plain Python."""
    a, b, contract_id = pair
    a_id, b_id = overlay_of(a).node_id, overlay_of(b).node_id
    source = stream_name_on(a_id, (a_id, b_id), "laneticks")
    batches = make_batches(seed=31)
    want = reference(batches)
    third = BATCHES // 3
    stayer = keyed_window_query("stayer", source, "stayed_out", site="alpha", kept="kept2")

    async def scenario() -> tuple[dict[str, Any], str, list[dict[str, Any]], list[Any]]:
        await set_up(a.port, 2, source, query(source), stayer)
        assert sorted(engine_of(a).lane.member_names()) == ["mover", "stayer"]
        await push(a.port, source, batches[:third], 0)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            assert await collect(cl, "moved_out", 1, timeout_s=120), "no result before the move"
        await push(a.port, source, batches[third : 2 * third], third)
        moved = await on_peer(a, a.peer.move_fragment("mover", b_id, contract=contract_id))
        try:
            await on_peer(a, a.peer.move_fragment("stayer", b_id, contract=contract_id))
            refused = ""
        except FedstreamError as exc:
            refused = exc.message
        await push(b.port, source, batches[2 * third :], 2 * third)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            rows = await collect(cl, "moved_out", sum(want.values()), timeout_s=300, settle_s=3)
            stayed = await collect(cl, "stayed_out", sum(want.values()), timeout_s=300, settle_s=3)
        return moved, refused, rows, stayed

    moved, refused, rows, stayed = asyncio.run(scenario())
    print("move:", moved, "refused:", refused)
    assert moved["to"] == b_id.hex() and moved["pause_s"] > 0
    assert "lane reads stream" in refused and source in refused
    # B runs the member in its own lane, under a new incarnation; A's lane keeps the other
    assert site_of(b).catalog.query("mover").placement == "lane"
    assert engine_of(b).lane.member_names() == ["mover"]
    assert engine_of(a).lane.member_names() == ["stayer"]
    assert site_of(a).catalog.find_query("mover") is None
    assert site_of(a).catalog.query("stayer").status == "RUNNING"

    def as_counter(got: list[dict[str, Any]]) -> Counter[tuple[int, ...]]:
        return Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in got)

    assert as_counter(rows) == want
    assert as_counter(stayed) == want


def test_a_fragment_moves_there_and_back_and_the_output_stays_exact(
    pair: tuple[PeerThread, PeerThread, str],
) -> None:
    """Back on the peer that hosts its input, the fragment reads the original stream again:
    the copy it read on the partner numbered its batches as the original does."""
    a, b, contract_id = pair
    a_id, b_id = overlay_of(a).node_id, overlay_of(b).node_id

    source = stream_name_on(a_id, (a_id, b_id), "rtticks")
    batches = make_batches(seed=23)
    want = reference(batches)
    quarter = BATCHES // 4

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        await set_up(a.port, 2, source, query(source))
        await push(a.port, source, batches[:quarter], 0)
        moves = []
        for first, (peer, to) in zip((quarter, 2 * quarter), ((a, b_id), (b, a_id)), strict=True):
            moves.append(
                await on_peer(peer, peer.peer.move_fragment("mover", to, contract=contract_id))
            )
            await push(a.port, source, batches[first : first + quarter], first)
        await push(b.port, source, batches[3 * quarter :], 3 * quarter)
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            rows = await collect(cl, "moved_out", sum(want.values()), timeout_s=300, settle_s=3)
        return moves, rows

    moves, rows = asyncio.run(scenario())
    print("moves:", moves)
    assert [m["to"] for m in moves] == [b_id.hex(), a_id.hex()]
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
    assert site_of(a).catalog.query("mover").status == "RUNNING"
    assert site_of(b).catalog.find_query("mover") is None
    # B's copy of the input is gone with the fragment; A no longer mirrors the input to B
    assert source not in site_of(b).spools
    assert not [m for m in fed_of(a).mirrors.describe() if m["stream"] == source]


def chain_query(source: str) -> dict[str, Any]:
    """filter on gamma -> aggregate on alpha (the one that moves) -> map on gamma."""
    q = query(source)
    q["name"] = "relay"
    q["boxes"][0]["node"] = "gamma"
    q["boxes"][1]["outputs"] = ["agg_mid"]
    q["boxes"].append(
        {
            "name": "twice",
            "type": "map",
            "node": "gamma",
            "inputs": ["agg_mid"],
            "outputs": ["relay_out"],
            "params": {
                "expression.0": "window_start",
                "output-field-name.0": "window_start",
                "expression.1": "window_end",
                "output-field-name.1": "window_end",
                "expression.2": "k",
                "output-field-name.2": "k",
                "expression.3": "s * 2",
                "output-field-name.3": "s",
                "expression.4": "n",
                "output-field-name.4": "n",
            },
        }
    )
    return q


@pytest.fixture
def trio(tmp_path: Path, spark: Any) -> Iterator[list[PeerThread]]:
    keys, contract_id, contracts = write_contract(tmp_path)
    keys["gamma"], _ = generate("gamma", tmp_path / "keys")
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "gamma.pub").write_bytes((tmp_path / "keys" / "gamma.pub").read_bytes())
    trust_all = tmp_path / "trust_all"
    trust_all.mkdir()
    for name in keys:
        (trust_all / f"{name}.pub").write_bytes((tmp_path / "keys" / f"{name}.pub").read_bytes())
    started: list[PeerThread] = []
    try:
        for name in ("alpha", "beta", "gamma"):
            bootstrap = []
            if started:
                a = started[0].peer
                assert a.overlay is not None
                bootstrap = [("127.0.0.1", a.overlay.port)]
            config = PeerConfig(
                data_dir=tmp_path / name,
                port=0,
                participant=name,
                key_path=keys[name],
                contracts_dir=contracts if name != "gamma" else None,
                trust_dir=trust if name != "gamma" else trust_all,
                bootstrap=bootstrap,
                brain=False,
                gossip_interval_s=0.3,
            )
            started.append(PeerThread(config, spark).__enter__())
        started[0].contract_id = contract_id  # type: ignore[attr-defined]
        yield started
    finally:
        for p in reversed(started):
            p.close()


def test_a_middle_fragment_moves_and_its_upstream_and_downstream_follow(
    trio: list[PeerThread],
) -> None:
    """The moving fragment reads a replica mirrored from gamma and feeds a fragment on gamma:
    gamma's mirror diverts to the new peer, and the new peer mirrors back under the old
    origin, so gamma's copy has no gap and no duplicate."""
    a, b, g = trio
    ids = [overlay_of(p).node_id for p in trio]

    source = stream_name_on(ids[2], ids, "rticks")
    batches = make_batches(seed=11)
    want = Counter((s, e, k, 2 * total, n) for (s, e, k, total, n) in reference(batches).elements())
    third = BATCHES // 3

    async def scenario() -> tuple[
        dict[str, Any], list[dict[str, Any]], LookupReply, set[tuple[str, str]]
    ]:
        [made] = await set_up(g.port, 3, source, chain_query(source))
        await push(g.port, source, batches[:third], 0)
        async with Client("127.0.0.1", g.port, timeout_s=120) as cl:
            assert await collect(cl, "relay_out", 1, timeout_s=120), "no result before the move"
        await push(g.port, source, batches[third : 2 * third], third)
        middle = next(f["name"] for f in made["fragments"] if f["site"] == ids[0].hex())
        contract_id = a.contract_id  # type: ignore[attr-defined]
        moved = await on_peer(a, a.peer.move_fragment(middle, ids[1], contract=contract_id))
        await push(a.port, source, batches[2 * third :], 2 * third)
        async with Client("127.0.0.1", g.port, timeout_s=120) as cl:
            rows = await collect(cl, "relay_out", sum(want.values()), timeout_s=300, settle_s=3)
            looked = await cl.lookup_object("relay")
            mirrors = {(m["stream"], m["to"]) for m in fed_of(g).mirrors.describe()}
            assert site_of(b).catalog.query(moved["fragment"]).status == "RUNNING"
            await cl.set_query_status("relay", "STOPPED")
            await cl.set_query_status("relay", "DELETED")
        return moved, rows, looked, mirrors

    moved, rows, looked, mirrors = asyncio.run(scenario())
    print("move:", moved)
    got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
    assert got == want
    # the lookup finds the fragment where it runs now, through its result stream's lease
    assert looked["status"] == "RUNNING", looked
    sites = {f["name"]: (f["site"], f.get("planned_site")) for f in looked["fragments"]}
    assert sites[moved["fragment"]] == (ids[1].hex(), ids[0].hex()), sites
    # gamma's mirror of the filter's output went to the fragment's new site, and nowhere else
    assert ("kept", ids[1].hex()[:16]) in mirrors, mirrors
    assert not any(to == ids[0].hex()[:16] for _s, to in mirrors), mirrors
    # deleted: the new site dropped the fragment, gamma mirrors nothing any more, and the
    # planned site forgot where the fragment went
    assert site_of(b).catalog.find_query(moved["fragment"]) is None
    assert not fed_of(g).mirrors.describe()
    assert moved["fragment"] not in site_of(a).catalog.moved()


def test_a_second_fragment_of_a_stream_waits_for_the_partners_lagging_copy(
    pair: tuple[PeerThread, PeerThread, str],
) -> None:
    """Two fragments read one stream hosted on A. The first moves to B, so A mirrors the stream
    to B; then that mirror stalls while A goes on pushing and the second fragment reads on.
    The second fragment moves to B too and resumes on B's copy: the move must wait, during its
    pause, until B's copy holds everything A's spool held at the stop (B refuses a copy that
    ends earlier: Spark re-runs the batch it had planned, and a missing file fails it)."""
    a, b, contract_id = pair
    a_id, b_id = overlay_of(a).node_id, overlay_of(b).node_id

    source = stream_name_on(a_id, (a_id, b_id), "lagticks")
    batches = make_batches(seed=31)
    want = reference(batches)
    third = BATCHES // 3
    stalled = 8  # batches pushed while the mirror to B stalls (fewer than the pre-stop catch-up)

    async def read_through_latest() -> None:
        """Until the second fragment on A has committed everything A's spool holds."""
        spool = site_of(a).spools.get(source)
        readers = [r for s, r in engine_of(a).running["second"].readers if s == source]
        async with asyncio.timeout(120):
            while min(spool.committed(r) for r in readers) < spool.latest:
                await asyncio.sleep(0.1)

    async def resume_mirror() -> None:
        fed_of(a).mirrors.resume_stream(source)

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
        second_query = keyed_window_query(
            "second", source, "second_out", site="alpha", kept="kept2"
        )
        await set_up(a.port, 2, source, query(source), second_query)
        await push(a.port, source, batches[:third], 0)
        moves = [await on_peer(a, a.peer.move_fragment("mover", b_id, contract=contract_id))]
        await on_peer(a, fed_of(a).mirrors.pause(source))
        await push(a.port, source, batches[third : third + stalled], third)
        await on_peer(a, read_through_latest())
        second = on_peer(a, a.peer.move_fragment("second", b_id, contract=contract_id))
        async with asyncio.timeout(120):  # the pause starts
            while "second" in engine_of(a).running and not second.done():
                await asyncio.sleep(0.05)
        # long enough for the rest of a move (export, ship, install: under a second here) had
        # it not waited for B's copy
        await asyncio.wait({second}, timeout=3.0)
        await on_peer(a, resume_mirror())
        moves.append(await second)
        await push(b.port, source, batches[third + stalled :], third + stalled)
        rows = {}
        async with Client("127.0.0.1", b.port, timeout_s=120) as cl:
            for out in ("moved_out", "second_out"):
                rows[out] = await collect(cl, out, sum(want.values()), timeout_s=300, settle_s=3)
        assert b.call(engine_of(b).failed(), 30) == {}
        assert {"mover", "second"} <= set(site_of(b).catalog.query_names())
        # Deleting the queries through A, where they no longer run: each goes where it runs
        # now. A's mirror of the source to B stays while one of them reads B's copy, and
        # then goes, or A's spool would keep every batch for a reader that is gone.
        readers = site_of(a).spools.get(source).readers
        async with Client("127.0.0.1", a.port, timeout_s=120) as cl:
            for name in ("mover", "second"):
                await cl.set_query_status(name, "STOPPED")
                await cl.set_query_status(name, "DELETED")
                mirrored = "mirror-" + b_id.hex() in readers()
                assert mirrored == (name == "mover"), (name, readers())
        return moves, rows

    moves, rows = asyncio.run(scenario())
    print("moves:", moves)
    assert [m["to"] for m in moves] == [b_id.hex(), b_id.hex()]
    for out, got in rows.items():
        counted = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in got)
        assert counted == want, out
    assert not set(site_of(b).catalog.query_names()) & {"mover", "second"}
    assert source not in site_of(b).spools
    assert not [m for m in fed_of(a).mirrors.describe() if m["stream"] == source]
    assert not site_of(a).catalog.moved()
