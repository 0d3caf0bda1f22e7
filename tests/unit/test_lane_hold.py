"""Holding the shared lane to move a member out (issue 28), without a JVM: where the member
stands (the offset log of the last batch it took, or its reader's offset for a stream that
batch did not read), its windows, and the gate a running batch and a hold share."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest

from peer.engine.lane import READER, Lane, LaneMember
from peer.errors import Unavailable
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import parse_query
from peer.model.schema import Field, Schema, to_arrow_schema
from peer.storage.spool import SpoolSet

EV = Schema("ev", (Field("k", "int"), Field("v", "long"), Field("t", "long")))


def windowed(name: str, source: str) -> CheckedQuery:
    box = {
        "name": "w",
        "type": "aggregate",
        "inputs": [source],
        "outputs": [f"{name}_out"],
        "params": {
            "window-size-by": "VALUES",
            "order-on-field": "t",
            "window-size": "10",
            "group-by": "k",
            "aggregate-function.0": "sum(v)",
            "aggregate-function-output-name.0": "s",
        },
    }
    return check_query(parse_query({"name": name, "boxes": [box]}), {"a": EV, "b": EV})


def log_batch(root: Path, batch: int, offsets: dict[str, int]) -> None:
    """An entry of Spark's offset log as the lane's checkpoint holds it."""
    path = root / "checkpoint" / "offsets" / str(batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0}
    path.write_text("v1\n" + json.dumps(meta) + "\n" + json.dumps({"o": offsets}))


@pytest.fixture
def lane(tmp_path: Path) -> Lane:
    spools = SpoolSet(tmp_path / "spools", fsync=False)
    for stream in ("a", "b"):
        spools.create(stream, to_arrow_schema(EV))
        spools.get(stream).register_reader(READER)
    return Lane(spools, tmp_path / "lane", name="lane", trigger_s=0.5, max_rows=1000)


def test_a_held_member_stands_where_its_last_batch_ended(lane: Lane) -> None:
    member = LaneMember.make(windowed("q", "a"), "query:q:i1", first_batch=0)
    assert member.window is not None
    rows = pa.table({"t": pa.array([3, 4, 12], pa.int64()), "k": pa.array([1, 1, 2], pa.int32()),
                     "v": pa.array([5, 6, 7], pa.int64())})  # fmt: skip
    member.window.take(rows)
    lane.members["q"] = member
    lane._windows_loaded = True
    log_batch(lane.root, 6, {"a": 40})
    log_batch(lane.root, 7, {"a": 44})  # planned, not run yet: the hold keeps it from starting
    lane._done_batch = 6
    cut = lane.hold("q", timeout_s=1)
    assert cut.positions == {"a": 40} and cut.reader == READER
    assert cut.window == member.window.to_state()
    # a second hold waits for the first (as a batch would), and gives up when told
    with pytest.raises(TimeoutError):
        lane.hold("q", timeout_s=0.05)
    lane.release("q", drop=False)  # the move failed: the member stays, the lane goes on
    assert lane.members == {"q": member}
    assert lane._gate.acquire(timeout=0.1)
    lane._gate.release()


def test_a_member_that_joined_later_stands_where_it_joined(lane: Lane) -> None:
    """It takes lane batches from ``first_batch`` on; a stream the logged batch did not read
    (the lane was restarted wider) starts at the lane reader's committed offset."""
    lane.members["q"] = LaneMember.make(windowed("q", "a"), "query:q:i1", first_batch=9)
    lane.spools.get("a").append(pa.table({"k": pa.array([1], pa.int32()), "v": [1], "t": [1]}))
    log_batch(lane.root, 8, {"b": 3})
    lane._done_batch = 5
    lane._windows_loaded = True
    cut = lane.hold("q", timeout_s=1)
    assert cut.positions == {"a": lane.spools.get("a").committed(READER)} == {"a": -1}
    lane.release("q", drop=True)
    assert lane.members == {} and lane.streams == []


def test_a_hold_waits_for_the_batch_under_way(lane: Lane) -> None:
    lane.members["q"] = LaneMember.make(windowed("q", "a"), "query:q:i1", first_batch=0)
    lane._windows_loaded = True
    log_batch(lane.root, 3, {"a": 12})
    lane._done_batch = 2
    running = threading.Event()
    finish = threading.Event()

    def batch() -> None:  # what the sink does around a batch
        with lane._gate:
            running.set()
            finish.wait(5)
            lane._done_batch = 3

    worker = threading.Thread(target=batch)
    worker.start()
    assert running.wait(5)
    got: dict[str, Any] = {}
    holder = threading.Thread(target=lambda: got.update(cut=lane.hold("q", timeout_s=5)))
    holder.start()
    holder.join(0.2)
    assert holder.is_alive()  # waiting for the batch
    finish.set()
    holder.join(5)
    worker.join(5)
    assert got["cut"].positions == {"a": 12}  # the batch it waited for is the member's
    # No lane restart while a member is held (a new member waits for the move to end) ...
    with pytest.raises(Unavailable) as err:
        lane._restart(None, ["a", "b"])  # type: ignore[arg-type]
    assert "held while q moves out" in err.value.message
    # ... and a stop lets the batch waiting at the gate go (Spark's stop would wait for the
    # sink), to fail uncommitted: a restart runs it again, with the member
    lane.stop()
    with pytest.raises(RuntimeError, match="stopped while q was held"):
        lane._sink(None, 4)  # type: ignore[arg-type]
    assert lane._done_batch == 3
    lane.release("q", drop=False)
    assert lane._held is None and lane._gate.acquire(timeout=0.1)


def test_an_arriving_member_starts_from_its_seed(lane: Lane, tmp_path: Path) -> None:
    """The windows a member moved with (``arrived/``) are its state until the lane saves its
    own; a stopped member forgets them."""
    q = windowed("q", "a")
    donor = LaneMember.make(q, "query:q:old", first_batch=0)
    assert donor.window is not None
    donor.window.take(pa.table({"k": pa.array([1], pa.int32()), "v": pa.array([5], pa.int64()),
                                "t": pa.array([3], pa.int64())}))  # fmt: skip
    seed = lane.seed_path("q", "new1")
    seed.parent.mkdir(parents=True)
    seed.write_bytes(msgpack.packb(donor.window.to_state(), use_bin_type=True))
    member = LaneMember.make(q, "query:q:new1", first_batch=0)
    lane.members["q"] = member
    assert member.window is not None
    # what Lane.add does before starting Spark
    member.seed = msgpack.unpackb(seed.read_bytes(), strict_map_key=False)
    member.window.load(member.seed)
    lane._load_windows(0)  # no saved state yet: the seed again
    assert member.window.to_state() == donor.window.to_state()
    lane.remove("q")
    assert not seed.exists()


def test_after_a_restart_the_hold_waits_for_the_batch_run_again(lane: Lane) -> None:
    """Batch 5 was planned, maybe appended, not committed: Spark runs it again first, and the
    member stands after it only then (its outputs may be in the spool under its origin)."""
    lane.members["q"] = LaneMember.make(windowed("q", "a"), "query:q:i1", first_batch=0)
    lane._windows_loaded = True
    log_batch(lane.root, 4, {"a": 20})
    log_batch(lane.root, 5, {"a": 25})
    commit = lane.root / "checkpoint" / "commits" / "4"
    commit.parent.mkdir(parents=True)
    commit.write_text("v1\n{}")
    lane._done_batch = lane._logged("commits")
    lane._replaying = lane._planned() > lane._done_batch
    with pytest.raises(TimeoutError):
        lane.hold("q", timeout_s=0.2)

    def replayed() -> None:  # what the sink does when batch 5 has run again
        with lane._gate:
            lane._done_batch, lane._replaying = 5, False
            lane._batch_ran.notify_all()

    worker = threading.Thread(target=replayed)
    worker.start()
    cut = lane.hold("q", timeout_s=5)
    worker.join(5)
    assert cut.positions == {"a": 25}


def test_a_lane_with_members_and_no_spark_query_is_reported_failed(lane: Lane) -> None:
    """A (re)start Spark refused leaves the members without a query: the restarts of failed
    queries must see it (peer.site.restarts), unless a move holds the lane."""
    assert lane.failure() is None  # no members: nothing to run
    lane.members["q"] = LaneMember.make(windowed("q", "a"), "query:q:i1", first_batch=0)
    assert lane.failure() == "not running"
    lane._held = "q"
    assert lane.failure() is None
