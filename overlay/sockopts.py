"""Socket options every TCP connection of a peer gets (its links, its client API, clients).

- ``TCP_NODELAY``: frames are whole messages; send each at once (Nagle and delayed ACKs would
  hold back small frames such as credit by ~40 ms).
- ``TCP_USER_TIMEOUT`` (Linux): a connection whose sent data stays unacknowledged for
  :data:`UNACKED_TIMEOUT_S` is closed by the kernel. Across a partition, or to a host that
  died without a word, TCP otherwise retransmits with a doubling timeout for a quarter of an
  hour: after a 30 s partition healed, a link waited ~24 s for its next retransmission
  before anything flowed again (scripts/bench_dpc.py). Closed instead, the link is opened
  anew on its next use and goes on at once. A busy but living peer is not affected: its
  kernel acknowledges what arrives, whatever the process does.
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["UNACKED_TIMEOUT_S", "tune"]

UNACKED_TIMEOUT_S = 10.0


def tune(sock: socket.socket | None) -> None:
    """Set this module's options on ``sock`` (a TCP socket); an option the platform lacks is
    left out."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, user_timeout, int(UNACKED_TIMEOUT_S * 1000))
