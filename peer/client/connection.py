"""The client's connection to one peer's API: :class:`Client`, the asyncio driver of a
:class:`~peer.protocol.api_connection.ClientConnection`.

The state machine numbers the requests, learns the frame limit from the hello reply, keeps
each subscription's credit and says what each frame from the peer means; this module holds
the stream and the waiting. One task (the reader) hands every frame of the connection to the
state machine and acts on the event: a reply wakes the request waiting on its ``id``, a
``batch`` goes to its subscription. Every request waits at most ``timeout_s``; a peer error
raises the :mod:`peer.errors` class of its code; losing the connection (or a frame that breaks
the protocol) fails every waiting request and subscription with
:class:`~peer.errors.Unavailable`. Messages are :mod:`peer.protocol.api`'s typed values and
each method returns its request's typed reply (:mod:`peer.protocol.replies`; reading one as a
dict, ``reply["count"]``, is the deprecated form of before, kept for one release); the
connection is opened through :mod:`overlay.transport` (a ``network=`` of
:class:`~overlay.transport.MemoryNetwork` runs it without sockets, in tests).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.transport import TCP, FrameStream, Network
from peer.client.payload import Batch, batch_payload
from peer.client.sql import ScriptSubmitted
from peer.client.subscription import Subscription
from peer.errors import FedstreamError, InvalidInput, Unauthorized, Unavailable
from peer.model.sql import is_sql
from peer.protocol.api import (
    PROTOCOL_VERSION,
    CreateQuery,
    CreateSchema,
    CreateSql,
    CreateStream,
    Credit,
    Hello,
    Lookup,
    Push,
    Request,
    SetQueryStatus,
    Status,
)
from peer.protocol.api_connection import ClientConnection
from peer.protocol.api_events import (
    BatchReceived,
    ClientEvent,
    ConnectionClosed,
    Farewell,
    Ignored,
    RawRequest,
    Replied,
    RequestFailed,
    SubscriptionEnded,
)
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateSqlReply,
    CreateStreamReply,
    HelloReply,
    LookupReply,
    PushReply,
    Reply,
    SetQueryStatusReply,
    StatusReply,
)

if TYPE_CHECKING:  # cryptography is imported only by clients that use TLS
    from overlay.identity import TrustStore

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "SERVER_LONGEST_WAIT_S",
    "Client",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 7700

# How long a peer may take, at most, before it answers a request on purpose: a push waits up
# to 30 s for room in a backlogged stream (``backlog_wait_s`` of peer.site.SiteConfig and
# peer.node.PeerConfig), and a peer forwarding a push tries the stream's host for up to 30 s
# (peer.federation.forward.FORWARD_DEADLINE_S); either then answers with a retriable refusal.
SERVER_LONGEST_WAIT_S = 30.0
# A request waits longer than that (by half again), so that a peer that is only waiting gets
# to answer, with its reply or its refusal, before the client gives up: a timeout then means
# a lost or stuck peer, never a busy one. (Equal waits made every slow push ambiguous: the
# client gave up just as the peer appended it.) tests/unit/test_client_retry.py checks the
# order of these numbers against the server's.
DEFAULT_TIMEOUT_S = 45.0
# Opening a connection (TCP, and the TLS handshake) takes milliseconds when the peer is there;
# a short bound lets a list of peers move on past one that is not (peer.client.peers).
DEFAULT_CONNECT_TIMEOUT_S = 10.0

OnOk = Callable[[Reply], None]
R = TypeVar("R", bound=Reply)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Reply | dict[str, Any]]  # (a bare map: the reply to a RawRequest)
    on_ok: OnOk | None


class Client:
    """A connection to one peer's client API.

    With ``participant`` and ``key_path`` the connection is mutual TLS (see the module
    notes); ``trust_dir`` holds the ``NAME.pub`` of the participants whose peers the client
    accepts besides its own. ``ssl`` is for a TLS context made by hand instead. ``network``
    is where to connect: the real one, or a :class:`~overlay.transport.MemoryNetwork` in tests.

    ``timeout_s`` bounds each request (see :data:`DEFAULT_TIMEOUT_S` for why it exceeds the
    peer's own waits); ``connect_timeout_s`` bounds opening the connection (default the
    smaller of ``timeout_s`` and :data:`DEFAULT_CONNECT_TIMEOUT_S`).

    Each request method returns the typed reply of its kind (:mod:`peer.protocol.replies`),
    and ``server_info`` is the :class:`~peer.protocol.replies.HelloReply`. Deprecated: reading
    a reply as a dict (``reply["offset"]``, ``reply.get(...)``, ``dict(reply)``, comparing it
    with a dict) still works in this release and goes in the next; use its attributes, its
    ``extra`` for fields beyond them, or ``to_wire()`` for the map itself.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float | None = None,
        client_name: str = "fedstream-python",
        subscription_credit: int = 64,
        participant: str | None = None,
        key_path: Path | None = None,
        trust_dir: Path | None = None,
        ssl: ssl.SSLContext | None = None,
        network: Network = TCP,
    ) -> None:
        if subscription_credit < 1:
            raise ValueError("subscription_credit must be at least 1")
        if (participant is None) != (key_path is None):
            raise ValueError("participant and key_path go together (the key is the participant's)")
        if trust_dir is not None and key_path is None:
            raise ValueError("trust_dir is for TLS: it needs participant and key_path too")
        if ssl is not None and key_path is not None:
            raise ValueError("give either ssl or participant and key_path, not both")
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.connect_timeout_s = (
            min(timeout_s, DEFAULT_CONNECT_TIMEOUT_S)
            if connect_timeout_s is None
            else connect_timeout_s
        )
        self.client_name = client_name
        self.subscription_credit = subscription_credit
        self.participant = participant
        self.key_path = key_path
        self.trust_dir = trust_dir
        self.server_info: HelloReply | None = None  # the peer's answer to hello, once connected
        self.server_participant: str | None = None  # proven by the peer's TLS certificate
        self._ssl = ssl
        self._network = network
        self._trust: TrustStore | None = None
        self._heard = False  # any frame arrived on this connection
        self._stream: FrameStream | None = None
        self._conn: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)  # shared by its connections: no id is ever reused
        self._pending: dict[int, _Pending] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._subscription_port = _Port(self, self._subscriptions)
        self._lost: FedstreamError | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        """Connected, and the connection not lost (a lost one needs :meth:`close` first)."""
        return self._stream is not None and self._lost is None

    @property
    def uses_tls(self) -> bool:
        return self._ssl is not None or self.key_path is not None

    async def connect(self) -> None:
        """Connect and say hello (raises Unavailable if the peer cannot be reached,
        Unauthorized if TLS fails because either side does not trust the other)."""
        if self._stream is not None:
            return
        self._stream = await self._open()
        self._conn = ClientConnection(ids=self._ids)
        self._lost = None
        self._heard = False
        self._reader = asyncio.create_task(self._read_loop(self._stream, self._conn))
        try:
            self.server_info = await self._ask(
                Hello(self.client_name, PROTOCOL_VERSION), HelloReply
            )
        except Unavailable as exc:
            await self.close()
            if self._heard or isinstance(exc.__cause__, TimeoutError):
                raise
            raise self._dropped_error() from exc
        except BaseException:
            await self.close()
            raise

    async def _open(self) -> FrameStream:
        context = self._ssl_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                stream = await self._network.connect(self.host, self.port, tls=context)
        except ssl.SSLCertVerificationError as exc:
            raise Unauthorized(
                f"refusing peer {self.address}: its TLS certificate is not issued by a "
                f"participant this client trusts ({exc.verify_message}); put that participant's "
                "NAME.pub in the trust directory",
                peer=self.address,
            ) from exc
        except ssl.SSLError as exc:
            raise Unavailable(
                f"TLS handshake with peer {self.address} failed ({exc.reason or exc}); does it "
                "serve TLS on that port? (a peer on loopback serves plain TCP)",
                peer=self.address,
            ) from exc
        except OSError as exc:  # TimeoutError included
            raise Unavailable(
                f"cannot connect to peer {self.address}: {exc or 'timed out'}", peer=self.address
            ) from exc
        if self._trust is not None:
            from peer.client.tls import server_participant

            try:
                self.server_participant = server_participant(
                    stream.ssl_object, self._trust, self.address
                )
            except Unauthorized:
                await stream.aclose()
                raise
        return stream

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for one connection: made anew each time, as the client
        certificate it presents is short-lived."""
        if self.key_path is None or self.participant is None:
            return self._ssl
        from peer.client.tls import participant_context

        context, self._trust = participant_context(self.participant, self.key_path, self.trust_dir)
        return context

    def _dropped_error(self) -> FedstreamError:
        """Why a peer closed the connection before answering hello, as best we can tell."""
        if self.uses_tls:
            peer = f"peer {self.address}"
            if self.server_participant is not None:
                peer += f" (participant {self.server_participant!r})"
            us = (
                f"participant {self.participant!r} (or this key of it)"
                if self.participant is not None
                else "the client certificate"
            )
            return Unauthorized(
                f"{peer} closed the connection after the TLS handshake: it does not trust {us}",
                peer=self.address,
            )
        return Unavailable(
            f"peer {self.address} closed the connection before answering hello (if its API "
            "port is not on loopback, it requires TLS: connect as a participant, with its key)",
            peer=self.address,
        )

    async def close(self) -> None:
        """Close the connection; waiting requests and subscriptions get Unavailable."""
        stream, reader, conn = self._stream, self._reader, self._conn
        if stream is None:
            return
        self._stream = self._reader = self._conn = None
        if reader is not None:
            reader.cancel()
            await asyncio.wait({reader})
        if conn is not None:
            conn.close()
        await stream.aclose()
        self._fail_all(Unavailable(f"client of peer {self.address} closed", peer=self.address))

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the API ---------------------------------------------------------------------------

    async def create_schema(self, schema: str | Mapping[str, Any]) -> CreateSchemaReply:
        """Create a schema from Medusa XML, JSON text, or a dict."""
        return await self._ask(CreateSchema(_plain(schema)), CreateSchemaReply)

    async def create_stream(
        self, name: str, schema: str, *, replicas: int | None = None
    ) -> CreateStreamReply:
        """Create a stream; ``replicas``: how many peers hold it (default: the peer's)."""
        return await self._ask(CreateStream(name, schema, replicas), CreateStreamReply)

    async def create_query(
        self, query: str | Mapping[str, Any], *, name: str = "query"
    ) -> CreateQueryReply:
        """Submit a query: Medusa/Borealis XML, JSON text, a dict, or a SQL script (sent to the
        peer to compile, see :meth:`submit_sql`; ``name`` names its INSERT without CREATE
        QUERY). For a script the reply names its last query, and ``extra`` holds what
        :meth:`submit_sql` returns (its streams, queries and warnings)."""
        if isinstance(query, str) and is_sql(query):
            done = await self.submit_sql(query, name=name)
            last = done.queries[-1] if done.queries else ""
            return CreateQueryReply(last, "SETUP", extra=done.to_wire())
        return await self._ask(CreateQuery(_plain(query)), CreateQueryReply)

    async def submit_sql(
        self, text: str, *, name: str = "query", start: bool = False, namespace: str = ""
    ) -> ScriptSubmitted:
        """Send a SQL script (docs/sql.md) for the peer to compile (``create_sql``); the peer
        creates its streams and queries in order, starting them when ``start``. A script the
        compiler refuses raises :class:`~peer.errors.SqlError` (line, column, reason), and
        nothing of it is created."""
        reply = await self._ask(CreateSql(text, name, start, namespace), CreateSqlReply)
        return ScriptSubmitted(
            tuple(reply.streams), tuple(reply.queries), reply.started, tuple(reply.warnings)
        )

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply:
        """SETUP, RUNNING, STOPPED or DELETED."""
        return await self._ask(SetQueryStatus(name, status), SetQueryStatusReply)

    async def start_query(self, name: str) -> SetQueryStatusReply:
        return await self.set_query_status(name, "RUNNING")

    async def stop_query(self, name: str) -> SetQueryStatusReply:
        return await self.set_query_status(name, "STOPPED")

    async def delete_query(self, name: str) -> SetQueryStatusReply:
        return await self.set_query_status(name, "DELETED")

    async def push(
        self, stream: str, data: object, *, producer: str | None = None, seq: int | None = None
    ) -> PushReply:
        """Push a batch (pyarrow Table, dict of columns, or list of row dicts); returns once
        the peer has durably accepted all of it. ``producer``/``seq`` make retries safe: the
        peer drops a batch whose (producer, seq) it has already accepted (a seq at or below
        the highest it holds of that producer), and says ``duplicate``. This sends once;
        :meth:`peer.client.PeerList.push` retries."""
        return await self._ask(Push(stream, batch_payload(data), producer, seq), PushReply)

    async def post_event(self, stream: str, event: Mapping[str, Any]) -> PushReply:
        """Push one tuple."""
        return await self.push(stream, [event])

    def subscribe(
        self, stream: str, start: str = "latest", *, tentative: bool = False
    ) -> Subscription:
        """Subscribe to ``stream`` from ``"latest"`` or ``"earliest"``.

        ``sub = await client.subscribe(s)`` waits until the peer has accepted (every tuple
        pushed after that is delivered); ``async for batch in client.subscribe(s)`` works too.
        With ``tentative``, results of a query missing an input come too, marked
        (``Batch.status``), and their correction as a batch without tuples whose ``undo``
        takes back every tentative tuple from that offset on (docs/protocol.md, section 5).
        """
        credit = self.subscription_credit
        return Subscription(self._subscription_port, stream, start, credit, tentative)

    async def receive_events(
        self,
        stream: str,
        limit: int | None = None,
        timeout_s: float | None = None,
        *,
        start: str = "latest",
    ) -> list[dict[str, Any]]:
        """Collect tuples of ``stream`` as row dicts until ``limit`` have arrived or
        ``timeout_s`` (default: the client's timeout) has passed; returns what arrived."""
        rows: list[dict[str, Any]] = []
        async with await self.subscribe(stream, start) as sub:
            try:
                async with asyncio.timeout(self.timeout_s if timeout_s is None else timeout_s):
                    async for batch in sub:
                        rows.extend(batch.rows())
                        if limit is not None and len(rows) >= limit:
                            break
            except TimeoutError:
                pass  # time is up: return what arrived
        return rows if limit is None else rows[:limit]

    async def lookup_object(self, name: str) -> LookupReply:
        """What the catalog knows about a schema, stream, query, participant or peer."""
        return await self._ask(Lookup(name), LookupReply)

    async def status(self) -> StatusReply:
        """The peer's status (for people and dashboards; docs/protocol.md, section 3)."""
        return await self._ask(Status(), StatusReply)

    # -- plumbing --------------------------------------------------------------------------

    async def _ask(self, request: Request, kind: type[R], *, on_ok: OnOk | None = None) -> R:
        """Send a typed request and return its typed result."""
        reply = await self._round_trip(request, on_ok)
        if not isinstance(reply, kind):  # (the connection decoded it by the request's op)
            raise RemoteProtocolError(f"{request.op}: a reply of another kind")
        return reply

    async def _request(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Send any request, typed or not (tests send what a typed one cannot): its bare
        result map."""
        reply = await self._round_trip(RawRequest(op, args), None)
        return reply if isinstance(reply, dict) else reply.to_wire()

    async def _round_trip(
        self, request: Request | RawRequest, on_ok: OnOk | None
    ) -> Reply | dict[str, Any]:
        op = request.op
        conn, stream = self._live()
        try:
            rid, data = conn.send_request(request)
        except LocalProtocolError as exc:  # larger than the peer takes: nothing was sent
            raise InvalidInput(f"{op}: {exc}", op=op) from exc
        future: asyncio.Future[Reply | dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(future, on_ok)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._write(stream, data)
                return await future
        except TimeoutError as exc:
            raise Unavailable(
                f"{op}: no reply from peer {self.address} within {self.timeout_s:g} s",
                op=op,
                peer=self.address,
            ) from exc
        finally:
            self._pending.pop(rid, None)
            conn.abandon(rid)

    async def _send_credit(self, credit: Credit) -> None:
        conn, stream = self._live()
        await self._write(stream, conn.send_credit(credit))

    def _live(self) -> tuple[ClientConnection, FrameStream]:
        conn, stream = self._conn, self._stream
        if conn is None or stream is None or self._lost is not None:
            raise self._lost_error(f"not connected to peer {self.address}")
        return conn, stream

    async def _write(self, stream: FrameStream, data: bytes) -> None:
        try:
            await stream.send_encoded(data)
        except OSError as exc:
            raise self._lost_error(f"connection to peer {self.address} lost: {exc}") from exc

    def _lost_error(self, message: str) -> FedstreamError:
        if self._lost is not None:
            return Unavailable(self._lost.message, **self._lost.details)
        return Unavailable(message, peer=self.address)

    async def _read_loop(self, stream: FrameStream, conn: ClientConnection) -> None:
        try:
            while True:
                frame = await stream.recv()
                if frame is not None:
                    self._heard = True
                event = conn.receive(frame)
                if isinstance(event, ConnectionClosed):
                    break
                self._dispatch(event)
            reason = f"peer {self.address} closed the connection"
        except RemoteProtocolError as exc:
            log.warning("peer %s broke the protocol: %s", self.address, exc)
            reason = f"peer {self.address} sent an invalid frame: {exc}"
        except OSError as exc:
            reason = f"connection to peer {self.address} lost: {exc!r}"
        except Exception:
            # A bug here must not leave requests waiting for replies nobody will route.
            log.exception("client reader of peer %s failed", self.address)
            reason = f"client reader of peer {self.address} failed"
        self._fail_all(Unavailable(reason, peer=self.address))

    def _dispatch(self, event: ClientEvent) -> None:
        match event:
            case BatchReceived(batch=batch):
                sub = self._subscriptions.get(batch.subscription)
                if sub is not None:
                    sub.deliver(
                        Batch(
                            batch.stream,
                            batch.offset,
                            batch.columns,
                            batch.part,
                            batch.parts,
                            batch.status or "stable",
                            batch.undo,
                        )
                    )
            case Replied(id=rid, result=result):
                if (pending := self._waiting(rid)) is not None:
                    if pending.on_ok is not None and not isinstance(result, dict):
                        pending.on_ok(result)
                    pending.future.set_result(result)
            case RequestFailed(id=rid, error=error):
                if (pending := self._waiting(rid)) is not None:
                    pending.future.set_exception(error)
            case SubscriptionEnded(subscription=sid, error=error):
                ended = self._subscriptions.pop(sid, None)
                if ended is not None:
                    ended.finish(error)
            case Farewell(code=code, message=message):
                # Not tied to a request: the peer is about to close the connection.
                self._lost = Unavailable(
                    f"peer {self.address} is closing the connection: {message}",
                    peer=self.address,
                    code=code,
                )
                log.warning("%s", self._lost.message)
            case Ignored(reason=reason):
                log.debug("ignoring %s from %s", reason, self.address)

    def _waiting(self, rid: int) -> _Pending | None:
        pending = self._pending.pop(rid, None)
        if pending is None or pending.future.done():
            log.debug("reply to request %s that nobody waits for", rid)
            return None
        return pending

    def _fail_all(self, error: Unavailable) -> None:
        if self._lost is None:
            self._lost = error
        reason = self._lost
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(Unavailable(reason.message, **reason.details))
        self._pending.clear()
        for sub in self._subscriptions.values():
            sub.finish(Unavailable(reason.message, **reason.details))
        self._subscriptions.clear()


def _plain(definition: str | Mapping[str, Any]) -> str | dict[str, Any]:
    return definition if isinstance(definition, str) else dict(definition)


class _Port:
    """What the client's subscriptions need of it (a SubscriptionPort)."""

    def __init__(self, client: Client, subscriptions: dict[int, Subscription]) -> None:
        self._client = client
        self._subscriptions = subscriptions  # the client's table: attached here, read there

    async def request(self, request: Request, *, on_ok: OnOk | None = None) -> Reply:
        reply = await self._client._round_trip(request, on_ok)
        if isinstance(reply, dict):  # (only a RawRequest is answered with a bare map)
            raise RemoteProtocolError(f"{request.op}: an untyped reply")
        return reply

    async def send(self, message: Credit) -> None:
        await self._client._send_credit(message)

    def taken(self, sid: int) -> Credit | None:
        conn = self._client._conn
        return None if conn is None else conn.taken(sid)

    def attach(self, sid: int, subscription: Subscription) -> None:
        self._subscriptions[sid] = subscription

    def detach(self, sid: int) -> None:
        self._subscriptions.pop(sid, None)
