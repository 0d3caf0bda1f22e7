"""The ``peer`` commands that talk to a running peer through its client API.

``schema create``, ``stream create``, ``query submit|start|stop|delete``, ``push``,
``subscribe``, ``lookup`` and ``status`` (DESIGN.md section 8). Each opens one connection,
to the first peer of ``--peer`` that answers (:func:`with_peers`: none answering is exit 2
with a hint), makes its requests, prints the replies (:mod:`peer.cli.render`) and closes it.

``push`` sends its input in chunks, each under an event id: one producer id per run (or
``--producer``, to resume an earlier run) and seq 1, 2, ... per chunk. A chunk refused with a
retriable error, or whose reply was lost with the connection, is sent again under the same
id, to the next peer of the list if the connection is gone; the stream keeps it once
(:meth:`peer.client.PeerList.push`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peer.cli.options import UsageError, add_client_options, client_tls, peer_addrs
from peer.cli.render import print_json, print_status
from peer.errors import Unavailable

if TYPE_CHECKING:
    from peer.client import Client, PeerList, RetryPolicy

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

DEFAULT_RETRY_TIMEOUT_S = 120.0  # peer.client.retry.DEFAULT_RETRY_DEADLINE_S
MAX_PRODUCER_CHARS = 200


async def with_peers(args: argparse.Namespace, fn: Callable[[PeerList], Awaitable[int]]) -> int:
    """``fn`` on the peers the options name, connected to the first that answers; closed
    afterwards."""
    from peer.client import Client, PeerList

    tls = client_tls(args)

    def make_client(host: str, port: int) -> Client:
        return Client(host, port, timeout_s=args.timeout, **tls)

    peers = PeerList(peer_addrs(args), make_client)
    try:
        await peers.connect()
    except (OSError, Unavailable, TimeoutError) as exc:
        raise Unavailable(
            f"cannot reach a peer at {peers.described} ({exc}); is `peer join` "
            "running there? Point --peer or PEER_ADDR at it."
        ) from exc
    try:
        return await fn(peers)
    finally:
        await peers.close()


async def with_client(args: argparse.Namespace, fn: Callable[[Client], Awaitable[int]]) -> int:
    """``fn`` on a connection to the first peer of the options that answers."""

    async def on_client(peers: PeerList) -> int:
        return await fn(peers.client)

    return await with_peers(args, on_client)


async def cmd_schema_create(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text()

    async def go(client: Client) -> int:
        print_json(await client.create_schema(text))
        return 0

    return await with_client(args, go)


async def cmd_stream_create(args: argparse.Namespace) -> int:
    async def go(client: Client) -> int:
        print_json(await client.create_stream(args.name, args.schema, replicas=args.replicas))
        return 0

    return await with_client(args, go)


async def _submit_sql(args: argparse.Namespace, text: str) -> int:
    """A SQL script: sent to the peer as text (create_sql), which compiles it (refused with
    line and column before anything is created; the schemas of streams it reads without
    declaring are looked up there) and creates its streams and queries in order."""
    if args.deploy:
        raise UsageError("--deploy places XML queries; in SQL write /*+ OPTIONS('node'='...') */")

    async def go(client: Client) -> int:
        submitted = await client.submit_sql(text, name=Path(args.file).stem, start=args.start)
        for warning in submitted.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print_json(submitted.to_wire())
        return 0

    return await with_client(args, go)


async def cmd_query_submit(args: argparse.Namespace) -> int:
    """Submit a query; a whole Borealis document creates its schemas, input streams and each
    of its queries in turn, placed by ``--deploy`` (peer.model.borealis)."""
    from peer.model.borealis import deployed, is_document, parse_deploy, parse_document
    from peer.model.query import parse_query, query_to_dict
    from peer.model.sql import is_sql

    text = Path(args.file).read_text()
    if args.file.endswith(".sql") or is_sql(text):
        return await _submit_sql(args, text)
    placed = parse_deploy(Path(args.deploy).read_text()) if args.deploy else {}
    xml = text.lstrip().startswith("<")
    document = parse_document(text) if xml and is_document(text) else None

    async def submit(client: Client, query: str | dict[str, Any]) -> dict[str, Any]:
        created = await client.create_query(query)
        result = created.to_wire()
        if args.start:
            result.update((await client.start_query(created.query)).to_wire())
        return result

    async def go(client: Client) -> int:
        if document is None:
            query = query_to_dict(deployed(parse_query(text), placed)) if placed else text
            print_json(await submit(client, query))
            return 0
        for schema in document.schemas:
            await client.create_schema(schema.to_dict())
        for stream, schema_name in document.inputs:
            await client.create_stream(stream, schema_name)
        results = [
            await submit(client, query_to_dict(deployed(q, placed))) for q in document.queries
        ]
        print_json(
            {
                "schemas": [s.name for s in document.schemas],
                "streams": [stream for stream, _ in document.inputs],
                "queries": results,
            }
        )
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
    from peer.client import RetryPolicy, new_producer_id

    producer = args.producer if args.producer is not None else new_producer_id("cli")
    if not producer.strip() or len(producer) > MAX_PRODUCER_CHARS:
        raise UsageError(
            f"--producer {producer!r} must be a non-blank id of at most {MAX_PRODUCER_CHARS} "
            "characters (the one an earlier run printed, to resume it)"
        )
    if not math.isfinite(args.retry_timeout) or args.retry_timeout < 0:
        raise UsageError(f"--retry-timeout must be seconds >= 0, not {args.retry_timeout}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {args.batch_size}")
    policy = RetryPolicy(deadline_s=args.retry_timeout)
    source = sys.stdin if args.file in (None, "-") else Path(args.file).open()  # noqa: SIM115
    with source:
        text = source.read().splitlines()

    async def go(peers: PeerList) -> int:
        result = await push_lines(
            peers,
            args.stream,
            text,
            args.format,
            args.batch_size,
            producer,
            policy,
            time_unit=args.time_unit,
        )
        print(json.dumps(result))
        return 0

    return await with_peers(args, go)


async def push_lines(
    peers: PeerList,
    stream: str,
    lines: list[str],
    fmt: str,
    batch_size: int,
    producer: str,
    policy: RetryPolicy,
    *,
    time_unit: str = "s",
) -> dict[str, Any]:
    """Push tuples (JSONL or CSV lines) in chunks of ``batch_size``, chunk n under event id
    (``producer``, n); what ``peer push`` prints: the rows acknowledged, and among them those
    the stream held already (``duplicates``: a resumed run's, or a retry's whose reply was
    lost), if any."""
    from peer.cli.ingest import chunks, read_columns
    from peer.model.schema import parse_schema

    info = await (await peers.connect()).lookup_object(stream)
    if info.kind != "stream":
        raise UsageError(f"{stream} is a {info.kind}, not a stream")
    columns = read_columns(lines, fmt, parse_schema(info.extra["schema"]), time_unit=time_unit)
    pushed = duplicates = 0
    for seq, part in enumerate(chunks(columns, batch_size), start=1):
        rows = len(next(iter(part.values()), []))
        try:
            reply = await peers.push(
                stream, {"columns": part}, producer=producer, seq=seq, policy=policy
            )
        except Unavailable as exc:
            raise Unavailable(
                f"{exc.message}. {pushed} rows were acknowledged before it; to push the rest "
                f"without duplicates, run the same command again with --producer {producer}",
                **exc.details,
            ) from exc
        pushed += rows
        if reply.duplicate:
            duplicates += rows
    result: dict[str, Any] = {"stream": stream, "pushed": pushed}
    if duplicates:
        result["duplicates"] = duplicates
    return result


async def cmd_subscribe(args: argparse.Namespace) -> int:
    from peer.cli.ingest import to_jsonl
    from peer.model.schema import parse_schema

    async def go(client: Client) -> int:
        info = await client.lookup_object(args.stream)
        schema = parse_schema(info.extra["schema"])
        seen = 0
        subscription = client.subscribe(args.stream, start=args.start, tentative=args.tentative)
        iterator = subscription.__aiter__()
        while args.limit is None or seen < args.limit:
            try:
                async with asyncio.timeout(args.idle_timeout):
                    batch = await iterator.__anext__()
            except (TimeoutError, StopAsyncIteration):
                break
            if batch.undo is not None:  # a correction (only with --tentative)
                sys.stdout.write(json.dumps({"_undo": batch.undo}) + "\n")
                sys.stdout.flush()
                continue
            rows = batch.rows()
            if args.limit is not None:
                rows = rows[: args.limit - seen]
            seen += len(rows)
            if args.tentative:
                rows = [{**row, "_status": batch.status} for row in rows]
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
        status = (await client.status()).to_wire()
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
    p.add_argument("file", help="the schema: Medusa XML <schema> or JSON (README: Schemas)")
    p.set_defaults(run=cmd_schema_create)

    stream = sub.add_parser("stream", help="streams").add_subparsers(dest="sub", required=True)
    p = add_client_options(stream.add_parser("create", help="create a stream"))
    p.add_argument("name", help="the stream's name (plain or a URI)")
    p.add_argument("--schema", required=True, help="the name of an existing schema")
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="how many peers hold the stream (default: the peer's --replicas, 3)",
    )
    p.set_defaults(run=cmd_stream_create)

    query = sub.add_parser("query", help="queries").add_subparsers(dest="sub", required=True)
    p = add_client_options(
        query.add_parser("submit", help="submit SQL (FILE.sql), Medusa/Borealis XML or JSON")
    )
    p.add_argument(
        "file",
        help="the query: a SQL script (docs/sql.md), Medusa or Borealis XML (a whole "
        "<borealis> document too) or JSON",
    )
    p.add_argument("--start", action="store_true", help="start the query once it is submitted")
    p.add_argument(
        "--deploy",
        metavar="FILE",
        help="a Borealis deploy file: <node endpoint=HOST:PORT query=NAME/> places that "
        "query's boxes on the peer at that address",
    )
    p.set_defaults(run=cmd_query_submit)
    p = query.add_parser(
        "explain", help="print the boxes, fragments and peers a query file would use"
    )
    p.add_argument("file", help="a SQL script, XML or JSON query (as for submit)")
    p.set_defaults(run=cmd_query_explain)
    for verb, status in (("start", "RUNNING"), ("stop", "STOPPED"), ("delete", "DELETED")):
        p = add_client_options(query.add_parser(verb, help=f"set a query {status}"))
        p.add_argument("name", help="the query's name")
        p.set_defaults(run=status_cmd(status))

    p = add_client_options(
        sub.add_parser("push", help="push tuples (one per line); exit 0 once acked")
    )
    p.add_argument("stream", help="the stream to push to")
    p.add_argument(
        "file", nargs="?", default="-", help="the tuples, one per line ('-': standard input)"
    )
    p.add_argument(
        "--format",
        choices=("jsonl", "csv"),
        default="jsonl",
        help="jsonl: one JSON object per line; csv: a header line of field names, then one "
        "tuple per line (an empty value is NULL)",
    )
    p.add_argument(
        "--time-unit",
        choices=("s", "ms", "us"),
        default="s",
        help="the unit of numeric timestamps since the Unix epoch (ISO-8601 strings are "
        "always read as such)",
    )
    p.add_argument("--batch-size", type=int, default=10_000, help="tuples per chunk")
    p.add_argument(
        "--producer",
        metavar="ID",
        help="the event id's producer (default: a fresh cli:<16 hex> per run); give a failed "
        "run's to push the rest of the same input (same --batch-size) without duplicates",
    )
    p.add_argument(
        "--retry-timeout",
        type=float,
        default=DEFAULT_RETRY_TIMEOUT_S,
        metavar="S",
        help="retry a chunk refused with a retriable error (or whose connection was lost, "
        "on the next --peer) for up to S seconds (0: no retries)",
    )
    p.set_defaults(run=cmd_push)

    p = add_client_options(sub.add_parser("subscribe", help="print a stream's tuples as JSONL"))
    p.add_argument("stream", help="the stream to print")
    p.add_argument("--limit", type=int, help="stop after N tuples (default: never)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="stop once no tuple came for S seconds (default: wait for ever)",
    )
    p.add_argument(
        "--start",
        choices=("latest", "earliest"),
        default="latest",
        help="latest: tuples pushed from now on; earliest: the stream from its first kept tuple",
    )
    p.add_argument(
        "--tentative",
        action="store_true",
        help='also results computed while an input was missing: each tuple gets "_status" '
        '("tentative" or "stable"), and a correction prints {"_undo": OFFSET}, which takes '
        "back every tentative tuple printed since the previous undo (default: stable only)",
    )
    p.set_defaults(run=cmd_subscribe)

    p = add_client_options(sub.add_parser("lookup", help="describe a schema, stream or query"))
    p.add_argument("name", help="a schema, stream, query, participant or peer name")
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON (the only form: the flag is accepted for scripts that ask for it)",
    )
    p.set_defaults(run=cmd_lookup)

    p = add_client_options(sub.add_parser("status", help="what the peer runs"))
    p.add_argument("--json", action="store_true", help="print the whole status as JSON")
    p.set_defaults(run=cmd_status)


async def cmd_query_explain(args: argparse.Namespace) -> int:
    """``peer query explain`` (:mod:`peer.cli.explain`, imported when run: the SQL compiler
    loads sqlglot, which every other command, ``peer join`` first, does without)."""
    from peer.cli.explain import cmd_query_explain as explain

    return await explain(args)
