"""Reading a box's parameters: the text-to-value rules shared by every box type.

Parameters keep their Aurora/Borealis names and arrive as text. A :class:`BoxParams` reads
them for one box, so that every error it raises names the query, the box and the parameter
("query FindMrX, box foo, parameter window-size: ..."). Indexed parameters (``expression.N``)
must be numbered 0, 1, 2, ... without gaps, and a box refuses parameters its type does not
know, listing the ones it does.

Durations on timestamp fields are seconds, written as a number (``60``, ``0.5``) or as a
Spark-style interval (``1 minute``, ``2 hours 30 minutes``, ``500 ms``).
"""

from __future__ import annotations

import math
import re

from peer.errors import QueryError
from peer.model.query import Box
from peer.model.schema import Field, Schema

_INDEXED = re.compile(r"(.+)\.(\d+)")
_INTERVAL_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")
_SECONDS_PER_UNIT = {
    **dict.fromkeys(("us", "microsecond", "microseconds"), 1e-6),
    **dict.fromkeys(("ms", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
    **dict.fromkeys(("week", "weeks"), 604800.0),
}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
ORDER_TYPES = frozenset({"int", "long", "double", "timestamp"})


class BoxParams:
    def __init__(self, query: str, box: Box, fixed: tuple[str, ...], indexed: tuple[str, ...]):
        self.query = query
        self.box = box
        self.values = dict(box.params)
        known = [*fixed, *(f"{base}.N" for base in indexed)]
        for name in self.values:
            match = _INDEXED.fullmatch(name)
            if name in fixed or (match is not None and match.group(1) in indexed):
                continue
            raise self.error(
                f"unknown parameter for a box of type {box.type} "
                f"(known: {', '.join(known) or 'none'})",
                name,
            )

    def where(self, param: str | None = None) -> str:
        where = f"query {self.query}, box {self.box.name}"
        return f"{where}, parameter {param}" if param else where

    def error(self, message: str, param: str | None = None, **details: object) -> QueryError:
        return QueryError(
            f"{self.where(param)}: {message}",
            query=self.query,
            box=self.box.name,
            parameter=param,
            **details,
        )

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def require(self, name: str, why: str = "") -> str:
        value = self.values.get(name)
        if value is None or not value.strip():
            raise self.error(f"is required{why}", name)
        return value.strip()

    def indexed(self, base: str, *, required: bool = True) -> list[str]:
        """The values of ``base.0``, ``base.1``, ... (numbered without gaps)."""
        found: dict[int, str] = {}
        for name, value in self.values.items():
            match = _INDEXED.fullmatch(name)
            if match is not None and match.group(1) == base:
                found[int(match.group(2))] = value
        for i in range(len(found)):
            if i not in found:
                last = max(found)
                raise self.error(f"is missing, but {base}.{last} is given", f"{base}.{i}")
        if required and not found:
            raise self.error("is required (at least one)", f"{base}.0")
        return [found[i] for i in range(len(found))]

    def names_for(self, base: str, count: int, primary: str) -> dict[int, str]:
        """The values of ``base.N`` that pair with ``primary.N``; refuses orphans."""
        out: dict[int, str] = {}
        for name, value in self.values.items():
            match = _INDEXED.fullmatch(name)
            if match is not None and match.group(1) == base:
                index = int(match.group(2))
                if index >= count:
                    raise self.error(f"has no matching {primary}.{index}", name)
                out[index] = value.strip()
        return out

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise self.error(f"must be 0/1 or true/false, got {value!r}", name)

    def number(
        self, name: str, value: str, *, integral: bool = False, zero_ok: bool = False
    ) -> float:
        try:
            number = float(value)
        except ValueError:
            raise self.error(f"must be a number, got {value!r}", name) from None
        return self._bounded(name, value, number, integral, zero_ok)

    def duration(
        self,
        name: str,
        value: str,
        order_type: str,
        *,
        integral: bool = False,
        zero_ok: bool = False,
    ) -> float:
        """A length on an order field: seconds (number or interval) for timestamps."""
        if order_type != "timestamp":
            return self.number(name, value, integral=integral, zero_ok=zero_ok)
        try:
            float(value)
        except ValueError:
            pass
        else:
            return self.number(name, value, zero_ok=zero_ok)
        text = value.strip().lower().removeprefix("interval").strip()
        total, pos = 0.0, 0
        while pos < len(text):
            match = _INTERVAL_PART.match(text, pos)
            if match is None or match.group(2) not in _SECONDS_PER_UNIT:
                raise self.error(
                    f"must be seconds or an interval such as '1 minute', got {value!r}", name
                )
            total += float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
            pos = match.end()
        if pos == 0:
            raise self.error(
                f"must be seconds or an interval such as '1 minute', got {value!r}", name
            )
        return self._bounded(name, value, total, False, zero_ok)

    def _bounded(self, name: str, text: str, number: float, integral: bool, zero_ok: bool) -> float:
        if not math.isfinite(number):
            raise self.error(f"must be a finite number, got {text!r}", name)
        if number < 0 or (number == 0 and not zero_ok):
            raise self.error(
                f"must be {'non-negative' if zero_ok else 'positive'}, got {text!r}", name
            )
        if integral and not number.is_integer():
            raise self.error(f"must be a whole number, got {text!r}", name)
        return number

    def field(
        self, name: str, value: str, schema: Schema, types: frozenset[str] | None = None
    ) -> Field:
        """The field of ``schema`` named ``value`` (case-insensitively), of one of ``types``."""
        wanted = value.strip().lower()
        field = next((f for f in schema.fields if f.name.lower() == wanted), None)
        if field is None:
            raise self.error(
                f"unknown field {value.strip()!r} (fields: {', '.join(schema.names)})", name
            )
        if types is not None and field.type not in types:
            raise self.error(
                f"field '{field.name}' is {field.type}, needs {' or '.join(sorted(types))}", name
            )
        return field

    def field_list(self, name: str, schema: Schema) -> tuple[str, ...]:
        """A comma-separated list of distinct fields (empty when the parameter is absent)."""
        value = self.values.get(name)
        if value is None or not value.strip():
            return ()
        names: list[str] = []
        for part in value.split(","):
            if not part.strip():
                raise self.error(f"has an empty entry in {value!r}", name)
            field = self.field(name, part, schema)
            if field.name in names:
                raise self.error(f"lists field '{field.name}' twice", name)
            names.append(field.name)
        return tuple(names)
