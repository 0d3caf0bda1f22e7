"""The peer's brain: Medusa's bounded-price mechanism on a live peer (DESIGN.md section 7).

Theory of operation
-------------------
The decisions are pure and live in :mod:`contracts.bpm` and :mod:`peer.brain.offers`; the
:class:`Brain` feeds them measurements, carries out what they decide and keeps the ledger
(:mod:`peer.storage.ledger`). It reaches its peer only through a :class:`BrainHost`. Every
``period_s`` the brain takes a round:

1. *Measure.* The CPU of the peer's process tree (:class:`peer.brain.load.LoadMeter`, in cores) and
   the share of the period each fragment's streaming query spent in micro-batches (deltas of
   ``BrainHost.engine_busy_seconds``) give a load per fragment
   (:func:`peer.brain.load.fragment_loads`) and a utilisation ``u = cpu / capacity``. CPU alone
   misses one kind of overload: a peer whose queries cannot keep up (one busy core of many,
   Spark waiting on its disk) while the CPU is not saturated. So when the batches waiting in
   the fragments' inputs exceed ``overload_backlog`` and grew over the period, ``u`` is raised
   to at least 1: the peer takes in more than it gets through, which is what being over
   capacity means. The first round only sets the marks; a round whose measuring fails is
   skipped.
2. *Offer.* Each valid contract (checked against the clock every round: the book is loaded
   once) whose partner has a live engine peer becomes a ``ContractView`` at its highest price,
   covering the kinds of the fragments this peer may hand over under it. ``bpm.choose_offer``
   picks at most one offer; it goes to the partner's live engine peer with the lowest gossiped
   utilisation, and an answer must come within ``offer_timeout_s``.
3. *Move.* The fragments the partner accepted (only those that were offered) move one at a
   time, each recorded in the ledger. A refusal, an unanswered offer or a failed move puts the
   partner last in the refusal memory (``bpm.remember_outcome``); refusals are forgotten after
   ``FORGET_REFUSAL_ROUNDS`` rounds. A fragment whose move failed is not offered again for as
   many rounds: a failed move pauses the fragment, and what made it fail may well last. After
   a move, no offer is made until a whole measured period lies after it: the period that saw
   the move still counts the load that left.

The other side, :meth:`Brain.handle_offer`, validates an offer (malformed: ``InvalidInput``),
refuses one that no valid contract with its sender allows, and takes with ``bpm.accept`` what
its last measurement leaves room for, counting the boxes it already accepted that have not yet
shown in a measurement (:func:`peer.brain.offers.answer_offer`). One thing happens at a time
per peer: while this peer's own offer is out, a move is under way, or boxes it accepted have
not all arrived, it takes nothing (and offers nothing). ``handle_offer`` decides without
awaiting anything, so two offers arriving together cannot both be taken.

Layout
------
- :mod:`peer.brain.host`: :class:`BrainHost`, the port the peer gives the brain.
- :mod:`peer.brain.rounds`: :class:`Brain`, its state, the rounds and the bookkeeping of
  offers made and taken.
- :mod:`peer.brain.offers`: offers and replies on the wire, and the decision to take an offer.
- :mod:`peer.brain.load`: the CPU the peer's process tree uses, and each fragment's share.
- :mod:`peer.brain.status`: the load figures it gossips and its part of ``peer status``.
"""

from peer.brain.host import BrainHost
from peer.brain.offers import kind_of
from peer.brain.rounds import Brain

__all__ = ["Brain", "BrainHost", "kind_of"]
