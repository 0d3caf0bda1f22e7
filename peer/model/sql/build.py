"""What compiling a query accumulates: its boxes in JSON form, and the small shared helpers
(scopes of column names, interval literals)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from peer.model.sql.dialect import refuse
from peer.model.sql.relation import Relation

_UNITS = {
    "MILLISECOND": 0.001, "MILLISECONDS": 0.001, "SECOND": 1.0, "SECONDS": 1.0,
    "MINUTE": 60.0, "MINUTES": 60.0, "HOUR": 3600.0, "HOURS": 3600.0,
    "DAY": 86400.0, "DAYS": 86400.0,
}  # fmt: skip

# A scope resolves a column reference (qualifier or "", name; both lower case) to an
# expression over the stream at hand.
Scope = Mapping[tuple[str, str], exp.Expr]


@dataclass
class Boxes:
    """The boxes of one query as they are made (JSON form), and the warnings compiling it
    raised. Every box writes a stream of its own, ``<query>.<box>``. A box equal to one made
    before (type, inputs, parameters, node) is not made twice: its stream is read again, as
    Flink reuses a common sub-plan (NEXMark q5 computes its per-window counts twice)."""

    query: str
    boxes: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, kind: str, inputs: list[str], params: dict[str, str], node: str | None) -> str:
        for made in self.boxes:
            if (made["type"], made["inputs"], made["params"], made.get("node")) == (
                kind,
                inputs,
                params,
                node,
            ):
                return str(made["outputs"][0])
        name = f"{kind}{len(self.boxes)}"
        output = f"{self.query}.{name}"
        box: dict[str, Any] = {
            "name": name, "type": kind, "inputs": inputs, "outputs": [output], "params": params,
        }  # fmt: skip
        if node is not None:
            box["node"] = node
        self.boxes.append(box)
        return output


def scope_of(relation: Relation, alias: str) -> dict[tuple[str, str], exp.Expr]:
    """Every column of ``relation``, bare and qualified by ``alias``."""
    scope: dict[tuple[str, str], exp.Expr] = {}
    for c in relation.columns:
        ref = exp.column(c.name, quoted=True)
        scope[("", c.name.lower())] = ref
        if alias:
            scope[(alias.lower(), c.name.lower())] = ref
    return scope


def interval_seconds(text: str, node: exp.Expr) -> float:
    """An ``INTERVAL 'n' UNIT`` literal in seconds (``text``: the script, for errors)."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        raise refuse(text, node, "expected an interval such as INTERVAL '10' SECOND")
    unit = str(node.unit.name if node.unit is not None else "SECOND").upper()
    try:
        amount = float(node.this.this)
    except ValueError:
        amount = float("nan")
    if unit not in _UNITS or not (0 < amount < 1e9):
        raise refuse(
            text,
            node,
            f"interval {node.sql()} is not a positive number of "
            "MILLISECOND, SECOND, MINUTE, HOUR or DAY",
        )
    return amount * _UNITS[unit]
