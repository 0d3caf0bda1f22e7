"""``fedlane``: one streaming source over the spools of several streams, for the shared lane.

Theory of operation
-------------------
The stateless lane (``peer.engine.lane``) runs every per-tuple query of a peer in ONE Spark
streaming query, so that its driver cost does not grow with the number of queries. This
source feeds it: a spec file (JSON, written by the peer before the lane starts) lists the
streams, their spool directories, reader ids and fields. The source's schema is "wide":
``__stream INT`` (index into the spec), ``__seq BIGINT`` (arrival order, as in ``fedspool``),
then one nullable column ``c<n>_<field>`` per field of each distinct stream shape ``n``
(streams with the same fields share columns); a row fills only its own stream's columns.

An offset is ``{"o": {stream: N}}``: every file <= N of each stream is consumed. A stream that
an offset does not name (the lane was restarted with a new stream) starts where its reader
committed last, or before its first file. Each micro-batch shares the row limit among the
streams (each gets at least one file when it has one), partitions are runs of files of one
stream, and ``commit`` writes every stream's reader offset so the peer can trim. No stream is
read past its spool's watermark (a replicated stream's acknowledged end, ``Spool.hold``;
read once per stream and ``latestOffset`` call; no file: no bound).

Input without a shared disk: with the options ``fetch=remote``, ``fetchAddress``, ``fetchPin``,
``fetchKey`` and ``fetchTtlS`` (``peer.fetch.protocol.FetchEndpoint``, set by the lane when the
engine's master is not local) each piece of a partition carries a ticket for exactly its files
(``fedspool``'s :class:`~peer.engine.source.Tickets`), and ``read`` in the executor fetches them
from the peer instead of opening them. The planner and ``commit`` run on the peer's host and go
on reading and writing the spool directories.

Like ``fedspool`` it runs in Spark's Python processes, so it imports only light modules.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from peer.engine.source import SEQ_COLUMN as SEQ
from peer.engine.source import Tickets, seq_column, stored_tables
from peer.fetch.protocol import FetchEndpoint, FetchTicket
from peer.model.schema import spark_type
from peer.model.tentative import STABLE
from peer.storage import spool_format as fmt
from peer.storage.spool_format import entry_mark

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

SOURCE_NAME = "fedlane"
STREAM = "__stream"


def column_name(shape: int, field: str) -> str:
    return f"c{shape}_{field}"


def shapes(spec: Mapping[str, Any]) -> list[int]:
    """For each stream of the spec, the number of its shape: streams with the same fields
    (names and types, in order) share one set of wide columns, so a lane over many streams of
    one schema stays as narrow as a lane over one."""
    seen: dict[str, int] = {}
    out = []
    for stream in spec["streams"]:
        key = json.dumps(stream["fields"])
        out.append(seen.setdefault(key, len(seen)))
    return out


def wide_ddl(spec: Mapping[str, Any]) -> str:
    parts = [f"`{STREAM}` INT", f"`{SEQ}` BIGINT"]
    done: set[int] = set()
    for stream, shape in zip(spec["streams"], shapes(spec), strict=True):
        if shape not in done:
            done.add(shape)
            parts += [f"`{column_name(shape, n)}` {spark_type(t)}" for n, t in stream["fields"]]
    return ", ".join(parts)


MAX_PARTITIONS = 2  # one per core here; more only add tasks for every scan of a batch


class LaneRange(InputPartition):
    """Runs of files, each ``(stream index, first, last)``: what one Spark task reads. With
    ``tickets`` (one per piece) the task fetches the files from the peer."""

    def __init__(
        self, pieces: list[tuple[int, int, int]], tickets: list[FetchTicket] | None = None
    ) -> None:
        super().__init__(tuple(pieces))
        self.pieces = pieces
        self.tickets = tickets


class LaneDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return wide_ddl(_load_spec(self.options))

    def streamReader(self, schema: StructType) -> LaneStreamReader:
        return LaneStreamReader(self.options, schema)


def _load_spec(options: Mapping[str, str]) -> dict[str, Any]:
    options = {k.lower(): v for k, v in options.items()}
    path = options.get("spec")
    if not path:
        raise ValueError("the fedlane source needs the option 'spec' (a lane spec file)")
    spec: dict[str, Any] = json.loads(Path(path).read_text())
    return spec


class LaneStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        spec = _load_spec(options)
        lowered = {k.lower(): v for k, v in options.items()}
        self.streams: list[dict[str, Any]] = spec["streams"]
        self.names = [s["name"] for s in self.streams]
        self.shapes = shapes(spec)
        self.dirs = [Path(s["dir"]) for s in self.streams]
        self.max_rows = int(lowered.get("maxrowsperbatch", 200_000))
        fetch = FetchEndpoint.from_options(lowered)
        self._tickets = None if fetch is None else Tickets(fetch)
        self.arrow_schema: pa.Schema = to_arrow_schema(schema, timezone="UTC")
        self._rows: dict[tuple[int, int], int] = {}

    def _start_of(self, index: int, start: Mapping[str, Any]) -> int:
        offsets = start.get("o", {})
        name = self.names[index]
        if name in offsets:
            return int(offsets[name])
        directory, reader = self.dirs[index], self.streams[index]["reader"]
        floor = fmt.trimmed_through(directory)  # never start inside what was trimmed
        try:
            return max(fmt.read_reader_offset(directory, reader), floor)
        except (KeyError, FileNotFoundError, ValueError):
            present = fmt.list_offsets(directory)
            return max(present[0] - 1 if present else floor, floor)

    def initialOffset(self) -> dict[str, Any]:
        return {"o": {name: self._start_of(i, {}) for i, name in enumerate(self.names)}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def _file_rows(self, index: int, offset: int) -> int:
        key = (index, offset)
        if key not in self._rows:
            self._rows[key] = fmt.file_rows(fmt.offset_path(self.dirs[index], offset))
        return self._rows[key]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        share = None if budget is None else max(1, budget // max(1, len(self.names)))
        end: dict[str, int] = {}
        for i, name in enumerate(self.names):
            begin = self._start_of(i, start)
            last, rows = begin, 0
            visible = fmt.read_watermark(self.dirs[i])
            while (visible is None or last < visible) and os.path.exists(
                fmt.offset_path(self.dirs[i], last + 1)
            ):
                n = self._file_rows(i, last + 1)
                if share is not None and last > begin and rows + n > share:
                    break
                last, rows = last + 1, rows + n
            end[name] = last
            if last > begin:  # taken: counts for backpressure before the commit
                fmt.write_taken(self.dirs[i], self.streams[i]["reader"], last)
        for key in [k for k in self._rows if k[1] <= end.get(self.names[k[0]], -1)]:
            del self._rows[key]
        return {"o": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[LaneRange]:
        pieces = []
        for i, name in enumerate(self.names):
            first = self._start_of(i, start) + 1
            last = int(end.get("o", {}).get(name, first - 1))
            if last >= first:
                pieces.append((i, first, last))
        # Deal the pieces round-robin into a few partitions: a partition per stream would make
        # every scan of a batch over many streams a task per stream.
        count = min(MAX_PARTITIONS, len(pieces))
        dealt = [pieces[p::count] for p in range(count)]
        if self._tickets is None:
            return [LaneRange(run) for run in dealt]
        mint = self._tickets.mint
        return [LaneRange(run, [mint(self.dirs[i], a, b) for i, a, b in run]) for run in dealt]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LaneRange)
        tickets: list[FetchTicket | None] = [None] * len(partition.pieces)
        if partition.tickets is not None:
            tickets = list(partition.tickets)
        for (i, first, last), ticket in zip(partition.pieces, tickets, strict=True):
            yield from self._read_piece(i, first, last, ticket)

    def _read_piece(
        self, i: int, first: int, last: int, ticket: FetchTicket | None
    ) -> Iterator[pa.RecordBatch]:
        fields = self.streams[i]["fields"]
        own = {column_name(self.shapes[i], name): name for name, _ in fields}
        target = self.arrow_schema
        for offset, table in stored_tables(self.dirs[i], first, last, ticket):
            if entry_mark(table.schema.metadata)[0] != STABLE:
                continue  # tentative results and undos: not an input of exact results
            row = 0
            for batch in table.to_batches():
                n = batch.num_rows
                columns: list[Any] = [
                    pa.array(np.full(n, i, dtype=np.int32)),
                    seq_column(offset, row, n),
                ]
                for f in target:
                    if f.name in (STREAM, SEQ):
                        continue
                    source = own.get(f.name)
                    if source is None:
                        columns.append(pa.nulls(n, type=f.type))
                    else:
                        column = batch.column(source)
                        columns.append(column if column.type == f.type else column.cast(f.type))
                yield pa.RecordBatch.from_arrays(columns, schema=target)
                row += n

    def commit(self, end: dict[str, Any]) -> None:
        for i, name in enumerate(self.names):
            if name in end.get("o", {}):
                fmt.write_reader_offset(
                    self.dirs[i], self.streams[i]["reader"], int(end["o"][name])
                )


def register_lane_source(spark: Any) -> None:
    spark.dataSource.register(LaneDataSource)
