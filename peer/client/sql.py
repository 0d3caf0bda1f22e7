"""Submitting a compiled SQL script from the client side: :func:`submit_script` (the same
requests, in the same order, as the peer makes for a ``create_sql`` request), for a caller
that compiled the script itself (tests and benchmarks that rename streams, say).
:meth:`peer.client.Client.submit_sql` sends the text to the peer instead."""

from __future__ import annotations

from peer.model.sql.submit import ScriptClient, ScriptSubmitted, submit_script

__all__ = ["ScriptClient", "ScriptSubmitted", "submit_script"]
