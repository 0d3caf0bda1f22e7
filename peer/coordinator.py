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
2. *wire*: the host of every such input starts a mirror to the site (:mod:`peer.mirror`).

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

import json
import logging
from typing import TYPE_CHECKING, Any

from overlay.membership import MemberInfo, rank, stream_target
from peer.errors import AlreadyExists, Conflict, InvalidInput, NotFound, QueryError
from peer.model.fragments import Fragment, fragment_query
from peer.model.plan import check_query
from peer.model.query import Query, query_to_dict
from peer.model.schema import parse_schema

if TYPE_CHECKING:
    from peer.federation import Federation

__all__ = ["Coordinator"]

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(self, fed: Federation) -> None:
        self.fed = fed

    # placement
    def _engines(self, members: list[MemberInfo]) -> list[MemberInfo]:
        engines = [m for m in members if m.engine]
        return engines or members

    def default_site(self, stream: str) -> str:
        """The submitting participant's peer responsible for ``stream`` (any engine peer if
        the participant has none)."""
        live = self.fed.overlay.live_members()
        mine = [m for m in live if m.participant == self.fed.overlay.identity.participant]
        candidates = [m for m in mine if m.engine] or self._engines(live)
        return rank(stream_target(stream), candidates)[0].node_id.hex()

    def resolve_site(self, node: str, stream: str) -> str:
        live = self.fed.overlay.live_members()
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
    async def create(self, query: Query) -> dict[str, Any]:
        fed = self.fed
        pointer = await fed.query_pointer(query.name)
        if pointer is not None and not pointer.get("deleted"):
            raise Conflict(
                f"query {query.name} already exists in the federation; delete it first",
                query=query.name,
            )
        produced = {s for box in query.boxes for s in box.outputs}
        inputs = [s for box in query.boxes for s in box.inputs if s not in produced]
        schemas = {}
        for stream in dict.fromkeys(inputs):
            record = await fed.stream_record(stream)
            schemas[stream] = parse_schema(record["schema"])
        checked = check_query(query, schemas)
        for stream in checked.outputs:
            existing = await fed.stream_record_or_none(stream)
            if existing is not None and not existing.get("deleted"):
                raise AlreadyExists(
                    f"query {query.name}: its result stream {stream} already exists",
                    query=query.name,
                    stream=stream,
                )
        fragments = fragment_query(query, default=self.default_site, resolve=self.resolve_site)
        made_by = {s: f.site for f in fragments for s in f.outputs}
        hosts = {s: (await fed.host_of(s)).hex() for s in schemas}

        def host(stream: str) -> str:
            return made_by.get(stream) or hosts[stream]

        for fragment in fragments:  # phase 1: install
            frame = {
                "op": "install_fragment",
                "query": query.name,
                "fragment": fragment.name,
                "definition": query_to_dict(fragment.as_query()),
                "inputs": {
                    s: {"schema": checked.stream_schemas[s].to_dict(), "host": host(s)}
                    for s in fragment.inputs
                },
            }
            await fed.call_site(bytes.fromhex(fragment.site), frame)
        for fragment in fragments:  # phase 2: wire
            for stream in fragment.inputs:
                if host(stream) != fragment.site:
                    await fed.call_site(
                        bytes.fromhex(host(stream)),
                        {"op": "mirror", "stream": stream, "to": fragment.site},
                    )
        plan = _plan(query, fragments, host)
        await fed.publish_query(
            query.name,
            plan,
            {"inputs": list(checked.inputs), "outputs": list(checked.outputs)},
        )
        return {
            "query": query.name,
            "status": "SETUP",
            "inputs": list(checked.inputs),
            "outputs": list(checked.outputs),
            "fragments": [{"name": f.name, "site": f.site} for f in fragments],
        }

    # status
    async def plan(self, name: str) -> dict[str, Any]:
        found = await self.fed.query_definition(name)
        if found is None or found[0].get("deleted"):
            raise NotFound(f"unknown query {name}", query=name)
        return found[1]

    async def site_now(self, fragment: dict[str, Any]) -> str:
        """The node id (hex) of the peer running ``fragment`` now: the host of its first
        result stream (a fragment's results live where it runs)."""
        planned = str(fragment["site"])
        outputs = fragment.get("outputs") or []
        if not outputs:
            return planned
        return (await self.fed.host_now(outputs[0], bytes.fromhex(planned))).hex()

    async def set_status(self, name: str, status: str) -> dict[str, Any]:
        plan = await self.plan(name)
        fragments = plan.get("fragments", [])
        if not isinstance(fragments, list):
            raise InvalidInput(f"query {name}: malformed plan")
        sites = [await self.site_now(f) for f in fragments]  # where they run now
        # downstream first: a fragment stops before the ones feeding it
        for fragment, site in reversed(list(zip(fragments, sites, strict=True))):
            frame = {"op": "fragment_status", "fragment": fragment["name"], "status": status}
            await self.fed.call_site(bytes.fromhex(site), frame)
            if status == "DELETED" and site != fragment["site"]:
                try:  # the planned site forgets where it went (the fragment is gone already)
                    await self.fed.call_site(bytes.fromhex(fragment["site"]), frame)
                except Exception as exc:
                    log.info("planned site of %s not told of its deletion: %s", name, exc)
        if status == "DELETED":  # each site has stopped the mirrors into what it dropped
            await self.fed.publish(f"query:{name}", {"deleted": True})
        return {"query": name, "status": status, "fragments": len(fragments)}

    async def describe(self, name: str) -> list[dict[str, Any]]:
        plan = await self.plan(name)
        out = []
        for fragment in plan.get("fragments", []):
            site = await self.site_now(fragment)
            info: dict[str, Any] = {"name": fragment["name"], "site": site}
            if site != fragment["site"]:
                info["planned_site"] = fragment["site"]
            try:
                reply = await self.fed.call_site(
                    bytes.fromhex(site), {"op": "lookup", "name": fragment["name"]}
                )
                info["status"] = reply.get("status")
            except Exception as exc:
                info["status"] = None
                info["error"] = str(exc)
            out.append(info)
        return out


def _plan(query: Query, fragments: list[Fragment], host: Any) -> dict[str, Any]:
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
