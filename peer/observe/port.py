"""What the observer reads of a peer, from the parts the node wires together: :class:`PeerPort`.

The node builds one over its client service's ``status`` (the one source of the status JSON),
and the ways to its local site and, in an overlay, its federation as they are at the time of
a call (the observer is made before them: the parts that feed it are given it when they are
made); the observer sees only the :class:`~peer.observe.observer.Observed` protocol, and its
tests give it a fake.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from peer.errors import Unavailable
from peer.federation import Federation
from peer.protocol.link import ObservePeer
from peer.protocol.replies import StatusReply
from peer.site import LocalSite

if TYPE_CHECKING:
    from peer.engine.runner import Engine

__all__ = ["PeerPort"]


class PeerPort:
    """Implements peer.observe.Observed for a peer's site and federation."""

    def __init__(
        self,
        status: Callable[[], Awaitable[StatusReply]],
        site: Callable[[], LocalSite | None],
        fed: Callable[[], Federation | None],
    ) -> None:
        self._status = status
        self._the_site = site
        self._the_fed = fed

    @property
    def _fed(self) -> Federation | None:
        return self._the_fed()

    @property
    def _engine(self) -> Engine | None:
        site = self._the_site()
        return None if site is None else site.engine

    @property
    def node_id(self) -> bytes | None:
        fed = self._fed
        return None if fed is None else fed.node_id

    async def status(self) -> dict[str, Any]:
        return (await self._status()).to_wire()

    def engine_counters(self) -> dict[str, dict[str, float]]:
        engine = self._engine
        return {} if engine is None else engine.counters()

    def stream_rows(self) -> dict[str, int]:
        engine = self._engine
        return {} if engine is None else engine.stream_rows()

    async def engine_progress(
        self, marks: dict[str, tuple[str, int]]
    ) -> dict[str, list[dict[str, Any]]]:
        engine = self._engine
        return {} if engine is None else await engine.progress(marks)

    def backlog(self) -> dict[str, int]:
        site = self._the_site()
        if site is None:
            return {}
        spools = site.spools
        out: dict[str, int] = {}
        for stream in spools.streams():
            try:
                out[stream] = spools.get(stream).backlog()
            except (KeyError, OSError, ValueError):  # dropped meanwhile
                continue
        return out

    def mirror_bytes(self) -> dict[str, int]:
        fed = self._fed
        return {} if fed is None else dict(fed.mirrors.sent_bytes)

    def link_stats(self) -> dict[str, int]:
        fed = self._fed
        return {} if fed is None else fed.overlay.link_stats()

    def members(self) -> list[bytes]:
        fed = self._fed
        if fed is None:
            return []
        me = fed.node_id
        return [m.node_id for m in fed.overlay.live_members() if m.node_id != me]

    async def ask(self, node_id: bytes, message: ObservePeer) -> dict[str, Any]:
        fed = self._fed
        if fed is None:
            raise Unavailable("this peer is not in an overlay: it has no other peers to ask")
        return dict(await fed.router.call(node_id, message))
