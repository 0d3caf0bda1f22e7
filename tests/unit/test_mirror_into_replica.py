"""A mirror into a stream this peer also replicates (peer.site.LocalSite.append_mirrored).

With high availability by default, a fragment's peer is often one of the replicas of the
stream it reads from another peer: the replication writes the primary's files at the
primary's offsets into the local spool, and the host's mirror sends the same batches. The
mirror must not write them a second time (the log would hold every batch twice and its
offsets would drift from the replicas'); it uncovers what the replication wrote, since it
carries acknowledged batches only, tagged with the host's offsets.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from peer.errors import Unavailable
from peer.model.schema import parse_schema
from peer.model.tentative import STABLE
from peer.replication.appenders import Appenders
from peer.site import LocalSite, SiteConfig

KV = {"name": "kv", "fields": [{"name": "k", "type": "int"}]}


def body(*values: int) -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"k": pa.array(values, pa.int32())})
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


async def refuse(_body: bytes, _rows: int, _producer: str | None, _seq: int | None) -> Any:
    raise Unavailable("not the primary")


def test_a_mirror_into_a_replicated_copy_uncovers_it_and_writes_nothing(tmp_path: Path) -> None:
    logs = Appenders()

    async def go() -> None:
        site = LocalSite(SiteConfig(data_dir=tmp_path), logs=logs)
        try:
            schema = parse_schema(KV)
            await site.add_schema(schema)
            await site.add_replica("r", schema, "ab" * 20)  # a fragment here reads it
            spool = site.spools.get("r")
            # the replication's copy: the primary's batches at its offsets, held from readers
            for value in (1, 2, 3):
                spool.append(pa.table({"k": pa.array([value], pa.int32())}))
            spool.hold(-1)
            logs.register("r", refuse, lambda: None)
            assert spool.latest == -1

            reply = await site.append_mirrored(
                "r", "m:host:r", ((0, body(1), STABLE), (1, body(2), STABLE))
            )
            assert (reply.last, reply.kept) == (1, 0)
            assert spool.log_end == 2  # nothing written twice
            assert spool.latest == 1  # acknowledged, so readable
            assert [t.column("k").to_pylist() for _, t in spool.read(-1, spool.latest)] == [
                [1],
                [2],
            ]

            # ahead of the replication here: what it holds is uncovered, the rest resent
            with pytest.raises(Unavailable, match="holds offsets through 2"):
                await site.append_mirrored(
                    "r", "m:host:r", ((2, body(3), STABLE), (3, body(4), STABLE))
                )
            assert (spool.log_end, spool.latest) == (2, 2)

            # a replay of older batches never lowers what readers see
            await site.append_mirrored("r", "m:host:r", ((0, body(1), STABLE),))
            assert (spool.log_end, spool.latest) == (2, 2)

            # not replicated here (any more): mirrored batches are appended as before
            logs.remove("r")
            await site.append_mirrored("r", "m:host:r", ((3, body(4), STABLE),))
            assert spool.log_end == 3
        finally:
            await site.close()

    asyncio.run(go())
