"""Running peer links over an in-memory pair (no sockets, no TLS): requests both ways, errors,
credit-bounded streams, cancellation, and frames that break the link protocol.

The certificates' part (who is at the other end) is tests/integration/test_links.py's; here
each Link is told who its remote is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from overlay.link import Link, LinkRemoteError, LinkSettings, LinkTimeout, LinkUnavailable
from overlay.tls import PeerIdentity
from overlay.transport import FrameStream, memory_stream_pair
from peer.testing import all_tasks_blocked, wait_until

TEST_TIMEOUT_S = 10
ACME = PeerIdentity(b"\x01" * 20, b"\x11" * 32, "acme", b"\x21" * 32)
MIT = PeerIdentity(b"\x02" * 20, b"\x12" * 32, "mit.edu", b"\x22" * 32)


def run(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            await main()

    asyncio.run(bounded())


class Refusal(Exception):
    """An error the way the peer's errors look (code, retriable, to_wire)."""

    code = "not_found"
    retriable = True

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self), "details": {"stream": "people"}}


@dataclass
class Handler:
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    produced: int = 0
    cancelled: list[str] = field(default_factory=list)

    async def handle(self, link: Link, frame: dict[str, Any]) -> dict[str, Any]:
        op = frame["type"]
        if op == "echo":
            return {"echo": frame["x"], "by": link.remote_participant}
        if op == "fail":
            raise Refusal("stream 'people' does not exist")
        if op == "crash":
            raise ValueError("a secret bug")
        if op == "call_back":
            return {"relayed": await link.request({"type": "echo", "x": frame["x"]}, 5)}
        if op == "block":
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append("block")
                raise
            return {"released": True}
        raise Refusal(f"unknown op {op}")

    async def stream(self, link: Link, frame: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            for i in range(frame.get("n", 1 << 30)):
                self.produced += 1
                yield {"i": i}
        except GeneratorExit:
            self.cancelled.append("stream")
            raise


@contextlib.asynccontextmanager
async def linked(
    settings: LinkSettings | None = None,
) -> AsyncIterator[tuple[Link, Link, Handler, Handler]]:
    """Two running links joined in memory: ``mine`` (at mit.edu) and ``theirs`` (at acme)."""
    settings = settings or LinkSettings()
    limits = (settings.max_in_flight, settings.max_streams)
    a, b = memory_stream_pair()
    my_handler, their_handler = Handler(), Handler()
    mine = Link(a, ACME, limits, my_handler, settings, address="memory:acme")
    theirs = Link(b, MIT, limits, their_handler, settings, address="memory:mit")
    async with asyncio.TaskGroup() as tg:
        tg.create_task(mine.run())
        tg.create_task(theirs.run())
        try:
            yield mine, theirs, my_handler, their_handler
        finally:
            await mine.close()
            await theirs.close()


@contextlib.asynccontextmanager
async def raw_peer(settings: LinkSettings | None = None) -> AsyncIterator[tuple[Link, FrameStream]]:
    """A running link whose other end is a bare frame stream the test speaks through."""
    settings = settings or LinkSettings(max_in_flight=2, max_streams=2)
    a, b = memory_stream_pair()
    link = Link(a, ACME, (2, 2), Handler(), settings, address="memory:raw")
    async with asyncio.TaskGroup() as tg:
        tg.create_task(link.run())
        try:
            yield link, b
        finally:
            await link.close()
            await b.aclose()


# -- requests ---------------------------------------------------------------------------------


def test_requests_both_ways_even_while_serving() -> None:
    async def main() -> None:
        async with linked() as (mine, theirs, _, _):
            assert await mine.request({"type": "echo", "x": [1, "a"]}, 5) == {
                "echo": [1, "a"],
                "by": "mit.edu",
            }
            relayed = await mine.request({"type": "call_back", "x": 7}, 5)
            assert relayed == {"relayed": {"echo": 7, "by": "acme"}}
            assert (await theirs.request({"type": "echo", "x": 2}, 5))["by"] == "acme"

    run(main)


def test_handler_errors_cross_with_their_code_and_bugs_as_internal() -> None:
    async def main() -> None:
        async with linked() as (mine, _, _, _):
            with pytest.raises(LinkRemoteError) as refused:
                await mine.request({"type": "fail"}, 5)
            err = refused.value
            assert (err.code, err.retriable, err.details) == (
                "not_found",
                True,
                {"stream": "people"},
            )
            assert err.message == "stream 'people' does not exist"
            with pytest.raises(LinkRemoteError) as crashed:
                await mine.request({"type": "crash"}, 5)
            assert crashed.value.code == "internal" and "secret" not in crashed.value.message
            assert not mine.closed

    run(main)


def test_a_timed_out_request_is_cancelled_on_the_remote_and_frees_its_slot() -> None:
    async def main() -> None:
        async with linked(LinkSettings(max_in_flight=1)) as (mine, _, _, theirs):
            with pytest.raises(LinkTimeout):
                await mine.request({"type": "block"}, 0.1)
            await wait_until(
                lambda: theirs.cancelled == ["block"],
                "theirs.cancelled == ['block']",
                5.0,
                every_s=0.001,
            )
            assert (await mine.request({"type": "echo", "x": 1}, 5))["echo"] == 1

    run(main)


def test_closing_a_link_fails_what_is_pending_on_it() -> None:
    async def main() -> None:
        async with linked() as (mine, theirs, _, handler):
            pending = asyncio.create_task(mine.request({"type": "block"}, 5))
            await wait_until(
                lambda: theirs.idle_s() == 0.0, "theirs.idle_s() == 0.0", 5.0, every_s=0.001
            )
            await theirs.close()
            with pytest.raises(LinkUnavailable):
                await pending
            await wait_until(lambda: mine.closed, "mine.closed", 5.0, every_s=0.001)
            with pytest.raises(LinkUnavailable):
                await mine.request({"type": "echo", "x": 1}, 5)
            assert handler.cancelled == ["block"]

    run(main)


# -- streams ----------------------------------------------------------------------------------


def test_stream_credit_bounds_a_slow_receiver_and_loses_nothing() -> None:
    async def main() -> None:
        credit, total = 4, 100
        async with linked() as (mine, _, _, theirs):
            async with mine.open_stream({"type": "count", "n": total}, credit=credit) as items:
                first = [await anext(items) for _ in range(1)]
                await wait_until(
                    lambda: theirs.produced >= credit,
                    "theirs.produced >= credit",
                    5.0,
                    every_s=0.001,
                )
                await all_tasks_blocked()
                assert theirs.produced == credit  # 1 taken, none given back yet (half is 2)
                rest = [item async for item in items]
            assert [item["i"] for item in first + rest] == list(range(total))

    run(main)


def test_closing_a_stream_cancels_its_producer_and_frees_the_slot() -> None:
    async def main() -> None:
        async with linked(LinkSettings(max_streams=1)) as (mine, _, _, theirs):
            for round_ in range(1, 4):
                async with mine.open_stream({"type": "forever"}, credit=2) as items:
                    assert (await anext(items))["i"] == 0
                await wait_until(
                    lambda: theirs.cancelled.count("stream") == round_,  # noqa: B023
                    "theirs.cancelled.count('stream') == round_",
                    5.0,
                    every_s=0.001,
                )

    run(main)


# -- frames that break the protocol -----------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "rep", "id": 99, "body": {}},  # a reply to nothing
        {"type": "req", "id": "1", "body": {}},  # id not an int
        {"type": "req", "id": 1},  # no body
        {"type": "rep", "id": 1, "error": "boom"},  # an error that is not a map
        {"type": "teleport"},
    ],
)
def test_a_frame_breaking_the_protocol_closes_the_link(frame: dict[str, Any]) -> None:
    async def main() -> None:
        async with raw_peer() as (link, remote):
            await remote.send(frame)
            assert await remote.recv() is None
            await wait_until(lambda: link.closed, "link.closed", 5.0, every_s=0.001)

    run(main)


def test_credit_beyond_the_limit_closes_the_link() -> None:
    async def main() -> None:
        async with raw_peer() as (link, remote):
            await remote.send({"type": "open", "id": 1, "body": {"type": "x", "n": 0}, "credit": 0})
            await remote.send({"type": "credit", "id": 1, "n": 1 << 40})
            while (got := await remote.recv()) is not None:
                assert got["type"] == "end"  # the stream's end may come first
            await wait_until(lambda: link.closed, "link.closed", 5.0, every_s=0.001)

    run(main)


def test_an_item_beyond_the_credit_closes_the_link_and_fails_the_stream() -> None:
    async def main() -> None:
        async with raw_peer() as (link, remote):
            items = link.open_stream({"type": "count"}, credit=1)
            opening = asyncio.create_task(anext(items))
            opened = await remote.recv()
            assert opened is not None and (opened["type"], opened["credit"]) == ("open", 1)
            for i in range(2):  # one more than granted
                await remote.send({"type": "item", "id": opened["id"], "body": {"i": i}})
            assert await opening == {"i": 0}  # what arrived in time is still delivered
            with pytest.raises(LinkUnavailable):
                await anext(items)
            assert link.closed

    run(main)


def test_more_requests_than_announced_closes_the_link() -> None:
    async def main() -> None:
        async with raw_peer() as (link, remote):
            for rid in (1, 2, 3):  # two were announced
                await remote.send({"type": "req", "id": rid, "body": {"type": "block"}})
            assert await remote.recv() is None
            await wait_until(lambda: link.closed, "link.closed", 5.0, every_s=0.001)

    run(main)
