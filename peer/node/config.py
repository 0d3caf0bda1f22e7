"""A peer's configuration: what ``peer join`` sets from its options, and the tests directly.

Each field names its unit (``_s``, ``_bytes``); docs/operations.md says what each does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from peer.fetch.server import FetchLimits
from peer.model.limits import ContentLimits


@dataclass
class PeerConfig:
    data_dir: Path = field(default_factory=lambda: Path("peer-data"))
    host: str = "127.0.0.1"
    port: int = 7700
    engine: bool = True
    spark_master: str = "local[*]"
    spark_conf: dict[str, str] = field(default_factory=dict)
    checkpoint_root: Path | None = None  # None: DATA_DIR/checkpoints (peer.engine.checkpoint_home)
    trigger_s: float = 0.0
    max_rows_per_batch: int = 200_000
    # Run filter/map/union-only queries together in one streaming query (peer.engine.lane).
    fuse_stateless: bool = True
    # How many per-tuple queries run on their own before the next ones share the lane.
    lane_after: int = 1
    max_frame_bytes: int = 64 * 1024 * 1024
    # Wire budgets, timeouts, fair sharing (issue 12): docs/protocol.md section 6 says each.
    max_frame_depth: int = 32
    max_frame_elements: int = 2_000_000
    max_container_len: int = 1_000_000
    max_decoded_bytes: int = 128 * 1024 * 1024
    frame_timeout_s: float = 60.0
    api_idle_timeout_s: float = 300.0
    link_idle_timeout_s: float = 300.0
    max_connections_per_address: int = 64
    evict_idle_s: float = 2.0
    relay_streams_per_connection: int = 16
    relay_streams_per_address: int = 32
    decode_workers: int = 1
    maintenance_interval_s: float = 2.0
    availability_interval_s: float = 0.25  # how often queries with a bound are looked at
    # How long a stream no query reads (a result stream) keeps its tuples for late subscribers.
    retention_s: float = 600.0
    fsync: bool = True
    # the overlay (DHT catalog, peer links, gossip); off: a lone peer as in issue 2
    overlay: bool = True
    overlay_host: str | None = None  # default: the API host
    overlay_port: int | None = None  # default: API port + 1 (0 when the API port is 0)
    bootstrap: list[tuple[str, int]] = field(default_factory=list)
    bootstrap_timeout_s: float = 30.0
    participant: str | None = None
    key_path: Path | None = None
    trust_dir: Path | None = None
    gossip_interval_s: float = 1.0
    suspect_after_s: float = 3.0
    dead_after_s: float = 8.0
    lease_s: float = 20.0
    # Backpressure: how many batches a stream may hold that its slowest reader (a query, a
    # mirror to another peer) has not taken; beyond it, pushes and mirrored appends wait
    # (up to backlog_wait_s, then a retriable error) and queries writing it read no input.
    max_backlog_batches: int = 1000
    backlog_wait_s: float = 30.0
    # Federation (issue 5): signed contracts with partners, and the bounded-price brain.
    contracts_dir: Path | None = None
    capacity: float | None = None  # cores this peer offers; default: os.cpu_count()
    bpm_period_s: float = 5.0
    offer_margin: float = 0.05
    accept_margin: float = 0.05
    offer_timeout_s: float = 10.0
    brain: bool = True  # run the brain when there are contracts (or balance, with an engine)
    # Balancing inside the participant (issue 28): hand load to a sibling peer whose
    # utilisation is lower by balance_margin over two brain rounds (peer.elastic.siblings).
    balance: bool = True
    balance_margin: float = 0.2
    # Growing and shrinking (peer.elastic.leader): --elastic MIN:MAX, how peers are started
    # (--provisioner: "local" or a command template), the options launched peers share, and
    # for a launched peer its name in the burst leader's plan (--launched-as).
    elastic: tuple[int, int] | None = None
    provisioner: str = "local"
    launch_args: tuple[str, ...] = ()
    launched_as: str | None = None
    # Replication (issue 11): a seat in the control plane, and the defaults of new streams.
    voter: bool = False  # a seat in the control plane whatever the count (--voter)
    volunteer: bool = False  # take an open seat (peer join's default; --no-voter: off)
    replicas: int = 3
    min_insync: int = 2
    failover_after_s: float = 3.0  # a primary this silent is replaced (sooner if it is gone)
    repair_after_s: float = 30.0  # a replica silent this long is replaced by a live peer
    voter_grace_s: float = 30.0  # a voter silent this long is replaced by a volunteer
    # Observability (issue 13): /metrics, /status and the dashboard on this address; None: off
    # (``peer join`` serves them by default on the API host, API port + 2).
    http: tuple[str, int] | None = None
    # Run a small windowed query once after this peer's own Spark session starts, so that the
    # first fragment it runs (a take-over, an arrival) starts warm (peer.engine.warm).
    warm_up: bool = True
    # Queries coordinated here that do not say get warm standbys (peer.replication.standby).
    standby: bool = False
    # Content budgets of requests (issue 12): pushed Arrow bytes once decompressed, query size
    # in any form, boxes, arrows per box, parameter text (peer.model.limits).
    limits: ContentLimits = field(default_factory=ContentLimits)
    # Executors fetch spool files from this peer (peer.fetch.server.remote_input: None = when
    # the Spark master is not local, or FEDSTREAM_FETCH_REMOTE=1).
    fetch_remote: bool | None = None
    fetch_port: int = 0  # 0: any free port (fix it where a firewall needs to know)
    fetch_limits: FetchLimits = field(default_factory=FetchLimits)
