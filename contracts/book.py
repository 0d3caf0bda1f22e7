"""A participant's contract book: the valid contracts of a directory that involve it.

A contract only proves that its two keys signed it; anyone can write one that puts their own
key under another participant's name. So the book checks every party's key against the keys
it already knows (``known_keys``: pass your own key at least) and against the contracts it has
already accepted: a participant has one key in the whole book. Files are read in name order
and a later file that disagrees with an earlier one is refused, never the earlier one.

The book is a snapshot at ``now``: a contract that expires later stays in it until the book is
loaded again. Refused files are kept with their reason, for ``peer status`` and logs; nothing
else reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from contracts.contract import Contract, ContractError, load, price_range, verify

__all__ = ["ContractBook", "Refusal"]


@dataclass(frozen=True)
class Refusal:
    path: Path
    error: ContractError

    @property
    def reason(self) -> str:
        return self.error.reason


class ContractBook:
    def __init__(self, me: str, contracts: list[Contract], refused: list[Refusal]) -> None:
        self.me = me
        self.contracts = tuple(contracts)
        self.refused = tuple(refused)

    @classmethod
    def load_dir(
        cls,
        directory: Path,
        me: str,
        now: datetime,
        *,
        known_keys: Mapping[str, bytes] | None = None,
    ) -> ContractBook:
        """Every ``*.toml`` of ``directory``: valid ones that involve ``me`` are kept."""
        if not directory.is_dir():
            raise ContractError("unreadable", f"contracts directory {directory} does not exist")
        keys = dict(known_keys or {})
        ids: dict[str, Path] = {}
        kept: list[Contract] = []
        refused: list[Refusal] = []
        for path in sorted(directory.glob("*.toml")):
            try:
                contract = load(path)
                if contract.party(me) is None:
                    raise ContractError(
                        "not-a-party",
                        f"{contract.label} is between {' and '.join(contract.names)}, "
                        f"not participant {me}",
                    )
                verify(contract, now, known_keys=keys)
                if contract.id in ids:
                    raise ContractError(
                        "duplicate",
                        f"{contract.label}: duplicate: {ids[contract.id]} has the same id",
                    )
            except ContractError as exc:
                refused.append(Refusal(path, exc))
                continue
            ids[contract.id] = path
            keys.update((p.name, p.public_key) for p in contract.parties)
            kept.append(contract)
        return cls(me, kept, refused)

    def partners(self) -> list[str]:
        """The participants ``me`` holds a valid contract with, sorted."""
        names = set()
        for c in self.contracts:
            partner = c.other(self.me)
            assert partner is not None
            names.add(partner.name)
        return sorted(names)

    def contracts_with(self, name: str) -> list[Contract]:
        """The contracts with participant ``name``, cheapest first (lowest price, then id)."""
        found = [c for c in self.contracts if c.party(name) is not None and name != self.me]
        return sorted(found, key=lambda c: (price_range(c), c.id))

    def public_keys(self) -> dict[str, bytes]:
        """Partner name -> raw Ed25519 public key, for ``TrustStore.add``."""
        keys: dict[str, bytes] = {}
        for c in self.contracts:
            partner = c.other(self.me)
            assert partner is not None
            keys[partner.name] = partner.public_key
        return keys
