"""Failover decisions of the control plane's leader (pure).

The Raft leader hears a heartbeat from every peer (with its log end for each stream) and,
every round, asks :func:`failover_decisions` which streams need a new primary: those whose
primary has been silent for ``failover_after_s``. For each, :func:`choose_primary` picks the
stream's ``standby`` if it is a live ISR member (it runs warm standbys of the fragments over the
stream, :mod:`peer.replication.standby`, which it promotes at once), else the live ISR member
with the longest log end (ties: the earlier in the successor list). Every ISR
member holds every acknowledged entry, so any choice keeps them all; the longest log keeps
the most unacknowledged ones too. No live ISR member means no election: the stream waits
(electing a replica outside the ISR could lose acknowledged entries).

Anchors. A stream S whose ``anchor`` names a stream A present among the streams (a query
fragment's result or checkpoint stream, anchored to the fragment's input A) must have A's
primary, so that the fragment, its input and its outputs fail over together:

- S is never elected on its own silence. It follows A: whenever A's primary is not S's, is
  live and is in S's ISR, S gets an ``Elect`` of A's primary. If A's primary is outside S's
  ISR, S waits (it must not lose acknowledged entries) until an ``ExpandIsr`` admits it.
- When A's primary is silent, A's new primary is chosen, preferably, among the live members of
  the ISRs of A and of every stream anchored to A (directly, or through a chain of anchors):
  the followers can then follow at once. If that intersection has no live member, the choice
  is over A's ISR alone, as for any stream (a follower outside it waits).
- A stream whose anchor is missing (dropped, or never created) fails over on its own. A cycle of
  anchors (possible only after a stream is dropped and created again) is cut at its least
  name, which fails over on its own; the others follow it.

Gone processes. Silence is the only evidence of a dead host, so ``failover_after_s`` must
outlast a busy peer's stall. A process that died on a live host leaves better evidence: its
host refuses connections to its port at once. :func:`to_probe` names the primaries silent
for ``suspect_after_s`` (a few heartbeats, well under ``failover_after_s``) that the leader
should ask the network about; one whose host refuses is treated as silent for good (its
last-heard time is dropped), so its streams fail over in the next round. A stopped process
(SIGSTOP) or a slow one still has its port open and waits for ``failover_after_s`` like a
dead host.

The decisions are proposed as :class:`~peer.replication.control.commands.Elect` commands for the
epoch they were decided in, so one made on stale heartbeats is a no-op once anything has changed.
They come in the order of ``streams`` and depend on nothing else (no clock, no unordered
iteration). Times are monotonic seconds on the leader's machine; the driver seeds
``last_heard`` with the moment it took office, so a new leader gives every peer a full
``failover_after_s`` to be heard.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from peer.replication.control.commands import Elect
from peer.replication.control.state import StreamState

__all__ = ["anchor_roots", "choose_primary", "failover_decisions", "live_nodes", "to_probe"]


def choose_primary(
    stream: StreamState, log_ends: Mapping[str, int], live: Collection[str]
) -> str | None:
    """The standby if it is a live ISR member, else the live ISR member with the longest log
    end (unknown: -1), or None if none lives."""
    if stream.standby is not None and stream.standby in live and stream.standby in stream.in_sync:
        return stream.standby
    best: str | None = None
    best_end = -2
    for node in stream.in_sync:  # in replica order, so a tie goes to the earlier
        if node in live and log_ends.get(node, -1) > best_end:
            best, best_end = node, log_ends.get(node, -1)
    return best


def can_fail_over(state: StreamState) -> bool:
    """Whether ``state`` has a replica besides its primary, on which what leads it could run
    if its primary died. A fragment anchored to a stream without one is not replicated: its
    checkpoints would have nowhere to go, and it could not run in its peer's shared lane."""
    return any(node != state.primary for node in state.replicas)


def live_nodes(last_heard: Mapping[str, float], now: float, failover_after_s: float) -> set[str]:
    """The nodes heard from within ``failover_after_s`` of ``now``."""
    return {node for node, heard in last_heard.items() if now - heard < failover_after_s}


def to_probe(
    streams: Iterable[StreamState],
    last_heard: Mapping[str, float],
    now: float,
    suspect_after_s: float,
    probed: Mapping[str, float],
) -> list[str]:
    """The primaries of ``streams`` silent for ``suspect_after_s`` and not yet probed in this
    silence (``probed[node]`` is the last-heard time at which ``node`` was probed), each once,
    in the order of ``streams``. A node never heard is not probed (the failover round seeds
    its time)."""
    chosen: list[str] = []
    for stream in streams:
        node = stream.primary
        heard = last_heard.get(node)
        if node in chosen or heard is None or now - heard < suspect_after_s:
            continue
        if probed.get(node) == heard:
            continue  # asked already since it was last heard
        chosen.append(node)
    return chosen


def _anchors(by_name: Mapping[str, StreamState]) -> dict[str, str]:
    """Stream name -> the name of its anchor, for each stream whose anchor is present; each
    cycle of anchors is cut at its least name."""
    anchors = {
        name: stream.anchor
        for name, stream in by_name.items()
        if stream.anchor is not None and stream.anchor in by_name and stream.anchor != name
    }
    for name in sorted(anchors):
        if name not in anchors:
            continue  # cut already
        path: list[str] = []
        node = name
        while node in anchors and node not in path:
            path.append(node)
            node = anchors[node]
        if node == name:  # back where it started: a cycle, exactly ``path``
            del anchors[min(path)]
    return anchors


def anchor_roots(streams: Iterable[StreamState]) -> dict[str, str]:
    """Stream name -> the stream it ultimately fails over with (its anchor's anchor...), for
    every anchored stream whose anchor is present among ``streams``."""
    return _roots(_anchors({stream.name: stream for stream in streams}))


def _roots(anchors: Mapping[str, str]) -> dict[str, str]:
    roots = {}
    for name in sorted(anchors):
        root = anchors[name]
        while root in anchors:  # cycles are cut, so this ends
            root = anchors[root]
        roots[name] = root
    return roots


def failover_decisions(
    streams: Iterable[StreamState],
    last_heard: Mapping[str, float],
    now: float,
    failover_after_s: float,
    log_ends: Mapping[str, Mapping[str, int]],
) -> list[Elect]:
    """One ``Elect`` for each of ``streams`` (the control plane's states) whose primary is
    silent and has a live ISR member, or that is anchored and can follow its anchor's primary
    (see the module docstring).
    ``log_ends[stream][node]`` is the log end ``node`` last reported for ``stream``.
    ``streams`` should hold every stream: a stream whose anchor is not among them fails over
    on its own."""
    live = live_nodes(last_heard, now, failover_after_s)
    ordered = list(streams)
    by_name = {stream.name: stream for stream in ordered}
    anchors = _anchors(by_name)
    followers: dict[str, list[StreamState]] = {}
    for name, root in _roots(anchors).items():
        followers.setdefault(root, []).append(by_name[name])
    decisions = []
    for stream in ordered:
        anchor = anchors.get(stream.name)
        if anchor is not None:
            lead = by_name[anchor].primary
            if lead != stream.primary and lead in stream.in_sync and lead in live:
                decisions.append(Elect(stream.name, stream.epoch, lead))
            continue
        if stream.primary in live:
            continue
        candidates = live - {stream.primary}
        ends = log_ends.get(stream.name, {})
        choice = None
        if stream.name in followers:
            shared = candidates.intersection(*(f.in_sync for f in followers[stream.name]))
            choice = choose_primary(stream, ends, shared)
        if choice is None:
            choice = choose_primary(stream, ends, candidates)
        if choice is not None:
            decisions.append(Elect(stream.name, stream.epoch, choice))
    return decisions
