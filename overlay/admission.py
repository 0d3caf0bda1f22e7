"""Who gets a connection slot of a listener: a pure policy, no I/O.

Theory of operation
-------------------
A listener (:class:`overlay.transport.Listener`) asks :meth:`Admission.admit` for a slot for
each connection it accepts, naming the remote host, and gives the slot back with
:meth:`Admission.release` when the connection ends. Two limits apply:

* ``max_per_address``: connections from one remote host (an outsider on one address cannot
  take every slot);
* ``max_connections``: connections in all;
* ``max_per_participant``: connections whose TLS certificate proves one participant (an
  insider on many addresses cannot take every slot either). The listener names the
  participant with :meth:`Admission.claim` once the handshake has proven it.

When a limit is reached, the newcomer still gets in if some connection it competes with (the
host's own for the first limit, any for the second) has been idle, no frame either way, for
at least ``evict_idle_s``: the one idle longest is *evicted* (:meth:`admit` returns it, and the
listener cancels its task). Otherwise the newcomer is refused. So a few hundred connections
that connect and say nothing (or never finish their TLS handshake) hold their slots only
until someone else needs one, while busy connections are never evicted. ``evict_idle_s``
keeps a burst of newcomers from evicting each other.

A slot knows when it was last active through ``activity`` (the connection's
:attr:`~overlay.stream.FrameStream.last_active` once it has a stream; its opening time until
then) and how to end it through ``cancel`` (set once its task runs; a slot without one is not
evicted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Admission", "Slot"]


@dataclass(eq=False)
class Slot:
    """One admitted connection."""

    host: str
    opened: float
    participant: str | None = None
    activity: Callable[[], float] | None = None
    cancel: Callable[[], object] | None = None
    evicted: bool = field(default=False, init=False)

    def last_active(self) -> float:
        return self.opened if self.activity is None else max(self.opened, self.activity())


class Admission:
    """The slots of one listener; see the module notes."""

    def __init__(
        self,
        max_connections: int,
        max_per_address: int,
        evict_idle_s: float,
        max_per_participant: int | None = None,
    ) -> None:
        """``max_per_participant`` defaults to ``max_per_address``."""
        if max_per_participant is None:
            max_per_participant = max_per_address
        if min(max_connections, max_per_address, max_per_participant) < 1:
            raise ValueError(
                "max_connections, max_per_address and max_per_participant must be at least 1"
            )
        if evict_idle_s < 0:
            raise ValueError("evict_idle_s must not be negative")
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.evict_idle_s = evict_idle_s
        self.max_per_participant = max_per_participant
        self._by_host: dict[str, set[Slot]] = {}
        self._by_participant: dict[str, set[Slot]] = {}
        self._count = 0
        self.evictions = 0

    @property
    def count(self) -> int:
        return self._count

    def count_of(self, host: str) -> int:
        return len(self._by_host.get(host, ()))

    def full_for(self, host: str) -> str | None:
        """Which limit a newcomer from ``host`` meets now (None: there is room)."""
        if self.count_of(host) >= self.max_per_address:
            return f"{self.max_per_address} connections from {host} (max_per_address)"
        if self._count >= self.max_connections:
            return f"{self.max_connections} connections (max_connections)"
        return None

    def admit(self, host: str, now: float) -> tuple[Slot | None, Slot | None]:
        """A slot for a newcomer from ``host`` (None: refused), and the slot evicted to make
        room for it (None if none was); the caller ends the evicted connection."""
        victim: Slot | None = None
        if self.count_of(host) >= self.max_per_address:
            victim = self._longest_idle(self._by_host.get(host, set()), now)
            if victim is None:
                return None, None
        elif self._count >= self.max_connections:
            everyone = (slot for slots in self._by_host.values() for slot in slots)
            victim = self._longest_idle(everyone, now)
            if victim is None:
                return None, None
        if victim is not None:
            self.release(victim)
            victim.evicted = True
            self.evictions += 1
        slot = Slot(host, now)
        self._by_host.setdefault(host, set()).add(slot)
        self._count += 1
        return slot, victim

    def claim(self, slot: Slot, participant: str, now: float) -> tuple[bool, Slot | None]:
        """The connection of ``slot`` proved ``participant``: whether it may stay, and the
        slot of that participant's connection idle longest, evicted to make room for it when
        the participant is at its limit (the caller ends it)."""
        mine = self._by_participant.setdefault(participant, set())
        victim: Slot | None = None
        if len(mine) >= self.max_per_participant:
            victim = self._longest_idle(mine, now)
            if victim is None:
                if not mine:
                    del self._by_participant[participant]
                return False, None
            self.release(victim)
            victim.evicted = True
            self.evictions += 1
        slot.participant = participant
        self._by_participant.setdefault(participant, set()).add(slot)
        return True, victim

    def count_of_participant(self, participant: str) -> int:
        return len(self._by_participant.get(participant, ()))

    def release(self, slot: Slot) -> None:
        """The connection of ``slot`` has ended (or was evicted); idempotent."""
        if slot.participant is not None:
            theirs = self._by_participant.get(slot.participant)
            if theirs is not None:
                theirs.discard(slot)
                if not theirs:
                    del self._by_participant[slot.participant]
        slots = self._by_host.get(slot.host)
        if slots is None or slot not in slots:
            return
        slots.discard(slot)
        if not slots:
            del self._by_host[slot.host]
        self._count -= 1

    def _longest_idle(self, slots: Iterable[Slot], now: float) -> Slot | None:
        best: Slot | None = None
        best_active = now - self.evict_idle_s
        for slot in slots:
            if slot.cancel is None:
                continue
            active = slot.last_active()
            if active <= best_active:
                best, best_active = slot, active
        return best
