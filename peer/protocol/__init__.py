"""Typed messages of the peer's two protocols, to and from wire frames, with no I/O.

* :mod:`peer.protocol.api`: the client API (docs/protocol.md, sections 1-8): requests decoded
  from frames with their checks, replies and subscription frames encoded.
* :mod:`peer.protocol.api_events` and :mod:`peer.protocol.api_connection`: the client API
  connection as sans-IO state machines, one per side (request ids, replies owed, the in-flight
  limit, hello, subscriptions and their credit, closing), driven by :mod:`peer.server` and
  :mod:`peer.client`;
* :mod:`peer.protocol.link`: what one peer asks of another over a peer link.
"""
