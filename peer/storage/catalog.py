"""The peer's local catalog: schemas, streams and queries, kept in SQLite in the data directory.

This is the single-peer catalog: every object it holds is served by this peer. The overlay's
DHT catalog (signed, versioned records) builds on the same object model. Writes are small and
rare (control plane), and each one is a committed SQLite transaction, so a peer restarted on
its data directory finds every object it acknowledged.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peer.errors import AlreadyExists, NotFound
from peer.model.query import Query, parse_query, query_to_dict
from peer.model.schema import Schema, parse_schema

_TABLES = """
CREATE TABLE IF NOT EXISTS schemas (name TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS streams (name TEXT PRIMARY KEY, schema TEXT NOT NULL,
                                    derived_from TEXT);
CREATE TABLE IF NOT EXISTS replicas (stream TEXT PRIMARY KEY, source TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS moved (fragment TEXT PRIMARY KEY, site TEXT NOT NULL,
                                  at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS queries (name TEXT PRIMARY KEY, body TEXT NOT NULL,
                                    status TEXT NOT NULL, incarnation TEXT NOT NULL,
                                    placement TEXT);
"""


@dataclass(frozen=True)
class StreamEntry:
    name: str
    schema: Schema
    derived_from: str | None  # the query whose result it is, if any


@dataclass(frozen=True)
class QueryEntry:
    query: Query
    status: str
    incarnation: str
    placement: str | None  # where the engine first ran it ("lane" or "own"); kept for resumes


class LocalCatalog:
    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_TABLES)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(queries)")}
        if "placement" not in columns:  # a data directory from before placements were kept
            self._db.execute("ALTER TABLE queries ADD COLUMN placement TEXT")
        self._lock = threading.Lock()
        # A stream never changes once created, and every push looks its stream up: keep the
        # entries found, so the hot path does no SQLite query and no schema parse.
        self._streams: dict[str, StreamEntry] = {}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # schemas
    def add_schema(self, schema: Schema) -> None:
        existing = self.find_schema(schema.name)
        if existing is not None:
            if existing == schema:
                return  # idempotent re-creation of the same schema
            raise AlreadyExists(
                f"schema {schema.name} already exists with other fields", schema=schema.name
            )
        self._write(
            "INSERT INTO schemas VALUES (?, ?)", (schema.name, json.dumps(schema.to_dict()))
        )

    def find_schema(self, name: str) -> Schema | None:
        rows = self._rows("SELECT body FROM schemas WHERE name = ?", (name,))
        return parse_schema(json.loads(rows[0][0])) if rows else None

    def schema(self, name: str) -> Schema:
        schema = self.find_schema(name)
        if schema is None:
            known = ", ".join(self.schema_names()) or "none"
            raise NotFound(f"unknown schema {name} (known: {known})", schema=name)
        return schema

    def schema_names(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM schemas ORDER BY name")]

    # streams
    def check_stream(self, name: str, schema: Schema) -> bool:
        """Whether stream ``name`` of ``schema`` can be added (False: it exists already, the
        same); raise, writing nothing, if the stream or the schema's name holds other fields."""
        existing = self.find_stream(name)
        if existing is not None:
            if existing.schema.fields == schema.fields:
                return False
            raise AlreadyExists(
                f"stream {name} already exists with schema {existing.schema.name}", stream=name
            )
        named = self.find_schema(schema.name)
        if named is not None and named.fields != schema.fields:
            raise AlreadyExists(
                f"stream {name} needs schema {schema.name}, but a schema of that name exists "
                "with other fields",
                stream=name,
                schema=schema.name,
            )
        return True

    def add_stream(self, name: str, schema: Schema, derived_from: str | None = None) -> None:
        if not self.check_stream(name, schema):
            return
        self.add_schema(schema)
        self._write("INSERT INTO streams VALUES (?, ?, ?)", (name, schema.name, derived_from))

    def find_stream(self, name: str) -> StreamEntry | None:
        entry = self._streams.get(name)
        if entry is not None:
            return entry
        rows = self._rows("SELECT schema, derived_from FROM streams WHERE name = ?", (name,))
        if not rows:
            return None
        entry = self._streams[name] = StreamEntry(name, self.schema(rows[0][0]), rows[0][1])
        return entry

    def stream(self, name: str) -> StreamEntry:
        entry = self.find_stream(name)
        if entry is None:
            known = ", ".join(self.stream_names()) or "none"
            raise NotFound(f"unknown stream {name} (known: {known})", stream=name)
        return entry

    def stream_names(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM streams ORDER BY name")]

    def stream_schemas(self) -> dict[str, Schema]:
        return {name: self.stream(name).schema for name in self.stream_names()}

    # queries
    def add_query(self, query: Query, incarnation: str) -> None:
        if self.find_query(query.name) is not None:
            raise AlreadyExists(
                f"query {query.name} already exists; delete it first", query=query.name
            )
        self._write(
            "INSERT INTO queries VALUES (?, ?, 'SETUP', ?, NULL)",
            (query.name, json.dumps(query_to_dict(query)), incarnation),
        )

    def find_query(self, name: str) -> QueryEntry | None:
        rows = self._rows(
            "SELECT body, status, incarnation, placement FROM queries WHERE name = ?", (name,)
        )
        if not rows:
            return None
        body, status, incarnation, placement = rows[0]
        return QueryEntry(parse_query(json.loads(body)), status, incarnation, placement)

    def query(self, name: str) -> QueryEntry:
        entry = self.find_query(name)
        if entry is None:
            known = ", ".join(self.query_names()) or "none"
            raise NotFound(f"unknown query {name} (known: {known})", query=name)
        return entry

    def query_names(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM queries ORDER BY name")]

    def set_placement(self, name: str, placement: str) -> None:
        self._write("UPDATE queries SET placement = ? WHERE name = ?", (placement, name))

    def set_status(self, name: str, status: str) -> None:
        self._write("UPDATE queries SET status = ? WHERE name = ?", (status, name))

    def remove_query(self, name: str) -> None:
        self._write("DELETE FROM queries WHERE name = ?", (name,))

    # replicas: local copies of streams hosted elsewhere, which local fragments read
    def add_replica(self, stream: str, source: str) -> None:
        self._write("INSERT OR REPLACE INTO replicas VALUES (?, ?)", (stream, source))

    def replicas(self) -> dict[str, str]:
        return dict(self._rows("SELECT stream, source FROM replicas"))

    def remove_replica(self, stream: str) -> None:
        """No local fragment reads ``stream`` from its host any more (the stream stays)."""
        self._write("DELETE FROM replicas WHERE stream = ?", (stream,))

    # fragments moved away to another peer (issue 5): requests for them are forwarded there
    def add_moved(self, fragment: str, site: str, at: float) -> None:
        self._write("INSERT OR REPLACE INTO moved VALUES (?, ?, ?)", (fragment, site, at))

    def moved(self) -> dict[str, str]:
        return dict(self._rows("SELECT fragment, site FROM moved"))

    def forget_moved(self, fragment: str) -> None:
        self._write("DELETE FROM moved WHERE fragment = ?", (fragment,))

    def remove_stream(self, name: str) -> None:
        """Forget a stream (its spool is the caller's to drop)."""
        self._write("DELETE FROM replicas WHERE stream = ?", (name,))
        self._write("DELETE FROM streams WHERE name = ?", (name,))
        self._streams.pop(name, None)
