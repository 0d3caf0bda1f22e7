"""A query's ``query:`` record carries a small definition itself (so it outlives its publisher,
the one provider of the blob), checked against the record's hash like a fetched body."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from overlay.catalog import Catalog, CatalogError

BODY = b'{"boxes": [], "name": "q"}'


def catalog_with(pointer: dict[str, Any]) -> Catalog:
    key = Ed25519PrivateKey.generate()
    catalog = Catalog(object(), participant="acme", participant_key=key, node_key=key)  # type: ignore[arg-type]

    async def read(_key: str, *, fresh: bool = False) -> dict[str, Any] | None:
        return pointer

    catalog.read = read  # type: ignore[method-assign,assignment]
    return catalog


def fetch_recording(calls: list[bytes], answer: bytes | None) -> Any:
    async def fetch(provider: bytes, _digest: bytes) -> bytes | None:
        calls.append(provider)
        return answer

    return fetch


def pointer(**more: Any) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(BODY).digest(), "size": len(BODY), **more}


def test_an_inline_body_is_taken_without_asking_a_provider() -> None:
    calls: list[bytes] = []
    catalog = catalog_with(pointer(body=BODY, providers=[b"p" * 20]))
    found = asyncio.run(catalog.fetch_body("query:q", fetch_recording(calls, None)))
    assert found is not None and found[1] == BODY
    assert calls == []


def test_an_inline_body_that_does_not_match_the_hash_is_ignored() -> None:
    calls: list[bytes] = []
    catalog = catalog_with(pointer(body=b"forged", providers=[b"p" * 20]))
    found = asyncio.run(catalog.fetch_body("query:q", fetch_recording(calls, BODY)))
    assert found is not None and found[1] == BODY
    assert calls == [b"p" * 20]


def test_without_an_inline_body_and_no_provider_answering_it_is_a_retriable_error() -> None:
    catalog = catalog_with(pointer(providers=[b"p" * 20]))
    with pytest.raises(CatalogError) as caught:
        asyncio.run(catalog.fetch_body("query:q", fetch_recording([], None)))
    assert caught.value.retriable
