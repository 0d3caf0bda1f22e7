"""The local site: one peer's streams, queries and engine, and nothing of the overlay.

- :mod:`peer.site.local`: :class:`LocalSite`, the site itself (push, subscribe, queries,
  status; the client API of a lone peer);
- :mod:`peer.site.store`: its configuration, and its storage opened before it is made;
- :mod:`peer.site.ports`: what the rooms above give it (replicated streams' appenders, the
  reachability of upstreams);
- :mod:`peer.site.subscribe`: a subscriber following a stream's spool.
"""

from peer.site.local import INTERNAL_PREFIX, INTERNAL_RETENTION_S, LocalSite, checked_status
from peer.site.ports import Appender, NoReplicaLogs, Reachable, ReplicaLogs, always_reachable
from peer.site.store import SiteConfig, SiteStore

__all__ = [
    "INTERNAL_PREFIX",
    "INTERNAL_RETENTION_S",
    "Appender",
    "LocalSite",
    "NoReplicaLogs",
    "Reachable",
    "ReplicaLogs",
    "SiteConfig",
    "SiteStore",
    "always_reachable",
    "checked_status",
]
