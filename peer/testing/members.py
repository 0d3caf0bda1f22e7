"""Wait until a peer sees enough of the federation: the one "members alive" wait of the tests.

A multi-peer test starts its peers, then waits until gossip has told one of them about the
others before it asks anything that needs them (a placement, a replica set, a forward). The
wait asks the peer's status through a :class:`peer.client.Client` and counts the overlay's
members by state, polling through :func:`peer.timing.wait_until` (the one poll helper).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from peer.timing import wait_until

__all__ = ["member_states", "members_alive"]


class _Status(Protocol):
    async def status(self) -> Mapping[str, Any]: ...


def member_states(status: Mapping[str, Any]) -> Counter[str]:
    """How many members the status's overlay lists in each state (``alive``, ``dead``, ...)."""
    return Counter(str(m["state"]) for m in status["overlay"]["members"])


async def members_alive(
    client: _Status, alive: int, *, dead: int = 0, timeout_s: float = 60.0
) -> list[dict[str, Any]]:
    """Wait until the peer behind ``client`` counts at least ``alive`` live members (itself
    included) and at least ``dead`` dead ones; returns the members it lists then."""
    if alive < 0 or dead < 0:
        raise ValueError(f"members to wait for cannot be negative ({alive} alive, {dead} dead)")

    async def enough() -> list[dict[str, Any]] | None:
        status = await client.status()
        states = member_states(status)
        if states["alive"] >= alive and states["dead"] >= dead:
            return list(status["overlay"]["members"])
        return None

    what = f"{alive} members alive" + (f" and {dead} dead" if dead else "")
    return await wait_until(enough, what, timeout_s, every_s=0.2)
