"""The overlay's protocol error family.

The split follows h11: a :class:`LocalProtocolError` means *we* tried to do something the
protocol does not allow (a bug or bad input on this side, raised before anything is sent); a
:class:`RemoteProtocolError` means the *other side* sent something invalid (hostile or broken
peer). Code that meets the network catches ``RemoteProtocolError`` and drops that one
connection; a ``LocalProtocolError`` usually becomes an error for the caller.

``retriable`` says whether the same operation may succeed later unchanged; a protocol
violation never does.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every framing or protocol violation."""

    retriable = False


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow (nothing was sent)."""


class RemoteProtocolError(ProtocolError):
    """The other side sent something the protocol does not allow."""
