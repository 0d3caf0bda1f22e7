"""The ``peer`` command (DESIGN.md section 8: the synopsis there is a contract).

Only this package installs logging handlers and chooses uvloop. Every failure prints one line
a person can act on and exits non-zero: 1 for a refused request, 2 for usage or an
unreachable peer, 3 for a missing Java.

The commands, each with its options beside it:

- :mod:`peer.cli.contract`: ``keygen`` and ``contract create|sign|verify`` (files only);
- :mod:`peer.cli.join`: ``join``, which runs a peer;
- :mod:`peer.cli.commands`: ``schema``, ``stream``, ``query``, ``push``, ``subscribe``,
  ``lookup`` and ``status``, which talk to a peer (printed by :mod:`peer.cli.render`);
- :mod:`peer.cli.doctor`: ``doctor``, what keeps this machine from running a peer;
- ``demo``: :mod:`peer.demo`, a local federation running an example query.

A command is a coroutine function set as ``run`` (run on uvloop) or a plain function set as
``sync``; :func:`main` maps what it raises to the exit codes above.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from peer.cli.commands import add_client_commands
from peer.cli.contract import add_contract_command, add_keygen_command
from peer.cli.doctor import add_doctor_command
from peer.cli.join import add_join_command
from peer.cli.options import UsageError, parse_addr, use_defaults_formatter
from peer.errors import FedstreamError, JavaMissing, Unavailable

__all__ = ["UsageError", "build_parser", "main", "parse_addr"]


def cmd_demo(args: argparse.Namespace) -> int:
    from peer.demo import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peer", description="fedstream peer")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_keygen_command(sub)
    add_contract_command(sub)
    add_join_command(sub)
    add_client_commands(sub)
    add_doctor_command(sub)

    from peer.demo import add_arguments as add_demo_arguments

    p = sub.add_parser(
        "demo", help="run a local federation of peers on an example query and check its output"
    )
    add_demo_arguments(p)
    p.set_defaults(sync=cmd_demo)
    use_defaults_formatter(parser)
    return parser


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if hasattr(args, "sync"):
            return int(args.sync(args))
        return _run(args.run(args))
    except JavaMissing as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 3
    except (UsageError, Unavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FedstreamError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
