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

* :mod:`overlay.link.events`: the frames of a running link as typed events; no I/O.
* :mod:`overlay.link.protocol`: the hello, limits, errors; no I/O.
* :mod:`overlay.link.outbox`: the bounded outbox every frame of a link goes through.
* :mod:`overlay.link.connection`: :class:`Link` and :class:`LinkStream`, one running link.
* :mod:`overlay.link.pool`: :class:`LinkPool`, which opens links.
* :mod:`overlay.link.server`: :class:`LinkServer`, which accepts them.

Sockets, TLS and the credit windows of streams are :mod:`overlay.transport`'s.

docs/protocol.md ("Peer links") describes the wire form for other implementations.
"""

from __future__ import annotations

from overlay.link.connection import Link, LinkHandler, LinkStream, Traffic
from overlay.link.pool import LinkPool
from overlay.link.protocol import (
    LINK_VERSION,
    LinkError,
    LinkRefused,
    LinkRemoteError,
    LinkSettings,
    LinkTimeout,
    LinkUnavailable,
)
from overlay.link.server import LinkServer

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
    "Traffic",
]
