"""What the observer reads of a peer, from the parts the node wires together: :class:`PeerPort`.

The node builds one over its client service's ``status`` (the one source of the status JSON),
its local site and, in an overlay, its federation; the observer sees only the
:class:`~peer.observe.observer.Observed` protocol, and its tests give it a fake.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from peer.errors import Unavailable
from peer.federation import Federation
from peer.protocol.link import ObservePeer
from peer.protocol.replies import StatusReply
from peer.site import LocalSite

__all__ = ["PeerPort"]


class PeerPort:
    """Implements peer.observe.Observed for a peer's site and federation."""

    def __init__(
        self,
        status: Callable[[], Awaitable[StatusReply]],
        site: LocalSite,
        fed: Federation | None,
    ) -> None:
        self._status = status
        self._site = site
        self._fed = fed

    @property
    def node_id(self) -> bytes | None:
        return None if self._fed is None else self._fed.node_id

    async def status(self) -> dict[str, Any]:
        return (await self._status()).to_wire()

    def engine_counters(self) -> dict[str, dict[str, float]]:
        engine = self._site.engine
        return {} if engine is None else engine.counters()

    async def engine_progress(
        self, marks: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict[str, Any]]]:
        engine = self._site.engine
        return {} if engine is None else await engine.progress(marks)

    def backlog(self) -> dict[str, int]:
        spools = self._site.spools
        out: dict[str, int] = {}
        for stream in spools.streams():
            try:
                out[stream] = spools.get(stream).backlog()
            except (KeyError, OSError, ValueError):  # dropped meanwhile
                continue
        return out

    def mirror_bytes(self) -> dict[str, int]:
        return {} if self._fed is None else dict(self._fed.mirrors.sent_bytes)

    def link_stats(self) -> dict[str, int]:
        return {} if self._fed is None else self._fed.overlay.link_stats()

    def members(self) -> list[bytes]:
        if self._fed is None:
            return []
        me = self._fed.node_id
        return [m.node_id for m in self._fed.overlay.live_members() if m.node_id != me]

    async def ask(self, node_id: bytes, message: ObservePeer) -> dict[str, Any]:
        if self._fed is None:
            raise Unavailable("this peer is not in an overlay: it has no other peers to ask")
        return dict(await self._fed.router.call(node_id, message))
