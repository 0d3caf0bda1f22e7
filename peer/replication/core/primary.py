"""The primary of one stream in one epoch (a sans-IO state machine).

Theory of operation
-------------------
The control plane names the primary of epoch E and the stream's in-sync set (ISR); the
primary keeps its own log end, the end each follower has reported *in this epoch* (a follower
only reports after reconciling, so its log up to that end is a prefix of the primary's), and
the acknowledged end (the high watermark).

Appending (:meth:`Primary.append`): a push whose ``(origin, seq)`` is not above the highest seq
the log holds for its origin is a duplicate, acknowledged once the current log end is. Otherwise
the primary refuses, retriably, if fewer than ``min_insync`` counted members (itself included)
exist or are reachable (not lagging); else it writes the entry at ``log_end + 1`` (the driver
fsyncs it first) and sends it to every follower that has taken everything before it.

Acknowledging: an offset is acknowledged once **every counted member** holds it and at least
``min_insync`` members are counted. The counted members are the ISR as last committed by the
control plane, plus a member whose expansion has been proposed but is not yet known to be
committed (Kafka's "maximal ISR"). So at every instant each member of the control plane's ISR
holds every acknowledged entry, and failover may pick any live ISR member without losing one.

The ISR changes only through the control plane, one proposal at a time (re-proposed every
``propose_retry_s`` until the primary learns the outcome through :meth:`Primary.on_isr`):

- *shrink*: a member lags when the oldest entry it lacks was appended more than
  ``replica_lag_s`` ago (entries older than this term count from its start). The primary
  proposes ``ShrinkIsr`` and **keeps waiting for the member** until the control plane has
  committed the smaller ISR: acknowledging without it earlier could leave an acknowledged
  entry missing on an ISR member that then wins an election.
- *expand*: a follower that holds everything acknowledged and everything the primary held when
  it took office (or took it again after a restart: its acknowledged end starts at -1, but
  every entry acknowledged before is in its log), and is not lagging, is proposed with
  ``ExpandIsr``; it is counted from the proposal on, so no entry is acknowledged without it
  in between.

Proposals carry the state ``version`` they were decided on, and the control plane applies a
proposal only at that version, so a late duplicate is a no-op. A version above the proposal's
therefore settles it either way, and the pending proposal is dropped.

Catching up: followers behind the log end are sent ranges (:class:`Ship`, at most ``max_ship``
entries, built by the driver from its log with :meth:`Primary.entry_message`) when they report
an end, and again every ``resend_s`` while they stay behind; a follower whose end is not known
in this epoch gets each new entry, and a :class:`Probe` every ``resend_s``, which make it
reconcile and report its end (even when the primary's log is empty, so that a follower can be
taken into the ISR before anything can be acknowledged).

Deposed: a reply, question or control-plane update naming a higher epoch means a new primary
exists; from then on this one refuses every push (retriable) and acknowledges nothing more.

Handing over (:meth:`Primary.hand_over`, a planned move of the primary role, Stormy's master
hand-over): the primary stops taking pushes (refused, retriable: the clients retry them with
the same ids, at the new primary), so its log stops growing; once the target, an ISR member,
holds the whole log and all of it is acknowledged, :attr:`Progress.hand_to` names the target
and the driver asks the control plane to ``Elect`` it in this epoch. The election deposes this
primary as any election does. Nothing acknowledged can be lost, whenever either side crashes:
the target is elected only while in the ISR, and every ISR member holds every acknowledged
entry. A hand-over that does not complete within ``handover_timeout_s`` (the target is gone,
or left the ISR) is called off and pushes are taken again.

Time is passed in (monotonic seconds); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from peer.replication.core.history import EpochStart, History, check_history, end_of, epoch_at
from peer.replication.core.history import last_epoch as history_last_epoch
from peer.replication.core.messages import (
    AppendReply,
    Effect,
    EpochEnd,
    EpochEndReply,
    Probe,
    Refusal,
    ReplicaAppend,
    SaveEpoch,
    SaveHistory,
    Seed,
    WriteEntry,
)

__all__ = [
    "Appended",
    "Duplicate",
    "IsrProposal",
    "Outgoing",
    "Primary",
    "Progress",
    "PushRefusal",
    "Refused",
    "Ship",
    "begin_epoch",
]


class PushRefusal(StrEnum):
    NOT_PRIMARY = "not_primary"
    HANDING_OVER = "handing_over"
    TOO_FEW_IN_SYNC = "too_few_in_sync"
    TOO_FEW_REACHABLE = "too_few_reachable"


@dataclass(frozen=True)
class Outgoing:
    """Send ``message`` to replica ``to``."""

    to: str
    message: ReplicaAppend | Probe


@dataclass(frozen=True)
class Ship:
    """Send replica ``to`` the entries ``first..last`` of the log (see ``entry_message``)."""

    to: str
    first: int
    last: int


@dataclass(frozen=True)
class IsrProposal:
    """Ask the control plane to shrink or expand the ISR by ``node``, decided at ``version``."""

    action: Literal["shrink", "expand"]
    node: str
    epoch: int
    version: int


@dataclass(frozen=True)
class Appended:
    """The push was written at ``offset``: perform ``effects``, send ``messages``, and answer
    the push once ``acknowledged >= offset`` (it may be already). If the write fails, this
    primary no longer matches its disk: the driver drops it (and steps down)."""

    offset: int
    effects: tuple[Effect, ...]
    messages: tuple[Outgoing, ...]
    acknowledged: int


@dataclass(frozen=True)
class Duplicate:
    """The push's (origin, seq) is in the log already, at or below ``covered_through``:
    answer it once ``acknowledged >= covered_through``."""

    covered_through: int


@dataclass(frozen=True)
class Refused:
    """The push was not written; the client may retry it (with the same id) if retriable."""

    reason: PushRefusal
    detail: str
    retriable: bool = True


@dataclass(frozen=True)
class Progress:
    """What a step changed: the acknowledged end and the offsets it newly covers, ranges to
    send, proposals for the control plane, whether the primary learnt it is deposed, and
    messages (probes) to send; ``hand_to``: a hand-over is ready, elect this member now."""

    acknowledged: int
    newly_acknowledged: range = range(0)
    ships: tuple[Ship, ...] = ()
    proposals: tuple[IsrProposal, ...] = ()
    deposed: bool = False
    messages: tuple[Outgoing, ...] = ()
    hand_to: str | None = None


def begin_epoch(history: History, epoch: int, log_end: int) -> tuple[History, tuple[Effect, ...]]:
    """What a replica does before it serves as primary of ``epoch``: fence lower epochs and
    record the epoch's start (``log_end + 1``) in its history, unless it did already (it
    restarted in office). Returns the history to build the :class:`Primary` with, and the
    effects to perform first."""
    latest = history_last_epoch(history)
    if latest > epoch:
        raise ValueError(f"a replica that has seen epoch {latest} cannot lead epoch {epoch}")
    if latest == epoch:
        return history, (SaveEpoch(epoch),)
    history = (*history, EpochStart(epoch, log_end + 1))
    return history, (SaveEpoch(epoch), SaveHistory(history))


@dataclass
class _Peer:
    end: int | None = None  # its log end reported in this epoch (None: not yet)
    sent_through: int = -1  # the highest offset sent to it since its last report
    sent_at: float = -math.inf


@dataclass
class _Pending:
    proposal: IsrProposal
    proposed_at: float


class Primary:
    """The primary of ``stream`` on ``node`` in ``epoch``."""

    def __init__(
        self,
        stream: str,
        node: str,
        *,
        epoch: int,
        version: int,
        replicas: Iterable[str],
        in_sync: Iterable[str],
        min_insync: int,
        log_end: int,
        history: History,
        now: float,
        seqs: Mapping[str, int] | None = None,
        replica_lag_s: float = 1.0,
        resend_s: float = 0.2,
        propose_retry_s: float = 0.5,
        max_ship: int = 64,
        handover_timeout_s: float = 5.0,
    ) -> None:
        self.stream = stream
        self.node = node
        self.epoch = epoch
        self.version = version
        self.replicas = tuple(replicas)
        self.in_sync = tuple(in_sync)
        self._check_members(self.replicas, self.in_sync)
        if min_insync < 1 or max_ship < 1 or log_end < -1:
            raise ValueError(
                f"primary of {stream!r}: min_insync {min_insync}, max_ship {max_ship} and"
                f" log end {log_end} must be >= 1, >= 1 and >= -1"
            )
        self.min_insync = min_insync
        self.log_end = log_end
        self.history = check_history(history, log_end)
        if history_last_epoch(self.history) != epoch:
            raise ValueError(
                f"primary of {stream!r} in epoch {epoch}: its history does not end with its"
                " epoch start (see begin_epoch)"
            )
        self.epoch_start = self.history[-1].start
        # What this primary held when it took office (or took it again after a restart): it
        # includes every acknowledged entry, though which ones those are is not known here.
        self.held_at_start = log_end
        self.started_at = now
        self.acknowledged = -1
        self.deposed = False
        self.replica_lag_s = replica_lag_s
        self.resend_s = resend_s
        self.propose_retry_s = propose_retry_s
        self.max_ship = max_ship
        self.handover_timeout_s = handover_timeout_s
        self.handing_to: str | None = None  # the member a hand-over goes to
        self._handing_since = 0.0
        self._seqs = dict(seqs or {})
        self._peers = {n: _Peer() for n in self.replicas if n != node}
        self._appended_at: dict[int, float] = {}
        self._pending: _Pending | None = None

    # ----------------------------------------------------------------------- pushes

    def append(
        self, body: bytes, *, origin: str | None = None, seq: int | None = None, now: float
    ) -> Appended | Duplicate | Refused:
        """Take a push. See the class's theory of operation for the three outcomes."""
        if self.deposed:
            return Refused(PushRefusal.NOT_PRIMARY, f"{self.node} no longer leads {self.stream!r}")
        if origin is not None and seq is not None and seq <= self._seqs.get(origin, -1):
            return Duplicate(self.log_end)
        if self.handing_to is not None:
            return Refused(
                PushRefusal.HANDING_OVER,
                f"{self.node} is handing {self.stream!r} over to {self.handing_to}",
            )
        counted = self.counted()
        if len(counted) < self.min_insync:
            return Refused(
                PushRefusal.TOO_FEW_IN_SYNC,
                f"stream {self.stream!r} has {len(counted)} in-sync replicas"
                f" ({', '.join(counted)}); {self.min_insync} needed",
            )
        reachable = [n for n in counted if n == self.node or not self.lagging(n, now)]
        if len(reachable) < self.min_insync:
            return Refused(
                PushRefusal.TOO_FEW_REACHABLE,
                f"stream {self.stream!r}: {len(reachable)} in-sync replicas reachable"
                f" ({', '.join(reachable)}); {self.min_insync} needed",
            )
        offset = self.log_end + 1
        self.log_end = offset
        self._appended_at[offset] = now
        if origin is not None and seq is not None:
            self._seqs[origin] = seq
        message = self.entry_message(offset, body, origin, seq)
        outgoing = []
        for name, peer in self._peers.items():
            streaming = peer.end is not None and peer.sent_through == offset - 1
            probing = peer.end is None and now - peer.sent_at >= self.resend_s
            if streaming or probing:
                outgoing.append(Outgoing(name, message))
                peer.sent_at = now
                if streaming:
                    peer.sent_through = offset
        self._advance()
        return Appended(
            offset,
            (WriteEntry(offset, self.epoch, body, origin, seq),),
            tuple(outgoing),
            self.acknowledged,
        )

    def hand_over(self, to: str, now: float) -> Progress:
        """Begin handing this stream over to ``to`` (see the theory of operation); the
        progress names it in ``hand_to`` at once if it holds everything already. ValueError
        if ``to`` is not another member of the ISR, or this primary is deposed."""
        if self.deposed:
            raise ValueError(f"{self.node} no longer leads {self.stream!r}")
        if to == self.node or to not in self.in_sync:
            raise ValueError(
                f"stream {self.stream!r} can be handed over only to another ISR member"
                f" ({', '.join(n for n in self.in_sync if n != self.node) or 'none'}), not {to}"
            )
        self.handing_to, self._handing_since = to, now
        return self._progress()

    def entry_message(
        self, offset: int, body: bytes, origin: str | None = None, seq: int | None = None
    ) -> ReplicaAppend:
        """The append carrying the log's entry at ``offset`` (for a :class:`Ship`)."""
        if not 0 <= offset <= self.log_end:
            raise ValueError(
                f"offset {offset} is not in {self.stream!r}'s log (end {self.log_end})"
            )
        entry_epoch = epoch_at(self.history, offset)
        return ReplicaAppend(self.stream, self.epoch, offset, entry_epoch, body, origin, seq)

    # ----------------------------------------------------------------------- replicas

    def on_reply(self, reply: AppendReply, now: float) -> Progress:
        """A follower's answer to an append."""
        self._check_stream(reply.stream)
        if self._fenced_by(reply.epoch):
            return self._progress()
        peer = self._peers.get(reply.node)
        if (
            reply.epoch < self.epoch
            or peer is None
            or reply.refused is Refusal.STALE_EPOCH
            or reply.log_end > self.log_end
        ):
            # Stale, from a stranger, or not a prefix of our log (a protocol violation).
            return self._progress()
        if not reply.accepted and reply.log_end < (peer.end if peer.end is not None else -1):
            return self._progress()
        peer.end = max(peer.end if peer.end is not None else -1, reply.log_end)
        if not reply.accepted or peer.sent_through < peer.end:
            peer.sent_through = peer.end  # a gap (or news): resend from its end
        ships = []
        if peer.end < self.log_end and peer.sent_through == peer.end:
            ships.append(self._ship(reply.node, peer, now))
        newly = self._advance()
        return self._progress(newly, ships, self._propose(now))

    def fence(self, append: ReplicaAppend | Probe | Seed) -> AppendReply | None:
        """An append (or probe) reached this primary. From its own epoch or an older one it
        is refused (``STALE_EPOCH``); from a newer one it deposes this primary, and None says
        so: the driver steps down and hands it to a :class:`~peer.replication.Follower`."""
        self._check_stream(append.stream)
        if self._fenced_by(append.epoch):
            return None
        return AppendReply(self.stream, self.epoch, self.node, self.log_end, Refusal.STALE_EPOCH)

    def on_epoch_end(self, request: EpochEnd) -> EpochEndReply | None:
        """A follower of our epoch asks where its last epoch ends in our log."""
        self._check_stream(request.stream)
        if self._fenced_by(request.epoch) or request.epoch < self.epoch:
            return None
        last, end = end_of(self.history, self.log_end, request.last_epoch)
        return EpochEndReply(self.stream, self.epoch, last, end)

    def on_isr(
        self,
        epoch: int,
        version: int,
        in_sync: Iterable[str],
        *,
        replicas: Iterable[str] | None = None,
        min_insync: int | None = None,
    ) -> Progress:
        """The control plane's committed state of the stream (as of ``version``)."""
        if self._fenced_by(epoch):
            return self._progress()
        if epoch < self.epoch or version <= self.version:
            return self._progress()
        new_replicas = self.replicas if replicas is None else tuple(replicas)
        new_in_sync = tuple(in_sync)
        self._check_members(new_replicas, new_in_sync)
        self.version, self.replicas, self.in_sync = version, new_replicas, new_in_sync
        for name in new_replicas:
            if name != self.node:
                self._peers.setdefault(name, _Peer())
        for name in list(self._peers):
            if name not in new_replicas:
                del self._peers[name]
        if min_insync is not None:
            self.min_insync = min_insync
        if self.handing_to is not None and self.handing_to not in new_in_sync:
            self.handing_to = None  # the target left the ISR: it can no longer be elected
        # Our pending proposal was decided at an older version: it took effect or never will.
        self._pending = None
        return self._progress(self._advance())

    def tick(self, now: float) -> Progress:
        """Time passed: resend to followers still behind, and propose ISR changes."""
        if self.deposed:
            return self._progress()
        if self.handing_to is not None and now - self._handing_since > self.handover_timeout_s:
            self.handing_to = None  # called off: the target never caught up
        ships = []
        probes = []
        for name, peer in self._peers.items():
            if now - peer.sent_at < self.resend_s:
                continue
            if peer.end is None:
                probes.append(Outgoing(name, Probe(self.stream, self.epoch)))
                peer.sent_at = now
            elif peer.end < self.log_end:
                peer.sent_through = peer.end
                ships.append(self._ship(name, peer, now))
        return self._progress(self._advance(), ships, self._propose(now), probes)

    # ----------------------------------------------------------------------- decisions

    def counted(self) -> tuple[str, ...]:
        """The members an acknowledgement waits for: the committed ISR, plus a member whose
        expansion is proposed and not yet settled."""
        pending = self._pending
        expanding = pending is not None and pending.proposal.action == "expand"
        if pending is not None and expanding and pending.proposal.node not in self.in_sync:
            return (*self.in_sync, pending.proposal.node)
        return self.in_sync

    def end_of_member(self, node: str) -> int:
        """The log end ``node`` has reported in this epoch (-1 if none); ours for us."""
        if node == self.node:
            return self.log_end
        peer = self._peers.get(node)
        return -1 if peer is None or peer.end is None else peer.end

    def lagging(self, node: str, now: float) -> bool:
        """Whether the oldest entry ``node`` lacks was appended over ``replica_lag_s`` ago."""
        missing = self.end_of_member(node) + 1
        if missing > self.log_end:
            return False
        since = self._appended_at.get(missing, self.started_at)
        return now - since > self.replica_lag_s

    def _advance(self) -> range:
        counted = self.counted()
        if len(counted) < self.min_insync:
            return range(0)
        candidate = min(self.end_of_member(n) for n in counted)
        if candidate <= self.acknowledged:
            return range(0)
        newly = range(self.acknowledged + 1, candidate + 1)
        self.acknowledged = candidate
        for offset in [o for o in self._appended_at if o <= candidate]:
            del self._appended_at[offset]
        return newly

    def _propose(self, now: float) -> tuple[IsrProposal, ...]:
        if self.deposed:
            return ()
        pending = self._pending
        if pending is not None:
            if now - pending.proposed_at < self.propose_retry_s:
                return ()
            pending.proposed_at = now
            return (pending.proposal,)
        proposal = None
        for name in self.in_sync:
            if name != self.node and self.lagging(name, now):
                proposal = IsrProposal("shrink", name, self.epoch, self.version)
                break
        else:
            floor = max(self.acknowledged, self.held_at_start)
            for name in self.replicas:
                peer = self._peers.get(name)
                if name in self.in_sync or peer is None or peer.end is None:
                    continue
                if peer.end >= floor and not self.lagging(name, now):
                    proposal = IsrProposal("expand", name, self.epoch, self.version)
                    break
        if proposal is None:
            return ()
        self._pending = _Pending(proposal, now)
        return (proposal,)

    # ----------------------------------------------------------------------- helpers

    def _ship(self, name: str, peer: _Peer, now: float) -> Ship:
        first = peer.sent_through + 1
        last = min(self.log_end, first + self.max_ship - 1)
        peer.sent_through = last
        peer.sent_at = now
        return Ship(name, first, last)

    def _fenced_by(self, epoch: int) -> bool:
        if epoch > self.epoch:
            self.deposed = True
        return self.deposed

    def _progress(
        self,
        newly: range = range(0),
        ships: Iterable[Ship] = (),
        proposals: tuple[IsrProposal, ...] = (),
        messages: Iterable[Outgoing] = (),
    ) -> Progress:
        # the target is counted (an ISR member while it is the target), so it holds all
        # that is acknowledged: a hand-over is ready once everything is
        to = self.handing_to
        ready = to is not None and not self.deposed and self.acknowledged == self.log_end
        return Progress(
            self.acknowledged,
            newly,
            tuple(ships),
            proposals,
            self.deposed,
            tuple(messages),
            to if ready else None,
        )

    def _check_members(self, replicas: tuple[str, ...], in_sync: tuple[str, ...]) -> None:
        if self.node not in in_sync:
            raise ValueError(f"{self.node} leads {self.stream!r} but is not in its ISR {in_sync}")
        if not set(in_sync) <= set(replicas) or len(set(replicas)) != len(replicas):
            raise ValueError(
                f"stream {self.stream!r}: ISR {in_sync} must be drawn from distinct replicas"
                f" {replicas}"
            )

    def _check_stream(self, stream: str) -> None:
        if stream != self.stream:
            raise ValueError(
                f"a message for stream {stream!r} reached the primary of {self.stream!r}"
            )
