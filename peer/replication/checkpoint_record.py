"""The entries of a replicated fragment's checkpoint stream ``~ckpt.<fragment>``: one
:class:`FragmentRecord` per entry, a one-row table holding the fragment's definition,
incarnation, status, the batch it was taken before, and its Spark checkpoint as a bundle
(:mod:`peer.storage.bundle`), msgpack'd and base64'd (:mod:`peer.replication.fragment_failover`
writes and takes them over; :mod:`peer.replication.standby` starts from them and reads the
watermark of a batch in them). A record read from a replica is untrusted input: anything wrong
is a ``ValueError`` that names it."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pyarrow as pa

from peer.model.schema import Field, Schema, make_schema

__all__ = ["CKPT_SCHEMA", "FragmentRecord"]

CKPT_SCHEMA: Schema = make_schema(
    "fedstream_checkpoint", (Field("batch", "long"), Field("record", "string"))
)


@dataclass(frozen=True)
class FragmentRecord:
    """One entry of a fragment's checkpoint stream."""

    fragment: str
    definition: dict[str, Any]
    incarnation: str
    status: str
    batch: int
    checkpoint: bytes
    inputs: tuple[str, ...] = field(default=())
    outputs: tuple[str, ...] = field(default=())

    def to_table(self) -> pa.Table:
        body = msgpack.packb(
            {
                "fragment": self.fragment,
                "definition": self.definition,
                "incarnation": self.incarnation,
                "status": self.status,
                "batch": self.batch,
                "checkpoint": self.checkpoint,
                "inputs": list(self.inputs),
                "outputs": list(self.outputs),
            },
            use_bin_type=True,
        )
        text = base64.b64encode(body).decode("ascii")
        return pa.table(
            {"batch": pa.array([self.batch], pa.int64()), "record": pa.array([text], pa.string())}
        )

    @staticmethod
    def from_table(table: pa.Table) -> FragmentRecord:
        """The record of one checkpoint-stream batch; ValueError names what is malformed."""
        if table.num_rows != 1 or "record" not in table.column_names:
            raise ValueError("a checkpoint record is one row with a 'record' column")
        try:
            raw = base64.b64decode(str(table.column("record")[0].as_py()), validate=True)
            data = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"checkpoint record is not base64 msgpack: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("checkpoint record is not a map")
        text = {k: data.get(k) for k in ("fragment", "incarnation", "status")}
        for key, value in text.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"checkpoint record: {key} must be a non-empty string")
        batch, checkpoint = data.get("batch"), data.get("checkpoint")
        definition = data.get("definition")
        if isinstance(batch, bool) or not isinstance(batch, int) or not -(2**63) <= batch < 2**63:
            raise ValueError("checkpoint record: batch must be an int64")
        if not isinstance(checkpoint, bytes) or not isinstance(definition, dict):
            raise ValueError("checkpoint record: checkpoint must be bytes, definition a map")
        if not all(isinstance(k, str) for k in definition):
            raise ValueError("checkpoint record: definition keys must be strings")
        names: dict[str, tuple[str, ...]] = {}
        for key in ("inputs", "outputs"):
            value = data.get(key)
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise ValueError(f"checkpoint record: {key} must be a list of names")
            names[key] = tuple(value)
        return FragmentRecord(
            str(text["fragment"]),
            definition,
            str(text["incarnation"]),
            str(text["status"]),
            batch,
            checkpoint,
            names["inputs"],
            names["outputs"],
        )
