"""Who sits in the control plane: founding, volunteering, admission and replacement of voters
(peer.replication.control.seats; pure, time from a ManualClock)."""

from __future__ import annotations

import pytest

from peer.errors import InvalidInput
from peer.replication.control import VoterSeats, may_found, may_volunteer, seats_for
from peer.replication.control.seats import GRACE_S, LIVE_WINDOW_S
from peer.replication.link_messages import ControlJoin
from peer.testing import ManualClock

A, B, C, D, E, F = (ch * 40 for ch in "abcdef")


def test_three_seats_until_five_peers_live_then_five() -> None:
    assert [seats_for(n) for n in range(8)] == [3, 3, 3, 3, 3, 5, 5, 5]
    with pytest.raises(ValueError, match="negative"):
        seats_for(-1)


def test_only_the_peer_that_starts_the_federation_founds_a_plane() -> None:
    assert may_found(volunteer=True, founder=True, voters_found=False)
    # a joining peer that finds no voters waits (three at once must not found three planes)
    assert not may_found(volunteer=True, founder=False, voters_found=False)
    assert not may_found(volunteer=True, founder=True, voters_found=True)
    assert not may_found(volunteer=False, founder=True, voters_found=False)  # --no-voter


def test_a_volunteer_asks_while_a_seat_is_open() -> None:
    def asks(me: str, voters: tuple[str, ...], seats: int | None, **kw: bool) -> bool:
        return may_volunteer(me, voters, seats, **{"volunteer": True, "forced": False, **kw})

    assert asks(C, (A, B), 3)
    assert not asks(D, (A, B, C), 3)
    assert asks(D, (A, B, C), 5)  # five peers live: two more seats
    assert asks(C, (A, B), None)  # the seats not announced yet: three are assumed
    assert not asks(D, (A, B, C), None)
    assert not asks(A, (A, B), 3)  # a voter already
    assert not asks(C, (), 3)  # no voters known: nobody to ask
    assert not asks(C, (A, B), 3, volunteer=False)  # --no-voter
    assert asks(F, (A, B, C, D, E), 5, forced=True, volunteer=False)  # --voter: a seat anyway


def test_seats_count_the_peers_heard_within_the_live_window() -> None:
    clock = ManualClock(100.0)
    seats = VoterSeats(clock)
    for node in (A, B, C, D):
        seats.heard(node)
    assert seats.seats() == 3
    seats.heard(E)
    assert seats.live() == {A, B, C, D, E} and seats.seats() == 5
    clock.advance(LIVE_WINDOW_S - 1)
    for node in (A, B, C, D):
        seats.heard(node)
    clock.advance(2)  # E is silent for longer than the window
    assert seats.live() == {A, B, C, D} and seats.seats() == 3


def test_a_volunteer_is_admitted_to_an_open_seat_only_and_a_forced_one_always() -> None:
    clock = ManualClock()
    seats = VoterSeats(clock)
    for node in (A, B, C, D):
        seats.heard(node)
    assert seats.admit((A, B), C, forced=False) is None
    declined = seats.admit((A, B, C), D, forced=False)
    assert declined is not None and "3 seats are taken" in declined and "4 peers live" in declined
    assert seats.admit((A, B, C), D, forced=True) is None
    assert seats.admit((A, B, C), C, forced=False) is None  # a voter already: nothing to do
    seats.heard(E)
    assert seats.admit((A, B, C), D, forced=False) is None  # five live: five seats


def test_a_voter_silent_for_the_grace_is_removed_one_at_a_time_never_the_leader() -> None:
    clock = ManualClock()
    seats = VoterSeats(clock, grace_s=GRACE_S)
    voters = (A, B, C)
    for node in voters:
        seats.heard(node)
    clock.advance(GRACE_S)  # silent exactly the grace: not yet
    seats.heard(A)
    assert seats.to_remove(voters, A) is None
    clock.advance(0.5)
    assert seats.to_remove(voters, A) == B  # B and C both silent: the first, alone
    assert seats.to_remove((A, C), A) == C
    clock.advance(GRACE_S * 3)
    assert seats.to_remove((A,), A) is None  # the leader never removes itself


def test_a_voter_never_heard_gets_the_whole_grace_from_when_it_is_first_counted() -> None:
    clock = ManualClock()
    seats = VoterSeats(clock)
    assert seats.to_remove((A, D), A) is None  # D is counted from now
    clock.advance(GRACE_S - 1)
    assert seats.to_remove((A, D), A) is None
    clock.advance(2)
    assert seats.to_remove((A, D), A) == D


def test_a_new_leader_counts_silence_only_from_taking_office() -> None:
    clock = ManualClock()
    seats = VoterSeats(clock)
    seats.heard(B)
    clock.advance(GRACE_S * 2)  # B was silent, but this voter did not lead: it could not tell
    seats.took_office((A, B, C))
    assert seats.to_remove((A, B, C), A) is None
    clock.advance(GRACE_S + 1)
    seats.heard(C)
    assert seats.to_remove((A, B, C), A) == B


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="live_window_s"):
        VoterSeats(ManualClock(), live_window_s=0)
    with pytest.raises(ValueError, match="at most grace_s"):
        VoterSeats(ManualClock(), live_window_s=10, grace_s=5)


def test_control_join_carries_volunteer_only_when_true() -> None:
    assert ControlJoin(A).to_wire() == {"op": "control_join", "node": A}  # as older peers send
    frame = ControlJoin(A, volunteer=True).to_wire()
    assert frame == {"op": "control_join", "node": A, "volunteer": True}
    assert ControlJoin.from_wire(frame) == ControlJoin(A, volunteer=True)
    assert ControlJoin.from_wire({"op": "control_join", "node": A}) == ControlJoin(A)
    with pytest.raises(InvalidInput, match="volunteer must be a boolean"):
        ControlJoin.from_wire({"op": "control_join", "node": A, "volunteer": 1})
