"""A W&B script run unchanged twice: against the real ``wandb`` in offline mode, then imported with ``trainledger
import wandb``, and against ``import trainledger as wandb``. Both journals verify and hold the same points; the
import names what it could not keep (a string, a run cut off mid-write) and refuses what is not a W&B run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import keygen, load_public_key, read_events, verify  # noqa: E402

SCRIPT = """
import sys
import {module} as wandb

run = wandb.init(project="cmp", name="same-script", dir=sys.argv[1], config={{"lr": 3e-4, "model": {{"layers": 2}}}})
for step in range(300):
    row = {{"loss": 2.0 - step / 300 + (5.0 if step == 120 else 0.0), "train/acc": step / 300, "lr": 3e-4}}
    if step % 50 == 0:
        row["eval/loss"] = 2.1 - step / 300
    if step == 7:
        row["odd"] = float("nan")
    if step == 8:
        row["flag"] = True
    wandb.log(row)
{extra}
wandb.finish()
"""


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp),
                "WANDB_CONFIG_DIR": str(tmp / "wandb-config"), "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
                "TRAINLEDGER_KEY_DIR": str(tmp / "home-keys")})
    return env


def _run(tmp: Path, module: str, extra: str = "") -> None:
    script = tmp / f"train_{module}.py"
    script.write_text(SCRIPT.format(module=module, extra=extra))
    r = subprocess.run([sys.executable, str(script), str(tmp)], cwd=tmp, env=_env(tmp), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _points(journal: Path) -> dict[tuple[int, str], str]:
    """Every (step, name) -> value (as repr: NaN equals NaN) a journal holds, from steps and logged metrics."""
    out: dict[tuple[int, str], str] = {}
    for ev in read_events(journal):
        tag = type(ev).__struct_config__.tag
        if tag == "step_observed":
            for name in ("loss", "grad_norm", "lr"):
                v = getattr(ev, name)
                if v is not None:
                    out[(ev.step, name)] = repr(float(v))
        elif tag == "metrics_logged":
            for name, v in ev.metrics.items():
                out[(ev.step, name)] = repr(float(v))
    return out


def _offline_run(tmp: Path) -> Path:
    (found,) = (tmp / "wandb").glob("offline-run-*")
    return found


def test_the_same_w_and_b_script_gives_the_same_points_imported_or_logged_directly(tmp_path, capsys):
    _run(tmp_path, "wandb")
    _run(tmp_path, "trainledger")
    priv, pub = keygen(tmp_path / "keys")
    assert main(["import", "wandb", str(_offline_run(tmp_path)), str(tmp_path / "imported"), "--key", str(priv)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("IMPORTED ") and "skipped" not in printed
    imported = tmp_path / "imported" / "journal.jsonl"
    direct = tmp_path / "trainledger-runs" / "cmp" / "same-script" / "journal.jsonl"
    assert verify(imported, keys=[load_public_key(pub)], require_closed=True).ok
    assert verify(direct, keys=[load_public_key(direct.parent / "trainledger.pub")], require_closed=True).ok
    a, b = _points(imported), _points(direct)
    assert len(a) == 300 * 3 + 6 + 2 and a == b  # every point, in both, the same: NaN and the bool's 1.0 too
    assert a[(7, "odd")] == "nan" and a[(8, "flag")] == "1.0"
    evs = list(read_events(imported))
    (cfg,) = [e for e in evs if type(e).__struct_config__.tag == "config_logged"]
    assert cfg.config["lr"] == 3e-4 and cfg.config["model"] == {"layers": 2}
    opened = evs[0]
    assert opened.meta["imported"]["tool"] == "wandb" and opened.meta["imported"]["files"][0]["file"].endswith(".wandb")
    # the step-120 spike is found in the imported run as in any other (the health projection ran over its steps)
    assert any(type(e).__struct_config__.tag == "anomaly_detected" and e.step == 120 for e in evs)


def test_what_the_import_cannot_keep_is_named(tmp_path, capsys):
    _run(tmp_path, "wandb", extra='wandb.log({"note": "a string, not a number", "loss": 1.0})')
    priv, _ = keygen(tmp_path / "keys")
    run = _offline_run(tmp_path)
    assert main(["import", "wandb", str(run), str(tmp_path / "a"), "--key", str(priv)]) == 0
    out = capsys.readouterr()
    assert "skipped record" in out.out and "note: not a number (str)" in out.out and "1 record(s)" in out.err
    # a run killed mid-write: the file cut in its last block is read up to the cut, and the cut is named
    (wf,) = run.glob("*.wandb")
    cut = tmp_path / "cut.wandb"
    data = wf.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert main(["import", "wandb", str(cut), str(tmp_path / "b"), "--key", str(priv)]) == 0
    assert "a record cut off" in capsys.readouterr().out
    # found by mutating a run file at random: one flipped byte in the last (here the only) block was taken for a
    # killed writer's cut, and every record after it was left out with exit 0; it is damage, named, exit 2
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0x10
    bad = tmp_path / "flipped.wandb"
    bad.write_bytes(bytes(flipped))
    assert main(["import", "wandb", str(bad), str(tmp_path / "e"), "--key", str(priv)]) == 2
    assert "damaged, not cut off" in capsys.readouterr().err
    assert not (tmp_path / "e" / "journal.jsonl").exists()
    # a tail the system lost as zeros is a cut, as a killed writer's is
    zeros = tmp_path / "zeros.wandb"
    zeros.write_bytes(data[: len(data) * 2 // 3] + bytes(len(data) // 3))
    assert main(["import", "wandb", str(zeros), str(tmp_path / "f"), "--key", str(priv)]) == 0
    assert "a record cut off" in capsys.readouterr().out
    # not a W&B run, a folder without one, an existing journal: one line each, exit 2, nothing written
    junk = tmp_path / "junk.wandb"
    junk.write_bytes(b"not a wandb file at all" * 10)
    assert main(["import", "wandb", str(junk), str(tmp_path / "c"), "--key", str(priv)]) == 2
    assert "not a W&B run file" in capsys.readouterr().err
    assert not (tmp_path / "c" / "journal.jsonl").exists()
    assert main(["import", "wandb", str(tmp_path / "keys"), str(tmp_path / "d"), "--key", str(priv)]) == 2
    assert "no .wandb file in it" in capsys.readouterr().err
    assert main(["import", "wandb", str(run), str(tmp_path / "a"), "--key", str(priv)]) == 2
    assert "already exists" in capsys.readouterr().err
    # a value nested past the JSON decoder's stack is text, not a number (never a RecursionError's traceback)
    from trainledger.training.interop import _json_value

    assert _json_value("[" * 100_000 + "]" * 100_000) == "[" * 200
