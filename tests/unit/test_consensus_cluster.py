"""peer.replication.raft as a cluster: ControlMachines in one process joined by an in-memory bus
that hands every frame to ``deliver`` (threads, no sockets, no JVM). Elections, commands submitted
on a follower, a cut-off leader replaced without split brain, a voter added, a voter restarted
from its journal, a voter caught up by a snapshot. Every wait is bounded."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.journal import MetaStorer

from peer.errors import Unavailable
from peer.replication.control import Applied, Command, CreateStream, Elect, StreamState
from peer.replication.raft import ControlMachine, RaftTimings, decode_message
from peer.testing import wait_until_sync

IDS = [hashlib.sha1(name.encode()).hexdigest() for name in ("v1", "v2", "v3", "v4")]
WAIT = 10.0  # the generous bound of every wait


class Bus:
    """Frames between machines, each handed to the receiver's ``deliver`` at once. A cut node
    neither sends nor receives; its sends still report success (the loss is silent)."""

    def __init__(self) -> None:
        self.machines: dict[str, ControlMachine] = {}
        self.cut: set[str] = set()
        self.lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []  # every frame sent, decoded
        self.bad: list[str] = []

    def send_for(self, src: str) -> Callable[[str, bytes], bool]:
        def send(dst: str, frame: bytes) -> bool:
            try:
                message = decode_message(frame)
            except Exception as exc:
                self.bad.append(repr(exc))
                raise
            with self.lock:
                self.seen.append(message)
                target = self.machines.get(dst)
                if src in self.cut or dst in self.cut:
                    return True
            if target is None:
                return False
            target.deliver(src, frame)
            return True

        return send

    def start(self, node: str, voters: list[str], **kwargs: Any) -> ControlMachine:
        machine = ControlMachine(node, voters, self.send_for(node), **kwargs)
        with self.lock:
            self.machines[node] = machine
        return machine

    def stop(self, node: str) -> None:
        with self.lock:
            machine = self.machines.pop(node)
        machine.close()

    def types(self) -> set[str]:
        with self.lock:
            return {m["type"] for m in self.seen}


@pytest.fixture
def bus(caplog: pytest.LogCaptureFixture) -> Iterator[Bus]:
    bus = Bus()
    with caplog.at_level(logging.WARNING):
        yield bus
        for node in list(bus.machines):
            bus.stop(node)
    assert bus.bad == []
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures == []  # pysyncobj logs what fails on its thread (a dump, a tick)


def one_leader(bus: Bus, among: list[str]) -> str | None:
    leaders = {bus.machines[n].leader() for n in among}
    if len(leaders) != 1:
        return None
    (leader,) = leaders
    if leader is None or leader not in among or not bus.machines[leader].is_leader():
        return None
    return leader


def submit(machine: ControlMachine, command: Command) -> Applied:
    """Submit until a leader takes it (an election may be running)."""
    return wait_until_sync(
        lambda: machine.submit(command).result(timeout=WAIT),
        f"a leader to take {command}",
        WAIT,
        every_s=0.05,
        tolerate=(Unavailable,),
    )


def same_state(bus: Bus, among: list[str]) -> tuple[StreamState, ...] | None:
    states = {bus.machines[n].snapshot() for n in among}
    return states.pop() if len(states) == 1 else None


def three(bus: Bus, **kwargs: Any) -> str:
    for node in IDS[:3]:
        bus.start(node, IDS[:3], **kwargs)
    return str(
        wait_until_sync(
            lambda: one_leader(bus, IDS[:3]), "a leader all agree on", WAIT, every_s=0.01
        )
    )


def test_three_voters_elect_a_leader_and_apply_a_follower_command_everywhere(bus: Bus) -> None:
    leader = three(bus)
    follower = next(n for n in IDS[:3] if n != leader)
    heard: list[Applied] = []
    bus.machines[leader].on_applied(heard.append)
    command = CreateStream("s", tuple(IDS[:3]), 2)
    applied = submit(bus.machines[follower], command)
    assert applied == Applied(command, True)
    state = wait_until_sync(
        lambda: same_state(bus, IDS[:3]) or None, "one state", WAIT, every_s=0.01
    )
    assert state == (StreamState("s", 1, IDS[0], tuple(IDS[:3]), tuple(IDS[:3]), 2, 1),)
    assert wait_until_sync(lambda: heard, "the leader's listener", WAIT, every_s=0.01) == [
        Applied(command, True)
    ]
    again = submit(bus.machines[leader], command)
    assert again == Applied(command, False, "stream 's' exists")
    assert bus.machines[follower].stream("s") == state[0]
    assert all(bus.machines[n].voters() == tuple(sorted(IDS[:3])) for n in IDS[:3])
    # a graceful hand-over: pysyncobj's timeout_now over the links
    done: Future[int] = Future()
    bus.machines[leader].transferLeadership(callback=lambda res, err: done.set_result(err))
    assert done.result(timeout=WAIT) == 0
    wait_until_sync(
        lambda: one_leader(bus, IDS[:3]) not in (None, leader), "another leader", WAIT, every_s=0.01
    )
    assert {"request_vote", "response_vote", "append_entries", "next_node_idx"} <= bus.types()
    assert {"apply_command", "apply_command_response", "timeout_now", "hello"} <= bus.types()
    assert any(m.get("entries") for m in bus.seen if m["type"] == "append_entries")


def test_a_cut_off_leader_is_replaced_and_rejoins_without_split_brain(bus: Bus) -> None:
    old = three(bus)
    rest = [n for n in IDS[:3] if n != old]
    submit(bus.machines[rest[0]], CreateStream("before", tuple(IDS[:3]), 2))
    wait_until_sync(
        lambda: same_state(bus, IDS[:3]) and bus.machines[old].snapshot(),
        "all applied",
        WAIT,
        every_s=0.01,
    )

    cut_at = time.monotonic()
    with bus.lock:
        bus.cut.add(old)
    new = wait_until_sync(
        lambda: one_leader(bus, rest), "a new leader among the rest", WAIT, every_s=0.01
    )
    elected_in = time.monotonic() - cut_at
    print(f"\nnew leader elected {elected_in:.3f} s after the leader was cut off")
    assert new != old
    assert elected_in < WAIT

    lost = bus.machines[old].submit(CreateStream("lost", tuple(IDS[:3]), 2), timeout=1.0)
    with pytest.raises(Unavailable):
        lost.result(timeout=WAIT)
    after = CreateStream("after", tuple(IDS[:3]), 2)
    assert submit(bus.machines[rest[1]], after) == Applied(after, True)

    with bus.lock:
        bus.cut.discard(old)
    state = wait_until_sync(
        lambda: same_state(bus, IDS[:3]) if bus.machines[old].stream("after") else None,
        "one state everywhere",
        WAIT,
        every_s=0.01,
    )
    assert [s.name for s in state] == ["after", "before"]  # "lost" applied nowhere
    wait_until_sync(lambda: one_leader(bus, IDS[:3]), "one leader again", WAIT, every_s=0.01)
    assert bus.machines[old].stream("lost") is None


def test_a_fourth_voter_added_catches_up_and_a_voter_can_be_removed(bus: Bus) -> None:
    leader = three(bus)
    for i in range(5):
        submit(bus.machines[leader], CreateStream(f"s{i}", tuple(IDS[:3]), 2))
    fourth = bus.start(IDS[3], IDS)
    bus.machines[leader].add_voter(IDS[3]).result(timeout=WAIT)
    wait_until_sync(
        lambda: all(len(m.voters()) == 4 for m in bus.machines.values()),
        "four voters everywhere",
        WAIT,
        every_s=0.01,
    )
    state = wait_until_sync(
        lambda: same_state(bus, IDS) if fourth.snapshot() else None,
        "the fourth caught up",
        WAIT,
        every_s=0.01,
    )
    assert len(state) == 5
    assert bus.machines[leader].add_voter(IDS[3]).result(timeout=WAIT) is None  # already one

    follower = next(n for n in IDS[:3] if n != leader)
    bus.machines[leader].remove_voter(follower).result(timeout=WAIT)
    remaining = [n for n in IDS if n != follower]
    wait_until_sync(
        lambda: all(bus.machines[n].voters() == tuple(sorted(remaining)) for n in remaining),
        "three voters left",
        WAIT,
        every_s=0.01,
    )
    bus.stop(follower)
    command = Elect("s0", 1, IDS[1])
    assert submit(fourth, command).ok
    wait_until_sync(lambda: same_state(bus, remaining), "applied by the rest", WAIT, every_s=0.01)


def saved_commit_index(journal_dir: Path) -> int:
    """The commit index pysyncobj's file journal has saved (in ``raft.journal.meta``)."""
    meta = MetaStorer(str(journal_dir / "raft.journal") + ".meta").getMeta()
    return int(meta.get("raftCommitIndex", 0))


def test_a_restarted_voter_recovers_its_state_from_its_journal(bus: Bus, tmp_path: Path) -> None:
    dirs = {n: tmp_path / n[:8] for n in IDS[:3]}
    for node in IDS[:3]:
        bus.start(node, IDS[:3], journal_dir=dirs[node])
    leader = wait_until_sync(lambda: one_leader(bus, IDS[:3]), "a leader", WAIT, every_s=0.01)
    for i in range(3):
        submit(bus.machines[leader], CreateStream(f"s{i}", tuple(IDS[:3]), 2))
    victim = next(n for n in IDS[:3] if n != leader)
    wait_until_sync(
        lambda: len(bus.machines[victim].snapshot()) == 3, "applied everywhere", WAIT, every_s=0.01
    )
    bus.machines[victim].forceLogCompaction()  # a dump on disk, then more journal after it
    wait_until_sync(lambda: (dirs[victim] / "raft.dump").exists(), "a dump", WAIT, every_s=0.01)
    submit(bus.machines[leader], CreateStream("s3", tuple(IDS[:3]), 2))
    wait_until_sync(
        lambda: len(bus.machines[victim].snapshot()) == 4, "s3 everywhere", WAIT, every_s=0.01
    )
    # pysyncobj saves the commit index beside its journal about once a second: stop the
    # victim once what it has applied is committed on its disk too
    committed = bus.machines[victim].raftCommitIndex
    wait_until_sync(
        lambda: saved_commit_index(dirs[victim]) >= committed,
        "the commit index saved",
        WAIT,
        every_s=0.05,
    )
    bus.stop(victim)

    with bus.lock:
        bus.cut.add(victim)  # it hears nobody: whatever it has comes from its disk
    restored: list[tuple[StreamState, ...]] = []
    reborn = ControlMachine(victim, IDS[:3], bus.send_for(victim), journal_dir=dirs[victim])
    reborn.on_restored(restored.append)
    with bus.lock:
        bus.machines[victim] = reborn
    wait_until_sync(
        lambda: reborn.snapshot() == same_state(bus, [leader]),
        "its state back from disk",
        WAIT,
        every_s=0.01,
    )
    assert len(reborn.snapshot()) == 4
    assert [s.name for s in restored[0]] == ["s0", "s1", "s2"]  # the dump, then the journal
    assert reborn.applied_count() == bus.machines[leader].applied_count()  # none applied twice
    with bus.lock:
        bus.cut.discard(victim)
    submit(bus.machines[leader], CreateStream("s4", tuple(IDS[:3]), 2))
    wait_until_sync(
        lambda: len(reborn.snapshot()) == 5 and same_state(bus, IDS[:3]),
        "it follows again",
        WAIT,
        every_s=0.01,
    )


def test_a_voter_far_behind_is_sent_a_snapshot(bus: Bus) -> None:
    leader = three(bus)
    for i in range(4):
        submit(bus.machines[leader], CreateStream(f"s{i}", tuple(IDS[:3]), 2))
    wait_until_sync(lambda: same_state(bus, IDS[:3]), "applied everywhere", WAIT, every_s=0.01)
    for node in IDS[:3]:
        bus.machines[node].forceLogCompaction()
    wait_until_sync(
        lambda: bus.machines[leader].getStatus()["log_len"] <= 3,
        "the leader compacted",
        WAIT,
        every_s=0.01,
    )
    fourth = bus.start(IDS[3], IDS)
    restored: list[tuple[StreamState, ...]] = []
    fourth.on_restored(restored.append)
    bus.machines[leader].add_voter(IDS[3]).result(timeout=WAIT)
    wait_until_sync(
        lambda: same_state(bus, IDS) if fourth.snapshot() else None, "caught up", WAIT, every_s=0.01
    )
    assert restored and [s.name for s in restored[-1]] == ["s0", "s1", "s2", "s3"]
    assert any(m.get("serialized") for m in bus.seen if m["type"] == "append_entries")


def test_submit_fails_fast_without_a_leader_and_after_close(bus: Bus) -> None:
    lonely = bus.start(IDS[0], IDS[:3], timings=RaftTimings(submit_timeout=2.0))
    with pytest.raises(Unavailable, match="there is no leader"):
        lonely.submit(CreateStream("s", (IDS[0],), 1)).result(timeout=WAIT)
    bus.stop(IDS[0])
    assert not lonely.tick_thread_alive()
    with pytest.raises(Unavailable, match="closed"):
        lonely.submit(CreateStream("s", (IDS[0],), 1)).result(timeout=WAIT)
