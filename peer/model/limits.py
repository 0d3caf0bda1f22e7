"""Budgets on what a request may ask of a peer: pushed batches and query definitions.

A request that is valid in shape can still be expensive: a few kilobytes of compressed Arrow
that inflate to hundreds of megabytes, a query whose thousand expressions take seconds to
check. Each budget here is checked before the work it bounds, and a request over one is
refused with an error naming the limit (its ``details`` carry ``limit`` and the value).
``peer join`` sets them (:class:`peer.node.PeerConfig.limits`); docs/protocol.md, "Content
limits", lists them with their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice

from peer.model.tuples import MAX_PUSH_BYTES

__all__ = ["DEFAULT_LIMITS", "ContentLimits", "definition_size"]


@dataclass(frozen=True)
class ContentLimits:
    # One pushed Arrow body, once decompressed (the frame limit bounds the compressed bytes).
    max_push_bytes: int = MAX_PUSH_BYTES
    # A query definition in any form: XML or JSON text, or a map (measured as its JSON text).
    max_query_bytes: int = 1 << 20
    # Boxes of one query (the model's own ceiling is 1000: peer.model.query.MAX_BOXES).
    max_boxes: int = 1000
    # Inputs, and outputs, of one box.
    max_arrows_per_box: int = 64
    # The parameter text of all boxes of one query together (expressions, predicates, ...);
    # one expression is bounded besides (4 KiB: peer.model.expr.MAX_TEXT). Checking takes
    # about 4 ms per KiB of expressions, in a worker thread.
    max_expression_bytes: int = 128 * 1024

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


DEFAULT_LIMITS = ContentLimits()


def definition_size(value: object, stop_after: int) -> int:
    """About how many bytes ``value`` (a definition sent as a map) takes as JSON text;
    counting stops soon after ``stop_after``, so a huge map costs no more than a small one.
    Iterative: nesting depth costs no stack."""
    size = 0
    pending: list[object] = [value]
    while pending and size <= stop_after:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item.encode("utf-8", "surrogatepass")) + 2
        elif isinstance(item, bytes | bytearray | memoryview):
            size += len(item) + 2
        elif isinstance(item, Mapping):
            size += 2 + 2 * len(item)  # braces, and a colon and a comma per entry
            # every entry costs a byte or more: no more than stop_after of them can fit
            for key, nested in islice(item.items(), max(0, stop_after - size + 1)):
                pending.append(key)
                pending.append(nested)
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            pending.extend(islice(item, max(0, stop_after - size + 1)))
        else:  # numbers, booleans, null
            size += len(repr(item)) if isinstance(item, int | float) else 5
    return size
