"""The commands of the control plane's replicated log (pure data).

Each command is decided by one peer on what it knew then (an epoch, a state version) and
applied later by every voter in log order; :meth:`peer.replication.control.state.ControlState.apply`
turns a command decided on stale knowledge into a no-op. Constructors check every field and name the
first wrong one, so a malformed command never reaches the log.

``ClaimBurst`` and ``PlanBurst`` are not about streams: they name a participant's burst leader
(the one of its peers that grows and shrinks it, issue 28) and the peers that leader has
launched (:mod:`peer.elastic.leader`).

A stream created with an ``anchor`` (the name of another stream) fails over with it: the
failover decisions (:mod:`peer.replication.control.failover`) keep its primary on its anchor's
primary. ``DropStream`` removes a stream from the state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BurstCommand",
    "ClaimBurst",
    "Command",
    "CreateStream",
    "DropStream",
    "Elect",
    "ExpandIsr",
    "PlanBurst",
    "SetReplicas",
    "SetStandby",
    "ShrinkIsr",
]


def _check_name(owner: str, field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{owner}.{field} must be a non-empty str, not {value!r}")


def _check_int(owner: str, field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{field} must be an int >= {minimum}, not {value!r}")


def _check_replicas(owner: str, name: str, replicas: object) -> None:
    if not isinstance(replicas, tuple) or not replicas:
        raise ValueError(f"{owner}({name!r}).replicas must be a non-empty tuple, not {replicas!r}")
    for node in replicas:
        _check_name(owner, "replicas[]", node)
    if len(set(replicas)) != len(replicas):
        raise ValueError(f"{owner}({name!r}).replicas names a node twice: {replicas}")


@dataclass(frozen=True)
class CreateStream:
    """A new replicated stream: epoch 1, ``replicas[0]`` its primary, every replica in sync
    (all hold the empty log). With ``anchor`` (another stream's name) the stream follows that
    stream's primary; its creator passes the anchor's replicas, its current primary first.
    ``wanted``: the replicas asked for, when fewer peers lived than that (None: as many as
    given); the stream's primary adds replicas as peers join (control.repair)."""

    name: str
    replicas: tuple[str, ...]
    min_insync: int
    anchor: str | None = None
    wanted: int | None = None

    def __post_init__(self) -> None:
        _check_name("CreateStream", "name", self.name)
        _check_replicas("CreateStream", self.name, self.replicas)
        _check_int("CreateStream", "min_insync", self.min_insync, 1)
        if self.anchor is not None:
            _check_name("CreateStream", "anchor", self.anchor)
            if self.anchor == self.name:
                raise ValueError(f"CreateStream({self.name!r}).anchor must name another stream")
        if self.wanted is not None:
            _check_int("CreateStream", "wanted", self.wanted, len(self.replicas))


@dataclass(frozen=True)
class DropStream:
    """Remove the stream ``name`` from the state (a no-op if there is none)."""

    name: str

    def __post_init__(self) -> None:
        _check_name("DropStream", "name", self.name)


@dataclass(frozen=True)
class Elect:
    """Make ``primary`` (an ISR member) the primary of epoch ``epoch + 1``; decided in
    ``epoch``, a no-op in any other."""

    name: str
    epoch: int
    primary: str

    def __post_init__(self) -> None:
        _check_name("Elect", "name", self.name)
        _check_int("Elect", "epoch", self.epoch, 1)
        _check_name("Elect", "primary", self.primary)


@dataclass(frozen=True)
class ShrinkIsr:
    """Remove ``node`` from the ISR; decided in ``epoch`` at state ``version``."""

    name: str
    epoch: int
    version: int
    node: str

    def __post_init__(self) -> None:
        _check_name("ShrinkIsr", "name", self.name)
        _check_int("ShrinkIsr", "epoch", self.epoch, 1)
        _check_int("ShrinkIsr", "version", self.version, 1)
        _check_name("ShrinkIsr", "node", self.node)


@dataclass(frozen=True)
class ExpandIsr:
    """Add ``node`` (a replica that caught up) to the ISR; decided in ``epoch`` at state
    ``version``."""

    name: str
    epoch: int
    version: int
    node: str

    def __post_init__(self) -> None:
        _check_name("ExpandIsr", "name", self.name)
        _check_int("ExpandIsr", "epoch", self.epoch, 1)
        _check_int("ExpandIsr", "version", self.version, 1)
        _check_name("ExpandIsr", "node", self.node)


@dataclass(frozen=True)
class SetReplicas:
    """A peer joined or died for good: the stream's successor list becomes ``replicas``
    (which keeps the primary); decided at state ``version``."""

    name: str
    version: int
    replicas: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_name("SetReplicas", "name", self.name)
        _check_int("SetReplicas", "version", self.version, 1)
        _check_replicas("SetReplicas", self.name, self.replicas)


@dataclass(frozen=True)
class SetStandby:
    """``standby`` (an ISR member other than the primary) runs warm standbys of the fragments
    anchored to the stream, and is the one a failover elects; None: nobody does. Decided in
    ``epoch``, a no-op in any other."""

    name: str
    epoch: int
    standby: str | None = None

    def __post_init__(self) -> None:
        _check_name("SetStandby", "name", self.name)
        _check_int("SetStandby", "epoch", self.epoch, 1)
        if self.standby is not None:
            _check_name("SetStandby", "standby", self.standby)


@dataclass(frozen=True)
class ClaimBurst:
    """``node`` becomes ``participant``'s burst leader in term ``term + 1``: decided in term
    ``term`` (0: the participant has none yet), a no-op in any other, so of two peers claiming
    on what they both saw, one wins. ``minimum`` and ``maximum`` are the claimant's
    ``--elastic MIN:MAX``: the bounds its plans are held to."""

    participant: str
    node: str
    term: int
    minimum: int
    maximum: int

    def __post_init__(self) -> None:
        _check_name("ClaimBurst", "participant", self.participant)
        _check_name("ClaimBurst", "node", self.node)
        _check_int("ClaimBurst", "term", self.term, 0)
        _check_int("ClaimBurst", "minimum", self.minimum, 1)
        _check_int("ClaimBurst", "maximum", self.maximum, self.minimum)


@dataclass(frozen=True)
class PlanBurst:
    """``participant``'s launched peers are to be ``launched`` (names its provisioner starts):
    decided by the leader of ``term`` at ``version``, a no-op at any other (a deposed leader's
    plan never holds), and held under ``maximum - 1`` names (the participant keeps at least
    one peer started by hand)."""

    participant: str
    term: int
    version: int
    launched: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_name("PlanBurst", "participant", self.participant)
        _check_int("PlanBurst", "term", self.term, 1)
        _check_int("PlanBurst", "version", self.version, 1)
        if not isinstance(self.launched, tuple):
            raise ValueError(f"PlanBurst.launched must be a tuple, not {self.launched!r}")
        for name in self.launched:
            _check_name("PlanBurst", "launched[]", name)
        if len(set(self.launched)) != len(self.launched):
            raise ValueError(f"PlanBurst.launched names a peer twice: {self.launched}")


BurstCommand = ClaimBurst | PlanBurst

Command = (
    CreateStream
    | DropStream
    | Elect
    | ShrinkIsr
    | ExpandIsr
    | SetReplicas
    | SetStandby
    | ClaimBurst
    | PlanBurst
)
