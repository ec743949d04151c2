"""The reference model's loss curve against its golden (torchtitan keeps loss curves the same way).

Tests that compare two runs of the reference loop (a resume against an uninterrupted control, a rewind against a
clean run) cannot see a change that moves both: a new initialisation, another data order, a changed optimizer
default. This one holds a fresh run to the curve recorded in ``tests/assets/golden/reference_losses.json``;
``tools/regen_goldens.py --loss-curve`` rewrites it, and the diff is what a reviewer reads.
"""

from __future__ import annotations

import json
import math

import pytest
from tool_modules import load_tool

torch = pytest.importorskip("torch")
regen_goldens = load_tool("regen_goldens")


def test_the_reference_loss_curve_matches_its_golden():
    want = json.loads(regen_goldens.LOSS_CURVE.read_text())
    if want["torch"] != torch.__version__:
        pytest.skip(f"the curve was recorded with torch {want['torch']}; this is {torch.__version__}")
    got = regen_goldens.reference_losses()
    assert got["config"] == want["config"], "the reference loop's defaults changed: regenerate and review the curve"
    assert len(got["losses"]) == len(want["losses"]) == want["config"]["steps"]
    moved = [(step, a, b) for step, (a, b) in enumerate(zip(got["losses"], want["losses"]))
             if not math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)]
    assert moved == [], f"the reference loss curve moved at {len(moved)} steps, first {moved[:3]}"
    assert got["losses"][-1] < got["losses"][0] - 0.2  # and it still learns
