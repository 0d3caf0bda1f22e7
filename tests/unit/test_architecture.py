"""The architecture is kept, not just drawn (docs/architecture.md): the layer rules of
pyproject.toml's ``[tool.importlinter]`` hold (no import cycle, TYPE_CHECKING imports
counted; arrows point one way), and no product module outgrows one idea."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("peer", "overlay", "contracts")
MAX_LINES = 600


def test_the_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' (scripts/env.sh does)")
    done = subprocess.run(
        [lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_product_module_is_over_600_lines() -> None:
    big = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert big == {}
