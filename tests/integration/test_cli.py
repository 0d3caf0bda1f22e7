"""The `peer` command against a real `peer join --no-engine` process (no JVM needed).

Covers the contract of DESIGN.md section 8 for one peer: exit codes, messages a person can act
on, push of JSONL and CSV files and stdin (acknowledged only when durable; chunks under a
producer id, so a run pushed again with ``--producer`` adds nothing), ``--peer`` lists,
subscribe as JSONL, lookup and status.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from peer.client import Client
from peer.testing import PeerProcess

SCHEMA_XML = """<schema name="medusa://nms.lcs.mit.edu/locator/person">
  <field name="person_name" type="string" size="32"/>
  <field name="person_id" type="int"/>
  <field name="seen" type="timestamp"/>
</schema>"""


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerProcess]:
    root = tmp_path_factory.mktemp("cli")
    with PeerProcess(root / "data", "--no-engine", log_path=root / "peer.log") as running:
        yield running


def cli(
    peer: PeerProcess | None, *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if peer is not None:
        env["PEER_ADDR"] = f"127.0.0.1:{peer.port}"
    return subprocess.run(
        [sys.executable, "-m", "peer.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_create_push_subscribe_lookup_status(peer: PeerProcess, tmp_path: Path) -> None:
    schema = tmp_path / "person.xml"
    schema.write_text(SCHEMA_XML)
    assert cli(peer, "schema", "create", str(schema)).returncode == 0
    made = cli(
        peer,
        "stream",
        "create",
        "medusa://nms.lcs.mit.edu/locator/people",
        "--schema",
        "medusa://nms.lcs.mit.edu/locator/person",
    )
    assert made.returncode == 0, made.stderr
    stream = "medusa://nms.lcs.mit.edu/locator/people"

    jsonl = tmp_path / "people.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps(
                {"person_name": f"p{i}", "person_id": i, "seen": f"2024-05-01T10:00:{i:02d}Z"}
            )
            for i in range(40)
        )
    )
    pushed = cli(peer, "push", stream, str(jsonl))
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout) == {"stream": stream, "pushed": 40}

    csv_text = "person_id,person_name,seen\n" + "\n".join(
        f"{i},q{i},1714557600.5" for i in range(40, 50)
    )
    assert cli(peer, "push", stream, "-", "--format", "csv", stdin=csv_text).returncode == 0

    sub = cli(
        peer, "subscribe", stream, "--start", "earliest", "--limit", "50", "--idle-timeout", "10"
    )
    assert sub.returncode == 0, sub.stderr
    rows = [json.loads(line) for line in sub.stdout.splitlines()]
    assert [r["person_id"] for r in rows] == list(range(50))
    assert rows[3]["seen"] == "2024-05-01T10:00:03+00:00"
    assert rows[45]["person_name"] == "q45"

    looked = json.loads(cli(peer, "lookup", stream).stdout)
    assert looked["kind"] == "stream" and looked["latest_offset"] == 1
    status = json.loads(cli(peer, "status", "--json").stdout)
    assert {"name": stream, "latest_offset": 1} in status["streams"]
    assert status["engine"] == "none"


def test_bad_file_pushes_nothing_and_names_line_and_field(
    peer: PeerProcess, tmp_path: Path
) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"name": "pt", "fields": [{"name": "x", "type": "int"}]}))
    assert cli(peer, "schema", "create", str(schema)).returncode == 0
    assert cli(peer, "stream", "create", "pts", "--schema", "pt").returncode == 0
    bad = cli(peer, "push", "pts", "-", stdin='{"x": 1}\n{"x": 2}\n{"x": "three"}\n')
    assert bad.returncode == 1
    assert "line 3" in bad.stderr and "'x'" in bad.stderr
    looked = json.loads(cli(peer, "lookup", "pts").stdout)
    assert looked["latest_offset"] == -1  # nothing of the refused file was kept


def test_errors_are_actionable(peer: PeerProcess, tmp_path: Path) -> None:
    unknown = cli(peer, "push", "nope", "-", stdin='{"x": 1}\n')
    assert unknown.returncode == 1 and "nope" in unknown.stderr
    query = tmp_path / "q.json"
    query.write_text(
        json.dumps(
            {
                "name": "q",
                "boxes": [
                    {
                        "name": "f",
                        "type": "filter",
                        "inputs": ["pts_missing"],
                        "outputs": ["o"],
                        "params": {"expression.0": "x > 1"},
                    }
                ],
            }
        )
    )
    refused = cli(peer, "query", "submit", str(query))
    assert refused.returncode == 1 and "pts_missing" in refused.stderr
    hostile = tmp_path / "h.json"
    hostile.write_text(
        json.dumps(
            {
                "name": "h",
                "boxes": [
                    {
                        "name": "f",
                        "type": "filter",
                        "inputs": ["pts"],
                        "outputs": ["o"],
                        "params": {
                            "expression.0": "reflect('java.lang.Runtime', 'getRuntime') IS NULL"
                        },
                    }
                ],
            }
        )
    )
    refused = cli(peer, "query", "submit", str(hostile))
    assert refused.returncode == 1 and "reflect" in refused.stderr
    unreachable = cli(None, "status", "--peer", "127.0.0.1:1")
    assert unreachable.returncode == 2 and "peer join" in unreachable.stderr
    assert cli(None, "status", "--peer", "nonsense").returncode == 2


def test_query_on_a_peer_without_engine_is_refused_at_start(
    peer: PeerProcess, tmp_path: Path
) -> None:
    query = tmp_path / "q.json"
    query.write_text(
        json.dumps(
            {
                "name": "keep",
                "boxes": [
                    {
                        "name": "f",
                        "type": "filter",
                        "inputs": ["pts"],
                        "outputs": ["kept"],
                        "params": {"expression.0": "x > 1"},
                    }
                ],
            }
        )
    )
    submitted = cli(peer, "query", "submit", str(query))
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["status"] == "SETUP"
    started = cli(peer, "query", "start", "keep")
    assert started.returncode == 1 and "without an engine" in started.stderr
    assert cli(peer, "query", "delete", "keep").returncode == 0


def test_push_tries_a_peer_list_in_turn_and_resumes_by_producer(
    peer: PeerProcess, tmp_path: Path
) -> None:
    """``--peer`` with a refusing address first, then the peer; a run pushed again under its
    producer id (a resume) adds nothing, and a fresh run appends (ids are per run)."""
    schema = tmp_path / "r.json"
    schema.write_text(json.dumps({"name": "rs", "fields": [{"name": "x", "type": "int"}]}))
    peers = f"127.0.0.1:1,127.0.0.1:{peer.port}"
    assert cli(None, "schema", "create", str(schema), "--peer", peers).returncode == 0
    assert (
        cli(None, "stream", "create", "resumable", "--schema", "rs", "--peer", peers).returncode
        == 0
    )
    lines = "".join(f'{{"x": {i}}}\n' for i in range(5))
    push = ("push", "resumable", "-", "--batch-size", "2", "--producer", "cli:0123abcd")
    first = cli(None, *push, "--peer", peers, stdin=lines)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"stream": "resumable", "pushed": 5}
    again = cli(peer, *push, stdin=lines)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"stream": "resumable", "pushed": 5, "duplicates": 5}
    assert json.loads(cli(peer, "lookup", "resumable").stdout)["latest_offset"] == 2
    fresh = cli(peer, "push", "resumable", "-", stdin=lines)
    assert json.loads(fresh.stdout) == {"stream": "resumable", "pushed": 5}
    assert json.loads(cli(peer, "lookup", "resumable").stdout)["latest_offset"] == 3
    sub = cli(peer, "subscribe", "resumable", "--start", "earliest", "--idle-timeout", "2")
    assert [json.loads(line)["x"] for line in sub.stdout.splitlines()] == [*range(5), *range(5)]


def test_keygen_writes_private_key_0600(tmp_path: Path) -> None:
    made = cli(None, "keygen", "acme", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "acme.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "acme.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    again = cli(None, "keygen", "acme", "--dir", str(tmp_path))
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr


def test_time_units_round_trip_and_subscribe_prints_any_stored_timestamp(
    peer: PeerProcess, tmp_path: Path
) -> None:
    schema = tmp_path / "ticks.json"
    schema.write_text(
        json.dumps(
            {
                "name": "ticks",
                "fields": [
                    {"name": "n", "type": "int"},
                    {"name": "at", "type": "timestamp"},
                    {"name": "note", "type": "string", "nullable": True},
                ],
            }
        )
    )
    assert cli(peer, "schema", "create", str(schema)).returncode == 0
    assert cli(peer, "stream", "create", "ticks", "--schema", "ticks").returncode == 0
    ms = 1_700_000_000_123
    lines = {
        "ms": f'{{"n": 1, "at": {ms}, "note": null}}\n',
        "us": f'{{"n": 2, "at": {ms * 1000 + 4}, "note": "x"}}\n',
        "s": '{"n": 3, "at": "2023-11-14T22:13:20.5Z", "note": null}\n',
    }
    for unit, line in lines.items():
        pushed = cli(peer, "push", "ticks", "-", "--time-unit", unit, stdin=line)
        assert pushed.returncode == 0, pushed.stderr
    csv = cli(
        peer, "push", "ticks", "--format", "csv", "--time-unit", "ms", stdin=f"n,at,note\n4,{ms},\n"
    )
    assert csv.returncode == 0, csv.stderr
    # A millisecond count read as seconds lies past the year 9999: refused, naming line and field.
    wrong = cli(
        peer,
        "push",
        "ticks",
        stdin=f'{{"n": 9, "at": 0, "note": null}}\n{{"n": 5, "at": {ms}, "note": null}}\n',
    )
    assert wrong.returncode != 0
    assert "line 2, field 'at'" in wrong.stderr and "--time-unit" in wrong.stderr

    # A value no ISO-8601 string can write (stored through the wire, which takes any int64).
    async def push_far() -> None:
        async with Client("127.0.0.1", peer.port) as c:
            await c.push("ticks", {"rows": [{"n": 6, "at": 2**62, "note": None}]})

    asyncio.run(push_far())
    got = cli(
        peer, "subscribe", "ticks", "--start", "earliest", "--limit", "5", "--idle-timeout", "10"
    )
    assert got.returncode == 0, got.stderr
    rows = [json.loads(line) for line in got.stdout.splitlines()]
    assert [(r["n"], r["at"], r["note"]) for r in rows] == [
        (1, "2023-11-14T22:13:20.123000+00:00", None),
        (2, "2023-11-14T22:13:20.123004+00:00", "x"),
        (3, "2023-11-14T22:13:20.500000+00:00", None),
        (4, "2023-11-14T22:13:20.123000+00:00", None),
        (6, 2**62, None),
    ]


def test_a_second_peer_on_the_same_data_directory_is_refused(peer: PeerProcess) -> None:
    """One process per data directory (peer.storage.datadir): a second `peer join` on it exits
    at once naming the directory and the running peer's pid; the first serves on."""
    second = cli(
        None, "join", "--no-engine", "--data-dir", str(peer.data_dir), "--listen", "127.0.0.1:0"
    )
    assert second.returncode == 1, second.stderr
    assert str(peer.data_dir) in second.stderr and "in use by another peer" in second.stderr
    assert peer.proc is not None and f"pid {peer.proc.pid}" in second.stderr

    async def still_serving() -> None:
        async with Client("127.0.0.1", peer.port, timeout_s=30) as c:
            assert peer.proc is not None and (await c.status())["pid"] == peer.proc.pid

    asyncio.run(still_serving())
