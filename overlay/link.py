"""Peer links: long-lived mutual-TLS connections carrying requests and credit-based streams.

Theory of operation
-------------------
A link is one TCP connection between two peers, upgraded to TLS 1.3 with node certificates
issued by participant keys (:mod:`overlay.tls`), then carrying :mod:`overlay.wire` frames. Right
after the handshake the client sends a ``hello`` and the server answers with its own (or with
``refused`` and a reason). Each hello names the sender's node id and participant, which must be
the ones its TLS certificate proves, and its limits. From then on the link is symmetric: either
side may send requests and open streams, and serves the other's with its :class:`LinkHandler`.

The layers, lowest first (import the public names from here):

* :mod:`overlay.link_protocol`: the frames, the hello, limits, errors; no I/O.
* :mod:`overlay.link_outbox`: the bounded outbox every frame of a link goes through.
* :mod:`overlay.link_connection`: :class:`Link` and :class:`LinkStream`, one running link.
* :mod:`overlay.link_pool`: :class:`LinkPool`, which opens links, and the task group that
  holds the links of a server or a pool.
* :mod:`overlay.link_server`: :class:`LinkServer`, which accepts them.

docs/protocol.md ("Peer links") describes the wire form for other implementations.
"""

from __future__ import annotations

from overlay.link_connection import Link, LinkHandler, LinkStream
from overlay.link_pool import LinkPool
from overlay.link_protocol import (
    LINK_VERSION,
    LinkError,
    LinkRefused,
    LinkRemoteError,
    LinkSettings,
    LinkTimeout,
    LinkUnavailable,
)
from overlay.link_server import LinkServer

__all__ = [
    "LINK_VERSION",
    "Link",
    "LinkError",
    "LinkHandler",
    "LinkPool",
    "LinkRefused",
    "LinkRemoteError",
    "LinkServer",
    "LinkSettings",
    "LinkStream",
    "LinkTimeout",
    "LinkUnavailable",
]
