"""A site's configuration, and its storage opened before the site (and its engine) are made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from peer.model.limits import ContentLimits
from peer.model.schema import to_arrow_schema
from peer.storage.catalog import LocalCatalog
from peer.storage.spool import SpoolSet


@dataclass(frozen=True)
class SiteConfig:
    data_dir: Path
    # Backpressure: how many batches a stream may hold that its slowest reader (a query, a
    # mirror to another peer) has not taken; beyond it, pushes and mirrored appends wait
    # (up to backlog_wait_s, then a retriable error) and queries writing it read no input.
    max_backlog_batches: int = 1000
    backlog_wait_s: float = 30.0
    # How long a stream no query reads (a result stream) keeps its tuples for late subscribers.
    retention_s: float = 600.0
    # What one request may ask (pushed bytes, query size; peer.model.limits).
    limits: ContentLimits = field(default_factory=ContentLimits)


@dataclass(frozen=True)
class SiteStore:
    """A site's storage: its local catalog and its spools (those the catalog names made if
    missing; a spool that does not open is quarantined). Opened before the engine, which
    reads the spools, so that the site is made with both."""

    catalog: LocalCatalog
    spools: SpoolSet

    @classmethod
    def open(cls, data_dir: Path) -> SiteStore:
        data_dir.mkdir(parents=True, exist_ok=True)
        catalog = LocalCatalog(data_dir / "catalog.sqlite")
        spools = SpoolSet(data_dir / "spool")  # quarantines what does not open
        for name in catalog.stream_names():
            if name not in spools and spools.quarantine_of(name) is None:
                spools.create(name, to_arrow_schema(catalog.stream(name).schema))
        return cls(catalog, spools)
