"""Failover decisions of the control plane's leader (pure).

The Raft leader hears a heartbeat from every peer (with its log end for each stream) and,
every round, asks :func:`failover_decisions` which streams need a new primary: those whose
primary has been silent for ``failover_after_s``. For each, :func:`choose_primary` picks the
live ISR member with the longest log end (ties: the earlier in the successor list). Every ISR
member holds every acknowledged entry, so any choice keeps them all; the longest log keeps
the most unacknowledged ones too. No live ISR member means no election: the stream waits
(electing a replica outside the ISR could lose acknowledged entries).

The decisions are proposed as :class:`~peer.control.commands.Elect` commands for the epoch they
were decided in, so one made on stale heartbeats is a no-op once anything has changed. Times
are monotonic seconds on the leader's machine; the driver seeds ``last_heard`` with the moment
it took office, so a new leader gives every peer a full ``failover_after_s`` to be heard.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from peer.control.commands import Elect
from peer.control.state import StreamState

__all__ = ["choose_primary", "failover_decisions", "live_nodes"]


def choose_primary(
    stream: StreamState, log_ends: Mapping[str, int], live: Collection[str]
) -> str | None:
    """The live ISR member with the longest log end (unknown: -1), or None if none lives."""
    best: str | None = None
    best_end = -2
    for node in stream.in_sync:  # in replica order, so a tie goes to the earlier
        if node in live and log_ends.get(node, -1) > best_end:
            best, best_end = node, log_ends.get(node, -1)
    return best


def live_nodes(last_heard: Mapping[str, float], now: float, failover_after_s: float) -> set[str]:
    """The nodes heard from within ``failover_after_s`` of ``now``."""
    return {node for node, heard in last_heard.items() if now - heard < failover_after_s}


def failover_decisions(
    streams: Iterable[StreamState],
    last_heard: Mapping[str, float],
    now: float,
    failover_after_s: float,
    log_ends: Mapping[str, Mapping[str, int]],
) -> list[Elect]:
    """One ``Elect`` for each of ``streams`` (the control plane's states) whose primary is
    silent and has a live ISR member.
    ``log_ends[stream][node]`` is the log end ``node`` last reported for ``stream``."""
    live = live_nodes(last_heard, now, failover_after_s)
    decisions = []
    for stream in streams:
        if stream.primary in live:
            continue
        candidates = live - {stream.primary}
        choice = choose_primary(stream, log_ends.get(stream.name, {}), candidates)
        if choice is not None:
            decisions.append(Elect(stream.name, stream.epoch, choice))
    return decisions
