"""The asyncio Python client of a peer's API, with the Medusa API names.

::

    async with Client("127.0.0.1", 7700) as client:
        await client.create_schema(schema_xml)
        await client.create_stream("people", schema="people")
        subscription = await client.subscribe("MrX")
        await client.push("people", {"person_name": ["Ann", "X"], "person_id": [1, 2]})
        async for batch in subscription:
            print(batch.rows())

Every request waits at most ``timeout_s``; a peer error raises the :mod:`peer.errors` class of
its code; losing the connection fails every waiting request and subscription with
:class:`~peer.errors.Unavailable`.

Subscriptions use credit-based flow control: the peer sends at most ``subscription_credit``
batches that the application has not yet taken, so a slow consumer never makes the reader
block, and replies to other requests keep flowing.

A peer whose API port is not on loopback speaks only mutual TLS: give the client a
``participant`` and its ``key_path`` (from ``peer keygen``). It presents a short-lived
certificate signed by that key, and accepts only a peer whose node certificate is issued by a
participant it trusts: its own, or one whose ``NAME.pub`` is in ``trust_dir``. Either side
refusing the other raises :class:`~peer.errors.Unauthorized`.

The layers: :mod:`peer.client.connection` (the :class:`Client`),
:mod:`peer.client.subscription`, :mod:`peer.client.payload` (what is pushed, :class:`Batch`)
and :mod:`peer.client.tls`; the messages are :mod:`peer.protocol.api`'s.
"""

from __future__ import annotations

from peer.client.connection import DEFAULT_PORT, Client
from peer.client.payload import Batch, batch_payload
from peer.client.subscription import Subscription

__all__ = ["DEFAULT_PORT", "Batch", "Client", "Subscription", "batch_payload"]
