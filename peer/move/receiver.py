"""The receiving side of a move (see :mod:`peer.move` for the theory of operation)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgpack

from contracts.book import ContractBook
from contracts.contract import covers
from peer.errors import (
    Conflict,
    FedstreamError,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
)
from peer.federation import Federation
from peer.model.query import parse_query
from peer.model.schema import parse_schema
from peer.move.journal import MOVE_ID, Journal, Outcome
from peer.move.package import (
    LANE_FILE,
    MAX_MOVE_BYTES,
    SIBLING,
    Incoming,
    append_chunk,
    check_install,
    check_manifest,
    check_pre,
    extract,
)
from peer.site import LocalSite
from peer.storage.spool_format import atomic_write, write_reader_offset
from peer.timing import MONOTONIC, WALL

log = logging.getLogger(__name__)

INCOMING_IDLE_S = 300.0  # an incoming move with no chunk for this long is dropped


def landed_incarnation(manifest: dict[str, Any]) -> str:
    """The incarnation a fragment runs under here. A lane member's results are tagged with
    (incarnation, lane batch id), and this peer's lane numbers its batches otherwise than the
    sender's: under the old incarnation its results could pass for replays of older ones. So
    a member takes a new incarnation, the move's own (the same after a crash mid-install)."""
    return str(manifest["id"])[:8] if manifest.get("lane") else str(manifest["incarnation"])


def lane_window(path: Path) -> dict[str, Any] | None:
    """The windows a lane member arrives with (None: a per-tuple member); InvalidInput if the
    file is not what a sender writes."""
    try:
        raw = msgpack.unpackb(path.read_bytes(), strict_map_key=False)
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        raise InvalidInput(f"move: the lane member's state is unreadable: {exc}") from None
    if not isinstance(raw, dict) or "window" not in raw:
        raise InvalidInput("move: the lane member's state names no windows")
    window = raw["window"]
    if window is None:
        return None
    if (
        isinstance(window, dict)
        and isinstance(window.get("wm"), int)
        and isinstance(window.get("g"), list)
    ):
        return window
    raise InvalidInput("move: the lane member's windows are not a watermark and groups")


class ArrivalHook(Protocol):
    """Told of each fragment that arrived and resumed here (the brain's ledger)."""

    def __call__(
        self,
        fragment: str,
        from_participant: str,
        contract: str,
        load: float,
        price: float,
        *,
        from_node: bytes | None = None,
    ) -> Awaitable[None]: ...


class MoveReceiver:
    def __init__(
        self,
        site: LocalSite,
        fed: Federation,
        book: ContractBook | None,
        lock: asyncio.Lock,
        journal: Journal,
        on_arrival: ArrivalHook | None = None,
        *,
        clock: Callable[[], float] = MONOTONIC,
        wall: Callable[[], float] = WALL,
    ) -> None:
        self.clock = clock  # how long a move in has been idle, the pause a move costs
        self.wall = wall  # contracts are valid between two dates
        self.site = site
        self.fed = fed
        self.book = book
        self.lock = lock  # one move in or out at a time
        self.journal = journal
        self.on_arrival = on_arrival
        self.root = site.data_dir / "moves"
        self._incoming: dict[str, Incoming] = {}
        self._installing: dict[str, asyncio.Future[None]] = {}  # move id -> its install
        self._holding = False  # the lock is held for an incoming move

    async def handle(self, frame: dict[str, Any], sender: str) -> dict[str, Any]:
        op = frame.get("op")
        if op == "move_begin":
            return await self._begin(frame.get("manifest"), sender)
        if op == "move_resolve":
            return await self._resolve(frame, sender)
        move_id = frame.get("move")
        found = self._incoming.get(move_id) if isinstance(move_id, str) else None
        if found is None or found.sender != sender or not isinstance(move_id, str):
            raise NotFound(f"no move {move_id!r} from {sender} is under way here")
        incoming = found
        incoming.touched = self.clock()
        if op == "move_chunk":
            data = frame.get("data")
            if not isinstance(data, bytes) or not data:
                raise InvalidInput("move_chunk: data must be non-empty bytes")
            part = frame.get("part", "final")
            if part not in ("pre", "final"):
                raise InvalidInput("move_chunk: part must be pre or final")
            if incoming.size + incoming.pre_size + len(data) > MAX_MOVE_BYTES:
                self._drop_incoming(move_id)
                raise InvalidInput(f"move_chunk: a move carries at most {MAX_MOVE_BYTES} bytes")
            if part == "pre":  # sent while the fragment still runs at the sender
                if incoming.pre_unpacked:
                    raise InvalidInput("move_chunk: the pre-copy was closed already")
                await asyncio.to_thread(append_chunk, incoming.pre_path, data)
                incoming.pre_digest.update(data)
                incoming.pre_size += len(data)
                return {"move": move_id, "received": incoming.pre_size}
            await asyncio.to_thread(append_chunk, incoming.path, data)
            incoming.digest.update(data)
            incoming.size += len(data)
            return {"move": move_id, "received": incoming.size}
        if op == "move_precopied":  # the pre-copy is whole: check and unpack it now
            if incoming.pre_unpacked:
                raise InvalidInput("move_precopied: the pre-copy was closed already")
            check_pre(frame, incoming, "move_precopied")
            await asyncio.to_thread(extract, incoming.pre_path, incoming.path.parent)
            incoming.pre_unpacked = True
            incoming.pre_path.unlink()
            return {"move": move_id, "unpacked": incoming.pre_size}
        if op == "move_install":
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._installing[move_id] = done
            try:
                return await self._install(check_install(frame, incoming), incoming)
            finally:
                done.set_result(None)
                self._installing.pop(move_id, None)
                self._drop_incoming(move_id)
        raise InvalidInput(f"unknown move request {op!r}")

    async def _resolve(self, frame: dict[str, Any], sender: str) -> dict[str, Any]:
        """The final word on a move (``installed`` or ``aborted``), asked by its sender after
        a failed or lost install, or when it undoes the move: a move not installed by now
        never will be."""
        move_id, fragment, epoch = frame.get("move"), frame.get("fragment"), frame.get("epoch")
        if not isinstance(move_id, str) or not MOVE_ID.fullmatch(move_id):
            raise InvalidInput("move_resolve: move must be 32 hex digits")
        if not isinstance(fragment, str) or not isinstance(epoch, int) or isinstance(epoch, bool):
            raise InvalidInput("move_resolve: fragment (a name) and epoch (an int) are needed")
        installing = self._installing.get(move_id)
        if installing is not None:
            await installing  # its outcome is written before this resolves
        outcome = await asyncio.to_thread(self.journal.outcome, move_id)
        if outcome is not None:
            if outcome.sender != sender:
                raise NotFound(f"no move {move_id} from {sender} is known here")
            return {"move": move_id, "decision": outcome.decision}
        pending = self._incoming.get(move_id)
        if pending is not None and pending.sender != sender:
            raise NotFound(f"no move {move_id} from {sender} is known here")
        await asyncio.to_thread(
            self.journal.decide, Outcome(move_id, fragment, epoch, "aborted", sender)
        )
        self._drop_incoming(move_id)
        return {"move": move_id, "decision": "aborted"}

    def _drop_incoming(self, move_id: str) -> None:
        incoming = self._incoming.pop(move_id, None)
        if incoming is not None:
            shutil.rmtree(incoming.path.parent, ignore_errors=True)
        if not self._incoming and self.lock.locked() and self._holding:
            self._holding = False
            self.lock.release()

    async def _begin(self, manifest: Any, sender: str) -> dict[str, Any]:
        site = self.site
        for key, incoming in list(self._incoming.items()):  # a sender that went silent
            if self.clock() - incoming.touched > INCOMING_IDLE_S:
                self._drop_incoming(key)
        checked_manifest = check_manifest(manifest)
        if site.engine is None:
            raise Conflict("this peer runs without an engine: it cannot take fragments")
        self._authorise(checked_manifest, sender)
        catalog = site.catalog
        name = checked_manifest["fragment"]
        last = await asyncio.to_thread(self.journal.last_epoch, name)
        if checked_manifest["epoch"] <= last:
            raise Conflict(
                f"fragment {name}: move epoch {checked_manifest['epoch']} is stale "
                f"(this peer has seen epoch {last})",
                query=name,
            )
        if catalog.find_query(name) is not None:
            raise Conflict(f"a query named {name} runs here already", query=name)
        spools, hosted = site.spools, self.fed.hosting.hosted
        reading = site.streams_read(besides=name)
        sibling = checked_manifest["contract"] == SIBLING
        for stream, info in checked_manifest["inputs"].items():
            if info["mode"] == "copy" and stream in spools:
                raise Conflict(f"this peer holds stream {stream} already", stream=stream)
            if sibling and info["mode"] == "local" and stream not in hosted and stream in reading:
                # inside a participant, a copy kept for another fragment here takes no second
                # reader: the two could then move on only together (peer.move.candidates.
                # why_not), and a launched peer could never drain (peer.elastic.drain). A
                # partner under a contract may take it (the copy does not travel again).
                raise Conflict(
                    f"this peer's copy of stream {stream} is read by another fragment here",
                    stream=stream,
                )
            if info["mode"] == "local" and not (
                stream in hosted or (stream in spools and spools.get(stream).aligned())
            ):
                raise Conflict(
                    f"this peer holds no copy of stream {stream} with the sender's offsets",
                    stream=stream,
                )
        for stream in checked_manifest["outputs"]:
            if stream in spools:
                raise Conflict(f"this peer holds stream {stream} already", stream=stream)
        if checked_manifest.get("lane"):
            lane_reads = set(site.engine.lane.streams)
            for stream in checked_manifest["inputs"]:
                if stream in lane_reads:
                    # the lane reads each stream at one position: the member's cannot be kept
                    raise Conflict(
                        f"this peer's lane reads stream {stream} already: a lane member "
                        "arriving could not start where it stopped",
                        stream=stream,
                    )
        if self.lock.locked():
            raise Unavailable("this peer has a move in flight; retry later")
        await self.lock.acquire()
        self._holding = True
        move_id = checked_manifest["id"]
        where = self.root / f"in-{move_id}"
        where.mkdir(parents=True)
        self._incoming[move_id] = Incoming(checked_manifest, sender, where / "move.tar")
        return {"move": move_id, "ready": True}

    def _authorise(self, manifest: dict[str, Any], sender: str) -> None:
        """A peer of this peer's own participant hands fragments over without a contract
        (``contract`` is SIBLING: they serve one owner, peer.elastic.balance); from another
        participant, a contract with it must let it hand us every box type."""
        if manifest["contract"] == SIBLING:
            if sender == self.fed.router.participant:
                return
            raise Unauthorized(
                f"{sender} is another participant: a fragment from it needs a contract"
            )
        book = self.book
        if book is None:
            raise Unauthorized("this peer holds no contracts: it takes no fragments")
        now = datetime.fromtimestamp(self.wall(), UTC)
        for contract in book.contracts_with(sender):
            if contract.id != manifest["contract"] or not (
                contract.not_before <= now <= contract.not_after
            ):
                continue
            if all(covers(contract, sender, t) for t in manifest["box_types"]):
                return
            raise Unauthorized(
                f"contract {contract.id[:8]} does not let {sender} hand us "
                f"{', '.join(manifest['box_types'])} boxes"
            )
        raise Unauthorized(f"no valid contract {manifest['contract'][:8]} with {sender} here")

    async def _install(self, sealed: dict[str, Any], incoming: Incoming) -> dict[str, Any]:
        manifest = incoming.manifest
        if incoming.size != sealed["size"] or incoming.digest.hexdigest() != sealed["sha256"]:
            raise InvalidInput("move_install: the data does not match the announced hash")
        site = self.site
        engine = site.engine
        assert engine is not None
        started = self.clock()
        name = manifest["fragment"]
        where = incoming.path.parent
        if sealed["pre"] is not None and not incoming.pre_unpacked:
            # the pre-copy first (unpacked already if announced whole): the final tar adds
            # the rest
            await asyncio.to_thread(extract, incoming.pre_path, where)
        await asyncio.to_thread(extract, incoming.path, where)
        steps: dict[str, float] = {}

        def lap(step: str) -> None:  # the install, step by step
            steps[step] = self.clock() - started - sum(steps.values())

        lap("unpack_s")
        tree = where / "tree"
        catalog, spools = site.catalog, site.spools
        query = parse_query(manifest["definition"])
        incarnation = landed_incarnation(manifest)

        def land() -> None:
            for stream, offsets in sealed["offsets"].items():  # streams held here already
                spool = spools.get(stream)
                if spool.latest < sealed["holds"][stream]:
                    raise Conflict(
                        f"stream {stream}: this peer's copy ends at batch {spool.latest}, "
                        f"the fragment may have read through {sealed['holds'][stream]}",
                        stream=stream,
                    )
                if offsets and min(offsets.values()) < spool.earliest - 1:
                    raise Conflict(
                        f"stream {stream}: this peer trimmed what the fragment has yet to read",
                        stream=stream,
                    )
            for stream, offsets in sealed["offsets"].items():
                spool = spools.get(stream)
                for reader, offset in offsets.items():
                    write_reader_offset(spool.directory, reader, offset, fsync=spool.fsync)
            for stream, info in manifest["inputs"].items():
                if info["mode"] == "local":
                    continue
                schema = parse_schema(info["schema"])
                spools.adopt(stream, tree / info["dir"])
                catalog.add_stream(stream, schema, None)
                catalog.add_replica(stream, info["source"])
            for stream, info in manifest["outputs"].items():
                schema = parse_schema(info["schema"])
                spools.adopt(stream, tree / info["dir"])
                catalog.add_stream(stream, schema, name)
            if manifest.get("lane"):  # its windows, for the lane to start it with
                window = lane_window(tree / LANE_FILE)
                if window is not None:
                    seed = engine.lane_seed(name, incarnation)
                    seed.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(seed, msgpack.packb(window, use_bin_type=True))
            else:
                checkpoint = engine.checkpoint_dir(name, incarnation)
                shutil.rmtree(checkpoint, ignore_errors=True)
                checkpoint.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(tree / "checkpoint"), checkpoint)
            catalog.add_query(query, incarnation)
            catalog.set_placement(name, "lane" if manifest.get("lane") else "own")
            catalog.forget_moved(name)

        move_id = manifest["id"]
        if await asyncio.to_thread(self.journal.outcome, move_id) is not None:
            raise Conflict(f"move {move_id} of {name} was resolved already", query=name)
        arrival = {
            "id": move_id,
            "manifest": manifest,
            "sender": incoming.sender,
            "offsets": sealed["offsets"],  # reader offsets landing writes on streams here
        }
        await asyncio.to_thread(self.journal.write_arrival, move_id, arrival)
        try:
            await asyncio.to_thread(land)
            lap("land_s")
            await site.set_query_status_here(name, "RUNNING")
            lap("start_s")
            # the commit point: from here the fragment is ours, whatever happens
            await asyncio.to_thread(
                self.journal.decide,
                Outcome(move_id, name, manifest["epoch"], "installed", incoming.sender),
            )
        except BaseException:
            await self._roll_back(arrival)
            raise
        await asyncio.to_thread(self.journal.drop_arrival, move_id)
        resume_s = self.clock() - started
        self._serve_arrived(manifest)
        if self.on_arrival is not None:
            try:
                await self.on_arrival(
                    name,
                    incoming.sender,
                    manifest["contract"],
                    manifest["load"],
                    manifest["price"],
                    from_node=bytes.fromhex(manifest["from_node"]),
                )
            except (ValueError, OSError) as exc:
                log.error("ledger entry for arriving fragment %s not written: %s", name, exc)
        log.info("fragment %s arrived from %s and resumed", name, incoming.sender)
        rounded = {k: round(v, 3) for k, v in steps.items()}
        return {"fragment": name, "resume_s": round(resume_s, 3), "steps": rounded}

    def _serve_arrived(self, manifest: dict[str, Any]) -> None:
        """Host the result streams of a fragment that arrived and pump their mirrors."""
        for stream in manifest["outputs"]:
            self.fed.hosting.adopt(stream)
            self.fed.mirrors.resume_stream(stream)

    def _forget_readers(self, offsets: dict[str, dict[str, int]]) -> None:
        """Unregister the reader offsets landing wrote on streams held here already."""
        for stream, readers in offsets.items():
            with contextlib.suppress(KeyError):
                spool = self.site.spools.get(stream)
                for reader in readers:
                    spool.unregister_reader(reader)

    async def _roll_back(self, arrival: dict[str, Any]) -> None:
        """Undo what landing an arrival did (nothing of it serves yet), and record the move
        as aborted unless its outcome is written already."""
        manifest = arrival["manifest"]
        site, name = self.site, manifest["fragment"]
        log.warning("fragment %s did not arrive; rolling back what landed of it", name)
        entry = site.catalog.find_query(name)
        incarnation = landed_incarnation(manifest)
        try:
            if entry is not None and entry.incarnation == incarnation:
                if site.engine is not None:  # stop it, drop its readers and checkpoint
                    await site.engine.drop_query(name, incarnation)
                await asyncio.to_thread(site.catalog.remove_query, name)
            await asyncio.to_thread(self._forget_readers, arrival.get("offsets", {}))
            landed = [s for s, i in manifest["inputs"].items() if i["mode"] == "copy"]
            await site.drop_streams(landed + list(manifest["outputs"]))
        except (OSError, FedstreamError) as exc:
            log.error("rolling back fragment %s: %s", name, exc)
        if await asyncio.to_thread(self.journal.outcome, manifest["id"]) is None:
            await asyncio.to_thread(
                self.journal.decide,
                Outcome(manifest["id"], name, manifest["epoch"], "aborted", arrival["sender"]),
            )
        await asyncio.to_thread(self.journal.drop_arrival, manifest["id"])

    async def recover(self) -> None:
        """Finish the arrivals this peer's last run left unfinished: one whose install was
        decided runs and serves; one that was not is rolled back (its sender undoes it)."""
        for arrival in await asyncio.to_thread(self.journal.arrivals):
            manifest = arrival.get("manifest")
            if not isinstance(manifest, dict) or "id" not in manifest:
                continue
            outcome = await asyncio.to_thread(self.journal.outcome, manifest["id"])
            if outcome is not None and outcome.decision == "installed":
                await self.site.resume_query(manifest["fragment"])
                self._serve_arrived(manifest)
                await asyncio.to_thread(self.journal.drop_arrival, manifest["id"])
            else:
                await self._roll_back(arrival)
