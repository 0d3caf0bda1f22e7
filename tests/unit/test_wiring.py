"""Collaborators are passed in when objects are made (issue 24): no product code patches
another object after it was built.

The check reads every module of ``peer/``, ``overlay/`` and ``contracts/`` and refuses an
assignment (``=``, ``+=``, annotated, ``del``) whose target belongs to an object other than
``self``/``cls``: ``site.engine = ...``, ``self.plane.replicas.is_live = ...`` (an attribute
of a collaborator, reached through ``self``), ``site.appenders[name] = ...`` (a collaborator's
container) and ``setattr(other, ...)``. A subscript of a local container (``out[k] = v``) and
of one's own (``self.streams[k] = v``) is fine.

Some objects are plain records whose fields their owner fills in: dataclasses of this code
base, ``ssl`` contexts being set up, zip entries, an argparse parser, an exception just
decoded. Each is listed in :data:`RECORDS` by module and expression, with the type it is and
why; the test checks that a listed dataclass is one, and that no entry is stale. Anything
else is a hook planted on a collaborator: give it to the object's constructor instead (a small
Protocol in the lower layer, or a registry the composition root owns: docs/architecture.md).

Not covered: mutation through method calls of another object's containers
(``other.items.pop(k)``), which an AST cannot tell from an ordinary call.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("peer", "overlay", "contracts")
OWN = ("self", "cls")

# Kinds that are not dataclasses of ours: objects of other libraries set up field by field as
# those intend, an error object, a part an object made for itself, and an instance a class's
# own constructor method is making. Each record of one says why it is fine.
OTHER_KINDS = frozenset(
    {
        "argparse.ArgumentParser",
        "ssl.SSLContext",
        "ssl.SSLObject",
        "zipfile.ZipInfo",
        "os.environ",
        "kademlia.node.Node",
        "kademlia.protocol.KademliaProtocol",
        "peer.errors.FedstreamError",
        "overlay.wire.FrameDecoder",
        "peer.replication.control.state.ControlState",
    }
)


class Record(NamedTuple):
    path: str  # the module, relative to the repository
    target: str  # the expression assigned to (its text, as ast.unparse gives it)
    kind: str  # the type it is: a dataclass of ours, or one of EXTERNAL_RECORDS
    reason: str


RECORDS: tuple[Record, ...] = (
    Record("peer/brain/rounds.py", "expected", "peer.brain.offers.Expected", "an offer's record"),
    Record("peer/cli/options.py", "parser", "argparse.ArgumentParser", "the parser being made"),
    Record("peer/demo/check.py", "board", "peer.demo.board.Board", "the demo's display record"),
    Record("peer/demo/inputs.py", "board", "peer.demo.board.Board", "the demo's display record"),
    Record("peer/demo/inputs.py", "state", "peer.demo.board.PushState", "a feeder's progress"),
    Record("peer/demo/run.py", "board", "peer.demo.board.Board", "the demo's display record"),
    Record("peer/demo/run.py", "self.board", "peer.demo.board.Board", "the demo's display"),
    Record("peer/demo/view.py", "board", "peer.demo.board.Board", "the demo's display record"),
    Record("peer/demo/view.py", "state", "peer.demo.board.OutputState", "an output's view"),
    Record("peer/engine/lane.py", "member", "peer.engine.lane.LaneMember", "a member's figures"),
    Record("peer/engine/runner.py", "running", "peer.engine.runner.RunningQuery", "its figures"),
    Record("peer/engine/session.py", "os", "os.environ", "the environment Spark reads"),
    Record("peer/engine/shipping.py", "info", "zipfile.ZipInfo", "a zip entry being written"),
    Record("peer/engine/forks.py", "state", "peer.engine.forks.FragmentState", "figures"),
    Record(
        "peer/engine/forks.py",
        "self.states.setdefault(name, FragmentState())",
        "peer.engine.forks.FragmentState",
        "a query's figures, kept in its own table",
    ),
    Record("peer/engine/forks.py", "fork", "peer.engine.forks.Fork", "a fork's feeds"),
    Record("peer/engine/forks.py", "self._marks", "peer.engine.forks._Marks", "its own"),
    Record("peer/fetch/client.py", "ctx", "ssl.SSLContext", "the client's context being set up"),
    Record("peer/fetch/tls.py", "ctx", "ssl.SSLContext", "the server's context being set up"),
    Record("peer/model/availability.py", "state", "peer.model.availability._Input", "a record"),
    Record("peer/model/tentative.py", "mark", "peer.model.tentative.UndoMark", "a record"),
    Record("peer/move/receiver.py", "incoming", "peer.move.package.Incoming", "an arrival"),
    Record("peer/move/sender.py", "intent", "peer.move.journal.Intent", "a journalled intent"),
    Record("peer/observe/http.py", "first", "ssl.SSLContext", "the context being set up"),
    Record("peer/observe/http.py", "sock", "ssl.SSLObject", "SNI: the handshake's context"),
    Record("peer/protocol/api.py", "err", "peer.errors.FedstreamError", "an error just decoded"),
    Record(
        "peer/protocol/api_connection.py",
        "sub",
        "peer.protocol.api_connection._Outgoing",
        "a subscription's credit",
    ),
    Record(
        "peer/protocol/api_connection.py",
        "opening",
        "peer.protocol.api_connection._Outgoing",
        "a subscription being opened",
    ),
    Record(
        "peer/replication/control/state.py",
        "state",
        "peer.replication.control.state.ControlState",
        "the instance its own classmethod (restore) is making",
    ),
    Record("peer/replication/core/primary.py", "peer", "peer.replication.core.primary._Peer", "-"),
    Record(
        "peer/replication/core/primary.py",
        "pending",
        "peer.replication.core.primary._Pending",
        "a proposal's record",
    ),
    Record(
        "peer/replication/fragment_failover.py",
        "standing",
        "peer.replication.fragment_failover._Standing",
        "a fragment's last checkpoint",
    ),
    Record(
        "peer/replication/raft/link_transport.py",
        "member",
        "peer.replication.raft.link_transport._Member",
        "a member's link figures",
    ),
    Record("peer/server/connection.py", "pump", "peer.server.connection._Pump", "a record"),
    Record("peer/storage/spool_format.py", "layout", "peer.storage.spool_format.Layout", "-"),
    Record("peer/storage/bundle.py", "info", "zipfile.ZipInfo", "a zip entry being written"),
    Record("peer/testing/sparkcluster.py", "host", "peer.testing.sparkcluster.WorkerHost", "-"),
    Record(
        "peer/testing/sparkcluster.py",
        "self.hosts[index]",
        "peer.testing.sparkcluster.WorkerHost",
        "a host of its own table",
    ),
    Record("overlay/admission.py", "slot", "overlay.admission.Slot", "an admission record"),
    Record("overlay/admission.py", "victim", "overlay.admission.Slot", "an admission record"),
    Record(
        "overlay/dht/server.py",
        "self.node",
        "kademlia.node.Node",
        "the kademlia server's record of its own address, filled once the socket is bound",
    ),
    Record(
        "overlay/dht/server.py",
        "protocol",
        "kademlia.protocol.KademliaProtocol",
        "its own DHT protocol's counters (``stats``, a plain dict)",
    ),
    Record(
        "overlay/dht/server.py",
        "self._protocol()",
        "kademlia.protocol.KademliaProtocol",
        "its own DHT protocol's counters (``stats``, a plain dict)",
    ),
    Record("overlay/link/connection.py", "call", "overlay.link.outbox.Call", "a call's record"),
    Record("overlay/link/connection.py", "served", "overlay.link.connection._Served", "a request"),
    Record("overlay/link/outbox.py", "out.call", "overlay.link.outbox.Call", "a call's record"),
    Record("overlay/link/pool.py", "opening", "overlay.link.pool._Opening", "a link opening"),
    Record("overlay/membership.py", "member", "overlay.membership.Member", "a member's state"),
    Record(
        "overlay/stream.py",
        "self._decoder",
        "overlay.wire.FrameDecoder",
        "the sans-IO decoder the stream made for itself; its budget is a setting",
    ),
    Record("overlay/tls.py", "ctx", "ssl.SSLContext", "the context being set up"),
    Record("overlay/transport.py", "slot", "overlay.admission.Slot", "a connection's slot"),
)


class Patch(NamedTuple):
    path: str
    line: int
    target: str  # the object assigned to


def patched(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, object) of every assignment to another object's attribute or container."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and not _is_own(node.args[0])
        ):
            yield node.lineno, ast.unparse(node.args[0])
        line = getattr(node, "lineno", 0)
        for target in targets:
            for obj in _owners(target):
                yield line, ast.unparse(obj)


def _owners(target: ast.expr) -> Iterator[ast.expr]:
    """The objects a target assigns into that are neither ``self``/``cls`` nor local."""
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _owners(element)
    elif isinstance(target, ast.Starred):
        yield from _owners(target.value)
    elif isinstance(target, ast.Attribute):
        if not _is_own(target.value):
            yield target.value
    elif isinstance(target, ast.Subscript):
        container = target.value
        while isinstance(container, ast.Subscript):
            container = container.value
        if isinstance(container, ast.Call) and isinstance(container.func, ast.Attribute):
            container = container.func.value  # ``d.setdefault(k, {})[j] = v``: d changes
        if isinstance(container, ast.Attribute) and not _is_own(container.value):
            yield container.value
        elif not isinstance(container, ast.Name | ast.Attribute):
            yield container


def _is_own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in OWN


def _patches(tree: ast.AST, path: str) -> list[Patch]:
    return [Patch(path, line, target) for line, target in patched(tree)]


def product_patches() -> list[Patch]:
    found: list[Patch] = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            found += _patches(ast.parse(file.read_text(), filename=path), path)
    return found


def test_no_product_code_patches_a_collaborator() -> None:
    allowed = {(r.path, r.target) for r in RECORDS}
    planted = [p for p in product_patches() if (p.path, p.target) not in allowed]
    assert not planted, "assigned onto another object after it was made:\n" + "\n".join(
        f"  {p.path}:{p.line}: {p.target}" for p in planted
    )


def test_every_listed_record_is_still_assigned_to() -> None:
    seen = {(p.path, p.target) for p in product_patches()}
    stale = [r for r in RECORDS if (r.path, r.target) not in seen]
    assert not stale, f"records no longer assigned to (remove them): {stale}"


@pytest.mark.parametrize("kind", sorted({r.kind for r in RECORDS} - OTHER_KINDS))
def test_a_listed_record_of_ours_is_a_dataclass(kind: str) -> None:
    module, _, name = kind.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    assert dataclasses.is_dataclass(found), f"{kind} is not a plain record (a dataclass)"


@pytest.mark.parametrize(
    ("source", "objects"),
    [
        ("site.engine = engine", ["site"]),
        ("self.plane.replicas.is_live = f", ["self.plane.replicas"]),
        ("self.hosting.primary_of = f", ["self.hosting"]),
        ("site.appenders[name] = push", ["site"]),
        ("fed.status_parts['brain'] = part", ["fed"]),
        ("a.b.c = 1", ["a.b"]),
        ("x.n += 1", ["x"]),
        ("x.n: int = 1", ["x"]),
        ("del site.trim_limit", ["site"]),
        ("(self.a, other.b) = (1, 2)", ["other"]),
        ("setattr(engine, 'emit', f)", ["engine"]),
        ("make().x = 1", ["make()"]),
        ("other.table.setdefault(k, {})[j] = v", ["other"]),
        ("out.setdefault(k, {})[j] = v\nself.ends.setdefault(k, {})[j] = v", []),
        ("self.x = 1\nself.items[k] = v\nitems[k] = v\nself.t[k][j] = v", []),
        ("setattr(self, 'x', 1)", []),
    ],
)
def test_the_check_tells_a_planted_hook_from_an_own_field(source: str, objects: list[str]) -> None:
    assert [target for _, target in patched(ast.parse(source))] == objects
