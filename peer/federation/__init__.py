"""A peer in a federation: where streams and queries live, and how requests get there.

The rooms, each using only the ones listed before it:

* :mod:`~peer.federation.router`: one table from peer-link message to handler, and calls out;
* :mod:`~peer.federation.records`: the catalog records in the DHT;
* :mod:`~peer.federation.mirror`: streams carried exactly once to peers that read them;
* :mod:`~peer.federation.hosting`: leases, who hosts a stream, taking over from a dead host;
* :mod:`~peer.federation.forward`: any-node push and subscribe;
* :mod:`~peer.federation.coordinator`: queries split into fragments over several peers;
* :mod:`~peer.federation.requests`: what other peers ask of this one;
* :mod:`~peer.federation.service`: the client API of a federated peer (:class:`Federation`).

The federation uses the local site (:mod:`peer.site`) and the overlay; it never imports the
node, the API server, moves or the brain (they register their link requests on the router).
"""

from peer.federation.service import Federation

__all__ = ["Federation"]
