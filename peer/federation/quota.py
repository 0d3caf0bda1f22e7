"""Link streams that relayed subscriptions may take, per client: a pure counter, no I/O.

Theory of operation
-------------------
A subscription to a stream hosted on another peer is relayed over one stream of the peer
link to that host (:mod:`peer.federation.forward`), and a link carries at most
``max_streams`` (64) streams. Without a quota one client could open 64 subscriptions through
this peer and leave none for anyone else's subscriptions to that host (issue 12). So each
relay first takes a place in :class:`RelayQuota`, for its client and that host:

* ``per_connection`` places per client connection (16 by default), and
* ``per_address`` places per client address (32: a participant with TLS, else the remote
  host), so that a client opening many connections gets no more,

both well below the link's capacity. A relay beyond either is refused with ``unavailable``
(retriable: places come back as the client's relays end), naming the limit. Subscriptions
served by this peer itself take no link stream and no place.

The client comes from the API server (:data:`peer.server.service.CLIENT`, set for everything a
connection does); a relay with no client (a peer's own) is not counted.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from peer.errors import Unavailable
from peer.server.service import ClientRef

__all__ = ["RelayQuota"]


class RelayQuota:
    def __init__(self, per_connection: int = 16, per_address: int = 32) -> None:
        if per_connection < 1 or per_address < 1:
            raise ValueError("relay quotas must be at least 1")
        self.per_connection = per_connection
        self.per_address = per_address
        self._held: Counter[tuple[str, str, bytes]] = Counter()

    def held(self, client: ClientRef, host: bytes) -> tuple[int, int]:
        """Places ``client`` holds toward ``host``: (its connection's, its address's)."""
        return (
            self._held["connection", client.connection, host],
            self._held["address", client.address, host],
        )

    @contextlib.contextmanager
    def hold(self, client: ClientRef | None, host: bytes, stream: str) -> Iterator[None]:
        """A place for one relay of ``client`` to ``host`` while the block runs; Unavailable
        (nothing taken) beyond a quota."""
        if client is None:
            yield
            return
        by_connection, by_address = self.held(client, host)
        limit = None
        if by_connection >= self.per_connection:
            limit = f"{self.per_connection} per connection (relay_streams_per_connection)"
        elif by_address >= self.per_address:
            limit = f"{self.per_address} per client address (relay_streams_per_address)"
        if limit is not None:
            raise Unavailable(
                f"subscribe to {stream!r}: this client holds {by_connection} relayed "
                f"subscriptions on this connection and {by_address} from its address to the "
                f"stream's host {host.hex()[:12]}; at most {limit}",
                stream=stream,
            )
        keys = [("connection", client.connection, host), ("address", client.address, host)]
        for key in keys:
            self._held[key] += 1
        try:
            yield
        finally:
            for key in keys:
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]
