"""peer.elastic.provision: the local provisioner starts a name once (a real child process),
the command template is checked and quoted, and new names are never reused."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from peer.elastic.provision import (
    CommandProvisioner,
    LaunchSpec,
    LocalProvisioner,
    check_template,
    launch_names,
    make_provisioner,
)
from peer.timing import wait_until_sync

SPEC = LaunchSpec("acme", "127.0.0.1:7701", "1:3", key=Path("/k/acme.key"), extra=("--no-lane",))


def test_the_local_command_joins_the_participant_as_the_launched_name(tmp_path: Path) -> None:
    command = LocalProvisioner(tmp_path, SPEC).command("acme-e1")
    assert command[1:4] == ["-m", "peer.cli", "join"]
    pairs = dict(itertools.pairwise(command))
    assert pairs["--participant"] == "acme" and pairs["--bootstrap"] == "127.0.0.1:7701"
    assert pairs["--data-dir"] == str(tmp_path / "acme-e1")
    assert pairs["--launched-as"] == "acme-e1" and pairs["--elastic"] == "1:3"
    assert pairs["--key"] == "/k/acme.key" and command[-1] == "--no-lane"


def test_a_local_name_is_started_once_while_it_runs(tmp_path: Path) -> None:
    # a stand-in for python: a script that ignores the peer's options and sleeps
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    fake.chmod(0o755)
    prov = LocalProvisioner(tmp_path / "peers", SPEC, python=str(fake))
    assert not prov.running("acme-e1")
    done = prov.start("acme-e1")
    assert done.startswith("started acme-e1")
    pid = int((tmp_path / "peers" / "acme-e1" / "launch.pid").read_text())
    try:
        wait_until_sync(lambda: prov.running("acme-e1") or None, "the launched process", 10)
        assert prov.start("acme-e1") == "acme-e1 runs already"
        assert os.getsid(pid) == pid  # its own session: it outlives the leader
        assert prov.used() == {"acme-e1"}
    finally:
        os.kill(pid, signal.SIGKILL)
        psutil.Process(pid).wait(10)
    assert not prov.running("acme-e1")


def test_a_command_template_is_filled_quoted_and_run_once(tmp_path: Path) -> None:
    out = tmp_path / "calls"
    prov = CommandProvisioner(f"echo {{participant}} {{bootstrap}} {{name}} >> {out}", SPEC)
    assert prov.start("acme-e1") == "ran the provisioner command for acme-e1"
    assert prov.start("acme-e1") == "acme-e1 was started by this leader already"
    assert out.read_text().split() == ["acme", "127.0.0.1:7701", "acme-e1"]
    hostile = CommandProvisioner("echo {name}", SPEC).command("x; rm -rf /")
    assert hostile == "echo 'x; rm -rf /'"


def test_a_failing_command_says_how_it_failed() -> None:
    prov = CommandProvisioner("echo no room for {name} >&2; exit 3", SPEC)
    with pytest.raises(RuntimeError, match="exited 3: no room for acme-e1"):
        prov.start("acme-e1")
    assert prov.used() == set()


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("start {participant}", "must use {name}"),
        ("start {name} {host}", "unknown field {host}"),
        ("start {name", "template"),
    ],
)
def test_a_bad_template_is_refused_naming_what_is_wrong(template: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("{", r"\{").replace("}", r"\}")):
        check_template(template)
    with pytest.raises(ValueError):
        make_provisioner(template, Path("."), SPEC)


def test_new_names_skip_every_name_taken() -> None:
    assert launch_names("acme", ["acme-e1", "acme-e3"], 3) == ["acme-e2", "acme-e4", "acme-e5"]
    assert launch_names("acme", [], 0) == []
