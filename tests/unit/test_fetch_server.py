"""The fetch server and client over the in-memory transport (no sockets, no TLS): stored
bytes served as they are, every refusal answered with its reason while the server goes on
serving, and the client's state machine for a reply. Expiry comes from a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay.errors import RemoteProtocolError
from overlay.transport import FrameStream, MemoryNetwork
from peer.errors import InvalidInput, NotFound, Unauthorized
from peer.fetch.capability import FetchKey
from peer.fetch.client import FetchFailed, SpoolFetcher
from peer.fetch.protocol import (
    FetchEndpoint,
    FetchRequest,
    FetchTicket,
    FileAssembler,
)
from peer.fetch.server import (
    FORCE_ENV,
    FetchLimits,
    FetchServer,
    advertised_host,
    remote_input,
)
from peer.storage import spool_format as fmt
from peer.storage.spool import Spool
from peer.testing.manual_clock import ManualClock
from peer.timing import wait_until

KEY = FetchKey.generate()
OTHER = FetchKey.generate()
SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string())])
TTL_S = 60.0
TIMEOUT_S = 10.0


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await body()

    asyncio.run(bounded())


def make_spool(root: Path, files: int = 3, rows: int = 50) -> Spool:
    spool = Spool(root / "spools" / "s", SCHEMA, fsync=False, name="s")
    for f in range(files):
        ks = list(range(f * rows, (f + 1) * rows))
        spool.append(pa.table({"k": pa.array(ks, pa.int64()), "s": [f"v{k}" * 5 for k in ks]}))
    return spool


class Served:
    """A fetch server on a memory network, its clock, and tickets for one spool."""

    def __init__(self, server: FetchServer, network: MemoryNetwork, clock: ManualClock) -> None:
        self.server = server
        self.network = network
        self.clock = clock

    def ticket(
        self, spool: Path | str, first: int, last: int, *, key: FetchKey = KEY, ttl_s: float = TTL_S
    ) -> FetchTicket:
        token = key.mint(str(spool), first, last, now=self.clock(), ttl_s=ttl_s)
        return FetchTicket(self.server.address, "", str(spool), token)

    def fetcher(self, ticket: FetchTicket) -> SpoolFetcher:
        return SpoolFetcher(ticket, network=self.network, tls=False, timeout_s=TIMEOUT_S)

    async def raw(self) -> FrameStream:
        return await self.network.connect("127.0.0.1", self.server.listener.port)


@asynccontextmanager
async def served(root: Path, **limits: Any) -> AsyncIterator[Served]:
    network = MemoryNetwork()
    clock = ManualClock(1_700_000_000.0)
    server = FetchServer(
        KEY,
        root / "fetch.key",
        [root],
        limits=FetchLimits(**limits),
        clock=clock,
        network=network,
    )
    await server.start()
    try:
        yield Served(server, network, clock)
    finally:
        await server.close()


def test_each_file_is_served_as_stored_in_chunks(tmp_path: Path) -> None:
    spool = make_spool(tmp_path, files=3, rows=400)
    stored = [fmt.offset_path(spool.directory, o).read_bytes() for o in (0, 1, 2)]
    assert min(len(b) for b in stored) > 3 * 1000  # several chunks each

    async def body() -> None:
        async with served(tmp_path, chunk_bytes=1000) as s:
            fetcher = s.fetcher(s.ticket(spool.directory, 0, 2))
            got = [await fetcher.fetch_async(o) for o in (0, 1, 2)]
            await fetcher.aclose()
            assert got == stored
            assert s.server.served_files == 3 and s.server.served_bytes == sum(map(len, stored))
            table = pa.ipc.open_file(pa.py_buffer(got[1])).read_all()
            assert table.column("k").to_pylist() == list(range(400, 800))

    run(body)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("forged", "forged"),
        ("expired", "expired"),
        ("out-of-range", "out-of-range"),
        ("wrong-spool", "wrong-spool"),
        ("other-key", "other-key"),
    ],
)
def test_a_refused_capability_is_answered_and_the_server_goes_on(
    tmp_path: Path, case: str, reason: str
) -> None:
    spool = make_spool(tmp_path)
    stored = fmt.offset_path(spool.directory, 2).read_bytes()

    async def body() -> None:
        async with served(tmp_path) as s:
            good = s.ticket(spool.directory, 1, 2)
            bad, offset = good, 2
            if case == "forged":
                token = bytearray(good.capability)
                token[3] ^= 0x40
                bad = FetchTicket(good.address, "", good.spool, bytes(token))
            elif case == "expired":
                bad = s.ticket(spool.directory, 1, 2, ttl_s=5.0)
                s.clock.advance(5.0)
            elif case == "out-of-range":
                offset = 3
            elif case == "wrong-spool":
                bad = FetchTicket(good.address, "", str(tmp_path / "spools" / "t"), good.capability)
            else:
                bad = s.ticket(spool.directory, 1, 2, key=OTHER)
            fetcher = s.fetcher(bad)
            with pytest.raises(Unauthorized, match=f"refused \\({reason}\\)"):
                await fetcher.fetch_async(offset)
            # the same connection, with a good capability, is still served
            same = SpoolFetcher(good, network=s.network, tls=False)
            same._stream = fetcher._stream
            assert await same.fetch_async(2) == stored
            # and so is everyone else
            other = s.fetcher(s.ticket(spool.directory, 0, 2))
            assert await other.fetch_async(2) == stored
            await fetcher.aclose()
            await other.aclose()
            assert s.server.refused == 1

    run(body)


def test_a_connection_refused_too_often_is_closed(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)

    async def body() -> None:
        async with served(tmp_path, max_refusals=2) as s:
            stream = await s.raw()
            bad = FetchRequest(str(spool.directory), 1, OTHER.mint("x", 1, 1, now=0, ttl_s=1))
            for _ in range(2):
                await stream.send(bad.to_wire())
                reply = await stream.recv()
                assert reply is not None and reply["code"] == "unauthorized"
            assert await stream.recv() is None  # closed after the second refusal
            await stream.aclose()

    run(body)


def test_a_spool_outside_the_roots_is_refused_even_with_a_valid_capability(
    tmp_path: Path,
) -> None:
    elsewhere = make_spool(tmp_path / "other", files=2)

    async def body() -> None:
        async with served(tmp_path / "root") as s:
            fetcher = s.fetcher(s.ticket(elsewhere.directory, 1, 1))
            with pytest.raises(InvalidInput, match="not under this peer's data directory"):
                await fetcher.fetch_async(1)
            link = s.fetcher(s.ticket(tmp_path / "root" / ".." / "other" / "spools" / "s", 1, 1))
            with pytest.raises(InvalidInput, match="not under"):
                await link.fetch_async(1)
            await fetcher.aclose()
            await link.aclose()

    (tmp_path / "root").mkdir()
    run(body)


def test_a_trimmed_file_is_not_found_with_its_reason(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    fmt.offset_path(spool.directory, 1).unlink()

    async def body() -> None:
        async with served(tmp_path) as s:
            fetcher = s.fetcher(s.ticket(spool.directory, 1, 2))
            with pytest.raises(NotFound, match="trimmed") as caught:
                await fetcher.fetch_async(1)
            assert caught.value.details["reason"] == "trimmed"
            assert len(await fetcher.fetch_async(2)) > 0
            await fetcher.aclose()

    run(body)


frames = st.dictionaries(
    st.sampled_from(["type", "spool", "offset", "capability", "x"]),
    st.one_of(
        st.sampled_from(["fetch", "file", "chunk"]),
        st.text(max_size=20),
        st.integers(-(2**63), 2**64 - 1),
        st.binary(max_size=200),
        st.none(),
        st.lists(st.integers(-1000, 1000), max_size=3),
    ),
    max_size=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(frames, min_size=1, max_size=8))
def test_any_request_frame_is_answered_and_the_server_goes_on(
    tmp_path_factory: pytest.TempPathFactory, requests: list[dict[str, Any]]
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    spool = make_spool(root, files=2, rows=5)
    stored = fmt.offset_path(spool.directory, 1).read_bytes()

    async def body() -> None:
        async with served(root, max_refusals=1000) as s:
            stream = await s.raw()
            for frame in requests:
                frame["type"] = str(frame.get("type", "fetch"))  # the codec needs a str
                await stream.send(frame)
                reply = await stream.recv()
                assert reply is not None and reply["type"] == "error", reply
                assert reply["code"] in {"invalid", "unauthorized"}
                if reply["message"].startswith("protocol error"):  # over the request budget
                    assert await stream.recv() is None  # and closed: a new connection
                    await stream.aclose()
                    stream = await s.raw()
            await stream.aclose()
            fetcher = s.fetcher(s.ticket(spool.directory, 1, 1))
            assert await fetcher.fetch_async(1) == stored
            await fetcher.aclose()

    run(body)


def test_the_reply_state_machine_refuses_what_breaks_the_protocol() -> None:
    with pytest.raises(RemoteProtocolError, match="unexpected 'chunk'"):
        FileAssembler(1, max_size=10).receive({"type": "chunk", "data": b"x"})
    with pytest.raises(RemoteProtocolError, match="expected offset 1"):
        FileAssembler(1, max_size=10).receive({"type": "file", "offset": 2, "size": 3})
    with pytest.raises(RemoteProtocolError, match="at most 10"):
        FileAssembler(1, max_size=10).receive({"type": "file", "offset": 1, "size": 11})
    reply = FileAssembler(1, max_size=10)
    assert reply.receive({"type": "file", "offset": 1, "size": 3}) is None
    with pytest.raises(RemoteProtocolError, match="beyond"):
        reply.receive({"type": "chunk", "data": b"abcd"})
    reply = FileAssembler(1, max_size=10)
    reply.receive({"type": "file", "offset": 1, "size": 3})
    assert reply.receive({"type": "chunk", "data": b"ab"}) is None
    assert reply.receive({"type": "chunk", "data": b"c"}) == b"abc"
    assert FileAssembler(1, max_size=0).receive({"type": "file", "offset": 1, "size": 0}) == b""
    with pytest.raises(NotFound, match="gone"):
        FileAssembler(1, max_size=10).receive(
            {"type": "error", "code": "not_found", "message": "gone", "details": {}}
        )


def test_a_fetch_request_names_its_bad_field() -> None:
    good = FetchRequest("/s", 3, b"t")
    assert FetchRequest.from_wire(good.to_wire()) == good
    with pytest.raises(InvalidInput, match="'offset' of type int"):
        FetchRequest.from_wire({**good.to_wire(), "offset": "3"})
    with pytest.raises(InvalidInput, match="out of range"):
        FetchRequest.from_wire({**good.to_wire(), "offset": -1})
    with pytest.raises(InvalidInput, match="'capability' of type bytes"):
        FetchRequest.from_wire({**good.to_wire(), "capability": "t"})
    with pytest.raises(InvalidInput, match="expected a 'fetch' frame"):
        FetchRequest.from_wire({"type": "hello"})


def test_the_endpoint_travels_as_source_options() -> None:
    endpoint = FetchEndpoint("10.0.0.5:7790", "ab" * 32, "/data/keys/fetch.key", 120.0)
    options = {k.lower(): v for k, v in endpoint.to_options().items()}
    assert FetchEndpoint.from_options(options) == endpoint
    assert FetchEndpoint.from_options({}) is None
    assert FetchEndpoint.from_options({"fetch": "local"}) is None
    with pytest.raises(ValueError, match="'local' or 'remote'"):
        FetchEndpoint.from_options({"fetch": "nfs"})
    with pytest.raises(ValueError, match="fetchpin"):
        FetchEndpoint.from_options({"fetch": "remote", "fetchaddress": "h:1", "fetchkey": "k"})
    assert FetchTicket("[::1]:7790", "", "/s", b"").host_port == ("::1", 7790)


def test_remote_input_follows_the_master_unless_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORCE_ENV, raising=False)
    assert not remote_input(None, "local[2]")
    assert remote_input(None, "spark://10.0.0.1:7077")
    assert not remote_input(False, "spark://10.0.0.1:7077")
    assert remote_input(True, "local[*]")
    monkeypatch.setenv(FORCE_ENV, "1")
    assert remote_input(None, "local[2]")
    assert not remote_input(False, "local[2]")


def test_a_lost_server_is_a_fetch_failure_naming_it(tmp_path: Path) -> None:
    async def body() -> None:
        network = MemoryNetwork()
        ticket = FetchTicket("127.0.0.1:9", "", str(tmp_path), b"x" * 80)
        fetcher = SpoolFetcher(ticket, network=network, tls=False)
        with pytest.raises(FetchFailed, match=r"fetch server 127\.0\.0\.1:9"):
            await fetcher.fetch_async(1)

    run(body)


def test_a_connection_the_server_closed_while_idle_is_opened_again(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    stored = [fmt.offset_path(spool.directory, o).read_bytes() for o in (0, 1)]

    async def body() -> None:
        async with served(tmp_path, idle_timeout_s=0.05) as s:
            fetcher = s.fetcher(s.ticket(spool.directory, 0, 1))
            assert await fetcher.fetch_async(0) == stored[0]
            await wait_until(  # the server closes it: idle
                lambda: not s.server.listener.connection_count, "the idle close", 10, every_s=0.01
            )
            assert await fetcher.fetch_async(1) == stored[1]
            await fetcher.aclose()

    run(body)


def test_a_wildcard_listen_address_is_advertised_as_the_drivers_host(tmp_path: Path) -> None:
    """Executors are told an address they can connect to: the listen host itself, or for a
    wildcard the driver's advertised host; a wildcard with none is refused, naming the fix."""
    assert advertised_host("10.0.0.5", {"spark.driver.host": "10.0.0.9"}) is None
    for wildcard in ("0.0.0.0", "::", "[::]"):
        assert advertised_host(wildcard, {"spark.driver.host": "10.0.0.5"}) == "10.0.0.5"
        with pytest.raises(InvalidInput, match="give --spark-driver-host HOST"):
            advertised_host(wildcard, {})
    with pytest.raises(InvalidInput, match=r"--listen 0\.0\.0\.0 is every address"):
        advertised_host("0.0.0.0", {"spark.driver.host": "0.0.0.0"})

    async def body() -> None:
        network = MemoryNetwork()
        for host, advertise, want in (
            ("0.0.0.0", "10.0.0.5", "10.0.0.5"),
            ("10.0.0.7", None, "10.0.0.7"),
        ):
            server = FetchServer(
                KEY, tmp_path / "k", [tmp_path], host=host, network=network,
                advertise_host=advertise,
            )  # fmt: skip
            await server.start()
            try:
                assert server.address == f"{want}:{server.listener.port}"
                assert server.endpoint.address == server.address  # what the tickets carry
            finally:
                await server.close()

    run(body)
