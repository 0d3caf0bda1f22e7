"""Streaming SQL (Flink's dialect of window table functions) compiled to fedstream's boxes.

:func:`compile_script` reads a script of ``CREATE STREAM``, ``CREATE VIEW`` and ``INSERT
INTO ... SELECT`` statements and gives the schemas, streams and queries (box graphs, the
same objects the XML and JSON forms give) to create; docs/sql.md says what is accepted and
how each construct becomes boxes. Pure: no Spark, no I/O.
"""

from typing import TYPE_CHECKING, Any

from peer.model.sql.unbounded import unbounded_state

if TYPE_CHECKING:
    from peer.model.sql.script import Script, StreamDecl, compile_script, read_streams

_COMPILER = ("Script", "StreamDecl", "compile_script", "read_streams")

__all__ = ["Script", "StreamDecl", "compile_script", "is_sql", "read_streams", "unbounded_state"]


def is_sql(text: str) -> bool:
    """Whether a query definition's text is SQL rather than XML or JSON."""
    stripped = text.lstrip()
    return bool(stripped) and not stripped.startswith(("<", "{", "["))


def __getattr__(name: str) -> Any:
    """The compiler's names, imported on first use: it loads sqlglot (a third of a second),
    which a peer that is never sent SQL, and every peer process a test starts, need not pay."""
    if name in _COMPILER:
        from peer.model.sql import script

        return getattr(script, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
