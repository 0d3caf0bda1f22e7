"""Connection slots (overlay.admission) and relay quotas (peer.federation.quota): pure rules."""

from __future__ import annotations

import pytest

from overlay.admission import Admission, Slot
from peer.errors import Unavailable
from peer.federation.quota import RelayQuota
from peer.server.service import ClientRef


def admitted(admission: Admission, host: str, now: float, active: float | None = None) -> Slot:
    slot, evicted = admission.admit(host, now)
    assert slot is not None and evicted is None
    slot.cancel = lambda: None
    if active is not None:
        slot.activity = lambda: active
    return slot


def test_a_full_listener_evicts_the_longest_idle_only_after_evict_idle_s() -> None:
    admission = Admission(max_connections=3, max_per_address=10, evict_idle_s=5.0)
    a = admitted(admission, "10.0.0.1", 0.0)
    b = admitted(admission, "10.0.0.2", 1.0)
    admitted(admission, "10.0.0.3", 2.0)
    assert admission.admit("10.0.0.4", 4.0) == (None, None)  # nobody idle 5 s yet
    slot, evicted = admission.admit("10.0.0.4", 6.5)
    assert slot is not None and evicted is a and a.evicted
    assert admission.count == 3 and admission.evictions == 1
    b.activity = lambda: 6.0  # b was busy lately: the next victim is another
    slot, evicted = admission.admit("10.0.0.5", 7.5)
    assert evicted is not None and evicted is not b


def test_one_address_competes_only_with_itself() -> None:
    admission = Admission(max_connections=100, max_per_address=2, evict_idle_s=1.0)
    first = admitted(admission, "10.0.0.1", 0.0)
    admitted(admission, "10.0.0.1", 0.5)
    admitted(admission, "10.0.0.2", 0.0)
    assert admission.full_for("10.0.0.1") is not None and "max_per_address" in str(
        admission.full_for("10.0.0.1")
    )
    assert admission.admit("10.0.0.1", 0.8) == (None, None)
    _slot, evicted = admission.admit("10.0.0.1", 2.0)
    assert evicted is first and admission.count_of("10.0.0.1") == 2
    assert admission.count_of("10.0.0.2") == 1


def test_a_slot_without_a_task_is_not_evicted_and_release_is_idempotent() -> None:
    admission = Admission(max_connections=1, max_per_address=1, evict_idle_s=0.0)
    slot, _ = admission.admit("h", 0.0)
    assert slot is not None
    assert admission.admit("h", 10.0) == (None, None)
    admission.release(slot)
    admission.release(slot)
    assert admission.count == 0


def test_relay_quota_per_connection_and_per_address() -> None:
    quota = RelayQuota(per_connection=2, per_address=3)
    host = b"\x01" * 20
    one, two = ClientRef("10.0.0.1:1", "10.0.0.1"), ClientRef("10.0.0.1:2", "10.0.0.1")
    with quota.hold(one, host, "s"), quota.hold(one, host, "s"):
        with (
            pytest.raises(Unavailable, match="relay_streams_per_connection"),
            quota.hold(one, host, "s"),
        ):
            pass
        with quota.hold(two, host, "s"):
            assert quota.held(two, host) == (1, 3)
            with (
                pytest.raises(Unavailable, match="relay_streams_per_address"),
                quota.hold(two, host, "s"),
            ):
                pass
            with quota.hold(one, b"\x02" * 20, "t"):  # another host's link: its own places
                assert quota.held(one, host) == (2, 3)
    assert quota.held(one, host) == (0, 0)
    with quota.hold(None, host, "s"):  # a peer's own relay is not counted
        assert quota.held(one, host) == (0, 0)


def test_one_participant_on_many_addresses_competes_with_itself() -> None:
    admission = Admission(
        max_connections=100, max_per_address=10, evict_idle_s=1.0, max_per_participant=2
    )
    first = admitted(admission, "10.0.0.1", 0.0, active=0.0)
    second = admitted(admission, "10.0.0.2", 0.0, active=0.5)
    assert admission.claim(first, "globex", 0.0) == (True, None)
    assert admission.claim(second, "globex", 0.5) == (True, None)
    third = admitted(admission, "10.0.0.3", 0.6)
    assert admission.claim(third, "globex", 0.6) == (False, None)  # nobody idle 1 s yet
    other = admitted(admission, "10.0.0.4", 0.6)
    assert admission.claim(other, "acme", 0.6) == (True, None)  # another participant
    ok, evicted = admission.claim(third, "globex", 1.2)
    assert ok and evicted is first and first.evicted
    assert admission.count_of_participant("globex") == 2
    admission.release(second)
    admission.release(third)
    assert admission.count_of_participant("globex") == 0
    assert admission.count_of_participant("acme") == 1


def test_the_participant_limit_defaults_to_the_address_limit() -> None:
    assert Admission(10, 3, 1.0).max_per_participant == 3
    with pytest.raises(ValueError, match="max_per_participant"):
        Admission(10, 3, 1.0, max_per_participant=0)
