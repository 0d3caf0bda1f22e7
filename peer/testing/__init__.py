"""Helpers for testing code that talks to peers (shipped, as trio.testing is).

- :class:`PeerThread` (:mod:`peer.testing.peer_thread`): a real peer on its own loop in a
  background thread, driven from a synchronous test;
- :class:`ManualClock` (:mod:`peer.testing.manual_clock`): a clock the test moves by hand (and that
  a loop sleeps on, see :class:`peer.timing.Clock`);
- :func:`wait_until` / :func:`wait_until_sync` (:mod:`peer.timing.poll`): the one poll helper,
  asking a condition again up to a deadline, for integration tests that wait on another
  thread, process or Spark (the async one, through :func:`peer.testing.cluster.wait_until`,
  counts a peer's refusals and timeouts as "not yet"); unit tests use the clock or events instead;
- :func:`all_tasks_blocked` (:mod:`peer.testing.idle`): yield until every other task waits,
  before a unit test checks that something did not happen;
- :func:`members_alive` (:mod:`peer.testing.members`): wait until a peer sees enough live
  members of the federation;
- :class:`FetchServerThread` (:mod:`peer.testing.fetch`): a peer's spool fetch server on its
  own loop in a background thread, for Spark tests of fetched input;
- :func:`run_async` (:mod:`peer.testing.loops`): an async test body on a fresh asyncio or
  uvloop loop, bounded in time;
- the local federation of :mod:`peer.testing.cluster` (``PeerProcess``, ``LocalFederation``,
  keys, trust and signed contracts, ``stream_name_on``, ``collect``), a process harness that
  the demo, the benchmarks and the attack scripts use too, and :class:`KeyedFeed`
  (:mod:`peer.testing.push`), the keyed-window workload pushed to one of its peers;
- from the product, for tests to import from one place: the keyed-window workload of
  :mod:`peer.examples.keyed_window` with its plain-Python reference.

Product code never imports this package (``lint-imports`` holds it to that); ``peer demo``,
which runs a local federation, and the scripts do.
"""

from __future__ import annotations

from peer.examples.keyed_window import (
    keyed_window_batches,
    keyed_window_box,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
)
from peer.testing.cluster import (
    LocalFederation,
    PeerProcess,
    collect,
    make_participants,
    participant_args,
    signed_contracts,
    stream_name_on,
    trust_all,
    wait_until,
)
from peer.testing.fetch import FetchServerThread
from peer.testing.idle import all_tasks_blocked
from peer.testing.loops import LOOPS, run_async
from peer.testing.manual_clock import ManualClock
from peer.testing.members import member_states, members_alive
from peer.testing.peer_thread import PeerThread
from peer.testing.push import KeyedFeed
from peer.timing import wait_until_sync

__all__ = [
    "LOOPS",
    "FetchServerThread",
    "KeyedFeed",
    "LocalFederation",
    "ManualClock",
    "PeerProcess",
    "PeerThread",
    "all_tasks_blocked",
    "collect",
    "keyed_window_batches",
    "keyed_window_box",
    "keyed_window_query",
    "keyed_window_schema",
    "keyed_window_sums",
    "make_participants",
    "member_states",
    "members_alive",
    "participant_args",
    "run_async",
    "signed_contracts",
    "stream_name_on",
    "trust_all",
    "wait_until",
    "wait_until_sync",
]
