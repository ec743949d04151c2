"""``import trainledger as wandb``: an ordinary W&B script runs unchanged into a signed journal that verifies and
replays; a run killed mid-way continues with resume="allow"; W&B's options that change nothing are named once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import argparse
    import math
    import sys

    import trainledger as wandb

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()

    run = wandb.init(project="mnist", name="baseline", config=args, entity="team", tags=["cnn"],
                     settings=wandb.Settings(start_method="thread"), resume="allow")
    wandb.config.update({"batch_size": 32})
    wandb.define_metric("val/acc", summary="max")
    assert wandb.run is run and wandb.config.lr == args.lr
    for step in range(run.step, 20):
        if step % 5 == 4:
            wandb.log({"val/acc": step / 20}, commit=False)  # joins this step's row
        wandb.log({"train/loss": 1.0 / (step + 1), "train/nan": math.nan if step == 3 else 0.0,
                   "media": object(), "nested": {"a": step}})
        if step == args.kill_at:
            run.journal.seal(durable=True)  # what a run has written by then (the flush interval aside)
            import os, signal
            os.kill(os.getpid(), signal.SIGKILL)
    wandb.summary["best_acc"] = 0.95
    print("summary", run.summary["val/acc"], run.summary["best_acc"])
    wandb.finish()
''')


def _run(tmp_path, *args, check=True):
    env = {**os.environ, "TRAINLEDGER_KEY_DIR": str(tmp_path / "keys")}
    (tmp_path / "train.py").write_text(SCRIPT)
    r = subprocess.run([sys.executable, "train.py", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def _metrics(journal, pub):
    from trainledger.journal import load_public_key, read_signed_events

    return [e for e in read_signed_events(journal, [load_public_key(pub)])
            if type(e).__struct_config__.tag == "metrics_logged"]


def test_a_wandb_script_runs_unchanged_and_its_journal_verifies_and_replays(tmp_path):
    from trainledger.audit import replay
    from trainledger.journal import load_public_key, verify
    from trainledger.journal.views.query import connect

    r = _run(tmp_path)
    run = tmp_path / "trainledger-runs" / "mnist" / "baseline"
    journal, pub = run / "journal.jsonl", run / "trainledger.pub"
    assert "summary 0.95 0.95" in r.stdout
    # W&B's options that change nothing here, named once; a value that is not a number, named once
    assert r.stderr.count("entity, settings") == 1 and r.stderr.count("'media' is a object") == 1
    assert f"signing with {tmp_path / 'keys' / 'default.key'}" in r.stderr
    key = load_public_key(pub)
    assert verify(journal, keys=[key], require_closed=True).ok and replay(journal, keys=[key]).ok
    rows = _metrics(journal, pub)
    logged = [m for m in rows if m.source == "wandb"]
    assert [m.step for m in logged] == list(range(20))
    assert logged[4].metrics["val/acc"] == 0.2 and logged[4].metrics["train/loss"] == 0.2
    assert logged[3].metrics["train/nan"] != logged[3].metrics["train/nan"]  # NaN kept
    assert logged[7].metrics["nested.a"] == 7.0 and "media" not in logged[7].metrics
    assert [m.metrics for m in rows if m.source == "summary"] == [{"best_acc": 0.95}]
    con = connect([journal], keys=[key])
    assert con.execute("SELECT count(*) FROM metrics WHERE name = 'train/loss'").fetchone()[0] == 20
    configs = con.execute("SELECT source, config FROM config_logged ORDER BY seq").fetchall()
    assert [c[0] for c in configs] == ["init", "config", "define_metric"]
    assert json.loads(configs[0][1])["lr"] == 0.001 and json.loads(configs[1][1]) == {"batch_size": 32}
    assert json.loads(configs[2][1]) == {"val/acc": {"summary": "max"}}
    opened = con.execute("SELECT json_extract(line, '$.meta') FROM events WHERE kind = 'run_opened'").fetchone()[0]
    assert json.loads(opened)["tags"] == ["cnn"] and json.loads(opened)["project"] == "mnist"


def test_a_run_killed_mid_way_continues_with_resume_allow(tmp_path):
    r = _run(tmp_path, "--kill-at", "9", check=False)
    assert r.returncode == -9
    _run(tmp_path)  # the same script again: resume="allow" continues the journal at the step after the last
    run = tmp_path / "trainledger-runs" / "mnist" / "baseline"
    from trainledger.journal import load_public_key, verify

    assert verify(run / "journal.jsonl", keys=[load_public_key(run / "trainledger.pub")], require_closed=True).ok
    steps = [m.step for m in _metrics(run / "journal.jsonl", run / "trainledger.pub") if m.source == "wandb"]
    assert steps == list(range(20))


def test_init_refuses_what_would_mix_two_runs(tmp_path, monkeypatch):
    import trainledger as wandb
    from trainledger.journal.errors import UsageError

    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "keys"))
    with pytest.raises(UsageError, match="holds no run to continue"):
        wandb.init(project="p", name="n", dir=tmp_path, resume="must")
    run = wandb.init(project="p", name="n", dir=tmp_path)
    wandb.log({"x": 1.0})
    wandb.log({"x": 2.0}, step=5)
    wandb.log({"x": 3.0}, step=2)  # below the current step: dropped, as W&B drops it
    wandb.finish()
    assert wandb.run is None and run.step == 5
    with pytest.raises(UsageError, match="holds a run already"):
        wandb.init(project="p", name="n", dir=tmp_path)
    with pytest.raises(UsageError, match="has finished"):
        wandb.init(project="p", name="n", dir=tmp_path, resume="allow")
    with pytest.raises(UsageError, match="cannot name a folder"):
        wandb.init(project="../up", dir=tmp_path)
    off = wandb.init(project="p", name="off", dir=tmp_path, mode="disabled")
    wandb.log({"x": 1.0})
    wandb.finish()
    assert off.journal is None and not (tmp_path / "trainledger-runs" / "p" / "off").exists()
    with pytest.raises(AttributeError, match="call trainledger.init"):
        wandb.config  # noqa: B018


def test_a_tensorboard_summarywriter_script_runs_unchanged(tmp_path, monkeypatch, capsys):
    """``from trainledger import SummaryWriter``: a step's scalars are one row, add_scalars names main/tag,
    add_hparams records the hyperparameters; other add_* are named once; the same log_dir continues after a kill
    (here: an exception inside the with block leaves the journal open)."""
    from trainledger import SummaryWriter
    from trainledger.journal import load_public_key, verify
    from trainledger.journal.views.query import connect

    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "keys"))
    log_dir = tmp_path / "runs" / "exp1"
    with pytest.raises(KeyboardInterrupt), SummaryWriter(log_dir) as w:
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_scalars("acc", {"train": step / 10, "val": step / 20}, global_step=step)
            w.add_histogram("weights", [1.0, 2.0], step)
        raise KeyboardInterrupt
    with SummaryWriter(log_dir) as w:
        for step in range(3, 5):
            w.add_scalar("loss", 1.0 / (step + 1), step)
        w.add_hparams({"lr": 0.1, "optimizer": "sgd"}, {"hparam/loss": 0.2})
    assert capsys.readouterr().err.count("add_histogram: not recorded") == 1
    key = load_public_key(log_dir / "trainledger.pub")
    assert verify(log_dir / "journal.jsonl", keys=[key], require_closed=True).ok
    con = connect([log_dir / "journal.jsonl"], keys=[key])
    rows = con.execute("SELECT step, name, value FROM metrics WHERE source = 'tensorboard' ORDER BY step, name").fetchall()
    assert rows[:3] == [(0, "acc/train", 0.0), (0, "acc/val", 0.0), (0, "loss", 1.0)]
    assert [r for r in rows if r[1] == "loss"] == [(s, "loss", 1.0 / (s + 1)) for s in range(5)]
    assert (4, "hparam/loss", 0.2) in rows
    hp = con.execute("SELECT config FROM config_logged WHERE source = 'hparams'").fetchone()[0]
    assert json.loads(hp) == {"lr": 0.1, "optimizer": "sgd"}
    assert con.execute("SELECT count(*) FROM events WHERE kind = 'tail_repaired'").fetchone()[0] <= 1


def test_log_queues_plain_rows_and_reads_a_tensor_at_the_call(tmp_path, monkeypatch):
    """log(row) queues a row of plain numbers for the journal's drain (its event is made there); a tensor (or a
    nested dict) is read at the call, so changing it in place afterwards changes nothing recorded; the summary
    sees queued rows at once; rows from the queued and the other paths keep the steps' order."""
    import torch

    import trainledger as wandb
    from trainledger.journal import load_public_key
    from trainledger.journal.views.query import connect

    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "keys"))
    run = wandb.init(project="p", name="queued", dir=str(tmp_path))
    acc = torch.zeros(())
    wandb.log({"loss": 2.0, "epoch": 0})  # step 0: queued
    acc += 0.5
    wandb.log({"acc": acc})  # step 1: a tensor, read now
    acc.zero_()
    wandb.log({"lr": 0.1}, commit=False)  # step 2 by the row path
    wandb.log({"loss": 1.0})
    assert run.summary["loss"] == 1.0 and run.summary["acc"] == 0.5 and run.summary["epoch"] == 0
    wandb.finish()
    key = load_public_key(run.path / "trainledger.pub")
    con = connect([run.path / "journal.jsonl"], keys=[key])
    rows = con.execute("SELECT step, name, value FROM metrics ORDER BY seq, name").fetchall()
    assert rows == [(0, "epoch", 0.0), (0, "loss", 2.0), (1, "acc", 0.5), (2, "loss", 1.0), (2, "lr", 0.1)]
