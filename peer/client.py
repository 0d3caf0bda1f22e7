"""The asyncio Python client of a peer's API, with the Medusa API names.

::

    async with Client("127.0.0.1", 7700) as client:
        await client.create_schema(schema_xml)
        await client.create_stream("people", schema="people")
        subscription = await client.subscribe("MrX")
        await client.push("people", {"person_name": ["Ann", "X"], "person_id": [1, 2]})
        async for batch in subscription:
            print(batch.rows())

One task (the reader) reads every frame of the connection and routes it: replies to the
request waiting on their ``id``, ``batch`` frames to their subscription. Every request waits
at most ``timeout_s``; a peer error raises the :mod:`peer.errors` class of its code; losing the
connection fails every waiting request and subscription with
:class:`~peer.errors.Unavailable`.

Subscriptions use credit-based flow control: the peer sends at most ``subscription_credit``
batches that the application has not yet taken, so a slow consumer never makes the reader
block, and replies to other requests keep flowing.

A peer whose API port is not on loopback speaks only mutual TLS: give the client a
``participant`` and its ``key_path`` (from ``peer keygen``). It presents a short-lived
certificate signed by that key, and accepts only a peer whose node certificate is issued by a
participant it trusts: its own, or one whose ``NAME.pub`` is in ``trust_dir``. Either side
refusing the other raises :class:`~peer.errors.Unauthorized`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.stream import FrameStream
from overlay.wire import DEFAULT_MAX_FRAME_BYTES, encode_frame
from peer.api import PROTOCOL_VERSION
from peer.errors import (
    FedstreamError,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
    from_wire,
)

if TYPE_CHECKING:  # cryptography is imported only by clients that use TLS
    from overlay.identity import TrustStore

__all__ = ["DEFAULT_PORT", "Batch", "Client", "Subscription"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 7700
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Batch:
    """Tuples of one stream as delivered by a subscription, column-wise."""

    stream: str
    offset: int  # the batch's position in the stream's log (increasing)
    columns: dict[str, list[Any]]
    part: int = 0  # a batch too big for one frame comes as parts 0..parts-1, same offset
    parts: int = 1

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values()), []))

    def rows(self) -> list[dict[str, Any]]:
        names = list(self.columns)
        return [
            dict(zip(names, values, strict=True))
            for values in zip(*self.columns.values(), strict=True)
        ]


def _wire_value(value: Any) -> Any:
    # Timestamps travel as int microseconds since the epoch, UTC (naive datetimes are UTC).
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return (aware - _EPOCH) // _MICROSECOND
    return value


def _column(values: Any) -> list[Any]:
    if hasattr(values, "tolist"):  # numpy arrays, pandas Series: plain Python values
        values = values.tolist()
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidInput(f"a column must be a sequence of values, not {type(values).__name__}")
    return [_wire_value(v) for v in values]


def batch_payload(data: Any) -> dict[str, Any]:
    """The batch part of a ``push`` frame for a pyarrow Table/RecordBatch, a mapping of
    columns, or a sequence of row mappings. A payload already in wire form
    (``{"columns": {...}}``, ``{"rows": [...]}``, ``{"arrow": bytes}``) is accepted too."""
    if isinstance(data, Mapping) and len(data) == 1:
        ((key, value),) = data.items()
        if key == "columns" and isinstance(value, Mapping):
            return batch_payload(value)
        if (
            key == "rows"
            and isinstance(value, list | tuple)
            and all(isinstance(row, Mapping) for row in value)
        ):
            return batch_payload(value)
        if key == "arrow" and isinstance(value, bytes | bytearray | memoryview):
            return {"arrow": bytes(value)}
    if isinstance(data, Mapping):
        return {"columns": {str(name): _column(values) for name, values in data.items()}}
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        rows = []
        for i, row in enumerate(data):
            if not isinstance(row, Mapping):
                raise InvalidInput(f"row {i} is a {type(row).__name__}, not a mapping", row=i)
            rows.append({str(k): _wire_value(v) for k, v in row.items()})
        return {"rows": rows}
    import pyarrow as pa  # only for Arrow input: keeps `import peer.client` light

    if isinstance(data, pa.Table | pa.RecordBatch):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write(data)
        return {"arrow": sink.getvalue().to_pybytes()}
    raise InvalidInput(
        f"cannot push a {type(data).__name__}: give a pyarrow Table, a dict of columns "
        "or a list of row dicts"
    )


def _error_from_frame(frame: Mapping[str, Any]) -> FedstreamError:
    err = from_wire(dict(frame))
    code = frame.get("code")
    if isinstance(code, str) and err.code != code:
        err.code = code  # a code this client has no class for ("internal", "protocol"): keep it
    return err


class Subscription:
    """An async iterator of :class:`Batch` (from :meth:`Client.subscribe`).

    ``await client.subscribe(...)`` returns it once the peer has accepted it (so nothing pushed
    after that is missed); ``async for batch in client.subscribe(...)`` subscribes on the
    first iteration. ``aclose()`` (or leaving ``async with``) unsubscribes. Iteration ends
    when the peer ends the subscription; it raises the peer's error if it failed, and
    :class:`~peer.errors.Unavailable` if the connection was lost.
    """

    def __init__(self, client: Client, stream: str, start: str, credit: int) -> None:
        self.stream = stream
        self.start = start
        self.sid: int | None = None
        self._client = client
        self._credit = credit
        self._opened = False
        self._taken = 0  # batches taken since the last credit grant
        self._queue: asyncio.Queue[Batch | FedstreamError | None] = asyncio.Queue()
        self._finished = False  # the peer ended it, or the connection is gone
        self._closed = False  # the application is done with it

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self._open().__await__()

    async def _open(self) -> Subscription:
        if self._opened:
            return self
        self._opened = True
        try:
            await self._client._request(
                "subscribe",
                {"stream": self.stream, "start": self.start, "credit": self._credit},
                on_ok=self._register,
            )
        except BaseException:
            self._closed = True
            raise
        return self

    def _register(self, result: dict[str, Any]) -> None:
        # Runs in the client's reader, before it reads the frame after the reply: no batch
        # can arrive before the subscription is known.
        sid = result.get("subscription")
        if not isinstance(sid, int):
            raise RemoteProtocolError("subscribe reply has no integer 'subscription'")
        self.sid = sid
        self._client._subscriptions[sid] = self

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Batch:
        if not self._opened:
            await self._open()
        if self._closed:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, FedstreamError):
            self._closed = True
            raise item
        self._taken += 1
        if self._taken * 2 >= self._credit and not self._finished:
            await self._grant()
        return item

    async def next_batch(self, timeout_s: float) -> Batch | None:
        """The next batch, or None if none arrives within ``timeout_s`` or the subscription
        has ended."""
        try:
            async with asyncio.timeout(timeout_s):
                return await anext(self)
        except (TimeoutError, StopAsyncIteration):
            return None

    async def aclose(self) -> None:
        """Unsubscribe (no more batches are delivered after this returns)."""
        if self._closed:
            return
        self._closed = True
        if not self._finished and self.sid is not None:
            self._finished = True
            self._client._subscriptions.pop(self.sid, None)
            # NotFound: it ended on its own; Unavailable: the connection is gone. Either way
            # there is nothing left to undo.
            with contextlib.suppress(NotFound, Unavailable):
                await self._client._request("unsubscribe", {"subscription": self.sid})

    async def __aenter__(self) -> Subscription:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _grant(self) -> None:
        batches, self._taken = self._taken, 0
        # If the connection is gone the reader has seen (or will see) it and ends us.
        with contextlib.suppress(Unavailable):
            await self._client._send(
                {"type": "credit", "subscription": self.sid, "batches": batches}
            )

    def _deliver(self, batch: Batch) -> None:
        if self._queue.qsize() >= self._credit:
            raise RemoteProtocolError(f"peer sent more batches than the credit of {self._credit}")
        self._queue.put_nowait(batch)

    def _finish(self, error: FedstreamError | None) -> None:
        if not self._finished:
            self._finished = True
            self._queue.put_nowait(error)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[dict[str, Any]]
    on_ok: Callable[[dict[str, Any]], None] | None


class Client:
    """A connection to one peer's client API.

    With ``participant`` and ``key_path`` the connection is mutual TLS (see the module
    notes); ``trust_dir`` holds the ``NAME.pub`` of the participants whose peers the client
    accepts besides its own. ``ssl`` is for a TLS context made by hand instead.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        timeout_s: float = 30.0,
        client_name: str = "fedstream-python",
        subscription_credit: int = 64,
        participant: str | None = None,
        key_path: Path | None = None,
        trust_dir: Path | None = None,
        ssl: ssl.SSLContext | None = None,
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
        self.client_name = client_name
        self.subscription_credit = subscription_credit
        self.participant = participant
        self.key_path = key_path
        self.trust_dir = trust_dir
        self.server_info: dict[str, Any] = {}
        self.server_participant: str | None = None  # proven by the peer's TLS certificate
        self._ssl = ssl
        self._trust: TrustStore | None = None
        self._heard = False  # any frame arrived on this connection
        self._max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        self._stream: FrameStream | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._subscriptions: dict[int, Subscription] = {}
        self._lost: FedstreamError | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def uses_tls(self) -> bool:
        return self._ssl is not None or self.key_path is not None

    async def connect(self) -> None:
        """Connect and say hello (raises Unavailable if the peer cannot be reached,
        Unauthorized if TLS fails because either side does not trust the other)."""
        if self._stream is not None:
            return
        self._stream = await self._open()
        self._lost = None
        self._heard = False
        self._reader = asyncio.create_task(self._read_loop(self._stream))
        try:
            self.server_info = await self._request(
                "hello", {"client": self.client_name, "version": PROTOCOL_VERSION}
            )
        except Unavailable as exc:
            await self.close()
            if self._heard or isinstance(exc.__cause__, TimeoutError):
                raise
            raise self._dropped_error() from exc
        except BaseException:
            await self.close()
            raise
        self._max_frame_bytes = int(
            self.server_info.get("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES)
        )

    async def _open(self) -> FrameStream:
        context = self._ssl_context()
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=context)
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
        stream = FrameStream(reader, writer)
        if self._trust is not None:
            from overlay.identity import IdentityError
            from overlay.tls import peer_identity

            try:
                remote = peer_identity(writer.get_extra_info("ssl_object"), self._trust)
            except IdentityError as exc:
                await stream.aclose()
                raise Unauthorized(
                    f"refusing peer {self.address}: {exc.reason}", peer=self.address
                ) from exc
            self.server_participant = remote.participant
        return stream

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for one connection: made anew each time, as the client
        certificate it presents is short-lived."""
        if self.key_path is None or self.participant is None:
            return self._ssl
        from contracts.keys import KeyError_, load_private
        from overlay.identity import IdentityError, TrustStore
        from overlay.tls import client_cert_context

        try:
            key = load_private(self.key_path)
            trust = TrustStore()
            trust.add(self.participant, key.public_key())
            if self.trust_dir is not None:
                if not self.trust_dir.is_dir():
                    raise IdentityError(f"trust directory {self.trust_dir} does not exist")
                trust.load_dir(self.trust_dir)
            context = client_cert_context(self.participant, key, trust)
        except (KeyError_, IdentityError) as exc:
            raise InvalidInput(
                f"cannot act as participant {self.participant!r} with key {self.key_path}: {exc}",
                participant=self.participant,
            ) from exc
        self._trust = trust
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
        stream, reader = self._stream, self._reader
        if stream is None:
            return
        self._stream = self._reader = None
        if reader is not None:
            reader.cancel()
            await asyncio.wait({reader})
        await stream.aclose()
        self._fail_all(Unavailable(f"client of peer {self.address} closed", peer=self.address))

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- the API ---------------------------------------------------------------------------

    async def create_schema(self, schema: str | Mapping[str, Any]) -> dict[str, Any]:
        """Create a schema from Medusa XML, JSON text, or a dict."""
        return await self._request("create_schema", {"schema": _plain(schema)})

    async def create_stream(self, name: str, schema: str) -> dict[str, Any]:
        return await self._request("create_stream", {"name": name, "schema": schema})

    async def create_query(self, query: str | Mapping[str, Any]) -> dict[str, Any]:
        """Submit a query: Medusa/Borealis XML, JSON text, or a dict."""
        return await self._request("create_query", {"query": _plain(query)})

    async def set_query_status(self, name: str, status: str) -> dict[str, Any]:
        """SETUP, RUNNING, STOPPED or DELETED."""
        return await self._request("set_query_status", {"name": name, "status": status})

    async def start_query(self, name: str) -> dict[str, Any]:
        return await self.set_query_status(name, "RUNNING")

    async def stop_query(self, name: str) -> dict[str, Any]:
        return await self.set_query_status(name, "STOPPED")

    async def delete_query(self, name: str) -> dict[str, Any]:
        return await self.set_query_status(name, "DELETED")

    async def push(
        self, stream: str, data: Any, *, producer: str | None = None, seq: int | None = None
    ) -> dict[str, Any]:
        """Push a batch (pyarrow Table, dict of columns, or list of row dicts); returns once
        the peer has durably accepted all of it. ``producer``/``seq`` make retries safe: the
        peer drops a batch whose (producer, seq) it has already accepted."""
        args: dict[str, Any] = {"stream": stream, **batch_payload(data)}
        if producer is not None:
            args["producer"] = producer
        if seq is not None:
            args["seq"] = seq
        return await self._request("push", args)

    async def post_event(self, stream: str, event: Mapping[str, Any]) -> dict[str, Any]:
        """Push one tuple."""
        return await self.push(stream, [event])

    def subscribe(self, stream: str, start: str = "latest") -> Subscription:
        """Subscribe to ``stream`` from ``"latest"`` or ``"earliest"``.

        ``sub = await client.subscribe(s)`` waits until the peer has accepted (every tuple
        pushed after that is delivered); ``async for batch in client.subscribe(s)`` works too.
        """
        return Subscription(self, stream, start, self.subscription_credit)

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

    async def lookup_object(self, name: str) -> dict[str, Any]:
        """What the catalog knows about a schema, stream, query, participant or peer."""
        return await self._request("lookup", {"name": name})

    async def status(self) -> dict[str, Any]:
        return await self._request("status", {})

    # -- plumbing --------------------------------------------------------------------------

    async def _request(
        self,
        op: str,
        args: dict[str, Any],
        *,
        on_ok: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(future, on_ok)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._send({"type": op, "id": rid, **args})
                return await future
        except TimeoutError as exc:
            raise Unavailable(
                f"{op}: no reply from peer {self.address} within {self.timeout_s:g} s",
                op=op,
                peer=self.address,
            ) from exc
        finally:
            self._pending.pop(rid, None)

    async def _send(self, frame: dict[str, Any]) -> None:
        stream = self._stream
        if stream is None or self._lost is not None:
            raise self._lost_error(f"not connected to peer {self.address}")
        try:
            data = encode_frame(frame, max_frame_bytes=self._max_frame_bytes)
        except LocalProtocolError as exc:
            raise InvalidInput(f"{frame['type']}: {exc}", op=frame["type"]) from exc
        try:
            await stream.send_encoded(data)
        except OSError as exc:
            raise self._lost_error(f"connection to peer {self.address} lost: {exc}") from exc

    def _lost_error(self, message: str) -> FedstreamError:
        if self._lost is not None:
            return Unavailable(self._lost.message, **self._lost.details)
        return Unavailable(message, peer=self.address)

    async def _read_loop(self, stream: FrameStream) -> None:
        try:
            while (frame := await stream.recv()) is not None:
                self._heard = True
                self._dispatch(frame)
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

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        rid = frame.get("id")
        if kind in ("ok", "error") and isinstance(rid, int):
            pending = self._pending.pop(rid, None)
            if pending is None or pending.future.done():
                log.debug("reply to request %s that nobody waits for", rid)
            elif kind == "ok":
                result = frame.get("result")
                if not isinstance(result, dict):
                    raise RemoteProtocolError(f"reply to request {rid} has no result map")
                if pending.on_ok is not None:
                    pending.on_ok(result)
                pending.future.set_result(result)
            else:
                pending.future.set_exception(_error_from_frame(frame))
        elif kind == "batch":
            sid, offset, stream, columns = (
                frame.get(k) for k in ("subscription", "offset", "stream", "columns")
            )
            part, parts = frame.get("part", 0), frame.get("parts", 1)
            if not (
                isinstance(sid, int)
                and isinstance(offset, int)
                and isinstance(stream, str)
                and isinstance(columns, dict)
                and isinstance(part, int)
                and isinstance(parts, int)
            ):
                raise RemoteProtocolError("batch frame lacks subscription/offset/stream/columns")
            sub = self._subscriptions.get(sid)
            if sub is not None:
                sub._deliver(Batch(stream, offset, columns, part, parts))
        elif kind in ("end", "error") and isinstance(frame.get("subscription"), int):
            sub = self._subscriptions.pop(frame["subscription"], None)
            if sub is not None:
                sub._finish(_error_from_frame(frame) if kind == "error" else None)
        elif kind == "error":
            # Not tied to a request: the peer is about to close the connection.
            self._lost = Unavailable(
                f"peer {self.address} is closing the connection: {frame.get('message')}",
                peer=self.address,
                code=frame.get("code"),
            )
            log.warning("%s", self._lost.message)
        else:
            log.debug("ignoring %s frame from %s", kind, self.address)

    def _fail_all(self, error: Unavailable) -> None:
        if self._lost is None:
            self._lost = error
        reason = self._lost
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(Unavailable(reason.message, **reason.details))
        self._pending.clear()
        for sub in self._subscriptions.values():
            sub._finish(Unavailable(reason.message, **reason.details))
        self._subscriptions.clear()


def _plain(definition: str | Mapping[str, Any]) -> str | dict[str, Any]:
    return definition if isinstance(definition, str) else dict(definition)
