"""Who sits in the control plane (pure): volunteering, admission and replacement of voters.

Theory of operation
-------------------
High availability is on by default (docs/replication.md, "Seats"): nobody has to know which
peers should run Raft. The rules, each a decision of this module that its drivers
(:mod:`peer.replication.plane` on every peer, :mod:`peer.replication.voter` on a voter) act on:

1. **Founding.** Only the peer that starts a federation (``peer join`` without
   ``--bootstrap``) founds a control plane, and only if it volunteers and finds no voters
   among the members it knows (:func:`may_found`). A joining peer that finds no voters waits
   and asks again; it never founds a second plane on its own. The one exception is a peer
   forced into a seat (``--voter``) that has found no plane for ``found_after_s`` (30 s): its
   operator asked for a seat, and without it the federation would have none.
2. **Volunteering.** A peer that volunteers (the default; ``--no-voter`` opts out, ``--voter``
   forces a seat) and is not a voter asks the control plane to admit it while the voters are
   fewer than the seats the voters announce (:func:`may_volunteer`).
3. **Seats.** Every voter hears every peer's heartbeat; the peers heard within
   ``live_window_s`` are live, and the seats are 3, or 5 once five peers are live
   (:func:`seats_for`). A forced voter is admitted whatever the count.
4. **Admission** is decided by the voter the peer asks, under one lock, and carried out with
   Raft's own membership change (one change at a time: pysyncobj refuses a second while one is
   pending), so two volunteers asking at once for the last seat get one seat between them
   (:meth:`VoterSeats.admit`).
5. **Replacement.** The leader removes a voter it has not heard for ``grace_s`` (30 s: far
   longer than a failover or a restart, so a peer restarting keeps its seat), one at a time
   and never itself (:meth:`VoterSeats.to_remove`); the seat it leaves is open, and the next
   volunteer to ask takes it (rule 2). A removed voter that comes back finds that the voters
   no longer count it and starts afresh as a volunteer.

Times are seconds of the clock the caller injects (monotonic on one machine); nothing here
depends on a wall clock, and no decision about data safety is taken here: Raft keeps the
log consistent whatever the membership does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

__all__ = [
    "FOUND_AFTER_S",
    "GRACE_S",
    "LIVE_WINDOW_S",
    "MAX_SEATS",
    "VoterSeats",
    "may_found",
    "may_volunteer",
    "seats_for",
]

MIN_SEATS = 3
MAX_SEATS = 5
LIVE_WINDOW_S = 5.0  # a peer heard within this is live, for counting seats
GRACE_S = 30.0  # a voter silent this long is replaced (it died for good)
FOUND_AFTER_S = 30.0  # a forced voter that found no plane this long founds one


def seats_for(live: int) -> int:
    """The number of voters a federation of ``live`` peers should have: 3, or 5 once five
    peers are live (only live peers can take them, so fewer may sit)."""
    if live < 0:
        raise ValueError(f"live peers cannot be negative: {live}")
    return MAX_SEATS if live >= MAX_SEATS else MIN_SEATS


def may_found(*, volunteer: bool, founder: bool, voters_found: bool) -> bool:
    """Whether this peer founds the control plane now: it started the federation (no
    seeds), volunteers, and no voter is known."""
    return volunteer and founder and not voters_found


def may_volunteer(
    me: str, voters: Collection[str], seats: int | None, *, volunteer: bool, forced: bool
) -> bool:
    """Whether this peer asks to be admitted now. ``seats``: what the voters last announced
    (None: not known yet, then the minimum is assumed)."""
    if not voters or me in voters:
        return False
    if forced:
        return True
    return volunteer and len(voters) < (MIN_SEATS if seats is None else seats)


class VoterSeats:
    """A voter's view of who is live, and its decisions about the seats."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        live_window_s: float = LIVE_WINDOW_S,
        grace_s: float = GRACE_S,
    ) -> None:
        if not 0 < live_window_s <= grace_s:
            raise ValueError(
                f"live_window_s ({live_window_s}) must be above 0 and at most grace_s ({grace_s})"
            )
        self.clock = clock
        self.live_window_s = live_window_s
        self.grace_s = grace_s
        self._heard: dict[str, float] = {}

    def heard(self, node: str) -> None:
        """``node`` (a voter or any peer) sent a heartbeat now."""
        self._heard[node] = self.clock()

    def took_office(self, voters: Iterable[str]) -> None:
        """This voter became leader: silence before now is not counted against anyone
        (it could not hear them), and every voter counts as heard now."""
        now = self.clock()
        self._heard = dict.fromkeys([*self._heard, *voters], now)

    def live(self) -> set[str]:
        now = self.clock()
        return {n for n, at in self._heard.items() if now - at <= self.live_window_s}

    def seats(self) -> int:
        return seats_for(len(self.live()))

    def admit(self, voters: Collection[str], node: str, *, forced: bool) -> str | None:
        """None to admit ``node`` as a voter now, or why not."""
        if node in voters:
            return None
        if forced:
            return None
        seats = self.seats()
        if len(voters) >= seats:
            return f"the control plane's {seats} seats are taken ({len(self.live())} peers live)"
        return None

    def to_remove(self, voters: Iterable[str], me: str) -> str | None:
        """A voter to remove (silent for ``grace_s``; never ``me``), or None. One at a time:
        Raft changes its membership one member at a time."""
        now = self.clock()
        for node in sorted(voters):
            if node == me:
                continue
            at = self._heard.setdefault(node, now)  # never heard: silent from now on
            if now - at > self.grace_s:
                return node
        return None
