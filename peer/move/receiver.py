"""The receiving side of a move (see :mod:`peer.move` for the theory of operation)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, Protocol

from contracts.book import ContractBook
from contracts.contract import covers
from peer.errors import Conflict, InvalidInput, NotFound, Unauthorized, Unavailable
from peer.federation import Federation
from peer.model.query import parse_query
from peer.model.schema import parse_schema
from peer.move.package import (
    MAX_MOVE_BYTES,
    Incoming,
    append_chunk,
    check_install,
    check_manifest,
    extract,
)
from peer.site import LocalSite
from peer.storage.spool_format import write_reader_offset

log = logging.getLogger(__name__)

INCOMING_IDLE_S = 300.0  # an incoming move with no chunk for this long is dropped


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
        on_arrival: ArrivalHook | None = None,
    ) -> None:
        self.site = site
        self.fed = fed
        self.book = book
        self.lock = lock  # one move in or out at a time
        self.on_arrival = on_arrival
        self.root = site.data_dir / "moves"
        self._incoming: dict[str, Incoming] = {}
        self._holding = False  # the lock is held for an incoming move

    async def handle(self, frame: dict[str, Any], sender: str) -> dict[str, Any]:
        op = frame.get("op")
        if op == "move_begin":
            return await self._begin(frame.get("manifest"), sender)
        if op == "move_abort":
            for key, pending in list(self._incoming.items()):
                if pending.sender == sender and pending.manifest.get("fragment") == frame.get(
                    "fragment"
                ):
                    self._drop_incoming(key)
            return {"aborted": True}
        move_id = frame.get("move")
        found = self._incoming.get(move_id) if isinstance(move_id, str) else None
        if found is None or found.sender != sender or not isinstance(move_id, str):
            raise NotFound(f"no move {move_id!r} from {sender} is under way here")
        incoming = found
        incoming.touched = time.monotonic()
        if op == "move_chunk":
            data = frame.get("data")
            if not isinstance(data, bytes) or not data:
                raise InvalidInput("move_chunk: data must be non-empty bytes")
            if incoming.size + len(data) > MAX_MOVE_BYTES:
                self._drop_incoming(move_id)
                raise InvalidInput(f"move_chunk: a move carries at most {MAX_MOVE_BYTES} bytes")
            await asyncio.to_thread(append_chunk, incoming.path, data)
            incoming.digest.update(data)
            incoming.size += len(data)
            return {"move": move_id, "received": incoming.size}
        if op == "move_install":
            try:
                return await self._install(check_install(frame, incoming), incoming)
            finally:
                self._drop_incoming(move_id)
        raise InvalidInput(f"unknown move request {op!r}")

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
            if time.monotonic() - incoming.touched > INCOMING_IDLE_S:
                self._drop_incoming(key)
        checked_manifest = check_manifest(manifest)
        if site.engine is None:
            raise Conflict("this peer runs without an engine: it cannot take fragments")
        self._authorise(checked_manifest, sender)
        catalog = site.catalog
        name = checked_manifest["fragment"]
        if catalog.find_query(name) is not None:
            raise Conflict(f"a query named {name} runs here already", query=name)
        spools, hosted = site.spools, self.fed.hosting.hosted
        for stream, info in checked_manifest["inputs"].items():
            if info["mode"] == "copy" and stream in spools:
                raise Conflict(f"this peer holds stream {stream} already", stream=stream)
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
        """A contract with the sender's participant must let it hand us every box type."""
        book = self.book
        if book is None:
            raise Unauthorized("this peer holds no contracts: it takes no fragments")
        now = datetime.now(UTC)
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
        site, fed = self.site, self.fed
        engine = site.engine
        assert engine is not None
        started = time.monotonic()
        name = manifest["fragment"]
        where = incoming.path.parent
        await asyncio.to_thread(extract, incoming.path, where)
        tree = where / "tree"
        catalog, spools = site.catalog, site.spools
        query = parse_query(manifest["definition"])
        incarnation = manifest["incarnation"]

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
            checkpoint = engine.checkpoint_dir(name, incarnation)
            shutil.rmtree(checkpoint, ignore_errors=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(tree / "checkpoint"), checkpoint)
            catalog.add_query(query, incarnation)
            catalog.set_placement(name, "own")
            catalog.forget_moved(name)

        await asyncio.to_thread(land)
        await site.set_query_status_here(name, "RUNNING")
        resume_s = time.monotonic() - started
        for stream in manifest["outputs"]:
            fed.hosting.adopt(stream)
            fed.mirrors.resume_stream(stream)
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
        return {"fragment": name, "resume_s": round(resume_s, 3)}
