"""The control plane: a replicated state machine that names each stream's primary, epoch and
in-sync set (docs/replication.md). This package is its pure core: the commands of the
replicated log, the state they are applied to, and the failover decisions of the Raft
leader (which keep an anchored stream on its anchor's primary). The Raft library and the
heartbeats that drive it live elsewhere and call in."""

from __future__ import annotations

from peer.replication.control.commands import (
    Command,
    CreateStream,
    DropStream,
    Elect,
    ExpandIsr,
    SetReplicas,
    ShrinkIsr,
)
from peer.replication.control.failover import (
    anchor_roots,
    choose_primary,
    failover_decisions,
    live_nodes,
)
from peer.replication.control.repair import repaired_replicas
from peer.replication.control.state import Applied, ControlState, StreamState

__all__ = [
    "Applied",
    "Command",
    "ControlState",
    "CreateStream",
    "DropStream",
    "Elect",
    "ExpandIsr",
    "SetReplicas",
    "ShrinkIsr",
    "StreamState",
    "anchor_roots",
    "choose_primary",
    "failover_decisions",
    "live_nodes",
    "repaired_replicas",
]
