"""SQLite storage of the catalog DHT: the one place every record write goes through.

Theory of operation
-------------------
The ``kademlia`` library writes to its storage from three places (``rpc_store``, the local
store of a ``set`` and the caching store of a lookup), always as ``storage[dkey] = value``.
:class:`CatalogStorage` is an ``IStorage`` whose ``__setitem__`` runs :meth:`accept`, so each
of those paths checks a record before keeping it:

1. decode (strict, size-capped) and verify: the key hashes to ``dkey``, the record has not
   expired and the owner signed it (:mod:`overlay.records`);
2. the caller's :data:`~overlay.records.Policy` (who may sign what);
3. the replacement rule against what is stored (:func:`~overlay.records.supersedes`) and, when
   the record itself has expired and been dropped, against the *pin*: the first owner of a
   key and the highest sequence accepted, kept in ``pins`` after the record is gone, so that
   neither another owner nor a replay of an older record can slip in once a record lapses.
   Lease keys (``place:``) get no pin: when a lease has run out anyone may take it;
4. the caps on items and bytes.

A refused write leaves the stored record as it was; :meth:`accept` says why (``rpc_store``
returns that to the sender as ``False``) and :attr:`refusals` counts the reasons.

Reads (``get``, ``[]``, iteration) only ever return unexpired records, as the raw bytes the
owner signed: republishing sends exactly those bytes again. Expired rows stay until
:meth:`purge_expired` (maintenance, or a write that needs the room) drops them.

``blobs`` is a small content-addressed table (SHA-256 -> bytes) for bodies too large for a
datagram; peers fetch them over TCP links, the DHT only carries their hashes.

SQLite calls are synchronous; each is well under a millisecond for the few thousand rows a
catalog holds, so they run on the event loop. Files use WAL with ``synchronous=NORMAL``:
a crash may lose the last writes, never corrupt the file; the DHT's replicas and owners'
republishing restore lost records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator

from kademlia.storage import IStorage

from overlay.records import (
    DhtError,
    Policy,
    Record,
    RecordError,
    allow_all,
    decode,
    dht_key,
    is_lease,
    supersedes,
    verify,
)

__all__ = ["FULL", "CatalogStorage", "StorageFull", "policy_refusal"]

log = logging.getLogger(__name__)

FULL = "storage full"
_DKEY_BYTES = 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    dkey BLOB PRIMARY KEY, raw BLOB NOT NULL, expiry INTEGER NOT NULL, stored_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pins (
    dkey BLOB PRIMARY KEY, owner BLOB NOT NULL, seq BLOB NOT NULL, pinned_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs (
    sha256 BLOB PRIMARY KEY, data BLOB NOT NULL, stored_at REAL NOT NULL
) WITHOUT ROWID;
"""


class StorageFull(DhtError):
    """A blob does not fit under this node's caps (it may once others are deleted)."""

    retriable = True


class CatalogStorage(IStorage):  # type: ignore[misc]
    """Validated, persistent DHT storage (see the module docstring).

    ``path`` is a SQLite file (``":memory:"`` for tests). ``max_items``/``max_bytes`` cap the
    records (expired ones included until purged), ``max_pins`` the pins left by expired
    records (the oldest such pin goes first), ``max_blob_bytes`` the blob table.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        policy: Policy = allow_all,
        *,
        max_items: int = 10_000,
        max_bytes: int = 32 * 2**20,
        max_pins: int = 40_000,
        max_blob_bytes: int = 256 * 2**20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_pins = max_pins
        self.max_blob_bytes = max_blob_bytes
        self.refusals: Counter[str] = Counter()
        self._clock = clock
        self._db = sqlite3.connect(os.fspath(path))
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._db:
            self._db.executescript(_SCHEMA)
        self._items, self._bytes = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(raw)), 0) FROM records"
        ).fetchone()
        (self._blob_bytes,) = self._db.execute(
            "SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs"
        ).fetchone()

    # -- writes --------------------------------------------------------------------------------

    def accept(self, dkey: bytes, raw: bytes, now: float | None = None) -> str | None:
        """Store ``raw`` under ``dkey`` if it is a valid record that may replace what is
        stored; return None if it was stored (or was the stored record again, which only
        refreshes its store time), else why it was refused: a short category such as
        ``"bad signature"``, ``"owner pinned"``, ``"stale sequence"`` or :data:`FULL`, or
        ``"refused by policy: ..."`` with the policy's reason."""
        now = self._clock() if now is None else now
        refusal = self._judge(dkey, raw, now)
        if refusal is None:
            return None
        category, detail = refusal
        self.refusals[category] += 1
        log.debug("refused a record for %s: %s", _hex(dkey), detail)
        return detail if category == "policy" else category

    def __setitem__(self, dkey: bytes, raw: bytes) -> None:
        # The library's write paths cannot be told "no": a refused record just is not kept.
        self.accept(dkey, raw)

    def purge_expired(self, now: float | None = None) -> int:
        """Drop expired records (their pins stay, except for lease keys, which have none).
        Returns how many were dropped."""
        now = self._clock() if now is None else now
        with self._db:
            cursor = self._db.execute("DELETE FROM records WHERE expiry <= ?", (_int(now),))
        if cursor.rowcount:
            self._recount()
        return cursor.rowcount

    def _judge(self, dkey: bytes, raw: bytes, now: float) -> tuple[str, str] | None:
        if not isinstance(dkey, bytes) or len(dkey) != _DKEY_BYTES:
            return "malformed record", "a DHT key is 20 bytes"
        try:
            record = decode(raw)
            verify(record, dkey, now)
        except RecordError as exc:
            return exc.reason, str(exc)
        reason = policy_refusal(self.policy, record)
        if reason is not None:
            return "policy", f"refused by policy: {reason}"
        old = self._stored(dkey)
        if old is not None:
            why = supersedes(record, old, now)
            if why is not None:
                return why, f"{record.key}: {why}"
            if record == old:
                with self._db:
                    self._db.execute("UPDATE records SET stored_at = ? WHERE dkey = ?", (now, dkey))
                return None
        elif not is_lease(record.key):
            pin = self._pin(dkey)
            if pin is not None and pin[0] != record.owner:
                return "owner pinned", f"{record.key}: owner pinned"
            if pin is not None and record.seq <= pin[1]:
                return "stale sequence", f"{record.key}: sequence {record.seq} <= {pin[1]}"
        if not self._make_room(dkey, len(raw), record, now):
            return FULL, f"{record.key}: {FULL} ({self._items} records, {self._bytes} bytes)"
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?)",
                (dkey, bytes(raw), record.expiry, now),
            )
            if not is_lease(record.key):
                self._db.execute(
                    "INSERT OR REPLACE INTO pins VALUES (?, ?, ?, ?)",
                    (dkey, record.owner, record.seq.to_bytes(8, "big"), now),
                )
        self._recount()
        return None

    def _make_room(self, dkey: bytes, size: int, record: Record, now: float) -> bool:
        if not self._fits(dkey, size):
            self.purge_expired(now)
            if not self._fits(dkey, size):
                return False
        if is_lease(record.key) or self._pin(dkey) is not None:
            return True
        (pins,) = self._db.execute("SELECT COUNT(*) FROM pins").fetchone()
        if pins < self.max_pins:
            return True
        # Forget the oldest pin whose record is gone (a name unused for the longest time).
        with self._db:
            cursor = self._db.execute(
                "DELETE FROM pins WHERE dkey = (SELECT dkey FROM pins WHERE dkey NOT IN "
                "(SELECT dkey FROM records) ORDER BY pinned_at LIMIT 1)"
            )
        return cursor.rowcount > 0

    def _fits(self, dkey: bytes, size: int) -> bool:
        row = self._db.execute("SELECT LENGTH(raw) FROM records WHERE dkey = ?", (dkey,)).fetchone()
        if row is None and self._items >= self.max_items:
            return False
        return bool(self._bytes - (row[0] if row else 0) + size <= self.max_bytes)

    def _recount(self) -> None:
        self._items, self._bytes = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(raw)), 0) FROM records"
        ).fetchone()

    # -- reads ---------------------------------------------------------------------------------

    def __getitem__(self, dkey: bytes) -> bytes:
        row = self._db.execute(
            "SELECT raw FROM records WHERE dkey = ? AND expiry > ?", (dkey, _int(self._clock()))
        ).fetchone()
        if row is None:
            raise KeyError(dkey)
        raw: bytes = row[0]
        return raw

    def get(self, dkey: bytes, default: bytes | None = None) -> bytes | None:
        try:
            return self[dkey]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        rows = self._db.execute(
            "SELECT dkey, raw FROM records WHERE expiry > ?", (_int(self._clock()),)
        ).fetchall()
        return iter([(dkey, raw) for dkey, raw in rows])

    def __len__(self) -> int:
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM records WHERE expiry > ?", (_int(self._clock()),)
        ).fetchone()
        return int(count)

    def iter_older_than(self, seconds_old: float) -> list[tuple[bytes, bytes]]:
        """Unexpired records last stored (or refreshed) at least ``seconds_old`` ago."""
        now = self._clock()
        rows = self._db.execute(
            "SELECT dkey, raw FROM records WHERE stored_at <= ? AND expiry > ? ORDER BY stored_at",
            (now - seconds_old, _int(now)),
        ).fetchall()
        return [(dkey, raw) for dkey, raw in rows]

    def local(self, key: str) -> Record | None:
        """The unexpired record this node holds for application key ``key``, if any."""
        raw = self.get(dht_key(key))
        return None if raw is None else decode(raw)

    def pinned(self, dkey: bytes) -> tuple[bytes, int] | None:
        """The pinned owner and highest accepted sequence for ``dkey``, if any."""
        return self._pin(dkey)

    @property
    def total_bytes(self) -> int:
        return int(self._bytes)

    def _stored(self, dkey: bytes) -> Record | None:
        row = self._db.execute("SELECT raw FROM records WHERE dkey = ?", (dkey,)).fetchone()
        if row is None:
            return None
        try:
            return decode(row[0])
        except RecordError:  # a damaged file: the row cannot stand in the way of a valid record
            log.warning("dropping an undecodable stored record for %s", _hex(dkey))
            return None

    def _pin(self, dkey: bytes) -> tuple[bytes, int] | None:
        row = self._db.execute("SELECT owner, seq FROM pins WHERE dkey = ?", (dkey,)).fetchone()
        return None if row is None else (row[0], int.from_bytes(row[1], "big"))

    # -- blobs ---------------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> bytes:
        """Keep ``data`` under its SHA-256 (returned). Raises :class:`StorageFull`."""
        digest = hashlib.sha256(data).digest()
        if self.get_blob(digest) is not None:
            return digest
        if self._blob_bytes + len(data) > self.max_blob_bytes:
            raise StorageFull(
                f"blob of {len(data)} bytes does not fit: {self._blob_bytes} of "
                f"{self.max_blob_bytes} bytes used"
            )
        with self._db:
            self._db.execute(
                "INSERT INTO blobs VALUES (?, ?, ?)", (digest, bytes(data), self._clock())
            )
        self._blob_bytes += len(data)
        return digest

    def get_blob(self, sha256: bytes) -> bytes | None:
        row = self._db.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else bytes(row[0])

    def delete_blob(self, sha256: bytes) -> bool:
        data = self.get_blob(sha256)
        if data is None:
            return False
        with self._db:
            self._db.execute("DELETE FROM blobs WHERE sha256 = ?", (sha256,))
        self._blob_bytes -= len(data)
        return True

    def close(self) -> None:
        self._db.close()


def policy_refusal(policy: Policy, record: Record) -> str | None:
    """``policy(record)``, where a policy that raises refuses (and is logged) instead of
    taking the node down."""
    try:
        return policy(record)
    except Exception as exc:
        log.exception("record policy failed on %s", record.key)
        return f"policy failed: {exc!r}"


def _int(now: float) -> int:
    # Expiry is whole seconds: a record is live while expiry > now, i.e. expiry > floor(now).
    return int(now)


def _hex(dkey: object) -> str:
    return dkey.hex() if isinstance(dkey, bytes) else repr(type(dkey))
