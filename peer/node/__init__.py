"""One peer, wired together (the composition root; docs/architecture.md).

- :mod:`peer.node.config`: :class:`PeerConfig`, what ``peer join`` sets;
- :mod:`peer.node.peer`: :class:`Peer`, its objects built in dependency order and run in one
  TaskGroup;
- :mod:`peer.node.client_service`: :class:`ClientService`, what the client API server calls;
- :mod:`peer.node.ports`: what the wired parts see of each other (the overlay's door to the
  federation, the brain's view of the peer);
- :mod:`peer.node.replication`: the replication room (control plane, replicated fragments)
  the federation is given, and the door through which the plane tells it of role changes.
"""

from peer.node.client_service import ClientService
from peer.node.config import PeerConfig
from peer.node.peer import Peer

__all__ = ["ClientService", "Peer", "PeerConfig"]
