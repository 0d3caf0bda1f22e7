"""The sending side of a move (see :mod:`peer.move` for the theory of operation)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peer.errors import Conflict, FedstreamError, InvalidInput, Unavailable
from peer.federation import Federation
from peer.model.query import query_to_dict
from peer.move.candidates import input_modes, why_not, why_not_there
from peer.move.journal import Intent, Journal
from peer.move.package import CHUNK_BYTES, export_fragment, export_precopy
from peer.protocol.link import Raw, StartMirror, StopMirror
from peer.site import LocalSite
from peer.timing import MONOTONIC, WALL, Clock

log = logging.getLogger(__name__)

HANDOVER_S = 3.0  # the old host's last lease on a moved result stream
INSTALL_TIMEOUT_S = 120.0
MIRROR_CATCHUP_S = 60.0
RESOLVE_ATTEMPTS = 3  # asked this often after a lost install reply before staying in doubt
RESOLVE_TIMEOUT_S = 10.0
RESOLVE_RETRY_S = 2.0


def resolve_request(intent: Intent) -> Raw:
    """``move_resolve``: the target's final word on the move (peer.move.journal)."""
    frame = {"move": intent.id, "fragment": intent.fragment, "epoch": intent.epoch}
    return Raw("move_resolve", frame)


class MoveSender:
    def __init__(
        self,
        site: LocalSite,
        fed: Federation,
        lock: asyncio.Lock,
        journal: Journal,
        *,
        clock: Clock = MONOTONIC,
        wall: Callable[[], float] = WALL,
    ) -> None:
        self.site = site
        self.fed = fed
        self.lock = lock  # one move in or out at a time
        self.journal = journal
        self.root = site.data_dir / "moves"
        self.clock = clock  # the pause a move costs, the waits between resolve attempts
        self.wall = wall  # when a fragment moved away (the catalog's record)
        self.in_doubt: dict[str, Intent] = {}  # move id -> the move being resolved
        self._resolvers: asyncio.TaskGroup | None = None  # run()'s, while it runs

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
            if any(intent.fragment == name for intent in self.in_doubt.values()):
                raise Conflict(f"fragment {name}: its last move is in doubt", query=name)
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
        # A member of the shared lane reads through the lane's reader, which stays here for
        # the other members: the move takes its position from the lane, and unregisters nothing.
        in_lane = name in engine.lane.members
        readers: dict[str, list[str]] = {}
        if in_lane:
            readers = {s: [engine.lane_reader] for s in checked.inputs}
        else:
            for stream, reader in engine.running[name].readers:
                readers.setdefault(stream, []).append(reader)
        replicas = catalog.replicas()
        replica_inputs = [s for s in checked.inputs if s in replicas]
        modes = input_modes(site, name, target)
        # hosted here, and new at the target: mirrored there from the copy's end on
        hosted_inputs = [s for s in checked.inputs if s not in replicas and modes[s] == "copy"]
        outputs = list(checked.outputs)
        last_epoch = await asyncio.to_thread(self.journal.last_epoch, name)
        intent = Intent(
            id=uuid.uuid4().hex,
            fragment=name,
            target=target.hex(),
            incarnation=entry.incarnation,
            epoch=last_epoch + 1,
            replica_inputs=replica_inputs,
            hosted_inputs=hosted_inputs,
            outputs=outputs,
            readers={} if in_lane else readers,
            lane=in_lane,
            kept=[s for s in checked.inputs if s not in replicas],  # we go on hosting these
        )
        stage = self.root / f"out-{intent.id}"
        manifest: dict[str, Any] = {
            "id": intent.id,
            "fragment": name,
            "definition": query_to_dict(entry.query),
            "incarnation": entry.incarnation,
            "epoch": intent.epoch,
            "box_types": sorted({b.type for b in entry.query.boxes}),
            "contract": contract,
            "load": load,
            "price": price,
            "from_node": fed.node_id.hex(),
            "lane": in_lane,  # it runs in the target's lane too, from its position and windows
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
        # The pre-copy: the backlog and result files as they are now travel while the
        # fragment runs; the pause then ships only what came after (as a live migration).
        precopy_started = self.clock()
        try:
            await self._mirrors_caught_up({s: spools.get(s).latest - 16 for s in mirrored}, target)
            pre = await asyncio.to_thread(export_precopy, site, stage, manifest, readers)
            await self._send_chunks(target, stage / "pre.tar", part="pre")
            pre_sealed = {"size": pre.tar.size, "sha256": pre.tar.sha256}
            await fed.router.call(  # the target checks and unpacks it now
                target, Raw("move_precopied", {"move": intent.id, **pre_sealed})
            )
            await asyncio.to_thread(self.journal.write_intent, intent)  # from here, undoable
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            await self._tell_target(intent)
            raise
        precopy_s = self.clock() - precopy_started
        started = self.clock()
        try:
            steps: dict[str, float] = {}

            def lap(step: str) -> None:  # the pause, step by step
                steps[step] = self.clock() - started - sum(steps.values())

            # the pause starts: the fragment's streaming query stops, or the lane holds at a
            # batch boundary and says where the member stands
            cut = await engine.hold_member(name) if in_lane else None
            if cut is None:
                await engine.stop_query(name)
            lap("stop_s")
            holds = {s: spools.get(s).latest for s in held}
            await self._mirrors_caught_up({s: holds[s] for s in mirrored}, target, strict=True)
            for stream in replica_inputs:
                site.freeze(stream)
            for stream in replica_inputs:
                await site.drained(stream)
                host = await fed.hosting.host_of(stream, fresh=True)
                reply = await fed.router.call(host, StopMirror(stream, fed.node_id))
                intent.detached[stream] = (host.hex(), int(reply.get("acked", -1)))
                await asyncio.to_thread(self.journal.write_intent, intent)
            for stream in outputs:
                await fed.mirrors.pause(stream)
            own_origin = {s: fed.mirrors.origin(s) for s in hosted_inputs + outputs}
            lap("detach_s")
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
                pre.present,
                cut,
            )
            lap("export_s")
            await self._send_chunks(target, stage / "move.tar")
            lap("send_s")
            intent.phase = "installing"  # the target may install from now on: in doubt
            await asyncio.to_thread(self.journal.write_intent, intent)
        except BaseException as exc:
            shutil.rmtree(stage, ignore_errors=True)
            await self._undo(intent)
            if isinstance(exc, FedstreamError):
                raise Unavailable(
                    f"moving {name} failed, it runs here again: {exc.message}", query=name
                ) from exc
            raise
        try:
            async with asyncio.timeout(INSTALL_TIMEOUT_S):
                install = {"move": intent.id, **sealed.install(), "holds": holds, "pre": pre_sealed}
                reply = await fed.router.call(target, Raw("move_install", install))
        except (FedstreamError, OSError, TimeoutError) as exc:
            reply = await self._after_lost_install(intent, exc)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        pause_s = self.clock() - started
        steps["install_s"] = pause_s - sum(steps.values())
        there = reply.get("steps")  # the target's own account of the install
        if isinstance(there, dict):
            for key in ("unpack_s", "land_s", "start_s"):
                if isinstance(there.get(key), int | float):
                    steps[f"target_{key}"] = float(there[key])
        await self._commit(intent)
        log.info(
            "fragment %s moved to %s (pause %.2f s: %s)",
            name,
            target.hex()[:12],
            pause_s,
            ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in steps.items()),
        )
        return {
            "fragment": name,
            "to": target.hex(),
            "pause_s": round(pause_s, 3),
            "bytes": sealed.tar.size,
            "precopy_bytes": pre.tar.size,
            "precopy_s": round(precopy_s, 3),
            "resume_s": reply.get("resume_s"),
            "steps": {k: round(v, 3) for k, v in steps.items()},  # the pause, step by step
            "epoch": intent.epoch,
        }

    async def _after_lost_install(self, intent: Intent, exc: Exception) -> dict[str, Any]:
        """The install request failed or its reply was lost: the target alone knows whether
        it installed. Ask it; undo if it did not; if it cannot say, stay in doubt (the
        fragment stays stopped here) and keep asking in the background."""
        message = exc.message if isinstance(exc, FedstreamError) else str(exc) or type(exc).__name__
        log.warning("install of %s at the target failed (%s); asking it", intent.fragment, message)
        decision = await self._resolve(intent, attempts=RESOLVE_ATTEMPTS)
        if decision == "installed":
            return {}
        name = intent.fragment
        if decision == "aborted":
            await self._undo(intent)
            raise Unavailable(f"moving {name} failed, it runs here again: {message}", query=name)
        self._watch(intent)
        if intent.lane and self.site.engine is not None:
            # stopped here until the target answers: out of the lane, which goes on without
            # it (its other members do not wait on the target)
            await self.site.engine.release_member(name, moved=True)
        raise Unavailable(
            f"moving {name}: the target did not answer whether it installed the fragment; "
            "it stays stopped here until the target answers",
            query=name,
        )

    async def _resolve(self, intent: Intent, *, attempts: int | None) -> str | None:
        """The target's final word on the move (installed or aborted); None when it did not
        answer ``attempts`` times (None: ask until it does)."""
        target = bytes.fromhex(intent.target)
        tried = 0
        while attempts is None or tried < attempts:
            tried += 1
            try:
                async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                    reply = await self.fed.router.call(target, resolve_request(intent))
                decision = reply.get("decision")
                if decision in ("installed", "aborted"):
                    return str(decision)
            except (FedstreamError, OSError, TimeoutError) as exc:
                log.info("move %s of %s not resolved yet: %s", intent.id[:8], intent.fragment, exc)
            await self.clock.sleep(RESOLVE_RETRY_S)
        return None

    async def _tell_target(self, intent: Intent) -> None:
        """Ask the target to resolve a move it cannot have installed: it forgets what it
        received and frees its move lock (best effort; it drops an idle move anyway)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                await self.fed.router.call(bytes.fromhex(intent.target), resolve_request(intent))

    async def run(self) -> None:
        """Resolve the moves in doubt, each in its own task of this task group, until
        cancelled (the peer's task group runs this; a move found in doubt before it started
        is resolved from here)."""
        async with asyncio.TaskGroup() as tg:
            self._resolvers = tg
            try:
                for intent in list(self.in_doubt.values()):
                    tg.create_task(self._settle(intent), name=intent.fragment)
                await asyncio.Event().wait()
            finally:
                self._resolvers = None

    def _watch(self, intent: Intent) -> None:
        """Resolve an in-doubt move in the background, then commit or undo it."""
        if intent.id in self.in_doubt:
            return
        self.in_doubt[intent.id] = intent
        if self._resolvers is not None:
            self._resolvers.create_task(self._settle(intent), name=intent.fragment)

    async def _settle(self, intent: Intent) -> None:
        try:
            decision = await self._resolve(intent, attempts=None)
            async with self.lock:
                if decision == "installed":
                    await self._commit(intent)
                else:
                    await self._undo(intent)
        except Exception:
            log.exception("settling the move of %s failed", intent.fragment)
        finally:
            self.in_doubt.pop(intent.id, None)

    async def recover(self) -> None:
        """Finish the moves this peer's last run left unfinished: one whose install was
        never sent is undone (the fragment runs here again); one in doubt is resolved with
        the target in the background."""
        for intent in await asyncio.to_thread(self.journal.intents):
            if intent.phase == "stopping":
                log.warning("move of %s was cut short; it runs here again", intent.fragment)
                await self._undo(intent)
            else:
                log.warning("move of %s was in doubt; asking its target", intent.fragment)
                self._watch(intent)

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

    async def _send_chunks(self, target: bytes, tar_path: Path, *, part: str = "final") -> None:
        router = self.fed.router
        move_id = tar_path.parent.name.removeprefix("out-")
        with tar_path.open("rb") as f:
            while block := await asyncio.to_thread(f.read, CHUNK_BYTES):
                chunk = {"move": move_id, "data": block, "part": part}
                await router.call(target, Raw("move_chunk", chunk))

    async def _undo(self, intent: Intent) -> None:
        """The target did not install the fragment: run it here again (also after a
        restart, when only the journal says what the move had done)."""
        site, fed = self.site, self.fed
        name, target = intent.fragment, bytes.fromhex(intent.target)
        log.warning("moving %s to %s failed; resuming it here", name, intent.target[:12])
        await self._tell_target(intent)
        for stream in intent.replica_inputs:
            # the host mirrors to us again from what we hold (idempotent if it never stopped)
            try:
                if stream in intent.detached:
                    host = bytes.fromhex(intent.detached[stream][0])
                else:
                    host = await fed.hosting.host_of(stream, fresh=True)
                acked = site.spools.get(stream).latest
                await fed.router.call(host, StartMirror(stream, fed.node_id, acked))
            except (FedstreamError, OSError, KeyError) as exc:
                log.error("mirror of %s to this peer not restored: %s", stream, exc)
        for stream in intent.hosted_inputs:  # the mirror readers this move made
            with contextlib.suppress(KeyError):
                await fed.mirrors.detach(stream, target)
        for stream in intent.outputs:
            with contextlib.suppress(KeyError):
                fed.mirrors.resume_stream(stream)
        for stream in intent.replica_inputs:
            site.thaw(stream)
        if intent.lane and site.engine is not None:  # the member goes on where it was held
            await site.engine.release_member(name, moved=False)
        await site.resume_query(name)
        await asyncio.to_thread(self.journal.drop_intent, intent.id)

    async def _commit(self, intent: Intent) -> None:
        """The target installed and runs the fragment: send it what we held back, let go."""
        site, fed = self.site, self.fed
        name, target = intent.fragment, bytes.fromhex(intent.target)
        for stream, (host_hex, acked) in intent.detached.items():
            host = bytes.fromhex(host_hex)
            if host == target:
                continue  # the target hosts it: the fragment reads the original there
            try:
                await fed.router.call(host, StartMirror(stream, target, acked))
            except FedstreamError as exc:
                log.error("host of %s did not start mirroring to the new site: %s", stream, exc)
        for stream in intent.hosted_inputs:
            fed.mirrors.start(stream, target)
            with contextlib.suppress(Exception):
                await fed.hosting.renew(stream)
        for stream in intent.outputs:
            try:
                await fed.hosting.hand_over(stream, target, HANDOVER_S)
            except FedstreamError as exc:  # the target claims it anyway once our lease ends
                log.error("handing %s over to the new site: %s", stream, exc)
        if intent.lane and site.engine is not None:  # the lane goes on without it
            await site.engine.release_member(name, moved=True)
        await asyncio.to_thread(self._release, intent)
        await asyncio.to_thread(site.catalog.add_moved, name, intent.target, self.wall())
        for stream in intent.replica_inputs:
            site.thaw(stream)
        await asyncio.to_thread(self.journal.drop_intent, intent.id)

    def _release(self, intent: Intent) -> None:
        site = self.site
        catalog, spools = site.catalog, site.spools
        assert site.engine is not None
        for stream in intent.kept:
            with contextlib.suppress(KeyError):
                spool = spools.get(stream)
                for reader in intent.readers.get(stream, []):
                    spool.unregister_reader(reader)
        for stream in intent.replica_inputs + intent.outputs:
            catalog.remove_stream(stream)
            with contextlib.suppress(KeyError):
                spools.drop(stream)
        with contextlib.suppress(Exception):
            catalog.remove_query(intent.fragment)
        shutil.rmtree(
            site.engine.checkpoint_dir(intent.fragment, intent.incarnation), ignore_errors=True
        )
