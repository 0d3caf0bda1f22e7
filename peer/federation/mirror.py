"""Mirrors: a stream's tuples carried, exactly once, to a peer that runs a fragment reading it.

Theory of operation
-------------------
A fragment reads only local spools. When one of its input streams lives on another peer (a
source stream hosted elsewhere, or the output of an upstream fragment), that peer *mirrors*
the stream to it: the receiver keeps a *replica* spool of the stream, and the sender pushes
every batch of its own spool there over a peer link.

Upstream backup and exactly-once delivery come from the spools themselves:

* The sender registers a spool reader ``mirror-<receiver node id>`` on the stream. Its offset
  is the last batch the receiver acknowledged, written atomically on every acknowledgement,
  so the sender's spool keeps (``trim`` never deletes) every batch not yet acknowledged, also
  across a crash of either side.
* Each batch travels tagged with an event id: origin ``m:<sender node id>:<stream>`` and the
  batch's spool offset as its sequence. The receiver appends it durably (fsync) before it
  answers, and its spool drops a batch whose sequence is not above the highest it has for that
  origin: a batch sent again after a lost acknowledgement or a restart is kept once.
* Batches go in order, at most one request in flight per mirror (a few batches per request),
  so sequences arrive increasing, as the replay check needs. A receiver that falls behind
  answers late; the sender waits, and its spool (on disk) holds the rest: memory stays bounded
  and nothing is dropped.
* A receiver declared dead (gossip) stops counting for backpressure: its reader is paused, so
  the stream's pushes and the queries writing it go on, while the spool still keeps every
  batch it has not acknowledged (upstream backup) for when it returns; its reader counts
  again once it lives.
* A disk fault on the sender (a full disk refusing the acknowledged offset, an unreadable
  spool file) stops that one mirror for a while, logged, and it tries again: never the other
  mirrors or the peer. An acknowledgement not yet written only means a resend, which the
  receiver drops as a replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from peer.errors import FedstreamError, Unavailable
from peer.model.tuples import arrow_bytes
from peer.protocol.link import Frame, MirrorAppend
from peer.storage.spool import Spool, SpoolSet
from peer.storage.spool_format import read_reader_offset, write_reader_offset
from peer.timing import MONOTONIC, Backoff, Clock

__all__ = ["MIRROR_PREFIX", "Mirrors"]

Send = Callable[[bytes, MirrorAppend], Awaitable[Frame]]

log = logging.getLogger(__name__)

MIRROR_PREFIX = "mirror-"
# A moved stream keeps the origin its first host mirrored it under (the receivers' replay
# memory is keyed by it); the file in its spool directory says which.
ORIGIN_FILE = "mirror-origin"
MAX_BATCHES_PER_REQUEST = 16
MAX_BYTES_PER_REQUEST = 8 * 1024 * 1024
RETRY_MAX_S = 5.0
BACKOFF = Backoff(0.1, RETRY_MAX_S)  # a receiver that is unavailable, a disk that fails


class Mirrors:
    """The mirrors this peer sends (one task each, restarted from the spools on start)."""

    def __init__(
        self, spools: SpoolSet, node_id: bytes, send: Send, *, clock: Clock = MONOTONIC
    ) -> None:
        self.spools = spools
        self.clock = clock  # the waits between tries
        self.node_id = node_id
        self._send = send
        self._tasks: dict[tuple[str, bytes], asyncio.Task[None]] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._acked = asyncio.Condition()  # notified after each acknowledgement is recorded
        self.sent_batches = 0
        self.sent_bytes: dict[str, int] = {}  # mirrored bytes by stream (the metrics)

    def origin(self, stream: str) -> str:
        """The event-id origin of ``stream``'s mirrored batches: this peer's, or that of the
        peer the stream moved here from (its offsets, and so its seqs, carried on)."""
        with contextlib.suppress(KeyError, OSError):
            spool = self.spools.get(stream)
            return (spool.directory / ORIGIN_FILE).read_text().strip()
        return f"m:{self.node_id.hex()[:16]}:{stream}"

    async def run(self) -> None:
        """Run every mirror until cancelled; start the ones recorded in the spools."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            spools = self.spools
            for stream in spools.streams():
                for reader in spools.get(stream).readers():
                    if reader.startswith(MIRROR_PREFIX):
                        with contextlib.suppress(ValueError):
                            self._launch(stream, bytes.fromhex(reader[len(MIRROR_PREFIX) :]))
            await asyncio.Event().wait()

    def start(self, stream: str, target: bytes, after: int | None = None) -> None:
        """Mirror ``stream`` (hosted here) to ``target`` from now on (idempotent); a new
        mirror starts after offset ``after`` when given (what the target holds already)."""
        spool = self.spools.get(stream)
        reader = MIRROR_PREFIX + target.hex()
        if after is not None and reader not in spool.readers():
            write_reader_offset(spool.directory, reader, after, fsync=spool.fsync)
        spool.register_reader(reader)
        self._launch(stream, target)

    def resume_stream(self, stream: str) -> None:
        """(Re)start the mirrors recorded as readers of ``stream``'s spool."""
        for reader in self.spools.get(stream).readers():
            if reader.startswith(MIRROR_PREFIX):
                with contextlib.suppress(ValueError):
                    self._launch(stream, bytes.fromhex(reader[len(MIRROR_PREFIX) :]))

    async def pause(self, stream: str, target: bytes | None = None) -> None:
        """Stop pumping ``stream`` (to ``target``, or to all) and wait until no request is in
        flight; the readers stay, so ``resume_stream`` or another peer carries on."""
        keys = [k for k in self._tasks if k[0] == stream and target in (None, k[1])]
        tasks = [self._tasks.pop(k) for k in keys]
        for task in tasks:
            task.cancel()
        if tasks:  # waits without swallowing a cancellation of pause() itself
            await asyncio.wait(tasks)

    async def detach(self, stream: str, target: bytes) -> int:
        """Stop mirroring ``stream`` to ``target`` for good; the last offset it acknowledged."""
        await self.pause(stream, target)
        spool = self.spools.get(stream)
        reader = MIRROR_PREFIX + target.hex()
        try:
            acked = read_reader_offset(spool.directory, reader)
        except KeyError:
            acked = -1
        spool.unregister_reader(reader)
        return acked

    async def acknowledged(self, stream: str, target: bytes, through: int) -> None:
        """Return once ``target`` has acknowledged ``stream``'s batches through offset
        ``through`` (KeyError if it is not a mirror target of the stream)."""
        spool = self.spools.get(stream)
        reader = MIRROR_PREFIX + target.hex()
        async with self._acked:
            await self._acked.wait_for(
                lambda: read_reader_offset(spool.directory, reader) >= through
            )

    def targets(self, stream: str) -> list[bytes]:
        return sorted(t for (s, t), task in self._tasks.items() if s == stream and not task.done())

    def stop(self, stream: str, target: bytes) -> None:
        task = self._tasks.pop((stream, target), None)
        if task is not None:
            task.cancel()
        with contextlib.suppress(KeyError):
            self.spools.get(stream).unregister_reader(MIRROR_PREFIX + target.hex())

    def stop_stream(self, stream: str) -> None:
        for key in [k for k in self._tasks if k[0] == stream]:
            self.stop(*key)

    def on_member(self, node_id: bytes, alive: bool) -> list[str]:
        """A peer died (``alive`` False) or lives again: pause or resume, on every stream
        mirrored to it, the reader that holds its batches back. Returns those streams."""
        reader = MIRROR_PREFIX + node_id.hex()
        touched = []
        for stream in self.spools.streams():
            spool = self.spools.get(stream)
            if reader in spool.readers():
                spool.pause_reader(reader, not alive)
                touched.append(stream)
        if touched:
            state = "resumed" if alive else "paused (the peer is dead)"
            log.warning("mirrors to %s %s: %s", node_id.hex()[:12], state, ", ".join(touched))
        return touched

    def _launch(self, stream: str, target: bytes) -> None:
        key = (stream, target)
        if key in self._tasks and not self._tasks[key].done():
            return
        if self._tg is None:
            return  # run() starts it from the spool's readers
        self._tasks[key] = self._tg.create_task(self._pump(stream, target))

    def describe(self) -> list[dict[str, Any]]:
        spools = self.spools
        out = []
        for (stream, target), task in sorted(self._tasks.items()):
            if task.done():
                continue
            spool = spools.get(stream)
            try:
                acked = read_reader_offset(spool.directory, MIRROR_PREFIX + target.hex())
            except KeyError:
                continue
            out.append(
                {"stream": stream, "to": target.hex()[:16], "acked": acked, "latest": spool.latest}
            )
        return out

    async def _pump(self, stream: str, target: bytes) -> None:
        spool = self.spools.get(stream)
        reader = MIRROR_PREFIX + target.hex()
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_append(_offset: int) -> None:
            loop.call_soon_threadsafe(wake.set)

        spool.add_listener(on_append)
        origin = self.origin(stream)
        refused = 0  # tries in a row the receiver was unavailable
        try:
            while True:
                wake.clear()
                try:
                    acked = read_reader_offset(spool.directory, reader)
                    start = max(acked, spool.earliest - 1)
                    if spool.latest <= start:
                        await wake.wait()
                        continue
                    batches = await asyncio.to_thread(_read_chunk, spool, start)
                except KeyError:
                    return  # unregistered: the mirror was stopped
                except (OSError, ValueError, FedstreamError) as exc:  # a disk fault here
                    log.error("mirror of %s to %s cannot read: %s", stream, target.hex()[:12], exc)
                    await self.clock.sleep(RETRY_MAX_S)
                    continue
                if not batches:
                    await wake.wait()
                    continue
                try:
                    await self._send(target, MirrorAppend(stream, origin, tuple(batches)))
                except Unavailable as exc:
                    log.info("mirror of %s to %s waits: %s", stream, target.hex()[:12], exc)
                    refused += 1
                    await self.clock.sleep(BACKOFF.delay_s(refused))
                    continue
                except FedstreamError as exc:
                    log.warning("mirror of %s to %s refused: %s", stream, target.hex()[:12], exc)
                    await self.clock.sleep(RETRY_MAX_S)
                    continue
                refused = 0
                last = batches[-1][0]
                self.sent_batches += len(batches)
                self.sent_bytes[stream] = self.sent_bytes.get(stream, 0) + sum(
                    len(body) for _offset, body, _status in batches
                )
                await self._record(spool, reader, last, stream, target)
                async with self._acked:
                    self._acked.notify_all()
        finally:
            spool.remove_listener(on_append)

    async def _record(
        self, spool: Spool, reader: str, last: int, stream: str, target: bytes
    ) -> None:
        """Write that ``target`` acknowledged ``last``; a disk fault (ENOSPC, EIO) is logged
        and retried until it passes, never raised: the task group and the peer go on."""
        failed = 0
        while True:
            try:
                await asyncio.to_thread(
                    write_reader_offset, spool.directory, reader, last, fsync=spool.fsync
                )
                return
            except OSError as exc:
                log.error(
                    "mirror of %s to %s: cannot record acknowledged offset %d (%s); retrying",
                    stream,
                    target.hex()[:12],
                    last,
                    exc.strerror or exc,
                )
                failed += 1
                await self.clock.sleep(BACKOFF.delay_s(failed))


def _read_chunk(spool: Spool, start: int) -> list[tuple[int, bytes, str]]:
    """The entries after ``start`` (tentative results and undos with their status, so
    that a fragment downstream can go on with them): at most MAX_BATCHES_PER_REQUEST and
    about MAX_BYTES_PER_REQUEST (always at least one)."""
    end = min(spool.latest, start + MAX_BATCHES_PER_REQUEST)
    out: list[tuple[int, bytes, str]] = []
    size = 0
    for offset, status, _undo, table in spool.read_entries(start, end, skip_trimmed=True):
        body = arrow_bytes(table)
        if out and size + len(body) > MAX_BYTES_PER_REQUEST:
            break
        out.append((offset, body, status))
        size += len(body)
    return out
