"""Stream replication, one room (docs/replication.md).

A replicated stream's log lives on its replicas; a control plane replicated by Raft names
one of them primary for an epoch and keeps the in-sync set. The room, from the bottom up
(import-linter's "replication room" contract keeps these layers):

* :mod:`~peer.replication.core`: the data plane's sans-IO state machines (primary, follower,
  epoch history) and the effects they ask their driver to perform;
* :mod:`~peer.replication.control`: the control plane's pure core (commands, the state they
  are applied to, failover and repair decisions);
* :mod:`~peer.replication.raft`: the Raft driver of the control plane on pysyncobj (the
  commands' codec, the timings, the machine and its transport over peer links);
* :mod:`~peer.replication.link_messages`: the replica and control-plane messages on peer links;
* :mod:`~peer.replication.fence`: a replica's durable fence and epoch history;
* :mod:`~peer.replication.log`: ``StreamLog`` (what a stream's log offers; the spool is one)
  and ``ReplicatedLog`` (a spool and its fence, composed);
* :mod:`~peer.replication.ports`: what the room is given (``Links``, ``Records``);
  :mod:`~peer.replication.names`: the names of the streams it makes;
* the drivers: :mod:`~peer.replication.heartbeats` (every peer's side of the control plane),
  :mod:`~peer.replication.voter`, :mod:`~peer.replication.driver` (one stream's replica),
  :mod:`~peer.replication.streams` (every replicated stream of this peer),
  :mod:`~peer.replication.plane` (the wiring) and :mod:`~peer.replication.fragment_failover`.

The rest of the peer sees only the face (``ports``, ``link_messages``, ``log``, ``names``);
the composition root builds the drivers.
"""
