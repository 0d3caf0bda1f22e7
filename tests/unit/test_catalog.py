"""The peer's local catalog: streams keep the schema they were made with."""

from __future__ import annotations

from pathlib import Path

import pytest

from peer.errors import AlreadyExists
from peer.model.schema import parse_schema
from peer.storage.catalog import LocalCatalog

PERSON = parse_schema({"name": "person", "fields": [{"name": "id", "type": "int"}]})
# A query result stream named "person" gets a derived schema of that name, other fields.
DERIVED = parse_schema({"name": "person", "fields": [{"name": "who", "type": "string"}]})


def test_a_stream_whose_schema_name_is_taken_by_other_fields_is_refused(tmp_path: Path) -> None:
    catalog = LocalCatalog(tmp_path / "catalog.sqlite")
    catalog.add_schema(PERSON)
    with pytest.raises(AlreadyExists, match="stream person needs schema person"):
        catalog.add_stream("person", DERIVED, "some_query")
    assert catalog.find_stream("person") is None  # nothing written
    assert catalog.schema("person") == PERSON


def test_streams_survive_a_reopen_with_their_schema(tmp_path: Path) -> None:
    catalog = LocalCatalog(tmp_path / "catalog.sqlite")
    catalog.add_schema(PERSON)
    catalog.add_stream("people", PERSON)
    catalog.add_stream("people", PERSON)  # the same again: idempotent
    with pytest.raises(AlreadyExists, match="stream people already exists"):
        catalog.add_stream("people", DERIVED.renamed("other"))
    catalog.close()
    reopened = LocalCatalog(tmp_path / "catalog.sqlite")
    entry = reopened.stream("people")
    assert entry.schema == PERSON
    assert reopened.stream("people") is entry  # served from the cache the second time


def test_a_replica_mark_is_removed_and_its_stream_stays(tmp_path: Path) -> None:
    catalog = LocalCatalog(tmp_path / "catalog.sqlite")
    catalog.add_schema(PERSON)
    catalog.add_stream("people", PERSON)
    catalog.add_replica("people", "ab" * 20)
    assert catalog.replicas() == {"people": "ab" * 20}
    catalog.remove_replica("people")
    catalog.close()
    reopened = LocalCatalog(tmp_path / "catalog.sqlite")
    assert reopened.replicas() == {}
    assert reopened.stream("people").schema == PERSON
