"""``trainledger import mlflow``: a run the real MLflow wrote to a local file store, imported with every point at
its step, its params as the configuration; a line that does not parse is named, a folder of several runs asks for
one, and what is not a store is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import keygen, load_public_key, read_events, verify  # noqa: E402

SCRIPT = textwrap.dedent("""
    import sys
    import mlflow

    mlflow.set_tracking_uri("file:" + sys.argv[1])
    for name in sys.argv[2:]:
        with mlflow.start_run(run_name=name):
            mlflow.log_params({"lr": 3e-4, "layers": 2})
            for step in range(200):
                m = {"loss": 2.0 - step / 200 + (5.0 if step == 120 else 0.0), "train/acc": step / 200, "lr": 3e-4}
                if step == 7:
                    m["odd"] = float("nan")
                mlflow.log_metrics(m, step=step)
""")


def _store(tmp: Path, *runs: str) -> Path:
    mlruns = tmp / "mlruns"
    script = tmp / "log_mlflow.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_TRACKING_URI="", GIT_PYTHON_REFRESH="quiet")
    r = subprocess.run([sys.executable, str(script), str(mlruns), *runs], cwd=tmp, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return mlruns


def test_a_mlflow_run_is_imported_point_for_point(tmp_path, capsys):
    mlruns = _store(tmp_path, "first")
    priv, pub = keygen(tmp_path / "keys")
    assert main(["import", "mlflow", str(mlruns), str(tmp_path / "imported"), "--key", str(priv)]) == 0
    assert capsys.readouterr().out.startswith("IMPORTED 200 steps")
    journal = tmp_path / "imported" / "journal.jsonl"
    assert verify(journal, keys=[load_public_key(pub)], require_closed=True).ok
    points: dict[tuple[int, str], float] = {}
    evs = list(read_events(journal))
    for ev in evs:
        tag = type(ev).__struct_config__.tag
        if tag == "step_observed":
            points[(ev.step, "loss")] = ev.loss
            points[(ev.step, "lr")] = ev.lr
        elif tag == "metrics_logged":
            points.update({(ev.step, k): v for k, v in ev.metrics.items()})
    assert len(points) == 200 * 3 + 1
    assert points[(120, "loss")] == pytest.approx(2.0 - 120 / 200 + 5.0) and points[(199, "train/acc")] == 199 / 200
    assert points[(7, "odd")] != points[(7, "odd")]  # NaN kept
    (cfg,) = [e for e in evs if type(e).__struct_config__.tag == "config_logged"]
    assert cfg.config == {"lr": "0.0003", "layers": "2"}  # MLflow keeps params as strings
    assert evs[0].meta["imported"]["tool"] == "mlflow"
    assert any(type(e).__struct_config__.tag == "anomaly_detected" and e.step == 120 for e in evs)


def test_what_the_mlflow_import_cannot_keep_is_named(tmp_path, capsys):
    mlruns = _store(tmp_path, "a", "b")
    priv, _ = keygen(tmp_path / "keys")
    assert main(["import", "mlflow", str(mlruns), str(tmp_path / "x"), "--key", str(priv)]) == 2
    assert "2 MLflow runs in it" in capsys.readouterr().err
    run = next(p.parent for p in mlruns.glob("*/*/metrics"))
    with open(run / "metrics" / "loss", "a") as f:
        f.write("not a point\n")
    assert main(["import", "mlflow", str(run), str(tmp_path / "y"), "--key", str(priv)]) == 0
    out = capsys.readouterr()
    assert "skipped loss: line 201 is not 'timestamp value step'" in out.out and "1 value(s)" in out.err
    assert main(["import", "mlflow", str(tmp_path / "keys"), str(tmp_path / "z"), "--key", str(priv)]) == 2
    assert "no MLflow run in it" in capsys.readouterr().err
    assert not (tmp_path / "z").exists()
