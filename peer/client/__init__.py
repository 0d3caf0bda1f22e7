"""The asyncio Python client of a peer's API, with the Medusa API names.

::

    async with Client("127.0.0.1", 7700) as client:
        await client.create_schema(schema_xml)
        await client.create_stream("people", schema="people")
        subscription = await client.subscribe("MrX")
        await client.push("people", {"person_name": ["Ann", "X"], "person_id": [1, 2]})
        async for batch in subscription:
            print(batch.rows())

Each request returns its typed reply (:mod:`peer.protocol.replies`): ``create_stream`` a
:class:`~peer.protocol.replies.CreateStreamReply`, ``push`` a
:class:`~peer.protocol.replies.PushReply` (``reply.count``, ``reply.offset``,
``reply.duplicate``), ``lookup_object`` a :class:`~peer.protocol.replies.LookupReply`,
``status`` a :class:`~peer.protocol.replies.StatusReply`, and so on; what a peer adds beyond
the typed fields is in ``reply.extra``. A reply still reads as the map it was before
(``reply["count"]``, ``dict(reply)``, ``reply == {...}``): that dict form is deprecated and
goes in the next release; ``reply.to_wire()`` is the map the peer sent.

Every request waits at most ``timeout_s`` (longer than any wait of the peer's own, see
:data:`~peer.client.connection.DEFAULT_TIMEOUT_S`); a peer error raises the
:mod:`peer.errors` class of its code; losing the connection fails every waiting request and
subscription with :class:`~peer.errors.Unavailable`.

A writer that must not lose or duplicate a batch pushes through a :class:`PeerList`: a list
of peers tried in turn, and each batch retried under its event id (producer, seq) until one
of them has accepted it::

    producer = new_producer_id("sensor")
    async with PeerList([("10.0.0.1", 7700), ("10.0.0.2", 7700)]) as peers:
        for seq, batch in enumerate(batches, start=1):
            await peers.push("readings", batch, producer=producer, seq=seq)

Subscriptions use credit-based flow control: the peer sends at most ``subscription_credit``
batches that the application has not yet taken, so a slow consumer never makes the reader
block, and replies to other requests keep flowing.

A peer whose API port is not on loopback speaks only mutual TLS: give the client a
``participant`` and its ``key_path`` (from ``peer keygen``). It presents a short-lived
certificate signed by that key, and accepts only a peer whose node certificate is issued by a
participant it trusts: its own, or one whose ``NAME.pub`` is in ``trust_dir``. Either side
refusing the other raises :class:`~peer.errors.Unauthorized`.

The layers: :mod:`peer.client.connection` (the :class:`Client`),
:mod:`peer.client.subscription`, :mod:`peer.client.payload` (what is pushed, :class:`Batch`),
:mod:`peer.client.tls`, :mod:`peer.client.peers` (:class:`PeerList`) and
:mod:`peer.client.retry` (when to retry); the messages are :mod:`peer.protocol.api`'s, the
replies :mod:`peer.protocol.replies`'.
"""

from __future__ import annotations

from peer.client.connection import DEFAULT_PORT, DEFAULT_TIMEOUT_S, Client
from peer.client.payload import Batch, batch_payload
from peer.client.peers import Address, PeerList
from peer.client.retry import RetryPolicy, new_producer_id
from peer.client.subscription import Subscription

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "Address",
    "Batch",
    "Client",
    "PeerList",
    "RetryPolicy",
    "Subscription",
    "batch_payload",
    "new_producer_id",
]
