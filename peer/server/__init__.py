"""The peer's servers: the client API (wire format: docs/protocol.md) on the transport.

* :mod:`peer.server.service`: :class:`PeerService`, what the server needs of the peer (a
  Protocol the peer implements), and :class:`AnnouncedBatches`/:data:`READY` for
  subscriptions whose start position is fixed elsewhere.
* :mod:`peer.server.connection`: one client connection (requests, subscriptions, outbox).
* :mod:`peer.server.sql_scripts`: :class:`~peer.server.sql_scripts.SqlScripts`, the
  ``create_sql`` request: a SQL script compiled in the server's own threads, within
  budgets, and created through the service's other requests.
* :mod:`peer.server.server`: :class:`ApiServer`, listening through
  :class:`overlay.transport.Listener`, with its TLS (:func:`api_server_tls`).

The messages themselves are :mod:`peer.protocol.api`'s.
"""

from __future__ import annotations

from peer.protocol.api import PROTOCOL_VERSION, QUERY_STATUSES
from peer.server.server import ApiServer, ServerTls, api_server_tls, is_loopback
from peer.server.service import READY, AnnouncedBatches, PeerService

__all__ = [
    "PROTOCOL_VERSION",
    "QUERY_STATUSES",
    "READY",
    "AnnouncedBatches",
    "ApiServer",
    "PeerService",
    "ServerTls",
    "api_server_tls",
    "is_loopback",
]
