"""peer.move's receiving side against hostile input: manifests, chunks, senders, tars.

No JVM: a fake peer with a real contract book, real spools and a real local catalog.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import tarfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import contract as ct
from contracts.book import ContractBook
from contracts.keys import generate, load_private
from overlay.identity import raw_public
from peer.errors import Conflict, FedstreamError, InvalidInput, NotFound, Unauthorized
from peer.move import SIBLING, Mover
from peer.move.journal import Outcome
from peer.move.package import check_manifest as _check_manifest
from peer.move.package import extract as _extract
from peer.site import LocalSite
from peer.storage.catalog import LocalCatalog
from peer.storage.spool import SpoolSet

SCHEMA = {"name": "tk", "fields": [{"name": "k", "type": "int"}, {"name": "t", "type": "long"}]}
DEFINITION = {
    "name": "frag",
    "boxes": [
        {
            "name": "keep",
            "type": "filter",
            "inputs": ["src"],
            "outputs": ["out"],
            "params": {"expression.0": "k > 0"},
        }
    ],
}


def manifest(contract_id: str = "c" * 32, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "fragment": "frag",
        "definition": DEFINITION,
        "incarnation": "abcd1234",
        "epoch": 1,
        "box_types": ["filter"],
        "inputs": {"src": {"dir": "in0", "mode": "copy", "schema": SCHEMA, "source": "00" * 20}},
        "outputs": {"out": {"dir": "out0", "schema": SCHEMA}},
        "contract": contract_id,
        "load": 0.3,
        "price": 2.0,
        "from_node": "11" * 20,
    }
    base.update(changes)
    return base


def test_a_good_manifest_passes() -> None:
    assert _check_manifest(manifest())["fragment"] == "frag"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"id": "../../etc"}, "id"),
        ({"id": True}, "id"),
        ({"load": float("nan")}, "load"),
        ({"price": -1.0}, "price"),
        ({"fragment": "other"}, "definition"),
        ({"box_types": ["aggregate"]}, "box_types"),
        (
            {"inputs": {"src": {"dir": "../x", "mode": "copy", "schema": SCHEMA, "source": "0"}}},
            "dir",
        ),
        ({"inputs": {"src": {"dir": "in0", "mode": "copy", "schema": SCHEMA}}}, "source"),
        (
            {"inputs": {"src": {"dir": "in0", "mode": "move", "schema": SCHEMA, "source": "0"}}},
            "mode",
        ),
        ({"outputs": ["out"]}, "outputs"),
        ({"contract": 5}, "contract"),
        ({"epoch": 0}, "epoch"),
        ({"epoch": "1"}, "epoch"),
        ({"lane": "yes"}, "lane"),
    ],
)
def test_a_bad_manifest_is_refused_with_a_reason(change: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        _check_manifest(manifest(**change))
    assert words in err.value.message


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )
)
def test_garbage_manifests_raise_invalid_input_only(junk: Any) -> None:
    with pytest.raises(InvalidInput):
        _check_manifest(junk)


@settings(max_examples=100)
@given(st.dictionaries(st.sampled_from(sorted(manifest())), st.none() | st.integers()))
def test_manifests_with_fields_replaced_never_pass_unchecked(junk: dict[str, Any]) -> None:
    bad = {**manifest(), **junk}
    try:
        _check_manifest(bad)
    except InvalidInput:
        return
    # what passed must still be well-typed where it matters
    assert isinstance(bad["id"], str) and isinstance(bad["inputs"], dict)


def test_a_tar_with_a_path_out_of_its_directory_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        info = tarfile.TarInfo("../../escaped")
        data = b"boom"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    where = tmp_path / "in"
    where.mkdir()
    with pytest.raises(InvalidInput, match="member refused"):
        _extract(evil, where)
    assert not (tmp_path.parent / "escaped").exists()


# -- the receiving Mover with a fake peer ---------------------------------------------------


@pytest.fixture
def receiver(tmp_path: Path) -> tuple[Mover, str]:
    privs = {}
    for name in ("alpha", "beta"):
        key, _ = generate(name, tmp_path / "keys")
        privs[name] = load_private(key)
    made = ct.create(
        "alpha",
        raw_public(privs["alpha"].public_key()),
        "beta",
        raw_public(privs["beta"].public_key()),
        price=2.0,
        b_accepts=["filter", "map"],
        days=1,
    )
    (tmp_path / "contracts").mkdir()
    ct.dump(
        ct.sign(ct.sign(made, privs["alpha"]), privs["beta"]), tmp_path / "contracts" / "ab.toml"
    )
    from datetime import UTC, datetime

    book = ContractBook.load_dir(
        tmp_path / "contracts",
        "beta",
        datetime.now(UTC),
        known_keys={"beta": raw_public(privs["beta"].public_key())},
    )
    assert len(book.contracts) == 1
    site = SimpleNamespace(
        data_dir=tmp_path / "data",
        engine=object(),
        catalog=LocalCatalog(tmp_path / "catalog.sqlite"),
        spools=SpoolSet(tmp_path / "spool"),
    )
    site.drop_streams = functools.partial(LocalSite.drop_streams, site)  # type: ignore[arg-type]
    site.streams_read = functools.partial(LocalSite.streams_read, site)  # type: ignore[arg-type]
    fed = SimpleNamespace(
        hosting=SimpleNamespace(hosted=set()), router=SimpleNamespace(participant="beta")
    )
    return Mover(site, fed, book), made.id  # type: ignore[arg-type]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_partner_under_contract_may_begin_a_move(receiver: tuple[Mover, str]) -> None:
    mover, cid = receiver
    reply = run(mover.handle({"op": "move_begin", "manifest": manifest(cid)}, "alpha"))
    assert reply["ready"] and mover.busy


def test_no_contract_no_move(receiver: tuple[Mover, str]) -> None:
    mover, cid = receiver
    with pytest.raises(Unauthorized):
        run(mover.handle({"op": "move_begin", "manifest": manifest(cid)}, "gamma"))
    with pytest.raises(Unauthorized):  # a contract id we do not hold
        run(mover.handle({"op": "move_begin", "manifest": manifest("d" * 32)}, "alpha"))
    assert not mover.busy


def test_a_peer_of_its_own_participant_needs_no_contract(receiver: tuple[Mover, str]) -> None:
    """Inside one participant load moves without contracts (issue 28); another participant
    naming no contract is refused and nothing starts."""
    mover, _cid = receiver
    with pytest.raises(Unauthorized, match="needs a contract"):
        run(mover.handle({"op": "move_begin", "manifest": manifest(SIBLING)}, "alpha"))
    assert not mover.busy
    reply = run(mover.handle({"op": "move_begin", "manifest": manifest(SIBLING)}, "beta"))
    assert reply["ready"] and mover.busy


def test_a_box_kind_the_contract_does_not_cover_is_refused(receiver: tuple[Mover, str]) -> None:
    mover, cid = receiver
    agg = {
        "name": "frag",
        "boxes": [
            {
                "name": "agg",
                "type": "aggregate",
                "inputs": ["src"],
                "outputs": ["out"],
                "params": {
                    "aggregate-function.0": "count()",
                    "aggregate-function-output-name.0": "n",
                    "window-size": "10",
                    "advance": "10",
                    "order-on-field": "t",
                },
            }
        ],
    }
    bad = manifest(cid, definition=agg, box_types=["aggregate"])
    with pytest.raises(Unauthorized) as err:
        run(mover.handle({"op": "move_begin", "manifest": bad}, "alpha"))
    assert "aggregate" in err.value.message
    assert not mover.busy


def test_chunks_from_another_sender_or_mistyped_are_refused(
    receiver: tuple[Mover, str],
) -> None:
    mover, cid = receiver
    m = manifest(cid)

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        with pytest.raises(NotFound):
            await mover.handle({"op": "move_chunk", "move": m["id"], "data": b"x"}, "gamma")
        with pytest.raises(InvalidInput):
            await mover.handle({"op": "move_chunk", "move": m["id"], "data": "text"}, "alpha")
        await mover.handle({"op": "move_chunk", "move": m["id"], "data": b"x" * 6}, "alpha")
        for bad in (
            {"size": -1, "sha256": "0", "offsets": {}},
            {"size": 6, "sha256": 5, "offsets": {}},
            {"size": 6, "sha256": "0", "offsets": {"src": {"r": 1}}},  # src is copied here
            {"size": 6, "sha256": "0", "offsets": []},
            {"size": 6, "sha256": "0", "offsets": {}},  # no holds
            {"size": 6, "sha256": "0", "offsets": {}, "holds": {"src": 3}},  # src is copied
        ):
            with pytest.raises(InvalidInput):
                await mover.handle({"op": "move_install", "move": m["id"], **bad}, "alpha")
            # refused and forgotten: the lock is free for the next move
            assert not mover.busy
            await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        with pytest.raises(NotFound):
            await mover.handle({"op": "move_install", "move": "f" * 32}, "alpha")

    run(go())


def test_data_that_does_not_match_the_hash_is_not_installed(
    receiver: tuple[Mover, str],
) -> None:
    mover, cid = receiver
    body = b"not the tar that was announced"
    m = manifest(cid)
    sealed = {
        "size": len(body),
        "sha256": hashlib.sha256(b"other").hexdigest(),
        "offsets": {},
        "holds": {},
    }

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        await mover.handle({"op": "move_chunk", "move": m["id"], "data": body}, "alpha")
        with pytest.raises(InvalidInput) as err:
            await mover.handle({"op": "move_install", "move": m["id"], **sealed}, "alpha")
        assert "hash" in err.value.message

    run(go())
    assert not mover.busy
    catalog = mover.site.catalog
    assert catalog.find_query("frag") is None and catalog.stream_names() == []


def test_a_second_move_waits_for_the_first(receiver: tuple[Mover, str]) -> None:
    mover, cid = receiver

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": manifest(cid)}, "alpha")
        with pytest.raises(FedstreamError):
            await mover.handle({"op": "move_begin", "manifest": manifest(cid)}, "alpha")

    run(go())


def test_a_name_already_here_is_a_conflict(receiver: tuple[Mover, str]) -> None:
    mover, cid = receiver
    from peer.model.schema import parse_schema, to_arrow_schema

    mover.site.spools.create("src", to_arrow_schema(parse_schema(SCHEMA)))
    with pytest.raises(Conflict):
        run(mover.handle({"op": "move_begin", "manifest": manifest(cid)}, "alpha"))
    # held here, but not as a copy with the sender's offsets: refused too
    local = manifest(cid)
    local["inputs"]["src"]["mode"] = "local"
    with pytest.raises(Conflict) as err:
        run(mover.handle({"op": "move_begin", "manifest": local}, "alpha"))
    assert "offsets" in err.value.message
    assert not mover.busy


def test_inside_a_participant_a_copy_another_fragment_reads_takes_no_second_reader(
    receiver: tuple[Mover, str],
) -> None:
    """A peer of the sender's own participant refuses a fragment whose input it holds as a
    copy for another fragment: the two could then move on only together, and a launched peer
    could never drain. A partner under contract takes it (the copy does not travel again)."""
    mover, _cid = receiver
    from peer.model.query import parse_query
    from peer.model.schema import parse_schema, to_arrow_schema

    mover.site.spools.create("src", to_arrow_schema(parse_schema(SCHEMA)))
    other = {**DEFINITION, "name": "other"}
    mover.site.catalog.add_query(parse_query(other), "ef01ab23")
    sibling = manifest(SIBLING)
    sibling["inputs"]["src"]["mode"] = "local"
    with pytest.raises(Conflict) as err:
        run(mover.handle({"op": "move_begin", "manifest": sibling}, "beta"))
    assert "read by another fragment here" in err.value.message
    assert not mover.busy
    # a stream this peer hosts may have many readers
    mover.fed.hosting.hosted.add("src")
    reply = run(mover.handle({"op": "move_begin", "manifest": sibling}, "beta"))
    assert reply["ready"] and mover.busy


def test_under_a_contract_a_second_reader_of_a_copy_is_taken(
    receiver: tuple[Mover, str],
) -> None:
    mover, cid = receiver
    from peer.model.query import parse_query
    from peer.model.schema import parse_schema, to_arrow_schema

    mover.site.spools.create("src", to_arrow_schema(parse_schema(SCHEMA)))
    mover.site.catalog.add_query(parse_query({**DEFINITION, "name": "other"}), "ef01ab23")
    local = manifest(cid)
    local["inputs"]["src"]["mode"] = "local"
    with pytest.raises(Conflict) as err:  # refused only because the copy is not aligned
        run(mover.handle({"op": "move_begin", "manifest": local}, "alpha"))
    assert "offsets" in err.value.message


def test_a_copy_here_shorter_than_the_senders_is_refused_and_nothing_installed(
    receiver: tuple[Mover, str],
) -> None:
    """An input this peer holds already (it hosts it): the fragment resumes on our copy and
    re-runs the batch it had planned at the sender, which may end at the sender's last batch;
    a copy that ends before it would fail the query on a missing file."""
    mover, cid = receiver
    from peer.model.schema import parse_schema, to_arrow_schema

    mover.fed.hosting.hosted.add("src")
    mover.site.spools.create("src", to_arrow_schema(parse_schema(SCHEMA)))
    m = manifest(cid)
    m["inputs"]["src"]["mode"] = "local"
    tree = io.BytesIO()
    with tarfile.open(fileobj=tree, mode="w") as tar:
        info = tarfile.TarInfo("tree/checkpoint/offsets/0")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    body = tree.getvalue()
    sealed = {
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "offsets": {"src": {"frag-src": 3}},
        "holds": {"src": 7},
    }

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        await mover.handle({"op": "move_chunk", "move": m["id"], "data": body}, "alpha")
        with pytest.raises(Conflict) as err:
            await mover.handle({"op": "move_install", "move": m["id"], **sealed}, "alpha")
        assert "src" in err.value.message and "7" in err.value.message

    run(go())
    assert not mover.busy
    catalog = mover.site.catalog
    assert catalog.find_query("frag") is None and catalog.stream_names() == []
    assert "frag-src" not in mover.site.spools.get("src").readers()


def test_a_resolved_move_is_aborted_for_good_and_frees_the_receiver(
    receiver: tuple[Mover, str],
) -> None:
    """The sender asks after a lost install reply: a move not installed by then never is."""
    mover, cid = receiver
    m = manifest(cid)

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        await mover.handle({"op": "move_chunk", "move": m["id"], "data": b"xyz"}, "alpha")
        with pytest.raises(NotFound):  # only the move's sender may ask
            await mover.handle(
                {"op": "move_resolve", "move": m["id"], "fragment": "frag", "epoch": 1}, "beta"
            )
        ask = {"op": "move_resolve", "move": m["id"], "fragment": "frag", "epoch": 1}
        assert (await mover.handle(ask, "alpha"))["decision"] == "aborted"
        assert (await mover.handle(ask, "alpha"))["decision"] == "aborted"  # final
        assert not mover.busy
        with pytest.raises(NotFound):  # what it received is gone: nothing to install
            await mover.handle({"op": "move_install", "move": m["id"], "size": 3}, "alpha")

    run(go())
    assert mover.journal.outcome(m["id"]) is not None
    assert mover.site.catalog.find_query("frag") is None


@pytest.mark.parametrize(
    "ask",
    [
        {"move": "../x", "fragment": "frag", "epoch": 1},
        {"move": "a" * 32, "fragment": 5, "epoch": 1},
        {"move": "a" * 32, "fragment": "frag", "epoch": True},
    ],
)
def test_a_malformed_resolve_is_refused(receiver: tuple[Mover, str], ask: dict[str, Any]) -> None:
    mover, _ = receiver
    with pytest.raises(InvalidInput):
        run(mover.handle({"op": "move_resolve", **ask}, "alpha"))
    assert mover.journal.outcome("a" * 32) is None


def test_a_move_older_than_the_fragments_last_arrival_is_refused(
    receiver: tuple[Mover, str],
) -> None:
    mover, cid = receiver
    mover.journal.decide(Outcome("e" * 32, "frag", 2, "installed", "alpha"))
    with pytest.raises(Conflict) as err:
        run(mover.handle({"op": "move_begin", "manifest": manifest(cid, epoch=2)}, "alpha"))
    assert "epoch 2 is stale" in err.value.message and not mover.busy
    reply = run(mover.handle({"op": "move_begin", "manifest": manifest(cid, epoch=3)}, "alpha"))
    assert reply["ready"] and mover.busy


def test_a_pre_copy_that_does_not_match_or_a_bad_part_is_refused(
    receiver: tuple[Mover, str],
) -> None:
    """The pre-copy (sent while the fragment still runs) is checked as the final tar is: a
    chunk of an unknown part, or an install whose pre-copy hash or size is not what arrived,
    is refused and installs nothing."""
    mover, cid = receiver
    m = manifest(cid)
    body = b"final part"
    good = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest(), "offsets": {}}

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        with pytest.raises(InvalidInput, match="part"):
            chunk = {"op": "move_chunk", "move": m["id"], "data": b"x", "part": "side"}
            await mover.handle(chunk, "alpha")
        pre = {"op": "move_chunk", "move": m["id"], "data": b"pre-copied", "part": "pre"}
        await mover.handle(pre, "alpha")
        await mover.handle({"op": "move_chunk", "move": m["id"], "data": body}, "alpha")
        for bad in (
            {"size": 10, "sha256": hashlib.sha256(b"other").hexdigest()},
            {"size": 3, "sha256": hashlib.sha256(b"pre-copied").hexdigest()},
            {"size": "10", "sha256": hashlib.sha256(b"pre-copied").hexdigest()},
            [1, 2],
        ):
            with pytest.raises(InvalidInput, match="pre"):
                install = {"op": "move_install", "move": m["id"], **good, "holds": {}, "pre": bad}
                await mover.handle(install, "alpha")
            assert not mover.busy
            await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
            await mover.handle(pre, "alpha")
            await mover.handle({"op": "move_chunk", "move": m["id"], "data": body}, "alpha")

    run(go())
    catalog = mover.site.catalog
    assert catalog.find_query("frag") is None and catalog.stream_names() == []


def test_a_pre_copy_announced_whole_is_checked_then_closed(
    receiver: tuple[Mover, str], tmp_path: Path
) -> None:
    """``move_precopied`` unpacks the pre-copy while the sender's fragment still runs, once
    its hash matches; after it no pre chunk is taken, and a wrong hash is refused."""
    mover, cid = receiver
    m = manifest(cid)
    tree = tmp_path / "tree" / "in0"
    tree.mkdir(parents=True)
    (tree / "00000000000000000001.arrow").write_bytes(b"batch")
    pre_tar = tmp_path / "pre.tar"
    with tarfile.open(pre_tar, "w") as tar:
        tar.add(tmp_path / "tree", arcname="tree")
    body = pre_tar.read_bytes()
    sealed = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    async def go() -> None:
        await mover.handle({"op": "move_begin", "manifest": m}, "alpha")
        chunk = {"op": "move_chunk", "move": m["id"], "data": body, "part": "pre"}
        await mover.handle(chunk, "alpha")
        with pytest.raises(InvalidInput, match="hash"):
            wrong = {**sealed, "sha256": hashlib.sha256(b"x").hexdigest()}
            await mover.handle({"op": "move_precopied", "move": m["id"], **wrong}, "alpha")
        reply = await mover.handle({"op": "move_precopied", "move": m["id"], **sealed}, "alpha")
        assert reply["unpacked"] == len(body)
        where = mover.receiver.root / f"in-{m['id']}"
        assert (where / "tree" / "in0" / "00000000000000000001.arrow").read_bytes() == b"batch"
        with pytest.raises(InvalidInput, match="closed"):
            await mover.handle(chunk, "alpha")
        with pytest.raises(InvalidInput, match="closed"):
            await mover.handle({"op": "move_precopied", "move": m["id"], **sealed}, "alpha")

    run(go())


def test_a_lane_member_whose_input_this_lane_reads_is_refused(
    receiver: tuple[Mover, str],
) -> None:
    """The lane reads each stream at one position: an arriving member could not start where it
    stopped. Refused at ``move_begin``, before the sender holds anything."""
    mover, cid = receiver
    mover.site.engine = SimpleNamespace(lane=SimpleNamespace(streams=["src"]))  # type: ignore[assignment]
    with pytest.raises(Conflict) as err:
        run(mover.handle({"op": "move_begin", "manifest": manifest(cid, lane=True)}, "alpha"))
    assert "lane reads stream src" in err.value.message and not mover.busy
    mover.site.engine = SimpleNamespace(lane=SimpleNamespace(streams=["other"]))  # type: ignore[assignment]
    assert run(mover.handle({"op": "move_begin", "manifest": manifest(cid, lane=True)}, "alpha"))


@pytest.mark.parametrize(
    "content",
    [
        b"not msgpack at all \xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"windows": None}),
        msgpack.packb({"window": {"wm": "0", "g": []}}),
        msgpack.packb({"window": {"wm": 0, "g": {}}}),
        msgpack.packb({"window": 7}),
    ],
)
def test_a_lane_members_state_that_is_not_windows_is_refused(
    tmp_path: Path, content: bytes
) -> None:
    from peer.move.receiver import lane_window

    path = tmp_path / "lane.msgpack"
    path.write_bytes(content)
    with pytest.raises(InvalidInput) as err:
        lane_window(path)
    assert "lane member" in err.value.message


def test_a_lane_member_takes_a_new_incarnation_and_a_fragment_keeps_its_own() -> None:
    """Its results are tagged (incarnation, lane batch id), and lanes number batches apart."""
    from peer.move.receiver import landed_incarnation

    member = manifest(lane=True)
    assert landed_incarnation(member) == member["id"][:8] != member["incarnation"]
    assert landed_incarnation(member) == landed_incarnation(dict(member))  # after a crash too
    assert landed_incarnation(manifest()) == manifest()["incarnation"]
