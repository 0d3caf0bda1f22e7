"""Replicated stream logs: the sans-IO core of the data plane (docs/replication.md).

Theory of operation
-------------------
A stream's log lives on its replicas; the control plane (:mod:`peer.replication.control`) names one
of them primary for an epoch and keeps the in-sync set (ISR). Every replica stores the primary's
bytes at the primary's offsets, so offsets and duplicate filters mean the same everywhere.

1. A push reaches the primary (:class:`Primary`). A duplicate ``(origin, seq)`` is answered
   once what the log held is acknowledged; with fewer than ``min_insync`` ISR members
   reachable it is refused, retriably; otherwise the primary writes it at ``log_end + 1``
   (fsync) and sends a :class:`ReplicaAppend` to each follower.
2. A follower (:class:`Follower`) refuses appends of a lower epoch (fencing), reconciles with a
   new epoch's primary before taking its appends (``EpochEnd``: it cuts the tail that primary
   never had), writes the entry at its log end + 1 (fsync) and answers with its log end.
3. The primary acknowledges an offset once every ISR member holds it (and at least
   ``min_insync`` do). A member that lags is removed through the control plane first; only the
   committed smaller ISR lets the primary acknowledge without it.

What fails, and what happens then:

- a message is lost, duplicated or reordered: appends are idempotent by offset, replies carry
  the follower's whole log end, and the primary resends what is missing every ``resend_s``;
- a follower crashes: it keeps what it fsynced and reconciles again when it comes back; while
  it is gone it lags, leaves the ISR, and acknowledgements go on if ``min_insync`` remain;
- the primary crashes or is cut off: the control plane elects the live ISR member with the
  longest log in a higher epoch. Every ISR member holds every acknowledged entry, so none is
  lost; the old primary's unacknowledged tail is cut when it rejoins as a follower; its pushes
  in flight are refused by the fence and retried by their clients under the same id;
- a partition: the side without ``min_insync`` reachable ISR members refuses pushes.

The state machines do no I/O, read no clock and import no asyncio: they return *effects*
(:mod:`peer.replication.core.messages`) that their driver performs in order, each fsynced, before
it sends the message that came with them. tests/unit/test_replication_sim.py runs them under
a simulated network with crashes and partitions.
"""

from __future__ import annotations

from peer.replication.core.follower import Follower
from peer.replication.core.history import EpochStart, History
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
from peer.replication.core.primary import (
    Appended,
    Duplicate,
    IsrProposal,
    Outgoing,
    Primary,
    Progress,
    PushRefusal,
    Refused,
    Ship,
    begin_epoch,
)

__all__ = [
    "AppendReply",
    "Appended",
    "Duplicate",
    "Effect",
    "EpochEnd",
    "EpochEndReply",
    "EpochStart",
    "Follower",
    "History",
    "IsrProposal",
    "Outgoing",
    "Primary",
    "Probe",
    "Progress",
    "PushRefusal",
    "Refusal",
    "Refused",
    "ReplicaAppend",
    "SaveEpoch",
    "SaveHistory",
    "Seed",
    "SeedLog",
    "Ship",
    "Truncate",
    "WriteEntry",
    "begin_epoch",
]
