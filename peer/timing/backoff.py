"""How long to wait before trying again: exponential backoff, capped, with optional jitter.

The wait before retry number ``n`` (1, 2, ...) is ``first_s * 2 ** (n - 1)``, at most
``max_s``, shortened by a random share of at most ``jitter`` (the caller draws the random
number, so the policy stays pure and a test gives it a fixed draw). The client's
:class:`peer.client.retry.RetryPolicy` and every retry loop in the peer use this one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff from ``first_s`` doubling to ``max_s`` (seconds)."""

    first_s: float
    max_s: float
    jitter: float = 0.0  # the share of each wait that is drawn at random

    def __post_init__(self) -> None:
        for name in ("first_s", "max_s", "jitter"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"backoff: {name} must be a finite number >= 0, not {value}")
        if self.first_s > self.max_s:
            raise ValueError(f"backoff: first_s ({self.first_s}) exceeds max_s ({self.max_s})")
        if self.jitter > 1:
            raise ValueError(f"backoff: jitter must be between 0 and 1, not {self.jitter}")

    def delay_s(self, retry: int, draw: float = 0.0) -> float:
        """The wait before retry number ``retry`` (1, 2, ...), ``draw`` in [0, 1)."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, not {retry}")
        if not 0 <= draw < 1:
            raise ValueError(f"a random draw is in [0, 1), not {draw}")
        # 2 ** 64 is far beyond any max_s: cap the exponent, not the float.
        base = min(self.max_s, self.first_s * 2.0 ** min(retry - 1, 64))
        return base * (1 - self.jitter * draw)
