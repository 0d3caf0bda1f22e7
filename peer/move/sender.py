"""The sending side of a move (see :mod:`peer.move` for the theory of operation)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from peer.errors import Conflict, FedstreamError, InvalidInput, Unavailable
from peer.federation import Federation
from peer.model.query import query_to_dict
from peer.move.package import CHUNK_BYTES, export_fragment
from peer.move.plan import input_modes, why_not, why_not_there
from peer.protocol.link import Raw, StartMirror, StopMirror
from peer.site import LocalSite

log = logging.getLogger(__name__)

HANDOVER_S = 3.0  # the old host's last lease on a moved result stream
INSTALL_TIMEOUT_S = 120.0
MIRROR_CATCHUP_S = 60.0


class MoveSender:
    def __init__(self, site: LocalSite, fed: Federation, lock: asyncio.Lock) -> None:
        self.site = site
        self.fed = fed
        self.lock = lock  # one move in or out at a time
        self.root = site.data_dir / "moves"

    async def move_out(
        self,
        name: str,
        target: bytes,
        *,
        contract: str,
        load: float = 0.0,
        price: float = 0.0,
    ) -> dict[str, Any]:
        fed = self.fed
        if self.site.engine is None:
            raise Conflict("this peer runs no engine: nothing can move")
        if target == fed.node_id:
            raise InvalidInput("a fragment cannot move to the peer it runs on")
        if self.lock.locked():
            raise Unavailable("another move is in flight on this peer; retry later")
        async with self.lock:
            reason = why_not(self.site, fed.hosting.hosted, name) or why_not_there(
                self.site, name, target
            )
            if reason is not None:
                raise Conflict(f"fragment {name} cannot move: {reason}", query=name)
            return await self._move_out(name, target, contract, load, price)

    async def _move_out(
        self, name: str, target: bytes, contract: str, load: float, price: float
    ) -> dict[str, Any]:
        site, fed, engine = self.site, self.fed, self.site.engine
        assert engine is not None
        catalog, spools = site.catalog, site.spools
        entry = catalog.query(name)
        checked = site.checked(entry.query)
        running = engine.running[name]
        readers: dict[str, list[str]] = {}
        for stream, reader in running.readers:
            readers.setdefault(stream, []).append(reader)
        replicas = catalog.replicas()
        replica_inputs = [s for s in checked.inputs if s in replicas]
        modes = input_modes(site, name, target)
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
        await fed.router.call(target, Raw("move_begin", {"manifest": manifest}))
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
                site.freeze(stream)
            for stream in replica_inputs:
                await site.drained(stream)
                host = await fed.hosting.host_of(stream, fresh=True)
                reply = await fed.router.call(host, StopMirror(stream, fed.node_id))
                detached[stream] = (host, int(reply.get("acked", -1)))
            for stream in outputs:
                await fed.mirrors.pause(stream)
            own_origin = {s: fed.mirrors.origin(s) for s in hosted_inputs + outputs}
            sealed = await asyncio.to_thread(
                export_fragment,
                site,
                stage,
                manifest,
                entry,
                readers,
                hosted_inputs,
                own_origin,
                target,
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
                await fed.router.call(host, StartMirror(stream, target, acked))
            except FedstreamError as exc:
                log.error("host of %s did not start mirroring to the new site: %s", stream, exc)
        for stream in hosted_inputs:
            fed.mirrors.start(stream, target)
            with contextlib.suppress(Exception):
                await fed.hosting.renew(stream)
        for stream in outputs:
            await fed.hosting.hand_over(stream, target, HANDOVER_S)
        kept = [s for s in checked.inputs if s not in replicas]  # we go on hosting these
        await asyncio.to_thread(
            self._release, name, entry.incarnation, readers, kept, replica_inputs, outputs
        )
        await asyncio.to_thread(catalog.add_moved, name, target.hex(), time.time())
        for stream in replica_inputs:
            site.thaw(stream)
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
        fed = self.fed
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

    async def _ship(self, target: bytes, tar_path: Path, sealed: dict[str, Any]) -> dict[str, Any]:
        router = self.fed.router
        move_id = tar_path.parent.name.removeprefix("out-")
        with tar_path.open("rb") as f:
            while block := await asyncio.to_thread(f.read, CHUNK_BYTES):
                await router.call(target, Raw("move_chunk", {"move": move_id, "data": block}))
        async with asyncio.timeout(INSTALL_TIMEOUT_S):
            return await router.call(target, Raw("move_install", {"move": move_id, **sealed}))

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
        site, fed = self.site, self.fed
        log.warning("moving %s to %s failed; resuming it here", name, target.hex()[:12])
        with contextlib.suppress(Exception):
            await fed.router.call(target, Raw("move_abort", {"fragment": name}))
        for stream, (host, acked) in detached.items():
            try:
                await fed.router.call(host, StartMirror(stream, fed.node_id, acked))
            except FedstreamError as exc:
                log.error("mirror of %s to this peer not restored: %s", stream, exc)
        for stream in hosted_inputs:  # the mirror readers this move made (none was there)
            with contextlib.suppress(KeyError):
                await fed.mirrors.detach(stream, target)
        for stream in outputs:
            fed.mirrors.resume_stream(stream)
        for stream in replica_inputs:
            site.thaw(stream)
        await site.set_query_status_here(name, "STOPPED")
        await site.set_query_status_here(name, "RUNNING")

    def _release(
        self,
        name: str,
        incarnation: str,
        readers: dict[str, list[str]],
        hosted_inputs: list[str],
        replica_inputs: list[str],
        outputs: list[str],
    ) -> None:
        site = self.site
        catalog, spools = site.catalog, site.spools
        assert site.engine is not None
        for stream in hosted_inputs:
            spool = spools.get(stream)
            for reader in readers.get(stream, []):
                spool.unregister_reader(reader)
        for stream in replica_inputs + outputs:
            catalog.remove_stream(stream)
            with contextlib.suppress(KeyError):
                spools.drop(stream)
        catalog.remove_query(name)
        shutil.rmtree(site.engine.checkpoint_dir(name, incarnation), ignore_errors=True)
