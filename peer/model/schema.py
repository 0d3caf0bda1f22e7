"""Schemas: named, typed field lists, and the definition-source helpers shared by the model.

A schema arrives as Medusa XML (``<schema name><field name type [size]/></schema>``), as JSON
text or as a mapping; all three give equal :class:`Schema` objects. Definitions come from
clients we do not trust, so every entry point here bounds its input (1 MiB), refuses XML
DOCTYPE/ENTITY declarations (entity expansion bombs) and raises only :class:`SchemaError`.

Field names are SQL identifiers because the engine turns them into Spark columns. Spark
resolves column names case-insensitively, so two fields differing only in case are refused;
names starting with ``__`` are reserved for the engine's internal columns. ``size`` is kept
for string fields only (Medusa's fixed-size strings): it bounds the length, in characters, of
a pushed value. On other types Aurora used it for byte widths, which our types already fix,
so it is accepted and dropped.

A field is non-nullable unless declared ``"nullable": true`` (JSON) or ``nullable="true"``
(XML): only a nullable field takes nil (SQL NULL), and every box treats NULL as SQL does.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from peer.errors import FedstreamError, SchemaError

TYPES = ("int", "long", "double", "bool", "string", "timestamp")
NUMERIC_TYPES = frozenset({"int", "long", "double"})

_TYPE_ALIASES = {
    "integer": "int",
    "int32": "int",
    "bigint": "long",
    "int64": "long",
    "float": "double",
    "float64": "double",
    "boolean": "bool",
    "varchar": "string",
    "text": "string",
}

MAX_SOURCE_BYTES = 1 << 20
MAX_NAME_LENGTH = 256
MAX_FIELDS = 1024
MAX_STRING_SIZE = 1 << 30

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXTERNAL_DTD = re.compile(
    r"<!DOCTYPE\s+[A-Za-z_][\w.-]*\s+(SYSTEM|PUBLIC\s+(\"[^\"<>\[]*\"|'[^'<>\[]*'))\s+"
    r"(\"[^\"<>\[]*\"|'[^'<>\[]*')\s*>",
    re.IGNORECASE,
)
# Stream, schema, query and box names are plain names or URIs such as
# medusa://nms.lcs.mit.edu/locator/person; no spaces, quotes or backslashes, since names end
# up in log lines, file names (hashed) and error messages.
_OBJECT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@~+%#?=&-]*")

_ARROW_TYPES: dict[str, pa.DataType] = {
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}

_SPARK_TYPES = {
    "int": "INT",
    "long": "BIGINT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "STRING",
    "timestamp": "TIMESTAMP",
}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    size: int | None = None
    nullable: bool = False


@dataclass(frozen=True)
class Schema:
    name: str
    fields: tuple[Field, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise SchemaError(
            f"schema {self.name}: no field '{name}' (fields: {', '.join(self.names)})",
            schema=self.name,
            field=name,
        )

    def to_dict(self) -> dict[str, Any]:
        fields: list[dict[str, Any]] = []
        for f in self.fields:
            d: dict[str, Any] = {"name": f.name, "type": f.type}
            if f.size is not None:
                d["size"] = f.size
            if f.nullable:
                d["nullable"] = True
            fields.append(d)
        return {"name": self.name, "fields": fields}

    def renamed(self, name: str) -> Schema:
        return Schema(check_name(name, "schema"), self.fields)


def check_name(
    name: object, what: str, error: type[FedstreamError] = SchemaError, *, prefix: str = ""
) -> str:
    """Return ``name`` if it is a valid object name (plain or URI), else raise ``error``."""
    if not isinstance(name, str) or not name:
        raise error(f"{prefix}{what} name must be a non-empty string, got {_show(name)}")
    if len(name) > MAX_NAME_LENGTH:
        raise error(f"{prefix}{what} name is longer than {MAX_NAME_LENGTH} characters")
    if not _OBJECT_NAME.fullmatch(name):
        raise error(
            f"{prefix}{what} name {name!r} has characters outside letters, digits and _.:/@~+%#?=&-"
        )
    return name


def check_field_name(name: object, error: type[FedstreamError], prefix: str) -> str:
    """Return ``name`` if it can name a field (an identifier not reserved), else raise."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or len(name) > 128:
        raise error(
            f"{prefix}field name {_show(name)} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
        )
    if name.startswith("__"):
        raise error(f"{prefix}field name {name!r} starts with '__', reserved for internal columns")
    return name


def normalize_type(value: object, error: type[FedstreamError], prefix: str) -> str:
    if isinstance(value, str):
        lowered = value.strip().lower()
        lowered = _TYPE_ALIASES.get(lowered, lowered)
        if lowered in TYPES:
            return lowered
    raise error(f"{prefix}unknown type {_show(value)} (types: {', '.join(TYPES)})")


def make_schema(name: str, fields: list[Field] | tuple[Field, ...]) -> Schema:
    """Build a schema from already-typed fields, checking names and uniqueness."""
    check_name(name, "schema")
    where = f"schema {name}: "
    if not fields:
        raise SchemaError(f"{where}has no fields", schema=name)
    if len(fields) > MAX_FIELDS:
        raise SchemaError(f"{where}has more than {MAX_FIELDS} fields", schema=name)
    seen: dict[str, str] = {}
    for f in fields:
        check_field_name(f.name, SchemaError, where)
        if f.type not in TYPES:
            raise SchemaError(f"{where}field '{f.name}': unknown type {f.type!r}", field=f.name)
        # Spark matches column names case-insensitively, so 'a' and 'A' would collide there.
        other = seen.get(f.name.lower())
        if other is not None:
            raise SchemaError(
                f"{where}field '{f.name}' repeats field '{other}' (names are case-insensitive)",
                schema=name,
                field=f.name,
            )
        seen[f.name.lower()] = f.name
    return Schema(name, tuple(fields))


def parse_schema(source: str | bytes | Mapping[str, Any]) -> Schema:
    """Parse a schema from Medusa XML, JSON text or a mapping; raise only SchemaError."""
    if isinstance(source, Mapping):
        return _schema_from_mapping(source)
    text = source_text(source, SchemaError, "schema")
    if text.lstrip().startswith("<"):
        return _schema_from_xml(parse_xml(text, SchemaError, "schema"))
    return _schema_from_mapping(parse_json(text, SchemaError, "schema"))


def _schema_from_mapping(data: Mapping[str, Any]) -> Schema:
    unknown = set(data) - {"name", "fields"}
    if unknown:
        raise SchemaError(f"schema: unknown keys {sorted(map(str, unknown))} (known: name, fields)")
    name = check_name(data.get("name"), "schema")
    raw_fields = data.get("fields")
    if not isinstance(raw_fields, list | tuple):
        raise SchemaError(f"schema {name}: 'fields' must be a list", schema=name)
    fields = []
    for i, raw in enumerate(raw_fields[: MAX_FIELDS + 1]):
        if not isinstance(raw, Mapping):
            raise SchemaError(f"schema {name}: field #{i} must be an object", schema=name)
        extra = set(raw) - {"name", "type", "size", "nullable"}
        if extra:
            raise SchemaError(
                f"schema {name}: field #{i} has unknown keys {sorted(map(str, extra))}",
                schema=name,
            )
        fields.append(
            _make_field(
                name, raw.get("name"), raw.get("type"), raw.get("size"), raw.get("nullable")
            )
        )
    return make_schema(name, fields)


def _schema_from_xml(root: ET.Element) -> Schema:
    if root.tag != "schema":
        raise SchemaError(f"schema XML must have a <schema> root element, got <{root.tag}>")
    name = check_name(root.get("name"), "schema")
    fields = []
    for child in root:
        if child.tag != "field":
            raise SchemaError(f"schema {name}: unexpected element <{child.tag}>", schema=name)
        fields.append(
            _make_field(
                name,
                child.get("name"),
                child.get("type"),
                child.get("size"),
                child.get("nullable"),
            )
        )
        if len(fields) > MAX_FIELDS:
            break
    return make_schema(name, fields)


def _make_field(
    schema: str, name: object, type_: object, size: object, nullable: object = None
) -> Field:
    where = f"schema {schema}: "
    fname = check_field_name(name, SchemaError, where)
    where = f"schema {schema}, field '{fname}': "
    ftype = normalize_type(type_, SchemaError, where)
    null_ok = _nullable(nullable, where)
    if size is None or size == "":
        return Field(fname, ftype, nullable=null_ok)
    if isinstance(size, str) and size.strip().isdigit():
        size = int(size.strip())
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_STRING_SIZE:
        raise SchemaError(f"{where}size must be a positive integer, got {_show(size)}")
    return Field(fname, ftype, size if ftype == "string" else None, null_ok)


def _nullable(value: object, where: str) -> bool:
    # JSON says true/false; XML attributes are text ("true", "false", "1", "0").
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise SchemaError(f"{where}nullable must be true or false, got {_show(value)}")


def to_arrow_schema(schema: Schema) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, _ARROW_TYPES[f.type], nullable=f.nullable) for f in schema.fields]
    )


def arrow_type(type_: str) -> pa.DataType:
    return _ARROW_TYPES[type_]


def spark_ddl(schema: Schema) -> str:
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema.fields)


def spark_type(type_: str) -> str:
    return _SPARK_TYPES[type_]


# -- definition sources, shared with the query parser ------------------------------------------


def source_text(source: object, error: type[FedstreamError], what: str) -> str:
    """Bound and decode a definition given as text or bytes."""
    if isinstance(source, bytes | bytearray | memoryview):
        raw = bytes(source)
        if len(raw) > MAX_SOURCE_BYTES:
            raise error(f"{what} definition is larger than {MAX_SOURCE_BYTES} bytes")
        try:
            return raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise error(f"{what} definition is not UTF-8 text: {exc.reason}") from exc
    if isinstance(source, str):
        if len(source) > MAX_SOURCE_BYTES:
            raise error(f"{what} definition is larger than {MAX_SOURCE_BYTES} characters")
        return source
    raise error(
        f"{what} definition must be XML or JSON text or a mapping, got {type(source).__name__}"
    )


def parse_xml(text: str, error: type[FedstreamError], what: str) -> ET.Element:
    # expat resolves internal entities itself; refusing the declarations up front keeps
    # entity-expansion bombs out whatever the expat version. The text is already decoded, so
    # an encoding declaration cannot hide the markup from this check.
    # Borealis files open with <!DOCTYPE borealis SYSTEM "borealis.dtd">: an external DTD,
    # which expat does not fetch, is allowed; an internal subset (where entities live) is not.
    upper = text.upper()
    doctypes = upper.count("<!DOCTYPE")
    if "<!ENTITY" in upper or doctypes > 1 or (doctypes and not _EXTERNAL_DTD.search(text)):
        raise error(
            f"{what} XML must not contain ENTITY declarations or a DOCTYPE other than "
            '<!DOCTYPE name SYSTEM "file.dtd">'
        )
    try:
        return ET.fromstring(text)
    except ET.ParseError as exc:
        raise error(f"{what} XML does not parse: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} XML does not parse: {type(exc).__name__}") from exc


def parse_json(text: str, error: type[FedstreamError], what: str) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} definition is neither XML nor valid JSON: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} JSON does not parse: {type(exc).__name__}") from exc
    if not isinstance(data, dict):
        raise error(f"{what} JSON must be an object, got {type(data).__name__}")
    return data


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
