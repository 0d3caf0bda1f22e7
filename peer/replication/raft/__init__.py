"""The control plane's Raft driver (docs/replication.md): pysyncobj replicating
:class:`~peer.replication.control.ControlState` among 3 or 5 voter peers.

It knows nothing of sockets or of the peer's links: the peer gives each
:class:`ControlMachine` a ``send(node_id, frame) -> bool`` callable and hands it every frame
from another voter with :meth:`ControlMachine.deliver`. ``link_transport`` is pysyncobj's
transport over those two; ``codec`` the commands' and snapshots' bytes; ``timings`` its clocks;
``machine`` the replicated state machine that drives them.
"""

from __future__ import annotations

from peer.replication.raft.codec import (
    MAX_COMMAND_BYTES,
    burst_from_wire,
    burst_to_wire,
    command_from_wire,
    command_to_wire,
    state_from_streams,
    stream_from_wire,
    stream_to_wire,
)
from peer.replication.raft.link_transport import (
    LinkTransport,
    MessageError,
    SendFn,
    TransportFactory,
    check_log_command,
    decode_message,
    encode_message,
)
from peer.replication.raft.machine import ControlMachine
from peer.replication.raft.timings import RaftTimings

__all__ = [
    "MAX_COMMAND_BYTES",
    "ControlMachine",
    "LinkTransport",
    "MessageError",
    "RaftTimings",
    "SendFn",
    "TransportFactory",
    "burst_from_wire",
    "burst_to_wire",
    "check_log_command",
    "command_from_wire",
    "command_to_wire",
    "decode_message",
    "encode_message",
    "state_from_streams",
    "stream_from_wire",
    "stream_to_wire",
]
