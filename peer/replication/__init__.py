"""Stream replication, one room (docs/replication.md).

A replicated stream's log lives on its replicas; a control plane replicated by Raft names
one of them primary for an epoch and keeps the in-sync set. The room, from the bottom up:

* :mod:`~peer.replication.core`: the data plane's sans-IO state machines (primary, follower,
  epoch history) and the effects they ask their driver to perform;
* :mod:`~peer.replication.control`: the control plane's pure core (commands, the state they
  are applied to, failover and repair decisions);
* :mod:`~peer.replication.raft`: the Raft driver of the control plane on pysyncobj (the
  commands' codec, the timings, the machine and its transport over peer links);
* :mod:`~peer.replication.link_messages`: the replica and control-plane messages on peer links;
* :mod:`~peer.replication.fence`: a replica's durable fence and epoch history.
"""
