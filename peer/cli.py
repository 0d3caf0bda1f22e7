"""The ``peer`` command (DESIGN.md section 8: the synopsis there is a contract).

Only this module installs logging handlers and chooses uvloop. Every failure prints one line a
person can act on and exits non-zero: 1 for a refused request, 2 for usage or an unreachable
peer, 3 for a missing Java.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from peer.errors import FedstreamError, JavaMissing, Unavailable

DEFAULT_PEER = "127.0.0.1:7700"
log = logging.getLogger("peer")


class UsageError(Exception):
    pass


def parse_addr(text: str, *, what: str = "address") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"{what} {text!r} must be HOST:PORT, e.g. 127.0.0.1:7700")
    return host.strip("[]"), int(port)


def _peer_addr(args: argparse.Namespace) -> tuple[str, int]:
    return parse_addr(args.peer or os.environ.get("PEER_ADDR") or DEFAULT_PEER, what="--peer")


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def _client_tls(args: argparse.Namespace) -> dict[str, Any]:
    """--participant, --key, --trust (else $PEER_PARTICIPANT, $PEER_KEY, $PEER_TRUST) as
    Client arguments: with a participant key the client speaks TLS."""
    participant = args.participant or os.environ.get("PEER_PARTICIPANT") or None
    key = args.key or os.environ.get("PEER_KEY") or None
    trust = args.trust or os.environ.get("PEER_TRUST") or None
    if (participant is None) != (key is None):
        raise UsageError(
            "--participant and --key go together (the key is that participant's; "
            "or set both PEER_PARTICIPANT and PEER_KEY)"
        )
    if trust is not None and key is None:
        raise UsageError("--trust is for TLS: give --participant and --key too")
    return {
        "participant": participant,
        "key_path": Path(key) if key else None,
        "trust_dir": Path(trust) if trust else None,
    }


async def _with_client(args: argparse.Namespace, fn: Callable[[Any], Awaitable[int]]) -> int:
    from peer.client import Client

    host, port = _peer_addr(args)
    try:
        client = Client(host, port, timeout_s=args.timeout, **_client_tls(args))
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


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


# commands talking to a peer
async def cmd_schema_create(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text()

    async def go(client: Any) -> int:
        _print_json(await client.create_schema(text))
        return 0

    return await _with_client(args, go)


async def cmd_stream_create(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        _print_json(await client.create_stream(args.name, args.schema))
        return 0

    return await _with_client(args, go)


async def cmd_query_submit(args: argparse.Namespace) -> int:
    text = Path(args.file).read_text()

    async def go(client: Any) -> int:
        result = await client.create_query(text)
        if args.start:
            result = {**result, **(await client.start_query(result["query"]))}
        _print_json(result)
        return 0

    return await _with_client(args, go)


def _status_cmd(status: str) -> Callable[[argparse.Namespace], Coroutine[Any, Any, int]]:
    async def cmd(args: argparse.Namespace) -> int:
        async def go(client: Any) -> int:
            _print_json(await client.set_query_status(args.name, status))
            return 0

        return await _with_client(args, go)

    return cmd


async def cmd_push(args: argparse.Namespace) -> int:
    from peer.ingest import chunks, read_columns
    from peer.model.schema import parse_schema

    source = sys.stdin if args.file in (None, "-") else Path(args.file).open()  # noqa: SIM115
    with source:
        text = source.read().splitlines()

    async def go(client: Any) -> int:
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

    return await _with_client(args, go)


async def cmd_subscribe(args: argparse.Namespace) -> int:
    from peer.ingest import to_jsonl
    from peer.model.schema import parse_schema

    async def go(client: Any) -> int:
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

    return await _with_client(args, go)


async def cmd_lookup(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        _print_json(await client.lookup_object(args.name))
        return 0

    return await _with_client(args, go)


async def cmd_status(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        status = await client.status()
        if args.json:
            _print_json(status)
            return 0
        from rich.console import Console
        from rich.table import Table

        console = Console()
        console.print(
            f"peer {status['peer']}  engine={status['engine']}  "
            f"uptime={status['uptime_s']}s  data={status['data_dir']}"
        )
        table = Table("query", "status", "batches", "rows out", "error")
        for q in status["queries"]:
            table.add_row(
                q["name"],
                q["status"],
                str(q.get("batches", "")),
                str(q.get("rows_out", "")),
                q.get("error", ""),
            )
        console.print(table)
        streams = Table("stream", "latest offset")
        for s in status["streams"]:
            streams.add_row(s["name"], str(s["latest_offset"]))
        console.print(streams)
        overlay = status.get("overlay")
        if overlay:
            console.print(
                f"node {overlay['node_id'][:16]}  participant={overlay['participant']}  "
                f"overlay={overlay['overlay']}  dht contacts={overlay['dht'].get('contacts')}"
            )
            members = Table("node", "participant", "state", "api", "engine", "load")
            for m in overlay["members"]:
                load = ", ".join(f"{k}={v:g}" for k, v in sorted(m["load"].items()))
                members.add_row(
                    m["node_id"][:16] + (" (this peer)" if m["self"] else ""),
                    m["participant"],
                    m["state"],
                    m["api"],
                    "spark" if m["engine"] else "none",
                    load,
                )
            console.print(members)
        brain = status.get("brain")
        if brain:
            from datetime import datetime

            util, load = brain.get("utilisation"), brain.get("load")
            measured = (
                "not measured yet"
                if util is None
                else f"utilisation={util:.0%}  load={load:.2f} cores"
            )
            offering = brain.get("offer_in_flight")
            console.print(
                f"brain: {measured}  capacity={brain['capacity']:g} cores"
                + (f"  offering to {offering}" if offering else "")
            )
            contracts = Table("contract", "partner", "price", "partner takes", "valid")
            for c in brain.get("contracts", []):
                contracts.add_row(
                    c["id"][:8],
                    c["partner"],
                    f"{c['price']:g}",
                    ", ".join(c.get("kinds", [])),
                    "yes" if c.get("valid", True) else "no",
                )
            console.print(contracts)
            for r in brain.get("refused_contracts", []):
                console.print(f"contract file {r['file']} refused: {r['message']}")
            ledger = Table("time", "dir", "fragment", "partner")
            for column in ("contract", "load", "price", "duration", "pause"):
                ledger.add_column(column, no_wrap=True)
            for e in brain.get("ledger", []):
                when = datetime.fromtimestamp(e["t"]).strftime("%m-%d %H:%M")
                duration, pause = e.get("duration_s"), e.get("pause_s")
                ledger.add_row(
                    when,
                    e["direction"],
                    e["fragment"],
                    e.get("partner") or "",
                    (e.get("contract") or "")[:8],
                    f"{e.get('load', 0):.3g}",
                    f"{e.get('price', 0):g}",
                    "" if duration is None else f"{duration:.0f}s",
                    "" if pause is None else f"{pause:.2f}s",
                    style=None if e.get("ok") else "red",
                )
            console.print(ledger)
        return 0

    return await _with_client(args, go)


# local commands
async def cmd_join(args: argparse.Namespace) -> int:
    from peer.node import Peer, PeerConfig

    host, port = parse_addr(args.listen, what="--listen")
    overlay_host: str | None = None
    overlay_port: int | None = None
    if args.overlay:
        overlay_host, overlay_port = parse_addr(args.overlay, what="--overlay")
    bootstrap = [parse_addr(b, what="--bootstrap") for b in args.bootstrap]
    if (args.key is None) != (args.participant is None):
        raise UsageError("--participant and --key go together (the key is that participant's)")
    if not args.no_engine:
        from peer.engine.java import find_java

        find_java()
    config = PeerConfig(
        data_dir=Path(args.data_dir),
        host=host,
        port=port,
        engine=not args.no_engine,
        fuse_stateless=not args.no_lane,
        spark_master=args.spark_master,
        overlay_host=overlay_host,
        overlay_port=overlay_port,
        bootstrap=bootstrap,
        participant=args.participant,
        key_path=Path(args.key) if args.key else None,
        trust_dir=Path(args.trust) if args.trust else None,
        gossip_interval_s=args.gossip_interval,
        suspect_after_s=args.suspect_after,
        dead_after_s=args.dead_after,
        max_backlog_batches=args.max_backlog,
        backlog_wait_s=args.backlog_wait,
        contracts_dir=Path(args.contracts) if args.contracts else None,
        capacity=args.capacity,
        bpm_period_s=args.bpm_period,
        offer_margin=args.offer_margin,
        accept_margin=args.accept_margin,
    )
    node = Peer(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, node.stop)
    try:
        await node.start()
    except BaseException as exc:
        await node.close()
        from overlay.identity import IdentityError
        from overlay.node import OverlayError

        if isinstance(exc, OverlayError):
            raise Unavailable(f"cannot join the overlay: {exc}") from exc
        if isinstance(exc, IdentityError):
            raise UsageError(f"identity: {exc}") from exc
        from contracts.contract import ContractError

        if isinstance(exc, ContractError):
            raise UsageError(f"--contracts: {exc}") from exc
        raise
    address: dict[str, Any] = {"host": host, "port": node.port, "pid": os.getpid()}
    if node.overlay is not None:
        address["overlay_port"] = node.overlay.port
        address["node_id"] = node.overlay.node_id.hex()
        address["participant"] = node.overlay.identity.participant
    marker = config.data_dir / "peer.json"
    marker.with_suffix(".tmp").write_text(json.dumps(address))
    marker.with_suffix(".tmp").replace(marker)  # readers never see half a file
    print(f"peer ready on {host}:{node.port} (data {config.data_dir}); Ctrl-C to leave", flush=True)
    await node.run()
    with contextlib.suppress(OSError):
        (config.data_dir / "peer.json").unlink()
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from contracts.keys import generate

    key, pub = generate(args.name, Path(args.dir))
    print(json.dumps({"private_key": str(key), "public_key": str(pub)}))
    return 0


# -- peer contract (DESIGN.md section 7; the file format is docs/contracts.md) -----------------


def _box_kinds(text: str, option: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds:
        raise UsageError(f"{option} needs box types, e.g. filter,map or any")
    return kinds


def _contract_key(name: str, given: str | None, keys_dir: str, option: str) -> bytes:
    from contracts.keys import check_name, load_public
    from overlay.identity import raw_public

    path = Path(given) if given else Path(keys_dir) / f"{check_name(name)}.pub"
    if not given and not path.exists():
        raise ValueError(
            f"no public key for {name}: no {path}; give {option} FILE.pub or --keys DIR"
        )
    return raw_public(load_public(path))


def cmd_contract_create(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from contracts import contract as ct

    if args.price is None and args.min_price is None and args.max_price is None:
        raise UsageError("give --price P, or --min-price P1 --max-price P2 (or all three)")
    if (args.min_price is None) != (args.max_price is None):
        raise UsageError("--min-price and --max-price come together")
    start = None
    if args.start:
        try:
            start = datetime.fromisoformat(args.start)
        except ValueError as exc:
            raise UsageError(f"--start {args.start!r}: not an RFC 3339 time") from exc
        if start.utcoffset() is None:
            raise UsageError(f"--start {args.start!r} needs a time zone, e.g. Z")
        start = start.astimezone(UTC)
    out = Path(args.out)
    if out.exists():
        raise ValueError(f"{out} already exists; refusing to overwrite a contract")
    tasks = _box_kinds(args.tasks, "--tasks")
    contract = ct.create(
        args.from_,
        _contract_key(args.from_, args.from_key, args.keys, "--from-key"),
        args.to,
        _contract_key(args.to, args.to_key, args.keys, "--to-key"),
        price=args.price,
        min_price=args.min_price,
        max_price=args.max_price,
        a_accepts=_box_kinds(args.from_tasks, "--from-tasks") if args.from_tasks else tasks,
        b_accepts=_box_kinds(args.to_tasks, "--to-tasks") if args.to_tasks else tasks,
        not_before=start,
        days=args.days,
        contract_id=args.id,
    )
    ct.dump(contract, out)
    print(
        f"wrote unsigned contract {contract.id} between {args.from_} and {args.to} to {out}; "
        f"each signs it with `peer contract sign {out} --key NAME.key`"
    )
    return 0


def cmd_contract_sign(args: argparse.Namespace) -> int:
    from contracts import contract as ct
    from contracts.keys import load_private

    path = Path(args.file)
    signed = ct.sign(ct.load(path), load_private(Path(args.key)))
    ct.dump(signed, path)
    done = [p.name for p in signed.parties if p.signature is not None]
    todo = [p.name for p in signed.parties if p.signature is None]
    then = f"{' and '.join(todo)} must sign it too" if todo else "signed by both parties"
    print(f"{signed.label}: signed by {' and '.join(done)}; {then}")
    return 0


def _export_contract(contract: Any, directory: Path) -> None:
    """canonical.bin, NAME.sig and NAME.pub (PEM): the openssl check of docs/contracts.md."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from contracts import contract as ct

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "canonical.bin").write_bytes(ct.canonical_bytes(contract))
    for p in contract.parties:
        pem = Ed25519PublicKey.from_public_bytes(p.public_key).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        pub = directory / f"{p.name}.pub"
        if pub.exists() and pub.read_bytes() != pem:
            raise ValueError(f"{pub} holds another key than the contract's key for {p.name}")
        pub.write_bytes(pem)
        if p.signature is not None:
            (directory / f"{p.name}.sig").write_bytes(p.signature)


def cmd_contract_verify(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from contracts import contract as ct
    from contracts.keys import load_public
    from overlay.identity import raw_public

    contract = ct.load(Path(args.file))
    if args.export:
        _export_contract(contract, Path(args.export))
    known = {}
    if args.trust:
        for name in contract.names:
            pub = Path(args.trust) / f"{name}.pub"
            if pub.exists():
                known[name] = raw_public(load_public(pub))
    ct.verify(contract, datetime.now(UTC), known_keys=known)
    (a, b), (low, high) = contract.parties, ct.price_range(contract)
    price = f"{low:g}" if low == high else f"{low:g} to {high:g}"
    start, end = ct.format_time(contract.not_before), ct.format_time(contract.not_after)
    print(f"{contract.label}: valid, signed by {a.name} and {b.name}")
    print(f"  price {price} per unit of load; valid from {start} to {end}")
    print(f"  {a.name} accepts from {b.name}: {', '.join(a.accepts)}")
    print(f"  {b.name} accepts from {a.name}: {', '.join(b.accepts)}")
    return 0


def _add_contract_parser(sub: Any) -> None:
    contract = sub.add_parser("contract", help="pairwise contracts between participants")
    verbs = contract.add_subparsers(dest="sub", required=True)
    p = verbs.add_parser("create", help="write an unsigned contract between two participants")
    p.add_argument("--from", dest="from_", required=True, metavar="A", help="participant A")
    p.add_argument("--to", required=True, metavar="B", help="participant B")
    p.add_argument("--price", type=float, help="fixed (or nominal) price per unit of load")
    p.add_argument("--min-price", type=float, help="lowest price of a range (with --max-price)")
    p.add_argument("--max-price", type=float, help="highest price of a range")
    p.add_argument(
        "--tasks",
        default="any",
        metavar="KIND,...",
        help="box types each party accepts from the other: filter, map, union, aggregate, "
        "join, bsort, or any (default any)",
    )
    p.add_argument("--from-tasks", metavar="KIND,...", help="what A accepts, if not --tasks")
    p.add_argument("--to-tasks", metavar="KIND,...", help="what B accepts, if not --tasks")
    p.add_argument("--days", type=float, default=30.0, help="validity in days (default 30)")
    p.add_argument("--start", metavar="TIME", help="RFC 3339 start of validity (default now)")
    p.add_argument("--id", help="contract id (default: 32 random hex digits)")
    p.add_argument("--from-key", metavar="FILE.pub", help="A's public key (default DIR/A.pub)")
    p.add_argument("--to-key", metavar="FILE.pub", help="B's public key (default DIR/B.pub)")
    p.add_argument("--keys", default=".", metavar="DIR", help="where NAME.pub files are")
    p.add_argument("--out", required=True, metavar="FILE")
    p.set_defaults(sync=cmd_contract_create)
    p = verbs.add_parser("sign", help="add your signature to a contract file")
    p.add_argument("file")
    p.add_argument("--key", required=True, metavar="KEYFILE", help="your private key (NAME.key)")
    p.set_defaults(sync=cmd_contract_sign)
    p = verbs.add_parser("verify", help="exit 0 only if valid now and signed by both parties")
    p.add_argument("file")
    p.add_argument(
        "--trust",
        metavar="DIR",
        help="public keys (NAME.pub) the parties' keys in the contract must match",
    )
    p.add_argument(
        "--export",
        metavar="DIR",
        help="write canonical.bin, NAME.sig and NAME.pub there, for `openssl pkeyutl -verify`",
    )
    p.set_defaults(sync=cmd_contract_verify)


def cmd_doctor(args: argparse.Namespace) -> int:
    from peer.doctor import run_doctor

    return run_doctor(data_dir=Path(args.data_dir), listen=args.listen, spark=not args.quick)


def cmd_demo(args: argparse.Namespace) -> int:
    from peer.demo import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="peer", description="fedstream peer")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def client_cmd(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--peer", help=f"HOST:PORT of a peer (default $PEER_ADDR or {DEFAULT_PEER})")
        p.add_argument("--timeout", type=float, default=60.0, help="request timeout, seconds")
        p.add_argument(
            "--participant",
            help="connect with TLS as this participant (with --key), as a peer whose API port "
            "is not on loopback requires (default $PEER_PARTICIPANT)",
        )
        p.add_argument("--key", help="the participant's private key file (default $PEER_KEY)")
        p.add_argument(
            "--trust",
            metavar="DIR",
            help="public keys (NAME.pub) of participants whose peers to accept, besides your "
            "own (default $PEER_TRUST)",
        )
        return p

    p = sub.add_parser("keygen", help="make a participant key pair")
    p.add_argument("name")
    p.add_argument("--dir", default=".")
    p.set_defaults(sync=cmd_keygen)
    _add_contract_parser(sub)

    p = sub.add_parser("join", help="run a peer until SIGINT/SIGTERM")
    p.add_argument("--data-dir", default="./peer-data")
    p.add_argument("--participant", help="participant name (with --key)")
    p.add_argument("--key", help="the participant's private key file (from `peer keygen`)")
    p.add_argument("--listen", default="127.0.0.1:7700", help="client API address")
    p.add_argument(
        "--overlay",
        help="overlay address: UDP (DHT) and TCP (peer links) on one port "
        "(default: the --listen host, its port + 1)",
    )
    p.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="overlay address of a peer to join through (repeat: tried in turn)",
    )
    p.add_argument("--http")
    p.add_argument(
        "--contracts",
        metavar="DIR",
        help="directory of signed contract files (*.toml): partners this peer shares load with",
    )
    p.add_argument(
        "--capacity",
        type=float,
        metavar="CORES",
        help="CPU cores this peer's load is measured against (default: all of them)",
    )
    p.add_argument("--bpm-period", type=float, default=5.0, help="seconds between load checks")
    p.add_argument("--offer-margin", type=float, default=0.05, help="offer above price*(1+margin)")
    p.add_argument(
        "--accept-margin", type=float, default=0.05, help="accept below price*(1-margin)"
    )
    p.add_argument("--trust", help="directory of trusted participants' public keys (NAME.pub)")
    p.add_argument("--gossip-interval", type=float, default=1.0, help="seconds")
    p.add_argument("--suspect-after", type=float, default=3.0, help="seconds of silence")
    p.add_argument("--dead-after", type=float, default=8.0, help="seconds of silence")
    p.add_argument(
        "--max-backlog",
        type=int,
        default=1000,
        metavar="BATCHES",
        help="backpressure: batches a stream may hold that its slowest reader has not taken",
    )
    p.add_argument(
        "--backlog-wait",
        type=float,
        default=30.0,
        metavar="S",
        help="how long a push waits for room before a retriable refusal",
    )
    p.add_argument("--spark-master", default="local[*]")
    p.add_argument("--no-engine", action="store_true", help="serve without Spark")
    p.add_argument(
        "--no-lane",
        action="store_true",
        help="run every query as its own Spark streaming query (no shared stateless lane)",
    )
    p.set_defaults(run=cmd_join)

    schema = sub.add_parser("schema", help="schemas").add_subparsers(dest="sub", required=True)
    p = client_cmd(schema.add_parser("create", help="create a schema from Medusa XML or JSON"))
    p.add_argument("file")
    p.set_defaults(run=cmd_schema_create)

    stream = sub.add_parser("stream", help="streams").add_subparsers(dest="sub", required=True)
    p = client_cmd(stream.add_parser("create", help="create a stream"))
    p.add_argument("name")
    p.add_argument("--schema", required=True)
    p.set_defaults(run=cmd_stream_create)

    query = sub.add_parser("query", help="queries").add_subparsers(dest="sub", required=True)
    p = client_cmd(query.add_parser("submit", help="submit Medusa/Borealis XML or JSON"))
    p.add_argument("file")
    p.add_argument("--start", action="store_true")
    p.set_defaults(run=cmd_query_submit)
    for verb, status in (("start", "RUNNING"), ("stop", "STOPPED"), ("delete", "DELETED")):
        p = client_cmd(query.add_parser(verb, help=f"set a query {status}"))
        p.add_argument("name")
        p.set_defaults(run=_status_cmd(status))

    p = client_cmd(sub.add_parser("push", help="push tuples (one per line); exit 0 once acked"))
    p.add_argument("stream")
    p.add_argument("file", nargs="?", default="-")
    p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    p.add_argument("--batch-size", type=int, default=10_000)
    p.set_defaults(run=cmd_push)

    p = client_cmd(sub.add_parser("subscribe", help="print a stream's tuples as JSONL"))
    p.add_argument("stream")
    p.add_argument("--limit", type=int)
    p.add_argument("--idle-timeout", type=float, default=None)
    p.add_argument("--start", choices=("latest", "earliest"), default="latest")
    p.set_defaults(run=cmd_subscribe)

    p = client_cmd(sub.add_parser("lookup", help="describe a schema, stream or query"))
    p.add_argument("name")
    p.set_defaults(run=cmd_lookup)

    p = client_cmd(sub.add_parser("status", help="what the peer runs"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("doctor", help="check Java, Spark, data directory and ports")
    p.add_argument("--data-dir", default="./peer-data")
    p.add_argument("--listen", default="127.0.0.1:7700")
    p.add_argument("--quick", action="store_true", help="skip the Spark start-up check")
    p.set_defaults(sync=cmd_doctor)

    from peer.demo import add_arguments as add_demo_arguments

    p = sub.add_parser(
        "demo", help="run a local federation of peers on an example query and check its output"
    )
    add_demo_arguments(p)
    p.set_defaults(sync=cmd_demo)
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
