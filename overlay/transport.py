"""The only socket and TLS code of fedstream: listen and connect, both giving frame streams.

Theory of operation
-------------------
The client API (:mod:`peer.server`, :mod:`peer.client`) and peer links (:mod:`overlay.link`)
reach the network only through this module, and only as :class:`~overlay.stream.FrameStream`:

* :data:`TCP` ``.connect(host, port, tls=...)`` opens a TCP connection, upgraded to TLS from
  its first byte when given a client context. It raises what the handshake raised
  (``ssl.SSLCertVerificationError``: we refused the server; another ``ssl.SSLError``: it
  dropped us; ``OSError``: no connection), and each caller says what that means to its user.
* :class:`Listener` accepts connections on a TCP port and hands each, as a FrameStream, to its
  owner's ``serve`` in a task of its own. It accepts sockets itself and has the loop wrap each
  in TLS from its first byte: ``asyncio.start_server`` + ``StreamWriter.start_tls`` loses a
  ClientHello that the stream read before the upgrade (it always does on uvloop), and
  ``start_server(ssl=...)`` keeps handshake failures to itself, while a refusal must be logged
  with its reason. The handshake is bounded by ``handshake_timeout_s``; one that fails closes
  that socket only. Slots are shared fairly (:mod:`overlay.admission`): at most
  ``max_per_address`` connections per remote host and ``max_connections`` in all; when a
  limit is reached the newcomer evicts the connection idle longest (at least
  ``evict_idle_s``), else it is closed before its handshake (peer links: the client takes
  that as worth retrying), or, when the owner gives a ``refuse`` callback (the API server),
  handed to that so that it can say why. Each connection's frames are decoded under the
  listener's ``budget`` and must arrive within ``frame_timeout_s`` each
  (:class:`~overlay.stream.FrameStream`). Refusals go through the listener's
  :class:`~overlay.refusals.RefusalLog`, so a flood of them cannot flood the log.
* :class:`MemoryNetwork` is the same without sockets, for tests: a Listener given the network
  binds to it, and ``network.connect`` hands that listener one end of a
  :func:`~overlay.stream.memory_stream_pair`. It carries no TLS.
* :class:`CreditWindow` and :class:`ReceiveWindow` are the one credit-based flow control of
  both protocols (link streams, API subscriptions): the receiver grants a window of items;
  the sender takes one unit per item and waits while it has none; the receiver gives taken
  items back once half of the window (rounded up) has been taken, and counts arrivals, so
  that an item beyond the credit is caught as the other side's protocol error.
* :class:`Nursery` is a ``TaskGroup`` that an object with ``start``/``close`` can hold (the
  listener's connections, a link pool's links).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeAlias

from overlay.admission import Admission, Slot
from overlay.refusals import RefusalLog
from overlay.sockopts import tune
from overlay.stream import FrameStream, memory_stream_pair
from overlay.wire import DEFAULT_BUDGET, DEFAULT_MAX_FRAME_BYTES, DecodeBudget

__all__ = [
    "TCP",
    "CreditError",
    "CreditWindow",
    "FrameStream",
    "Listener",
    "MemoryNetwork",
    "Network",
    "Nursery",
    "ReceiveWindow",
    "ServerTls",
    "memory_stream_pair",
    "tls_reason",
]

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 1.0  # how long a refused or finished connection may take to flush and close
MAX_REFUSING = 16  # connections being told why they are refused, at most, at a time

ServerTls: TypeAlias = ssl.SSLContext | Callable[[], ssl.SSLContext]
"""A listener's TLS: a context, or a function giving the current one for each connection."""

Serve: TypeAlias = Callable[[FrameStream], Awaitable[None]]


def tls_reason(exc: ssl.SSLError) -> str:
    """Why a TLS handshake failed, in words a log reader can act on."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"its certificate was refused ({exc.verify_message})"
    return exc.reason or str(exc)


# -- connecting -------------------------------------------------------------------------------


class Network(Protocol):
    """Where connections are opened: :data:`TCP`, or a :class:`MemoryNetwork` in tests."""

    async def connect(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> FrameStream: ...


class _Tcp:
    async def connect(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> FrameStream:
        """Connect (callers bound the wait with ``asyncio.timeout``); see the module notes."""
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        tune(writer.get_extra_info("socket"))
        return FrameStream(reader, writer, max_frame_bytes=max_frame_bytes)


TCP: Network = _Tcp()
"""The real network."""


async def refused(host: str, port: int, *, timeout_s: float) -> bool:
    """Whether ``host`` refuses a TCP connection to ``port`` (nothing listens there). A
    connection made is closed at once (the listener sees a client that left before its TLS
    handshake); made, not answered in ``timeout_s`` or failing otherwise is not a refusal."""
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False
    writer.close()
    return False


class MemoryNetwork:
    """Listeners and connections in one process, without sockets (see the module notes)."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, int], Listener] = {}
        self._ports = itertools.count(1)
        self._clients = itertools.count(1)

    def bind(self, listener: Listener, host: str, port: int) -> int:
        """Register ``listener`` at ``host:port`` (port 0: a free one); the bound port."""
        if port == 0:
            port = next(p for p in self._ports if (host, p) not in self._listeners)
        if (host, port) in self._listeners:
            raise OSError(f"memory address {host}:{port} is already in use")
        self._listeners[(host, port)] = listener
        return port

    def unbind(self, host: str, port: int) -> None:
        self._listeners.pop((host, port), None)

    async def connect(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        source: str = "memory",
    ) -> FrameStream:
        """A stream to the listener at ``host:port``; the listener sees the client as
        ``source:N`` (its host: ``source``)."""
        if tls is not None:
            raise ValueError("a memory network carries no TLS")
        listener = self._listeners.get((host, port))
        if listener is None:
            raise ConnectionRefusedError(f"nothing listens on memory address {host}:{port}")
        ours, theirs = memory_stream_pair(
            max_frame_bytes=max_frame_bytes,
            b_max_frame_bytes=listener.max_frame_bytes,
            names=(f"{source}:{next(self._clients)}", f"memory:{host}:{port}"),
        )
        if not listener.hand_over(theirs):
            raise ConnectionRefusedError(f"nothing listens on memory address {host}:{port}")
        return ours


# -- listening --------------------------------------------------------------------------------


class Listener:
    """Accepts connections and serves each with ``serve`` (see the module notes).

    ``name`` (e.g. ``"peer links"``) starts every log line, written to the owner's ``logger``.
    After ``serve`` returns (or is cancelled) the stream is closed. :meth:`close` stops
    listening, cancels every connection's task and waits for them, bounded.
    """

    def __init__(
        self,
        serve: Serve,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str,
        logger: logging.Logger = log,
        tls: ServerTls | None = None,
        max_connections: int = 256,
        max_per_address: int = 64,
        evict_idle_s: float = 2.0,
        refuse: Serve | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        budget: DecodeBudget | None = DEFAULT_BUDGET,
        frame_timeout_s: float | None = 60.0,
        handshake_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        network: MemoryNetwork | None = None,
        identify: Callable[[FrameStream], str | None] | None = None,
    ) -> None:
        """``identify``: the participant a TLS connection's certificate proves (None if
        unknown), for the per-participant limit (``max_per_address`` connections each)."""
        if network is not None and tls is not None:
            raise ValueError("a memory network carries no TLS")
        self.host = host
        self.name = name
        self.max_connections = max_connections
        self.max_frame_bytes = max_frame_bytes
        self.budget = budget
        self.frame_timeout_s = frame_timeout_s
        self.admission = Admission(max_connections, max(1, max_per_address), evict_idle_s)
        self.handshake_timeout_s = handshake_timeout_s
        self.close_timeout_s = close_timeout_s
        self._identify = identify
        self._serve = serve
        self._refuse = refuse
        self._requested_port = port
        self._tls = tls
        self._log = logger
        # refused handshakes: a few warnings a minute, the rest counted (no log flooding)
        self.refusals = RefusalLog(logger)
        self._network = network
        self._nursery = Nursery(name, close_timeout_s)
        self._socket: socket.socket | None = None
        self._port: int | None = None
        self._refusing = 0

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        if self._port is None:
            raise RuntimeError(f"{self.name}: not listening")
        return self._port

    @property
    def connection_count(self) -> int:
        """Connections handshaking, served or being refused."""
        return self.admission.count + self._refusing

    @property
    def uses_tls(self) -> bool:
        return self._tls is not None

    def tls_context(self) -> ssl.SSLContext | None:
        """The context for the next connection (None: plain TCP)."""
        tls = self._tls
        return tls if tls is None or isinstance(tls, ssl.SSLContext) else tls()

    async def start(self) -> None:
        if self._port is not None:
            return
        self.tls_context()  # a broken TLS setup fails here, not at the first client
        await self._nursery.start()
        if self._network is not None:
            self._port = self._network.bind(self, self.host, self._requested_port)
            return
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host, self._requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _type, _proto, _name, address = infos[0]
        listening = socket.create_server(address[:2], family=family, backlog=128)
        listening.setblocking(False)
        self._socket = listening
        self._port = int(listening.getsockname()[1])
        self._nursery.spawn(self._accept_loop(listening))

    async def close(self) -> None:
        """Stop listening, end every connection and wait for them (bounded)."""
        if self._network is not None and self._port is not None:
            self._network.unbind(self.host, self._port)
        await self._nursery.close()
        if self._socket is not None:
            self._socket.close()

    async def __aenter__(self) -> Listener:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def hand_over(self, stream: FrameStream) -> bool:
        """Take a connection made without a socket (a :class:`MemoryNetwork`'s); False if
        this listener is closing (the caller is refused)."""
        if self._nursery.closing:
            return False
        self._limit(stream)
        slot = self._admit(stream.peer.rpartition(":")[0] or stream.peer)
        if slot is None:
            return self._turn_away(stream.peer, stream, None)
        slot.activity = lambda: stream.last_active
        return self._spawn(self._run(stream), slot)

    def _limit(self, stream: FrameStream) -> None:
        stream.set_limits(self.budget, self.frame_timeout_s)

    def _admit(self, host: str) -> Slot | None:
        """A slot for a newcomer from ``host``, evicting the connection idle longest if a
        limit is reached (None: refused)."""
        slot, evicted = self.admission.admit(host, time.monotonic())
        if evicted is not None and evicted.cancel is not None:
            self._log.info(
                "%s: closing an idle connection from %s to make room", self.name, evicted.host
            )
            evicted.cancel()
        return slot

    def _turn_away(
        self, where: str, stream: FrameStream | None, conn: socket.socket | None
    ) -> bool:
        """A newcomer with no slot: told why if the owner may refuse, else closed."""
        host = where.rpartition(":")[0] or where
        why = self.admission.full_for(host) or "no room"
        self.refusals.warning("%s: refused %s: %s", self.name, where, why)
        if self._refuse is None or self._refusing >= MAX_REFUSING:
            if stream is not None:
                self._nursery.spawn(stream.aclose(CLOSE_WAIT_S))
            if conn is not None:
                conn.close()
            return True
        self._refusing += 1
        coro = self._run(stream, refusing=True) if stream else self._accept(conn, where, True)
        if self._nursery.spawn(self._refusal(coro)):
            return True
        self._refusing -= 1
        if conn is not None:
            conn.close()
        return False

    async def _refusal(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        finally:
            self._refusing -= 1

    def _spawn(self, coro: Coroutine[Any, Any, None], slot: Slot) -> bool:
        if self._nursery.spawn(self._counted(coro, slot)):
            return True
        self.admission.release(slot)
        return False

    async def _counted(self, coro: Coroutine[Any, Any, None], slot: Slot) -> None:
        task = asyncio.current_task()
        assert task is not None
        slot.cancel = task.cancel
        try:
            await coro
        except asyncio.CancelledError:
            if not slot.evicted:
                raise
            # evicted to make room: this connection ends, the listener goes on
        finally:
            self.admission.release(slot)

    async def _accept_loop(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(listening)
            except OSError as exc:  # e.g. out of file descriptors: back off, keep serving
                self._log.warning("%s: accept failed: %r", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            slot = self._admit(host)
            if slot is None:
                self._turn_away(where, None, conn)
            elif not self._spawn(self._accept(conn, where, False, slot), slot):
                conn.close()

    async def _accept(
        self, conn: socket.socket | None, where: str, refusing: bool, slot: Slot | None = None
    ) -> None:
        assert conn is not None
        stream = await self._handshake(conn, where)
        if stream is not None:
            self._limit(stream)
            if slot is not None:
                slot.activity = lambda: stream.last_active
                if not self._claim(stream, slot, where):
                    await stream.aclose(self.close_timeout_s)
                    return
            await self._run(stream, refusing=refusing)

    def _claim(self, stream: FrameStream, slot: Slot, where: str) -> bool:
        """Count the connection under the participant its certificate proves; False if that
        participant has its share of connections and none of them is idle."""
        if self._identify is None or stream.ssl_object is None:
            return True
        try:
            participant = self._identify(stream)
        except Exception:  # an unknown party: the server refuses it with its reason
            return True
        if participant is None:
            return True
        ok, evicted = self.admission.claim(slot, participant, time.monotonic())
        if evicted is not None and evicted.cancel is not None:
            self._log.info(
                "%s: closing an idle connection of %s to make room", self.name, participant
            )
            evicted.cancel()
        if not ok:
            self.refusals.warning(
                "%s: refused %s: %d connections of participant %s (max_per_participant)",
                self.name,
                where,
                self.admission.max_per_participant,
                participant,
            )
        return ok

    async def _handshake(self, conn: socket.socket, where: str) -> FrameStream | None:
        """The accepted socket as a frame stream, after its TLS handshake if we have TLS;
        None (socket closed, reason logged) if the handshake fails."""
        loop = asyncio.get_running_loop()
        tune(conn)  # (asyncio sets TCP_NODELAY only where proto reports IPPROTO_TCP: not here)
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            context = self.tls_context()
            async with asyncio.timeout(self.handshake_timeout_s):
                transport, _ = await loop.connect_accepted_socket(
                    lambda: protocol, conn, ssl=context
                )
        except BaseException as exc:
            conn.close()  # the loop closed its transport, if it had made one
            if isinstance(exc, ssl.SSLError):
                reason = tls_reason(exc)
                self.refusals.warning(
                    "%s: refused %s at the TLS handshake: %s", self.name, where, reason
                )
            elif isinstance(exc, TimeoutError):
                self._log.info("%s: %s did not finish the TLS handshake in time", self.name, where)
            elif isinstance(exc, OSError):  # e.g. a client that refused our certificate
                self._log.info("%s: TLS handshake with %s failed: %r", self.name, where, exc)
            else:
                raise
            return None
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        return FrameStream(reader, writer, max_frame_bytes=self.max_frame_bytes)

    async def _run(self, stream: FrameStream, *, refusing: bool = False) -> None:
        try:
            if refusing and self._refuse is not None:
                await self._refuse(stream)
            else:
                await self._serve(stream)
        finally:
            await stream.aclose(min(CLOSE_WAIT_S, self.close_timeout_s))


# -- flow control -----------------------------------------------------------------------------


class CreditError(ValueError):
    """A credit the window does not allow: a grant below 1 or past ``max_credit``, or an
    item beyond the credit granted. The caller says whose fault it is."""


class CreditWindow:
    """The sender's side: how many more items it may send.

    ``initial`` items are granted at the start (None: no flow control, :meth:`take` never
    waits). ``max_credit`` bounds the unused credit: peer links allow 2**16 and refuse more
    (docs/protocol.md 9.4, :meth:`grant`).
    """

    def __init__(self, initial: int | None, *, max_credit: int) -> None:
        if initial is not None and not 0 <= initial <= max_credit:
            raise CreditError(f"credit {initial} is out of range")
        self.max_credit = max_credit
        self._available = initial
        self._granted = asyncio.Event()

    @property
    def available(self) -> int | None:
        return self._available

    async def take(self) -> None:
        """Use one unit of credit, waiting for a grant while there is none."""
        if self._available is None:
            return
        while self._available <= 0:
            self._granted.clear()
            await self._granted.wait()
        self._available -= 1

    def grant(self, n: int) -> None:
        """The receiver allows ``n`` more; CreditError if ``n < 1`` or it passes the cap."""
        if self._available is None:
            return
        if not 1 <= n <= self.max_credit - self._available:
            raise CreditError(f"credit of {n} is not allowed")
        self._add(n)

    def _add(self, n: int) -> None:
        assert self._available is not None
        self._available += n
        self._granted.set()


class ReceiveWindow:
    """The receiver's side of a window of ``window`` items.

    :meth:`arrived` counts an item the sender sent (CreditError beyond the credit granted);
    :meth:`taken` counts one the consumer took and says how many to grant back now: none until
    half of the window, rounded up, has been taken, then all taken so far. Invariant: items
    waiting + credit the sender has not used + taken not yet given back == ``window``.
    """

    def __init__(self, window: int, *, max_credit: int) -> None:
        if not 1 <= window <= max_credit:
            raise ValueError(f"credit must be in 1..{max_credit}")
        self.window = window
        self._unused = window  # granted and not yet used by the sender
        self._taken = 0  # taken by the consumer, not yet given back

    def arrived(self) -> None:
        if self._unused <= 0:
            raise CreditError("an item beyond the credit granted")
        self._unused -= 1

    def taken(self) -> int:
        self._taken += 1
        if self._taken * 2 < self.window:
            return 0
        n, self._taken = self._taken, 0
        self._unused += n
        return n


# -- tasks ------------------------------------------------------------------------------------


class Nursery:
    """A TaskGroup run by a supervisor task, so that objects with ``start``/``close`` (a
    listener, a link pool) can hold one: children are spawned into it; ``close`` cancels them
    and waits, bounded. A child that raises is logged and does not end its siblings."""

    def __init__(self, name: str, close_timeout_s: float) -> None:
        self._name = name
        self._close_timeout_s = close_timeout_s
        self._tg: asyncio.TaskGroup | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False

    async def start(self) -> None:
        if self._supervisor is None:
            self._supervisor = asyncio.create_task(self._supervise(), name=self._name)
            await self._ready.wait()

    async def _supervise(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self._ready.set()
            await self._stop.wait()
            for task in list(self._tasks):
                task.cancel()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> bool:
        """Run ``coro`` in the group; False (and ``coro`` closed) if the group is closing."""
        if self._tg is None or self.closing:
            coro.close()
            return False
        task = self._tg.create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _guarded(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception:  # a bug in one child must not end its siblings
            log.exception("%s: a task failed", self._name)

    async def close(self) -> None:
        self.closing = True
        self._stop.set()
        if self._supervisor is None:
            return
        try:
            async with asyncio.timeout(self._close_timeout_s + CLOSE_WAIT_S):
                await asyncio.shield(self._supervisor)
        except TimeoutError:
            log.warning("%s: tasks still running after %.1f s", self._name, self._close_timeout_s)
            self._supervisor.cancel()
            await asyncio.wait([self._supervisor], timeout=self._close_timeout_s)
