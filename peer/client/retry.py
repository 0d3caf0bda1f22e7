"""When and how long to wait before trying a push again: the pure part of retrying.

Theory of operation
-------------------
A push whose reply never arrives is *ambiguous*: the peer may have appended the batch and
lost only the reply (the connection dropped after the fsync, or the client's wait ran out).
Sending it again is safe only because it carries the same event id, a (producer, seq) pair:
the stream's log keeps the highest seq of each producer and drops a batch at or below it,
answering ``duplicate: true``, which counts as success. So:

* a producer id names one writer for as long as it may resume (:func:`new_producer_id`, e.g.
  ``cli:3f9a0c1d2b4e5f60``); its seqs rise by one per batch, and one batch is in flight at a
  time, so a retried seq is never below one the log already took from a later batch;
* a refusal is retried only if its error class says ``retriable`` (the peer is unavailable,
  the stream backlogged, too few in-sync replicas reachable, the connection lost or the
  wait run out); anything else (a bad tuple, an unknown stream) is final at once;
* waits grow exponentially from ``first_backoff_s`` to ``max_backoff_s``, each shortened by a
  random part (``jitter``) so that many writers refused together do not return together;
* the whole retry of one batch is bounded by ``deadline_s`` from its first try: no new try
  starts later than that, so a writer gives up after at most ``deadline_s`` plus one
  request's timeout, and says how far it got.

:class:`Retrying` makes these decisions for one batch, given the time and a random draw; it
does no I/O and never sleeps. :class:`peer.client.peers.PeerList` drives it: it sleeps, and
reconnects (to the next peer of its list) when the connection is gone.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

from peer.timing import Backoff

__all__ = ["DEFAULT_RETRY_DEADLINE_S", "RetryPolicy", "Retrying", "new_producer_id"]

DEFAULT_RETRY_DEADLINE_S = 120.0  # long enough to ride out a failover and a backlog wait


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one batch is retried (times in seconds; see the module notes)."""

    deadline_s: float = DEFAULT_RETRY_DEADLINE_S
    first_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter: float = 0.5  # the share of each wait that is drawn at random

    def __post_init__(self) -> None:
        for name in ("deadline_s", "first_backoff_s", "max_backoff_s", "jitter"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"retry policy: {name} must be a finite number >= 0, not {value}")
        if self.first_backoff_s > self.max_backoff_s:
            raise ValueError(
                f"retry policy: first_backoff_s ({self.first_backoff_s}) exceeds max_backoff_s "
                f"({self.max_backoff_s})"
            )
        if self.jitter > 1:
            raise ValueError(f"retry policy: jitter must be between 0 and 1, not {self.jitter}")

    def backoff_s(self, retry: int, draw: float) -> float:
        """The wait before retry number ``retry`` (1, 2, ...), ``draw`` in [0, 1)."""
        return self.backoff.delay_s(retry, draw)

    @property
    def backoff(self) -> Backoff:
        """The peer's one backoff rule, with this policy's figures."""
        return Backoff(self.first_backoff_s, self.max_backoff_s, self.jitter)


@dataclass(slots=True)
class Retrying:
    """The retry decisions for one batch, first tried at ``started`` (monotonic seconds)."""

    policy: RetryPolicy
    started: float
    retries: int = field(default=0, init=False)

    @property
    def attempts(self) -> int:
        """Tries made so far, the first included, once a failure was reported."""
        return self.retries + 1

    def next_wait(self, now: float, draw: float) -> float | None:
        """After a retriable failure at ``now``: how long to wait before the next try, or
        None if that try would start after the deadline (give up)."""
        wait = self.policy.backoff_s(self.retries + 1, draw)
        if now + wait > self.started + self.policy.deadline_s:
            return None
        self.retries += 1
        return wait


def new_producer_id(prefix: str = "cli") -> str:
    """A fresh producer id, ``PREFIX:`` and 16 random hex digits (64 bits: two writers
    never draw the same one)."""
    if not prefix or ":" in prefix:
        raise ValueError(f"a producer id prefix is a non-empty word without ':', not {prefix!r}")
    return f"{prefix}:{secrets.token_hex(8)}"
