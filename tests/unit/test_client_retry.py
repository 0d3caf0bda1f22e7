"""Pushes that are retried are kept once (issue 11: ambiguous pushes never duplicate).

The decisions (peer.client.retry) are checked as pure functions, with Hypothesis. The retries
themselves run the real Client and PeerList against the real API server and a real LocalSite
(its spool on disk keeps the highest seq of each producer) over an in-memory network: no
sockets, no JVM. A relay between client and server loses the reply of a push after the site
appended it; fronts of the site refuse pushes with retriable errors, or never answer. Every
test counts what the stream holds afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlay.transport import FrameStream, Listener, MemoryNetwork
from peer.cli import build_parser, main
from peer.cli.commands import DEFAULT_RETRY_TIMEOUT_S, push_lines
from peer.cli.options import DEFAULT_TIMEOUT_S as CLI_TIMEOUT_S
from peer.cli.options import UsageError, parse_addrs, peer_addrs
from peer.client import Client, PeerList, RetryPolicy, new_producer_id
from peer.client.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    SERVER_LONGEST_WAIT_S,
)
from peer.client.retry import DEFAULT_RETRY_DEADLINE_S, Retrying
from peer.errors import FedstreamError, NotFound, TupleError, Unavailable
from peer.protocol.replies import (
    CreateQueryReply,
    CreateSchemaReply,
    CreateStreamReply,
    LookupReply,
    PushReply,
    SetQueryStatusReply,
    StatusReply,
)
from peer.server import ApiServer, PeerService
from peer.site import LocalSite, SiteConfig
from peer.testing import run_async

NETWORK = MemoryNetwork()
HOST = "127.0.0.1"
STREAM = "people"
PERSON = {
    "name": "person",
    "fields": [{"name": "name", "type": "string"}, {"name": "id", "type": "int"}],
}
FAST = RetryPolicy(deadline_s=5.0, first_backoff_s=0.01, max_backoff_s=0.05, jitter=0.0)
REQUEST_TIMEOUT_S = 2.0

Hook = Callable[[], Awaitable[None]]


def batch(*ids: int) -> dict[str, list[Any]]:
    return {"name": [f"p{i}" for i in ids], "id": list(ids)}


def make_client(host: str, port: int) -> Client:
    return Client(host, port, timeout_s=REQUEST_TIMEOUT_S, network=NETWORK)


def free_port() -> int:
    """An address nothing listens on: connecting to it is refused."""
    listener = Listener(_never, HOST, 0, name="placeholder", network=NETWORK)
    port = NETWORK.bind(listener, HOST, 0)
    NETWORK.unbind(HOST, port)
    return port


async def _never(stream: FrameStream) -> None:
    raise AssertionError("nobody connects here")


class Front:
    """A PeerService in front of a real LocalSite; ``before`` and ``after`` run around each
    push the site takes (to refuse it, or hang), and ``pushes`` counts the pushes that came."""

    def __init__(
        self, site: LocalSite, *, before: Hook | None = None, after: Hook | None = None
    ) -> None:
        self.site = site
        self.before = before
        self.after = after
        self.pushes = 0

    async def push(
        self, stream: str, payload: dict[str, Any], producer: str | None, seq: int | None
    ) -> PushReply:
        self.pushes += 1
        if self.before is not None:
            await self.before()
        reply = await self.site.push(stream, payload, producer, seq)
        if self.after is not None:
            await self.after()
        return reply

    async def create_schema(self, schema: str | dict[str, Any]) -> CreateSchemaReply:
        return await self.site.create_schema(schema)

    async def create_stream(
        self, name: str, schema: str, replicas: int | None = None
    ) -> CreateStreamReply:
        return await self.site.create_stream(name, schema)

    async def create_query(self, query: str | dict[str, Any]) -> CreateQueryReply:
        return await self.site.create_query(query)

    async def set_query_status(self, name: str, status: str) -> SetQueryStatusReply:
        return await self.site.set_query_status(name, status)

    def subscribe(self, stream: str, start: str) -> AsyncIterator[dict[str, Any]]:
        return self.site.subscribe(stream, start)

    async def lookup(self, name: str) -> LookupReply:
        return await self.site.lookup(name)

    async def status(self) -> StatusReply:
        return await self.site.status()


class Refusals:
    """A hook that raises ``error`` its first ``times`` calls."""

    def __init__(self, times: int, error: FedstreamError | None = None) -> None:
        self.left = times
        self.error = error or Unavailable(
            f"stream {STREAM}: too few in-sync replicas reachable; retry later", stream=STREAM
        )

    async def __call__(self) -> None:
        if self.left > 0:
            self.left -= 1
            raise self.error


async def hang() -> None:
    await asyncio.Event().wait()


class LossyRelay:
    """A hop between clients and a server that loses the reply to the first ``lose`` pushes:
    it closes the client's connection when the reply arrives, so the site has appended the
    batch but the client cannot know. With ``vanish``, it then stops listening too (the peer
    is gone: a reconnect is refused)."""

    def __init__(self, target: int, *, lose: int = 1, vanish: bool = False) -> None:
        self.target = target
        self.lose = lose
        self.vanish = vanish
        self.lost = 0
        self.listener = Listener(self._serve, HOST, 0, name="lossy relay", network=NETWORK)

    async def _serve(self, client_side: FrameStream) -> None:
        server_side = await NETWORK.connect(HOST, self.target)
        pushes: set[int] = set()

        async def requests() -> None:
            while (frame := await client_side.recv()) is not None:
                if frame.get("type") == "push":
                    pushes.add(frame["id"])
                await server_side.send(frame)

        try:
            async with asyncio.TaskGroup() as group:
                forwarding = group.create_task(requests())
                while (frame := await server_side.recv()) is not None:
                    if frame.get("id") in pushes and self.lost < self.lose:
                        self.lost += 1
                        if self.vanish:
                            NETWORK.unbind(HOST, self.listener.port)
                        break  # the reply is lost: the listener closes the client's side
                    await client_side.send(frame)
                forwarding.cancel()
        finally:
            await server_side.aclose()


@contextlib.asynccontextmanager
async def site_with_stream(root: Path) -> AsyncIterator[LocalSite]:
    site = LocalSite(SiteConfig(data_dir=root))
    try:
        await site.create_schema(PERSON)
        await site.create_stream(STREAM, "person")
        yield site
    finally:
        await site.close()


@contextlib.asynccontextmanager
async def serving(service: PeerService) -> AsyncIterator[int]:
    server = ApiServer(service, HOST, 0, network=NETWORK)
    await server.start()
    try:
        yield server.port
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def relaying(relay: LossyRelay) -> AsyncIterator[int]:
    async with relay.listener:
        yield relay.listener.port


def held(site: LocalSite) -> list[int]:
    """The ids of every tuple the stream holds, in order (offsets count batches)."""
    spool = site.spools.get(STREAM)
    return [i for _, table in spool.read(-1, spool.latest) for i in table.column("id").to_pylist()]


# -- the decisions (pure) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"deadline_s": -1.0}, "deadline_s"),
        ({"first_backoff_s": float("nan")}, "first_backoff_s"),
        ({"max_backoff_s": float("inf")}, "max_backoff_s"),
        ({"first_backoff_s": 2.0, "max_backoff_s": 1.0}, "exceeds max_backoff_s"),
        ({"jitter": 1.5}, "jitter"),
    ],
)
def test_a_bad_policy_names_the_setting(options: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        RetryPolicy(**options)


policies = st.builds(
    RetryPolicy,
    deadline_s=st.floats(0, 60),
    first_backoff_s=st.floats(0.001, 1),
    max_backoff_s=st.floats(1, 10),
    jitter=st.floats(0, 1),
)
draws = st.floats(0, 1, exclude_max=True)


@given(policies, st.integers(1, 200), draws)
def test_waits_grow_exponentially_to_the_cap_less_their_random_part(
    policy: RetryPolicy, retry: int, draw: float
) -> None:
    base = min(policy.max_backoff_s, policy.first_backoff_s * 2 ** min(retry - 1, 64))
    wait = policy.backoff_s(retry, draw)
    assert base * (1 - policy.jitter) <= wait * (1 + 1e-9) and wait <= base
    assert policy.backoff_s(retry + 1, 0.0) >= policy.backoff_s(retry, 0.0)


@given(policies, st.lists(draws, min_size=1, max_size=400), st.floats(0, 5))
def test_no_try_starts_after_the_deadline(
    policy: RetryPolicy, draw_list: list[float], work_s: float
) -> None:
    """However long each try takes (``work_s``), the tries started by the waits all start
    before the deadline, and the retries end: giving up is None, once."""
    retrying = Retrying(policy, started=100.0)
    now = 100.0
    for draw in draw_list:
        now += work_s  # the try itself
        wait = retrying.next_wait(now, draw)
        if wait is None:
            break
        now += wait
        assert now <= 100.0 + policy.deadline_s
    else:
        # Still going after 400 tries: only if each wait and try took (almost) nothing.
        assert work_s * len(draw_list) <= policy.deadline_s
    assert retrying.attempts == retrying.retries + 1


def test_retrying_counts_tries_and_gives_up() -> None:
    retrying = Retrying(RetryPolicy(deadline_s=1.0, first_backoff_s=0.25, jitter=0), 0.0)
    assert [retrying.next_wait(0.0, 0.5) for _ in range(3)] == [0.25, 0.5, 1.0]
    assert retrying.attempts == 4
    assert Retrying(RetryPolicy(deadline_s=0.0), 0.0).next_wait(0.0, 0.0) is None


def test_producer_ids_are_fresh_and_named() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("cli:") and len(i) == 20 and int(i[4:], 16) >= 0 for i in ids)
    assert new_producer_id("sensor").startswith("sensor:")
    with pytest.raises(ValueError, match="prefix"):
        new_producer_id("a:b")


def test_the_client_waits_longer_than_any_wait_of_the_peer() -> None:
    """The relation of the timeouts (issue 11): a peer that is only waiting answers before the
    client gives up. Equal numbers (30 s and 30 s, as before) fail this."""
    from peer.federation.forward import FORWARD_DEADLINE_S
    from peer.node import PeerConfig

    server_waits = [
        SiteConfig(data_dir=Path("unused")).backlog_wait_s,
        PeerConfig().backlog_wait_s,
        FORWARD_DEADLINE_S,
    ]
    assert max(server_waits) <= SERVER_LONGEST_WAIT_S
    assert DEFAULT_TIMEOUT_S > SERVER_LONGEST_WAIT_S and CLI_TIMEOUT_S > SERVER_LONGEST_WAIT_S
    assert Client().timeout_s == DEFAULT_TIMEOUT_S
    assert Client().connect_timeout_s == DEFAULT_CONNECT_TIMEOUT_S
    assert Client(timeout_s=1).connect_timeout_s == 1
    assert DEFAULT_RETRY_TIMEOUT_S == DEFAULT_RETRY_DEADLINE_S


# -- the CLI's options (pure) -----------------------------------------------------------------


def test_peer_lists_parse_in_order_once() -> None:
    assert parse_addrs("a:1, b:2,a:1,[::1]:3", what="--peer") == [("a", 1), ("b", 2), ("::1", 3)]
    for bad in ("a:1,", ",a:1", "a:1,,b:2", "a:1,b"):
        with pytest.raises(UsageError, match="--peer"):
            parse_addrs(bad, what="--peer")


def test_peer_list_from_option_else_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    monkeypatch.setenv("PEER_ADDR", "h1:7700,h2:7710")
    assert peer_addrs(parser.parse_args(["status"])) == [("h1", 7700), ("h2", 7710)]
    assert peer_addrs(parser.parse_args(["status", "--peer", "x:1,y:2"])) == [("x", 1), ("y", 2)]
    monkeypatch.setenv("PEER_ADDR", "h1:7700,oops")
    with pytest.raises(UsageError, match="PEER_ADDR"):
        peer_addrs(parser.parse_args(["status"]))
    monkeypatch.delenv("PEER_ADDR")
    assert peer_addrs(parser.parse_args(["status"])) == [("127.0.0.1", 7700)]


def test_push_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["push", "people", "f.jsonl", "--producer", "cli:ab"])
    assert (args.producer, args.retry_timeout) == ("cli:ab", DEFAULT_RETRY_TIMEOUT_S)
    for bad in (["--retry-timeout", "-1"], ["--producer", " "], ["--batch-size", "0"]):
        # Refused before any peer is asked (none listens on port 1).
        assert main(["push", "people", "--peer", "127.0.0.1:1", *bad]) == 2
        assert bad[0] in capsys.readouterr().err


# -- retried pushes over the API --------------------------------------------------------------


def test_a_push_whose_reply_is_lost_is_kept_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site, serving(site) as port:
            relay = LossyRelay(port)
            async with relaying(relay) as front, PeerList([(HOST, front)], make_client) as peers:
                reply = await peers.push(STREAM, batch(1, 2), producer="w", seq=1, policy=FAST)
                assert relay.lost == 1
                assert reply["duplicate"] is True  # the first send was appended
                reply = await peers.push(STREAM, batch(3), producer="w", seq=2, policy=FAST)
                assert reply["duplicate"] is False
            assert held(site) == [1, 2, 3]

    run_async(body)


def test_without_an_event_id_a_resend_duplicates(tmp_path: Path) -> None:
    """What the relay does to a client that resends without an event id (the defect of
    issue 11): the lost reply's batch was appended, and the resend appends it again."""

    async def body() -> None:
        async with site_with_stream(tmp_path) as site, serving(site) as port:
            async with relaying(LossyRelay(port)) as front:
                async with make_client(HOST, front) as client:
                    with pytest.raises(Unavailable, match="closed the connection"):
                        await client.push(STREAM, batch(1))
                async with make_client(HOST, front) as client:
                    await client.push(STREAM, batch(1))
            assert held(site) == [1, 1]

    run_async(body)


@pytest.mark.parametrize("appended_first", [False, True])
def test_retriable_refusals_are_retried_and_the_batch_kept_once(
    tmp_path: Path, appended_first: bool
) -> None:
    """Refused twice with a retriable error, before the site appended the batch (a backlog,
    too few replicas) or after (the append landed, the acknowledgement did not)."""

    async def body() -> None:
        async with site_with_stream(tmp_path) as site:
            refusals = Refusals(2)
            front = Front(site, after=refusals) if appended_first else Front(site, before=refusals)
            async with serving(front) as port, PeerList([(HOST, port)], make_client) as peers:
                reply = await peers.push(STREAM, batch(7, 8), producer="w", seq=1, policy=FAST)
            assert front.pushes == 3 and refusals.left == 0
            assert reply["duplicate"] is appended_first
            assert held(site) == [7, 8]

    run_async(body)


def test_a_refusal_that_is_not_retriable_is_final_at_once(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site:
            front = Front(site, before=Refusals(1, TupleError("tuple 0 field 'id' is not int")))
            async with serving(front) as port, PeerList([(HOST, port)], make_client) as peers:
                with pytest.raises(TupleError, match="field 'id'"):
                    await peers.push(STREAM, batch(1), producer="w", seq=1, policy=FAST)
                with pytest.raises(NotFound):
                    await peers.push("nope", batch(1), producer="w", seq=2, policy=FAST)
            assert front.pushes == 2 and held(site) == []

    run_async(body)


def test_retries_end_at_the_deadline_naming_the_batch(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site:
            front = Front(site, before=Refusals(10_000))
            policy = RetryPolicy(deadline_s=0.3, first_backoff_s=0.02, max_backoff_s=0.1)
            async with serving(front) as port, PeerList([(HOST, port)], make_client) as peers:
                with pytest.raises(Unavailable) as refused:
                    await peers.push(STREAM, batch(1), producer="cli:ab", seq=4, policy=policy)
            assert "batch 4 of producer cli:ab" in refused.value.message
            assert "too few in-sync replicas" in refused.value.message
            assert refused.value.details == {"stream": STREAM, "producer": "cli:ab", "seq": 4}
            assert 3 <= front.pushes <= 15  # retried, with growing waits, and then no more
            assert held(site) == []

    run_async(body)


def test_an_overdue_reply_moves_the_push_to_the_next_peer(tmp_path: Path) -> None:
    """A peer that never answers (longer than the client's timeout) is left for the next
    one; the batch lands once."""

    async def body() -> None:
        async with site_with_stream(tmp_path) as site:
            stuck = Front(site, before=hang)
            async with serving(stuck) as a, serving(site) as b:
                quick = RetryPolicy(deadline_s=5.0, first_backoff_s=0.01, jitter=0)

                def impatient(host: str, port: int) -> Client:
                    return Client(host, port, timeout_s=0.3, network=NETWORK)

                async with PeerList([(HOST, a), (HOST, b)], impatient) as peers:
                    assert peers.client.port == a
                    await peers.push(STREAM, batch(5), producer="w", seq=1, policy=quick)
                    assert peers.client.port == b
            assert stuck.pushes == 1 and held(site) == [5]

    run_async(body)


def test_a_peer_list_connects_to_the_first_that_answers(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site, serving(site) as b:
            dead = free_port()
            args = build_parser().parse_args(["status", "--peer", f"{HOST}:{dead},{HOST}:{b}"])
            async with PeerList(peer_addrs(args), make_client) as peers:
                assert peers.client.port == b
                assert (await peers.client.lookup_object(STREAM))["kind"] == "stream"
            other = free_port()
            with pytest.raises(Unavailable) as none:
                await PeerList([(HOST, dead), (HOST, other)], make_client).connect()
            assert (
                f"{HOST}:{dead}" in none.value.message and f"{HOST}:{other}" in none.value.message
            )

    run_async(body)


def test_cli_push_moves_on_when_its_peer_is_lost(tmp_path: Path) -> None:
    """``peer push --peer a,b``: a dies right after appending the first chunk, before its
    reply; the chunk is sent again to b under the same event id, and every row is held once."""

    async def body() -> None:
        async with site_with_stream(tmp_path) as site, serving(site) as b:
            relay = LossyRelay(b, vanish=True)
            lines = [json.dumps({"name": f"p{i}", "id": i}) for i in range(5)]
            async with relaying(relay) as a, PeerList([(HOST, a), (HOST, b)], make_client) as peers:
                result = await push_lines(peers, STREAM, lines, "jsonl", 2, "cli:00ff", FAST)
                assert peers.client.port == b
            assert relay.lost == 1
            assert result == {"stream": STREAM, "pushed": 5, "duplicates": 2}
            assert held(site) == [0, 1, 2, 3, 4]

    run_async(body)


def test_cli_push_resumes_a_run_by_its_producer_id(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site, serving(site) as port:
            lines = [json.dumps({"name": f"p{i}", "id": i}) for i in range(6)]
            async with PeerList([(HOST, port)], make_client) as peers:
                first = await push_lines(peers, STREAM, lines[:4], "jsonl", 2, "cli:1", FAST)
                again = await push_lines(peers, STREAM, lines, "jsonl", 2, "cli:1", FAST)
                other = await push_lines(peers, STREAM, lines[:1], "jsonl", 2, "cli:2", FAST)
            assert first == {"stream": STREAM, "pushed": 4}
            assert again == {"stream": STREAM, "pushed": 6, "duplicates": 4}
            assert other == {"stream": STREAM, "pushed": 1}  # another producer's seq 1 is new
            assert held(site) == [0, 1, 2, 3, 4, 5, 0]

    run_async(body)


def test_cli_push_that_gives_up_says_how_to_resume(tmp_path: Path) -> None:
    async def body() -> None:
        async with site_with_stream(tmp_path) as site:
            refusals = Refusals(10_000)
            front = Front(site)
            lines = [json.dumps({"name": f"p{i}", "id": i}) for i in range(3)]
            policy = RetryPolicy(deadline_s=0.1, first_backoff_s=0.02)
            async with serving(front) as port, PeerList([(HOST, port)], make_client) as peers:

                async def refuse_after_first() -> None:
                    if front.pushes > 1:
                        await refusals()

                front.before = refuse_after_first
                with pytest.raises(Unavailable) as refused:
                    await push_lines(peers, STREAM, lines, "jsonl", 2, "cli:77", policy)
            message = refused.value.message
            assert "2 rows were acknowledged" in message and "--producer cli:77" in message
            assert held(site) == [0, 1]

    run_async(body)
