"""``peer demo``: a local federation of real peers runs one of the example queries, checked.

The demo makes a key pair for each of ``--peers`` participants (acme, globex, initech, ...)
and a trust directory in a temporary directory, starts one ``peer join`` process per
participant (each with its own data directory and a one-core local Spark session), joins them
into one overlay and waits until every peer sees every other one alive. It then creates an
example's schemas and streams (:mod:`peer.examples`: Medusa's traffic query by default, the
network-intrusion query with ``--example intrusion``), submits the query with its box groups
placed on the participants round-robin, and starts it: the query runs as fragments on several
peers, chained by mirrors.

One pusher per input stream pushes the generated tuples in event-time order, in batches, each
batch to a peer picked at random (which forwards it to the stream's host), with a producer id
and sequence number so that a retried batch is kept once. Meanwhile the demo shows, live, what
each peer runs (its fragments, hosted streams and mirrors, its state and load as gossip has
it) and what comes out. At the end it reads every output stream from the earliest tuple on a
peer that does not host it, compares it with the example's plain-Python reference, stops the
peers, and exits 0 only if every output stream matches.

The parts, each a module:

- :mod:`peer.demo.run`: the options and the driver (start the peers, submit, wait, stop);
- :mod:`peer.demo.examples`: the examples the demo runs and how boxes are dealt to peers;
- :mod:`peer.demo.inputs`: the input cut into batches and pushed on a schedule;
- :mod:`peer.demo.board` and :mod:`peer.demo.view`: what the demo knows, and shows, live;
- :mod:`peer.demo.check`: the verdict against the plain-Python reference;
- :mod:`peer.demo.spike`: ``peer demo --spike``, a load spike and boxes moving under contract;
- :mod:`peer.demo.elastic`: ``peer demo --elastic``, a participant growing with a ramp and
  shrinking after it;
- :mod:`peer.demo.partition`: ``peer demo --partition``, a participant cut off: tentative
  results, then their corrections (issue 16).

The peers themselves are :mod:`peer.testing.cluster`'s local federation.
"""

from __future__ import annotations

from peer.demo.examples import EXAMPLES
from peer.demo.run import add_arguments, main, run_demo

__all__ = ["EXAMPLES", "add_arguments", "main", "run_demo"]
