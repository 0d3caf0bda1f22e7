"""One follower replica of one stream (a sans-IO state machine).

Theory of operation
-------------------
A follower holds three durable things: the highest ``epoch`` it has seen (its fence), its log
(``log_end`` is the last offset it holds, -1 when empty) and its epoch history. In memory it
keeps one more: whether it is *reconciled* with the primary of its epoch, i.e. whether its log
is known to be a prefix of that primary's. It starts unreconciled (unless its log is empty),
and becomes so again whenever it learns a higher epoch.

States and transitions, all in :meth:`Follower.receive` and :meth:`Follower.on_epoch_end`:

======================  =====================================================================
append from epoch e     what the follower does (a ``Probe`` is an append without an entry: it
                        goes as far as "unreconciled", then is answered with the log end)
======================  =====================================================================
``e < epoch``           refuses it (``STALE_EPOCH``, with its epoch): **fencing**. A deposed
                        primary never collects an acknowledgement from a replica that has
                        heard of its successor.
``e > epoch``           saves ``e`` (``SaveEpoch``), becomes unreconciled, then as below.
unreconciled            asks the primary ``EpochEnd(last epoch of its history)`` instead of
                        answering; the append is dropped (the primary resends).
``offset > end + 1``    answers ``GAP`` with its end: the primary resends from there.
``offset <= end``       a duplicate: its log is a prefix of this primary's, so it holds the
                        same bytes there already; answers with its end.
``offset == end + 1``   writes the entry (history first if the entry opens an epoch) and
                        answers with its new end.
======================  =====================================================================

Reconciling (the answer to ``EpochEnd``, KIP-279's rule): the primary answers with the largest
epoch ``e'`` of its history at or below the one asked about, and the last offset ``end'`` it
owns. Every entry of the follower from an epoch above ``e'`` is from an epoch the primary has
no entry of, so it was never acknowledged (an acknowledged entry is on every in-sync replica,
the primary included): the follower cuts them. If its history has ``e'`` too, both logs hold
entries of ``e'`` from the one primary of ``e'``, so they agree up to the smaller end of ``e'``:
the follower cuts above ``min(end', its own end of e')`` and is reconciled (when ``e'`` is the
primary's own epoch, nothing: those entries came from it). Otherwise it asks
again about its (now lower) last epoch. Each round lowers the epoch asked about, so it ends.

Crashes: the driver performs effects in order, each fsynced. A history change is saved
*before* the write that needs it and *after* the truncation that causes it, so a crash between
the two leaves at worst an empty epoch in the history (harmless; dropped on restart), never an
entry credited to an epoch that did not write it. After a restart the follower reconciles
again before it takes anything.
"""

from __future__ import annotations

from peer.replication.core.history import (
    History,
    check_history,
    end_of,
    last_epoch,
    truncated,
    with_entry,
)
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
    SeedLog,
    Truncate,
    WriteEntry,
)

__all__ = ["Follower"]


class Follower:
    """One stream's replica on one node, following the primary of its epoch."""

    def __init__(
        self,
        stream: str,
        node: str,
        *,
        epoch: int = 0,
        log_end: int = -1,
        history: History = (),
    ) -> None:
        if epoch < 0 or log_end < -1:
            raise ValueError(f"follower of {stream!r}: epoch {epoch} / log end {log_end} invalid")
        self.stream = stream
        self.node = node
        self.epoch = epoch
        self.log_end = log_end
        # An epoch that starts beyond the log is empty (a primary that wrote nothing, or a
        # crash between a truncation and its history update): drop it.
        self.history = check_history(truncated(history, log_end), log_end)
        if last_epoch(self.history) > epoch:
            raise ValueError(
                f"follower of {stream!r}: history holds epoch {last_epoch(self.history)}"
                f" above its epoch {epoch}"
            )
        self.reconciled = log_end < 0

    # ----------------------------------------------------------------------- inputs

    def receive(
        self, append: ReplicaAppend | Probe
    ) -> tuple[AppendReply | EpochEnd, tuple[Effect, ...]]:
        """Handle an append (or a probe: an append without an entry); the message to send back
        to its sender, and the effects to perform first."""
        self._check_stream(append.stream)
        if append.epoch < self.epoch:
            return self._reply(Refusal.STALE_EPOCH), ()
        effects = list(self.on_new_epoch(append.epoch))
        if not self.reconciled:
            return self._ask(), tuple(effects)
        if isinstance(append, Probe):
            return self._reply(), tuple(effects)
        if append.offset > self.log_end + 1:
            return self._reply(Refusal.GAP), tuple(effects)
        if append.offset <= self.log_end:
            return self._reply(), tuple(effects)
        if append.entry_epoch < last_epoch(self.history):
            # Cannot follow a prefix of ours: our log is not what we believed. Start over.
            self.reconciled = False
            return self._ask(), tuple(effects)
        history = with_entry(self.history, append.entry_epoch, append.offset)
        if history != self.history:
            self.history = history
            effects.append(SaveHistory(history))
        effects.append(
            WriteEntry(append.offset, append.entry_epoch, append.body, append.origin, append.seq)
        )
        self.log_end = append.offset
        return self._reply(), tuple(effects)

    def seed(self, seed: Seed) -> tuple[AppendReply | EpochEnd, tuple[Effect, ...]]:
        """The primary trimmed entries this follower lacks: once reconciled (its log a prefix
        of the primary's), start the log after ``seed.through`` with the primary's history of
        the entries through there. Answered like an append."""
        self._check_stream(seed.stream)
        if seed.epoch < self.epoch:
            return self._reply(Refusal.STALE_EPOCH), ()
        effects = list(self.on_new_epoch(seed.epoch))
        if not self.reconciled:
            return self._ask(), tuple(effects)
        if seed.through <= self.log_end:
            return self._reply(), tuple(effects)
        self.log_end = seed.through
        self.history = check_history(seed.history, seed.through)
        effects += [SeedLog(seed.through, seed.seqs), SaveHistory(self.history)]
        return self._reply(), tuple(effects)

    def on_new_epoch(self, epoch: int) -> tuple[Effect, ...]:
        """The control plane (or an append) says ``epoch`` has begun: fence everything below
        it from now on, and reconcile with its primary before taking its appends."""
        if epoch <= self.epoch:
            return ()
        self.epoch = epoch
        self.reconciled = self.log_end < 0
        return (SaveEpoch(epoch),)

    def on_epoch_end(
        self, reply: EpochEndReply
    ) -> tuple[AppendReply | EpochEnd | None, tuple[Effect, ...]]:
        """The primary's answer to :class:`EpochEnd`: cut the divergent tail. Returns the next
        message to the primary (the new log end once reconciled, or the next question) and
        the effects to perform first; None for a stale or repeated answer."""
        self._check_stream(reply.stream)
        asked = last_epoch(self.history)
        if reply.epoch != self.epoch or self.reconciled or reply.last_epoch > asked:
            return None, ()
        own_epoch, own_end = end_of(self.history, self.log_end, reply.last_epoch)
        cut = own_end
        if own_epoch == reply.last_epoch < reply.epoch:
            # The primary's end of a past epoch is fixed while it serves. Entries of its own
            # epoch came from it, so they are a prefix of its log: nothing to cut there (and an
            # answer delayed from before a restart of ours may name an end we have passed).
            cut = min(cut, reply.end)
        effects: list[Effect] = []
        if cut < self.log_end:
            self.log_end = cut
            effects.append(Truncate(cut))
            history = truncated(self.history, cut)
            if history != self.history:
                self.history = history
                effects.append(SaveHistory(history))
        if own_epoch == reply.last_epoch or self.log_end < 0:
            self.reconciled = True
            return self._reply(), tuple(effects)
        return self._ask(), tuple(effects)

    # ----------------------------------------------------------------------- helpers

    def _reply(self, refused: Refusal | None = None) -> AppendReply:
        return AppendReply(self.stream, self.epoch, self.node, self.log_end, refused)

    def _ask(self) -> EpochEnd:
        return EpochEnd(self.stream, self.epoch, self.node, last_epoch(self.history))

    def _check_stream(self, stream: str) -> None:
        if stream != self.stream:
            raise ValueError(
                f"a message for stream {stream!r} reached the follower of {self.stream!r}"
            )
