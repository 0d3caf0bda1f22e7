"""The names replication gives the streams it makes itself (part of the room's face): a
replicated fragment's checkpoint stream is ``~ckpt.<fragment>``, an internal stream that only
peers write (docs/replication.md, "Fragments")."""

from __future__ import annotations

from peer.site import INTERNAL_PREFIX

__all__ = ["CKPT_PREFIX", "checkpoint_stream"]

CKPT_PREFIX = INTERNAL_PREFIX + "ckpt."


def checkpoint_stream(fragment: str) -> str:
    """The checkpoint stream of the replicated fragment ``fragment``."""
    return CKPT_PREFIX + fragment
