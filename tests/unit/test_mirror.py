"""Mirrors carry a spool to a replica exactly once, one request at a time, keeping on disk
what the receiver has not acknowledged (real spools; the peer link is a fake)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from peer.errors import Unavailable
from peer.federation.mirror import BACKOFF, MIRROR_PREFIX, Mirrors
from peer.protocol.link import MirrorAppend
from peer.storage.spool import Spool, SpoolSet
from peer.storage.spool_format import read_reader_offset
from peer.testing import ManualClock, all_tasks_blocked, wait_until

SCHEMA = pa.schema([("x", pa.int64())])
TARGET = bytes(range(20))


def table(start: int, n: int = 10) -> pa.Table:
    return pa.table({"x": pa.array(range(start, start + n), pa.int64())})


class FakeFed:
    """Delivers mirror_append into a real receiving spool; can stall, or lose acks."""

    node_id = bytes(20)

    def __init__(self, sender: SpoolSet, receiver: Spool) -> None:
        self.spools = sender
        self.receiver = receiver
        self.open = asyncio.Event()
        self.open.set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.lose_ack_on: set[int] = set()
        self.asked = asyncio.Event()  # set when the first request arrives

    def mirrors(self) -> Mirrors:
        return Mirrors(self.spools, self.node_id, self.call)

    async def call(self, target: bytes, message: MirrorAppend) -> dict[str, Any]:
        # what travels is the wire form, decoded again as the receiver does
        message = MirrorAppend.from_wire(message.to_wire())
        assert target == TARGET
        self.in_flight += 1
        self.asked.set()
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.open.wait()
            self.calls += 1
            for seq, body, status in message.batches:
                t = pa.ipc.open_stream(body).read_all()
                self.receiver.append(t, origin=message.origin, seq=seq, status=status)
            if self.calls in self.lose_ack_on:
                raise Unavailable("the acknowledgement was lost")
            return {"last": message.batches[-1][0]}
        finally:
            self.in_flight -= 1


def received(spool: Spool) -> list[int]:
    return [x for _, t in spool.read(spool.earliest - 1, spool.latest) for x in t["x"].to_pylist()]


async def run_until(mirrors: Mirrors, done: Callable[[], bool], what: str) -> None:
    """Run ``mirrors`` until ``done()`` (the mirror's reads and acks go through threads)."""
    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(mirrors.run())
        await wait_until(done, what, 20, every_s=0.01)
        runner.cancel()


def test_exactly_once_across_lost_acks_and_a_stalled_receiver(tmp_path: Path) -> None:
    sender = SpoolSet(tmp_path / "a", fsync=False)
    source = sender.create("s", SCHEMA)
    replica = Spool(tmp_path / "b" / "s", SCHEMA, fsync=False)
    reader = MIRROR_PREFIX + TARGET.hex()
    for i in range(40):
        source.append(table(i * 10))

    async def go() -> FakeFed:
        fed = FakeFed(sender, replica)
        fed.lose_ack_on = {1, 3}
        mirrors = fed.mirrors()
        fed.open.clear()  # the receiver stalls at first
        mirrors.start("s", TARGET)  # before run(): run() starts it from the spool's readers
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(mirrors.run())
            async with asyncio.timeout(20):
                await fed.asked.wait()
            # stalled: one request waits, nothing is acknowledged, the rest stays on disk
            assert fed.in_flight == 1
            assert read_reader_offset(source.directory, reader) == -1
            assert source.trim() == 0
            fed.open.set()
            await wait_until(lambda: len(received(replica)) >= 400, "400 rows", 20, every_s=0.01)
            for i in range(40, 50):  # later appends follow
                source.append(table(i * 10))
            await wait_until(
                lambda: read_reader_offset(source.directory, reader) == source.latest,
                "every batch acknowledged",
                20,
                every_s=0.01,
            )
            runner.cancel()
        return fed

    fed = asyncio.run(go())
    assert received(replica) == list(range(500))  # lost acks were re-sent and dropped once
    assert fed.max_in_flight == 1
    assert read_reader_offset(source.directory, reader) == source.latest
    assert source.trim() > 0  # acknowledged batches may go now


def test_mirrors_restart_from_the_spool_and_stop_cleanly(tmp_path: Path) -> None:
    sender = SpoolSet(tmp_path / "a", fsync=False)
    source = sender.create("s", SCHEMA)
    replica = Spool(tmp_path / "b" / "s", SCHEMA, fsync=False)
    for i in range(5):
        source.append(table(i * 10))
    fed = FakeFed(sender, replica)
    first = fed.mirrors()
    first.start("s", TARGET)
    asyncio.run(run_until(first, lambda: len(received(replica)) >= 50, "50 rows"))
    for i in range(5, 8):
        source.append(table(i * 10))
    again = fed.mirrors()  # a restart: found in the spool's readers
    asyncio.run(run_until(again, lambda: len(received(replica)) >= 80, "80 rows"))
    assert received(replica) == list(range(80))
    again.stop("s", TARGET)
    assert not [r for r in source.readers() if r.startswith(MIRROR_PREFIX)]


def test_a_dead_receiver_stops_holding_back_the_writers_but_keeps_its_batches(
    tmp_path: Path,
) -> None:
    spools = SpoolSet(tmp_path / "sender", fsync=False)
    spool = spools.create("s", SCHEMA)
    other = spools.create("t", SCHEMA)
    reader = MIRROR_PREFIX + TARGET.hex()
    spool.register_reader(reader)
    for i in range(5):
        spool.append(table(i * 10))
        other.append(table(i * 10))

    async def never(_node: bytes, _message: MirrorAppend) -> dict[str, Any]:
        raise Unavailable("the receiver is dead")

    mirrors = Mirrors(spools, bytes(20), never)
    assert spool.backlog() == 5  # the receiver acknowledged nothing: writers would wait
    assert mirrors.on_member(TARGET, alive=False) == ["s"]
    assert spool.backlog() == 0  # pushes to s are no longer held back by the dead peer
    assert spool.trim() == 0  # ... but every batch it lacks is kept for its return
    assert spool.earliest == 0
    assert mirrors.on_member(bytes(range(1, 21)), alive=False) == []  # not a receiver here
    assert mirrors.on_member(TARGET, alive=True) == ["s"]
    assert spool.backlog() == 5


def test_mirror_append_carries_tentative_entries_and_undos_on_the_wire() -> None:
    import pytest

    from peer.errors import InvalidInput

    message = MirrorAppend(
        "s", "m:x", ((3, b"a", "stable"), (4, b"b", "tentative"), (5, b"", "undo"))
    )
    wire = message.to_wire()
    assert wire["batches"] == [[3, b"a"], [4, b"b", "tentative"], [5, b"", "undo"]]
    assert MirrorAppend.from_wire(wire) == message
    bad = {**wire, "batches": [[3, b"a", "maybe"]]}
    with pytest.raises(InvalidInput, match="status one of"):
        MirrorAppend.from_wire(bad)


def test_a_mirror_to_an_unavailable_receiver_backs_off_on_its_clock(tmp_path: Path) -> None:
    sender = SpoolSet(tmp_path / "a", fsync=False)
    source = sender.create("s", SCHEMA)
    source.append(table(0))
    clock = ManualClock()
    tries: list[float] = []

    async def refuse(_node: bytes, _message: MirrorAppend) -> dict[str, Any]:
        tries.append(clock())
        raise Unavailable("the receiver is away")

    def more_than(n: int) -> Callable[[], bool]:
        return lambda: len(tries) > n

    async def go() -> None:
        mirrors = Mirrors(sender, bytes(20), refuse, clock=clock)
        mirrors.start("s", TARGET)
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(mirrors.run())
            for wait in (BACKOFF.delay_s(1), BACKOFF.delay_s(2), BACKOFF.delay_s(3)):
                await wait_until(lambda: clock.sleepers == 1, "the pump waiting", 20, every_s=0)
                clock.advance(wait * 0.99)  # not yet
                await all_tasks_blocked()
                assert clock.sleepers == 1
                clock.advance(wait * 0.01 + 1e-9)
                await wait_until(more_than(len(tries)), "the next try", 20, every_s=0.001)
            runner.cancel()

    asyncio.run(go())
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(tries)]
    assert gaps == [0.1, 0.2, 0.4]  # doubling from 0.1 s, as the one Backoff says
