"""The catalog DHT: the ``kademlia`` library's routing, hardened through its own seams.

Theory of operation
-------------------
``kademlia`` 2.2.3 is used as a routing substrate (see /work/shared/notes/kademlia.md for its
measured defects, D1-D21). Nothing of it is copied; it is extended where it allows, one module
per seam, lowest first:

* :mod:`overlay.dht.store`: :class:`CatalogStorage` is the ``IStorage``: every write path
  checks signature, key, expiry, policy and the owner/sequence rule (D2, D3, D4a, D12, D13).
* :mod:`overlay.dht.protocol`: :class:`CatalogProtocol` (a ``KademliaProtocol``) checks every
  datagram and RPC, and admits a contact to our routing only once it has proven its node id
  with a signed ``hello`` (D4a, D4b, D6, D9, D11, D17).
* :mod:`overlay.dht.server`: :class:`CatalogServer` (a ``Server``) and :class:`RecordCrawl`
  (a ``ValueSpiderCrawl``): verified lookups that tell "absent" from "unreachable", entry
  correction, ack counts, maintenance in one task, neighbours saved as JSON (D7, D8, D15, D16).

The records themselves (:mod:`overlay.records`), the catalog cache on top
(:mod:`overlay.catalog`) and node identities (:mod:`overlay.identity`) sit beside this package.
"""

from __future__ import annotations

from overlay.dht.protocol import HELLO_DOMAIN, Admit, CatalogProtocol, node_id_of
from overlay.dht.server import CatalogServer, DhtError, DhtUnavailable, RecordCrawl
from overlay.dht.store import FULL, CatalogStorage, StorageFull, policy_refusal

__all__ = [
    "FULL",
    "HELLO_DOMAIN",
    "Admit",
    "CatalogProtocol",
    "CatalogServer",
    "CatalogStorage",
    "DhtError",
    "DhtUnavailable",
    "RecordCrawl",
    "StorageFull",
    "node_id_of",
    "policy_refusal",
]
