"""A replica's epoch history: which epoch wrote which stretch of its log (pure).

The history is a tuple of :class:`EpochStart` ``(epoch, start)``, epochs strictly rising and
starts never falling: epoch ``e`` owns the offsets from its start up to the next entry's start
minus one (the last entry owns everything up to the log end). A primary records its epoch's
start when it takes office, even if it then writes nothing, so two entries may share a start
(an empty epoch); a follower records an epoch when the first entry of that epoch reaches it.

Two replicas that both hold entries of epoch ``e`` got them from the one primary of ``e``, so
their logs agree up to the smaller of their two ends of ``e``: :func:`end_of` is the question a
follower asks its new primary (``EpochEnd``) to find where its log stops agreeing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

__all__ = [
    "EpochStart",
    "History",
    "check_history",
    "end_of",
    "epoch_at",
    "last_epoch",
    "truncated",
    "with_entry",
]


@dataclass(frozen=True, order=True)
class EpochStart:
    """Epoch ``epoch`` wrote its first entry (or would have) at offset ``start``."""

    epoch: int
    start: int

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 1:
            raise ValueError(f"an epoch history's epoch must be an int >= 1, not {self.epoch!r}")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise ValueError(f"epoch {self.epoch}'s start must be an int >= 0, not {self.start!r}")


History = tuple[EpochStart, ...]


def check_history(entries: Iterable[EpochStart], log_end: int) -> History:
    """The entries as a history, or ValueError naming the first entry out of order."""
    history = tuple(entries)
    for before, after in pairwise(history):
        if after.epoch <= before.epoch or after.start < before.start:
            raise ValueError(f"epoch history out of order: {before} then {after}")
    if history and history[0].start != 0 and log_end >= 0:
        # Offsets below the first start would belong to no epoch.
        raise ValueError(f"epoch history starts at {history[0].start}, but the log holds offset 0")
    if history and history[-1].start > log_end + 1:
        raise ValueError(f"epoch history entry {history[-1]} lies beyond log end {log_end} + 1")
    return history


def last_epoch(history: History) -> int:
    """The latest epoch in the history (0 for an empty one)."""
    return history[-1].epoch if history else 0


def end_of(history: History, log_end: int, epoch: int) -> tuple[int, int]:
    """``(e, end)``: the largest epoch ``e <= epoch`` in the history and the last offset it
    owns (``log_end`` for the latest epoch); ``(0, -1)`` when the history has no such epoch."""
    for index in range(len(history) - 1, -1, -1):
        if history[index].epoch <= epoch:
            if index == len(history) - 1:
                return history[index].epoch, log_end
            return history[index].epoch, history[index + 1].start - 1
    return 0, -1


def epoch_at(history: History, offset: int) -> int:
    """The epoch that wrote ``offset`` (of entries sharing a start, the last: the ones before
    it are empty). ValueError if no epoch of the history covers it."""
    for entry in reversed(history):
        if entry.start <= offset:
            return entry.epoch
    raise ValueError(f"offset {offset} precedes every epoch of the history")


def truncated(history: History, after: int) -> History:
    """The history of a log cut to end at ``after``: epochs that start later are gone."""
    return tuple(entry for entry in history if entry.start <= after)


def with_entry(history: History, epoch: int, offset: int) -> History:
    """The history once an entry of ``epoch`` is written at ``offset`` (the log's next one)."""
    latest = last_epoch(history)
    if epoch == latest:
        return history
    if epoch < latest:
        raise ValueError(f"an entry of epoch {epoch} at offset {offset} follows epoch {latest}")
    return (*history, EpochStart(epoch, offset))
