"""Reading tuples from JSONL or CSV text for ``peer push``, and writing them for ``subscribe``.

Text formats carry no types, so each value is converted by the stream's schema here, and an
error names the 1-based line and the field. Timestamps are read as ISO-8601 strings (a missing
zone means UTC) or as numbers since the Unix epoch in ``time_unit`` (``s``, ``ms`` or ``us``;
``peer push --time-unit``), and sent as the wire's integer microseconds; a timestamp outside
the years 1 to 9999 (which ISO-8601 cannot write) is refused. A JSON null, or an empty CSV
value, is a NULL: taken by a nullable field, refused elsewhere. Everything is read and checked
before anything is sent: a file with one bad line pushes nothing.

Going out (``peer subscribe``), a timestamp is written as an ISO-8601 UTC string, or as its
integer microseconds when it lies outside the years ISO-8601 can write.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from peer.errors import TupleError
from peer.model.schema import Schema

INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
TRUE = {"true", "t", "1", "yes"}
FALSE = {"false", "f", "0", "no"}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


TIME_UNITS = {"s": 1_000_000, "ms": 1_000, "us": 1}
# What ISO-8601 (and Python's datetime) can write: 0001-01-01 to 9999-12-31T23:59:59.999999.
MIN_US = (dt.datetime.min.replace(tzinfo=dt.UTC) - EPOCH) // dt.timedelta(microseconds=1)
MAX_US = (dt.datetime.max.replace(tzinfo=dt.UTC) - EPOCH) // dt.timedelta(microseconds=1)


def _timestamp(value: Any, unit: str) -> int:
    per = TIME_UNITS[unit]
    if isinstance(value, bool):
        raise ValueError("a boolean is not a timestamp")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return _iso(text)
    if isinstance(value, int):
        micros = value * per
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number of {unit}")
        micros = round(value * per)
    else:
        raise ValueError(f"expected an ISO-8601 string or a number of {unit}, got {value!r}")
    if not MIN_US <= micros <= MAX_US:
        raise ValueError(
            f"{value} {unit} since the epoch is outside the years 1 to 9999"
            + ("" if unit == "us" else "; is it in smaller units? see --time-unit")
        )
    return micros


def _iso(text: str) -> int:
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither ISO-8601 nor a number") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    delta = parsed - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def iso_or_micros(value: int) -> str | int:
    """A timestamp for people: ISO-8601 UTC, or the integer microseconds ISO cannot write."""
    if MIN_US <= value <= MAX_US:
        return (EPOCH + dt.timedelta(microseconds=value)).isoformat()
    return value


def convert(
    value: Any, type_: str, *, from_text: bool, nullable: bool = False, time_unit: str = "s"
) -> Any:
    """One value of a field, converted to its wire form (None: NULL); ValueError says why
    not."""
    if value is None or (from_text and value == ""):
        if nullable:
            return None
        raise ValueError("missing value (the field is not nullable)")
    if type_ in INT_RANGE:
        if from_text:
            value = int(str(value).strip())
        elif isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ValueError(f"expected an integer, got {value!r}")
        low, high = INT_RANGE[type_]
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range for {type_}")
        return value
    if type_ == "double":
        if isinstance(value, bool):
            raise ValueError("expected a number, got a boolean")
        if from_text or isinstance(value, int | float):
            return float(value)
        raise ValueError(f"expected a number, got {value!r}")
    if type_ == "bool":
        if isinstance(value, bool):
            return value
        if from_text and str(value).strip().lower() in TRUE | FALSE:
            return str(value).strip().lower() in TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if type_ == "string":
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {value!r}")
    if type_ == "timestamp":
        return _timestamp(value, time_unit)
    raise ValueError(f"unknown type {type_}")


def _records(text: Iterable[str], fmt: str, schema: Schema) -> Iterator[tuple[int, dict[str, Any]]]:
    if fmt == "jsonl":
        for number, line in enumerate(text, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TupleError(f"line {number}: not JSON: {exc.msg}", line=number) from exc
            if not isinstance(record, dict):
                raise TupleError(f"line {number}: expected a JSON object", line=number)
            yield number, record
    elif fmt == "csv":
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        for row in reader:
            if not row:
                continue
            number = reader.line_num
            if len(row) != len(header):
                raise TupleError(
                    f"line {number}: {len(row)} values for {len(header)} columns", line=number
                )
            yield number, dict(zip(header, row, strict=True))
    else:
        raise TupleError(f"unknown format {fmt!r} (jsonl or csv)")


def read_columns(
    text: Iterable[str], fmt: str, schema: Schema, *, time_unit: str = "s"
) -> dict[str, list[Any]]:
    """All tuples of ``text`` as wire columns; TupleError names the line and field."""
    if time_unit not in TIME_UNITS:
        raise TupleError(f"unknown time unit {time_unit!r} (s, ms or us)")
    columns: dict[str, list[Any]] = {f.name: [] for f in schema.fields}
    known = set(columns)
    for number, record in _records(text, fmt, schema):
        extra = set(record) - known
        if extra:
            raise TupleError(
                f"line {number}: unknown field {sorted(extra)[0]!r} for stream "
                f"schema {schema.name} (fields: {', '.join(schema.names)})",
                line=number,
                field=sorted(extra)[0],
            )
        for f in schema.fields:
            if f.name not in record:
                raise TupleError(
                    f"line {number}: missing field {f.name!r}", line=number, field=f.name
                )
            try:
                value = convert(
                    record[f.name],
                    f.type,
                    from_text=fmt == "csv",
                    nullable=f.nullable,
                    time_unit=time_unit,
                )
                columns[f.name].append(value)
            except ValueError as exc:
                raise TupleError(
                    f"line {number}, field {f.name!r} ({f.type}): {exc}", line=number, field=f.name
                ) from exc
    return columns


def chunks(columns: dict[str, list[Any]], size: int) -> Iterator[dict[str, list[Any]]]:
    total = len(next(iter(columns.values()), []))
    for start in range(0, total, size):
        yield {name: values[start : start + size] for name, values in columns.items()}


def to_jsonl(rows: Iterable[dict[str, Any]], schema: Schema) -> str:
    """Rows as JSON lines, timestamps as ISO-8601 UTC strings."""
    stamps = [f.name for f in schema.fields if f.type == "timestamp"]
    out = io.StringIO()
    for row in rows:
        if stamps:
            row = dict(row)
            for name in stamps:
                value = row.get(name)
                if isinstance(value, int):
                    row[name] = iso_or_micros(value)
                elif isinstance(value, dt.datetime):
                    row[name] = value.isoformat()
        out.write(json.dumps(row, default=str))
        out.write("\n")
    return out.getvalue()
