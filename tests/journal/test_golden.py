"""Signed golden journals (tools/regen_goldens.py) keep verifying and replaying as they did when written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainledger.journal import load_public_key, verify
from trainledger.journal.kinds import BUILTIN_KINDS

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "golden"
JOURNALS = sorted(GOLDEN.glob("*.jsonl"))


def test_goldens_exist():
    assert [p.name for p in JOURNALS] == ["every_kind_v1.jsonl"]


@pytest.mark.parametrize("path", JOURNALS, ids=lambda p: p.name)
def test_golden_verifies_and_replays_as_recorded(path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from regen_goldens import expectations

    assert expectations(path) == json.loads(path.with_suffix(".expect.json").read_text())


def test_every_builtin_kind_is_in_a_golden():
    """A new kind gets a golden of its own (a new file: old goldens are never rewritten)."""
    seen = set()
    for p in JOURNALS:
        seen |= set(verify(p, keys=[load_public_key(p.with_suffix(".pub"))]).kinds)
    assert set(BUILTIN_KINDS) <= seen, sorted(set(BUILTIN_KINDS) - seen)
