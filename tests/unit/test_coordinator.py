"""The coordinator of a distributed query (peer.federation.coordinator) against fake peers.

No sockets and no JVM: the router, the catalog records and the hosting are fakes that record
what the coordinator sends; the query model, its check and the fragmenting are real. A failure
in the middle of ``create`` must leave nothing behind: every fragment installed before it is
deleted again at its site, downstream first, and the error reaches the caller.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from overlay.membership import MemberInfo
from peer.errors import Conflict, FedstreamError, Unavailable
from peer.federation.coordinator import Coordinator
from peer.model import plan
from peer.model.query import Query, parse_query
from peer.model.schema import Schema, parse_schema
from peer.protocol.link import FragmentStatus, InstallFragment, Request, StartMirror
from peer.site import LocalSite, SiteConfig

A, B, C = (bytes([n]) * 20 for n in (1, 2, 3))
SCHEMA = parse_schema({"name": "kv", "fields": [{"name": "k", "type": "int"}]})
# three boxes, each placed on another participant's peer: three fragments in a chain
CHAIN = {
    "name": "chain",
    "boxes": [
        {
            "name": f"b{i}",
            "type": "filter",
            "inputs": [src],
            "outputs": [dst],
            "params": {"expression.0": "k > 0"},
            "node": node,
        }
        for i, (src, dst, node) in enumerate(
            [("src", "s1", "alpha"), ("s1", "s2", "beta"), ("s2", "out", "gamma")]
        )
    ],
}


def member(node_id: bytes, participant: str) -> MemberInfo:
    return MemberInfo(node_id, participant, b"", ("127.0.0.1", 1), ("127.0.0.1", 2), True, 1)


class FakeRouter:
    """Records each message per site; fails the install at ``fail_at`` (0-based)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.sent: list[tuple[bytes, Request]] = []
        self.fail_at = fail_at
        self.installs = 0

    async def ask(self, node_id: bytes, message: Request) -> dict[str, Any]:
        self.sent.append((node_id, message))
        if isinstance(message, InstallFragment):
            self.installs += 1
            if self.installs - 1 == self.fail_at:
                raise Unavailable(f"peer {node_id.hex()[:12]} unreachable")
        return {}


class FakeRecords:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def query_pointer(self, name: str) -> dict[str, Any] | None:
        return None

    async def stream_schema(self, stream: str) -> Schema:
        return SCHEMA

    async def stream_or_none(self, stream: str) -> dict[str, Any] | None:
        return None

    async def publish_query(self, name: str, plan: dict[str, Any], info: dict[str, Any]) -> None:
        self.published.append(name)


def coordinator(router: FakeRouter, records: FakeRecords) -> Coordinator:
    members = [member(A, "alpha"), member(B, "beta"), member(C, "gamma")]
    overlay = SimpleNamespace(
        live_members=lambda: members, identity=SimpleNamespace(participant="alpha")
    )

    async def host_of(stream: str, *, fresh: bool = False) -> bytes:
        return A

    hosting = SimpleNamespace(host_of=host_of)
    return Coordinator(overlay, records, hosting, router)  # type: ignore[arg-type]


def test_a_query_over_three_peers_is_installed_wired_and_published() -> None:
    router, records = FakeRouter(), FakeRecords()
    reply = asyncio.run(coordinator(router, records).create(parse_query(CHAIN)))
    assert [f["site"] for f in reply["fragments"]] == [A.hex(), B.hex(), C.hex()]
    installs = [(n, m) for n, m in router.sent if isinstance(m, InstallFragment)]
    assert [n for n, _ in installs] == [A, B, C]
    mirrors = [(n, m.stream, m.to) for n, m in router.sent if isinstance(m, StartMirror)]
    assert mirrors == [(A, "s1", B), (B, "s2", C)]
    assert records.published == ["chain"]
    assert not any(isinstance(m, FragmentStatus) for _, m in router.sent)


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_failed_install_undoes_the_fragments_before_it(fail_at: int) -> None:
    router, records = FakeRouter(fail_at=fail_at), FakeRecords()
    with pytest.raises(Unavailable):
        asyncio.run(coordinator(router, records).create(parse_query(CHAIN)))
    installed = [n for n, m in router.sent if isinstance(m, InstallFragment)][:fail_at]
    undone = [
        (n, m.status)
        for n, m in router.sent
        if isinstance(m, FragmentStatus)  # only after the failure
    ]
    assert undone == [(n, "DELETED") for n in reversed(installed)]  # downstream first
    assert records.published == []


def test_a_failed_wiring_undoes_every_fragment() -> None:
    class WiringFails(FakeRouter):
        async def ask(self, node_id: bytes, message: Request) -> dict[str, Any]:
            if isinstance(message, StartMirror):
                raise Conflict("no such stream here")
            return await super().ask(node_id, message)

    router, records = WiringFails(), FakeRecords()
    with pytest.raises(FedstreamError):
        asyncio.run(coordinator(router, records).create(parse_query(CHAIN)))
    undone = [n for n, m in router.sent if isinstance(m, FragmentStatus)]
    assert undone == [C, B, A]
    assert records.published == []


def test_the_coordinator_checks_a_query_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = plan.check_query

    def counting(query: Query, streams: Any) -> plan.CheckedQuery:
        calls.append(query.name)
        return real(query, streams)

    monkeypatch.setattr("peer.federation.coordinator.check_query", counting)
    asyncio.run(coordinator(FakeRouter(), FakeRecords()).create(parse_query(CHAIN)))
    assert calls == ["chain"]


def test_a_lone_site_parses_and_checks_a_query_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the client's definition to the running query's plan: one parse, one check; the
    site keeps the checked query for its later starts (the catalog hands out fresh copies)."""
    checks: list[str] = []
    parses: list[object] = []
    real_check, real_parse = plan.check_query, parse_query

    def counting_check(query: Query, streams: Any) -> plan.CheckedQuery:
        checks.append(query.name)
        return real_check(query, streams)

    def counting_parse(source: Any, **options: Any) -> Query:
        parses.append(source)
        return real_parse(source, **options)

    monkeypatch.setattr("peer.site.local.check_query", counting_check)
    monkeypatch.setattr("peer.site.local.parse_query", counting_parse)

    async def go() -> None:
        site = LocalSite(SiteConfig(data_dir=tmp_path))
        try:
            await site.create_schema({"name": "kv", "fields": [{"name": "k", "type": "int"}]})
            await site.create_stream("src", "kv")
            one = {**CHAIN, "boxes": [{**CHAIN["boxes"][0], "node": None}]}  # type: ignore[dict-item]
            await site.create_query(one)
            entry = site.catalog.query("chain")
            checked = site.checked(entry.query)
            assert checked.outputs == ("s1",)
        finally:
            await site.close()

    asyncio.run(go())
    assert len(parses) == 1 and checks == ["chain"]
