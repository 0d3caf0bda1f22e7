"""A list of peers tried in turn, and pushes retried on them: :class:`PeerList`.

A writer that knows several peers of a federation (any peer takes a push and forwards it to
the stream's primary) keeps one connection, to the first of them that answers. When that
connection is lost, or a reply does not come within the client's timeout, the next try goes
to the next peer of the list (round the list, again and again until the deadline).
:meth:`PeerList.push` retries a batch under its event id (producer, seq), so a batch whose
reply was lost is kept once however often it is sent; :mod:`peer.client.retry` holds the
reasoning and the decisions, this module the waiting and the connections.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from peer.client.connection import Client
from peer.client.retry import Retrying, RetryPolicy
from peer.errors import FedstreamError, InvalidInput, Unavailable
from peer.protocol.replies import PushReply

__all__ = ["Address", "PeerList"]

log = logging.getLogger(__name__)

Address = tuple[str, int]
ClientFactory = Callable[[str, int], Client]


class PeerList:
    """Connections to one peer at a time out of ``addresses``, in the order given.

    ``make_client(host, port)`` makes an unconnected :class:`Client` (with the options of the
    caller: timeout, TLS, network); the default is ``Client(host, port)``. ``draw`` gives the
    random part of the waits, in [0, 1) (tests pass a seeded one).
    """

    def __init__(
        self,
        addresses: Sequence[Address],
        make_client: ClientFactory = Client,
        *,
        draw: Callable[[], float] = random.random,
    ) -> None:
        if not addresses:
            raise ValueError("a peer list needs at least one HOST:PORT")
        self.addresses = list(addresses)
        self._make_client = make_client
        self._draw = draw
        self._next = 0  # where the next connect starts
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        """The current connection (after :meth:`connect`)."""
        if self._client is None:
            raise Unavailable(f"not connected to any peer of {self.described}")
        return self._client

    @property
    def described(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.addresses)

    async def connect(self) -> Client:
        """The current connection if it is alive, else one to the first peer that answers,
        starting after the one that was lost; Unavailable naming each peer's failure if none
        does (Unauthorized at once from a peer that refuses our TLS, or that we refuse)."""
        if self._client is not None:
            if self._client.connected:
                return self._client
            await self.drop()
        failures: list[str] = []
        for i in range(len(self.addresses)):
            index = (self._next + i) % len(self.addresses)
            host, port = self.addresses[index]
            client = self._make_client(host, port)
            try:
                await client.connect()
            except Unavailable as exc:
                failures.append(exc.message)
                continue
            self._client, self._next = client, index
            return client
        if len(failures) == 1:
            raise Unavailable(failures[0], peer=self.described)
        raise Unavailable(
            f"none of the peers {self.described} answered: {'; '.join(failures)}",
            peer=self.described,
        )

    async def drop(self) -> None:
        """Close the current connection; the next :meth:`connect` tries the next peer first."""
        client, self._client = self._client, None
        if client is not None:
            self._next = (self._next + 1) % len(self.addresses)
            await client.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> PeerList:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def push(
        self,
        stream: str,
        data: object,
        *,
        producer: str,
        seq: int,
        policy: RetryPolicy | None = None,
    ) -> PushReply:
        """Push one batch under its event id (``producer``, ``seq``) until a peer has
        accepted it, or already had it (the reply then says ``duplicate``).

        Retriable refusals and lost connections are tried again with the same id, after
        growing waits, moving to the next peer when the connection is gone or a reply is
        overdue; a refusal that is not retriable is raised at once, and when ``policy``'s
        deadline has passed, Unavailable says how far the batch got.
        """
        if not producer:
            raise InvalidInput("push: a retried push needs a producer id", stream=stream)
        if seq < 0:
            raise InvalidInput(f"push: seq must not be negative, not {seq}", stream=stream)
        loop = asyncio.get_running_loop()
        retrying = Retrying(policy or RetryPolicy(), loop.time())
        while True:
            try:
                client = await self.connect()
                return await client.push(stream, data, producer=producer, seq=seq)
            except FedstreamError as exc:
                if not exc.retriable:
                    raise
                wait = retrying.next_wait(loop.time(), self._draw())
                if wait is None:
                    elapsed = loop.time() - retrying.started
                    raise Unavailable(
                        f"push to {stream}: batch {seq} of producer {producer} was not "
                        f"acknowledged after {retrying.attempts} tries in {elapsed:.1f} s "
                        f"(last: {exc.message})",
                        stream=stream,
                        producer=producer,
                        seq=seq,
                    ) from exc
                if self._client is not None and isinstance(exc.__cause__, TimeoutError):
                    await self.drop()  # overdue: this peer is stuck, try the next one
                log.info(
                    "push to %s (producer %s, seq %d) refused, retry %d in %.2f s: %s",
                    stream,
                    producer,
                    seq,
                    retrying.retries,
                    wait,
                    exc.message,
                )
                await asyncio.sleep(wait)
