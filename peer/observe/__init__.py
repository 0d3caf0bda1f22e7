"""Observability: Prometheus metrics, the status API and the live dashboard of a peer.

* :mod:`peer.observe.families`: the metric families (one table) and those built at scrape
  time from a snapshot; pure.
* :mod:`peer.observe.samples`: Spark progress reports to fragment figures, counters to chart
  points; pure.
* :mod:`peer.observe.diagram`: each query as boxes and arrows, marked with the peers that run
  them and the rates of their streams; pure.
* :mod:`peer.observe.observer`: :class:`Observer`, the per-peer registry, the hooks the node
  calls, the sampler and the federation view (asked of every peer over peer links).
* :mod:`peer.observe.port`: :class:`PeerPort`, what the observer reads of the peer.
* :mod:`peer.observe.http`: :class:`HttpServer` (aiohttp): ``/metrics``, ``/status``, the
  dashboard (``static/``) and its Server-Sent Events.
"""

from __future__ import annotations

from peer.observe.http import HttpServer, current_context
from peer.observe.observer import Observed, Observer
from peer.observe.port import PeerPort

__all__ = ["HttpServer", "Observed", "Observer", "PeerPort", "current_context"]
