"""Signed golden journals (tools/regen_goldens.py) keep verifying and replaying as they did when written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainledger.journal import load_public_key, verify
from trainledger.journal.kinds import BUILTIN_KINDS

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"
JOURNALS = sorted(GOLDEN.glob("*.jsonl"))


def test_goldens_exist():
    assert [p.name for p in JOURNALS] == ["compute_v1_7.jsonl", "every_kind_v1.jsonl", "every_kind_v1_1.jsonl", "every_kind_v1_10.jsonl",
                                          "every_kind_v1_2.jsonl", "every_kind_v1_3.jsonl", "every_kind_v1_6.jsonl", "every_kind_v1_9.jsonl", "experiment_v1_1.jsonl", "ladder_closed_v1_7.jsonl", "ladder_halt_v1_1.jsonl",
                                          "rank_keys_v1_7.jsonl", "resumed_rewound_v1_1.jsonl", "scaling_ladder_v1_2.jsonl"]


def test_a_format_1_1_journal_is_not_asked_for_device_anomalies():
    """every_kind_v1_1 records throttling starting without the thermal_throttle anomaly that 1.2 derives from it."""
    from trainledger.audit import replay

    p = GOLDEN / "every_kind_v1_1.jsonl"
    rec = replay(p, keys=[load_public_key(p.with_suffix(".pub"))])
    assert rec.ok and "thermal_throttle" not in rec.anomalies_by_kind
    q = GOLDEN / "every_kind_v1_2.jsonl"
    assert replay(q, keys=[load_public_key(q.with_suffix(".pub"))]).anomalies_by_kind["thermal_throttle"] == [25]


@pytest.mark.parametrize("path", JOURNALS, ids=lambda p: p.name)
def test_golden_verifies_and_replays_as_recorded(path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
    from regen_goldens import expectations

    assert expectations(path) == json.loads(path.with_suffix(".expect.json").read_text())


def test_every_builtin_kind_is_in_a_golden():
    """A new kind gets a golden of its own (a new file: old goldens are never rewritten)."""
    seen = set()
    for p in JOURNALS:
        seen |= set(verify(p, keys=[load_public_key(p.with_suffix(".pub"))]).kinds)
    assert set(BUILTIN_KINDS) <= seen, sorted(set(BUILTIN_KINDS) - seen)


def test_a_format_1_0_journal_is_not_asked_for_kinds_that_came_later(tmp_path, signer, pubkey):
    """A lone outlier in a 1.0 journal is not a difference: spike_suspected did not exist when it was written;
    the same journal marked 1.1 must carry it."""
    import msgspec
    from journal_tools import dump, read_lines, rechain, write_lines

    from trainledger.journal import Journal, StepObserved
    from trainledger.audit import replay

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(40):
            j.append(StepObserved(step=i, loss=3.25 if i == 30 else 3.0 + 0.01 * (i % 5)))
    diffs = replay(p, keys=[pubkey]).differences
    assert [d["kind"] for d in diffs] == ["spike_suspected"]  # 1.1: the suspected spike was not recorded
    lines = read_lines(p)
    opened = msgspec.json.decode(lines[0])
    opened["format_version"] = "1.0"
    write_lines(p, rechain([dump(opened)] + lines[1:], resign=signer))
    assert replay(p, keys=[pubkey]).differences == []


def test_the_compute_golden_holds_its_statement_figures():
    """compute_v1_7: the threshold crossed at the step its running total reaches it, the energy counter's fall
    counted as a reset and left out of the measured energy, and the statement of it checked offline."""
    from trainledger.audit import compute_statement
    from trainledger.journal.statements.compute.statement import check_statement

    p = GOLDEN / "compute_v1_7.jsonl"
    key = load_public_key(p.with_suffix(".pub"))
    st = compute_statement([p], [key])
    j = st["runs"][0]["journals"][0]
    fpt = 6 * 1_000_000 + 12 * 2 * 4 * 16 * 64
    assert [(c["name"], c["step"]) for c in j["crossings"]] == [("small", 24)]
    assert j["compute"]["flops"] == 60 * 512 * fpt and j["compute"]["energy_resets"] == 1
    assert j["compute"]["energy_j"] == 4.0 and j["compute"]["hardware"][0]["device_kind"] == "Golden GPU"
    import json

    assert st["findings"] == [] and check_statement(json.dumps(st).encode(), [key]).journals == 1


def test_the_main_jobs_statement_is_what_replay_recomputes():
    """ladder_closed_v1_7, a ladder journal closed as trainledger ladder closes it: every figure of its compute
    statement is replay's own fold of its steps, and verify-proof holds the statement to its proven events."""
    import json

    from trainledger.audit import compute_statement, replay
    from trainledger.journal.statements.compute.statement import check_statement

    p = GOLDEN / "ladder_closed_v1_7.jsonl"
    key = load_public_key(p.with_suffix(".pub"))
    st = compute_statement([p], [key])
    rec = replay(p, keys=[key])
    stated = st["runs"][0]["journals"][0]["compute"]
    assert st["findings"] == [] and rec.ok and rec.compute == stated
    f = st["figures"]
    assert f["model_flops"] == rec.compute["flops"] and f["tokens"] == rec.compute["tokens"]
    assert f["hardware_flops"] == 1e9 * rec.compute["busy_s"] and f["devices"] == 1
    assert not f["thresholds"]["gpai"]["reached"] and f["energy_j"] is None  # no counter on a CPU: not invented
    assert check_statement(json.dumps(st).encode(), [key]).figures == f

