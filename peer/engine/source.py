"""``fedspool``: a PySpark streaming data source that reads a spool directory by offset.

Theory of operation
-------------------
The spool (``peer.storage.spool``) is written by the peer process; this module runs in the Python
processes Spark starts (the source runner that plans micro-batches, and the workers that read
partitions), so it imports only pyarrow, the standard library, pyspark's data source API and
``peer.storage.spool_format`` at the top: never the peer node or the session builder.

An offset is ``{"offset": N}``: every spool file with offset <= N is consumed (with
``nameOffsets``, ``{"offset": N, "stream": S}``: a query with a warm standby names the stream
each source reads, so that the standby can tell, from the offset log alone, where each input of
the primary's batch ended; peer.replication.standby). Spark asks

* ``initialOffset`` once for a new query (no checkpoint): just before the first file present;
* ``getDefaultReadLimit`` once: ``ReadMaxRows(maxRowsPerBatch)``, because with a 0 s trigger a
  backlog otherwise becomes one huge micro-batch (the driver ran out of heap collecting it);
* ``latestOffset(start, limit)`` before each micro-batch: it walks the files after ``start``
  by ``stat`` (a walk stops at the first gap, so a file still being renamed into place is
  never skipped) and stops where the limit says, reading row counts from file footers. A
  micro-batch always takes at least one whole file: files are the unit of the offset. It
  never goes past the spool's watermark (a replicated stream's acknowledged end, which the
  peer's ``Spool.hold`` writes; read once per call; no file: no bound), nor does
  ``prepareForTriggerAvailableNow``'s target. With ``ignoreHold`` it reads to the log's end:
  a warm standby over a follower's copy (:mod:`peer.replication.standby`), whose spool is held
  at -1 while it follows; files are renamed into place whole, so it never meets half of one;
* ``partitions(start, end)``: the files of the range split into up to ``numPartitions``
  contiguous runs of similar row count, so that two cores read and filter in parallel;
  Spark concatenates partitions in order, so a collected micro-batch is in offset order;
* ``read(partition)`` (in a worker): each file's record batches, cast to the exact Arrow
  schema Spark derives from the declared one (``timestamp[us, tz=UTC]``), plus ``__seq``
  when ``withSeq`` is on;
* ``commit(end)`` after the micro-batch is in Spark's commit log: ``readers/<reader>.offset``
  is rewritten atomically, which is what lets the peer trim the spool.

Options: ``path`` (spool directory), ``schema`` (Spark DDL of the stream), ``reader`` (reader
id whose commit file this query writes; without it nothing is committed), ``maxRowsPerBatch``
(default 200000; 0 = unbounded), ``withSeq`` (``true`` adds a trailing ``__seq BIGINT``),
``numPartitions`` (default 2), ``startingOffset`` (``earliest``, the default, or ``latest``:
for a query without checkpoint), ``noFsync`` (``true`` skips fsync of commit files: tests),
``heartbeat`` (``true`` adds a trailing ``__hb BOOLEAN``, true on the rows of heartbeat files:
see ``peer.engine.forks``), ``fetch`` (``local``, the default, or ``remote``) with
``fetchAddress``, ``fetchPin``, ``fetchKey`` and ``fetchTtlS`` (``peer.fetch.protocol.
FetchEndpoint``).

Input without a shared disk (``fetch=remote``, set by the engine when Spark's master is not
local): the planner runs on the peer's host, so it still plans by reading the spool directory;
``partitions`` gives each partition a ticket (the peer's fetch server, its TLS pin, and a
capability for exactly that partition's files signed with the peer's fetch key, which the
planner reads from ``fetchKey``: ``peer.fetch.capability``), and ``read`` in the executor
fetches each file's stored bytes from the peer (``peer.fetch.client``) instead of opening it,
then decodes them exactly as a local file. The key itself is never pickled to executors.

Tentative results and undo entries (``peer.model.tentative``) are read as files without rows:
a query reads the stable part of its inputs only, so its own results are exact.

``__seq`` = offset * 2**24 + row index within the file: a total order of arrival that
survives restarts and replays (the spool caps files at 2**24 - 1 rows).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from peer.fetch.protocol import FetchEndpoint, FetchTicket
from peer.model.tentative import STABLE
from peer.storage import spool_format as fmt
from peer.storage.spool_format import META_HEARTBEAT, entry_mark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from peer.fetch.capability import FetchKey

log = logging.getLogger(__name__)

SOURCE_NAME = "fedspool"
# A source offset as Spark stores it: {"offset": N}, and "stream": S with nameOffsets.
SpoolOffset = dict[str, int | str]
SEQ_COLUMN = fmt.SEQ_COLUMN
HB_COLUMN = "__hb"  # true on a heartbeat row (a tentative fork's missing input)
SEQ_SHIFT = fmt.SEQ_SHIFT  # __seq = offset << SEQ_SHIFT | row index
DEFAULT_MAX_ROWS = 200_000
DEFAULT_PARTITIONS = 2
# Below this many rows per partition a second Python task costs more than it saves.
MIN_ROWS_PER_PARTITION = 20_000


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1", "yes")


class SpoolRange(InputPartition):
    """Files ``first..last`` (inclusive) of one spool: what one Spark task reads (pickled).
    With a ``ticket`` the task fetches them from the peer instead of opening them."""

    def __init__(self, first: int, last: int, ticket: FetchTicket | None = None) -> None:
        super().__init__((first, last))
        self.first = first
        self.last = last
        self.ticket = ticket


class SpoolDataSource(DataSource):
    """``spark.readStream.format("fedspool")``; see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        ddl = self.options.get("schema")
        if not ddl:
            raise ValueError("the fedspool source needs the option 'schema' (a Spark DDL string)")
        if _flag(self.options.get("withSeq")):
            ddl = f"{ddl}, `{SEQ_COLUMN}` BIGINT"
        if _flag(self.options.get("heartbeat")):
            ddl = f"{ddl}, `{HB_COLUMN}` BOOLEAN"
        return str(ddl)

    def streamReader(self, schema: StructType) -> SpoolStreamReader:
        return SpoolStreamReader(self.options, schema)


class SpoolStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        # Spark hands the options over case-insensitively (keys lower-cased): so do we.
        options = {k.lower(): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise ValueError("the fedspool source needs the option 'path' (a spool directory)")
        self.directory = Path(path)
        self.reader_id = options.get("reader") or None
        if self.reader_id is not None:
            fmt.reader_path(self.directory, self.reader_id)  # validate early
        self.with_seq = _flag(options.get("withseq"))
        self.heartbeat = _flag(options.get("heartbeat"))
        self.max_rows = int(options.get("maxrowsperbatch", DEFAULT_MAX_ROWS))
        self.num_partitions = max(1, int(options.get("numpartitions", DEFAULT_PARTITIONS)))
        self.starting = options.get("startingoffset", "earliest").strip().lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError(
                f"startingOffset must be 'earliest' or 'latest', not {self.starting!r}"
            )
        self.fsync = not _flag(options.get("nofsync"))
        self.bounded = not _flag(options.get("ignorehold"))
        self.named = _flag(options.get("nameoffsets"))
        self.stream = fmt.stream_name_of(self.directory)
        self.fetch = FetchEndpoint.from_options(options)
        self._tickets = None if self.fetch is None else Tickets(self.fetch)
        # Backpressure: while a reader of one of these (output) spools is more than
        # maxBacklog batches behind, plan no new data; the input waits on disk.
        hold = options.get("holdback") or ""
        self.hold_back = [Path(p) for p in hold.split(os.pathsep) if p]
        self.max_backlog = int(options.get("maxbacklog", "0") or 0)
        from pyspark.sql.pandas.types import to_arrow_schema

        # Exactly what Spark checks returned batches against (field order, tz, nullability).
        self.arrow_schema: pa.Schema = to_arrow_schema(schema, timezone="UTC")
        self._rows: dict[int, int] = {}  # row counts by offset (planner process only)
        self._target: int | None = None  # Trigger.AvailableNow's end

    # ----------------------------------------------------------------------- planning

    def initialOffset(self) -> SpoolOffset:
        present = fmt.list_offsets(self.directory)
        if self.starting == "latest":
            trimmed = fmt.trimmed_through(self.directory)
            last = present[-1] if present else trimmed
            return self._at(max(trimmed, _bounded(last, self._visible())))
        if present:
            return self._at(present[0] - 1)
        return self._at(fmt.trimmed_through(self.directory))

    def _at(self, offset: int) -> SpoolOffset:
        return {"offset": offset, "stream": self.stream} if self.named else {"offset": offset}

    def _visible(self) -> int | None:
        return fmt.read_watermark(self.directory) if self.bounded else None

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows > 0:
            return ReadMaxRows(self.max_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        present = fmt.list_offsets(self.directory)
        visible = self._visible()
        self._target = _bounded(present[-1], visible) if present else None

    def latestOffset(self, start: SpoolOffset, limit: ReadLimit) -> SpoolOffset:
        begin = int(start["offset"])
        if self.max_backlog > 0 and any(fmt.backlog(d) > self.max_backlog for d in self.hold_back):
            return self._at(begin)
        max_rows = max_files = max_bytes = None
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif isinstance(limit, ReadMaxFiles):
            max_files = limit.max_files
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        stop = _bounded(self._target, self._visible())
        end, rows, size = begin, 0, 0
        while stop is None or end < stop:
            path = fmt.offset_path(self.directory, end + 1)
            try:
                file_size = os.stat(path).st_size
            except FileNotFoundError:
                break
            file_rows = self._file_rows(end + 1)
            if end > begin and (
                (max_rows is not None and rows + file_rows > max_rows)
                or (max_bytes is not None and size + file_size > max_bytes)
                or (max_files is not None and end - begin >= max_files)
            ):
                break
            end, rows, size = end + 1, rows + file_rows, size + file_size
        if end == begin:
            self._check_not_trimmed(begin)
        if isinstance(limit, ReadMinRows) and rows < limit.min_rows:
            return self._at(begin)
        for offset in [o for o in self._rows if o <= begin]:
            del self._rows[offset]
        if self.reader_id is not None and end > begin:
            fmt.write_taken(self.directory, self.reader_id, end)  # for backpressure
        return self._at(end)

    def _check_not_trimmed(self, begin: int) -> None:
        # Nothing after `begin`: normal when idle, but if later files exist, the next one was
        # trimmed before this reader consumed it (a reader registered too late, or a stale
        # checkpoint). Stalling silently would hide data loss.
        present = fmt.list_offsets(self.directory)
        if present and present[-1] > begin + 1 and present[0] > begin + 1:
            raise fmt.TrimmedError(
                f"spool {self.directory}: offsets {begin + 1}..{present[0] - 1} were trimmed "
                f"before reader {self.reader_id!r} consumed them"
            )

    def _file_rows(self, offset: int) -> int:
        rows = self._rows.get(offset)
        if rows is None:
            rows = self._rows[offset] = fmt.file_rows(fmt.offset_path(self.directory, offset))
        return rows

    def reportLatestOffset(self) -> SpoolOffset | None:
        present = fmt.list_offsets(self.directory)
        if not present:
            return None
        return self._at(_bounded(present[-1], self._visible()))

    def partitions(self, start: SpoolOffset, end: SpoolOffset) -> Sequence[SpoolRange]:
        first, last = int(start["offset"]) + 1, int(end["offset"])
        if last < first:
            return []
        offsets = list(range(first, last + 1))
        rows = [self._file_rows(o) for o in offsets]
        total = sum(rows)
        parts = min(self.num_partitions, len(offsets), max(1, total // MIN_ROWS_PER_PARTITION))
        # Cut before the file whose middle crosses the next 1/parts share of the rows.
        ranges: list[SpoolRange] = []
        run_start, acc, share = first, 0, total / parts
        for offset, n in zip(offsets, rows, strict=True):
            crossing = acc + n / 2 > share * (len(ranges) + 1)
            if crossing and len(ranges) < parts - 1 and offset > run_start:
                ranges.append(SpoolRange(run_start, offset - 1))
                run_start = offset
            acc += n
        ranges.append(SpoolRange(run_start, last))
        if self._tickets is not None:  # each with a capability for its files
            mint = self._tickets.mint
            return [
                SpoolRange(r.first, r.last, mint(self.directory, r.first, r.last)) for r in ranges
            ]
        return ranges

    # ----------------------------------------------------------------------- reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpoolRange)
        target = self.arrow_schema
        hidden = {SEQ_COLUMN} if self.with_seq else set()
        hidden |= {HB_COLUMN} if self.heartbeat else set()
        names = [n for n in target.names if n not in hidden]
        for offset, table in self._tables(partition):
            meta = table.schema.metadata or {}
            if entry_mark(meta)[0] != STABLE:
                continue  # a tentative result or an undo: not an input of exact results
            beat = (META_HEARTBEAT in meta) if self.heartbeat else None
            row = 0
            for batch in table.to_batches():
                seq_row = row if self.with_seq else None
                yield _conform(batch, names, target, offset, seq_row, beat)
                row += batch.num_rows

    def _tables(self, partition: SpoolRange) -> Iterator[tuple[int, pa.Table]]:
        return stored_tables(self.directory, partition.first, partition.last, partition.ticket)

    def commit(self, end: SpoolOffset) -> None:
        if self.reader_id is not None:
            fmt.write_reader_offset(
                self.directory, self.reader_id, int(end["offset"]), fsync=self.fsync
            )

    def stop(self) -> None:
        self._rows.clear()


class Tickets:
    """Mints the tickets of a planner's partitions with the peer's fetch key, loaded from
    ``endpoint.key_path`` on first use (the planner runs on the peer's host). Pickled, it
    drops the key: executors get tickets, never the key that signs them."""

    def __init__(self, endpoint: FetchEndpoint) -> None:
        self.endpoint = endpoint
        self._key: FetchKey | None = None

    def mint(self, directory: Path, first: int, last: int) -> FetchTicket:
        """A ticket for files ``first..last`` of the spool in ``directory`` (absolute: the
        capability names the spool as the fetch server resolves it)."""
        if self._key is None:
            from peer.fetch.capability import FetchKey

            self._key = FetchKey.load(Path(self.endpoint.key_path))
        spool = str(directory)
        ttl_s = self.endpoint.ttl_s
        token = self._key.mint(spool, first, last, now=time.time(), ttl_s=ttl_s)
        return FetchTicket(self.endpoint.address, self.endpoint.pin, spool, token)

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "_key": None}


def stored_tables(
    directory: Path, first: int, last: int, ticket: FetchTicket | None
) -> Iterator[tuple[int, pa.Table]]:
    """Files ``first..last`` of a spool as stored, each ``(offset, table)``: opened in
    ``directory``, or, with a ``ticket``, fetched from the peer (an executor on another host).
    A file trimmed before it was read raises TrimmedError."""
    offsets = range(first, last + 1)
    if ticket is None:
        for offset in offsets:
            try:
                table = fmt.read_file(fmt.offset_path(directory, offset))
            except FileNotFoundError:
                raise _trimmed(directory, offset) from None
            yield offset, table
        return
    from peer.errors import NotFound
    from peer.fetch.client import SpoolFetcher

    with SpoolFetcher(ticket) as fetcher:
        for offset in offsets:
            try:
                data = fetcher.fetch(offset)
            except NotFound as exc:
                if exc.details.get("reason") == "trimmed":
                    raise _trimmed(directory, offset) from None
                raise
            yield offset, pa.ipc.open_file(pa.py_buffer(data)).read_all()


def _trimmed(directory: Path, offset: int) -> fmt.TrimmedError:
    return fmt.TrimmedError(f"spool {directory}: offset {offset} was trimmed before it was read")


@overload
def _bounded(end: int, visible: int | None) -> int: ...
@overload
def _bounded(end: None, visible: int | None) -> int | None: ...
def _bounded(end: int | None, visible: int | None) -> int | None:
    """``end`` capped at the watermark ``visible`` (None: no cap, or no end)."""
    if end is None:
        return visible
    return end if visible is None else min(end, visible)


def seq_column(offset: int, first_row: int, rows: int) -> pa.Array:
    """``__seq`` of ``rows`` tuples of spool file ``offset`` from row ``first_row`` on."""
    import numpy as np

    base = (offset << SEQ_SHIFT) + first_row
    return pa.array(np.arange(base, base + rows, dtype=np.int64))


def _conform(
    batch: pa.RecordBatch,
    names: list[str],
    target: pa.Schema,
    offset: int,
    seq_row: int | None,
    beat: bool | None = None,
) -> pa.RecordBatch:
    columns: list[Any] = []
    for name in names:
        column = batch.column(name)
        wanted = target.field(name).type
        columns.append(column if column.type == wanted else column.cast(wanted))
    if seq_row is not None:
        columns.append(seq_column(offset, seq_row, batch.num_rows))
    if beat is not None:
        columns.append(pa.array([beat] * batch.num_rows, pa.bool_()))
    return pa.RecordBatch.from_arrays(columns, schema=target)


# --------------------------------------------------------------------------- driver side


def register_sources(spark: SparkSession) -> None:
    """Make ``format("fedspool")`` known to this session."""
    spark.dataSource.register(SpoolDataSource)


def read_stream(
    spark: SparkSession,
    spool_dir: Path | str,
    ddl: str,
    reader_id: str,
    *,
    with_seq: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    num_partitions: int = DEFAULT_PARTITIONS,
    hold_back: list[Path] | None = None,
    max_backlog: int = 0,
    heartbeat: bool = False,
    fetch: FetchEndpoint | None = None,
    ignore_hold: bool = False,
    name_offsets: bool = False,
) -> DataFrame:
    """A streaming DataFrame over a spool; register ``reader_id`` on the spool first. With
    ``hold_back`` (the query's output spools) and ``max_backlog``, no new input is read
    while a reader of an output spool is more than ``max_backlog`` batches behind. With
    ``fetch`` (the peer's fetch server) the executors fetch the files from the peer."""
    remote = {} if fetch is None else fetch.to_options()
    if fetch is not None:  # the capability names the spool as the server will resolve it
        spool_dir = os.path.abspath(spool_dir)
    return (
        spark.readStream.format(SOURCE_NAME)
        .options(**remote)
        .option("path", str(spool_dir))
        .option("schema", ddl)
        .option("reader", reader_id)
        .option("withSeq", "true" if with_seq else "false")
        .option("maxRowsPerBatch", str(max_rows))
        .option("numPartitions", str(num_partitions))
        .option("holdBack", os.pathsep.join(str(p) for p in hold_back or []))
        .option("maxBacklog", str(max_backlog))
        .option("heartbeat", "true" if heartbeat else "false")
        .option("ignoreHold", "true" if ignore_hold else "false")
        .option("nameOffsets", "true" if name_offsets else "false")
        .load()
    )
