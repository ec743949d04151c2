"""Any metric and any evaluation in the journal: ``Recorder.log`` records scalars as logged (NaN and the infinities
kept, nested dicts flattened as W&B does, tensors by value), ``Recorder.evaluate`` binds results to the digest of the
checkpoint they evaluated, and ``query`` reads them back as ``metrics`` and ``evaluations``."""

from __future__ import annotations

import math

import pytest
import torch

from trainledger.journal import read_events, verify
from trainledger.journal.errors import UsageError
from trainledger.training.kinds import metric_values
from trainledger.training.recorder import Recorder


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_metric_values_flattens_and_keeps_every_real_number():
    import numpy as np

    got = metric_values({"train/acc": 0.5, "n": 3, "ok": True, "eval": {"loss": 1.5, "sub": {"x": np.float32(2)}},
                         "nan": float("nan"), "inf": -math.inf, "t": torch.tensor(0.25), "ü/é": 1})
    assert got["train/acc"] == 0.5 and got["n"] == 3.0 and got["ok"] == 1.0 and got["eval.loss"] == 1.5
    assert got["eval.sub.x"] == 2.0 and math.isnan(got["nan"]) and got["inf"] == -math.inf and got["t"] == 0.25
    assert got["ü/é"] == 1.0 and all(type(v) is float for v in got.values())
    for bad, says in (({"s": "text"}, "'s' is a str"), ({"v": [1, 2]}, "'v' is a list"),
                      ({"t": torch.zeros(3)}, "'t' is a Tensor"), ({"": 1.0}, "non-empty string"),
                      ({"x" * 2000: 1.0}, "longer than 1024"), ([1, 2], "must be a mapping")):
        with pytest.raises(ValueError, match=says):
            metric_values(bad)


def test_log_and_evaluate_are_signed_replayed_and_queried(tmp_path, signer, pubkey, capsys):
    from trainledger.journal.views.query import connect

    model, opt = _model()
    run = tmp_path / "run"
    with Recorder(run, signer=signer, model=model, optimizer=opt) as rec:
        for step in range(6):
            loss = float(6 - step)
            rec.step(step, loss)
            rec.log({"train/acc": step / 10, "lr": 0.1, "weird": float("nan") if step == 3 else 1.0})
        rec.log({"eval": {"loss": 2.5}}, step=4)
        with pytest.raises(UsageError, match="evaluate: no checkpoint recorded yet"):
            rec.evaluate("heldout", {"loss": 1.0})
        ck = rec.checkpoint(5)
        ev = rec.evaluate("heldout", {"loss": 1.25, "acc": 0.75}, cases=[{"id": 1, "ok": True}])
        with pytest.raises(UsageError, match="'text' is a str"):
            rec.log({"text": "hello"})
        with pytest.raises(UsageError, match="not a live checkpoint"):
            rec.evaluate("heldout", {"loss": 1.0}, checkpoint="checkpoints/nope.pt")
    assert ev.checkpoint == ck.path and ev.checkpoint_sha256 == ck.sha256 and ev.step == 5 and ev.cases == 1
    assert (run / ev.cases_path).is_file()
    journal = run / "journal.jsonl"
    assert verify(journal, keys=[pubkey], require_closed=True).ok
    events = list(read_events(journal))
    logged = [e for e in events if type(e).__struct_config__.tag == "metrics_logged"]
    assert [e.step for e in logged] == [0, 1, 2, 3, 4, 5, 4] and {e.source for e in logged} == {"log"}
    assert math.isnan(logged[3].metrics["weird"]) and logged[6].metrics == {"eval.loss": 2.5}
    evals = [e for e in events if type(e).__struct_config__.tag == "evaluation_recorded"]
    assert [(e.hook, e.step, e.checkpoint_sha256, e.metrics, e.cases_sha256) for e in evals] == [
        (ev.hook, ev.step, ev.checkpoint_sha256, ev.metrics, ev.cases_sha256)]
    con = connect([journal], keys=[pubkey])
    rows = con.execute("SELECT step, name, value FROM metrics WHERE name = 'train/acc' ORDER BY step").fetchall()
    assert rows == [(s, "train/acc", s / 10) for s in range(6)]
    nan = con.execute("SELECT value FROM metrics WHERE name = 'weird' AND step = 3").fetchone()[0]
    assert math.isnan(nan)
    assert con.execute("SELECT hook, checkpoint_sha256, metrics->>'acc' FROM evaluations").fetchall() == [
        ("heldout", ck.sha256, "0.75")]
    # replay names what each conclusion was recomputed from, and that no conclusion used the logged metrics
    from trainledger.audit import replay
    from trainledger.cli import main

    rec = replay(journal, keys=[pubkey])
    inputs = {x["conclusion"]: x["folds"] for x in rec.inputs}
    assert inputs["health"]["step_observed"] == 6 and "metrics_logged" not in inputs["health"]
    assert inputs[None] == {"metrics_logged": 7}
    assert any("evaluation_recorded" in folds for name, folds in inputs.items() if name is not None)
    pub = tmp_path / "run.pub"
    pub.write_text(pubkey.line() + "\n")
    assert main(["replay", str(journal), "--pubkey", str(pub)]) == 0
    assert "used by no conclusion (records only): metrics_logged 7" in capsys.readouterr().out


def test_log_costs_little_and_never_waits_for_the_disk(tmp_path, signer):
    """Counted, not timed: log() queues its event (append_deferred); nothing reaches the file until a drain."""
    model, opt = _model()
    rec = Recorder(tmp_path / "run", signer=signer, model=model, optimizer=opt)
    journal = rec.journal
    before = journal.path.stat().st_size
    rec.log({"a": 1.0})
    assert journal._pending and journal.path.stat().st_size == before  # queued, not written
    rec.close()
