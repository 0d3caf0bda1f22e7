"""Repairing a stream's replica set (pure): who replaces a replica that died for good.

A stream's replicas are the live peers XOR-closest to its key when it is created. When one of
them stays silent longer than the repair delay (much longer than a failover: a restart should
not move data), its primary proposes ``SetReplicas`` with the dead member replaced by the
closest live peer that is not a replica yet. The new member starts empty, out of the in-sync
set; its primary seeds it (the entries trimmed already) and ships the rest, then expands the
ISR. Nothing moves for a closer peer that joins: a replica set changes only when one of its
members is gone, so nothing flaps.

An *anchored* stream (a fragment's results and checkpoints, which fail over with its input)
does not pick its own: it takes its anchor's replica set, so that its fragment can run
wherever its input's primary goes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from peer.replication.control.state import StreamState

__all__ = ["repaired_replicas"]


def repaired_replicas(
    state: StreamState,
    dead: Collection[str],
    candidates: Sequence[str],
    anchor: StreamState | None = None,
) -> tuple[str, ...] | None:
    """The replica set ``state`` should have now, or None to keep it.

    ``dead``: members silent for longer than the repair delay; ``candidates``: live peers in
    the order of preference (XOR distance to the stream's key); ``anchor``: the state of the
    stream ``state`` is anchored to, if it is."""
    if anchor is not None:
        wanted = anchor.replicas
        if set(wanted) == set(state.replicas) or state.primary not in wanted:
            return None
        return wanted
    gone = [n for n in state.replicas if n in dead and n != state.primary]
    if not gone:
        return None
    fresh = [c for c in dict.fromkeys(candidates) if c not in state.replicas and c not in dead]
    if not fresh:
        return None  # nobody to take over: the stream stays under-replicated
    replaced = dict(zip(gone, fresh, strict=False))
    return tuple(replaced.get(n, n) for n in state.replicas)
