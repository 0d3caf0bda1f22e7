"""Validation of pushed batches against a stream's schema.

Theory of operation: a batch arrives column-wise (``{"columns": {field: [...]}}``), row-wise
(``{"rows": [{field: value}, ...]}``) or as Arrow IPC stream bytes (``{"arrow": b"..."}``) and
leaves as a ``pa.Table`` of exactly :func:`to_arrow_schema`. Pushes must sustain ~200,000
tuples/s, so each column takes a fast path: ``set(map(type, values))`` (a C-speed pass) proves
the column holds only Python types that are valid for the field, then pyarrow converts it in
one call. Any surprise (a foreign type, None, an out-of-range number, a float with a fraction)
sends that one column down the slow path, which walks it value by value to name the first bad
line and field. A batch is accepted whole or refused whole with a :class:`TupleError`.

Wire conventions: timestamps are int microseconds since the Unix epoch (UTC), msgpack
``Timestamp`` or ``datetime`` (naive means UTC); ints may arrive as integral floats (JSON
clients cannot always tell them apart) but never as bools; doubles accept ints and NaN/inf;
nil (None) is a NULL, taken only by a field declared nullable. An error's details name the
stream, the field and the tuple (its 0-based index in the batch).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from peer.errors import TupleError
from peer.model.ipc import declared_size
from peer.model.schema import Field, Schema, arrow_type, to_arrow_schema

MAX_ROWS = 1_000_000
# What one pushed Arrow body may hold once decompressed (``max_push_bytes``; docs/protocol.md,
# "Content limits"); the frame limit bounds only the compressed bytes.
MAX_PUSH_BYTES = 64 * 1024 * 1024

_INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TS_TYPE = pa.timestamp("us", tz="UTC")

# Python types that let a column skip the per-value scan, per field type.
_FAST_TYPES: dict[str, frozenset[type]] = {
    "int": frozenset({int}),
    "long": frozenset({int}),
    "double": frozenset({int, float}),
    "bool": frozenset({bool}),
    "string": frozenset({str}),
    "timestamp": frozenset({int}),
}


class _BadValue(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def batch_from_wire(
    schema: Schema,
    payload: Mapping[str, Any],
    *,
    max_rows: int = MAX_ROWS,
    max_bytes: int = MAX_PUSH_BYTES,
    stream: str | None = None,
) -> pa.Table:
    """Validate a pushed batch and return it as a table of the schema's Arrow types.

    An Arrow body is bounded before it is decoded: at most ``max_rows`` tuples and
    ``max_bytes`` once decompressed (:mod:`peer.model.ipc`). It is CPU work: callers on the
    event loop run this in a worker thread."""
    label = f"stream {stream}" if stream else f"schema {schema.name}"
    if not isinstance(payload, Mapping) or len(payload) != 1:
        raise TupleError(
            f"{label}: a batch is one of {{'columns': ...}}, {{'rows': ...}} or {{'arrow': ...}}",
            stream=stream,
        )
    ((kind, body),) = payload.items()
    if kind == "arrow":
        return _from_arrow(schema, body, label, stream, max_rows, max_bytes)
    if kind == "rows":
        columns = _columns_from_rows(schema, body, label, stream, max_rows)
    elif kind == "columns":
        columns = _checked_columns(schema, body, label, stream, max_rows)
    else:
        raise TupleError(f"{label}: unknown batch encoding {kind!r}", stream=stream)
    arrays = [_column(f, columns[f.name], label, stream) for f in schema.fields]
    return pa.Table.from_arrays(arrays, schema=to_arrow_schema(schema))


def _checked_columns(
    schema: Schema, body: object, label: str, stream: str | None, max_rows: int
) -> dict[str, Sequence[Any]]:
    if not isinstance(body, Mapping):
        raise TupleError(f"{label}: 'columns' must map field names to lists", stream=stream)
    for name in body:
        if name not in schema.names:
            raise TupleError(f"{label}: unknown field {name!r}", stream=stream, field=str(name))
    length: int | None = None
    first = ""
    for f in schema.fields:
        if f.name not in body:
            raise TupleError(f"{label}: field '{f.name}' is missing", stream=stream, field=f.name)
        values = body[f.name]
        if not isinstance(values, list | tuple):
            raise TupleError(
                f"{label}: field '{f.name}' must be a list of values", stream=stream, field=f.name
            )
        if len(values) > max_rows:
            raise TupleError(f"{label}: batch has more than {max_rows} tuples", stream=stream)
        if length is None:
            length, first = len(values), f.name
        elif len(values) != length:
            raise TupleError(
                f"{label}: field '{f.name}' has {len(values)} values "
                f"but field '{first}' has {length}",
                stream=stream,
                field=f.name,
            )
    return dict(body)


def _columns_from_rows(
    schema: Schema, rows: object, label: str, stream: str | None, max_rows: int
) -> dict[str, Sequence[Any]]:
    if not isinstance(rows, list | tuple):
        raise TupleError(f"{label}: 'rows' must be a list of objects", stream=stream)
    if len(rows) > max_rows:
        raise TupleError(f"{label}: batch has more than {max_rows} tuples", stream=stream)
    names = set(schema.names)
    for line, row in enumerate(rows):
        if not isinstance(row, dict) or row.keys() != names:
            _refuse_row(schema, row, line, label, stream)
    return {name: [row[name] for row in rows] for name in schema.names}


def _refuse_row(schema: Schema, row: object, line: int, label: str, stream: str | None) -> None:
    """Raise for a row that is not an object with exactly the schema's fields; return for a
    non-dict mapping that has them."""
    if not isinstance(row, Mapping):
        raise TupleError(
            f"{label}, tuple {line}: a tuple must be an object", stream=stream, tuple=line
        )
    for name in schema.names:
        if name not in row:
            raise TupleError(
                f"{label}, tuple {line}: field '{name}' is missing",
                stream=stream,
                tuple=line,
                field=name,
            )
    extra = next((k for k in row if k not in schema.names), None)
    if extra is None:
        return
    raise TupleError(
        f"{label}, tuple {line}: unknown field {extra!r}",
        stream=stream,
        tuple=line,
        field=str(extra),
    )


def _column(f: Field, values: Sequence[Any], label: str, stream: str | None) -> pa.Array:
    target = _arrow_type(f)
    kinds = set(map(type, values))
    array: pa.Array | None = None
    if f.nullable:
        kinds.discard(type(None))
    if kinds <= _FAST_TYPES[f.type]:
        try:
            array = _fast_array(f.type, values, target, kinds)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError):
            array = None
    elif f.type == "timestamp" and kinds == {dt.datetime}:
        # pyarrow reads naive datetimes as UTC wall time and converts aware ones: our rule.
        try:
            array = pa.array(values, type=target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            array = None
    if array is None:
        array = pa.array(_normalized(f, values, label, stream), type=_canonical_type(f.type))
        if f.type == "timestamp":
            array = array.view(target)
    if f.size is not None:
        _check_size(f, array, label, stream)
    return array


def _fast_array(
    type_: str, values: Sequence[Any], target: pa.DataType, kinds: set[type]
) -> pa.Array:
    if type_ == "timestamp":
        return pa.array(values, type=pa.int64()).view(target)
    if type_ in ("int", "long") and float in kinds:
        # pyarrow would truncate 1.5 silently; a safe cast from float64 refuses fractions.
        return pa.array(values, type=pa.float64()).cast(target, safe=True)
    return pa.array(values, type=target)


def _check_size(f: Field, array: pa.Array, label: str, stream: str | None) -> None:
    assert f.size is not None
    too_long = pc.greater(pc.utf8_length(array), f.size)
    line = pc.index(too_long, True).as_py()
    if line >= 0:
        raise TupleError(
            f"{label}, tuple {line}, field '{f.name}': string is longer than {f.size} characters",
            stream=stream,
            tuple=line,
            field=f.name,
        )


def _normalized(f: Field, values: Sequence[Any], label: str, stream: str | None) -> list[Any]:
    """The slow path: check each value, naming the first bad one; return canonical values."""
    check = _CHECKS[f.type]
    out: list[Any] = []
    for line, value in enumerate(values):
        try:
            if value is None:
                if not f.nullable:
                    raise _BadValue("is nil, but the field is not nullable")
                out.append(None)
                continue
            out.append(check(f.type, value))
        except _BadValue as bad:
            raise TupleError(
                f"{label}, tuple {line}, field '{f.name}': {bad.reason}",
                stream=stream,
                tuple=line,
                field=f.name,
            ) from None
    return out


def _check_int(type_: str, value: Any) -> int:
    if isinstance(value, float) and not isinstance(value, bool):
        if not value.is_integer():
            raise _BadValue(f"expected {type_}, got {_show(value)} (has a fraction)")
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadValue(f"expected {type_}, got {_kind(value)} {_show(value)}")
    low, high = _INT_RANGES[type_]
    if not low <= value <= high:
        raise _BadValue(f"{value} is out of range for {type_} [{low}, {high}]")
    return int(value)


def _check_double(type_: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadValue(f"expected double, got {_kind(value)} {_show(value)}")
    try:
        return float(value)
    except OverflowError:
        raise _BadValue(f"{_show(value)} is out of range for double") from None


def _check_bool(type_: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _BadValue(f"expected bool, got {_kind(value)} {_show(value)}")
    return value


def _check_string(type_: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _BadValue(f"expected string, got {_kind(value)} {_show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _BadValue("string is not valid Unicode (lone surrogate)") from None
    return str(value)


def _check_timestamp(type_: str, value: Any) -> int:
    if isinstance(value, msgpack.Timestamp):
        return _check_int("long", value.to_unix_nano() // 1000)
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        delta = aware - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, int) and not isinstance(value, bool):
        return _check_int("long", value)
    raise _BadValue(
        f"expected timestamp (int microseconds, msgpack Timestamp or datetime), "
        f"got {_kind(value)} {_show(value)}"
    )


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "int": _check_int,
    "long": _check_int,
    "double": _check_double,
    "bool": _check_bool,
    "string": _check_string,
    "timestamp": _check_timestamp,
}


def _canonical_type(type_: str) -> pa.DataType:
    return pa.int64() if type_ == "timestamp" else arrow_type(type_)


def _arrow_type(f: Field) -> pa.DataType:
    return arrow_type(f.type)


# -- Arrow IPC batches ---------------------------------------------------------------------------

_ARROW_SOURCES: dict[str, Callable[[pa.DataType], bool]] = {
    "int": pa.types.is_integer,
    "long": pa.types.is_integer,
    "double": lambda t: pa.types.is_floating(t) or pa.types.is_integer(t),
    "bool": pa.types.is_boolean,
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "timestamp": lambda t: pa.types.is_timestamp(t) or pa.types.is_int64(t),
}


def _from_arrow(
    schema: Schema, body: object, label: str, stream: str | None, max_rows: int, max_bytes: int
) -> pa.Table:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TupleError(f"{label}: 'arrow' must be Arrow IPC stream bytes", stream=stream)
    data = pa.py_buffer(body)
    try:
        declared = declared_size(data, max_bytes=max_bytes, max_rows=max_rows)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise TupleError(
            f"{label}: Arrow IPC payload does not decode: {exc}", stream=stream
        ) from exc
    if declared.rows > max_rows:
        raise TupleError(f"{label}: batch has more than {max_rows} tuples", stream=stream)
    if declared.bytes > max_bytes:
        raise _too_large(label, stream, declared.bytes, max_bytes, declared.compressed)
    try:
        reader = pa.ipc.open_stream(data)
        batches = []
        size = 0
        for batch in reader:  # decoded one at a time, each within what was declared
            size += batch.nbytes
            if size > max_bytes:
                raise _too_large(label, stream, size, max_bytes, declared.compressed)
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=reader.schema)
        # A hostile stream can declare buffers that do not hold what they claim.
        table.validate(full=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise TupleError(
            f"{label}: Arrow IPC payload does not decode: {exc}", stream=stream
        ) from exc
    names = table.column_names
    for name in names:
        if name not in schema.names:
            raise TupleError(f"{label}: unknown field {name!r}", stream=stream, field=name)
    if len(set(names)) != len(names):
        raise TupleError(f"{label}: Arrow payload repeats a column", stream=stream)
    columns = []
    for f in schema.fields:
        if f.name not in names:
            raise TupleError(f"{label}: field '{f.name}' is missing", stream=stream, field=f.name)
        columns.append(_arrow_column(f, table.column(f.name), label, stream))
    return pa.Table.from_arrays(columns, schema=to_arrow_schema(schema))


def _too_large(
    label: str, stream: str | None, size: int, limit: int, compressed: bool
) -> TupleError:
    return TupleError(
        f"{label}: Arrow IPC payload holds at least {size} bytes"
        f"{' once decompressed' if compressed else ''}, over the push limit of {limit} bytes "
        "(max_push_bytes)",
        stream=stream,
        limit="max_push_bytes",
        max_push_bytes=limit,
    )


def _arrow_column(f: Field, column: pa.ChunkedArray, label: str, stream: str | None) -> pa.Array:
    target = _arrow_type(f)
    if (column.null_count == 0 or f.nullable) and _ARROW_SOURCES[f.type](column.type):
        try:
            array = column.combine_chunks()
            if f.type == "timestamp" and pa.types.is_int64(array.type):
                array = array.view(target)
            array = array.cast(target, safe=True)
            if f.size is not None:
                _check_size(f, array, label, stream)
            return array
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    if pa.types.is_timestamp(column.type):
        # Python datetimes cannot hold every Arrow timestamp; the raw integers can.
        column = column.cast(pa.int64())
    try:
        values = column.to_pylist()
    except (pa.ArrowException, ValueError, OverflowError) as exc:
        raise TupleError(
            f"{label}: field '{f.name}' holds values that do not decode ({type(exc).__name__})",
            stream=stream,
            field=f.name,
        ) from exc
    _normalized(f, values, label, stream)
    # The slow path found every value acceptable, so the column's Arrow type is the culprit.
    raise TupleError(
        f"{label}: field '{f.name}' has Arrow type {column.type}, "
        f"which does not convert to {f.type}",
        stream=stream,
        field=f.name,
    )


# -- back to the wire ----------------------------------------------------------------------------


def _plain_columns(table: pa.Table) -> list[pa.ChunkedArray]:
    out = []
    for column in table.columns:
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        out.append(column)
    return out


def batch_to_wire(table: pa.Table) -> dict[str, Any]:
    """The columnar wire form of a table (timestamps as int microseconds)."""
    return {
        "columns": {
            name: column.to_pylist()
            for name, column in zip(table.column_names, _plain_columns(table), strict=True)
        }
    }


def rows_from_table(table: pa.Table) -> list[dict[str, Any]]:
    """The table's tuples as dicts (timestamps as int microseconds)."""
    plain = pa.Table.from_arrays(_plain_columns(table), names=table.column_names)
    rows: list[dict[str, Any]] = plain.to_pylist()
    return rows


def _kind(value: object) -> str:
    return type(value).__name__


def _show(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def arrow_bytes(data: pa.Table | pa.RecordBatch) -> bytes:
    """``data`` as an Arrow IPC stream (what ``arrow`` fields carry, on links and pushes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return bytes(sink.getvalue())
