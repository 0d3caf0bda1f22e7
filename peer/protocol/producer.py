"""Producer ids: the name under which a client's pushes are kept (with each batch's seq) so
that a retried push is stored once. Checked alike where a push arrives from a client and
where it arrives forwarded over a peer link."""

from __future__ import annotations

import re

from peer.errors import InvalidInput

MAX_PRODUCER_CHARS = 256  # a producer id (it is kept with each batch it pushed)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_producer(producer: str | None) -> str | None:
    """A push's producer id (None: none), refused unless 1-256 characters without control
    characters (the API and peer links check it alike)."""
    if producer is not None and (
        not producer or len(producer) > MAX_PRODUCER_CHARS or _CONTROL.search(producer)
    ):
        raise InvalidInput(
            f"push: 'producer' must be 1-{MAX_PRODUCER_CHARS} characters without control "
            "characters",
            argument="producer",
        )
    return producer
