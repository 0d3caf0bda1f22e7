"""What replicas of a stream say to each other, and what they ask their driver to do (pure data).

Messages travel between the primary and its followers (their wire form belongs to
``peer.protocol.link``); effects are what a state machine asks its driver to perform on the
replica's disk, in the order given, each one durable (fsynced) before the next, and all of
them before the message returned with them is sent. Every constructor checks its fields and
names the first wrong one, so a hostile frame decoded into a message is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from peer.replication.core.history import History, check_history

__all__ = [
    "AppendReply",
    "Effect",
    "EpochEnd",
    "EpochEndReply",
    "Probe",
    "Refusal",
    "ReplicaAppend",
    "SaveEpoch",
    "SaveHistory",
    "Truncate",
    "WriteEntry",
]


def _check_int(owner: str, name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an int >= {minimum}, not {value!r}")


def _check_str(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{owner}.{name} must be a non-empty str, not {value!r}")


def _check_tag(owner: str, origin: object, seq: object) -> None:
    if origin is None and seq is None:
        return
    _check_str(owner, "origin", origin)
    _check_int(owner, "seq", seq, 0)


class Refusal(StrEnum):
    """Why a replica did not take an append."""

    #: Fencing: the sender's epoch is below the replica's; the sender has been deposed.
    STALE_EPOCH = "stale_epoch"
    #: The offset lies beyond the replica's log end + 1: resend from ``log_end + 1``.
    GAP = "gap"


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class ReplicaAppend:
    """Primary -> follower: hold ``body`` at ``offset``.

    ``epoch`` is the sender's epoch (what fencing compares); ``entry_epoch`` is the epoch that
    first wrote this entry (older than ``epoch`` when a follower catches up on old entries),
    which the follower records in its epoch history."""

    stream: str
    epoch: int
    offset: int
    entry_epoch: int
    body: bytes
    origin: str | None = None
    seq: int | None = None

    def __post_init__(self) -> None:
        _check_str("ReplicaAppend", "stream", self.stream)
        _check_int("ReplicaAppend", "epoch", self.epoch, 1)
        _check_int("ReplicaAppend", "offset", self.offset, 0)
        _check_int("ReplicaAppend", "entry_epoch", self.entry_epoch, 1)
        if self.entry_epoch > self.epoch:
            raise ValueError(
                f"ReplicaAppend.entry_epoch {self.entry_epoch} is above its epoch {self.epoch}"
            )
        if not isinstance(self.body, bytes):
            raise ValueError(f"ReplicaAppend.body must be bytes, not {type(self.body).__name__}")
        _check_tag("ReplicaAppend", self.origin, self.seq)


@dataclass(frozen=True)
class Probe:
    """Primary of ``epoch`` -> a follower whose log end it does not know in this epoch (and
    has no entry to send it, or no reason to): answer like an append, without an entry."""

    stream: str
    epoch: int

    def __post_init__(self) -> None:
        _check_str("Probe", "stream", self.stream)
        _check_int("Probe", "epoch", self.epoch, 1)


@dataclass(frozen=True)
class AppendReply:
    """Follower -> primary: the follower's ``log_end`` (fsynced) in its ``epoch``, and why it
    refused the append or probe, if it did (``refused is None``: accepted, or a duplicate it
    holds)."""

    stream: str
    epoch: int
    node: str
    log_end: int
    refused: Refusal | None = None

    def __post_init__(self) -> None:
        _check_str("AppendReply", "stream", self.stream)
        _check_int("AppendReply", "epoch", self.epoch, 0)
        _check_str("AppendReply", "node", self.node)
        _check_int("AppendReply", "log_end", self.log_end, -1)
        if self.refused is not None and not isinstance(self.refused, Refusal):
            raise ValueError(f"AppendReply.refused must be a Refusal or None, not {self.refused!r}")

    @property
    def accepted(self) -> bool:
        return self.refused is None


@dataclass(frozen=True)
class EpochEnd:
    """Follower -> primary of ``epoch``: where does ``last_epoch`` (the latest epoch of the
    follower's history) end in your log?"""

    stream: str
    epoch: int
    node: str
    last_epoch: int

    def __post_init__(self) -> None:
        _check_str("EpochEnd", "stream", self.stream)
        _check_int("EpochEnd", "epoch", self.epoch, 1)
        _check_str("EpochEnd", "node", self.node)
        _check_int("EpochEnd", "last_epoch", self.last_epoch, 0)
        if self.last_epoch > self.epoch:
            raise ValueError(f"EpochEnd.last_epoch {self.last_epoch} is above epoch {self.epoch}")


@dataclass(frozen=True)
class EpochEndReply:
    """Primary of ``epoch`` -> follower: ``last_epoch`` is the largest epoch of its history at
    or below the one asked about (0 if none), and ``end`` the last offset it owns (-1 if none)."""

    stream: str
    epoch: int
    last_epoch: int
    end: int

    def __post_init__(self) -> None:
        _check_str("EpochEndReply", "stream", self.stream)
        _check_int("EpochEndReply", "epoch", self.epoch, 1)
        _check_int("EpochEndReply", "last_epoch", self.last_epoch, 0)
        _check_int("EpochEndReply", "end", self.end, -1)
        if self.last_epoch > self.epoch:
            raise ValueError(
                f"EpochEndReply.last_epoch {self.last_epoch} is above epoch {self.epoch}"
            )


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Seed:
    """Primary of ``epoch`` -> a follower that lacks entries the primary trimmed already:
    start your log after ``through`` (what the primary trimmed), with the replay memory
    ``seqs`` ((origin, highest seq) of the trimmed entries) and the primary's epoch history
    of the entries through there. Answered like an append."""

    stream: str
    epoch: int
    through: int
    seqs: tuple[tuple[str, int], ...]
    history: History

    def __post_init__(self) -> None:
        _check_str("Seed", "stream", self.stream)
        _check_int("Seed", "epoch", self.epoch, 1)
        _check_int("Seed", "through", self.through, 0)
        for origin, seq in self.seqs:
            _check_tag("Seed", origin, seq)
        for start in self.history:
            if start.start > self.through or start.epoch > self.epoch:
                raise ValueError(f"Seed: history entry {start} beyond {self.through}/{self.epoch}")
        check_history(self.history, self.through)


@dataclass(frozen=True)
class SeedLog:
    """Start the log after ``through`` with the replay memory ``seqs`` (see :class:`Seed`)."""

    through: int
    seqs: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class WriteEntry:
    """Write the entry at ``offset`` (always the log's next offset) and fsync it."""

    offset: int
    entry_epoch: int
    body: bytes
    origin: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Truncate:
    """Remove every entry above offset ``after`` (-1: all of them), durably."""

    after: int


@dataclass(frozen=True)
class SaveEpoch:
    """Record durably that this replica has seen ``epoch``: it fences lower ones from now on,
    across restarts."""

    epoch: int


@dataclass(frozen=True)
class SaveHistory:
    """Replace the replica's durable epoch history."""

    history: History


Effect = WriteEntry | Truncate | SaveEpoch | SaveHistory | SeedLog
