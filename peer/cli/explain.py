"""``peer query explain FILE``: what a query file would make, without a peer.

For SQL it prints the streams the script declares, then each query (each stage of one) with
its boxes (type, inputs, outputs, parameters) and its fragments: the pieces placed on one
peer each, and where each would run. Where needs a peer's view of the overlay for most
boxes, so the place is named as the rule the planner follows (peer.model.fragments): the
peer a box's ``node`` names (a SQL ``OPTIONS('node' = ...)`` hint), else the peer that holds
the stream its first input reads. XML and JSON queries are explained the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from peer.model.borealis import is_document, parse_document
from peer.model.fragments import fragment_query
from peer.model.query import Query, parse_query
from peer.model.sql import Script, compile_script, is_sql

__all__ = ["cmd_query_explain", "explain_lines", "load_script"]


def load_script(path: str) -> Script:
    """A query file as a script: SQL compiled, XML/JSON read (their streams are not
    declared in the file, except in a Borealis document)."""
    text = Path(path).read_text()
    if path.endswith(".sql") or is_sql(text):
        return compile_script(text, name=Path(path).stem)
    if text.lstrip().startswith("<") and is_document(text):
        return Script((), parse_document(text).queries, ())
    return Script((), (parse_query(text),), ())


def explain_lines(script: Script) -> list[str]:
    lines: list[str] = []
    for stream in script.streams:
        fields = ", ".join(
            f"{f.name} {f.type}{'' if f.nullable else ' not null'}" for f in stream.schema.fields
        )
        replicas = f" replicas={stream.replicas}" if stream.replicas else ""
        lines.append(f"stream {stream.name} ({fields}){replicas}")
    for query in script.queries:
        lines.extend(_query_lines(query))
    lines.extend(f"warning: {w}" for w in script.warnings)
    return lines


def _query_lines(query: Query) -> list[str]:
    bound = (
        f" availability_bound={query.availability_bound_s:g}s"
        if query.availability_bound_s is not None
        else ""
    )
    lines = [f"query {query.name}{bound}"]
    for box in query.boxes:
        where = f" node={box.node}" if box.node else ""
        lines.append(
            f"  box {box.name} {box.type} {', '.join(box.inputs)} -> "
            f"{', '.join(box.outputs)}{where}"
        )
        lines.extend(f"      {key} = {value}" for key, value in box.params)
    fragments = fragment_query(
        query,
        default=lambda stream: f"the peer holding {stream}",
        resolve=lambda node, _stream: f"peer {node}",
    )
    for fragment in fragments:
        boxes = ", ".join(b.name for b in fragment.boxes)
        lines.append(f"  fragment {fragment.name} [{boxes}] runs on {fragment.site}")
    return lines


async def cmd_query_explain(args: argparse.Namespace) -> int:
    for line in explain_lines(load_script(args.file)):
        print(line)
    return 0
