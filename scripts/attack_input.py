"""Re-run issue 12's request-content attacks from outside against two `peer join --no-engine`
processes on loopback (ephemeral ports), and print what each cost the attacked peer.

    PYTHONPATH=. .venv/bin/python scripts/attack_input.py [--work DIR]

For every attack: the answer (or error) the attacker got, the slowest `hello` a concurrent
client got meanwhile (a new connection every 100 ms), the attacked peer's RSS growth, and
whether its partner still sees it alive. Also, outside any request: `peer keygen` with a
newline in the name and through a dangling symlink, and `peer contract verify --trust` of a
contract whose party is named "globex\\n". Everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from contracts import contract as ct
from contracts.keys import generate, load_private
from overlay.identity import raw_public
from peer.client import Client
from peer.errors import FedstreamError
from peer.protocol.api import Push
from peer.testing.cluster import PeerProcess
from peer.testing.hostile import (
    Watch,
    arrow_bomb,
    big_schema,
    long_schema_name,
    reverse_chain_query,
    wide_filter_query,
)

Attack = Callable[[Client], Awaitable[Any]]


async def partner_view(partner: PeerProcess, node_id: str) -> str:
    async with Client("127.0.0.1", partner.port) as client:
        members = (await client.status())["overlay"]["members"]
    return next((m["state"] for m in members if m["node_id"] == node_id), "absent")


async def attack(name: str, target: PeerProcess, partner: PeerProcess, fn: Attack) -> list[str]:
    assert target.proc is not None
    async with (
        Client("127.0.0.1", target.port, timeout_s=120) as client,
        Watch("127.0.0.1", target.port, target.proc.pid) as seen,
    ):
        try:
            answer = f"ok {str(await fn(client))[:70]}"
        except FedstreamError as exc:
            answer = f"{exc.code}: {exc.message[:170]}"
    await asyncio.sleep(1.0)  # a gossip round or so
    view = await partner_view(partner, target.node_id)
    return [
        name,
        answer,
        f"{seen.worst_hello_s * 1000:.0f} ms"
        + (f" ({seen.failures} failed)" if seen.failures else ""),
        f"{seen.rss_growth / 2**20:+.0f} MB",
        view,
    ]


async def network_attacks(a: PeerProcess, b: PeerProcess) -> list[list[str]]:
    async with Client("127.0.0.1", a.port) as client:
        await client.create_schema({"name": "text", "fields": [{"name": "s", "type": "string"}]})
        await client.create_schema({"name": "num", "fields": [{"name": "x", "type": "int"}]})
        await client.create_stream("words", "text", replicas=1)
        await client.create_stream("nums", "num", replicas=1)
        host = (await client.lookup_object("words"))["host"]
    hosting, other = (a, b) if host == a.node_id else (b, a)
    bomb = arrow_bomb()
    rows = []
    for label, target, partner in (
        ("host", hosting, other),
        ("through its partner", other, hosting),
    ):
        rows.append(
            await attack(
                f"{len(bomb) // 1024} KB zstd Arrow push (268 MB inflated), {label}",
                target,
                partner,
                lambda c: c._ask(Push("words", {"arrow": bomb})),
            )
        )
    rows.append(
        await attack(
            "filter box, 1,000 outputs x 3.3 KB expressions, as a map",
            a,
            b,
            lambda c: c.create_query(wide_filter_query("wide", "nums")),
        )
    )
    rows.append(
        await attack(
            "1,000-box chain declared in reverse order",
            b,
            a,
            lambda c: c.create_query(reverse_chain_query("chain", "nums")),
        )
    )
    rows.append(
        await attack(
            "create_schema, DHT key too long", a, b, lambda c: c.create_schema(long_schema_name())
        )
    )
    rows.append(
        await attack("create_schema, record too big", a, b, lambda c: c.create_schema(big_schema()))
    )

    async def left_behind(c: Client) -> Any:
        return await c.create_stream("after_refusal", "big")

    rows.append(await attack("... then a stream on that schema", a, b, left_behind))
    return rows


def cli(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "peer.cli", *args], capture_output=True, text=True, timeout=60
    )
    return done.returncode, (done.stderr or done.stdout).strip().splitlines()[-1][:110]


def offline_attacks(work: Path) -> list[list[str]]:
    rows = []
    code, said = cli("keygen", "nl\n", "--dir", str(work / "k1"))
    rows.append(["peer keygen $'nl\\n'", f"exit {code}: {said}", "", "", ""])
    (work / "k2").mkdir()
    (work / "k2" / "acme.key").symlink_to(work / "k2" / "elsewhere.key")
    code, said = cli("keygen", "acme", "--dir", str(work / "k2"))
    written = (work / "k2" / "elsewhere.key").exists()
    said = f"exit {code}: {said}; target written: {written}"
    rows.append(["peer keygen through a dangling symlink", said, "", "", ""])
    keys = {n: generate(n, work / "k3")[0] for n in ("acme", "globex", "mallory")}
    priv = {n: load_private(p) for n, p in keys.items()}
    made = ct.create(
        "acme",
        raw_public(priv["acme"].public_key()),
        "globex",
        raw_public(priv["mallory"].public_key()),
        price=1.0,
    )
    text = ct.dumps(ct.sign(ct.sign(made, priv["acme"]), priv["mallory"]))
    path = work / "forged.toml"
    path.write_text(text.replace('name = "globex"', 'name = "globex\\n"'))
    trust = work / "offline-trust"
    trust.mkdir(exist_ok=True)
    for n in ("acme", "globex"):
        shutil.copy(work / "k3" / f"{n}.pub", trust)
    code, said = cli("contract", "verify", str(path), "--trust", str(trust))
    rows.append(['contract party "globex\\n", verify --trust', f"exit {code}: {said}", "", "", ""])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="where the peers keep their data (default: temp)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="attack-input-"))
    trust = work / "trust"
    trust.mkdir(parents=True, exist_ok=True)
    keys = {}
    for name in ("acme", "globex"):
        key, pub = generate(name, work / "keys", overwrite=True)
        shutil.copy(pub, trust)
        keys[name] = key
    common = ("--no-engine", "--trust", str(trust), "--http", "off")
    a = PeerProcess(work / "a", "--participant", "acme", "--key", str(keys["acme"]), *common)
    b = PeerProcess(work / "b", "--participant", "globex", "--key", str(keys["globex"]), *common)
    try:
        a.start()
        b.extra = (*b.extra, "--bootstrap", a.overlay_addr)
        b.start()
        rows = asyncio.run(network_attacks(a, b))
    finally:
        b.stop(30)
        a.stop(30)
    rows += offline_attacks(work)
    print("| attack | answer | slowest concurrent hello | RSS growth | partner's view |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
