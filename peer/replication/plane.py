"""Replication on a peer, wired together: the control-plane client, the voter seat (if this
peer is a voter), and the replicated streams (docs/replication.md).

Theory of operation
-------------------
On start, the peer finds the federation's voters by asking live members. A peer started as
a voter (``peer join --voter``) joins them: the first voter of a federation starts the Raft
group alone; a later one asks the group to admit it and then starts its member with the
voters it was told. A voter remembers the group it belongs to (``control/voters.json`` in its
data directory) and its Raft journal, so it rejoins after a restart without asking.

The control plane's requests are served on every peer: a voter answers them, any other peer
answers a read with the voters it knows (that is how a joining peer finds them) and refuses
the rest, retriably.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from peer.errors import Unavailable
from peer.protocol.link import Frame
from peer.replication.appenders import Appenders
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
from peer.replication.voter import Voter
from peer.site import LocalSite
from peer.storage.spool_format import atomic_write

log = logging.getLogger(__name__)

VoterHandler = Callable[[Voter, Any, str], Awaitable[Frame]]

VOTERS_FILE = "voters.json"
JOIN_S = 30.0


@dataclass(frozen=True)
class ReplicationSettings:
    """``peer join --voter / --replicas / --min-insync``."""

    voter: bool = False
    replicas: int = 3
    min_insync: int = 2
    heartbeat_s: float = 0.25
    failover_after_s: float = 1.5
    repair_after_s: float = (
        30.0  # a replica silent this long is replaced (peer.replication.control.repair)
    )

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.min_insync < 1:
            raise ValueError("replicas and min_insync must be at least 1")


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
    ) -> None:
        self.site = site
        self.router = router
        self.settings = settings
        self.me = router.node_id.hex()
        self.client = ControlClient(router, self._log_ends, heartbeat_s=settings.heartbeat_s)
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
        )
        self.voter: Voter | None = None
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
    async def start(self, members: list[bytes]) -> None:
        self.replicas.start()
        saved = self._saved_voters()
        found = await self.client.discover([m for m in members if m != self.router.node_id])
        if not self.settings.voter and not saved:
            if not found:
                log.info("no control plane found; replicated streams are off until one is")
            return
        if saved:
            voters = saved
        elif not found:
            voters = (self.me,)
            log.warning("no voters found: this peer starts the control plane")
        else:
            reply = await self._join_voters()
            voters = tuple(v for v in reply.get("voters", ()) if isinstance(v, str))
            if self.me not in voters:
                voters = (*voters, self.me)
        self._save_voters(voters)
        self.voter = Voter(
            self.me,
            voters,
            self._call_voter,
            journal_dir=self.directory,
            failover_after_s=self.settings.failover_after_s,
            on_voters=self._save_voters,
        )
        self.client.set_voters(voters)

    async def _join_voters(self) -> Frame:
        """Ask the voters to admit this peer; a group still electing its leader is asked
        again, for up to JOIN_S."""
        deadline = time.monotonic() + JOIN_S
        while True:
            try:
                return await self.client.submit(ControlJoin(self.me))
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

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
            if self.voter is not None:
                tg.create_task(self.voter.run())

    def status(self) -> dict[str, Any]:
        return {
            **self.client.describe(),
            "voter": self.voter is not None,
            "streams": self.replicas.describe(),
        }
