"""Bytes carried by a set of links, counted across their lifetimes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Traffic"]


class _Counted(Protocol):
    @property
    def traffic(self) -> tuple[int, int]: ...


@dataclass
class Traffic:
    """Bytes over a set of links: those still open are counted from their streams, the closed
    ones here (:meth:`close` as a link ends), so the totals only grow."""

    sent_bytes: int = 0
    received_bytes: int = 0

    def close(self, link: _Counted) -> None:
        sent, received = link.traffic
        self.sent_bytes += sent
        self.received_bytes += received

    def totals(self, live: Iterable[_Counted]) -> tuple[int, int]:
        sent, received = self.sent_bytes, self.received_bytes
        for link in live:
            s, r = link.traffic
            sent, received = sent + s, received + r
        return sent, received
