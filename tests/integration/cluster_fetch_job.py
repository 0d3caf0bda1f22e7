"""A driver for the cluster test of refused read capabilities, run as its own process:
``python -m tests.integration.cluster_fetch_job MASTER DRIVER_HOST TICKETS``.

``TICKETS`` is a file of pickled ``{name: (spool directory, first, last, FetchTicket)}`` made by
the test (with the fetch server's key, another key, or an expired lifetime). It builds the
peer's session for ``MASTER`` (the code shipped, the executors checked) and reads each ticket's
files in one Spark task on the executors through ``peer.engine.source.stored_tables``, exactly
as the ``fedspool`` source's ``read`` does there. A task never fails: it reports the executor's
host, the rows it read before any error, and the error's type and message. Prints one JSON
object ``{name: {"host", "rows", "error_type", "error"}}``.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any


def main(master: str, driver_host: str, tickets_path: str) -> None:
    from peer.engine.cluster_conf import driver_conf
    from peer.engine.session import build_session

    tickets = pickle.loads(Path(tickets_path).read_bytes())
    conf = {**driver_conf(master, driver_host, None), "spark.executor.memory": "512m"}
    spark = build_session(master, app_name="fedstream-fetch-refusals", conf=conf)

    def read(item: tuple[str, tuple[str, int, int, Any]]) -> tuple[str, dict[str, Any]]:
        # on an executor, which imports only the code the driver shipped
        import socket

        from peer.engine.source import stored_tables

        name, (directory, first, last, ticket) = item
        rows: list[int] = []
        error_type = error = None
        try:
            for _, table in stored_tables(Path(directory), first, last, ticket):
                rows.extend(table.column("a").to_pylist())
        except Exception as exc:
            error_type, error = type(exc).__name__, str(exc)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # no packet is sent
            sock.connect((driver_host, 9))
            host = str(sock.getsockname()[0])  # this executor's address toward the driver
        return name, {"host": host, "rows": rows, "error_type": error_type, "error": error}

    items = sorted(tickets.items())
    found = dict(spark.sparkContext.parallelize(items, len(items)).map(read).collect())
    print(json.dumps(found))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
