"""Who is in the overlay, who is alive, and who is responsible for what (pure, no I/O).

Theory of operation
-------------------
Membership is heartbeat gossip, as in Cassandra's or Scuttlebutt's failure detectors. Every
member owns one entry about itself, :class:`MemberInfo`: its node id, participant, certificate,
addresses, whether it runs an engine, its load, an ``incarnation`` (fixed per process start)
and a ``heartbeat`` counter it bumps every gossip round. Rounds exchange the whole table
(:meth:`Membership.digest` / :meth:`Membership.merge`); an entry replaces the known one only if
its ``(incarnation, heartbeat)`` is higher, so an old entry relayed late never undoes news.

Liveness is decided locally, from the local clock: a member whose heartbeat has not advanced
for ``suspect_after_s`` is SUSPECT, for ``dead_after_s`` DEAD; any newer heartbeat makes it
ALIVE again. A member that says it is leaving is LEFT at once. DEAD and LEFT entries are not
gossiped on (so the news of a departure is not undone by the dead member's last entry) but
are kept as tombstones for ``forget_after_s``, and an entry that is not newer than its
tombstone is ignored.

Heartbeats are not signed: gossip only travels over mutually authenticated peer links, so only
federation members can speak, and a member's certificate (which binds its node id to its
participant) is checked once, by the ``verify`` callable, when the member is first seen.

Responsibility (DESIGN.md section 6): the peer responsible for a stream is the live member
whose node id is XOR-closest to ``sha1("sid:" + stream)``; its replicas are the next r-1.
:func:`rank` orders candidates by that distance; the caller picks the candidate set (live
members, engine-capable first).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "Event",
    "MemberInfo",
    "MemberState",
    "Membership",
    "rank",
    "stream_target",
]

MAX_MEMBERS = 4096
MAX_LOAD_KEYS = 16


class MemberState(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True)
class MemberInfo:
    """What a member says about itself (the gossiped entry)."""

    node_id: bytes
    participant: str
    cert: bytes
    overlay: tuple[str, int]
    api: tuple[str, int]
    engine: bool
    incarnation: int
    heartbeat: int = 0
    load: dict[str, float] = field(default_factory=dict)
    leaving: bool = False

    @property
    def version(self) -> tuple[int, int]:
        return (self.incarnation, self.heartbeat)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.node_id,
            "p": self.participant,
            "cert": self.cert,
            "ov": list(self.overlay),
            "api": list(self.api),
            "eng": self.engine,
            "inc": self.incarnation,
            "hb": self.heartbeat,
            "load": dict(self.load),
            "bye": self.leaving,
        }

    @classmethod
    def from_wire(cls, raw: Any) -> MemberInfo:
        """Parse one gossiped entry; ``ValueError`` names what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError("member entry is not a map")
        try:
            node_id, participant, cert = raw["id"], raw["p"], raw["cert"]
            overlay, api = _addr(raw["ov"], "ov"), _addr(raw["api"], "api")
            engine, inc, hb, load, bye = raw["eng"], raw["inc"], raw["hb"], raw["load"], raw["bye"]
        except KeyError as exc:
            raise ValueError(f"member entry lacks {exc.args[0]!r}") from None
        if not isinstance(node_id, bytes) or len(node_id) != 20:
            raise ValueError("member id must be 20 bytes")
        if not isinstance(participant, str) or not 0 < len(participant) <= 128:
            raise ValueError("member participant must be a name")
        if not isinstance(cert, bytes) or len(cert) > 1024:
            raise ValueError("member cert must be at most 1024 bytes")
        if not isinstance(engine, bool) or not isinstance(bye, bool):
            raise ValueError("member flags must be booleans")
        for name, value in (("inc", inc), ("hb", hb)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                raise ValueError(f"member {name} must be a non-negative integer")
        if not isinstance(load, dict) or len(load) > MAX_LOAD_KEYS:
            raise ValueError(f"member load must be a map of at most {MAX_LOAD_KEYS} figures")
        figures: dict[str, float] = {}
        for key, value in load.items():
            if not isinstance(key, str) or len(key) > 32:
                raise ValueError("member load keys must be short strings")
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"member load {key!r} must be a number")
            figures[key] = float(value)
        return cls(node_id, participant, cert, overlay, api, engine, inc, hb, figures, bye)


def _addr(raw: Any, what: str) -> tuple[str, int]:
    if (
        not isinstance(raw, list | tuple)
        or len(raw) != 2
        or not isinstance(raw[0], str)
        or not 0 < len(raw[0]) <= 255
        or not isinstance(raw[1], int)
        or isinstance(raw[1], bool)
        or not 0 < raw[1] < 65536
    ):
        raise ValueError(f"member {what} must be [host, port]")
    return (raw[0], raw[1])


@dataclass
class Member:
    info: MemberInfo
    state: MemberState
    changed_at: float  # local clock: when the heartbeat last advanced (or the state changed)


@dataclass(frozen=True)
class Event:
    """A change of a member's state: joined, alive, suspect, dead, left or updated."""

    kind: str
    info: MemberInfo


class Membership:
    """The gossip state machine of one member (no clock of its own: pass ``now``)."""

    def __init__(
        self,
        me: MemberInfo,
        *,
        now: float,
        suspect_after_s: float = 3.0,
        dead_after_s: float = 8.0,
        forget_after_s: float = 3600.0,
        verify: Callable[[MemberInfo], str | None] | None = None,
    ) -> None:
        if not 0 < suspect_after_s < dead_after_s:
            raise ValueError("need 0 < suspect_after_s < dead_after_s")
        self.me = me
        self.suspect_after_s = suspect_after_s
        self.dead_after_s = dead_after_s
        self.forget_after_s = forget_after_s
        self._verify = verify
        self._members: dict[bytes, Member] = {me.node_id: Member(me, MemberState.ALIVE, now)}
        self.refused: dict[str, int] = {}

    # our own entry
    def beat(self, now: float, load: dict[str, float] | None = None) -> MemberInfo:
        """Advance our heartbeat (once per gossip round), optionally with new load figures."""
        self.me = replace(
            self.me,
            heartbeat=self.me.heartbeat + 1,
            load=dict(load) if load is not None else self.me.load,
        )
        self._members[self.me.node_id] = Member(self.me, MemberState.ALIVE, now)
        return self.me

    def leave(self, now: float) -> MemberInfo:
        self.me = replace(self.me, heartbeat=self.me.heartbeat + 1, leaving=True)
        self._members[self.me.node_id] = Member(self.me, MemberState.LEFT, now)
        return self.me

    # gossip
    def digest(self) -> list[dict[str, Any]]:
        """The entries to gossip: every member not known dead or gone (and ourselves)."""
        return [
            m.info.to_wire()
            for m in self._members.values()
            if m.state in (MemberState.ALIVE, MemberState.SUSPECT)
            or m.info.node_id == self.me.node_id
        ]

    def merge(self, entries: Iterable[Any], now: float) -> list[Event]:
        """Take in a gossiped table; malformed or unverifiable entries are skipped and
        counted in :attr:`refused` (by reason), never raised."""
        events: list[Event] = []
        for raw in entries:
            try:
                info = MemberInfo.from_wire(raw)
            except ValueError as exc:
                self._refuse(str(exc))
                continue
            event = self._merge_one(info, now)
            if event is not None:
                events.append(event)
        return events

    def _merge_one(self, info: MemberInfo, now: float) -> Event | None:
        if info.node_id == self.me.node_id:
            return None  # only we speak for ourselves
        known = self._members.get(info.node_id)
        if known is not None and info.version <= known.info.version:
            return None
        if known is None or known.info.cert != info.cert:
            if len(self._members) >= MAX_MEMBERS and known is None:
                self._refuse("membership table full")
                return None
            reason = self._verify(info) if self._verify is not None else None
            if reason is not None:
                self._refuse(reason)
                return None
        state = MemberState.LEFT if info.leaving else MemberState.ALIVE
        self._members[info.node_id] = Member(info, state, now)
        if known is None:
            return Event("left" if info.leaving else "joined", info)
        if known.state != state:
            return Event(state.value, info)
        if (known.info.overlay, known.info.api, known.info.engine) != (
            info.overlay,
            info.api,
            info.engine,
        ):
            return Event("updated", info)
        return None

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def tick(self, now: float) -> list[Event]:
        """Move silent members to SUSPECT, then DEAD; forget old tombstones."""
        events: list[Event] = []
        for node_id, member in list(self._members.items()):
            if node_id == self.me.node_id:
                continue
            silent = now - member.changed_at
            if member.state in (MemberState.DEAD, MemberState.LEFT):
                if silent >= self.forget_after_s:
                    del self._members[node_id]
                continue
            if silent >= self.dead_after_s:
                member.state = MemberState.DEAD
                member.changed_at = now
                events.append(Event("dead", member.info))
            elif silent >= self.suspect_after_s and member.state is MemberState.ALIVE:
                member.state = MemberState.SUSPECT
                events.append(Event("suspect", member.info))
        return events

    def declare_dead(self, node_id: bytes, now: float) -> Event | None:
        """Mark a member dead at once (e.g. it refused our link with a new identity)."""
        member = self._members.get(node_id)
        if member is None or node_id == self.me.node_id or member.state is MemberState.DEAD:
            return None
        member.state = MemberState.DEAD
        member.changed_at = now
        return Event("dead", member.info)

    # views
    def members(self) -> list[Member]:
        return list(self._members.values())

    def get(self, node_id: bytes) -> Member | None:
        return self._members.get(node_id)

    def live(self) -> list[MemberInfo]:
        """Members believed alive (SUSPECT ones included: not yet declared dead), and us."""
        return [
            m.info
            for m in self._members.values()
            if m.state in (MemberState.ALIVE, MemberState.SUSPECT)
        ]

    def state_of(self, node_id: bytes) -> MemberState | None:
        member = self._members.get(node_id)
        return None if member is None else member.state


def stream_target(stream: str) -> bytes:
    """The point of the 160-bit id space a stream's responsibility is decided at."""
    return hashlib.sha1(b"sid:" + stream.encode()).digest()


def rank(target: bytes, candidates: Iterable[MemberInfo]) -> list[MemberInfo]:
    """Candidates ordered by XOR distance of their node id to ``target`` (closest first)."""
    t = int.from_bytes(target, "big")
    return sorted(candidates, key=lambda m: int.from_bytes(m.node_id, "big") ^ t)
