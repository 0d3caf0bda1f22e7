"""Hostile request content, refused by pure logic before the work it would cost (issue 12):
compressed Arrow bodies, query budgets, deep query graphs, names, contract parties, move
tars, catalog labels and refused-handshake logging. No sockets, no JVM."""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import contracts.contract as ct
from contracts.keys import KeyError_, check_name, generate
from overlay.identity import TrustStore, raw_public
from overlay.record_policy import record_refusal
from overlay.records import sign_record
from overlay.refusals import RefusalLog
from peer.errors import InvalidInput, QueryError, TupleError
from peer.model.fragments import fragment_query
from peer.model.ipc import declared_size
from peer.model.limits import ContentLimits, definition_size
from peer.model.plan import check_query
from peer.model.query import parse_query, topological_order
from peer.model.schema import parse_schema
from peer.model.tuples import batch_from_wire
from peer.move.package import extract
from peer.protocol.api import Push

TEXT = parse_schema({"name": "t", "fields": [{"name": "s", "type": "string"}]})
INTS = parse_schema({"name": "i", "fields": [{"name": "x", "type": "int"}]})


def ipc(table: pa.Table, codec: str | None = None, *, chunk: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(
        compression=None if codec is None else pa.Codec(codec, compression_level=None)
    )
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        for batch in table.to_batches(max_chunksize=chunk):
            writer.write(batch)
    return bytes(sink.getvalue())


def bomb(size: int, codec: str = "zstd") -> bytes:
    """One string of ``size`` zeros: a few KiB compressed."""
    return ipc(pa.table({"s": pa.array(["0" * size])}), codec)


# -- Arrow IPC: an uncompressed-size bound -----------------------------------------------------


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_push_that_inflates_past_the_limit_is_refused_naming_it(codec: str) -> None:
    body = bomb(8 << 20, codec)
    assert len(body) < 200_000
    with pytest.raises(
        TupleError, match=r"over the push limit of 4194304 bytes \(max_push_bytes\)"
    ):
        batch_from_wire(TEXT, {"arrow": body}, stream="t", max_bytes=4 << 20)
    # the same body under a larger limit decodes, value for value
    table = batch_from_wire(TEXT, {"arrow": body}, stream="t", max_bytes=16 << 20)
    assert table.column("s").to_pylist() == ["0" * (8 << 20)]


def test_declared_sizes_are_read_without_decoding_and_match_the_data() -> None:
    table = pa.table({"s": pa.array(["abc", None, "de"] * 1000)})
    for codec in (None, "zstd", "lz4"):
        size = declared_size(ipc(table, codec, chunk=700), max_bytes=1 << 30, max_rows=10**9)
        assert size.rows == 3000
        assert size.compressed == (codec is not None)
        # the buffers as written: never less than what pyarrow holds for the table
        assert table.nbytes <= size.bytes <= table.nbytes + 64 * 5
    # counting stops soon after a limit: the caller refuses without reading the rest
    early = declared_size(ipc(table, "zstd", chunk=10), max_bytes=100, max_rows=10**9)
    assert 100 < early.bytes < 400


def test_rows_are_bounded_before_decoding() -> None:
    body = ipc(pa.table({"x": pa.array(range(50), pa.int32())}), "zstd", chunk=10)
    with pytest.raises(TupleError, match="more than 20 tuples"):
        batch_from_wire(INTS, {"arrow": body}, max_rows=20)


@pytest.mark.parametrize("cut", [9, 40, -30, 0])
def test_a_truncated_or_damaged_body_is_refused_as_undecodable(cut: int) -> None:
    body = bomb(1000)
    damaged = body[:cut] if cut else body[:-24] + b"\xff" * 24
    with pytest.raises(TupleError, match=r"does not decode|tuples|push limit"):
        batch_from_wire(TEXT, {"arrow": damaged})


def test_a_compressed_buffer_declaring_a_negative_size_is_refused() -> None:
    body = bytearray(bomb(5000))
    at = body.rfind((5000).to_bytes(8, "little", signed=True))  # the data buffer's prefix
    assert at > 0
    body[at : at + 8] = (-7).to_bytes(8, "little", signed=True)
    with pytest.raises(TupleError, match="declares -7 bytes"):
        batch_from_wire(TEXT, {"arrow": bytes(body)})


# -- query budgets -----------------------------------------------------------------------------


def filter_box(outputs: int, expression: str = "x > 1") -> dict[str, Any]:
    params = {f"expression.{i}": expression for i in range(outputs)}
    return {
        "name": "f",
        "type": "filter",
        "inputs": ["i"],
        "outputs": [f"o{i}" for i in range(outputs)],
        "params": params,
    }


def test_a_query_sent_as_a_map_does_not_skip_the_size_limit() -> None:
    wide = " OR ".join(f"x = {i:09d}" for i in range(250))  # 3.2 KB, under 4 KiB
    query = {"name": "q", "boxes": [filter_box(1000, wide)]}
    with pytest.raises(QueryError, match=r"larger than 1048576 bytes \(as JSON text\)") as err:
        parse_query(query)
    assert err.value.details["limit"] == "max_query_bytes"
    with pytest.raises(QueryError, match="larger than 1048576"):
        parse_query(json.dumps(query))


def test_outputs_per_box_and_parameter_text_are_budgeted() -> None:
    with pytest.raises(QueryError, match="has 65 outputs, more than 64") as err:
        parse_query({"name": "q", "boxes": [filter_box(65)]})
    assert err.value.details == {
        "limit": "max_arrows_per_box",
        "max_arrows_per_box": 64,
        "query": "q",
        "box": "f",
    }
    wide = "x = 1" + " OR x = 1" * 400  # about 3.6 KB: 40 of them pass 128 KiB
    with pytest.raises(QueryError, match="more than 131072 bytes of text") as err:
        parse_query({"name": "q", "boxes": [filter_box(40, wide)]})
    assert err.value.details["limit"] == "max_expression_bytes"
    small = ContentLimits(max_boxes=2)
    chain = {"name": "q", "boxes": chain_boxes(3)}
    with pytest.raises(QueryError, match="more than 2 boxes"):
        parse_query(chain, limits=small)
    assert len(parse_query(chain).boxes) == 3


def test_definition_size_counts_a_map_as_its_json_text_and_stops_early() -> None:
    value = {"name": "q", "boxes": [{"a": [1, 2, "xyz"], "b": None}]}
    assert abs(definition_size(value, 10_000) - len(json.dumps(value, separators=(",", ":")))) < 8
    deep: Any = "leaf"
    for _ in range(100_000):  # far deeper than Python's recursion limit
        deep = [deep]
    assert definition_size(deep, 1 << 30) > 100_000
    huge: list[Any] = [[]] * 5_000_000
    assert definition_size(huge, 100) == 5_000_002  # its length counted; no element walked


def chain_boxes(count: int) -> list[dict[str, Any]]:
    boxes = [
        {
            "name": f"b{i}",
            "type": "filter",
            "inputs": ["i" if i == 0 else f"s{i}"],
            "outputs": [f"s{i + 1}"],
            "params": {"expression.0": "x > 1"},
        }
        for i in range(count)
    ]
    boxes.reverse()  # declared downstream first: the deepest walk
    return boxes


def test_a_thousand_box_chain_declared_in_reverse_is_checked_and_placed() -> None:
    query = parse_query({"name": "q", "boxes": chain_boxes(1000)})
    order = topological_order(query)
    assert [b.name for b in order] == [f"b{i}" for i in range(1000)]
    checked = check_query(query, {"i": INTS})
    assert checked.inputs == ("i",) and checked.outputs == ("s1000",)
    (fragment,) = fragment_query(query, default=lambda s: "A", resolve=lambda n, s: "A")
    assert [b.name for b in fragment.boxes] == [f"b{i}" for i in range(1000)]


def test_a_cycle_is_still_refused_by_both_sorts() -> None:
    boxes = [
        {"name": "a", "type": "union", "inputs": ["i", "y"], "outputs": ["x"]},
        {"name": "b", "type": "map", "inputs": ["x"], "outputs": ["y"], "params": {}},
    ]
    with pytest.raises(QueryError, match=r"cycle: (a -> b -> a|b -> a -> b)"):
        parse_query({"name": "q", "boxes": boxes})


# -- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nl\n", "globex\n", "a\x00b", "tab\t", "é"])
def test_participant_names_are_matched_whole(name: str) -> None:
    with pytest.raises(KeyError_):
        check_name(name)


def test_keygen_refuses_a_newline_and_a_dangling_symlink(tmp_path: Path) -> None:
    with pytest.raises(KeyError_, match="participant name"):
        generate("nl\n", tmp_path)
    assert list(tmp_path.iterdir()) == []
    target = tmp_path / "elsewhere" / "stolen.key"
    (tmp_path / "acme.key").symlink_to(target)
    with pytest.raises(KeyError_, match="symbolic link"):
        generate("acme", tmp_path)
    with pytest.raises(KeyError_, match="symbolic link"):
        generate("acme", tmp_path, overwrite=True)
    assert not target.exists() and not (tmp_path / "acme.pub").exists()


def test_a_producer_id_with_a_control_character_is_refused() -> None:
    frame = {"type": "push", "id": 1, "stream": "s", "columns": {"x": [1]}, "producer": "p\n"}
    with pytest.raises(InvalidInput, match="producer"):
        Push.from_wire(frame)
    assert Push.from_wire({**frame, "producer": "p-1 ok"}).producer == "p-1 ok"


def keys() -> dict[str, Ed25519PrivateKey]:
    return {n: Ed25519PrivateKey.generate() for n in ("acme", "globex", "mallory")}


def signed_contract(a: str, b: str, ka: Ed25519PrivateKey, kb: Ed25519PrivateKey) -> ct.Contract:
    made = ct.create(a, raw_public(ka.public_key()), b, raw_public(kb.public_key()), price=1.0)
    return ct.sign(ct.sign(made, ka), kb)


def test_a_contract_party_named_with_a_trailing_newline_is_malformed() -> None:
    k = keys()
    text = ct.dumps(signed_contract("acme", "globex", k["acme"], k["mallory"]))
    hostile = text.replace('name = "globex"', 'name = "globex\\n"')
    assert hostile != text
    with pytest.raises(ct.ContractError) as err:
        ct.loads(hostile.encode())
    assert err.value.reason == "malformed"


def test_the_contract_book_checks_parties_against_the_trust_store(tmp_path: Path) -> None:
    from contracts.book import ContractBook

    k = keys()
    trust = TrustStore()
    for name in ("acme", "globex"):
        trust.add(name, k[name].public_key())
    (tmp_path / "c").mkdir()
    # mallory's key under globex's name; globex's key under another name
    ct.dump(signed_contract("acme", "globex", k["acme"], k["mallory"]), tmp_path / "c" / "1.toml")
    ct.dump(signed_contract("acme", "globex2", k["acme"], k["globex"]), tmp_path / "c" / "2.toml")
    ct.dump(signed_contract("acme", "globex", k["acme"], k["globex"]), tmp_path / "c" / "3.toml")
    book = ContractBook.load_dir(
        tmp_path / "c", "acme", datetime.now(UTC), known_keys=trust.participants()
    )
    assert [r.path.name for r in book.refused] == ["1.toml", "2.toml"]
    assert {r.error.reason for r in book.refused} == {"wrong-key"}
    assert "participant globex's known key" in book.refused[1].reason or "globex" in str(
        book.refused[1].error
    )
    assert book.partners() == ["globex"]


# -- move tars ---------------------------------------------------------------------------------


def zero_tar(path: Path, size: int, mode: str) -> None:
    info = tarfile.TarInfo("tree/zeros")
    info.size = size

    class Zeros(io.RawIOBase):
        left = size

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        tar.addfile(info, io.BufferedReader(Zeros()))


def test_a_compressed_move_tar_is_refused_before_it_inflates(tmp_path: Path) -> None:
    zero_tar(tmp_path / "bomb.tar", 32 << 20, "w:gz")
    assert os.path.getsize(tmp_path / "bomb.tar") < 100_000
    with pytest.raises(InvalidInput, match="compressed"):
        extract(tmp_path / "bomb.tar", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_move_tar_declaring_more_than_it_holds_is_refused_while_read(tmp_path: Path) -> None:
    header = tarfile.TarInfo("tree/big")
    header.size = 1 << 30
    (tmp_path / "lie.tar").write_bytes(header.tobuf() + bytes(1024))
    with pytest.raises(InvalidInput, match="more than its own 1536 bytes"):
        extract(tmp_path / "lie.tar", tmp_path / "out")
    assert not (tmp_path / "out" / "tree" / "big").exists()
    zero_tar(tmp_path / "ok.tar", 5000, "w")
    extract(tmp_path / "ok.tar", tmp_path / "out")
    assert (tmp_path / "out" / "tree" / "zeros").read_bytes() == bytes(5000)


# -- catalog labels ----------------------------------------------------------------------------


def record(key: str, value: dict[str, Any], signer: Ed25519PrivateKey) -> Any:
    return sign_record(key, msgpack.packb(value), signer, 1, 2**40)


def test_catalog_labels_are_bound_to_the_signing_key() -> None:
    k = keys()
    trust = TrustStore()
    for name in ("acme", "globex"):
        trust.add(name, k[name].public_key())
    pk = {n: raw_public(key.public_key()) for n, key in k.items()}
    ok = record("participant:acme", {"name": "acme", "pk": pk["acme"]}, k["acme"])
    assert record_refusal(trust, ok) is None
    claim = record("participant:globex", {"name": "globex", "pk": pk["acme"]}, k["acme"])
    assert "signed by participant 'acme'" in str(record_refusal(trust, claim))
    renamed = record("participant:acme", {"name": "globex", "pk": pk["acme"]}, k["acme"])
    assert record_refusal(trust, renamed) is not None
    stream = {"schema": {"name": "s"}, "derived_from": None, "owner": "globex"}
    assert "claims owner 'globex'" in str(
        record_refusal(trust, record("stream:s", stream, k["acme"]))
    )
    assert record_refusal(trust, record("stream:s", {**stream, "owner": "acme"}, k["acme"])) is None
    outsider = record("stream:s", {**stream, "owner": "mallory"}, k["mallory"])
    assert "not a participant this peer trusts" in str(record_refusal(trust, outsider))


# -- refused handshakes ------------------------------------------------------------------------


def test_refused_handshakes_are_logged_a_few_at_a_time_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = RefusalLog(logging.getLogger("test.refusals"), burst=3, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        logged = [refusals.warning("refused %s", i) for i in range(10_000)]
        assert sum(logged) == 3 and refusals.suppressed == 9_997
        now[0] = 61.0
        assert refusals.warning("refused %s", "late")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert lines[-1] == "refused late (and 9997 more refused, not logged, in the last 60 s)"
    assert refusals.total == 10_001
