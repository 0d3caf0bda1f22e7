"""Pure parts of the CLI and the Java check: no peer, no JVM."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest

from peer.cli import UsageError, build_parser, parse_addr
from peer.engine.java import parse_java_version


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21.0.2" 2024-01-16 LTS', 21),
        ('java version "1.8.0_381"', 8),
        ('openjdk version "25-ea" 2025-09-16', 25),
    ],
)
def test_parse_java_version(output: str, major: int) -> None:
    parsed = parse_java_version(output)
    assert parsed is not None and parsed[0] == major


def test_parse_java_version_garbage() -> None:
    assert parse_java_version("command not found") is None


@pytest.mark.parametrize("text", ["localhost", "127.0.0.1:", ":7700", "h:99999", "h:port"])
def test_bad_addresses_name_the_option(text: str) -> None:
    with pytest.raises(UsageError, match="--peer"):
        parse_addr(text, what="--peer")


def test_good_address() -> None:
    assert parse_addr("[::1]:7700") == ("::1", 7700)
    assert parse_addr("127.0.0.1:0") == ("127.0.0.1", 0)


def test_synopsis_commands_parse() -> None:
    parser = build_parser()
    for argv in (
        ["keygen", "acme", "--dir", "/tmp/k"],
        ["join"],
        ["join", "--no-lane"],
        [
            "join",
            "--data-dir",
            "d",
            "--participant",
            "acme",
            "--key",
            "k",
            "--listen",
            "127.0.0.1:7701",
            "--bootstrap",
            "a:1",
            "--bootstrap",
            "b:2",
            "--http",
            "127.0.0.1:8080",
            "--contracts",
            "c",
            "--trust",
            "t",
            "--spark-master",
            "local[2]",
            "--no-engine",
        ],
        ["schema", "create", "s.xml"],
        ["stream", "create", "people", "--schema", "person"],
        ["query", "submit", "q.xml", "--start"],
        ["query", "start", "q"],
        ["query", "stop", "q"],
        ["query", "delete", "q"],
        ["push", "people", "f.jsonl", "--format", "csv"],
        ["push", "people"],
        ["subscribe", "MrX", "--limit", "3", "--idle-timeout", "2"],
        ["lookup", "people"],
        ["status", "--json"],
        ["demo", "--peers", "1", "--duration", "5"],
        ["doctor"],
    ):
        parser.parse_args(argv)


def _parsers(parser: argparse.ArgumentParser, path: str = "peer") -> Iterator[tuple[str, Any]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_flag_has_help_and_shows_its_default() -> None:
    missing, hidden_default = [], []
    for path, parser in _parsers(build_parser()):
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            name = action.option_strings[-1] if action.option_strings else action.dest
            if not (action.help or "").strip():
                missing.append(f"{path} {name}")
            shown = action.option_strings and action.default not in (None, False, [])
            said = "default" in (action.help or "")
            if shown and not said and f"(default: {action.default})" not in " ".join(text.split()):
                hidden_default.append(f"{path} {name}")
    assert not missing, f"flags without help: {missing}"
    assert not hidden_default, f"defaults not shown: {hidden_default}"


def test_status_shows_tentative_queries_since_when_and_their_corrections() -> None:
    from peer.cli.render import availability_text

    assert availability_text(None) == "exact"
    assert availability_text({"tentative": False, "corrections": 0}) == "exact"
    text = availability_text(
        {
            "tentative": True,
            "tentative_since": 100.0,
            "missing_inputs": ["cars_g"],
            "corrections": 1,
            "corrected_tuples": 12,
        },
        now=130.0,
    )
    assert text == "TENTATIVE for 30 s (missing cars_g); 1 corrections, 12 taken back"
    done = {"tentative": False, "corrections": 2, "corrected_tuples": 5}
    assert availability_text(done) == "exact (2 corrections, 5 taken back)"


def test_join_volunteers_for_the_control_plane_unless_told_otherwise() -> None:
    parser = build_parser()
    plain = parser.parse_args(["join"])
    assert (plain.voter, plain.volunteer) == (False, True)
    forced = parser.parse_args(["join", "--voter"])
    assert (forced.voter, forced.volunteer) == (True, True)
    out = parser.parse_args(["join", "--no-voter"])
    assert (out.voter, out.volunteer) == (False, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["join", "--voter", "--no-voter"])


def test_status_says_why_a_stream_has_fewer_copies(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from peer.cli.render import print_status

    monkeypatch.setenv("COLUMNS", "300")  # (rich wraps table cells to the terminal's width)
    base = {"peer": "127.0.0.1:7700", "engine": "none", "uptime_s": 1, "data_dir": "d"}
    base = {**base, "queries": [], "streams": [{"name": "ticks", "latest_offset": 3}]}
    print_status({**base, "replication": {"voters": [], "streams": {}, "note": "1 copy: x"}})
    assert "streams: 1 copy: x" in capsys.readouterr().out
    lone = {"role": "primary", "epoch": 1, "replicas": ["a" * 40], "in_sync": ["a" * 40]}
    lone["copies"] = "1 of 3 copies: only 1 peer live"
    print_status({**base, "replication": {"voters": ["a" * 40], "streams": {"ticks": lone}}})
    assert "1 of 3 copies: only 1 peer live" in capsys.readouterr().out


def test_status_shows_standbys_their_lag_and_promotions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from peer.cli.render import print_status

    monkeypatch.setenv("COLUMNS", "300")
    base = {"peer": "127.0.0.1:7700", "engine": "local[*]", "uptime_s": 1, "data_dir": "d"}
    base = {**base, "queries": [], "streams": []}
    standby = {
        "anchor": "ticks",
        "epoch": 2,
        "batches": 9,
        "held": 14,
        "since_batch_s": 0.25,
        "behind_batches": 3,
        "promoted": False,
    }
    replication = {"voters": [], "streams": {}, "standbys": {"win": standby}, "promotions": 1}
    print_status({**base, "replication": replication})
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "win" in line)
    for shown in ("standby", "ticks", "3 batches", "0.2 s", "14", "9"):
        assert shown in row, (shown, row)
    assert "standby promotions here: 1" in out


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--elastic", "3"], "MIN:MAX"),
        (["--elastic", "a:b"], "MIN:MAX"),
        (["--elastic", "3:1"], "1 <= MIN <= MAX"),
        (["--elastic", "0:2"], "1 <= MIN <= MAX"),
        (["--elastic", "1:3"], "--participant and --key"),
        (["--launched-as", "x"], "goes with --elastic"),
        (["--participant", "acme", "--key", "k", "--elastic", "1:3", "--elastic-interval", "0"],
         "--elastic-interval must be"),
        (["--participant", "acme", "--key", "k", "--elastic", "1:3", "--elastic-interval",
          "nan"], "--elastic-interval must be"),
        (["--participant", "acme", "--key", "k", "--elastic", "1:3", "--provisioner", "go"],
         "must use {name}"),
        (["--participant", "acme", "--key", "k", "--elastic", "1:3", "--provisioner",
          "go {name} {zone}"], "unknown field {zone}"),
    ],
)  # fmt: skip
def test_join_refuses_bad_elastic_options_naming_them(argv: list[str], why: str) -> None:
    from peer.cli.join import elastic_options

    args = build_parser().parse_args(["join", *argv])
    with pytest.raises(UsageError) as raised:
        elastic_options(args)
    assert why in str(raised.value)


def test_join_elastic_options_parse_and_launched_peers_share_what_they_must() -> None:
    from peer.cli.join import elastic_options, launch_args

    argv = ["join", "--participant", "acme", "--key", "k", "--elastic", " 1:3 ",
            "--capacity", "0.5", "--no-lane", "--elastic-interval", "4"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert elastic_options(args) == (1, 3)
    assert launch_args(args) == (
        "--capacity", "0.5", "--no-lane", "--elastic-interval", "4.0", "--replicas", "3",
        "--min-insync", "2",
    )  # fmt: skip
    assert elastic_options(build_parser().parse_args(["join"])) is None


def test_status_shows_the_burst_leader_its_decisions_and_a_drain(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from peer.cli.render import print_status

    monkeypatch.setenv("COLUMNS", "300")
    base = {"peer": "127.0.0.1:7700", "engine": "local[*]", "uptime_s": 1, "data_dir": "d"}
    base = {**base, "queries": [], "streams": []}
    grow = {
        "t": 1.7e9, "action": "grow", "term": 2, "current": 1, "size": 3,
        "reason": "needs 4 peers at 70% utilisation; held at MAX (3)",
        "offered": 24000.0, "true_rate": 10000.0, "launched": ["acme-e1", "acme-e2"],
    }  # fmt: skip
    elastic = {"participant": "acme", "min": 1, "max": 3, "leader": "ab" * 20, "leading": True,
               "term": 2, "launched": ["acme-e1", "acme-e2"], "counts": {"grow": 1},
               "decisions": [grow], "launched_as": "acme-e3", "draining": True,
               "left": ["another query here reads its result stream q9_out"]}  # fmt: skip
    print_status({**base, "elastic": elastic})
    out = capsys.readouterr().out
    assert "elastic acme 1:3: leader abababababab (this peer), term 2" in out
    assert "launched acme-e1, acme-e2" in out
    row = next(line for line in out.splitlines() if "grow" in line)
    for shown in ("1 -> 3", "24,000", "10,000", "held at MAX (3)"):
        assert shown in row, (shown, row)
    waiting = "waiting on: another query here reads its result stream q9_out"
    assert f"launched as acme-e3: draining; {waiting}" in out
