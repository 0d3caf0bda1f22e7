"""Starting a participant's peers: ``peer join --provisioner SPEC`` (issue 28).

Theory of operation
-------------------
The burst leader (:mod:`peer.elastic.leader`) decides which peers the participant has launched,
by name, in the control plane; a provisioner makes a name run. Starting a name is idempotent,
because a leader that dies after its plan was committed leaves the next one to start the same
names again: the names, not the calls, say how many peers there are.

- ``local`` (the default): a ``peer join`` process on this machine, in its own session (it
  outlives the leader that started it), with its data directory ``BASE/NAME`` beside this
  peer's, bootstrapped into the federation through this peer, ``--launched-as NAME`` (which
  keeps it out of the control plane's seats, so draining it never costs a voter) and the same
  participant key, trust directory and ``--elastic`` bounds. Its pid is in ``BASE/NAME/launch.pid``
  and its output in ``BASE/NAME/peer.log``; a name whose process is alive is not started again.
- a command template, e.g. ``--provisioner 'ssh host-{name} start-peer {participant}
  {bootstrap} {name}'``: run through the shell with ``{participant}``, ``{bootstrap}`` (this
  peer's overlay address) and ``{name}`` filled in (each quoted), to start the peer anywhere
  (docs/operations.md shows a script). This module cannot see whether it runs, so it runs the
  command once per name per leader; the command must start ``peer join ... --launched-as
  {name}`` and do nothing when that name already runs.

A launched peer leaves by itself when its name leaves the plan (:mod:`peer.elastic.drain`):
no provisioner stops anything.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

__all__ = [
    "CommandProvisioner",
    "LaunchSpec",
    "LocalProvisioner",
    "Provisioner",
    "make_provisioner",
]

PID_FILE = "launch.pid"
LOG_FILE = "peer.log"
_FIELDS = ("participant", "bootstrap", "name")


class Provisioner(Protocol):
    def start(self, name: str) -> str:
        """Make ``name`` run (nothing if it runs already); what was done, in words."""
        ...

    def used(self) -> set[str]:
        """Names this provisioner has ever started (new peers get new names)."""
        ...


@dataclass(frozen=True)
class LaunchSpec:
    """What a launched peer is started with: the participant, where it bootstraps, and the
    options it shares with the peer that launches it."""

    participant: str
    bootstrap: str  # HOST:PORT of this peer's overlay
    elastic: str  # MIN:MAX
    key: Path | None = None
    trust: Path | None = None
    extra: tuple[str, ...] = ()  # more `peer join` options (capacity, Spark master, ...)


class LocalProvisioner:
    """Starts ``peer join`` processes on this machine, under ``base``."""

    def __init__(self, base: Path, spec: LaunchSpec, python: str = sys.executable) -> None:
        self.base = base
        self.spec = spec
        self.python = python

    def data_dir(self, name: str) -> Path:
        return self.base / name

    def used(self) -> set[str]:
        return {p.parent.name for p in self.base.glob(f"*/{PID_FILE}")}

    def running(self, name: str) -> bool:
        """Whether the process last started for ``name`` is alive (and still a peer)."""
        try:
            pid = int((self.data_dir(name) / PID_FILE).read_text().strip())
            proc = psutil.Process(pid)
            return proc.status() != psutil.STATUS_ZOMBIE and "join" in proc.cmdline()
        except (OSError, ValueError, psutil.Error):
            return False

    def command(self, name: str) -> list[str]:
        spec = self.spec
        args = [
            self.python, "-m", "peer.cli", "join",
            "--participant", spec.participant,
            "--bootstrap", spec.bootstrap,
            "--data-dir", str(self.data_dir(name)),
            "--listen", "127.0.0.1:0",
            "--launched-as", name,
            "--elastic", spec.elastic,
            "--provisioner", "local",
        ]  # fmt: skip
        if spec.key is not None:
            args += ["--key", str(spec.key)]
        if spec.trust is not None:
            args += ["--trust", str(spec.trust)]
        return [*args, *spec.extra]

    def start(self, name: str) -> str:
        if self.running(name):
            return f"{name} runs already"
        home = self.data_dir(name)
        home.mkdir(parents=True, exist_ok=True)
        with open(home / LOG_FILE, "ab") as out:
            proc = subprocess.Popen(
                self.command(name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this peer: the plan, not this process, owns it
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        tmp = home / (PID_FILE + ".tmp")
        tmp.write_text(str(proc.pid))
        tmp.replace(home / PID_FILE)
        return f"started {name} (pid {proc.pid}, data {home})"


class CommandProvisioner:
    """Runs a command template once per name (per leader)."""

    def __init__(self, template: str, spec: LaunchSpec) -> None:
        check_template(template)
        self.template = template
        self.spec = spec
        self.started: set[str] = set()

    def used(self) -> set[str]:
        return set(self.started)

    def command(self, name: str) -> str:
        values = {
            "participant": self.spec.participant,
            "bootstrap": self.spec.bootstrap,
            "name": name,
        }
        return self.template.format(**{k: shlex.quote(v) for k, v in values.items()})

    def start(self, name: str) -> str:
        if name in self.started:
            return f"{name} was started by this leader already"
        command = self.command(name)
        done = subprocess.run(
            command, shell=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=120
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).decode(errors="replace").strip()[-300:]
            raise RuntimeError(f"provisioner command for {name} exited {done.returncode}: {tail}")
        self.started.add(name)
        return f"ran the provisioner command for {name}"


def check_template(template: str) -> None:
    """A usable command template, or ValueError naming what is wrong."""
    import string

    try:
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ValueError(f"--provisioner template: {exc}") from None
    unknown = sorted(names - set(_FIELDS))
    if unknown:
        raise ValueError(
            f"--provisioner template: unknown field {{{unknown[0]}}} (known: "
            + ", ".join("{" + f + "}" for f in _FIELDS) + ")"
        )  # fmt: skip
    if "name" not in names:
        raise ValueError("--provisioner template must use {name}: each launched peer has one")


def make_provisioner(spec_text: str, base: Path, spec: LaunchSpec) -> Provisioner:
    """``--provisioner``: ``local``, or a command template."""
    if spec_text.strip() == "local":
        return LocalProvisioner(base, spec)
    return CommandProvisioner(spec_text, spec)


def launch_names(participant: str, taken: Sequence[str], count: int) -> list[str]:
    """``count`` new names for launched peers, ``PARTICIPANT-eN`` with the lowest N not taken."""
    names: list[str] = []
    n = 1
    while len(names) < count:
        candidate = f"{participant}-e{n}"
        if candidate not in taken:
            names.append(candidate)
        n += 1
    return names
