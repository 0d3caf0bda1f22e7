"""Queries that span peers: plan the fragments, install them, wire them, and move them
through SETUP, RUNNING, STOPPED and DELETED together.

Theory of operation
-------------------
Any peer can coordinate any query; it keeps nothing of its own. ``create`` checks the whole
query against the schemas of its input streams (catalog records), splits it into fragments
(:mod:`peer.model.fragments`), then in two phases:

1. *install*: each fragment's site creates replica spools for the inputs it reads from other
   peers, and the fragment itself as a local query (SETUP), hosting its output streams (their
   ``stream:`` and ``place:`` records say so);
2. *wire*: the host of every such input starts a mirror to the site (:mod:`peer.federation.mirror`).

If any step fails, ``create`` undoes what it did: every fragment installed so far is deleted
at its site (which drops its result streams, with tombstones, and its replicas, asking their
hosts to stop mirroring), so a failed query leaves nothing behind and its name can be used
again.

Then it publishes ``query:NAME``: a pointer to the definition and the fragment list (stored by
content hash, fetched over links). ``set_status`` reads that record and sends the new status
to every fragment's site; DELETED also drops the fragments' spools and checkpoints (a site
that drops a replica no query of its own reads asks the stream's host to stop mirroring it
there), and leaves a tombstone record so the name can be used again.

A fragment may have moved since (:mod:`peer.move`): the record keeps the site it was planned
on, which the query's owner alone could rewrite, but the ``place:`` lease of the fragment's
result streams names the peer that runs it now. So status changes and lookups go to that
peer; the planned site, which forwards what reaches it, hears of a deletion too, so that it
forgets where the fragment went.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from overlay.membership import MemberInfo, rank, stream_target
from overlay.node import Overlay
from peer.errors import AlreadyExists, Conflict, InvalidInput, NotFound, QueryError
from peer.federation.hosting import Hosting
from peer.federation.records import CatalogRecords
from peer.federation.replicas import UNREPLICATED, ReplicaPlacement
from peer.federation.router import Router
from peer.model.fragments import Fragment, fragment_query
from peer.model.plan import CheckedQuery, check_query
from peer.model.query import Query, query_to_dict
from peer.protocol.link import FragmentInput, FragmentStatus, InstallFragment, Lookup, StartMirror
from peer.protocol.replies import CreateQueryReply, SetQueryStatusReply
from peer.replication.names import checkpoint_stream

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(
        self,
        overlay: Overlay,
        records: CatalogRecords,
        hosting: Hosting,
        router: Router,
        replicas: ReplicaPlacement = UNREPLICATED,
        *,
        standby: bool = False,
    ) -> None:
        self.overlay = overlay
        self.standby = standby  # a query that does not say gets warm standbys (peer join --standby)
        self.records = records
        self.hosting = hosting
        self.router = router
        # with a control plane: the primary of a replicated stream, where a fragment reading
        # it is placed so that it can fail over with it
        self.replicas = replicas

    async def primary_of(self, stream: str) -> str | None:
        """The primary of a replicated stream (node id, hex), None for a plain one."""
        primary = await self.replicas.primary_of(stream, True)
        return None if primary is None else primary.hex()

    # placement
    def _engines(self, members: list[MemberInfo]) -> list[MemberInfo]:
        engines = [m for m in members if m.engine]
        return engines or members

    def default_site(self, stream: str) -> str:
        """The submitting participant's peer responsible for ``stream`` (any engine peer if
        the participant has none)."""
        live = self.overlay.live_members()
        mine = [m for m in live if m.participant == self.overlay.identity.participant]
        candidates = [m for m in mine if m.engine] or self._engines(live)
        return rank(stream_target(stream), candidates)[0].node_id.hex()

    def resolve_site(self, node: str, stream: str) -> str:
        live = self.overlay.live_members()
        of_participant = [m for m in live if m.participant == node]
        if of_participant:
            return rank(stream_target(stream), self._engines(of_participant))[0].node_id.hex()
        lowered = node.lower()
        if len(lowered) >= 6 and all(c in "0123456789abcdef" for c in lowered):
            matches = [m for m in live if m.node_id.hex().startswith(lowered)]
            if len(matches) == 1:
                return matches[0].node_id.hex()
        for m in live:
            if node in (f"{m.api[0]}:{m.api[1]}", f"{m.overlay[0]}:{m.overlay[1]}"):
                return m.node_id.hex()
        raise QueryError(
            f"node {node!r} names no live peer (a participant name, a node id prefix of at "
            "least 6 hex digits, or a peer's HOST:PORT)",
            node=node,
        )

    # create
    async def check(self, query: Query) -> CheckedQuery:
        """The query checked against its input streams' schemas (catalog records), once."""
        pointer = await self.records.query_pointer(query.name)
        if pointer is not None and not pointer.get("deleted"):
            raise Conflict(
                f"query {query.name} already exists in the federation; delete it first",
                query=query.name,
            )
        produced = {s for box in query.boxes for s in box.outputs}
        inputs = [s for box in query.boxes for s in box.inputs if s not in produced]
        schemas = {s: await self.records.stream_schema(s) for s in dict.fromkeys(inputs)}
        checked = await asyncio.to_thread(check_query, query, schemas)  # CPU: not on the loop
        for stream in checked.outputs:
            if await self.records.stream_or_none(stream) is not None:
                raise AlreadyExists(
                    f"query {query.name}: its result stream {stream} already exists",
                    query=query.name,
                    stream=stream,
                )
        return checked

    async def create(self, query: Query) -> CreateQueryReply:
        if query.standby is None and self.standby:
            query = replace(query, standby=True)
        checked = await self.check(query)
        primaries = {s: await self.primary_of(s) for s in checked.inputs}

        def default(stream: str) -> str:
            return primaries.get(stream) or self.default_site(stream)

        fragments = fragment_query(query, default=default, resolve=self.resolve_site)
        made_by = {s: f.site for f in fragments for s in f.outputs}
        hosts = {s: (await self.hosting.host_of(s)).hex() for s in checked.inputs}

        def host(stream: str) -> str:
            return made_by.get(stream) or hosts[stream]

        installed: list[Fragment] = []
        try:
            for fragment in fragments:  # phase 1: install
                message = InstallFragment(
                    query.name,
                    fragment.name,
                    fragment.as_query(),
                    {s: FragmentInput(checked.stream_schemas[s], host(s)) for s in fragment.inputs},
                )
                await self.router.ask(bytes.fromhex(fragment.site), message)
                installed.append(fragment)
            for fragment in fragments:  # phase 2: wire
                for stream in fragment.inputs:
                    if host(stream) != fragment.site:
                        wire = StartMirror(stream, bytes.fromhex(fragment.site))
                        await self.router.ask(bytes.fromhex(host(stream)), wire)
            await self.records.publish_query(
                query.name,
                _plan(query, fragments, host),
                {"inputs": list(checked.inputs), "outputs": list(checked.outputs)},
            )
        except BaseException:
            await self._undo(query.name, installed)
            raise
        return CreateQueryReply(
            query.name,
            "SETUP",
            extra={
                "inputs": list(checked.inputs),
                "outputs": list(checked.outputs),
                "fragments": [{"name": f.name, "site": f.site} for f in fragments],
            },
        )

    async def _undo(self, name: str, installed: list[Fragment]) -> None:
        """Delete the fragments a failed ``create`` installed, downstream first."""
        for fragment in reversed(installed):
            try:
                await self.router.ask(
                    bytes.fromhex(fragment.site), FragmentStatus(fragment.name, "DELETED")
                )
            except Exception as exc:  # the site is gone: it has nothing left to undo
                log.warning("query %s: fragment %s not undone: %s", name, fragment.name, exc)

    # status
    async def plan(self, name: str) -> dict[str, Any]:
        found = await self.records.query_definition(name)
        if found is None or found[0].get("deleted"):
            raise NotFound(f"unknown query {name}", query=name)
        return found[1]

    async def site_now(self, fragment: dict[str, Any]) -> str:
        """The node id (hex) of the peer running ``fragment`` now: the primary of its
        replicated streams, else the host of its first result stream (a fragment's
        results live where it runs)."""
        planned = str(fragment["site"])
        outputs = fragment.get("outputs") or []
        if not outputs:
            return planned
        # a replicated fragment runs where the primary of its streams (its checkpoints') is
        primary = await self.primary_of(checkpoint_stream(str(fragment["name"])))
        if primary is not None:
            return primary
        return (await self.hosting.host_now(outputs[0], bytes.fromhex(planned))).hex()

    async def set_status(self, name: str, status: str) -> SetQueryStatusReply:
        plan = await self.plan(name)
        fragments = plan.get("fragments", [])
        if not isinstance(fragments, list):
            raise InvalidInput(f"query {name}: malformed plan")
        sites = [await self.site_now(f) for f in fragments]  # where they run now
        # downstream first: a fragment stops before the ones feeding it
        for fragment, site in reversed(list(zip(fragments, sites, strict=True))):
            message = FragmentStatus(fragment["name"], status)
            await self.router.ask(bytes.fromhex(site), message)
            if status == "DELETED" and site != fragment["site"]:
                try:  # the planned site forgets where it went (the fragment is gone already)
                    await self.router.ask(bytes.fromhex(fragment["site"]), message)
                except Exception as exc:
                    log.info("planned site of %s not told of its deletion: %s", name, exc)
        if status == "DELETED":  # each site has stopped the mirrors into what it dropped
            await self.records.publish(f"query:{name}", {"deleted": True})
        return SetQueryStatusReply(name, status, extra={"fragments": len(fragments)})

    async def describe(self, name: str) -> list[dict[str, Any]]:
        plan = await self.plan(name)
        out = []
        for fragment in plan.get("fragments", []):
            site = await self.site_now(fragment)
            info: dict[str, Any] = {"name": fragment["name"], "site": site}
            if site != fragment["site"]:
                info["planned_site"] = fragment["site"]
            try:
                reply = await self.router.ask(bytes.fromhex(site), Lookup(fragment["name"]))
                info["status"] = reply.get("status")
            except Exception as exc:
                info["status"] = None
                info["error"] = str(exc)
            out.append(info)
        return out


def _plan(query: Query, fragments: list[Fragment], host: Callable[[str], str]) -> dict[str, Any]:
    outputs = [s for f in fragments for s in f.outputs]
    return {
        "query": query_to_dict(query),
        "outputs": outputs,
        "fragments": [
            {
                "name": f.name,
                "site": f.site,
                "boxes": [b.name for b in f.boxes],
                "inputs": list(f.inputs),
                "outputs": list(f.outputs),
                "remote_inputs": {s: host(s) for s in f.inputs if host(s) != f.site},
            }
            for f in fragments
        ],
    }


def plan_json(plan: dict[str, Any]) -> str:
    return json.dumps(plan, sort_keys=True)
