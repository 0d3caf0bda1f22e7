"""What the SQL compiler knows about a stream while it compiles: its columns, which of them
are event time (with their watermark delay), the window its rows belong to, and whether the
state behind it grows forever.

A :class:`Relation` is the compile-time face of a stream, a source or one a box writes.
Columns keep fedstream's field types; a time column carries the delay of its watermark,
which becomes an aggregate's ``slack``. Rows of a windowed aggregate carry the window they
belong to (:class:`Window`), so that a later ``GROUP BY`` of those window columns can be an
aggregate of its own (NEXMark q5's maximum per window).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from peer.model.schema import Field, Schema


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool = False
    delay_s: float | None = None  # an event-time column: its watermark delay, else None

    @property
    def field(self) -> Field:
        return Field(self.name, self.type, nullable=self.nullable)


@dataclass(frozen=True)
class Window:
    """The window of an aggregate's rows: its length, its slide, and the columns that hold
    its start and end in this relation (None when the query dropped them)."""

    size_s: float
    slide_s: float
    start: str | None
    end: str | None


@dataclass(frozen=True)
class Relation:
    stream: str
    columns: tuple[Column, ...]
    window: Window | None = None
    # why this relation's state grows without bound (an unbounded join), else None
    unbounded: str | None = None

    def find(self, name: str) -> Column | None:
        lowered = name.lower()
        return next((c for c in self.columns if c.name.lower() == lowered), None)

    @property
    def schema(self) -> Schema:
        return Schema(self.stream, tuple(c.field for c in self.columns))

    def time_columns(self) -> list[Column]:
        return [c for c in self.columns if c.delay_s is not None]

    def renamed(self, stream: str) -> Relation:
        return replace(self, stream=stream)


def source(stream: str, schema: Schema, delays: dict[str, float]) -> Relation:
    """A source stream: its timestamp fields are event time, with the declared watermark
    delay (0 when the stream declares none for them)."""
    columns = tuple(
        Column(
            f.name,
            f.type,
            f.nullable,
            delays.get(f.name.lower(), 0.0) if f.type == "timestamp" else None,
        )
        for f in schema.fields
    )
    return Relation(stream, columns)
