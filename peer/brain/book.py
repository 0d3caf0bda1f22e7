"""The contracts a peer holds: its contracts directory, checked against its trust store."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contracts.book import ContractBook
    from overlay.identity import NodeIdentity, TrustStore

log = logging.getLogger(__name__)


def load_contracts(directory: Path, identity: NodeIdentity, trust: TrustStore) -> ContractBook:
    """The valid contracts of ``directory`` that involve our participant, each party's key
    checked against the trust store (our own key, ``--trust``, ``DATA_DIR/trust``); each
    partner's key becomes trusted (its peers may link to us). A refused file is logged with
    its reason and never used."""
    from contracts.book import ContractBook
    from overlay.identity import IdentityError

    me = identity.participant
    book = ContractBook.load_dir(directory, me, datetime.now(UTC), known_keys=trust.participants())
    for refusal in book.refused:
        if refusal.reason == "not-a-party":  # another pair's contract: not ours to use
            log.debug("contract %s: %s", refusal.path.name, refusal.error)
        else:
            log.warning("contract %s refused: %s", refusal.path.name, refusal.error)
    for name, key in book.public_keys().items():
        try:
            trust.add(name, key)
        except IdentityError as exc:
            log.warning("contract partner %s not trusted: %s", name, exc)
    log.info("%d contract(s) with %s", len(book.contracts), ", ".join(book.partners()))
    return book
