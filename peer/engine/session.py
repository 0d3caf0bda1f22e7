"""Building the one Spark session a peer (or a test process) uses.

Settings follow the measurements in shared/notes/spark.md: few shuffle partitions (frozen into
stateful checkpoints, so they must be small before the first start), the RocksDB state store,
join state format 4, no UI, and Python workers on this very interpreter so that the spool
data source finds pyarrow and this package.

On a cluster master (``peer.engine.cluster_conf``) the driver binds the address its caller
gives in ``conf`` instead of loopback, the peer's executor-side modules are shipped to the
executors (``peer.engine.shipping``) and, unless ``check`` is off, the executors are checked
to run them with this Python and pyarrow before any query starts.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from peer.engine.cluster_conf import is_cluster
from peer.engine.java import find_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.join.stateFormatVersion": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    # Recovery needs the newest batch only; fewer old ones make checkpoints that travel (moves,
    # replicated fragments: peer.replication.fragment_failover) smaller.
    "spark.sql.streaming.minBatchesToRetain": "10",
    # Every micro-batch writes its offset-log and commit-log entries through Hadoop. Without
    # Hadoop's native library (the pip wheel has none), the default FileContext manager made a
    # plain PySpark process here spawn `readlink` and `chmod` from the JVM (about 2.5 per batch,
    # strace): ~30 ms per log entry, a stateless batch 150 ms instead of 104. The FileSystem
    # manager spawns about one `chmod` per batch. Renames stay POSIX rename(2), atomic as
    # before; neither manager fsyncs. `peer join`'s own JVM was not seen spawning `readlink`
    # even before (why was not found): the benchmarks' plain Spark references, which use this
    # session too, were the ones paying it (docs/benchmarks.md). The raw local file system
    # would drop the .crc side files as well, but the RocksDB state store refuses it.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.adaptive.enabled": "false",
    # A box's output folded several times re-plans the boxes before it; a reused shuffle of a
    # stateful box would leave the other copies without a watermark (they never emit).
    "spark.sql.exchange.reuse": "false",
    # A runtime error (division by zero, overflow) must not kill a long-running streaming
    # query: outside ANSI mode Spark yields NULL, as Aurora's expressions did.
    "spark.sql.ansi.enabled": "false",
}


def build_session(
    master: str = "local[*]",
    app_name: str = "fedstream-peer",
    conf: dict[str, str] | None = None,
    warehouse_dir: str | None = None,
    *,
    ship_dir: Path | None = None,
    check: bool = True,
) -> SparkSession:
    """Start (or return) this process's Spark session. Blocking: call off the event loop.
    On a cluster master the executors' code is written to ``ship_dir`` (default: a fresh
    temporary directory) and shipped; ``check`` runs the executor check."""
    find_java()  # fail with the actionable message, not a py4j trace
    cluster = is_cluster(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = dict(DEFAULT_CONF)
    if cluster:
        # Executors on other hosts connect back to the driver: it binds what the caller
        # says (peer.engine.cluster_conf.driver_conf), not loopback.
        del settings["spark.driver.bindAddress"], settings["spark.driver.host"]
        bind = (conf or {}).get("spark.driver.bindAddress")
        if bind and bind not in ("0.0.0.0", "::"):
            os.environ["SPARK_LOCAL_IP"] = bind
    else:
        # Without it Spark warns on every start that the host name resolves to loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    if warehouse_dir:
        settings["spark.sql.warehouse.dir"] = warehouse_dir
    log4j = Path(__file__).with_name("log4j2.properties")
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if cluster:
        from peer.engine import shipping

        shipping.ship(spark, ship_dir or Path(tempfile.mkdtemp(prefix="fedstream-ship-")))
        if check:
            try:
                shipping.check_executors(spark)
            except BaseException:
                spark.stop()
                raise
    log.info("spark session ready: master=%s version=%s", master, spark.version)
    return spark
