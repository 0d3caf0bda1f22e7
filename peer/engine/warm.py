"""Warming a peer's own Spark session up before a fragment needs it.

A fresh JVM runs its first streaming query several times slower than the next ones: classes
load, code is generated, the Python workers of the spool source and py4j's callback server
start, RocksDB's native library loads. Measured on 2 cores (one ``peer join``, the keyed
10 s window; load average 5.5): submit to first result 14.3 s for the first query, 7.7 s for
the second, 4.9 s for the third. When the first query a peer runs is a fragment it takes over
from a dead peer (peer.replication.fragment_failover) or one moved to it, that cold start is all
downtime.

:func:`warm_up` runs, once, in the background after the peer's own session starts, a small
query along the same path as a fragment: the spool source, a filter, an event-time tumbling
aggregate on the RocksDB state store, a ``foreachBatch`` sink. It reads a spool of its own in
the checkpoint directory (never the catalog) and leaves nothing behind. A session adopted
from elsewhere (tests share one) is not warmed: whoever started it did.

A real query that starts meanwhile (a fragment taken over seconds after the peer came back)
ends the warm-up: on 2 cores the two competed, and the taken-over fragment's first result came
only after the warm-up's 13.7 s. What the warm-up loaded by then stays loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from peer.model.plan import check_query
from peer.model.query import parse_query
from peer.model.schema import parse_schema, spark_ddl, to_arrow_schema
from peer.storage.spool import Spool
from peer.timing import MONOTONIC

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from peer.engine.runner import Engine

log = logging.getLogger(__name__)

NAME = "warm_up"
SCHEMA = {"name": NAME, "fields": [{"name": "k", "type": "int"}, {"name": "t", "type": "long"}]}
QUERY = {
    "name": NAME,
    "boxes": [
        {
            "name": "keep",
            "type": "filter",
            "inputs": ["warm_in"],
            "outputs": ["warm_kept"],
            "params": {"expression.0": "k >= 0"},
        },
        {
            "name": "per_key",
            "type": "aggregate",
            "inputs": ["warm_kept"],
            "outputs": ["warm_out"],
            "params": {
                "aggregate-function.0": "count()",
                "aggregate-function-output-name.0": "n",
                "window-size": "1",
                "advance": "1",
                "order-on-field": "t",
                "group-by": "k",
            },
        },
    ],
}
BATCHES = 3  # each closes the window of the one before: the aggregate emits


async def warm_up(
    engine: Engine, *, timeout_s: float = 120.0, clock: Callable[[], float] = MONOTONIC
) -> float | None:
    """Run the warm-up query until it emitted a window, a query of the peer's own started
    (``engine.serving``) or ``timeout_s`` passed; the seconds it took, None if it did not
    finish (logged; nothing else depends on it)."""
    from peer.engine.compile import compile_query
    from peer.engine.source import read_stream

    spark = engine.spark
    if spark is None:
        return None
    began = clock()
    root = engine.checkpoint_root / "~warm-up"
    schema = parse_schema(SCHEMA)
    checked = check_query(parse_query(QUERY), {"warm_in": schema})
    emitted = asyncio.Event()
    done = threading.Event()  # the same, for Spark's callback thread
    loop = asyncio.get_running_loop()
    handle: Any = None

    def start() -> Any:
        shutil.rmtree(root, ignore_errors=True)
        spool = Spool(root / "warm_in", to_arrow_schema(schema), fsync=False, name="warm_in")
        for b in range(BATCHES):
            spool.append(pa.table({"k": pa.array([0, 1], pa.int32()), "t": [b, b]}))
        spool.register_reader(NAME)
        spool.pause_reader(NAME, False)

        def source(_stream: str, in_schema: Any) -> DataFrame:
            ddl = spark_ddl(in_schema)
            return read_stream(spark, spool.directory, ddl, NAME, fetch=engine.fetch)

        def sink(df: DataFrame, _batch_id: int) -> None:
            # Once it has emitted, later batches do no work: the stop that follows would
            # interrupt a collect under way (a py4j error in the log, and nothing gained).
            if done.is_set():
                return
            if df.toArrow().num_rows:
                done.set()
                loop.call_soon_threadsafe(emitted.set)

        frame = compile_query(checked, source).frame
        return (
            frame.writeStream.queryName(f"~{NAME}")
            .option("checkpointLocation", str(root / "checkpoint"))
            .outputMode("append")
            .foreachBatch(sink)
            .start()
        )

    def stop() -> None:
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.stop()
        shutil.rmtree(root, ignore_errors=True)

    if engine.serving.is_set():
        return None  # a query runs already: it warms the session itself
    try:
        handle = await engine.call(start)
        async with asyncio.timeout(timeout_s):
            waits = [asyncio.ensure_future(e.wait()) for e in (emitted, engine.serving)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        if not emitted.is_set():
            log.info("spark warm-up yields to a query after %.1f s", clock() - began)
            return None
    except Exception as exc:  # a warm-up is a nicety: the peer runs on without it
        log.warning("spark warm-up did not finish: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(engine.call(stop))
    took = clock() - began
    log.info("spark warmed up in %.1f s", took)
    return took
