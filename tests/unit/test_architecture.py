"""The architecture is kept, not just drawn (docs/architecture.md): the layer rules of
pyproject.toml's ``[tool.importlinter]`` hold (no import cycle, TYPE_CHECKING imports
counted; arrows point one way; only the composition root builds the replication room). Module
size is not counted here: a module holds one idea, whatever its length (the style guide's
anchors)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' (scripts/env.sh does)")
    done = subprocess.run(
        [lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
