"""Who may sign which catalog record: the storage policy of every node (storing and reading).

Catalog records (``participant:``, ``schema:``, ``stream:``, ``query:``) must be signed by a
participant this node trusts, and the names they carry must be that participant's own: a
``participant:NAME`` record names the key that signs it, under the name the trust store gives
that key; a ``schema:``/``stream:``/``query:`` record's ``owner`` label, when present, is the
signer's trusted name. So an insider (a trusted participant) cannot publish records that claim
to be another participant's. Node records (``peer:``, ``place:``) must be signed by a node key
whose certificate a trusted participant issued.
"""

from __future__ import annotations

import time
from typing import Any

from overlay.catalog import unpack
from overlay.identity import IdentityError, TrustStore, verify_node_cert
from overlay.records import Record

__all__ = ["CATALOG_PREFIXES", "NODE_PREFIXES", "record_refusal"]

CATALOG_PREFIXES = ("participant:", "schema:", "stream:", "query:")
NODE_PREFIXES = ("peer:", "place:")


def record_refusal(trust: TrustStore, record: Record, now: float | None = None) -> str | None:
    """Why ``record`` (well formed and signed) is refused, or None when it is allowed."""
    if record.key.startswith(CATALOG_PREFIXES):
        signer = trust.name_of(record.owner)
        if signer is None:
            return "record owner is not a participant this peer trusts"
        value = _safe_unpack(record.value)
        if value is None:
            return "catalog record value does not decode"
        if record.key.startswith("participant:"):
            name = record.key.partition(":")[2]
            if value.get("pk") != record.owner:
                return "participant record must be signed by the key it names"
            if name != signer or value.get("name", name) != signer:
                return f"participant record for {name!r} signed by participant {signer!r}"
            return None
        owner = value.get("owner")
        if owner is not None and owner != signer:
            return f"record claims owner {str(owner)[:64]!r} but is signed by {signer!r}"
        return None
    if record.key.startswith(NODE_PREFIXES):
        value = _safe_unpack(record.value)
        if value is None or not isinstance(value.get("cert"), bytes):
            return "node record lacks its certificate"
        try:
            cert = verify_node_cert(value["cert"], trust, time.time() if now is None else now)
        except IdentityError as exc:
            return str(exc)
        if cert.node_pub != record.owner:
            return "node record not signed by the node its certificate names"
        if record.key.startswith("peer:") and record.key[5:] != cert.node_id.hex():
            return "peer record under another node's id"
        return None
    return "unknown catalog namespace"


def _safe_unpack(raw: bytes) -> dict[str, Any] | None:
    try:
        return unpack(raw)
    except Exception:
        return None
