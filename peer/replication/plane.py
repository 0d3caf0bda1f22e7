"""Replication on a peer, wired together: the control-plane client, the voter seat (if this
peer is a voter), and the replicated streams (docs/replication.md).

Theory of operation
-------------------
On start, the peer finds the federation's voters by asking live members. Who sits in the
control plane is decided by :mod:`peer.replication.control.seats`: the peer that starts a
federation (no ``--bootstrap``) founds the plane alone if it volunteers (``peer join``'s
default) or is forced (``--voter``); every other peer that volunteers asks the voters to admit
it while the seats they announce (3, or 5 once five peers are live) are not all taken, and
then starts its Raft member with the voters it was told. A joining peer that finds no voters
keeps asking a few live members (every ``SEAT_CHECK_S``; a ``--no-voter`` peer every
``WATCH_S``) and never founds a second plane, unless it was forced into a seat and has found
none for ``found_after_s``. A voter that dies for good is removed by the leader
(:mod:`peer.replication.voter`), and its seat goes to the next volunteer.

A voter remembers the group it belongs to (``control/voters.json`` in its data directory) and
its Raft journal, so it rejoins after a restart without asking; if the live voters no longer
count it (it was replaced while it was away), it drops that journal and volunteers afresh.

The control plane's requests are served on every peer: a voter answers them, any other peer
answers a read with the voters it knows (that is how a joining peer finds them) and refuses
the rest, retriably.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from peer.errors import FedstreamError, Unavailable
from peer.protocol.link import Frame
from peer.replication.appenders import Appenders
from peer.replication.control import NO_CONTROL_PLANE, VoterSeats, may_found, may_volunteer
from peer.replication.control.seats import FOUND_AFTER_S, GRACE_S, LIVE_WINDOW_S
from peer.replication.heartbeats import ControlClient
from peer.replication.link_messages import (
    ControlHeartbeat,
    ControlJoin,
    ControlRead,
    ControlSubmit,
    RaftFrame,
)
from peer.replication.ports import Links, Records
from peer.replication.streams import IsLive, OnRole, ReplicatedStreams, Responsible
from peer.replication.voter import Gone, Voter
from peer.site import LocalSite
from peer.storage.spool_format import atomic_write
from peer.timing import MONOTONIC, Clock, wait_until

log = logging.getLogger(__name__)

VoterHandler = Callable[[Voter, Any, str], Awaitable[Frame]]

Members = Callable[[], list[bytes]]  # the overlay's live members now (node ids)

VOTERS_FILE = "voters.json"
JOIN_S = 30.0
SEAT_CHECK_S = 1.0  # how often a peer without a seat looks for voters and open seats
WATCH_S = 10.0  # how often a --no-voter peer that knows no voters asks again
DISCOVER_SAMPLE = 3  # live members asked per round (a federation without a plane stays quiet)
LEAD_S = 10.0  # how long a founder waits for its plane to elect it
LEARN_S = 10.0  # how long a restarted peer waits at start for its roles in replicated streams


@dataclass(frozen=True)
class ReplicationSettings:
    """``peer join --voter / --no-voter / --replicas / --min-insync``.

    ``voter``: a seat whatever the count (``--voter``); ``volunteer``: take an open seat
    (``peer join``'s default; ``--no-voter`` turns it off); ``founder``: this peer starts the
    federation (no ``--bootstrap``), so it may found the control plane."""

    voter: bool = False
    volunteer: bool = False
    founder: bool = False
    replicas: int = 3
    min_insync: int = 2
    heartbeat_s: float = 0.25
    failover_after_s: float = 3.0
    repair_after_s: float = (
        30.0  # a replica silent this long is replaced (peer.replication.control.repair)
    )
    voter_grace_s: float = GRACE_S  # a voter silent this long is replaced
    found_after_s: float = FOUND_AFTER_S  # a forced voter that finds no plane this long founds one

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.min_insync < 1:
            raise ValueError("replicas and min_insync must be at least 1")
        if not self.voter_grace_s > 0 or not self.found_after_s >= 0:
            raise ValueError("voter_grace_s must be above 0 and found_after_s at least 0")

    @property
    def seeks_seat(self) -> bool:
        return self.voter or self.volunteer


class ControlPlane:
    def __init__(
        self,
        site: LocalSite,
        router: Links,
        records: Records,
        settings: ReplicationSettings,
        on_role: OnRole,
        *,
        logs: Appenders,
        is_live: IsLive | None = None,
        responsible: Responsible | None = None,
        gone: Gone | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        """``gone``: whether a peer's process is gone (its voter asks it about a silent
        primary; None: silence alone decides)."""
        self.site = site
        self.clock = clock
        self.gone = gone
        self.router = router
        self.settings = settings
        self.me = router.node_id.hex()
        self.client = ControlClient(
            router, self._log_ends, heartbeat_s=settings.heartbeat_s, clock=clock
        )
        self.replicas = ReplicatedStreams(
            site,
            router,
            self.client,
            records,
            on_role,
            logs=logs,
            is_live=is_live,
            responsible=responsible,
            repair_after_s=settings.repair_after_s,
            clock=clock,
        )
        self.voter: Voter | None = None
        self._members: Members = list
        self.directory = site.data_dir / "control"
        voter_only: tuple[tuple[str, VoterHandler], ...] = (
            (ControlHeartbeat.OP, Voter.on_heartbeat),
            (ControlSubmit.OP, Voter.on_submit),
            (ControlJoin.OP, Voter.on_join),
            (RaftFrame.OP, Voter.on_raft),
        )
        for op, serve in voter_only:
            router.register(op, functools.partial(self._at_voter, serve))
        router.register(ControlRead.OP, self._read)

    def _log_ends(self) -> dict[str, int]:
        return self.replicas.log_ends()

    # ----------------------------------------------------------------------- joining
    async def start(self, members: Members) -> None:
        """Find the voters; take this peer's seat now if it has one (saved), founds the
        plane, or was forced into one and the plane exists. Volunteering goes on in
        :meth:`run`."""
        self.replicas.start()
        self._members = members
        saved = self._saved_voters()
        others = self._others()
        found = await self.client.discover(others)
        if saved and found and self.me not in self.client.voters:
            log.warning("the control plane's voters no longer count this peer: it volunteers")
            await asyncio.to_thread(shutil.rmtree, self.directory, True)
            saved = ()
        if saved:
            self._take_seat(saved)
            if saved == (self.me,):  # its only voter: the plane is back once it leads again
                await self._lead_alone()
        elif may_found(  # (a peer rejoining through the neighbours it saved founds nothing)
            volunteer=self.settings.seeks_seat,
            founder=self.settings.founder and not others,
            voters_found=found,
        ):
            log.warning("no voters found: this peer founds the control plane")
            self._take_seat((self.me,))
            await self._lead_alone()
        elif self.settings.voter and found:
            reply = await self._join_voters()
            if reply.get("ok"):
                self._seat_from(reply)
        elif not found:
            log.info("no control plane found yet; replicated streams are off until one is")
        await self._learn_roles()

    async def _learn_roles(self) -> None:
        """After a restart, learn this peer's role in the replicated streams it holds before
        it says it is ready, as it takes its unreplicated streams back before then: a peer
        that leads a stream takes its pushes once it is ready. A stream the control plane
        does not answer for within LEARN_S (all told) stays refused, retriably, until a
        heartbeat tells."""
        if not self.client.active:
            return
        waiting = self.replicas.awaiting_role()
        try:
            async with asyncio.timeout(LEARN_S):
                for name in waiting:
                    try:
                        await self.replicas.refresh(name)
                    except FedstreamError as exc:
                        log.warning("replicated stream %s: role not learnt at start: %s", name, exc)
        except TimeoutError:
            log.warning("roles in replicated streams not all learnt in %.0f s at start", LEARN_S)

    async def _lead_alone(self) -> None:
        """Wait (up to LEAD_S) until a plane whose only voter is this peer (founded here, or
        restarted from its journal) has elected its leader, so that the peer takes streams
        as soon as it says it is ready."""
        voter = self.voter
        assert voter is not None
        try:
            await wait_until(
                lambda: voter.machine.is_leader(),
                "a leader",
                LEAD_S,
                every_s=0.05,
                clock=self.clock,
            )
        except TimeoutError:
            log.warning("the control plane of this peer has no leader after %.0f s", LEAD_S)

    def _others(self) -> list[bytes]:
        return [m for m in self._members() if m != self.router.node_id]

    def _seat_from(self, reply: Frame) -> None:
        voters = tuple(v for v in reply.get("voters", ()) if isinstance(v, str))
        self._take_seat(voters if self.me in voters else (*voters, self.me))

    def _take_seat(self, voters: tuple[str, ...]) -> None:
        self._save_voters(voters)
        self.voter = Voter(
            self.me,
            voters,
            self._call_voter,
            journal_dir=self.directory,
            seats=VoterSeats(
                self.clock,
                live_window_s=min(LIVE_WINDOW_S, self.settings.voter_grace_s),
                grace_s=self.settings.voter_grace_s,
            ),
            on_voters=self._save_voters,
            failover_after_s=self.settings.failover_after_s,
            gone=self.gone,
            # two heartbeats missed: cheap to ask about (one connection attempt)
            suspect_after_s=min(2 * self.settings.heartbeat_s, self.settings.failover_after_s),
            clock=self.clock,
        )
        self.client.set_voters(voters)

    async def _join_voters(self) -> Frame:
        """Ask the voters to admit this peer; a group still electing its leader is asked
        again, for up to JOIN_S."""
        deadline = self.clock() + JOIN_S
        message = ControlJoin(self.me, volunteer=not self.settings.voter)
        while True:
            try:
                return await self.client.submit(message)
            except Unavailable:
                if self.clock() > deadline:
                    raise
                await self.clock.sleep(0.2)

    async def _find_seat(self) -> None:
        """Until this peer sits (or, with ``--no-voter``, knows the voters): look for the
        voters, and ask for an open seat while there is one (docs/replication.md, Seats)."""
        since = self.clock()
        forced = self.settings.voter
        while self.voter is None:
            others = self._others()
            sample = random.sample(others, min(len(others), DISCOVER_SAMPLE))
            if not self.client.active and not await self.client.discover(sample):
                if forced and self.clock() - since >= self.settings.found_after_s:
                    log.warning(
                        "no voters found in %.0f s: this forced voter founds the plane",
                        self.settings.found_after_s,
                    )
                    self._take_seat((self.me,))
                    return
            elif not self.settings.seeks_seat:
                return  # the heartbeats keep the voters current from now on
            elif may_volunteer(
                self.me,
                self.client.voters,
                self.client.seats,
                volunteer=self.settings.volunteer,
                forced=forced,
            ):
                try:
                    reply = await self.client.submit(ControlJoin(self.me, volunteer=not forced))
                except Unavailable as exc:
                    log.debug("asking for a seat failed: %s", exc)
                else:
                    if reply.get("ok"):
                        self._seat_from(reply)
                        return
                    log.debug("no seat: %s", reply.get("reason"))
            await self.clock.sleep(SEAT_CHECK_S if self.settings.seeks_seat else WATCH_S)

    async def _call_voter(self, node: str, frame: RaftFrame) -> Frame:
        return await self.router.call(bytes.fromhex(node), frame)

    def _saved_voters(self) -> tuple[str, ...]:
        path = self.directory / VOTERS_FILE
        try:
            voters = json.loads(path.read_text())
        except (OSError, ValueError):
            return ()
        if not isinstance(voters, list) or not all(isinstance(v, str) for v in voters):
            return ()
        return tuple(voters)

    def _save_voters(self, voters: tuple[str, ...]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write(self.directory / VOTERS_FILE, json.dumps(list(voters)).encode(), fsync=True)

    # ----------------------------------------------------------------------- serving
    async def _at_voter(self, serve: VoterHandler, message: Any, sender: str) -> Frame:
        """A request only a voter serves; any other peer refuses it (retriably), naming the
        voters it knows."""
        if self.voter is None:
            raise Unavailable(
                "this peer is not a voter of the control plane", **self.client.describe()
            )
        return await serve(self.voter, message, sender)

    async def _read(self, message: ControlRead, sender: str) -> Frame:
        if self.voter is None:
            return {"stream": None, **self.client.describe(), "voter": False}
        return await self.voter.on_read(message, sender)

    # ----------------------------------------------------------------------- running
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.client.run())
            tg.create_task(self.replicas.run())
            tg.create_task(self._sit())

    async def _sit(self) -> None:
        if self.voter is None:
            await self._find_seat()
        if self.voter is not None:
            await self.voter.run()

    def plain_copies(self) -> str:
        """What a stream without replication has, in words (``peer lookup``)."""
        return "1 copy: not replicated" if self.client.active else NO_CONTROL_PLANE

    def status(self) -> dict[str, Any]:
        """The voters, this peer's seat, its replicated streams; without a control plane, a
        ``note`` that every stream then has one copy."""
        note = {} if self.client.active else {"note": NO_CONTROL_PLANE}
        return {
            **self.client.describe(),
            "voter": self.voter is not None,
            "streams": self.replicas.describe(),
            **note,
        }
