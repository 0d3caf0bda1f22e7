"""A launched peer leaves when its name leaves the burst leader's plan (issue 28).

Theory of operation
-------------------
A peer started with ``--launched-as NAME`` reads its participant's burst state from the
control plane every ``round_s``. Once NAME is not among the launched names (the leader chose
to shrink; or the plan dropped it before it came up), it drains:

1. it gossips ``drain`` (:meth:`figures`), so its siblings' balancers send it nothing and the
   leader's sizing no longer counts it;
2. it hands the primary role of each stream it leads to another in-sync replica (the planned
   hand-over of :meth:`peer.replication.ReplicatedStreams.hand_over`: nothing acknowledged is
   lost, pushes in flight are retried), replicated fragments going with their input's primary;
3. it moves every other fragment, with its state, to the least loaded live sibling (the move
   protocol, under :data:`peer.move.SIBLING`);
4. when nothing is left to move, and no move into it is under way (a sibling that chose it
   before it gossiped ``drain``: stopping mid-install would leave that move in doubt for
   good), it stops the peer (``peer join`` exits 0).

What cannot move (a fragment whose result stream another fragment here reads; a lane member
whose input the target's lane reads already) keeps the peer up: it says so in its status and
tries again each round. Its follower roles in replicated streams are not handed over: the
control plane repairs them once the peer is gone, as for any peer that leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

from peer.errors import FedstreamError
from peer.move import SIBLING
from peer.replication.bursts import BurstState

__all__ = ["DrainPort", "DrainStatus", "Drainer"]

log = logging.getLogger(__name__)

ROUND_S = 2.0


class DrainStatus(TypedDict):
    """A launched peer's part of ``peer status``."""

    launched_as: str
    draining: bool
    left: list[str]  # what kept the last drain pass from finishing


class DrainPort(Protocol):
    """What draining uses of the peer."""

    async def read_burst(self, participant: str) -> BurstState | None: ...

    def siblings(self) -> Sequence[bytes]:
        """Live engine peers of this participant that are not draining, least loaded first."""
        ...

    def led_streams(self) -> Sequence[tuple[str, tuple[str, ...]]]:
        """Streams this peer leads, each with its other in-sync replicas."""
        ...

    async def hand_over_stream(self, name: str, to: str) -> object: ...

    def movable_fragments(self) -> Sequence[tuple[str, tuple[str, ...]]]: ...

    def handover_fragments(self) -> Sequence[tuple[str, tuple[str, ...], frozenset[bytes]]]: ...

    async def move_fragment(
        self, name: str, target: bytes, *, contract: str, load: float, price: float
    ) -> Mapping[str, object]: ...

    def unmovable(self) -> Sequence[str]:
        """Fragments here that cannot move, each with why."""
        ...

    def moving(self) -> bool:
        """A move into or out of this peer is under way."""
        ...


class Drainer:
    def __init__(
        self, port: DrainPort, participant: str, name: str, stop: Callable[[], None]
    ) -> None:
        self.port = port
        self.participant = participant
        self.name = name
        self.stop = stop
        self.draining = False
        self.left: list[str] = []  # what kept the last pass from finishing

    def figures(self) -> dict[str, float]:
        """What this peer adds to its gossip: launched, and draining once it drains."""
        return {"launched": 1.0, **({"drain": 1.0} if self.draining else {})}

    async def run(self, round_s: float = ROUND_S) -> None:
        while True:
            try:
                if await self.round():
                    return
            except FedstreamError as exc:
                log.info("launched peer %s: %s", self.name, exc)
            except Exception:
                log.exception("launched peer %s: a drain round failed", self.name)
            await asyncio.sleep(round_s)

    async def round(self) -> bool:
        """One look at the plan (and a drain pass if this peer left it); True once the peer
        has been stopped."""
        if not self.draining:
            state = await self.port.read_burst(self.participant)
            if state is None or self.name in state.launched:
                return False
            log.info("launched peer %s: no longer in the plan; draining", self.name)
            self.draining = True
        self.left = await self._pass()
        if self.left:
            return False
        log.info("launched peer %s: drained; stopping", self.name)
        self.stop()
        return True

    async def _pass(self) -> list[str]:
        port, left = self.port, []
        siblings = list(port.siblings())
        if not siblings:
            return ["no live sibling to take the load"]
        for stream, others in port.led_streams():
            target = next((o for o in others if bytes.fromhex(o) in siblings), None)
            if target is None:
                left.append(f"stream {stream}: no live in-sync replica to lead it")
                continue
            await self._try(left, f"stream {stream}", port.hand_over_stream(stream, target))
        for fragment, _inputs, allowed in port.handover_fragments():
            chosen = next((s for s in siblings if s in allowed), None)
            if chosen is None:
                left.append(f"fragment {fragment}: no live in-sync replica of its inputs")
                continue
            await self._try(left, f"fragment {fragment}", self._move(fragment, chosen))
        for fragment, _inputs in port.movable_fragments():
            await self._try(left, f"fragment {fragment}", self._move(fragment, siblings[0]))
        left.extend(port.unmovable())
        if port.moving():  # a sibling's move into this peer: stopping now would leave it in doubt
            left.append("a move into this peer is under way")
        return left

    async def _move(self, fragment: str, target: bytes) -> object:
        return await self.port.move_fragment(
            fragment, target, contract=SIBLING, load=0.0, price=0.0
        )

    @staticmethod
    async def _try(left: list[str], what: str, step: Any) -> None:
        try:
            await step
        except FedstreamError as exc:
            left.append(f"{what}: {exc}")

    def status(self) -> DrainStatus:
        return {"launched_as": self.name, "draining": self.draining, "left": list(self.left)}
