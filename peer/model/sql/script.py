"""A SQL script: its statements in order, compiled into schemas, streams and queries.

Statements:

- ``CREATE STREAM name (col TYPE [NOT NULL], ..., WATERMARK FOR t AS t - INTERVAL 'n' UNIT)
  [WITH ('replicas' = 'N')]`` declares a source stream and its schema (``CREATE TABLE`` is
  read the same way). A declaration whose name an ``INSERT`` of the script writes is the
  output's declaration instead (as Flink's sink tables are): the query's columns take its
  names, by position, and their types must agree; nothing is created for it.
- ``CREATE VIEW name AS SELECT ...``: a query later statements may read; each reader gets
  its own copy of its boxes.
- ``[CREATE QUERY name [WITH ('availability_bound' = 'S')] AS] INSERT INTO out SELECT ...``:
  a query writing the stream ``out``, named by ``CREATE QUERY`` or else by the script's name.

A query becomes one or more fedstream queries (stages), created and started in order: an
aggregate reading the result of a windowed box (an aggregate or a join) of the same stage
starts a new stage, since in one Spark streaming query they would share one watermark and
the second would never emit (docs/nexmark.md, "Why some queries run as several fedstream
queries"). Stage ``i > 0`` of query ``q`` is named ``q_i``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from peer.errors import SqlError
from peer.model.limits import DEFAULT_LIMITS, ContentLimits
from peer.model.query import Query, check_bound, check_budget, parse_query
from peer.model.schema import MAX_STRING_SIZE, Field, Schema, check_field_name, check_name
from peer.model.sql.build import Boxes, interval_seconds
from peer.model.sql.compiler import Compiler, CompileWork
from peer.model.sql.dialect import parse_script, refuse
from peer.model.sql.relation import Relation, source

_TYPES = {
    exp.DataType.Type.BIGINT: "long",
    exp.DataType.Type.INT: "int",
    exp.DataType.Type.SMALLINT: "int",
    exp.DataType.Type.TINYINT: "int",
    exp.DataType.Type.DOUBLE: "double",
    exp.DataType.Type.FLOAT: "double",
    exp.DataType.Type.DECIMAL: "double",
    exp.DataType.Type.BOOLEAN: "bool",
    exp.DataType.Type.VARCHAR: "string",
    exp.DataType.Type.CHAR: "string",
    exp.DataType.Type.TEXT: "string",
    exp.DataType.Type.TIMESTAMP: "timestamp",
    exp.DataType.Type.TIMESTAMPTZ: "timestamp",
    exp.DataType.Type.TIMESTAMPLTZ: "timestamp",
}
# options of CREATE STREAM: replicas; 'connector' and 'format' describe Flink's external
# systems, which a fedstream stream does not have (read and ignored, with a warning)
_IGNORED_OPTIONS = ("connector", "format")


@dataclass(frozen=True)
class StreamDecl:
    name: str
    schema: Schema
    replicas: int | None = None


@dataclass(frozen=True)
class Script:
    """A compiled script: schemas and streams to create, then queries to create and start,
    each list in order; ``warnings`` name what the script asks that may cost (unbounded
    state) or that fedstream ignores."""

    streams: tuple[StreamDecl, ...]
    queries: tuple[Query, ...]
    warnings: tuple[str, ...]


def compile_script(
    text: str,
    *,
    name: str,
    streams: Mapping[str, Schema] | None = None,
    namespace: str = "",
    limits: ContentLimits = DEFAULT_LIMITS,
) -> Script:
    """Compile a SQL script. ``name`` names an ``INSERT`` that has no ``CREATE QUERY`` (the
    file's name, say); ``streams`` are schemas of streams that exist already; ``namespace``
    prefixes every stream and query the script names (several runs on one peer)."""
    return _Script(text, name, streams or {}, namespace, limits).run()


def read_streams(text: str, *, limits: ContentLimits = DEFAULT_LIMITS) -> list[str]:
    """The streams a script reads without declaring them (neither ``CREATE STREAM`` nor a
    view): a client looks their schemas up and passes them to :func:`compile_script`."""
    statements = parse_script(text, max_bytes=limits.max_query_bytes)
    defined: set[str] = set()
    read: list[str] = []
    for statement in statements:
        if isinstance(statement, exp.Create) and statement.kind in ("TABLE", "STREAM", "VIEW"):
            defined.add(_created_name(statement).lower())
        targets = {id(i.this) for i in statement.find_all(exp.Insert)}
        for table in statement.find_all(exp.Table):
            if (
                id(table) in targets
                or not isinstance(table.this, exp.Identifier)
                or isinstance(table.parent, exp.Schema | exp.Create)
            ):
                continue
            name = table.name
            if name.lower() not in defined and name not in read:
                read.append(name)
    return read


class _Script:
    def __init__(
        self,
        text: str,
        name: str,
        known: Mapping[str, Schema],
        namespace: str,
        limits: ContentLimits,
    ) -> None:
        self.text = text
        self.name = name
        self.namespace = namespace
        self.limits = limits
        self.relations: dict[str, Relation] = {
            k.lower(): source(namespace + k, s, {}) for k, s in known.items()
        }
        self.views: dict[str, exp.Expr] = {}
        self.declared: list[StreamDecl] = []
        self.sinks: dict[str, exp.Create] = {}
        self.queries: list[Query] = []
        self.warnings: list[str] = []
        self.work = CompileWork()  # shared by every statement's compiler

    def run(self) -> Script:
        statements = parse_script(self.text, max_bytes=self.limits.max_query_bytes)
        targets = {
            insert.this.name.lower()
            for statement in statements
            for insert in statement.find_all(exp.Insert)
            if isinstance(insert.this, exp.Table)
        }
        unnamed = sum(1 for s in statements if isinstance(s, exp.Insert))
        for statement in statements:
            if isinstance(statement, exp.Create) and statement.kind == "QUERY":
                self.insert(statement.expression, statement.this.name, statement)
            elif isinstance(statement, exp.Create) and statement.kind == "VIEW":
                self.view(statement)
            elif isinstance(statement, exp.Create) and statement.kind in ("TABLE", "STREAM"):
                if _created_name(statement).lower() in targets:
                    self.sinks[_created_name(statement).lower()] = statement
                else:
                    self.stream(statement)
            elif isinstance(statement, exp.Insert):
                target = statement.this.name if isinstance(statement.this, exp.Table) else ""
                qname = self.name if unnamed == 1 else f"{self.name}_{target}"
                self.insert(statement, qname, None)
            elif isinstance(statement, exp.Create) and "FUNCTION" in str(statement.kind):
                raise refuse(
                    self.text,
                    statement,
                    keyword="FUNCTION",
                    reason="user-defined functions are not supported: a box runs only the "
                    "built-in functions of the allow-list (docs/sql.md)",
                )
            else:
                raise refuse(
                    self.text,
                    statement,
                    keyword=statement.key.upper(),
                    reason=f"{statement.key.upper()} is not a statement fedstream takes (CREATE "
                    "STREAM, CREATE VIEW, CREATE QUERY ... AS INSERT, INSERT INTO ... SELECT)",
                )
        if not self.declared and not self.queries:
            raise SqlError("the SQL script declares no stream and no query")
        return Script(tuple(self.declared), tuple(self.queries), tuple(self.warnings))

    # -- declarations -------------------------------------------------------------------------

    def stream(self, create: exp.Create) -> None:
        name = _created_name(create)
        if name.lower() in self.relations or name.lower() in self.views:
            raise refuse(self.text, create, f"{name} is declared twice")
        full = check_name(self.namespace + name, "stream", SqlError)
        fields, delays = self.columns(create)
        schema = Schema(full, tuple(fields))
        replicas = None
        for key, value, node in self.options(create):
            if key == "replicas":
                if not value.isdigit() or not 1 <= int(value) <= 64:
                    raise refuse(self.text, node, f"'replicas' is a count of peers, got {value!r}")
                replicas = int(value)
            elif key in _IGNORED_OPTIONS:
                self.warnings.append(f"stream {name}: option '{key}' is ignored by fedstream")
            else:
                raise refuse(
                    self.text, node, f"unknown stream option '{key}' (options: 'replicas')"
                )
        self.declared.append(StreamDecl(full, schema, replicas))
        self.relations[name.lower()] = source(full, schema, delays)

    def columns(self, create: exp.Create) -> tuple[list[Field], dict[str, float]]:
        schema = create.this
        if not isinstance(schema, exp.Schema):
            raise refuse(self.text, create, "CREATE STREAM needs a column list")
        fields: list[Field] = []
        delays: dict[str, float] = {}
        for item in schema.expressions:
            if isinstance(item, exp.WatermarkColumnConstraint):
                column, delay = self.watermark(item)
                delays[column] = delay
                continue
            if not isinstance(item, exp.ColumnDef):
                raise refuse(
                    self.text,
                    item,
                    f"{item.sql()[:40]} is not supported in CREATE STREAM (columns and one "
                    "WATERMARK FOR t AS t - INTERVAL 'n' SECOND)",
                )
            fields.append(self.column(item))
        names = {f.name.lower() for f in fields}
        for column in delays:
            field = next((f for f in fields if f.name.lower() == column), None)
            if field is None or field.type != "timestamp":
                raise refuse(
                    self.text, schema, f"the WATERMARK column {column} is not a TIMESTAMP column"
                )
        if len(names) != len(fields):
            raise refuse(self.text, schema, "two columns have the same name")
        return fields, delays

    def column(self, item: exp.ColumnDef) -> Field:
        name = check_field_name(item.name, SqlError, f"column {item.name}: ")
        kind = item.args.get("kind")
        type_ = _TYPES.get(kind.this) if isinstance(kind, exp.DataType) else None
        if type_ is None:
            raise refuse(
                self.text,
                item,
                f"column {name}: type {kind.sql() if kind else '(none)'} is not supported "
                "(BIGINT, INT, DOUBLE, BOOLEAN, VARCHAR(n), STRING, TIMESTAMP(3))",
            )
        size = None
        if type_ == "string" and isinstance(kind, exp.DataType) and kind.expressions:
            param = kind.expressions[0]
            value = param.this if isinstance(param, exp.DataTypeParam) else param
            digits = value.name if isinstance(value, exp.Literal) else ""
            if digits.isdigit() and 0 < int(digits) <= MAX_STRING_SIZE:
                size = int(digits)
        nullable = True
        for constraint in item.args.get("constraints") or []:
            if isinstance(constraint.args.get("kind"), exp.NotNullColumnConstraint):
                nullable = False
            else:
                raise refuse(
                    self.text,
                    constraint,
                    f"column {name}: only NOT NULL is supported, not {constraint.sql()[:30]}",
                )
        return Field(name, type_, size, nullable)

    def watermark(self, item: exp.WatermarkColumnConstraint) -> tuple[str, float]:
        column = item.this
        expression = item.expression
        if isinstance(expression, exp.Column) and column.name.lower() == expression.name.lower():
            return column.name.lower(), 0.0
        if (
            isinstance(expression, exp.Sub)
            and isinstance(expression.this, exp.Column)
            and expression.this.name.lower() == column.name.lower()
        ):
            return column.name.lower(), interval_seconds(self.text, expression.expression)
        raise refuse(
            self.text,
            item,
            "a watermark is WATERMARK FOR t AS t - INTERVAL 'n' SECOND (or AS t)",
        )

    def options(self, create: exp.Create) -> list[tuple[str, str, exp.Expr]]:
        properties = create.args.get("properties")
        out: list[tuple[str, str, exp.Expr]] = []
        for prop in properties.expressions if properties is not None else []:
            if not isinstance(prop, exp.Property):
                raise refuse(self.text, prop, "options are written 'key' = 'value'")
            key = prop.name.lower() if prop.name else prop.this.sql().strip("'\"`").lower()
            value = prop.args.get("value")
            text = value.name if isinstance(value, exp.Literal) else (value.sql() if value else "")
            out.append((key, text, prop))
        return out

    def view(self, create: exp.Create) -> None:
        name = _created_name(create)
        if name.lower() in self.relations or name.lower() in self.views:
            raise refuse(self.text, create, f"{name} is declared twice")
        body = create.expression
        if not isinstance(body, exp.Query):
            raise refuse(self.text, create, "CREATE VIEW name AS SELECT ...")
        # compile once now so that an error shows at the view, then keep the text
        Compiler(self.text, Boxes("check"), self.relations, self.views, self.work).query(body)
        self.views[name.lower()] = body

    # -- queries ------------------------------------------------------------------------------

    def insert(self, insert: exp.Expr, qname: str, create: exp.Create | None) -> None:
        if not isinstance(insert, exp.Insert) or not isinstance(insert.this, exp.Table):
            raise refuse(self.text, insert, "a query is INSERT INTO stream SELECT ...")
        if insert.args.get("overwrite"):
            raise refuse(self.text, insert, "INSERT OVERWRITE has no meaning on a stream")
        bound = None
        if create is not None:
            for key, value, node in self.options(create):
                if key not in ("availability_bound", "availability-bound"):
                    raise refuse(
                        self.text,
                        node,
                        f"unknown query option '{key}' (options: 'availability_bound')",
                    )
                try:
                    bound = check_bound(qname, value)
                except Exception as exc:
                    raise refuse(self.text, node, str(exc)) from exc
        full = check_name(self.namespace.replace(":", "_") + qname, "query", SqlError)
        target = insert.this.name
        if target.lower() in self.relations or target.lower() in self.views:
            raise refuse(
                self.text,
                insert.this,
                f"{target} is a source stream or a view; a query writes a new stream",
            )
        boxes = Boxes(full)
        compiler = Compiler(self.text, boxes, self.relations, self.views, self.work)
        relation = compiler.query(insert.expression)
        sink = self.sinks.get(target.lower())
        if sink is not None:
            relation = self.conform(relation, sink, boxes)
        _write_to(boxes.boxes, relation.stream, self.namespace + target)
        self.warnings.extend(f"query {full}: {w}" for w in boxes.warnings)
        for stage in _stages(full, boxes.boxes, bound):
            check_budget(stage, self.limits)
            self.queries.append(stage)

    def conform(self, relation: Relation, sink: exp.Create, boxes: Boxes) -> Relation:
        """The query's columns renamed to the declared output's, by position."""
        fields, _ = self.columns(sink)
        if len(fields) != len(relation.columns):
            raise refuse(
                self.text,
                sink,
                f"{_created_name(sink)} declares {len(fields)} columns, the query gives "
                f"{len(relation.columns)}",
            )
        params: dict[str, str] = {}
        for i, (f, c) in enumerate(zip(fields, relation.columns, strict=True)):
            numeric = {"int", "long", "double"}
            if f.type != c.type and not (f.type == "double" and c.type in numeric):
                raise refuse(
                    self.text,
                    sink,
                    f"column {f.name} of {_created_name(sink)} is {f.type}, the query gives "
                    f"{c.type} ({c.name})",
                )
            expression = f"`{c.name}`" if f.type == c.type else f"CAST(`{c.name}` AS DOUBLE)"
            params[f"expression.{i}"] = expression
            params[f"output-field-name.{i}"] = f.name
        if all(
            f.name == c.name and f.type == c.type
            for f, c in zip(fields, relation.columns, strict=True)
        ):
            return relation
        return relation.renamed(boxes.add("map", [relation.stream], params, None))


def _created_name(create: exp.Create) -> str:
    this = create.this
    table = this.this if isinstance(this, exp.Schema) else this
    return table.name if isinstance(table, exp.Table) else str(table.sql())


def _write_to(boxes: list[dict[str, Any]], stream: str, target: str) -> None:
    for box in boxes:
        box["outputs"] = [target if s == stream else s for s in box["outputs"]]
        box["inputs"] = [target if s == stream else s for s in box["inputs"]]


def _stages(name: str, boxes: list[dict[str, Any]], bound: float | None) -> list[Query]:
    producer = {s: i for i, box in enumerate(boxes) for s in box["outputs"]}
    stage: list[int] = []
    windowed: list[bool] = []  # the box is, or reads within its stage, a windowed box
    for box in boxes:
        here = 0
        after = False
        for s in box["inputs"]:
            if s not in producer:
                continue
            p = producer[s]
            if box["type"] == "aggregate" and windowed[p]:
                here = max(here, stage[p] + 1)
            else:
                here = max(here, stage[p])
        for s in box["inputs"]:
            if s in producer and stage[producer[s]] == here and windowed[producer[s]]:
                after = True
        stage.append(here)
        windowed.append(box["type"] in ("aggregate", "join") or after)
    out = []
    for i in range(max(stage) + 1):
        members = [box for box, s in zip(boxes, stage, strict=True) if s == i]
        definition: dict[str, Any] = {"name": name if i == 0 else f"{name}_{i}", "boxes": members}
        if bound is not None:
            definition["availability_bound"] = bound
        out.append(parse_query(definition))
    return out
