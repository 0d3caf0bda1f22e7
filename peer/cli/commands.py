"""The ``peer`` commands that talk to a running peer through its client API.

``schema create``, ``stream create``, ``query submit|start|stop|delete``, ``push``,
``subscribe``, ``lookup`` and ``status`` (DESIGN.md section 8). Each opens one connection
(:func:`with_client`: an unreachable peer is exit 2 with a hint), makes its requests, prints
the replies (:mod:`peer.cli.render`) and closes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.cli.options import UsageError, add_client_options, client_tls, peer_addr
from peer.cli.render import print_json, print_status
from peer.errors import Unavailable

if TYPE_CHECKING:
    from peer.client import Client

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


async def with_client(args: argparse.Namespace, fn: Callable[[Client], Awaitable[int]]) -> int:
    """``fn`` on a connection to the peer the options name; closed afterwards."""
    from peer.client import Client

    host, port = peer_addr(args)
    try:
        client = Client(host, port, timeout_s=args.timeout, **client_tls(args))
        await client.connect()
    except (OSError, Unavailable, TimeoutError) as exc:
        raise Unavailable(
            f"cannot reach a peer at {host}:{port} ({exc}); is `peer join` "
            "running there? Point --peer or PEER_ADDR at it."
        ) from exc
    try:
        return await fn(client)
    finally:
        await client.close()


async def cmd_schema_create(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text()

    async def go(client: Client) -> int:
        print_json(await client.create_schema(text))
        return 0

    return await with_client(args, go)


async def cmd_stream_create(args: argparse.Namespace) -> int:
    async def go(client: Client) -> int:
        print_json(await client.create_stream(args.name, args.schema))
        return 0

    return await with_client(args, go)


async def cmd_query_submit(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text()

    async def go(client: Client) -> int:
        result = await client.create_query(text)
        if args.start:
            result = {**result, **(await client.start_query(result["query"]))}
        print_json(result)
        return 0

    return await with_client(args, go)


def status_cmd(status: str) -> Command:
    """``query start|stop|delete``: set a query's status to ``status``."""

    async def cmd(args: argparse.Namespace) -> int:
        async def go(client: Client) -> int:
            print_json(await client.set_query_status(args.name, status))
            return 0

        return await with_client(args, go)

    return cmd


async def cmd_push(args: argparse.Namespace) -> int:
    from peer.ingest import chunks, read_columns
    from peer.model.schema import parse_schema

    source = sys.stdin if args.file in (None, "-") else Path(args.file).open()  # noqa: SIM115
    with source:
        text = source.read().splitlines()

    async def go(client: Client) -> int:
        info = await client.lookup_object(args.stream)
        if info.get("kind") != "stream":
            raise UsageError(f"{args.stream} is a {info.get('kind')}, not a stream")
        schema = parse_schema(info["schema"])
        columns = read_columns(text, args.format, schema)
        total = 0
        for part in chunks(columns, args.batch_size):
            reply = await client.push(args.stream, {"columns": part})
            total += int(reply.get("count", 0))
        print(json.dumps({"stream": args.stream, "pushed": total}))
        return 0

    return await with_client(args, go)


async def cmd_subscribe(args: argparse.Namespace) -> int:
    from peer.ingest import to_jsonl
    from peer.model.schema import parse_schema

    async def go(client: Client) -> int:
        info = await client.lookup_object(args.stream)
        schema = parse_schema(info["schema"])
        seen = 0
        iterator = client.subscribe(args.stream, start=args.start).__aiter__()
        while args.limit is None or seen < args.limit:
            try:
                async with asyncio.timeout(args.idle_timeout):
                    batch = await iterator.__anext__()
            except (TimeoutError, StopAsyncIteration):
                break
            rows = batch.rows()
            if args.limit is not None:
                rows = rows[: args.limit - seen]
            seen += len(rows)
            sys.stdout.write(to_jsonl(rows, schema))
            sys.stdout.flush()
        return 0

    return await with_client(args, go)


async def cmd_lookup(args: argparse.Namespace) -> int:
    async def go(client: Client) -> int:
        print_json(await client.lookup_object(args.name))
        return 0

    return await with_client(args, go)


async def cmd_status(args: argparse.Namespace) -> int:
    async def go(client: Client) -> int:
        status = await client.status()
        if args.json:
            print_json(status)
        else:
            print_status(status)
        return 0

    return await with_client(args, go)


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """schema, stream, query, push, subscribe, lookup and status, in that order."""
    schema = sub.add_parser("schema", help="schemas").add_subparsers(dest="sub", required=True)
    p = add_client_options(
        schema.add_parser("create", help="create a schema from Medusa XML or JSON")
    )
    p.add_argument("file")
    p.set_defaults(run=cmd_schema_create)

    stream = sub.add_parser("stream", help="streams").add_subparsers(dest="sub", required=True)
    p = add_client_options(stream.add_parser("create", help="create a stream"))
    p.add_argument("name")
    p.add_argument("--schema", required=True)
    p.set_defaults(run=cmd_stream_create)

    query = sub.add_parser("query", help="queries").add_subparsers(dest="sub", required=True)
    p = add_client_options(query.add_parser("submit", help="submit Medusa/Borealis XML or JSON"))
    p.add_argument("file")
    p.add_argument("--start", action="store_true")
    p.set_defaults(run=cmd_query_submit)
    for verb, status in (("start", "RUNNING"), ("stop", "STOPPED"), ("delete", "DELETED")):
        p = add_client_options(query.add_parser(verb, help=f"set a query {status}"))
        p.add_argument("name")
        p.set_defaults(run=status_cmd(status))

    p = add_client_options(
        sub.add_parser("push", help="push tuples (one per line); exit 0 once acked")
    )
    p.add_argument("stream")
    p.add_argument("file", nargs="?", default="-")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    p.add_argument("--batch-size", type=int, default=10_000)
    p.set_defaults(run=cmd_push)

    p = add_client_options(sub.add_parser("subscribe", help="print a stream's tuples as JSONL"))
    p.add_argument("stream")
    p.add_argument("--limit", type=int)
    p.add_argument("--idle-timeout", type=float, default=None)
    p.add_argument("--start", choices=("latest", "earliest"), default="latest")
    p.set_defaults(run=cmd_subscribe)

    p = add_client_options(sub.add_parser("lookup", help="describe a schema, stream or query"))
    p.add_argument("name")
    p.set_defaults(run=cmd_lookup)

    p = add_client_options(sub.add_parser("status", help="what the peer runs"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_status)
