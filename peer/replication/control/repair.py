"""Repairing a stream's replica set (pure): who replaces a replica that died for good, and who
joins a stream that has fewer replicas than it asked for.

A stream's replicas are the live peers XOR-closest to its key when it is created. When one of
them stays silent longer than the repair delay (much longer than a failover: a restart should
not move data), its primary proposes ``SetReplicas`` with the dead member replaced by the
closest live peer that is not a replica yet: one that runs an engine if any is left, else
any (the copies the stream had are kept; a short stream, below, grows on engine peers only).
The new member starts empty, out of the in-sync set; its primary seeds it (the entries
trimmed already) and ships the rest, then expands the ISR. Nothing moves for a closer peer
that joins: a replica set changes only when one of its members is gone, so nothing flaps.

A stream created while fewer peers lived than the replicas it asked for (``wanted``; a lone
peer's streams have one) is *short*: as live peers that are not replicas yet appear, its
primary proposes ``SetReplicas`` with the closest of them added, up to the count asked for.
Newcomers start as a replacement does (empty, out of the ISR, seeded).

An *anchored* stream (a fragment's results and checkpoints, which fail over with its input)
does not pick its own: it takes its anchor's replica set, so that its fragment can run
wherever its input's primary goes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from peer.replication.control.state import StreamState

__all__ = ["NO_CONTROL_PLANE", "copies_text", "repaired_replicas"]


def repaired_replicas(
    state: StreamState,
    dead: Collection[str],
    candidates: Sequence[str],
    anchor: StreamState | None = None,
) -> tuple[str, ...] | None:
    """The replica set ``state`` should have now, or None to keep it.

    ``dead``: members silent for longer than the repair delay; ``candidates``: live peers in
    the order of preference (XOR distance to the stream's key); ``anchor``: the state of the
    stream ``state`` is anchored to, if it is. Dead members are replaced first, then a short
    stream grows to the replicas it asked for."""
    if anchor is not None:
        wanted = anchor.replicas
        if set(wanted) == set(state.replicas) or state.primary not in wanted:
            return None
        return wanted
    gone = [n for n in state.replicas if n in dead and n != state.primary]
    if not gone and state.missing <= 0:
        return None
    fresh = [c for c in dict.fromkeys(candidates) if c not in state.replicas and c not in dead]
    if not fresh:
        return None  # nobody to take over: the stream stays under-replicated
    replaced = dict(zip(gone, fresh, strict=False))
    kept = [replaced.get(n, n) for n in state.replicas]
    added = fresh[len(replaced) :][: max(state.missing, 0)]
    return (*kept, *added)


def copies_text(state: StreamState, live: int) -> str:
    """What ``peer status`` and the dashboard say of a stream's copies, and why it has fewer
    than it asked for. ``live``: how many live peers could hold it (at most ``state.asked``
    are counted)."""
    have, asked, in_sync = len(state.replicas), state.asked, len(state.in_sync)
    text = f"{have} of {asked} copies"
    if have < asked:
        if live < asked:
            text += f": only {live} peer{'' if live == 1 else 's'} live"
        else:
            text += f": adding {asked - have} (peers joined)"
    if in_sync < have:
        text += f"; {in_sync} in sync, {have - in_sync} catching up"
    return text


NO_CONTROL_PLANE = "1 copy: no control plane"
