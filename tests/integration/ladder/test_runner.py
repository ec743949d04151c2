"""The ladder end to end: the seed document's ladders, decisions, projection, and tamper evidence."""

from __future__ import annotations

import json

import pytest
from journal_tools import read_lines, write_lines
from test_rung_pieces import seed_rungs

from trainledger.ladder.presets import tiny

from trainledger.journal import IntegrityError, Journal, read_events, verify
from trainledger.ladder import Rung
from trainledger.ladder.runner import LadderProjection, run_pilot_ladder


@pytest.fixture
def ladder_journal(tmp_path, signer):
    j = Journal.create(tmp_path / "ladder.jsonl", signer=signer)
    return j


def test_three_rung_ladder_passes_with_receipts(tmp_path, signer, ladder_journal):
    result = run_pilot_ladder(seed_rungs(), peak_flops_per_sec=1.0e9, journal=ladder_journal, work_dir=tmp_path)
    ladder_journal.close()
    assert result.halted_at is None
    assert result.passed_rungs() == ["rung_i_shakeout", "rung_ii_bakeoff", "rung_iii_context"]
    assert result.decisions == 3
    bake = result.outcomes[1].artifacts
    assert bake["F9_mup_transfer"] == {"base_lr": 0.05, "base_width": 8, "target_width": 8, "transferred_lr": 0.05}
    assert bake["H2_moe_vs_dense"]["decision"] == "moe" and 0 < bake["H2_moe_vs_dense"]["relative_output_diff"] < 1
    assert set(bake["skipped_pieces"]) == {"E7"}
    assert set(result.outcomes[2].artifacts["skipped_pieces"]) == {"E8", "F5"}
    for o in result.outcomes:
        assert o.measured["mfu_samples"] == 30 and o.measured["mfu_mean"] > 0
        assert len(o.artifacts["forgetting_curve"]) == 30 and len(o.artifacts["mfu_series"]) == 30
    # The outcome is a projection of the journal, and the journal verifies.
    assert LadderProjection.replay(tmp_path / "ladder.jsonl") == result
    assert verify(tmp_path / "ladder.jsonl", keys=[signer.public], require_closed=True).ok


def test_halt_case_stops_at_the_failing_rung(tmp_path, signer, ladder_journal):
    rungs = [
        Rung(name="rung_i_shakeout", real_target="1B params / 8k context / 8 GPUs", decision_pieces=("F1", "F4"),
             max_final_loss=5.0),
        Rung(name="rung_ii_impossible", real_target="8B params / 128k context / 256 GPUs", decision_pieces=("H2",),
             max_final_loss=1.0e-6, steps=10),
        Rung(name="rung_iii_unreached", real_target="8B params / 10M context / 1000 GPUs", decision_pieces=("E8", "F5")),
    ]
    result = run_pilot_ladder(rungs, peak_flops_per_sec=1.0e9, journal=ladder_journal, work_dir=tmp_path)
    ladder_journal.close()
    assert result.halted_at == "rung_ii_impossible" and len(result.outcomes) == 2
    assert result.outcomes[1].reason.startswith("final loss ") and result.outcomes[1].reason.endswith("> target 1e-06")
    decisions = [e for e in read_events(tmp_path / "ladder.jsonl") if type(e).__struct_config__.tag == "decision_recorded"]
    assert [d.action_chosen for d in decisions] == ["advance", "halt_ladder"]
    assert decisions[1].belief_after == {"a": 2.0, "b": 2.0, "mean": 0.5}
    assert not any(e.rung == "rung_iii_unreached" for e in read_events(tmp_path / "ladder.jsonl")
                   if hasattr(e, "rung"))


def test_mutating_a_stored_verdict_breaks_verify(tmp_path, signer, ladder_journal):
    run_pilot_ladder(seed_rungs()[:1], peak_flops_per_sec=1.0e9, journal=ladder_journal, work_dir=tmp_path)
    ladder_journal.close()
    path = tmp_path / "ladder.jsonl"
    lines = read_lines(path)
    i = next(k for k, x in enumerate(lines) if b'"kind":"gate_verdict"' in x)
    lines[i] = lines[i].replace(b'"passed":true', b'"passed":false')
    write_lines(path, lines)
    with pytest.raises(IntegrityError):
        verify(path, keys=[signer.public])


def test_fault_tolerance_rung_is_killed_and_resumed(tmp_path, signer, ladder_journal):
    rung = Rung(name="rung_f2", real_target="1B params / 8 GPUs", decision_pieces=("F2",), exercise_fault_tolerance=True)
    result = run_pilot_ladder([rung], peak_flops_per_sec=1.0e9, journal=ladder_journal, work_dir=tmp_path)
    ladder_journal.close()
    assert result.outcomes[0].measured["continuity_ok"] is True and result.passed_rungs() == ["rung_f2"]
    kinds = [type(e).__struct_config__.tag for e in read_events(tmp_path / "ladder.jsonl")]
    assert kinds.count("checkpoint_saved") == 1 and kinds.count("run_resumed") == 1


def test_unavailable_piece_raises_before_anything_runs(tmp_path, ladder_journal):
    rungs = [Rung(name="ok", real_target="x"), Rung(name="e7", real_target="y", exercise_eval_suite=True)]
    with pytest.raises(NotImplementedError, match="E7"):
        run_pilot_ladder(rungs, peak_flops_per_sec=1.0e9, journal=ladder_journal, work_dir=tmp_path)
    ladder_journal.close()
    assert "rung_started" not in [type(e).__struct_config__.tag for e in read_events(tmp_path / "ladder.jsonl")]


def test_preset_is_the_seed_ladder():
    assert tiny() == seed_rungs()


def test_cli_ladder_runs_verifies_and_prints(tmp_path, capsys):
    from trainledger.cli import main

    assert main(["ladder", "--preset", "tiny", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "no rung halted" in out and "rung_iii_context" in out and "tail      closed" in out
    assert main(["ladder", "--preset", "halt", "--json", str(tmp_path / "halt")]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)   # --json: stdout is one object; the table and the progress go to stderr
    assert d["halted_at"] == "rung_ii_impossible" and d["replay_consistent"] is True and d["verify"]["tail"] == "closed"
    assert [o["passed"] for o in d["outcomes"]] == [True, False] and d["report"].endswith("report.html")
    assert "halted at rung_ii_impossible" in err and "> target 1e-06" in err
    assert main(["ladder", "--preset", "tiny", str(tmp_path / "out")]) == 2  # never overwrites a ladder
