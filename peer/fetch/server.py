"""The fetch server: a peer's spool files, read by Spark executors on other hosts.

Theory of operation
-------------------
One :class:`~overlay.transport.Listener` (TLS from the first byte, :mod:`peer.fetch.tls`)
serves the protocol of :mod:`peer.fetch.protocol`. For each request the server checks the
capability (:class:`~peer.fetch.capability.CapabilityCheck`, against the clock it was given)
before it touches the disk, then resolves the spool directory and requires it to lie under
one of its ``roots`` (the data directory, the checkpoint root): a token is only ever minted
by this peer, and this check keeps a leaked fetch key from reaching anything but spool files.
The file (``<20 digits>.arrow``, opened without following links) is sent as it is, in chunks
of ``chunk_bytes``, each read in a worker thread (``asyncio.to_thread``) while holding one of
``max_concurrent_reads`` slots, so that the event loop never waits for the disk and the
memory the server holds is about one chunk per connection.

Budgets (docs/security.md, "Spool fetches"): the listener's slots (``max_connections``,
``max_per_address``) and TLS handshake time; a request frame of at most
``max_request_bytes`` decoded under a tiny budget; a frame begun must be complete within
``frame_timeout_s`` (slowloris); a connection with no request for ``idle_timeout_s`` is closed;
each chunk must be taken by the client within ``send_timeout_s`` (a client that stops reading
loses its connection, not the server its slots); after ``max_refusals`` refused capabilities
a connection is closed. A refused request is answered with an ``error`` frame naming the
reason and the server goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from overlay.errors import LocalProtocolError, RemoteProtocolError
from overlay.stream import IdleTimeout
from overlay.transport import FrameStream, Listener, MemoryNetwork
from overlay.wire import DecodeBudget, encode_frame
from peer.errors import FedstreamError, InvalidInput, NotFound
from peer.fetch.capability import (
    DEFAULT_TTL_S,
    CapabilityCheck,
    CapabilityRefused,
    FetchKey,
    fetch_key_path,
)
from peer.fetch.protocol import (
    CHUNK_BYTES,
    MAX_REQUEST_BYTES,
    Chunk,
    FetchEndpoint,
    FetchRequest,
    FileHeader,
    error_frame,
)
from peer.fetch.tls import server_context
from peer.storage import spool_format as fmt

__all__ = ["FORCE_ENV", "FetchLimits", "FetchServer", "advertised_host", "remote_input"]

log = logging.getLogger(__name__)

FORCE_ENV = "FEDSTREAM_FETCH_REMOTE"  # "1": fetch even under a local master (tests)
WILDCARDS = ("0.0.0.0", "::", "")  # a listen host that is every address: not one to advertise

REQUEST_BUDGET = DecodeBudget(
    max_depth=2, max_elements=16, max_container_len=8, max_decoded_bytes=64 * 1024
)


@dataclass(frozen=True)
class FetchLimits:
    """The fetch server's budgets (docs/security.md, "Spool fetches")."""

    max_connections: int = 64
    max_per_address: int = 16
    max_concurrent_reads: int = 4
    chunk_bytes: int = CHUNK_BYTES
    max_request_bytes: int = MAX_REQUEST_BYTES
    idle_timeout_s: float = 30.0
    frame_timeout_s: float = 10.0
    handshake_timeout_s: float = 10.0
    send_timeout_s: float = 30.0
    max_refusals: int = 3
    capability_ttl_s: float = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_bytes <= CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in 1..{CHUNK_BYTES}, not {self.chunk_bytes}")


class FetchServer:
    """Serves spool files under ``roots`` to holders of capabilities signed by ``key``.

    ``clock`` (wall-clock seconds) decides expiry; ``network`` (tests) replaces TCP, and then
    the server has no TLS."""

    def __init__(
        self,
        key: FetchKey,
        key_path: Path,
        roots: Sequence[Path],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: FetchLimits | None = None,
        clock: Callable[[], float] = time.time,
        network: MemoryNetwork | None = None,
        advertise_host: str | None = None,
    ) -> None:
        self.limits = limits = limits or FetchLimits()
        # The host executors are told to fetch from (None: the one listened on; a wildcard
        # listen address needs one: advertised_host).
        self.advertise_host = advertise_host
        self.key_path = key_path
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self._check = CapabilityCheck(key.public)
        self._clock = clock
        self._reads = asyncio.Semaphore(limits.max_concurrent_reads)
        self._reply_bytes = limits.chunk_bytes + 1024
        tls, self.pin = (None, "") if network is not None else server_context(key)
        self.listener = Listener(
            self._serve,
            host,
            port,
            name="spool fetch",
            logger=log,
            tls=tls,
            max_connections=limits.max_connections,
            max_per_address=limits.max_per_address,
            max_frame_bytes=limits.max_request_bytes,
            budget=REQUEST_BUDGET,
            frame_timeout_s=limits.frame_timeout_s,
            handshake_timeout_s=limits.handshake_timeout_s,
            network=network,
        )
        self.served_files = 0
        self.served_bytes = 0
        self.refused = 0

    @property
    def address(self) -> str:
        host = self.advertise_host or self.listener.host
        return f"[{host}]:{self.listener.port}" if ":" in host else f"{host}:{self.listener.port}"

    @property
    def endpoint(self) -> FetchEndpoint:
        """What the engine gives the ``fedspool`` source to read through this server."""
        return FetchEndpoint(
            self.address, self.pin, str(self.key_path), self.limits.capability_ttl_s
        )

    @classmethod
    async def open(
        cls,
        data_dir: Path,
        roots: Sequence[Path],
        host: str,
        port: int,
        limits: FetchLimits,
        advertise_host: str | None = None,
    ) -> FetchServer:
        """The started fetch server of the peer whose data directory is ``data_dir`` (its
        fetch key made there on first use), telling executors ``advertise_host`` if given."""
        key = await asyncio.to_thread(FetchKey.load_or_create, data_dir)
        server = cls(
            key,
            fetch_key_path(data_dir),
            roots,
            host=host,
            port=port,
            limits=limits,
            advertise_host=advertise_host,
        )
        await server.start()
        return server

    async def start(self) -> None:
        await self.listener.start()
        log.info("spool fetch server on %s (pin %s)", self.address, self.pin[:16])

    async def close(self) -> None:
        await self.listener.close()

    # -- one connection ---------------------------------------------------------------------

    async def _serve(self, stream: FrameStream) -> None:
        refusals = 0
        while True:
            try:
                frame = await stream.recv(idle_timeout_s=self.limits.idle_timeout_s)
            except IdleTimeout:
                return
            except RemoteProtocolError as exc:
                await self._reply_error(stream, InvalidInput(f"protocol error: {exc}"))
                return
            if frame is None:
                return
            try:
                request = FetchRequest.from_wire(frame)
                self._check.check(
                    request.capability,
                    spool=request.spool,
                    offset=request.offset,
                    now=self._clock(),
                )
                await self._send_file(stream, request)
            except CapabilityRefused as exc:
                refusals += 1
                self.refused += 1
                self.listener.refusals.warning("spool fetch: %s refused: %s", stream.peer, exc)
                if not await self._reply_error(stream, exc) or refusals >= self.limits.max_refusals:
                    return
            except FedstreamError as exc:
                if not await self._reply_error(stream, exc):
                    return
            except (OSError, TimeoutError) as exc:  # the client went away or stopped reading
                log.info("spool fetch: dropped %s: %r", stream.peer, exc)
                return

    def _open(self, request: FetchRequest) -> int:
        """The file descriptor of the file a checked request names (in a worker thread):
        InvalidInput if its spool is outside ``roots``, NotFound if the file is gone."""
        directory = Path(os.path.realpath(request.spool))
        if not any(directory.is_relative_to(root) for root in self.roots):
            raise InvalidInput(
                f"spool {request.spool!r} is not under this peer's data directory",
                spool=request.spool,
            )
        path = fmt.offset_path(directory, request.offset)
        try:
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(
                f"spool {request.spool}: offset {request.offset} was trimmed before it was read",
                reason="trimmed",
                offset=request.offset,
            ) from None
        except OSError as exc:
            raise NotFound(
                f"spool {request.spool}: offset {request.offset}: {exc.strerror}",
                offset=request.offset,
            ) from None

    async def _send_file(self, stream: FrameStream, request: FetchRequest) -> None:
        async with self._reads:
            fd = await asyncio.to_thread(self._open, request)
        try:
            size = os.fstat(fd).st_size
            await self._send(stream, FileHeader(request.offset, size).to_wire())
            sent = 0
            while sent < size:
                async with self._reads:
                    want = min(self.limits.chunk_bytes, size - sent)
                    data = await asyncio.to_thread(os.pread, fd, want, sent)
                if not data:  # spool files never shrink: the disk is lying, drop the client
                    raise ConnectionError(f"spool {request.spool}: file {request.offset} shrank")
                await self._send(stream, Chunk(data).to_wire())
                sent += len(data)
            self.served_files += 1
            self.served_bytes += size
        finally:
            os.close(fd)

    async def _send(self, stream: FrameStream, frame: dict[str, object]) -> None:
        encoded = encode_frame(frame, max_frame_bytes=self._reply_bytes)
        async with asyncio.timeout(self.limits.send_timeout_s):
            await stream.send_encoded(encoded)

    async def _reply_error(self, stream: FrameStream, exc: FedstreamError) -> bool:
        """Tell the client why; False if it cannot be told (the connection is over)."""
        try:
            await self._send(stream, error_frame(exc))
        except (OSError, TimeoutError, LocalProtocolError):
            return False
        return True


def remote_input(chosen: bool | None, master: str) -> bool:
    """Whether executors fetch spool files from the peer: ``chosen`` if set, else when Spark's
    master is not local or the environment sets :data:`FORCE_ENV` (tests of the remote path
    under ``local[N]``)."""
    if chosen is not None:
        return chosen
    forced = os.environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes")
    return forced or not master.strip().lower().startswith("local")


def advertised_host(listen_host: str, spark_conf: Mapping[str, str]) -> str | None:
    """The host executors fetch from when the peer listens on ``listen_host``: None (that
    host itself) unless it is a wildcard, which is no address to connect to; then the
    driver's advertised host (``spark.driver.host``: ``--spark-driver-host``, which a cluster
    master requires with a wildcard ``--listen``), the one address the executors are known to
    reach this host at. InvalidInput if there is none."""
    if listen_host.strip("[]") not in WILDCARDS:
        return None
    driver = spark_conf.get("spark.driver.host", "").strip()
    if not driver or driver.strip("[]") in WILDCARDS:
        raise InvalidInput(
            f"--listen {listen_host} is every address, and executors need one to fetch spool "
            "data from: give --spark-driver-host HOST (this host's address on the cluster's "
            "network)",
            listen=listen_host,
        )
    return driver
