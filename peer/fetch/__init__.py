"""Spool fetches: Spark executors on other hosts read a peer's spool files over the network.

* :mod:`peer.fetch.capability`: the fetch key, and the signed read capabilities (pure);
* :mod:`peer.fetch.protocol`: the fetch frames, the client's reply state machine, the ticket a
  partition carries and the endpoint the engine hands the source (pure);
* :mod:`peer.fetch.tls`: the server's certificate and the pin that executors check;
* :mod:`peer.fetch.server`: the peer's fetch server, under the budgets of docs/security.md;
* :mod:`peer.fetch.client`: the executor's side, used by the ``fedspool`` source's ``read()``.
"""
