"""Import TensorBoard and Megatron logs into signed journals that say they were imported, find an old spike by
replay, count what could not be read; export a journal back to TensorBoard and read it with TensorBoard's reader."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("tensorboard")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import read_events  # noqa: E402
from trainledger.audit import replay  # noqa: E402


def _tb_log(logdir, steps=300, spike=200):
    from torch.utils.tensorboard import SummaryWriter

    rng = random.Random(0)
    w = SummaryWriter(str(logdir))
    for s in range(steps):
        loss = 3.0 * math.exp(-s / 400) + rng.gauss(0, 0.01) + (8.0 if s == spike else 0.0)
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/grad_norm", 1.0 + rng.gauss(0, 0.02), s)
        w.add_scalar("train/learning_rate", 3e-4, s)
        if s % 50 == 0:
            w.add_scalar("eval/accuracy", 0.5 + s / 1000, s)
    w.close()


def test_a_tensorboard_log_is_imported_and_its_spike_found(tmp_path, capsys):
    _tb_log(tmp_path / "tb")
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    assert main(["import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "run"), "--key", str(priv)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("IMPORTED 300 steps and 6 other values from 1 tensorboard file(s)")
    j = tmp_path / "run" / "journal.jsonl"
    rec = replay(j, keys=[__import__("trainledger.journal", fromlist=["load_public_key"]).load_public_key(pub)])
    assert rec.ok and 200 in rec.anomalies_by_kind["loss_spike"]
    steps = [e for e in read_events(j) if type(e).__struct_config__.tag == "step_observed"]
    assert steps[5].grad_norm is not None and steps[5].lr == pytest.approx(3e-4)
    assert main(["verify", "--pubkey", str(pub), str(j)]) == 0
    assert "IMPORTED  from 1 tensorboard file(s)" in capsys.readouterr().out
    assert main(["replay", "--pubkey", str(pub), str(j)]) == 0
    assert "IMPORTED" in capsys.readouterr().out
    assert main(["query", "--pubkey", str(pub), "--format", "json", str(j), "SELECT imported FROM runs"]) == 0
    assert '"imported": true' in capsys.readouterr().out
    opened = next(iter(read_events(j)))
    (src,) = opened.meta["imported"]["files"]
    assert len(src["sha256"]) == 64 and src["bytes"] > 0


def _megatron_log(path, n=60):
    lines = ["Megatron-LM training log"]
    for k in range(1, n + 1):
        it = 10 * k
        loss = "nan" if k == 40 else f"{7.0 - 0.02 * k:.6E}"
        skipped = 1 if k == 30 else 0
        lines.append(f" iteration {it:>8}/    5000 | consumed samples: {it * 512:>12} | elapsed time per iteration "
                     f"(ms): {1200 + k:.1f} | learning rate: 1.500E-04 | global batch size:   512 | lm loss: {loss} |"
                     f" loss scale: 65536.0 | grad norm: 1.{k:03d} | number of skipped iterations: {skipped:>3} | "
                     f"number of nan iterations: {1 if k == 40 else 0:>3} |")
    lines.insert(20, " iteration      195/    5000 | lm loss: 7.1x3 | garbled |")
    path.write_text("\n".join(lines) + "\n iteration      610/    5000 | lm loss: 5.9")  # cut off mid-line


def test_a_megatron_log_is_imported_with_its_nan_and_every_skip_named(tmp_path, capsys):
    from trainledger.journal import keygen, load_public_key

    priv, pub = keygen(tmp_path / "keys")
    _megatron_log(tmp_path / "train.log")
    assert main(["import", "megatron", str(tmp_path / "train.log"), str(tmp_path / "run"), "--key", str(priv)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("IMPORTED 60 steps")
    assert "skipped line 21: an iteration line without an lm loss" in out
    assert "skipped line 63: the last line is cut off" in out and "2 line(s) skipped" in err
    j = tmp_path / "run" / "journal.jsonl"
    rec = replay(j, keys=[load_public_key(pub)])
    assert rec.ok and rec.anomalies_by_kind.get("nan_loss") == [400]
    steps = [e for e in read_events(j) if type(e).__struct_config__.tag == "step_observed"]
    assert steps[0].step == 10 and steps[0].step_time_s == pytest.approx(1.201) and steps[0].examples == 512
    other = [e for e in read_events(j) if type(e).__struct_config__.tag == "metrics_logged"]
    assert any(e.step == 300 and e.metrics.get("number of skipped iterations") == 1 for e in other)


@pytest.mark.parametrize("extra, more", [(9, None), (12, "  ... 3 more")])
def test_the_skipped_listing_shows_the_last_entry_and_counts_the_rest(tmp_path, capsys, extra, more):
    """The first ten skipped lines are listed, and the last (where a cut-off file is named) always; "... N more"
    stands between them only when something is left out (with eleven, nothing is)."""
    from trainledger.journal import keygen

    priv, _ = keygen(tmp_path / "keys")
    log = tmp_path / "train.log"
    _megatron_log(log)
    lines = log.read_text().split("\n")
    for _ in range(extra):  # each a line the import skips, before the cut-off last line
        lines.insert(30, " iteration      195/    5000 | lm loss: 7.1x3 | garbled |")
    log.write_text("\n".join(lines))
    assert main(["import", "megatron", str(log), str(tmp_path / "run"), "--key", str(priv)]) == 0
    out, err = capsys.readouterr()
    shown = [x for x in out.splitlines() if x.startswith("  ")]
    assert f"{extra + 2} line(s) skipped" in err and "the last line is cut off" in shown[-1]
    assert len([x for x in shown if x.startswith("  skipped")]) == 11
    assert (more in shown) if more else not any("more" in x for x in shown)


def test_export_to_tensorboard_reads_back(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    _tb_log(tmp_path / "tb", steps=120, spike=100)
    assert main(["import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "run"), "--key", str(priv)]) == 0
    assert main(["export", "tensorboard", "--pubkey", str(pub), str(tmp_path / "run" / "journal.jsonl"),
                 str(tmp_path / "out")]) == 0
    acc = EventAccumulator(str(tmp_path / "out"), size_guidance={"scalars": 0})
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [x.step for x in loss] == list(range(120))
    src = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    src.Reload()
    assert [x.value for x in loss] == [x.value for x in src.Scalars("train/loss")]
    assert [x.step for x in acc.Scalars("anomalies/loss_spike")] == [100]


def test_a_truncated_or_corrupted_event_file_is_named_not_half_imported(tmp_path, capsys):
    from trainledger.journal import keygen

    priv, _ = keygen(tmp_path / "keys")
    _tb_log(tmp_path / "tb", steps=50, spike=40)
    (f,) = list((tmp_path / "tb").iterdir())
    data = f.read_bytes()
    f.write_bytes(data[:-7])  # cut off inside the last record
    assert main(["import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "a"), "--key", str(priv)]) == 2
    err = capsys.readouterr().err
    assert f.name in err and "truncated" in err and not (tmp_path / "a" / "journal.jsonl").exists()
    b = bytearray(data)
    b[len(b) // 2] ^= 1
    f.write_bytes(bytes(b))
    assert main(["import", "tensorboard", str(tmp_path / "tb"), str(tmp_path / "b"), "--key", str(priv)]) == 2
    assert "bad data CRC" in capsys.readouterr().err
