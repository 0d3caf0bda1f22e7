"""A move cut short at any step leaves exactly one running copy (issue 11).

Two partners share this process's Spark session; a windowed aggregate moves between them
three times, each time cut short at another step:

1. the sender dies after shipping its tar but before it asks the target to install: when it
   restarts, its journal says the install was never sent, so it runs the fragment again
   itself, and the target forgets what it received;
2. the sender dies after the target installed, before it let go: when it restarts it is in
   doubt, asks the target, hears ``installed`` and lets go;
3. the reply to the install is lost: the sender asks the target, hears ``installed`` and lets
   go, instead of running the fragment again beside the target's copy.

Pushes go on between the moves; the output, read from the peer that runs the fragment last,
equals plain Python: no window lost, none twice. The same again with the aggregate in the
shared lane (issue 28), where a move holds the lane instead of stopping a streaming query.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import Counter
from typing import Any

import pytest

from peer.client import Client
from peer.errors import Unavailable
from peer.move.journal import Journal
from peer.protocol.link import Raw
from peer.testing import PeerThread, collect, stream_name_on, wait_until_sync
from tests.integration.test_move import (
    BATCHES,
    engine_of,
    make_batches,
    overlay_of,
    pair,
    push,
    query,
    reference,
    set_up,
    site_of,
)

__all__ = ["pair"]  # the fixture, shared with test_move

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]


class Crash(Exception):
    """The sender's process dies here (nothing after this point runs)."""


async def crash(*_args: Any, **_kwargs: Any) -> None:
    raise Crash


async def nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def runs(peer: PeerThread, name: str = "mover") -> bool:
    entry = site_of(peer).catalog.find_query(name)
    engine = engine_of(peer)
    here = name in engine.running or (name in engine.lane.members and engine.lane._held != name)
    return entry is not None and entry.status == "RUNNING" and here


@pytest.mark.parametrize("pair", ["data-dir", "lane"], indirect=True)
def test_a_move_cut_short_at_any_step_leaves_one_running_copy(
    pair: tuple[PeerThread, PeerThread, str], spark: Any
) -> None:
    a, b, contract_id = pair
    a_id, b_id = overlay_of(a).node_id, overlay_of(b).node_id
    source = stream_name_on(a_id, (a_id, b_id), "crticks")
    batches = make_batches(seed=31)
    want = reference(batches)
    n = BATCHES // 4
    restarted: list[PeerThread] = []

    def restart(peer: PeerThread) -> PeerThread:
        """Stop ``peer`` as it is (its moves unfinished) and start it on its data again."""
        peer.close()
        config = dataclasses.replace(peer.config, bootstrap=[("127.0.0.1", overlay_of(b).port)])
        again = PeerThread(config, spark).__enter__()
        restarted.append(again)
        # it listens on a new port: b sends it nothing before gossip has told b where
        port = overlay_of(again).port
        wait_until_sync(
            lambda: (info := overlay_of(b).member(a_id)) is not None and info.overlay[1] == port,
            "the partner to learn the restarted peer's address",
            90,
            every_s=0.2,
        )
        return again

    def move(peer: PeerThread, to: bytes) -> dict[str, Any]:
        return peer.call(peer.peer.move_fragment("mover", to, contract=contract_id), 300)

    try:
        asyncio.run(set_up(a.port, 2, source, query(source)))
        asyncio.run(push(a.port, source, batches[:n], 0))

        # 0. the sender fails while it pre-copies: nothing stopped, nothing journalled
        sender = a.peer.mover.sender if a.peer.mover else None
        assert sender is not None
        send_chunks = sender._send_chunks

        async def crash_at(when: str, target: bytes, tar: Any, **kw: Any) -> None:
            if kw.get("part", "final") == when:
                raise Crash
            await send_chunks(target, tar, **kw)

        sender._send_chunks = functools.partial(crash_at, "pre")  # type: ignore[method-assign]
        with pytest.raises(Crash):
            move(a, b_id)
        assert Journal(a.config.data_dir).intents() == [] and runs(a)
        wait_until_sync(
            lambda: not (b.peer.mover and b.peer.mover.busy),
            "the target's move lock freed after the failed pre-copy",
            90,
            every_s=0.2,
        )

        # 1. the sender dies with the tar shipped, before asking for the install
        sender._send_chunks = functools.partial(crash_at, "final")  # type: ignore[method-assign]
        sender._undo = nothing  # type: ignore[method-assign]
        with pytest.raises(Crash):
            move(a, b_id)
        assert [i.phase for i in Journal(a.config.data_dir).intents()] == ["stopping"]
        assert not runs(a)  # stopped, or held in the lane
        a = restart(a)
        assert runs(a), "the sender did not take its fragment back"
        assert Journal(a.config.data_dir).intents() == []
        wait_until_sync(
            lambda: not (b.peer.mover and b.peer.mover.busy),
            "the target's move lock freed",
            90,
            every_s=0.2,
        )
        assert site_of(b).catalog.find_query("mover") is None
        asyncio.run(push(a.port, source, batches[n : 2 * n], n))

        # 2. the sender dies after the target installed, before letting go
        sender = a.peer.mover.sender if a.peer.mover else None
        assert sender is not None
        sender._commit = crash  # type: ignore[method-assign]
        with pytest.raises(Crash):
            move(a, b_id)
        assert runs(b), "the target did not run what it installed"
        assert [i.phase for i in Journal(a.config.data_dir).intents()] == ["installing"]
        a = restart(a)
        wait_until_sync(
            lambda: (
                site_of(a).catalog.find_query("mover") is None
                and site_of(a).catalog.moved() == {"mover": b_id.hex()}
            ),
            "the restarted sender let go",
            90,
            every_s=0.2,
        )
        assert runs(b) and Journal(a.config.data_dir).intents() == []
        asyncio.run(push(a.port, source, batches[2 * n : 3 * n], 2 * n))

        # 3. the target installs, and its reply is lost on the way back
        router = b.peer.fed.router if b.peer.fed else None
        assert router is not None
        real_call = router.call

        async def lossy(node_id: bytes, message: Any) -> dict[str, Any]:
            reply = await real_call(node_id, message)
            if isinstance(message, Raw) and message.op == "move_install":
                raise Unavailable("the reply to move_install was lost")
            return reply

        router.call = lossy  # type: ignore[method-assign]
        try:
            moved = move(b, a_id)
        finally:
            router.call = real_call  # type: ignore[method-assign]
        assert moved["to"] == a_id.hex() and moved["epoch"] == 2
        assert runs(a) and site_of(b).catalog.find_query("mover") is None
        assert not runs(b) and "mover" not in engine_of(b).lane.members

        async def finish() -> list[dict[str, Any]]:
            await push(a.port, source, batches[3 * n :], 3 * n)
            async with Client("127.0.0.1", a.port, timeout_s=120) as cl:
                return await collect(cl, "moved_out", sum(want.values()), timeout_s=300, settle_s=3)

        rows = asyncio.run(finish())
        got = Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)
        assert got == want
    finally:
        for p in restarted:
            p.close()
