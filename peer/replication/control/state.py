"""The control plane's state machine: who leads which stream, in which epoch, with which
in-sync set (pure; a Raft library replicates it).

Theory of operation
-------------------
Voters replicate a log of :mod:`~peer.replication.control.commands` with Raft; every voter applies
the committed commands, in log order, to its own :class:`ControlState`. :meth:`ControlState.apply`
reads nothing but the state and the command (no clock, no randomness, no iteration over an
unordered set), so every voter holds the same state after the same prefix of the log.

For each stream the state holds ``epoch``, ``primary``, ``replicas`` (the successor list),
``in_sync`` (the ISR, in replica order), the requested ``min_insync``, a ``version`` that
rises by one with every change, and ``anchor``: None, or the name of the stream it is anchored
to. An anchored stream (a query fragment's results, its checkpoints) must keep the same primary
as its anchor (the fragment's input), so all of them fail over together; the state only records
the anchor, the failover decisions (:mod:`peer.replication.control.failover`) act on it.

Commands are decided by a peer on what it knew then, and a command decided on stale knowledge
is a no-op with a reason (:class:`Applied`):

- ``CreateStream``: epoch 1, the first replica leads, and every replica is in sync (they all
  hold the empty log, so each holds every acknowledged entry). It records its ``anchor`` as
  given: an anchored stream's creator passes the anchor's replicas with its primary first. The
  anchor need not exist (a stream whose anchor is missing fails over on its own).
- ``DropStream`` removes the stream (a stream anchored to it keeps naming it, and so fails over
  on its own until a stream of that name exists again). A name dropped and created again
  starts afresh at epoch 1 and version 1.
- ``Elect`` holds only in the epoch it was decided in, and only for an ISR member other than the
  primary. The new epoch's ISR is the old one without the deposed primary: it is the
  member known to be unreachable, and every other member holds every acknowledged entry.
- ``ShrinkIsr`` / ``ExpandIsr`` (proposed by the primary) hold only in their epoch and at their
  version, so a proposal delivered twice, or after the ISR changed, cannot undo a later change
  (an ``ExpandIsr`` re-applied after a ``ShrinkIsr`` would let a member lacking acknowledged
  entries back into the ISR). The primary never leaves the ISR.
- ``SetReplicas`` holds only at its version and must keep the primary; members that leave the
  successor list leave the ISR.
- ``SetStandby`` names the ISR member that runs warm standbys of the stream's fragments
  (:mod:`peer.replication.standby`); it holds only in its epoch, for an ISR member other than
  the primary (or None). A standby that leaves the ISR, or becomes primary, is no longer one:
  every change that does so clears it.

Beside the streams, the state holds each elastic participant's :class:`BurstState`: its burst
leader, in a ``term`` that rises with every claim, the ``--elastic MIN:MAX`` bounds the leader
claimed with, and the names of the peers its leaders have launched. ``ClaimBurst`` holds only
in the term it was decided in (two peers claiming on what they both saw: one wins);
``PlanBurst`` only in its term and at its version, and with at most ``maximum - 1`` names. A
deposed leader's plan is thus a no-op: two leaders cannot both act.

Invariants (tests/unit/test_control_state.py): the primary is in the ISR; the ISR is drawn from
the replicas; the standby, if any, is an ISR member other than the primary; while a stream
exists, its epoch and version never fall.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from peer.replication.control.commands import (
    BurstCommand,
    ClaimBurst,
    Command,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    PlanBurst,
    SetReplicas,
    SetStandby,
    ShrinkIsr,
)

__all__ = ["Applied", "BurstState", "ControlState", "StreamState"]


@dataclass(frozen=True)
class StreamState:
    """One stream as the control plane has decided it."""

    name: str
    epoch: int
    primary: str
    replicas: tuple[str, ...]
    in_sync: tuple[str, ...]
    min_insync: int
    version: int
    anchor: str | None = None  # the stream this one fails over with (see the module docstring)
    wanted: int | None = None  # the replicas asked for (None: as many as it has)
    standby: str | None = None  # the ISR member running the fragments' warm standbys

    @property
    def under_replicated(self) -> bool:
        """Whether some of the stream's replicas are out of its in-sync set."""
        return len(self.in_sync) < len(self.replicas)

    @property
    def asked(self) -> int:
        """How many replicas the stream asked for."""
        return len(self.replicas) if self.wanted is None else max(self.wanted, len(self.replicas))

    @property
    def missing(self) -> int:
        """How many replicas it lacks of those it asked for (peers were too few)."""
        return self.asked - len(self.replicas)

    @property
    def required_insync(self) -> int:
        """``min_insync``, but never more than the replicas the stream has been given."""
        return min(self.min_insync, len(self.replicas))


@dataclass(frozen=True)
class BurstState:
    """One elastic participant's burst leader, and the peers its leaders have launched."""

    participant: str
    leader: str
    term: int
    minimum: int
    maximum: int
    launched: tuple[str, ...] = ()
    version: int = 1  # rises by one with every change


@dataclass(frozen=True)
class Applied:
    """What applying one command did: ``ok`` if it changed the state, else ``reason``."""

    command: Command
    ok: bool
    reason: str = ""


class ControlState:
    """The replicated state: every stream's epoch, primary, replicas and ISR."""

    def __init__(self) -> None:
        self._streams: dict[str, StreamState] = {}
        self._bursts: dict[str, BurstState] = {}
        self.applied = 0  # commands applied (no-ops included): the log index reached

    @classmethod
    def restore(
        cls, streams: Iterable[StreamState], applied: int, bursts: Iterable[BurstState] = ()
    ) -> ControlState:
        """The state a snapshot holds: exactly ``streams`` and ``bursts``, after ``applied``
        commands."""
        state = cls()
        state._streams = {s.name: s for s in streams}
        state._bursts = {b.participant: b for b in bursts}
        state.applied = applied
        return state

    def stream(self, name: str) -> StreamState | None:
        return self._streams.get(name)

    def streams(self) -> Iterator[StreamState]:
        """Every stream, by name."""
        for name in sorted(self._streams):
            yield self._streams[name]

    def snapshot(self) -> tuple[StreamState, ...]:
        """Every stream's state, comparable between voters."""
        return tuple(self.streams())

    def burst(self, participant: str) -> BurstState | None:
        return self._bursts.get(participant)

    def bursts(self) -> tuple[BurstState, ...]:
        """Every elastic participant's burst state, by participant."""
        return tuple(self._bursts[p] for p in sorted(self._bursts))

    def apply(self, command: Command) -> Applied:
        """Apply one committed command; a stale or inapplicable one changes nothing."""
        self.applied += 1
        if isinstance(command, ClaimBurst | PlanBurst):
            return self._burst(command)
        if isinstance(command, CreateStream):
            return self._create(command)
        current = self._streams.get(command.name)
        if current is None:
            return Applied(command, False, f"no stream {command.name!r}")
        if isinstance(command, DropStream):
            del self._streams[command.name]
            return Applied(command, True)
        if isinstance(command, Elect):
            outcome = self._elect(current, command)
        elif isinstance(command, ShrinkIsr | ExpandIsr):
            outcome = self._change_isr(current, command)
        elif isinstance(command, SetReplicas):
            outcome = self._set_replicas(current, command)
        elif isinstance(command, SetStandby):
            outcome = self._set_standby(current, command)
        else:  # pragma: no cover - the Command union is closed
            raise TypeError(f"not a control-plane command: {command!r}")
        if isinstance(outcome, str):
            return Applied(command, False, outcome)
        if outcome.standby is not None and (
            outcome.standby == outcome.primary or outcome.standby not in outcome.in_sync
        ):
            outcome = replace(outcome, standby=None)  # promoted, or out of the ISR
        self._streams[command.name] = replace(outcome, version=current.version + 1)
        return Applied(command, True)

    # ----------------------------------------------------------------------- commands

    def _burst(self, command: BurstCommand) -> Applied:
        current = self._bursts.get(command.participant)
        term = 0 if current is None else current.term
        if command.term != term:
            return Applied(
                command, False, f"decided in term {command.term}; {command.participant!r}"
                f" is in term {term}",
            )  # fmt: skip
        if isinstance(command, ClaimBurst):
            launched = () if current is None else current.launched
            version = 0 if current is None else current.version
            self._bursts[command.participant] = BurstState(
                command.participant, command.node, term + 1, command.minimum,
                command.maximum, launched, version + 1,
            )  # fmt: skip
            return Applied(command, True)
        assert current is not None  # term >= 1 was checked against it
        if command.version != current.version:
            return Applied(
                command, False, f"decided at version {command.version};"
                f" {command.participant!r} is at version {current.version}",
            )  # fmt: skip
        if len(command.launched) > current.maximum - 1:
            return Applied(
                command, False, f"{len(command.launched)} launched peers and the one started"
                f" by hand exceed {command.participant!r}'s maximum {current.maximum}",
            )  # fmt: skip
        self._bursts[command.participant] = replace(
            current, launched=command.launched, version=current.version + 1
        )
        return Applied(command, True)

    def _create(self, command: CreateStream) -> Applied:
        if command.name in self._streams:
            return Applied(command, False, f"stream {command.name!r} exists")
        self._streams[command.name] = StreamState(
            name=command.name,
            epoch=1,
            primary=command.replicas[0],
            replicas=command.replicas,
            in_sync=command.replicas,
            min_insync=command.min_insync,
            version=1,
            anchor=command.anchor,
            wanted=command.wanted,
        )
        return Applied(command, True)

    @staticmethod
    def _elect(current: StreamState, command: Elect) -> StreamState | str:
        if command.epoch != current.epoch:
            return f"decided in epoch {command.epoch}; {current.name!r} is in epoch {current.epoch}"
        if command.primary == current.primary:
            return f"{command.primary} already leads {current.name!r}"
        if command.primary not in current.in_sync:
            return f"{command.primary} is not in {current.name!r}'s ISR {current.in_sync}"
        in_sync = tuple(n for n in current.in_sync if n != current.primary)
        return replace(current, epoch=current.epoch + 1, primary=command.primary, in_sync=in_sync)

    @staticmethod
    def _change_isr(current: StreamState, command: ShrinkIsr | ExpandIsr) -> StreamState | str:
        if command.epoch != current.epoch or command.version != current.version:
            return (
                f"decided at epoch {command.epoch} version {command.version}; {current.name!r}"
                f" is at epoch {current.epoch} version {current.version}"
            )
        if isinstance(command, ShrinkIsr):
            if command.node == current.primary:
                return f"the primary {command.node} stays in {current.name!r}'s ISR"
            if command.node not in current.in_sync:
                return f"{command.node} is not in {current.name!r}'s ISR"
            members = set(current.in_sync) - {command.node}
        else:
            if command.node not in current.replicas:
                return f"{command.node} is not a replica of {current.name!r}"
            if command.node in current.in_sync:
                return f"{command.node} is in {current.name!r}'s ISR already"
            members = set(current.in_sync) | {command.node}
        in_sync = tuple(n for n in current.replicas if n in members)
        return replace(current, in_sync=in_sync)

    @staticmethod
    def _set_standby(current: StreamState, command: SetStandby) -> StreamState | str:
        if command.epoch != current.epoch:
            return f"decided in epoch {command.epoch}; {current.name!r} is in epoch {current.epoch}"
        node = command.standby
        if node == current.standby:
            return f"{node} is {current.name!r}'s standby already"
        if node is not None and (node == current.primary or node not in current.in_sync):
            return f"{node} is not an ISR member of {current.name!r} other than its primary"
        return replace(current, standby=node)

    @staticmethod
    def _set_replicas(current: StreamState, command: SetReplicas) -> StreamState | str:
        if command.version != current.version:
            return (
                f"decided at version {command.version}; {current.name!r} is at version"
                f" {current.version}"
            )
        if current.primary not in command.replicas:
            return f"the replicas of {current.name!r} must keep its primary {current.primary}"
        in_sync = tuple(n for n in command.replicas if n in current.in_sync)
        return replace(current, replicas=command.replicas, in_sync=in_sync)
