"""A driver for the cluster tests, run as its own process (a process has one SparkContext, and
the test process's is local): ``python -m tests.integration.cluster_job MASTER DRIVER_HOST
CHECKPOINT WINDOWS``.

It builds the peer's session for ``MASTER`` (driver bound to ``DRIVER_HOST``, the code
shipped, the executors checked) and runs a windowed aggregate over Spark's deterministic
``rate-micro-batch`` source (no spool: input comes from the executors themselves), its state in
``CHECKPOINT``, until ``WINDOWS`` windows were emitted through ``foreachBatch``. Prints one
JSON object: the rows, and the hosts of the executors that ran.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

ROWS_PER_SECOND = 20  # event time: value // 20 seconds
WINDOW_S = 5
GROUPS = 3


def main(master: str, driver_host: str, checkpoint: str, windows: int) -> None:
    from pyspark.sql import functions as F

    from peer.engine.cluster_conf import driver_conf
    from peer.engine.session import build_session

    conf = {**driver_conf(master, driver_host, None), "spark.executor.memory": "512m"}
    spark = build_session(master, app_name="fedstream-cluster-test", conf=conf)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        got = [r.asDict() for r in df.collect()]
        with lock:
            rows.extend(got)

    frame = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 400)
        .option("numPartitions", 2)
        .option("startTimestamp", 0)
        .option("advanceMillisPerBatch", 1000)
        .load()
        .withColumn("ts", F.timestamp_seconds(F.col("value") / ROWS_PER_SECOND).cast("timestamp"))
        .withColumn("grp", F.col("value") % GROUPS)
        .withWatermark("ts", "0 seconds")
        .groupBy(F.window("ts", f"{WINDOW_S} seconds"), "grp")
        .agg(F.count("*").alias("n"), F.sum("value").alias("total"))
        .select(F.unix_seconds(F.col("window.start")).alias("start"), "grp", "n", "total")
    )
    query = (
        frame.writeStream.option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime="0 seconds")
        .foreachBatch(sink)
        .start()
    )
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        with lock:
            starts = {r["start"] for r in rows}
        if len(starts) >= windows or query.exception() is not None:
            break
        time.sleep(0.5)
    error = query.exception()
    query.stop()
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    hosts = sorted({info.host() for info in infos} - {driver_host})
    print(json.dumps({"rows": rows, "executors": hosts, "error": str(error) if error else None}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
