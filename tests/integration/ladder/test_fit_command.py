"""`trainledger fit` end to end: a CSV of points, and a ladder journal verified first, each fitted with its
bootstrap interval."""

from __future__ import annotations

import pytest
from test_scaling import synthetic  # tests/unit/ladder: the synthetic law's points


def test_trainledger_fit_prints_the_law_and_sizes_a_budget(tmp_path, capsys):
    import json

    from trainledger.cli import main

    csv = tmp_path / "points.csv"
    csv.write_text("n_params,tokens,loss\n" + "".join(f"{n},{d},{ls}\n" for n, d, ls in synthetic()))
    assert main(["fit", str(csv), "--budget", "1e21", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (b,) = out["budgets"]
    assert 6 * b["n_params"] * b["tokens"] == pytest.approx(1e21) and b["interval"][0] < b["predicted_loss"]
    bad = tmp_path / "bad.csv"
    bad.write_text("1e8,1e9,3.0\n1e8,1e9,-3\n")
    assert main(["fit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2:" in err and "positive finite" in err and len(err.strip().splitlines()) == 1


def test_trainledger_fit_reads_a_ladder_journal(capsys):
    import json
    from pathlib import Path

    from trainledger.cli import main

    g = Path(__file__).resolve().parents[2] / "assets" / "golden" / "scaling_ladder_v1_2"
    assert main(["fit", "--pubkey", str(g.with_suffix(".pub")), "--json", str(g.with_suffix(".jsonl"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 7 and out["loo_error"] < 0.1  # six pilots and the headline
    assert main(["fit", str(g.with_suffix(".jsonl"))]) == 2  # no key pinned: refused, one line
