"""The registries the composition root hands to parts that need each other (issue 24): the
replicated streams' appenders (site <-> replication room), the engine's seams (engine <->
replicated fragments, tentative forks, metrics), the overlay's door to the federation and the
control plane's door for role changes.
Each behaves as a lone peer until bound, and is bound once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

from overlay.node import OverlayError
from peer.engine.seams import EngineSeams, SeamBound
from peer.federation import Federation
from peer.node.ports import FederationDoor
from peer.node.replication import RoleDoor
from peer.replication.appenders import Appenders
from peer.site import LocalSite, SiteConfig
from peer.storage.spool import SpoolSet

KV = {"name": "kv", "fields": [{"name": "k", "type": "int"}]}


def test_a_site_appends_a_registered_stream_through_its_appender_and_the_rest_itself(
    tmp_path: Path,
) -> None:
    logs = Appenders()
    taken: list[tuple[int, str | None, int | None]] = []
    limits = {"rep": 3}

    async def replicate(body: bytes, rows: int, producer: str | None, seq: int | None) -> Any:
        assert body  # the encoded spool file of the batch
        taken.append((rows, producer, seq))
        return {"stream": "rep", "count": rows, "offset": 41, "duplicate": False}

    async def go() -> None:
        site = LocalSite(SiteConfig(data_dir=tmp_path), logs=logs)
        try:
            await site.create_schema(KV)
            await site.create_stream("rep", "kv")
            await site.create_stream("plain", "kv")
            logs.register("rep", replicate, lambda: limits["rep"])
            reply = await site.push("rep", {"columns": {"k": [1, 2, 3]}}, "p", 7)
            assert (reply.count, reply.offset) == (3, 41)
            assert taken == [(3, "p", 7)]
            assert site.spools.get("rep").latest == -1  # nothing here: the replicas append it
            plain = await site.push("plain", {"columns": {"k": [5]}}, None, None)
            assert plain.count == 1 and site.spools.get("plain").latest == plain.offset
            assert site.logs.trim_limit("rep") == 3 and site.logs.trim_limit("plain") is None
            logs.remove("rep")  # no longer replicated here: the local spool again
            again = await site.push("rep", {"columns": {"k": [9]}}, None, None)
            assert taken == [(3, "p", 7)] and site.spools.get("rep").latest == again.offset
            assert "rep" not in logs and site.logs.trim_limit("rep") is None
        finally:
            await site.close()

    asyncio.run(go())


class _Sink:
    def __init__(self) -> None:
        self.batches: list[tuple[str, int]] = []
        self.emitted: list[tuple[str, int, str, int]] = []

    def on_batch(self, query: str, batch_id: int, checkpoint: Path) -> None:
        self.batches.append((query, batch_id))

    def emit(self, stream: str, table: pa.Table, origin: str, seq: int) -> None:
        self.emitted.append((stream, table.num_rows, origin, seq))


class _Forks:
    def __init__(self) -> None:
        self.wrote_at: list[tuple[str, str, int, int]] = []
        self.stopped: list[str] = []

    def wrote(self, query: str, stream: str, offset: int, rows: int) -> None:
        self.wrote_at.append((query, stream, offset, rows))

    async def stop_fork(self, query: str) -> None:
        self.stopped.append(query)


def test_unbound_seams_append_results_locally_and_bound_ones_hand_them_over(
    tmp_path: Path,
) -> None:
    spools = SpoolSet(tmp_path / "spool", fsync=False)
    schema = pa.schema([("k", pa.int64())])
    spools.create("out", schema)
    table = pa.table({"k": [1, 2]}, schema=schema)
    seams = EngineSeams()
    assert seams.on_batch("q", 0, tmp_path) is None
    seams.emit(spools, "out", table, "q", 0)
    assert spools.get("out").latest == 0  # a lone peer's: appended to the spool
    assert not seams.measures_results
    seams.wrote_tentative("q", "out", 5, 2)  # nobody forks: nothing happens
    asyncio.run(seams.stop_fork("q"))

    sink, forks, ages = _Sink(), _Forks(), []
    seams.send_results_to(sink)
    seams.fork_with(forks)
    seams.report_results_to(lambda query, age: ages.append((query, age)))
    seams.on_batch("q", 1, tmp_path)
    seams.emit(spools, "out", table, "q", 1)
    seams.wrote_tentative("q", "out", 5, 2)
    asyncio.run(seams.stop_fork("q"))
    seams.result("q", 0.25)
    assert spools.get("out").latest == 0  # the sink's to append now
    assert sink.batches == [("q", 1)] and sink.emitted == [("out", 2, "q", 1)]
    assert forks.wrote_at == [("q", "out", 5, 2)] and forks.stopped == ["q"]
    assert seams.measures_results and ages == [("q", 0.25)]


def test_a_seam_is_bound_once() -> None:
    seams = EngineSeams()
    seams.send_results_to(_Sink())
    seams.fork_with(_Forks())
    seams.report_results_to(lambda _query, _age: None)
    with pytest.raises(SeamBound, match="result sink"):
        seams.send_results_to(_Sink())
    with pytest.raises(SeamBound, match="tentative forks"):
        seams.fork_with(_Forks())
    with pytest.raises(SeamBound, match="result metrics"):
        seams.report_results_to(lambda _query, _age: None)


class _Router:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    async def handle_link(self, link: Any, frame: dict[str, Any]) -> dict[str, Any]:
        self.frames.append(frame)
        return {"ok": True}


class _Fed:
    def __init__(self) -> None:
        self.router = _Router()
        self.events: list[Any] = []

    async def on_member(self, event: Any) -> None:
        self.events.append(event)


def test_the_overlay_door_refuses_until_the_federation_opens_it_once() -> None:
    door = FederationDoor()
    with pytest.raises(OverlayError, match="starting"):
        asyncio.run(door.handle_link(cast(Any, None), {"op": "x"}))
    asyncio.run(door.on_member(cast(Any, "early")))  # dropped: nobody to tell yet
    fed = _Fed()
    door.open(cast(Federation, fed))
    assert asyncio.run(door.handle_link(cast(Any, None), {"op": "x"})) == {"ok": True}
    asyncio.run(door.on_member(cast(Any, "joined")))
    assert fed.router.frames == [{"op": "x"}] and fed.events == ["joined"]
    with pytest.raises(RuntimeError, match="open already"):
        door.open(cast(Federation, _Fed()))


def test_the_role_door_refuses_a_role_until_opened_then_tells_its_listener_in_order() -> None:
    door = RoleDoor()
    with pytest.raises(RuntimeError, match="stream s: a role change before the federation"):
        door.on_role("s", True)  # a role lost here would leave hosting wrong: never dropped
    told: list[tuple[str, bool]] = []
    door.open(lambda stream, primary: told.append((stream, primary)))
    door.on_role("s", True)
    door.on_role("t", True)
    door.on_role("s", False)
    assert told == [("s", True), ("t", True), ("s", False)]
    with pytest.raises(RuntimeError, match="open already"):
        door.open(lambda stream, primary: None)
    door.on_role("u", True)  # the first listener still hears
    assert told[-1] == ("u", True)


def test_a_status_taken_while_a_query_moves_away_leaves_it_out(tmp_path: Path) -> None:
    """The engine answers ``describe`` while the loop goes on: a fragment that moved away (or
    was deleted) meanwhile is left out of the status, which does not fail."""
    from peer.model.query import parse_query

    site = LocalSite(SiteConfig(data_dir=tmp_path))
    query = {
        "name": "gone",
        "boxes": [
            {
                "name": "f",
                "type": "filter",
                "inputs": ["kv_in"],
                "outputs": ["kv_out"],
                "params": {"expression.0": "k > 0"},
            }
        ],
    }

    class MovingEngine:  # what describe() sees: the move let go of the query meanwhile
        executors = None

        async def describe(self, names: list[str]) -> dict[str, dict[str, Any]]:
            site.catalog.remove_query("gone")
            return {n: {"active": True} for n in names}

    async def go() -> dict[str, Any]:
        await site.create_schema(KV)
        await site.create_stream("kv_in", "kv")
        site.catalog.add_query(parse_query(query), "i1")
        assert site.catalog.query_names() == ["gone"]
        site.engine = cast(Any, MovingEngine())
        return (await site.status()).to_wire()

    found = asyncio.run(go())
    assert found["queries"] == [] and [s["name"] for s in found["streams"]] == ["kv_in"]
