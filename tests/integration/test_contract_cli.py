"""`peer contract create|sign|verify` end to end, and the OpenSSL check of docs/contracts.md."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def peer(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peer.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(cwd: Path, *args: str) -> str:
    done = peer(cwd, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(cwd: Path, *args: str, code: int = 1) -> str:
    done = peer(cwd, *args)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: ")
    return done.stderr


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    for name in ("acme", "mit.edu", "eve"):
        ok(tmp_path, "keygen", name)
    return tmp_path


def create(cwd: Path, out: str = "c.toml", *extra: str) -> Path:
    ok(cwd, "contract", "create", "--from", "acme", "--to", "mit.edu", "--out", out, *extra)
    return cwd / out


def signed(cwd: Path, out: str = "c.toml", *extra: str) -> Path:
    path = create(cwd, out, *extra)
    ok(cwd, "contract", "sign", out, "--key", "acme.key")
    ok(cwd, "contract", "sign", out, "--key", "mit.edu.key")
    return path


def test_create_sign_by_both_verify(keys: Path) -> None:
    path = create(keys, "c.toml", "--min-price", "2", "--max-price", "3.5", "--tasks", "map")
    assert "signed by neither party" in refused(keys, "contract", "verify", "c.toml")
    assert "signed by acme" in ok(keys, "contract", "sign", "c.toml", "--key", "acme.key")
    assert "signed by both" in ok(keys, "contract", "sign", "c.toml", "--key", "mit.edu.key")
    summary = ok(keys, "contract", "verify", str(path))
    assert "valid, signed by acme and mit.edu" in summary
    assert "price 2 to 3.5 per unit of load" in summary
    assert "acme accepts from mit.edu: map" in summary
    ok(keys, "contract", "verify", "c.toml", "--trust", str(keys))


def test_the_synopsis_form_with_all_options(keys: Path) -> None:
    keydir = keys / "pubs"
    keydir.mkdir()
    for name in ("acme", "mit.edu"):
        shutil.copy(keys / f"{name}.pub", keydir)
    ok(
        keys,
        "contract", "create", "--from", "acme", "--to", "mit.edu",
        "--price", "3", "--min-price", "2", "--max-price", "4",
        "--tasks", "filter,map", "--to-tasks", "any", "--days", "7",
        "--keys", str(keydir), "--out", "all.toml",
    )  # fmt: skip
    ok(keys, "contract", "sign", "all.toml", "--key", "acme.key")
    ok(keys, "contract", "sign", "all.toml", "--key", "mit.edu.key")
    summary = ok(keys, "contract", "verify", "all.toml")
    assert "mit.edu accepts from acme: any" in summary
    ok(
        keys,
        "contract", "create", "--from", "acme", "--to", "mit.edu", "--price", "1",
        "--from-key", "acme.pub", "--to-key", "mit.edu.pub", "--keys", "/nonexistent",
        "--out", "explicit.toml",
    )  # fmt: skip


def test_tampered_file_is_refused_naming_why(keys: Path) -> None:
    path = signed(keys, "c.toml", "--price", "2.5")
    path.write_text(path.read_text().replace("price = 2.5", "price = 0.5"))
    why = refused(keys, "contract", "verify", "c.toml")
    assert "altered" in why
    assert "acme" in why and "c.toml" in why


def test_one_signature_only_is_refused(keys: Path) -> None:
    create(keys, "c.toml", "--price", "1")
    ok(keys, "contract", "sign", "c.toml", "--key", "mit.edu.key")
    why = refused(keys, "contract", "verify", "c.toml")
    assert "signed by mit.edu only; acme must sign it" in why


def test_wrong_key_is_refused(keys: Path) -> None:
    create(keys, "c.toml", "--price", "1")
    why = refused(keys, "contract", "sign", "c.toml", "--key", "eve.key")
    assert "wrong key" in why and "neither acme's nor mit.edu's" in why
    # eve writes a contract that puts eve's key under acme's name; acme's real key refuses it
    ok(
        keys,
        "contract", "create", "--from", "acme", "--to", "mit.edu", "--price", "1",
        "--from-key", "eve.pub", "--out", "forged.toml",
    )  # fmt: skip
    ok(keys, "contract", "sign", "forged.toml", "--key", "eve.key")
    ok(keys, "contract", "sign", "forged.toml", "--key", "mit.edu.key")
    why = refused(keys, "contract", "verify", "forged.toml", "--trust", str(keys))
    assert "wrong key: participant acme's key" in why


def test_expired_and_not_yet_valid(keys: Path) -> None:
    signed(keys, "old.toml", "--price", "1", "--start", "2020-01-01T00:00:00Z", "--days", "1")
    assert "expired at 2020-01-02T00:00:00Z" in refused(keys, "contract", "verify", "old.toml")
    signed(keys, "new.toml", "--price", "1", "--start", "2999-01-01T00:00:00+00:00")
    assert "not yet valid" in refused(keys, "contract", "verify", "new.toml")


def test_usage_and_input_errors(keys: Path) -> None:
    base = ("contract", "create", "--from", "acme", "--to", "mit.edu", "--out", "x.toml")
    assert "--price" in refused(keys, *base, code=2)
    assert "come together" in refused(keys, *base, "--min-price", "1", code=2)
    assert "needs a time zone" in refused(
        keys, *base, "--price", "1", "--start", "2026-01-01", code=2
    )
    assert "self-contract" in refused(
        keys, "contract", "create", "--from", "acme", "--to", "acme", "--price", "1",
        "--out", "self.toml",
    )  # fmt: skip
    assert "no public key for bob" in refused(
        keys, "contract", "create", "--from", "acme", "--to", "bob", "--price", "1",
        "--out", "bob.toml",
    )  # fmt: skip
    assert "unknown box types ['sql']" in refused(keys, *base, "--price", "1", "--tasks", "sql")
    assert "from 0 to" in refused(keys, *base, "--price", "-1")
    assert not (keys / "x.toml").exists()
    create(keys, "x.toml", "--price", "1")
    assert "refusing to overwrite" in refused(keys, *base, "--price", "2")
    (keys / "junk.toml").write_text("price = [")
    assert "malformed" in refused(keys, "contract", "verify", "junk.toml")
    assert "usage" in peer(keys, "contract").stderr


def _openssl_command() -> str:
    found = re.search(r"^openssl pkeyutl -verify .*$", DOCS.read_text(), re.M)
    assert found, "docs/contracts.md shows the openssl command"
    return found.group(0)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_openssl_checks_the_signatures_as_documented(keys: Path) -> None:
    command = _openssl_command()
    assert command == (
        "openssl pkeyutl -verify -rawin -pubin -inkey acme.pub -in canonical.bin -sigfile acme.sig"
    )
    signed(keys, "c.toml", "--price", "2.5", "--tasks", "filter,join")
    out = keys / "export"
    ok(keys, "contract", "verify", "c.toml", "--export", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "acme.pub", "acme.sig", "canonical.bin", "mit.edu.pub", "mit.edu.sig",
    ]  # fmt: skip
    assert (out / "acme.pub").read_bytes() == (keys / "acme.pub").read_bytes()

    def openssl(cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            shlex.split(cmd), cwd=out, capture_output=True, text=True, timeout=30, check=False
        )

    for party in ("acme", "mit.edu"):
        done = openssl(command.replace("acme", party))
        assert done.returncode == 0, done.stderr
        assert "Signature Verified Successfully" in done.stdout

    # one party's signature against the other's key fails
    done = openssl(command.replace("acme.sig", "mit.edu.sig"))
    assert done.returncode == 1
    assert "Signature Verification Failure" in done.stdout

    # a tampered copy of the canonical bytes fails
    canonical = (out / "canonical.bin").read_bytes()
    assert canonical.startswith(b"fedstream-contract-v1\n")
    (out / "canonical.bin").write_bytes(canonical.replace(b"price=2.5", b"price=0.5"))
    done = openssl(command)
    assert done.returncode == 1
    assert "Signature Verification Failure" in done.stdout


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_export_of_a_tampered_file_shows_openssl_refusing_it(keys: Path) -> None:
    path = signed(keys, "c.toml", "--price", "2.5")
    path.write_text(path.read_text().replace("price = 2.5", "price = 0.5"))
    out = keys / "export"
    refused(keys, "contract", "verify", "c.toml", "--export", str(out))
    done = subprocess.run(
        shlex.split(_openssl_command()), cwd=out, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "Signature Verification Failure" in done.stdout
