"""An elastic participant's record in the control plane, as the rest of the peer sees it (part
of the room's face): its burst state and the two commands that change it
(:mod:`peer.replication.control.state` says how they apply; :mod:`peer.elastic` uses them)."""

from __future__ import annotations

from peer.replication.control import BurstState, ClaimBurst, PlanBurst

__all__ = ["BurstState", "ClaimBurst", "PlanBurst"]
