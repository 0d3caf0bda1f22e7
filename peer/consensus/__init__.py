"""The control plane's Raft driver (docs/replication.md): pysyncobj replicating
:class:`~peer.control.ControlState` among 3 or 5 voter peers.

It knows nothing of sockets or of the peer's links: the peer gives each
:class:`ControlMachine` a ``send(node_id, frame) -> bool`` callable and hands it every frame
from another voter with :meth:`ControlMachine.deliver`. ``transport`` is pysyncobj's transport
over those two; ``machine`` is the replicated state machine, its commands' wire form and its
snapshots.
"""

from __future__ import annotations

from peer.consensus.machine import (
    MAX_COMMAND_BYTES,
    ControlMachine,
    RaftTimings,
    command_from_wire,
    command_to_wire,
    state_from_streams,
    stream_from_wire,
    stream_to_wire,
)
from peer.consensus.transport import (
    LinkTransport,
    MessageError,
    SendFn,
    TransportFactory,
    check_log_command,
    decode_message,
    encode_message,
)

__all__ = [
    "MAX_COMMAND_BYTES",
    "ControlMachine",
    "LinkTransport",
    "MessageError",
    "RaftTimings",
    "SendFn",
    "TransportFactory",
    "check_log_command",
    "command_from_wire",
    "command_to_wire",
    "decode_message",
    "encode_message",
    "state_from_streams",
    "stream_from_wire",
    "stream_to_wire",
]
