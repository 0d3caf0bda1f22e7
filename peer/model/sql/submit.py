"""Submitting a compiled SQL script as the requests a peer already takes (create_schema,
create_stream, create_query, set_query_status), made in script order: by the peer that
compiled a ``create_sql`` request (peer.server.sql_scripts), or by a caller holding a
compiled script (tests, benchmarks).

A script's queries may be several fedstream queries each (stages, peer.model.sql.script),
and a stage reads the stream the stage before it writes, so stages are created and started
in order. A source stream the script declares and the peer already has, with the same
schema, is used as it is (create_schema and create_stream are idempotent); any refusal
stops the submission there and raises (what was created before stays, as the Borealis
document path does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from peer.model.query import query_to_dict

if TYPE_CHECKING:
    from peer.model.sql.script import Script

__all__ = ["ScriptClient", "ScriptSubmitted", "submit_script"]


class ScriptClient(Protocol):
    """The requests a script is made of."""

    async def create_schema(self, schema: Any) -> object: ...

    async def create_stream(
        self, name: str, schema: str, *, replicas: int | None = None
    ) -> object: ...

    async def create_query(self, query: Any) -> object: ...

    async def set_query_status(self, name: str, status: str) -> object: ...


@dataclass(frozen=True)
class ScriptSubmitted:
    """What submitting a script did: the source streams it declared (created, or found
    identical), its queries (stages in order), whether they were started, and the compiler's
    warnings (unbounded state, ignored options)."""

    streams: tuple[str, ...]
    queries: tuple[str, ...]
    started: bool
    warnings: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "streams": list(self.streams),
            "queries": list(self.queries),
            "started": self.started,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ScriptSubmitted:
        return cls(
            tuple(data["streams"]),
            tuple(data["queries"]),
            bool(data["started"]),
            tuple(data["warnings"]),
        )


async def submit_script(client: ScriptClient, script: Script, *, start: bool) -> ScriptSubmitted:
    """Create the script's schemas and streams, then its queries (started when ``start``;
    a later stage reads an earlier one, so each is started before the next is made)."""
    for stream in script.streams:
        await client.create_schema(stream.schema.to_dict())
        await client.create_stream(stream.name, stream.schema.name, replicas=stream.replicas)
    names: list[str] = []
    for query in script.queries:
        await client.create_query(query_to_dict(query))
        if start:
            await client.set_query_status(query.name, "RUNNING")
        names.append(query.name)
    streams = tuple(stream.name for stream in script.streams)
    return ScriptSubmitted(streams, tuple(names), start, script.warnings)
