"""ruff, configured in pyproject.toml ([tool.ruff]), finds nothing in the tree: no undefined or unused name, no
unused import, no syntax error in the packages, tests or tools."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).is_file():
        pytest.skip("ruff is not installed (the dev extra brings it)")
    p = subprocess.run([ruff, "check", "--no-cache", "journal", "training", "ladder", "src", "tests", "tools"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
