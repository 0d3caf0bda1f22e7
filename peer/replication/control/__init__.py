"""The control plane: a replicated state machine that names each stream's primary, epoch and
in-sync set (docs/replication.md). This package is its pure core: the commands of the
replicated log, the state they are applied to, the failover decisions of the Raft leader
(which keep an anchored stream on its anchor's primary), the repair of replica sets, and who
sits in the control plane (seats). The Raft library and the heartbeats that drive it live
elsewhere and call in."""

from __future__ import annotations

from peer.replication.control.commands import (
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
from peer.replication.control.failover import (
    anchor_roots,
    can_fail_over,
    choose_primary,
    failover_decisions,
    live_nodes,
    to_probe,
)
from peer.replication.control.repair import NO_CONTROL_PLANE, copies_text, repaired_replicas
from peer.replication.control.seats import (
    VoterSeats,
    may_found,
    may_volunteer,
    seats_for,
)
from peer.replication.control.state import Applied, BurstState, ControlState, StreamState

__all__ = [
    "NO_CONTROL_PLANE",
    "Applied",
    "BurstState",
    "ClaimBurst",
    "Command",
    "ControlState",
    "CreateStream",
    "DropStream",
    "Elect",
    "ExpandIsr",
    "PlanBurst",
    "SetReplicas",
    "SetStandby",
    "ShrinkIsr",
    "StreamState",
    "VoterSeats",
    "anchor_roots",
    "can_fail_over",
    "choose_primary",
    "copies_text",
    "failover_decisions",
    "live_nodes",
    "may_found",
    "may_volunteer",
    "repaired_replicas",
    "seats_for",
    "to_probe",
]
