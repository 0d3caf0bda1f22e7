"""overlay.transport without sockets: the listener on a memory network (serve, refuse, close),
the credit windows both ways, and the nursery."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from overlay.transport import (
    CreditError,
    CreditWindow,
    FrameStream,
    Listener,
    MemoryNetwork,
    Nursery,
    ReceiveWindow,
)
from peer.testing import all_tasks_blocked, wait_until

TEST_TIMEOUT_S = 10


def run(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            await main()

    asyncio.run(bounded())


class Echo:
    """Answers each frame with ``{"type": "echo", "of": frame}``; counts who is being served."""

    def __init__(self) -> None:
        self.serving = 0
        self.served = 0
        self.refused = 0
        self.cancelled = 0
        self.release = asyncio.Event()

    async def serve(self, stream: FrameStream) -> None:
        self.serving += 1
        try:
            while (frame := await stream.recv()) is not None:
                if frame["type"] == "hold":
                    await self.release.wait()
                await stream.send({"type": "echo", "of": frame})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.serving -= 1
            self.served += 1

    async def refuse(self, stream: FrameStream) -> None:
        self.refused += 1
        await stream.send({"type": "full"})


def listener(network: MemoryNetwork, echo: Echo, **options: Any) -> Listener:
    return Listener(echo.serve, "10.0.0.1", 0, name="test", network=network, **options)


# -- the listener -----------------------------------------------------------------------------


def test_a_memory_listener_serves_each_connection_and_closes_it_after() -> None:
    async def main() -> None:
        network, echo = MemoryNetwork(), Echo()
        async with listener(network, echo) as server:
            a = await network.connect("10.0.0.1", server.port)
            b = await network.connect("10.0.0.1", server.port)
            await a.send({"type": "ping", "n": 1})
            await b.send({"type": "ping", "n": 2})
            assert await a.recv() == {"type": "echo", "of": {"type": "ping", "n": 1}}
            assert await b.recv() == {"type": "echo", "of": {"type": "ping", "n": 2}}
            assert server.connection_count == 2 and not server.uses_tls
            await a.aclose()  # the server's serve returns at EOF, and its end is closed
            await wait_until(
                lambda: server.connection_count == 1,
                "server.connection_count == 1",
                5.0,
                every_s=0.001,
            )
            assert echo.served == 1
            await b.send({"type": "ping", "n": 3})
            assert (await b.recv() or {})["of"]["n"] == 3

    run(main)


def test_a_full_listener_closes_the_newcomer_unless_it_may_refuse() -> None:
    async def main() -> None:
        network, echo = MemoryNetwork(), Echo()
        async with listener(network, echo, max_connections=1) as server:
            first = await network.connect("10.0.0.1", server.port)
            turned_away = await network.connect("10.0.0.1", server.port)
            assert await turned_away.recv() is None  # closed before anything was said
            await first.send({"type": "ping"})
            assert (await first.recv() or {})["type"] == "echo"
        async with listener(network, echo, max_connections=1, refuse=echo.refuse) as server:
            first = await network.connect("10.0.0.1", server.port)
            told = await network.connect("10.0.0.1", server.port)
            assert await told.recv() == {"type": "full"}
            assert await told.recv() is None
            assert echo.refused == 1
            await first.send({"type": "ping"})
            assert (await first.recv() or {})["type"] == "echo"

    run(main)


def test_closing_a_listener_ends_its_connections_and_refuses_new_ones() -> None:
    async def main() -> None:
        network, echo = MemoryNetwork(), Echo()
        server = listener(network, echo, close_timeout_s=1)
        await server.start()
        port = server.port
        held = await network.connect("10.0.0.1", port)
        await held.send({"type": "hold"})
        await wait_until(lambda: echo.serving == 1, "echo.serving == 1", 5.0, every_s=0.001)
        await server.close()
        assert echo.cancelled == 1 and server.connection_count == 0
        assert await held.recv() is None
        with pytest.raises(ConnectionRefusedError):
            await network.connect("10.0.0.1", port)

    run(main)


def test_a_memory_network_carries_no_tls_and_no_one_listens_by_default() -> None:
    async def main() -> None:
        network = MemoryNetwork()
        with pytest.raises(ConnectionRefusedError):
            await network.connect("10.0.0.1", 1)
        async with listener(network, Echo()) as server:
            with pytest.raises(ValueError, match="no TLS"):
                await network.connect("10.0.0.1", server.port, tls=ssl.create_default_context())
        with pytest.raises(ValueError, match="no TLS"):
            Listener(Echo().serve, name="x", network=network, tls=ssl.create_default_context())

    run(main)


def test_the_listener_of_a_port_has_it_alone() -> None:
    async def main() -> None:
        network = MemoryNetwork()
        async with listener(network, Echo()) as one:
            other = Listener(Echo().serve, "10.0.0.1", one.port, name="other", network=network)
            with pytest.raises(OSError, match="already in use"):
                await other.start()
            await other.close()

    run(main)


# -- credit windows ---------------------------------------------------------------------------


def test_a_sender_waits_for_credit_and_goes_on_when_granted() -> None:
    async def main() -> None:
        window = CreditWindow(2, max_credit=8)
        await window.take()
        await window.take()
        assert window.available == 0
        blocked = asyncio.create_task(window.take())
        await all_tasks_blocked()
        assert not blocked.done()
        window.grant(3)
        await blocked
        assert window.available == 2

    run(main)


def test_grants_beyond_the_window_are_refused() -> None:
    window = CreditWindow(6, max_credit=8)
    for bad in (0, -1, 3):
        with pytest.raises(CreditError):
            window.grant(bad)
    window.grant(2)
    assert window.available == 8
    with pytest.raises(CreditError):
        CreditWindow(9, max_credit=8)
    assert CreditWindow(0, max_credit=8).available == 0


def test_without_credit_a_sender_never_waits() -> None:
    async def main() -> None:
        window = CreditWindow(None, max_credit=8)
        for _ in range(100):
            await window.take()
        window.grant(1 << 30)
        assert window.available is None

    run(main)


@pytest.mark.parametrize(("window", "threshold"), [(1, 1), (2, 1), (4, 2), (5, 3), (16, 8)])
def test_a_receiver_gives_credit_back_once_half_the_window_is_taken(
    window: int, threshold: int
) -> None:
    receiver = ReceiveWindow(window, max_credit=1 << 16)
    for _ in range(window):
        receiver.arrived()
    with pytest.raises(CreditError):
        receiver.arrived()  # beyond the credit granted
    given = [receiver.taken() for _ in range(threshold)]
    assert given == [0] * (threshold - 1) + [threshold]
    for _ in range(threshold):  # what was given back may arrive again, and no more
        receiver.arrived()
    with pytest.raises(CreditError):
        receiver.arrived()


def test_a_receive_window_must_fit_the_cap() -> None:
    for bad in (0, 9):
        with pytest.raises(ValueError, match=r"credit must be in 1\.\.8"):
            ReceiveWindow(bad, max_credit=8)


def test_both_windows_together_never_let_more_than_the_window_be_unread() -> None:
    async def main() -> None:
        credit, total = 4, 50
        sender = CreditWindow(credit, max_credit=1 << 16)
        receiver = ReceiveWindow(credit, max_credit=1 << 16)
        queue: asyncio.Queue[int] = asyncio.Queue()
        peak = 0

        async def produce() -> None:
            nonlocal peak
            for i in range(total):
                await sender.take()
                receiver.arrived()
                queue.put_nowait(i)
                peak = max(peak, queue.qsize())

        producer = asyncio.create_task(produce())
        got: list[int] = []
        while len(got) < total:
            got.append(await queue.get())
            await asyncio.sleep(0)
            if n := receiver.taken():
                sender.grant(n)
        await producer
        assert got == list(range(total)) and peak <= credit

    run(main)


# -- the nursery ------------------------------------------------------------------------------


def test_a_nursery_keeps_children_apart_and_ends_them_on_close() -> None:
    async def main() -> None:
        nursery = Nursery("test", close_timeout_s=1)
        await nursery.start()
        done: list[str] = []

        async def fails() -> None:
            raise RuntimeError("a bug in one child")

        async def forever() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                done.append("cancelled")

        assert nursery.spawn(fails())
        assert nursery.spawn(forever())
        await all_tasks_blocked()  # the failure is logged; the sibling runs on
        assert done == []
        await nursery.close()
        assert done == ["cancelled"]
        late = forever()
        assert not nursery.spawn(late)  # closing: refused, and the coroutine closed
        with contextlib.suppress(StopIteration), pytest.raises(RuntimeError):
            late.send(None)

    run(main)
