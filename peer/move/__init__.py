"""Moving a running fragment, with its state, to a partner's peer (Medusa's load movement).

Theory of operation
-------------------
A fragment reads local spools and writes local spools; Spark keeps its progress (the spool
offsets each micro-batch consumed) and its operator state (windows, join buffers) in the
fragment's checkpoint directory. So a fragment moves whole if the new peer gets the checkpoint
and spools *with the same offsets*: Spark resumes there exactly where it stopped, and a batch
it re-runs carries the same batch id, which the result spool drops as a replay.

The sender P, holding the move lock (one move in or out at a time):

0. pre-copies while the fragment still runs (as a live migration does): the batch files of
   each input that travels that the fragment has yet to read, and of each result spool, as
   they are now, go to Q as a first tar (``move_chunk`` with ``part: pre``); batch files are
   immutable, so this copy stays valid, and the pause then ships only what came after it;
1. stops the fragment's streaming query: the *pause* starts. A member of the shared lane
   (``peer.engine.lane``) is not stopped: the lane holds at a batch boundary (its other
   members wait too) and says where the member stands, the spool offset through which it
   took each input and its windows; these travel in place of a checkpoint, the lane reader's
   offsets in the input copies say where the target's lane starts them, and the lane goes on
   without the member once the target installed it (with it, exactly where it was, if not);
2. for each input that is a replica of a stream hosted by U: refuses further mirrored appends
   (and waits for those landing), then asks U to stop mirroring to P (``unmirror``), which
   answers with the last offset P acknowledged; P's replica is final from then on;
3. for each input hosted at P itself (P keeps hosting it): registers a mirror reader for the
   new peer Q at the spool's latest offset L (what the copy will hold); if Q holds a mirror
   of it already, waits until that mirror has everything P's spool held at the stop;
4. pauses the mirrors of the fragment's result streams (downstream fragments' copies), so the
   readers' offsets are final;
5. exports into a staging directory: the checkpoint; each input's uncommitted spool files
   (after the fragment's committed offset) with the fragment's reader offsets and the replay
   memory; each result spool whole (what late subscribers may still read) with the mirror
   readers, and the origin its mirrors used; of the batch files, only those the pre-copy did
   not carry;
6. ships it as one tar over the peer link in chunks (``move_begin``, ``move_chunk``...,
   ``move_install``, which names the pre-copy's size and hash too), with a manifest
   (definition, incarnation, streams, schemas, contract);
7. Q checks the sender's contract covers every box type of the fragment (a peer of Q's own
   participant needs none: its manifest names the contract ``SIBLING``), and that its own
   copy of each input it holds already reaches as far as P's spool did at the stop (``holds``:
   Spark re-runs the batch it had planned, which may end there), unpacks the pre-copy and
   then the final tar over it (both checked against their hashes), adopts the spools and
   the checkpoint, enters the streams and the query in its catalog, starts the query from the
   checkpoint (the pause ends), hosts the result streams (their mirrors carry on under the old
   origin, so downstream replay memory still applies) and claims their leases;
8. P then has U mirror to Q from the offset P had acknowledged, mirrors its own inputs to Q,
   writes a short handover lease naming Q for each result stream, records where the fragment
   went (requests for it are forwarded), and drops what it no longer needs.

A failure during the pre-copy stops nothing: P tells Q to drop the move. A failure before P
asks Q to install undoes steps 2-4 and restarts the fragment at P. From
that request on, Q alone decides, once and durably, whether the move happened (it installed,
or it aborts when P asks about a move it has not installed); P journals what it did so that it
can undo or finish the move after a crash, and stays *in doubt* (the fragment stopped) while Q
cannot be asked. So a crash at any step, or a lost reply, leaves exactly one running copy:
see :mod:`~peer.move.journal`.

Movable: a RUNNING fragment (its own streaming query, or a member of the shared lane), whose
result streams no other local query reads and whose replica inputs no other local query
reads. Q refuses a fragment whose streams or name it already holds, and a lane member whose
input its own lane reads already (its lane reads each stream at one position). A lane
member runs at Q under a new incarnation, the move's: its results are tagged with Q's lane
batch ids, which under the old one could pass for replays of P's.

The stages live in their own modules: :mod:`~peer.move.candidates` (what may move, and how each
input travels), :mod:`~peer.move.package` (manifest, tar and their checks),
:mod:`~peer.move.journal` (the durable intents and outcomes),
:mod:`~peer.move.sender` (steps 1-6 and 8) and :mod:`~peer.move.receiver` (step 7).
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

from contracts.book import ContractBook
from peer.federation import Federation
from peer.move.candidates import movable
from peer.move.journal import Journal
from peer.move.package import SIBLING
from peer.move.receiver import ArrivalHook, MoveReceiver
from peer.move.sender import MoveSender
from peer.protocol.link import Raw
from peer.site import LocalSite
from peer.timing import MONOTONIC, Clock

__all__ = ["SIBLING", "ArrivalHook", "Mover"]

MOVE_OPS = ("move_begin", "move_chunk", "move_precopied", "move_install", "move_resolve")


class Mover:
    """Moves fragments out (:class:`MoveSender`) and takes them in (:class:`MoveReceiver`),
    one at a time."""

    def __init__(
        self,
        site: LocalSite,
        fed: Federation,
        book: ContractBook | None,
        on_arrival: ArrivalHook | None = None,
        *,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.site = site
        self.fed = fed
        self.lock = asyncio.Lock()  # one move in or out at a time
        root = site.data_dir / "moves"
        shutil.rmtree(root, ignore_errors=True)  # leftovers of a crash mid-move
        root.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(site.data_dir)
        self.sender = MoveSender(site, fed, self.lock, self.journal, clock=clock)
        self.receiver = MoveReceiver(
            site, fed, book, self.lock, self.journal, on_arrival, clock=clock
        )

    async def recover(self) -> None:
        """Finish the moves in and out that this peer's last run left unfinished (see
        :mod:`peer.move.journal`)."""
        async with self.lock:
            await self.receiver.recover()
            await self.sender.recover()

    async def run(self) -> None:
        """Resolve moves left in doubt in the background until cancelled (in the peer's task
        group)."""
        await self.sender.run()

    def register(self) -> None:
        """Serve the ``move_*`` peer-link requests."""
        for op in MOVE_OPS:
            self.fed.router.register(op, self._handle)

    async def _handle(self, message: Raw, sender: str) -> dict[str, Any]:
        return await self.receiver.handle(message.frame, sender)

    @property
    def busy(self) -> bool:
        return self.lock.locked()

    def movable(self) -> list[tuple[str, tuple[str, ...]]]:
        """(fragment, box types) of the fragments that may move now."""
        return movable(self.site, self.fed.hosting.hosted)

    async def move_out(
        self, name: str, target: bytes, *, contract: str, load: float = 0.0, price: float = 0.0
    ) -> dict[str, Any]:
        """Move fragment ``name``, with its state, to peer ``target``."""
        return await self.sender.move_out(name, target, contract=contract, load=load, price=price)

    async def handle(self, frame: dict[str, Any], sender: str) -> dict[str, Any]:
        return await self.receiver.handle(frame, sender)
