"""Trust round 4, the compute statement: an attacker who can write the statement file (and run ``trainledger prove``
on the journal: proving a line needs no key) but holds no key. Each attack edits the JSON ``trainledger compute``
wrote, as docs/compute.md describes it, and runs ``trainledger verify-proof``; each must fail, naming what was
wrong, or (what no statement can change) print the regulation's own verdict."""

from __future__ import annotations

import json

import pytest

from tests.helpers.compute_runs import FPT, OPTS, TOKENS, SHAPE
from trainledger.cli import main
from trainledger.journal import Journal, Signer
from trainledger.training.health.mfu import record_compute
from trainledger.training.health.monitor import TrainingHealthMonitor


def _run(path, signer, *, steps, thresholds, earlier_total_at=None):
    """A journal under the monitor watching ``thresholds``; with ``earlier_total_at``, a compute_totaled recorded
    mid-run as well (record_compute is public: a user may total the compute at any point)."""
    with Journal.create(path, signer=signer, run_id="victim", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=SHAPE, peak_flops_per_sec=1e12, peak_source="given",
                                  compute_thresholds=thresholds)
        for s in range(steps):
            m.observe_step(s, 3.0 - 0.001 * s, grad_norm=1.0, step_time_s=0.002, tokens=TOKENS)
            if s + 1 == earlier_total_at:
                record_compute(j)
        record_compute(j)
    return path


@pytest.fixture
def signed(tmp_path):
    s = Signer.generate()
    pub = tmp_path / "k.pub"
    pub.write_text(s.public.line() + "\n")
    return s, pub


def _statement(capsys, path, pub, out):
    code = main(["compute", str(path), "--pubkey", str(pub), "--out", str(out)])
    capsys.readouterr()
    return code, json.loads(out.read_text())


def _check(capsys, path, pub, *extra):
    code = main(["verify-proof", str(path), "--pubkey", str(pub), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _rebundle(capsys, journal, pub, seqs, out):
    """What anyone can do with the journal and no key: prove the lines they choose."""
    assert main(["prove", str(journal), *sum((["--seq", str(s)] for s in seqs), []), "--pubkey", str(pub),
                 "--out", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def _lines(journal):
    return [json.loads(x) for x in journal.read_text().splitlines()]


def _refigure(st):
    """The attacker recomputes every figure from what the statement now says (the module is public)."""
    from trainledger.journal.statements.compute.figures import model_figures, run_figures

    for r in st["runs"]:
        r["figures"] = run_figures(r["journals"], board_power_w=st["board_power_w"])
    st["figures"] = model_figures(st["runs"], st["thresholds"], tuple(st["mfu_range"]))


def test_a_statement_restated_from_an_earlier_total_fails(tmp_path, signed, capsys):
    s, pub = signed
    j = _run(tmp_path / "run.jsonl", s, steps=40, thresholds={}, earlier_total_at=20)
    out = tmp_path / "st.json"
    code, st = _statement(capsys, j, pub, out)
    assert code == 0 and _check(capsys, out, pub)[0] == 0
    totals = [x for x in _lines(j) if x["kind"] == "compute_totaled"]
    assert len(totals) == 2 and totals[0]["flops"] == totals[1]["flops"] / 2
    # the attack: the earlier total, proved alone, stated with figures made from it
    jr = st["runs"][0]["journals"][0]
    jr["bundle"] = _rebundle(capsys, j, pub, [totals[0]["seq"]], tmp_path / "b.json")
    jr["compute"] = {k: v for k, v in totals[0].items() if k not in ("seq", "ts", "h")}
    _refigure(st)
    out.write_text(json.dumps(st))
    code, text, _ = _check(capsys, out, pub)
    assert code == 1 and text.startswith("FAIL")
    assert f"its compute_totaled (seq {totals[0]['seq']}) is not shown to be its last" in text
    # and proved together with the lines up to the close, the later total is in them: refused by name
    closed = next(x["seq"] for x in _lines(j) if x["kind"] == "run_closed")
    jr["bundle"] = _rebundle(capsys, j, pub, range(totals[0]["seq"], closed + 1), tmp_path / "b2.json")
    out.write_text(json.dumps(st))
    code, text, _ = _check(capsys, out, pub)
    assert code == 1 and "2 totals proven" in text


def test_a_signed_crossing_left_out_of_a_statement_fails(tmp_path, signed, capsys):
    s, pub = signed
    j = _run(tmp_path / "run.jsonl", s, steps=40, thresholds={"small": 10 * FPT * TOKENS})
    out = tmp_path / "st.json"
    code, st = _statement(capsys, j, pub, out)
    assert code == 0 and st["runs"][0]["journals"][0]["crossings"][0]["name"] == "small"
    crossing = next(x["seq"] for x in _lines(j) if x["kind"] == "compute_threshold_crossed")
    jr = st["runs"][0]["journals"][0]
    kept = [e["seq"] for e in jr["bundle"]["entries"] if e["seq"] != crossing]
    jr["bundle"] = _rebundle(capsys, j, pub, kept, tmp_path / "b.json")
    jr["crossings"] = []
    out.write_text(json.dumps(st))
    code, err, _ = _check(capsys, out, pub)
    assert code == 1 and "its compute_totaled says the steps crossed small; the statement proves no crossing" in err


def test_the_regulations_thresholds_are_evaluated_whatever_the_statement_lists(tmp_path, signed, capsys):
    """The thresholds edited away (1e23 and 1e25 replaced by 1e30, every figure recomputed): the statement is
    consistent with itself, and verify-proof still prints the regulation's own thresholds against the proven
    FLOPs (here a run large enough to pass 1e23)."""
    s, pub = signed
    from tests.unit.training.test_compute_statement import BIG, BIG_TOKENS

    p = tmp_path / "big.jsonl"
    with Journal.create(p, signer=s, run_id="big", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=BIG, peak_flops_per_sec=989e12, peak_source="datasheet",
                                  devices=1024)
        for step in range(300):
            m.observe_step(step, 2.0, grad_norm=1.0, step_time_s=1.0, tokens=BIG_TOKENS)
        record_compute(j)
    out = tmp_path / "st.json"
    code, st = _statement(capsys, p, pub, out)
    assert code == 0 and st["figures"]["thresholds"]["gpai"]["reached"]
    st["thresholds"] = {"gpai": 1e30, "systemic-risk": 1e30}
    _refigure(st)
    out.write_text(json.dumps(st))
    code, text, _ = _check(capsys, out, pub)
    assert code == 0  # nothing the keys signed was changed...
    assert "the regulation's thresholds (evaluated by this check, whatever the statement lists): gpai (1e+23 " \
           "model FLOPs) REACHED by run big; systemic-risk (1e+25 model FLOPs) not reached" in text  # ...and it says
    code, text, _ = _check(capsys, out, pub, "--json")
    assert json.loads(text)["regulation"]["gpai"]["reached"] is True


def test_the_text_of_what_a_statement_does_not_prove_is_not_the_statements_to_change(tmp_path, signed, capsys):
    s, pub = signed
    j = _run(tmp_path / "run.jsonl", s, steps=20, thresholds={})
    out = tmp_path / "st.json"
    _, st = _statement(capsys, j, pub, out)
    st["not_proven"] = "Everything here is proven."
    out.write_text(json.dumps(st))
    code, text, _ = _check(capsys, out, pub)
    assert code == 1 and "Everything here is proven." not in text
    assert "what it does not prove: The receipts are the trainer's own" in text
    assert "text of what it does not prove is not the one trainledger writes" in text


def test_an_aggregate_edit_is_refused_naming_the_figure(tmp_path, signed, capsys):
    s, pub = signed
    j = _run(tmp_path / "run.jsonl", s, steps=20, thresholds={})
    out = tmp_path / "st.json"
    _, st = _statement(capsys, j, pub, out)
    st["figures"]["device_hours"] = 0.0
    out.write_text(json.dumps(st))
    code, err, _ = _check(capsys, out, pub)
    assert code == 1 and "the model's figure device_hours stated" in err
