"""A peer's engine on a real Spark cluster: a standalone Master and two Workers of one core each,
every Worker on a host of its own (network and mount namespaces, peer.testing.sparkcluster)
that does not see the tests' files, but for one shared directory (the checkpoint directory).

- a windowed aggregate, its state in the shared directory, runs on the executors (which
  import only the code the driver ships them) and equals plain Python;
- ``peer doctor --spark-master`` passes on the good cluster and catches each setup mistake:
  a wrong master, a driver bound to loopback (refused from the options, and, forced through
  ``--spark-conf``, seen as executors that never register), a listen address the executors
  cannot reach, a checkpoint directory that is not shared.

The ``spark_cluster`` fixture is module-wide (starting it costs about a minute); tests that
read spools through the peer (issue 25, item 2) add a ``peer join --spark-master
cluster.master_url --listen cluster.driver_host:0 --checkpoint-dir cluster.shared`` beside it,
with the peer's data directory under ``hidden`` as here. The last tests share one such peer
(``cluster_peer``), since a standalone application holds every free core while it lives.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from peer.client import Client
from peer.testing import (
    PeerProcess,
    collect,
    keyed_window_batches,
    keyed_window_query,
    keyed_window_schema,
    keyed_window_sums,
    make_participants,
    participant_args,
    wait_until_sync,
)
from peer.testing.sparkcluster import SparkCluster, missing

WHY = missing()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.skipif(WHY is not None, reason=WHY or ""),
    pytest.mark.timeout(900),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' temporary root: the Workers' hosts do not see it."""
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def spark_cluster(hidden: Path) -> Iterator[SparkCluster]:
    shared = hidden / "nfs-checkpoints"
    shared.mkdir(exist_ok=True)
    with SparkCluster(shared=shared, hidden=[hidden], workers=2, cores=1) as cluster:
        yield cluster


def _python(*argv: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )


def _expected(windows: set[int]) -> list[tuple[int, int, int, int]]:
    """Plain Python: the job's windowed aggregate (tests/integration/cluster_job.py)."""
    from tests.integration.cluster_job import GROUPS, ROWS_PER_SECOND, WINDOW_S

    cells: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for start in windows:
        for value in range(start * ROWS_PER_SECOND, (start + WINDOW_S) * ROWS_PER_SECOND):
            cell = cells[(start, value % GROUPS)]
            cell[0] += 1
            cell[1] += value
    return sorted((s, g, n, total) for (s, g), (n, total) in cells.items())


def _doctor(
    cluster: SparkCluster, hidden: Path, *options: str, timeout_s: float = 60
) -> tuple[int, dict[str, str], str]:
    data = hidden / "doctor-data"
    done = _python(
        "-m", "peer.cli", "doctor", "--data-dir", str(data),
        "--cluster-timeout", str(timeout_s), *options,
    )  # fmt: skip
    lines: dict[str, str] = {}
    for line in done.stdout.splitlines():
        status, _, rest = line.partition(" ")
        if status in ("ok", "FAIL"):
            name, _, detail = rest.strip().partition(" ")
            lines[name] = f"{status} {detail.strip()}"
    return done.returncode, lines, done.stdout + done.stderr[-3000:]


def test_doctor_passes_on_the_good_cluster(spark_cluster: SparkCluster, hidden: Path) -> None:
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", spark_cluster.master_url,
        "--listen", f"{spark_cluster.driver_host}:0",
        "--checkpoint-dir", str(spark_cluster.shared),
    )  # fmt: skip
    assert code == 0, out + spark_cluster.logs()
    for name in ("master", "driver", "executors", "code", "reach", "checkpoint"):
        assert lines[name].startswith("ok"), out
    assert "2 executor(s)" in lines["executors"]
    # the tasks land where Spark puts them: every executor that ran one reached the peer
    assert any(h.address in lines["reach"] for h in spark_cluster.hosts), out
    assert not any(spark_cluster.shared.glob(".doctor-*"))  # it cleans up


def test_doctor_catches_a_wrong_master(spark_cluster: SparkCluster, hidden: Path) -> None:
    with socket.socket() as free:
        free.bind((spark_cluster.driver_host, 0))
        port = free.getsockname()[1]
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", f"spark://{spark_cluster.driver_host}:{port}",
        "--listen", f"{spark_cluster.driver_host}:0",
    )  # fmt: skip
    assert code == 1, out
    assert lines["master"].startswith("FAIL cannot reach the Spark master"), out
    assert "org.apache.spark.deploy.master.Master" in lines["master"]
    assert lines["executors"] == "FAIL not checked: the master check failed", out


def test_doctor_catches_a_checkpoint_dir_that_is_not_shared(
    spark_cluster: SparkCluster, hidden: Path
) -> None:
    private = hidden / "not-shared"  # here, but not on the Workers' hosts
    private.mkdir(exist_ok=True)
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", spark_cluster.master_url,
        "--listen", f"{spark_cluster.driver_host}:0", "--checkpoint-dir", str(private),
    )  # fmt: skip
    assert code == 1, out
    assert lines["reach"].startswith("ok"), out
    assert lines["checkpoint"].startswith(
        f"FAIL {private} is not the same directory for the executors and this host"
    ), out
    assert "Mount the same shared directory" in lines["checkpoint"]
    assert not any(private.glob(".doctor-*"))


def test_doctor_catches_a_driver_on_loopback(spark_cluster: SparkCluster, hidden: Path) -> None:
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", spark_cluster.master_url,
        "--listen", "127.0.0.1:0",
    )  # fmt: skip
    assert code == 1, out
    assert lines["driver"].startswith("FAIL the driver would advertise 127.0.0.1"), out
    assert "--spark-driver-host" in lines["driver"]


def test_doctor_sees_executors_that_cannot_reach_a_loopback_driver(
    spark_cluster: SparkCluster, hidden: Path
) -> None:
    """Forced past the options' check, the executors never register: said so, with the fix."""
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", spark_cluster.master_url,
        "--listen", f"{spark_cluster.driver_host}:0",
        "--spark-conf", "spark.driver.host=127.0.0.1", timeout_s=12,
    )  # fmt: skip
    assert code == 1, out
    assert lines["executors"].startswith("FAIL no executor registered within 12 s"), out
    assert "connect back to the driver at 127.0.0.1:" in lines["executors"]


def test_doctor_catches_a_peer_address_executors_cannot_reach(
    spark_cluster: SparkCluster, hidden: Path
) -> None:
    code, lines, out = _doctor(
        spark_cluster, hidden, "--spark-master", spark_cluster.master_url,
        "--listen", "127.0.0.1:0", "--spark-driver-host", spark_cluster.driver_host,
    )  # fmt: skip
    assert code == 1, out
    assert lines["code"].startswith("ok"), out
    assert lines["reach"].startswith("FAIL executors cannot reach this peer at 127.0.0.1:"), out
    assert "ConnectionRefusedError" in lines["reach"]


def test_a_windowed_aggregate_on_the_executors_stays_exact_through_a_worker_killed(
    spark_cluster: SparkCluster,
) -> None:
    """A windowed aggregate (tests/integration/cluster_job.py: the peer's session, the code
    shipped, state in the shared directory) runs on the executors, which import only the code
    the driver ships them; a Worker host is killed -9 mid-stream (peer.testing.sparkcluster's
    helper): Spark runs the lost tasks on the other executor, the Worker started again
    registers anew, and every window equals plain Python, each once, none skipped."""
    checkpoint = spark_cluster.shared / "job-killed"
    commits = checkpoint / "commits"
    job = subprocess.Popen(
        [
            sys.executable, "-m", "tests.integration.cluster_job", spark_cluster.master_url,
            spark_cluster.driver_host, str(checkpoint), "40",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip

    def committed() -> int:
        return len([p for p in commits.glob("[0-9]*")]) if commits.is_dir() else 0

    try:
        deadline = time.monotonic() + 300
        while committed() < 3 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
        assert committed() >= 3, "the job made no progress"
        spark_cluster.kill_worker(1)
        mark = committed()
        while committed() < mark + 3 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
        assert committed() >= mark + 3, "no progress on the one Worker left"
        spark_cluster.start_worker(1)
        out, err = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(30)
        if spark_cluster.hosts[1].proc is None:
            spark_cluster.start_worker(1)
    assert job.returncode == 0, err[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None
    got = sorted((r["start"], r["grp"], r["n"], r["total"]) for r in result["rows"])
    starts = {start for start, *_ in got}
    assert len(starts) >= 40 and starts == set(range(0, 5 * len(starts), 5))
    assert got == _expected(starts)  # tuple for tuple, each once
    # the executors, not the driver, ran it, and wrote its state into the shared directory
    assert result["executors"] and set(result["executors"]) <= {
        h.address for h in spark_cluster.hosts
    }, result["executors"]
    assert any((checkpoint / "state").rglob("*")), "no state in the shared directory"


def _cluster_peer(cluster: SparkCluster, hidden: Path, name: str) -> tuple[PeerProcess, Any]:
    """A ``peer join --spark-master spark://...`` (not started) whose data directory the Worker
    hosts cannot see, and the arguments of a trusted client of it: its API listens off
    loopback, so it takes TLS clients of trusted participants only."""
    key = make_participants(hidden / f"{name}-keys", ["acme"])["acme"]
    trust = hidden / f"{name}-keys" / "trust"
    peer = PeerProcess(
        hidden / name,
        *participant_args("acme", key, trust),
        "--http", "off",
        "--spark-master", cluster.master_url,
        "--checkpoint-dir", f"file://{cluster.shared}",
        "--spark-conf", "spark.executor.memory=512m",
        log_path=hidden / f"{name}.log",
        host=cluster.driver_host,
        verbose=True,
    )  # fmt: skip

    def client() -> Client:
        return Client(cluster.driver_host, peer.port, participant="acme", key_path=key,
                      trust_dir=trust, timeout_s=120)  # fmt: skip

    return peer, client


def _windows(rows: list[dict[str, Any]]) -> Counter[tuple[int, ...]]:
    return Counter((r["window_start"], r["window_end"], r["k"], r["s"], r["n"]) for r in rows)


def test_forged_and_expired_read_capabilities_are_refused_on_the_executors(
    spark_cluster: SparkCluster, hidden: Path
) -> None:
    """Executors on the Worker hosts read a spool they cannot see through the peer's fetch
    server (real TLS, the server bound where the Workers reach it): with a good ticket they
    read every row; with a capability signed by another key, one whose signature was tampered
    with, and one that expired, the fetch fails with the server's reason and nothing is read
    (issue 25, item 2)."""
    import pickle

    import pyarrow as pa

    from peer.errors import Unauthorized
    from peer.fetch.capability import FetchKey
    from peer.fetch.protocol import FetchTicket
    from peer.storage.spool import Spool
    from peer.testing import FetchServerThread

    data = hidden / "refusals"
    spool = Spool(data / "spools" / "s", pa.schema([("a", pa.int64())]), fsync=False, name="s")
    for first in (0, 100, 200):
        spool.append(pa.table({"a": pa.array(range(first, first + 50), pa.int64())}))
    directory = str(spool.directory.resolve())
    with FetchServerThread(data, host=spark_cluster.driver_host) as fetch:
        key = FetchKey.load(Path(fetch.endpoint.key_path))
        now = time.time()
        good = key.mint(directory, 0, 2, now=now, ttl_s=600)
        tampered = bytes([good[0] ^ 1]) + good[1:]  # the signature's first byte
        tickets = {
            name: (directory, 0, 2, FetchTicket(fetch.endpoint.address, fetch.server.pin,
                                                directory, token))
            for name, token in {
                "good": good,
                "other-key": FetchKey.generate().mint(directory, 0, 2, now=now, ttl_s=600),
                "forged": tampered,
                "expired": key.mint(directory, 0, 2, now=now - 3600, ttl_s=60),
            }.items()
        }  # fmt: skip
        path = hidden / "refusal-tickets.pickle"
        path.write_bytes(pickle.dumps(tickets))
        done = _python(
            "-m", "tests.integration.cluster_fetch_job", spark_cluster.master_url,
            spark_cluster.driver_host, str(path),
        )  # fmt: skip
        served, refused = fetch.server.served_files, fetch.server.refused
    assert done.returncode == 0, done.stderr[-4000:] + spark_cluster.logs()
    found = json.loads(done.stdout.strip().splitlines()[-1])
    workers = {h.address for h in spark_cluster.hosts}
    assert {r["host"] for r in found.values()} <= workers, found  # read on the Worker hosts
    assert found["good"]["error"] is None, found["good"]
    assert found["good"]["rows"] == [*range(50), *range(100, 150), *range(200, 250)]
    for name in ("other-key", "forged", "expired"):
        result = found[name]
        assert result["rows"] == [], result  # nothing read
        assert result["error_type"] == Unauthorized.__name__, result
        assert f"read capability refused ({name})" in result["error"], result
    assert "its signature does not verify" in found["forged"]["error"]
    assert "expired" in found["expired"]["error"] and "s ago" in found["expired"]["error"]
    assert served == 3 and refused == 3, (served, refused)


def test_the_traffic_query_in_a_federation_with_a_cluster_peer_is_exact(
    spark_cluster: SparkCluster, hidden: Path
) -> None:
    """Medusa's traffic query over two participants: globex's peer runs Spark ``local[1]``
    and the statistics and towing boxes; acme's peer runs on the cluster and the billing
    fragment, which receives globex's segment tolls over a peer link and car positions from
    wherever they are hosted, and whose results are read through globex. Every output equals
    the plain-Python reference, tuple for tuple (issue 25, "Tests")."""
    from peer.examples import columns, traffic
    from peer.testing import LocalFederation

    work = hidden / "federation"
    keys = make_participants(work, ("acme", "globex"))
    trust = work / "trust"
    args = {
        "acme": [
            *participant_args("acme", keys["acme"], trust), "--http", "off",
            "--spark-master", spark_cluster.master_url,
            "--checkpoint-dir", f"file://{spark_cluster.shared}",
            "--spark-conf", "spark.executor.memory=512m",
        ],
        "globex": [
            *participant_args("globex", keys["globex"], trust), "--http", "off",
            "--spark-master", "local[1]", "--no-warm-up",
        ],
    }  # fmt: skip
    host = spark_cluster.driver_host  # both on the cluster's network: the Workers reach acme
    nodes = {
        "per_minute": "globex", "toll": "globex", "stopped": "globex", "dispatch": "globex",
        "moving": "acme", "bill": "acme",
    }  # fmt: skip
    inputs = traffic.generate(seed=3, cars=30, minutes=4, segments=6)
    want = traffic.reference(inputs)
    assert all(want[s] for s in traffic.OUTPUTS)
    assert any(row["toll"] > 0 for row in want["toll_notifications"])

    def client(fed: LocalFederation, name: str) -> Client:
        return Client(host, fed.procs[name].port, participant=name, key_path=keys[name],
                      trust_dir=trust, timeout_s=120)  # fmt: skip

    async def scenario(fed: LocalFederation) -> tuple[dict[str, list[Any]], list[Any]]:
        async with client(fed, "globex") as g, client(fed, "acme") as a:
            async with asyncio.timeout(180):  # the overlay: each sees both alive
                while True:
                    views = [((await c.status()).extra.get("overlay") or {}) for c in (g, a)]
                    alive = [
                        sum(m.get("state") == "alive" for m in v.get("members", [])) for v in views
                    ]
                    if min(alive) >= 2:
                        break
                    await asyncio.sleep(1)
            for schema in traffic.SCHEMAS:
                await g.create_schema(schema)
            for stream, schema_name in traffic.SOURCE_STREAMS.items():
                await g.create_stream(stream, schema_name)
            made = await g.create_query(traffic.query("traffic", nodes))
            await g.start_query("traffic")
            for stream, rows in inputs.items():
                for i in range(0, len(rows), 250):
                    await g.push(stream, {"columns": columns(rows[i : i + 250])})
            got = {
                stream: await collect(g, stream, len(rows), timeout_s=300, settle_s=5)
                for stream, rows in want.items()
            }
            return got, list(made.extra.get("fragments", []))

    with LocalFederation(work, args, hosts={"acme": host, "globex": host}) as fed:
        try:
            got, fragments = asyncio.run(scenario(fed))
        except BaseException:
            for name in ("acme", "globex"):
                print(name, fed.procs[name].log_path.read_text(errors="replace")[-4000:])
            print(spark_cluster.logs())
            raise
        acme = fed.procs["acme"].node_id
    # the billing fragment runs on the cluster peer, the others on the local one
    on_acme = [f for f in fragments if f.get("site") == acme]
    assert on_acme and len(on_acme) < len(fragments), fragments
    assert {s: traffic.compare(got[s], want[s]) for s in want} == {s: [] for s in want}


# The tests below share one cluster peer and come last: a standalone application takes every
# free core of the cluster, so while the shared peer lives no other application (the jobs, the
# doctor and the federation above) would get an executor.
@pytest.fixture(scope="module")
def cluster_peer(spark_cluster: SparkCluster, hidden: Path) -> Iterator[tuple[PeerProcess, Any]]:
    """One ``peer join --spark-master spark://...`` for the tests below (each uses streams and
    queries of its own names): starting one costs about half a minute."""
    peer, client = _cluster_peer(spark_cluster, hidden, "peer-on-cluster")
    peer.start(timeout_s=300)
    try:
        yield peer, client
    finally:
        peer.stop()


def test_a_peer_joins_with_the_cluster_as_its_engine(
    cluster_peer: tuple[PeerProcess, Any], spark_cluster: SparkCluster, hidden: Path
) -> None:
    """``peer join --spark-master spark://...``: the executor check passes at start, and the
    warm-up query (the spool source, a windowed aggregate on RocksDB, foreachBatch) runs on the
    executors, reading its spool from the peer's directory in the shared checkpoint dir."""
    peer, _ = cluster_peer

    def warmed() -> str | None:  # the warm-up runs once the peer is ready
        text = peer.log_path.read_text(errors="replace")
        done = "spark warmed up in" in text or "warm-up did not finish" in text
        return text if done or (peer.proc is not None and peer.proc.poll() is not None) else None

    text = wait_until_sync(warmed, "the peer's warm-up", 300, every_s=1)
    assert peer.proc is not None and peer.proc.poll() is None, text[-4000:]
    assert "shipped" in text and "spark warmed up in" in text, text[-4000:] + (spark_cluster.logs())
    record = json.loads((peer.data_dir / "checkpoint-home.json").read_text())
    home = spark_cluster.shared / record["name"]
    assert (home / "checkpoints").is_dir()
    assert (home / "executor-code" / "fedstream-executor.zip").is_file()
    assert not (peer.data_dir / "checkpoints").exists()


def test_pushed_data_on_the_cluster_alone_and_in_the_lane_is_exact(
    cluster_peer: tuple[PeerProcess, Any], spark_cluster: SparkCluster
) -> None:
    """The whole path of issue 25 on the cluster: tuples pushed to the peer, whose data
    directory the Worker hosts cannot see; a filter and a keyed tumbling window run on the
    executors, which fetch the spool files from the peer (signed read capabilities over TLS,
    peer.fetch). A second keyed window over the same stream joins the lane (issue 25, item 6;
    the first runs alone): the lane's source fetches its input in the executors, the member's
    (window, key) partials are computed there, and the driver collects partials, not rows.
    Both queries' windows equal plain Python, once each."""
    peer, client = cluster_peer
    per_push = 400
    batches = keyed_window_batches(31, 30, per_push, keys=4, values=(-5, 40))
    want_own = keyed_window_sums(batches, at_least=0)
    want_lane = keyed_window_sums(batches, at_least=10)

    async def scenario() -> tuple[list[Any], list[Any], dict[str, Any]]:
        async with client() as c:
            await c.create_schema(keyed_window_schema())
            await c.create_stream("lane_ticks", "tick")
            for name, at_least in (("alone", 0), ("laned", 10)):
                query = keyed_window_query(name, "lane_ticks", f"{name}_out", at_least=at_least)
                await c.create_query(query)
                await c.start_query(name)
            for i, batch in enumerate(batches):
                await c.push("lane_ticks", {"columns": batch}, producer="t", seq=i)
            own = await collect(c, "alone_out", sum(want_own.values()), timeout_s=240)
            laned = await collect(
                c, "laned_out", sum(want_lane.values()), timeout_s=240, settle_s=5
            )
            return own, laned, dict(await c.status())

    try:
        own, laned, status = asyncio.run(scenario())
    except BaseException:
        print(peer.log_path.read_text(errors="replace")[-6000:], spark_cluster.logs())
        raise
    log_text = peer.log_path.read_text(errors="replace")
    assert _windows(laned) == want_lane, log_text[-4000:]
    assert _windows(own) == want_own, log_text[-4000:]
    queries = {q["name"]: q for q in status["queries"]}
    assert queries["laned"].get("lane") is True, queries
    assert queries["alone"].get("lane") is None, queries
    # the driver's last lane batch: (window, key) partials per partition, never a push's rows
    assert 0 < queries["laned"]["collected_rows"] < per_push, queries["laned"]
    # Spark runs no task in the driver: the executors, which cannot see the data directory,
    # read every input file through the peer's fetch server; the state lives in the shared dir.
    assert not (peer.data_dir / "checkpoints").exists()


@pytest.mark.parametrize(
    "q",
    [
        "q1",  # per tuple: a map of every bid (currency conversion)
        "q3",  # a windowed join: people and their auctions, the join bounded in event time
        "q8",  # a window join: new people and new sellers of the same tumbling window
    ],
)
def test_nexmark_on_the_cluster_equals_duckdb(
    cluster_peer: tuple[PeerProcess, Any], q: str
) -> None:
    """NEXMark queries on a peer whose engine is the cluster (input fetched by the executors,
    state in the shared directory) equal DuckDB running each query's SQL on the same events,
    tuple for tuple (tests/integration/test_nexmark.py's generator, reference and driver)."""
    from peer.examples import compare
    from tests.integration.test_nexmark import duckdb_rows, run_query

    want = duckdb_rows([q])[q]
    assert want, f"{q}: the generated events give no result; the test would prove nothing"
    got = asyncio.run(run_query(cluster_peer[1], q, len(want), timeout_s=300))
    assert compare(got, want) == []


def test_every_worker_gone_the_peer_waits_for_executors_and_resumes_exactly(
    cluster_peer: tuple[PeerProcess, Any], spark_cluster: SparkCluster
) -> None:
    """Both Worker hosts killed -9 mid-stream (issue 25, item 8): pushes are still taken, the
    peer's status says the engine waits for executors (none live, since when); one Worker
    started again, the query resumes and every window equals plain Python, once each. It runs
    last of the shared peer's tests: they need not wait for the Workers to come back."""
    peer, client = cluster_peer
    batches = keyed_window_batches(37, 30, 400, keys=4, values=(-5, 40))
    want = keyed_window_sums(batches, at_least=0)
    first, second = batches[:12], batches[12:]

    async def executors(c: Client, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The status' executors once ``ok`` holds (bounded: 180 s)."""
        async with asyncio.timeout(180):
            while True:
                found = dict((await c.status()).get("executors") or {})
                if found and ok(found):
                    return found
                await asyncio.sleep(1)

    async def scenario() -> tuple[list[Any], dict[str, Any], dict[str, Any]]:
        async with client() as c:
            await c.create_schema(keyed_window_schema())
            await c.create_stream("orphan_ticks", "tick")
            await c.create_query(keyed_window_query("orphan", "orphan_ticks", "orphan_out"))
            await c.start_query("orphan")
            before = await executors(c, lambda e: e["live"] == 2)
            assert before["waiting"] is False and before["waiting_since"] is None, before
            for i, batch in enumerate(first):
                await c.push("orphan_ticks", {"columns": batch}, producer="t", seq=i)
            early = await collect(c, "orphan_out", 1, timeout_s=240)  # it has run on them
            assert early, "no window came out before the Workers were killed"
            killed_at = time.time()
            await asyncio.to_thread(spark_cluster.kill_worker, 0)
            await asyncio.to_thread(spark_cluster.kill_worker, 1)
            waiting = await executors(c, lambda e: e["waiting"])
            for i, batch in enumerate(second, start=len(first)):  # still taken
                await c.push("orphan_ticks", {"columns": batch}, producer="t", seq=i)
            assert (await executors(c, lambda e: True))["waiting"] is True
            await asyncio.to_thread(spark_cluster.start_worker, 0)
            back = await executors(c, lambda e: e["live"] >= 1)
            assert killed_at <= waiting["waiting_since"] <= time.time(), waiting
            rows = await collect(c, "orphan_out", sum(want.values()), timeout_s=300, settle_s=5)
            return rows, waiting, back

    try:
        rows, waiting, back = asyncio.run(scenario())
    except BaseException:
        print(peer.log_path.read_text(errors="replace")[-6000:], spark_cluster.logs())
        raise
    finally:
        for host in spark_cluster.hosts:  # what comes after gets both Workers back
            if host.proc is None:
                spark_cluster.start_worker(host.index)
    assert waiting["live"] == 0 and waiting["waiting"] is True, waiting
    assert back["waiting"] is False and back["waiting_since"] is None, back
    assert _windows(rows) == want, peer.log_path.read_text(errors="replace")[-4000:]
