"""ruff, configured in pyproject.toml ([tool.ruff]), finds nothing in the tree: no undefined or unused name, no
unused import, no syntax error in the packages, tests or tools. mypy ([tool.mypy]) finds nothing in the format
core (journal/*.py), through tools/typecheck.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tool_modules import load_tool

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).is_file():
        pytest.skip("ruff is not installed (the dev extra brings it)")
    p = subprocess.run([ruff, "check", "--no-cache", "journal", "training", "ladder", "src", "tests", "tools"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_mypy_finds_nothing_in_the_format_core():
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra brings it)")
    typecheck = load_tool("typecheck")
    code, out = typecheck.run()
    assert code == 0 and "Success: no issues found" in out, out[-4000:]
    assert len(typecheck.core_modules()) >= 20  # every file of the core, not a few
