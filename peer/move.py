"""Moving a running fragment, with its state, to a partner's peer (Medusa's load movement).

Theory of operation
-------------------
A fragment reads local spools and writes local spools; Spark keeps its progress (the spool
offsets each micro-batch consumed) and its operator state (windows, join buffers) in the
fragment's checkpoint directory. So a fragment moves whole if the new peer gets the checkpoint
and spools *with the same offsets*: Spark resumes there exactly where it stopped, and a batch
it re-runs carries the same batch id, which the result spool drops as a replay.

The sender P, holding the move lock (one move in or out at a time):

1. stops the fragment's streaming query: the *pause* starts;
2. for each input that is a replica of a stream hosted by U: refuses further mirrored appends
   (and waits for those landing), then asks U to stop mirroring to P (``unmirror``), which
   answers with the last offset P acknowledged; P's replica is final from then on;
3. for each input hosted at P itself (P keeps hosting it): registers a mirror reader for the
   new peer Q at the spool's latest offset L (what the copy will hold); if Q holds a mirror
   of it already, waits until that mirror has everything P's spool held at the stop;
4. pauses the mirrors of the fragment's result streams (downstream fragments' copies), so the
   readers' offsets are final;
5. exports into a staging directory: the checkpoint; each input's uncommitted spool files
   (after the fragment's committed offset) with the fragment's reader offsets and the replay
   memory; each result spool whole (what late subscribers may still read) with the mirror
   readers, and the origin its mirrors used;
6. ships it as one tar over the peer link in chunks (``move_begin``, ``move_chunk``...,
   ``move_install``), with a manifest (definition, incarnation, streams, schemas, contract);
7. Q checks the sender's contract covers every box type of the fragment, and that its own
   copy of each input it holds already reaches as far as P's spool did at the stop (``holds``:
   Spark re-runs the batch it had planned, which may end there), adopts the spools and
   the checkpoint, enters the streams and the query in its catalog, starts the query from the
   checkpoint (the pause ends), hosts the result streams (their mirrors carry on under the old
   origin, so downstream replay memory still applies) and claims their leases;
8. P then has U mirror to Q from the offset P had acknowledged, mirrors its own inputs to Q,
   writes a short handover lease naming Q for each result stream, records where the fragment
   went (requests for it are forwarded), and drops what it no longer needs.

A failure before Q has resumed undoes steps 2-4 and restarts the fragment at P.

Movable: a RUNNING fragment with its own streaming query (not in the stateless lane), whose
result streams no other local query reads and whose replica inputs no other local query
reads. Q refuses a fragment whose streams or name it already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.errors import Conflict, FedstreamError, InvalidInput, NotFound, Unauthorized, Unavailable
from peer.mirror import MIRROR_PREFIX, ORIGIN_FILE
from peer.model.query import parse_query, query_to_dict
from peer.model.schema import parse_schema
from peer.storage.spool_format import write_reader_offset

if TYPE_CHECKING:
    from peer.node import Peer

log = logging.getLogger(__name__)

_READER = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
CHUNK_BYTES = 4 * 1024 * 1024
MAX_MOVE_BYTES = 8 * 1024**3
HANDOVER_S = 3.0  # the old host's last lease on a moved result stream
INSTALL_TIMEOUT_S = 120.0
MIRROR_CATCHUP_S = 60.0
INCOMING_IDLE_S = 300.0  # an incoming move with no chunk for this long is dropped


@dataclass
class _Incoming:
    manifest: dict[str, Any]
    sender: str
    path: Path
    size: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    touched: float = field(default_factory=time.monotonic)


class Mover:
    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.lock = asyncio.Lock()  # one move in or out at a time
        self._incoming: dict[str, _Incoming] = {}
        self._holding = False  # the lock is held for an incoming move
        self.root = peer.data_dir / "moves"
        shutil.rmtree(self.root, ignore_errors=True)  # leftovers of a crash mid-move
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    # ------------------------------------------------------------------ what may move

    def movable(self) -> list[tuple[str, tuple[str, ...]]]:
        """(fragment, box types) of the fragments that may move now."""
        peer = self.peer
        if peer.engine is None or peer.fed is None:
            return []
        out = []
        for name in peer.local_catalog().query_names():
            if self.why_not(name) is None:
                entry = peer.local_catalog().query(name)
                out.append((name, tuple(sorted({b.type for b in entry.query.boxes}))))
        return out

    def why_not(self, name: str) -> str | None:
        peer = self.peer
        catalog = peer.local_catalog()
        entry = catalog.find_query(name)
        if entry is None:
            return f"no fragment {name} runs here"
        if entry.status != "RUNNING":
            return f"fragment {name} is {entry.status}, not RUNNING"
        if peer.engine is None or name not in peer.engine.running:
            return f"fragment {name} runs in the shared stateless lane"
        checked = peer.checked(entry.query)
        others = [
            s
            for other in catalog.query_names()
            if other != name
            for box in catalog.query(other).query.boxes
            for s in box.inputs
        ]
        replicas = catalog.replicas()
        fed = peer.fed
        assert fed is not None
        for stream in checked.outputs:
            if stream in others:
                return f"another query here reads its result stream {stream}"
        for stream in checked.inputs:
            if stream in replicas:
                if stream in others:
                    return f"another query here reads its input {stream}"
            elif stream not in fed.hosted:
                return f"its input {stream} is neither hosted nor mirrored here"
        return None

    # ------------------------------------------------------------------ sending

    def _why_not_there(self, name: str, target: bytes) -> str | None:
        """Why the fragment cannot go to ``target`` (checked before anything stops)."""
        peer = self.peer
        catalog, spools = peer.local_catalog(), peer.spool_set()
        checked = peer.checked(catalog.query(name).query)
        replicas = catalog.replicas()
        for stream in checked.inputs:
            if replicas.get(stream) == target.hex() and not spools.get(stream).aligned():
                # the target hosts it, but our copy numbers its batches otherwise
                return f"the target hosts its input {stream}, with other offsets than ours"
        for stream in checked.outputs:
            if MIRROR_PREFIX + target.hex() in spools.get(stream).readers():
                return f"the target reads its result stream {stream}"
        return None

    def _input_modes(self, name: str, target: bytes) -> dict[str, str]:
        """How each input gets to ``target``: ``copy`` (its uncommitted files travel and
        become a replica there) or ``local`` (the target holds the stream with our offsets
        already: it hosts it, or it holds a mirror of it that we send; only the reader
        offsets travel)."""
        peer = self.peer
        catalog, spools = peer.local_catalog(), peer.spool_set()
        checked = peer.checked(catalog.query(name).query)
        replicas = catalog.replicas()
        modes = {}
        for stream in checked.inputs:
            if replicas.get(stream) == target.hex() or (
                stream not in replicas
                and (MIRROR_PREFIX + target.hex() in spools.get(stream).readers())
            ):
                modes[stream] = "local"
            else:
                modes[stream] = "copy"
        return modes

    async def move_out(
        self,
        name: str,
        target: bytes,
        *,
        contract: str,
        load: float = 0.0,
        price: float = 0.0,
    ) -> dict[str, Any]:
        peer, fed = self.peer, self.peer.fed
        if fed is None or peer.engine is None:
            raise Conflict("this peer runs no engine or no overlay: nothing can move")
        if target == fed.node_id:
            raise InvalidInput("a fragment cannot move to the peer it runs on")
        if self.lock.locked():
            raise Unavailable("another move is in flight on this peer; retry later")
        async with self.lock:
            reason = self.why_not(name) or self._why_not_there(name, target)
            if reason is not None:
                raise Conflict(f"fragment {name} cannot move: {reason}", query=name)
            return await self._move_out(name, target, contract, load, price)

    async def _move_out(
        self, name: str, target: bytes, contract: str, load: float, price: float
    ) -> dict[str, Any]:
        peer, fed, engine = self.peer, self.peer.fed, self.peer.engine
        assert fed is not None
        catalog, spools = peer.local_catalog(), peer.spool_set()
        entry = catalog.query(name)
        checked = peer.checked(entry.query)
        running = engine.running[name]
        readers: dict[str, list[str]] = {}
        for stream, reader in running.readers:
            readers.setdefault(stream, []).append(reader)
        replicas = catalog.replicas()
        replica_inputs = [s for s in checked.inputs if s in replicas]
        modes = self._input_modes(name, target)
        # hosted here, and new at the target: mirrored there from the copy's end on
        hosted_inputs = [s for s in checked.inputs if s not in replicas and modes[s] == "copy"]
        outputs = list(checked.outputs)
        move_id = uuid.uuid4().hex
        stage = self.root / f"out-{move_id}"
        detached: dict[str, tuple[bytes, int]] = {}  # replica input -> (its host, acked)
        manifest: dict[str, Any] = {
            "id": move_id,
            "fragment": name,
            "definition": query_to_dict(entry.query),
            "incarnation": entry.incarnation,
            "box_types": sorted({b.type for b in entry.query.boxes}),
            "contract": contract,
            "load": load,
            "price": price,
            "from_node": fed.node_id.hex(),
            "inputs": {
                s: {
                    "dir": f"in{i}",
                    "mode": modes[s],
                    "schema": catalog.stream(s).schema.to_dict(),
                    "source": replicas.get(s, fed.node_id.hex()),
                }
                for i, s in enumerate(checked.inputs)
            },
            "outputs": {
                s: {"dir": f"out{i}", "schema": catalog.stream(s).schema.to_dict()}
                for i, s in enumerate(outputs)
            },
        }
        # the target checks the contract and its streams before anything stops here
        await fed.call(target, {"op": "move_begin", "manifest": manifest})
        # Inputs the target holds already: its copy must hold every batch the fragment may
        # have planned here (Spark re-runs a planned batch on resume, and a file missing there
        # fails the query), so what our spool held at the stop. Of those we host and mirror to
        # the target, most is sent before the stop, the rest during the pause.
        held = [s for s in checked.inputs if modes[s] == "local"]
        mirrored = [s for s in held if s not in replicas]
        await self._mirrors_caught_up({s: spools.get(s).latest - 16 for s in mirrored}, target)
        started = time.monotonic()
        try:
            await engine.stop_query(name)  # the pause starts
            holds = {s: spools.get(s).latest for s in held}
            await self._mirrors_caught_up({s: holds[s] for s in mirrored}, target, strict=True)
            for stream in replica_inputs:
                peer.freeze(stream)
            for stream in replica_inputs:
                await peer.drained(stream)
                host = await fed.host_of(stream, fresh=True)
                reply = await fed.call(
                    host, {"op": "unmirror", "stream": stream, "to": fed.node_id.hex()}
                )
                detached[stream] = (host, int(reply.get("acked", -1)))
            for stream in outputs:
                await fed.mirrors.pause(stream)
            own_origin = {s: fed.mirrors.origin(s) for s in hosted_inputs + outputs}
            sealed = await asyncio.to_thread(
                self._export, stage, manifest, entry, readers, hosted_inputs, own_origin, target
            )
            reply = await self._ship(target, stage / "move.tar", {**sealed, "holds": holds})
        except BaseException as exc:
            await self._undo(name, target, detached, hosted_inputs, outputs, replica_inputs)
            shutil.rmtree(stage, ignore_errors=True)
            if isinstance(exc, FedstreamError):
                raise Unavailable(
                    f"moving {name} failed, it runs here again: {exc.message}", query=name
                ) from exc
            raise
        pause_s = time.monotonic() - started
        # Q runs it now: send it what P held back, and let go.
        for stream, (host, acked) in detached.items():
            if host == target:
                continue  # the target hosts it: the fragment reads the original there
            try:
                await fed.call(
                    host,
                    {"op": "mirror", "stream": stream, "to": target.hex(), "after": acked},
                )
            except FedstreamError as exc:
                log.error("host of %s did not start mirroring to the new site: %s", stream, exc)
        for stream in hosted_inputs:
            fed.mirrors.start(stream, target)
            with contextlib.suppress(Exception):
                await fed._renew(stream)
        for stream in outputs:
            await fed.hand_over(stream, target, HANDOVER_S)
        kept = [s for s in checked.inputs if s not in replicas]  # we go on hosting these
        await asyncio.to_thread(
            self._release, name, entry.incarnation, readers, kept, replica_inputs, outputs
        )
        await asyncio.to_thread(catalog.add_moved, name, target.hex(), time.time())
        for stream in replica_inputs:
            peer.thaw(stream)
        shutil.rmtree(stage, ignore_errors=True)
        log.info("fragment %s moved to %s (pause %.2f s)", name, target.hex()[:12], pause_s)
        return {
            "fragment": name,
            "to": target.hex(),
            "pause_s": round(pause_s, 3),
            "bytes": sealed["size"],
            "resume_s": reply.get("resume_s"),
        }

    async def _mirrors_caught_up(
        self, goals: dict[str, int], target: bytes, *, strict: bool = False
    ) -> None:
        """Wait until ``target`` acknowledged each stream's mirrored batches through its goal
        offset; after MIRROR_CATCHUP_S, give up (``strict``: fail)."""
        fed = self.peer.fed
        assert fed is not None
        try:
            async with asyncio.timeout(MIRROR_CATCHUP_S):
                for stream, goal in goals.items():
                    await fed.mirrors.acknowledged(stream, target, goal)
        except TimeoutError:
            if strict:
                raise Unavailable(
                    f"the mirror of {', '.join(goals)} to the target did not catch up within "
                    f"{MIRROR_CATCHUP_S:.0f} s"
                ) from None

    def _export(
        self,
        stage: Path,
        manifest: dict[str, Any],
        entry: Any,
        readers: dict[str, list[str]],
        hosted_inputs: list[str],
        own_origin: dict[str, str],
        target: bytes,
    ) -> dict[str, Any]:
        """Write the tar; what ``move_install`` says besides it (size, hash, reader offsets
        of the inputs the target holds already)."""
        peer = self.peer
        spools = peer.spool_set()
        tree = stage / "tree"
        name = manifest["fragment"]
        shutil.copytree(peer.engine.checkpoint_dir(name, entry.incarnation), tree / "checkpoint")
        offsets: dict[str, dict[str, int]] = {}
        for stream, info in manifest["inputs"].items():
            spool = spools.get(stream)
            ids = readers.get(stream, [])
            committed = {r: spool.committed(r) for r in ids}
            if info["mode"] == "local":
                offsets[stream] = committed
                continue
            floor = min(committed.values(), default=spool.latest)
            seqs = {}
            through = spool.latest
            if stream in hosted_inputs:
                # P mirrors it to Q from L on, under P's origin, once Q runs the fragment
                seqs = {own_origin[stream]: through}
                write_reader_offset(
                    spool.directory, MIRROR_PREFIX + target.hex(), through, fsync=spool.fsync
                )
            spool.export(tree / info["dir"], after=floor, through=through, readers=ids, seqs=seqs)
        for stream, info in manifest["outputs"].items():
            spool = spools.get(stream)
            mirror_readers = [r for r in spool.readers() if r.startswith(MIRROR_PREFIX)]
            spool.export(tree / info["dir"], after=-1, readers=mirror_readers)
            (tree / info["dir"] / ORIGIN_FILE).write_text(own_origin[stream])
        tar_path = stage / "move.tar"
        with tarfile.open(tar_path, "w") as tar:
            tar.add(tree, arcname="tree")
        digest = hashlib.sha256()
        with tar_path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return {"size": tar_path.stat().st_size, "sha256": digest.hexdigest(), "offsets": offsets}

    async def _ship(self, target: bytes, tar_path: Path, sealed: dict[str, Any]) -> dict[str, Any]:
        fed = self.peer.fed
        assert fed is not None
        move_id = tar_path.parent.name.removeprefix("out-")
        with tar_path.open("rb") as f:
            while block := await asyncio.to_thread(f.read, CHUNK_BYTES):
                await fed.call(target, {"op": "move_chunk", "move": move_id, "data": block})
        async with asyncio.timeout(INSTALL_TIMEOUT_S):
            return await fed.call(target, {"op": "move_install", "move": move_id, **sealed})

    async def _undo(
        self,
        name: str,
        target: bytes,
        detached: dict[str, tuple[bytes, int]],
        hosted_inputs: list[str],
        outputs: list[str],
        replica_inputs: list[str],
    ) -> None:
        """The move failed before the new peer resumed it: run it here again."""
        peer, fed = self.peer, self.peer.fed
        assert fed is not None
        log.warning("moving %s to %s failed; resuming it here", name, target.hex()[:12])
        with contextlib.suppress(Exception):
            await fed.call(target, {"op": "move_abort", "fragment": name})
        for stream, (host, acked) in detached.items():
            try:
                await fed.call(
                    host,
                    {"op": "mirror", "stream": stream, "to": fed.node_id.hex(), "after": acked},
                )
            except FedstreamError as exc:
                log.error("mirror of %s to this peer not restored: %s", stream, exc)
        for stream in hosted_inputs:  # the mirror readers this move made (none was there)
            with contextlib.suppress(KeyError):
                await fed.mirrors.detach(stream, target)
        for stream in outputs:
            fed.mirrors.resume_stream(stream)
        for stream in replica_inputs:
            peer.thaw(stream)
        await peer.set_query_status_local(name, "STOPPED")
        await peer.set_query_status_local(name, "RUNNING")

    def _release(
        self,
        name: str,
        incarnation: str,
        readers: dict[str, list[str]],
        hosted_inputs: list[str],
        replica_inputs: list[str],
        outputs: list[str],
    ) -> None:
        peer = self.peer
        catalog, spools = peer.local_catalog(), peer.spool_set()
        for stream in hosted_inputs:
            spool = spools.get(stream)
            for reader in readers.get(stream, []):
                spool.unregister_reader(reader)
        for stream in replica_inputs + outputs:
            catalog.remove_stream(stream)
            with contextlib.suppress(KeyError):
                spools.drop(stream)
        catalog.remove_query(name)
        shutil.rmtree(peer.engine.checkpoint_dir(name, incarnation), ignore_errors=True)

    # ------------------------------------------------------------------ receiving

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
            await asyncio.to_thread(_append, incoming.path, data)
            incoming.digest.update(data)
            incoming.size += len(data)
            return {"move": move_id, "received": incoming.size}
        if op == "move_install":
            try:
                return await self._install(_check_install(frame, incoming), incoming)
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
        peer = self.peer
        for key, incoming in list(self._incoming.items()):  # a sender that went silent
            if time.monotonic() - incoming.touched > INCOMING_IDLE_S:
                self._drop_incoming(key)
        checked_manifest = _check_manifest(manifest)
        if peer.engine is None:
            raise Conflict("this peer runs without an engine: it cannot take fragments")
        self._authorise(checked_manifest, sender)
        catalog = peer.local_catalog()
        name = checked_manifest["fragment"]
        if catalog.find_query(name) is not None:
            raise Conflict(f"a query named {name} runs here already", query=name)
        spools, hosted = peer.spool_set(), peer.fed.hosted if peer.fed is not None else set()
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
        self._incoming[move_id] = _Incoming(checked_manifest, sender, where / "move.tar")
        return {"move": move_id, "ready": True}

    def _authorise(self, manifest: dict[str, Any], sender: str) -> None:
        """A contract with the sender's participant must let it hand us every box type."""
        from datetime import UTC, datetime

        from contracts.contract import covers

        book = self.peer.book
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

    async def _install(self, sealed: dict[str, Any], incoming: _Incoming) -> dict[str, Any]:
        manifest = incoming.manifest
        if incoming.size != sealed["size"] or incoming.digest.hexdigest() != sealed["sha256"]:
            raise InvalidInput("move_install: the data does not match the announced hash")
        peer, fed = self.peer, self.peer.fed
        assert fed is not None
        started = time.monotonic()
        name = manifest["fragment"]
        where = incoming.path.parent
        await asyncio.to_thread(_extract, incoming.path, where)
        tree = where / "tree"
        catalog, spools = peer.local_catalog(), peer.spool_set()
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
            checkpoint = peer.engine.checkpoint_dir(name, incarnation)
            shutil.rmtree(checkpoint, ignore_errors=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(tree / "checkpoint"), checkpoint)
            catalog.add_query(query, incarnation)
            catalog.set_placement(name, "own")
            catalog.forget_moved(name)

        await asyncio.to_thread(land)
        await peer.set_query_status_local(name, "RUNNING")
        resume_s = time.monotonic() - started
        for stream in manifest["outputs"]:
            fed.adopt(stream)
            fed.mirrors.resume_stream(stream)
        brain = getattr(peer, "brain", None)
        if brain is not None:
            try:
                await brain.note_arrival(
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


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _extract(tar_path: Path, where: Path) -> None:
    with tarfile.open(tar_path, "r") as tar:
        tar.extractall(where, filter="data")  # no absolute paths, links out, devices


def _check_manifest(manifest: Any) -> dict[str, Any]:
    """The manifest, type-checked; InvalidInput names the first thing wrong."""
    if not isinstance(manifest, dict):
        raise InvalidInput("move_begin: manifest must be a map")

    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        value = manifest.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidInput(f"move_begin: manifest field {key!r} is missing or mistyped")
        return value

    for key in ("id", "fragment", "incarnation", "contract", "from_node"):
        need(key, str)
    if not all(c in "0123456789abcdef" for c in manifest["id"]) or len(manifest["id"]) != 32:
        raise InvalidInput("move_begin: id must be 32 hex digits")
    for key in ("load", "price"):
        value = need(key, (int, float))
        if not (value >= 0 and value < float("inf")):
            raise InvalidInput(f"move_begin: {key} must be finite and >= 0")
    need("definition", dict)
    parsed = parse_query(manifest["definition"])
    if parsed.name != manifest["fragment"]:
        raise InvalidInput("move_begin: the definition is not the fragment's")
    types = need("box_types", list)
    if sorted({b.type for b in parsed.boxes}) != types:
        raise InvalidInput("move_begin: box_types do not match the definition")
    for key in ("inputs", "outputs"):
        streams = need(key, dict)
        for stream, info in streams.items():
            if not isinstance(stream, str) or not isinstance(info, dict):
                raise InvalidInput(f"move_begin: {key} must map stream names to maps")
            directory = info.get("dir")
            if not isinstance(directory, str) or not directory.isalnum():
                raise InvalidInput(f"move_begin: {key}.{stream}.dir must be a plain name")
            parse_schema(info.get("schema") or {})
            if key == "inputs" and not isinstance(info.get("source"), str):
                raise InvalidInput(f"move_begin: inputs.{stream}.source must be a node id")
            if key == "inputs" and info.get("mode") not in ("copy", "local"):
                raise InvalidInput(f"move_begin: inputs.{stream}.mode must be copy or local")
    return manifest


def _check_install(frame: dict[str, Any], incoming: _Incoming) -> dict[str, Any]:
    """size, sha256, reader offsets and held offsets of a ``move_install``; InvalidInput if
    mistyped."""
    size, digest, offsets = frame.get("size"), frame.get("sha256"), frame.get("offsets")
    holds = frame.get("holds")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_MOVE_BYTES:
        raise InvalidInput("move_install: size must be a positive byte count")
    if not isinstance(digest, str):
        raise InvalidInput("move_install: sha256 must be a hex string")
    if not isinstance(offsets, dict):
        raise InvalidInput("move_install: offsets must be a map")
    local = {s for s, i in incoming.manifest["inputs"].items() if i["mode"] == "local"}
    if set(offsets) != local:
        raise InvalidInput("move_install: offsets must name exactly the inputs held here")
    if (
        not isinstance(holds, dict)
        or set(holds) != local
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in holds.values())
    ):
        raise InvalidInput("move_install: holds must map each input held here to an offset")
    for stream, readers in offsets.items():
        if not isinstance(readers, dict) or not all(
            isinstance(r, str)
            and _READER.fullmatch(r)
            and isinstance(o, int)
            and not isinstance(o, bool)
            and o >= -1
            for r, o in readers.items()
        ):
            raise InvalidInput(f"move_install: offsets.{stream} must map reader ids to offsets")
    return {"size": size, "sha256": digest, "offsets": offsets, "holds": holds}


__all__ = ["Mover"]
