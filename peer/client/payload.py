"""What a client pushes and receives: batch payloads in wire form, and :class:`Batch`.

Timestamps travel as int microseconds since the epoch, UTC (naive datetimes are UTC); numpy
arrays and pandas Series become plain Python values; pyarrow tables travel as Arrow IPC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from peer.errors import InvalidInput

__all__ = ["Batch", "batch_payload"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Batch:
    """Tuples of one stream as delivered by a subscription, column-wise."""

    stream: str
    offset: int  # the batch's position in the stream's log (increasing)
    columns: dict[str, list[Any]]
    part: int = 0  # a batch too big for one frame comes as parts 0..parts-1, same offset
    parts: int = 1
    status: str = "stable"  # "tentative": a result that may be taken back (issue 16)
    undo: int | None = None  # a correction: every tentative tuple from this offset on is void

    @property
    def num_rows(self) -> int:
        return len(next(iter(self.columns.values()), []))

    def rows(self) -> list[dict[str, Any]]:
        names = list(self.columns)
        return [
            dict(zip(names, values, strict=True))
            for values in zip(*self.columns.values(), strict=True)
        ]


def _wire_value(value: object) -> object:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return (aware - _EPOCH) // _MICROSECOND
    return value


def _column(values: object) -> list[object]:
    tolist = getattr(values, "tolist", None)
    if callable(tolist):  # numpy arrays, pandas Series: plain Python values
        values = tolist()
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidInput(f"a column must be a sequence of values, not {type(values).__name__}")
    return [_wire_value(v) for v in values]


def batch_payload(data: object) -> dict[str, Any]:
    """The batch part of a ``push`` frame for a pyarrow Table/RecordBatch, a mapping of
    columns, or a sequence of row mappings. A payload already in wire form
    (``{"columns": {...}}``, ``{"rows": [...]}``, ``{"arrow": bytes}``) is accepted too."""
    if isinstance(data, Mapping) and len(data) == 1:
        ((key, value),) = data.items()
        if key == "columns" and isinstance(value, Mapping):
            return batch_payload(value)
        if (
            key == "rows"
            and isinstance(value, list | tuple)
            and all(isinstance(row, Mapping) for row in value)
        ):
            return batch_payload(value)
        if key == "arrow" and isinstance(value, bytes | bytearray | memoryview):
            return {"arrow": bytes(value)}
    if isinstance(data, Mapping):
        return {"columns": {str(name): _column(values) for name, values in data.items()}}
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        rows = []
        for i, row in enumerate(data):
            if not isinstance(row, Mapping):
                raise InvalidInput(f"row {i} is a {type(row).__name__}, not a mapping", row=i)
            rows.append({str(k): _wire_value(v) for k, v in row.items()})
        return {"rows": rows}
    import pyarrow as pa  # only for Arrow input: keeps `import peer.client` light

    from peer.model.tuples import arrow_bytes

    if isinstance(data, pa.Table | pa.RecordBatch):
        return {"arrow": arrow_bytes(data)}
    raise InvalidInput(
        f"cannot push a {type(data).__name__}: give a pyarrow Table, a dict of columns "
        "or a list of row dicts"
    )
