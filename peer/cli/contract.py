"""``peer keygen`` and ``peer contract create|sign|verify``: identities and contracts on disk.

A participant's identity is an Ed25519 key pair (``NAME.key``, ``NAME.pub``). A contract
between two participants (DESIGN.md section 7; the file format is docs/contracts.md) is
created unsigned from both public keys, signed by each party in turn with its private key,
and verified: valid now and signed by both, optionally against the public keys a participant
trusts. ``verify --export`` writes what ``openssl pkeyutl -verify`` needs to check the
signatures without fedstream. These commands need no peer.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from peer.cli.options import UsageError

if TYPE_CHECKING:
    from contracts.contract import Contract


def cmd_keygen(args: argparse.Namespace) -> int:
    from contracts.keys import generate

    key, pub = generate(args.name, Path(args.dir))
    print(json.dumps({"private_key": str(key), "public_key": str(pub)}))
    return 0


def add_keygen_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keygen", help="make a participant key pair")
    p.add_argument("name", help="the participant's name: writes DIR/NAME.key and DIR/NAME.pub")
    p.add_argument("--dir", default=".", help="where to write the key pair")
    p.set_defaults(sync=cmd_keygen)


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


def _export_contract(contract: Contract, directory: Path) -> None:
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


def add_contract_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--out", required=True, metavar="FILE", help="the contract file to write")
    p.set_defaults(sync=cmd_contract_create)
    p = verbs.add_parser("sign", help="add your signature to a contract file")
    p.add_argument("file", help="the contract file (TOML), signed in place")
    p.add_argument("--key", required=True, metavar="KEYFILE", help="your private key (NAME.key)")
    p.set_defaults(sync=cmd_contract_sign)
    p = verbs.add_parser("verify", help="exit 0 only if valid now and signed by both parties")
    p.add_argument("file", help="the contract file (TOML)")
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
