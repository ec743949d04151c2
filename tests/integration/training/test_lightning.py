"""The Lightning callback with the real lightning Trainer on the CPU: every optimizer step journaled, each
ModelCheckpoint file digested and carrying the journal's head, a resume checked (a changed byte refused), a crash
journaled by on_exception, and self.log metrics through the logger adapter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HELPERS = Path(__file__).resolve().parents[2] / "helpers"  # the torchrun workers

L = pytest.importorskip("lightning")

from trainledger.journal import read_events, verify  # noqa: E402
from trainledger.audit import replay  # noqa: E402
from trainledger.training.checkpoints.state import ResumeRejected  # noqa: E402
from trainledger.training.integrations.lightning import TrainledgerCallback, TrainledgerLogger  # noqa: E402

# Lightning's advice on a toy run (workers, logging), and its own use of a torch API that torch 2.13 deprecates
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")]


class Tiny(L.LightningModule):
    def __init__(self, crash_at: int | None = None):
        super().__init__()
        self.save_hyperparameters()  # what the logger records as the run's configuration
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.crash_at = crash_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        xs = torch.randn(256, 8, generator=g)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=8)


def _fit(run, signer, *, crash_at=None, ckpt_path=None, logger=False, clip=1.0, steps=12, module=None,
         trainer_options=None, **options):
    from lightning.pytorch.callbacks import ModelCheckpoint

    cb = TrainledgerCallback(run, signer=signer, **options)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, enable_progress_bar=False,
                        enable_model_summary=False, logger=TrainledgerLogger(cb) if logger else False,
                        callbacks=[cb, ModelCheckpoint(dirpath=run / "ckpts", every_n_train_steps=5, save_top_k=-1)],
                        log_every_n_steps=1, gradient_clip_val=clip, **(trainer_options or {}))
    trainer.fit(Tiny(crash_at) if module is None else module, ckpt_path=ckpt_path)
    return trainer, cb


class Glitchy(Tiny):
    """Dropout, so a replay check must restore the random state; and a unit that computes wrong once: the loss of
    the ``glitch_at``-th call of training_step off by 2^-20 of itself."""

    def __init__(self, glitch_at=None):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)
        self.calls, self.glitch_at = 0, glitch_at

    def training_step(self, batch, batch_idx):
        self.calls += 1
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(self.drop(x)), y)
        self.log("train_loss", loss)
        return loss * (1 + 2 ** -20) if self.calls == self.glitch_at else loss


def _events(run, tag):
    return [e for e in read_events(run / "journal.jsonl") if type(e).__struct_config__.tag == tag]


def test_the_gradient_norm_is_the_one_before_clipping_read_from_lightnings_own_clip(tmp_path, signer, monkeypatch):
    """With clipping on, the norm is Lightning's own (its clip_grad_norm_ call, wrapped while fitting); without the
    wrapper (a clipping path that does not go through torch) the callback computes it before Lightning clips: the
    same values either way, all far above the clip value, and clip_grad_norm_ is itself again afterwards."""
    from trainledger.training.integrations import lightning as integ

    original = torch.nn.utils.clip_grad_norm_
    _, cb = _fit(tmp_path / "tap", signer, clip=1e-4)
    assert cb._tapped and torch.nn.utils.clip_grad_norm_ is original
    monkeypatch.setattr(integ, "tap_clip", lambda owner: None)
    _, cb2 = _fit(tmp_path / "own", signer, clip=1e-4)
    assert not cb2._tapped
    tapped = [s.grad_norm for s in _events(tmp_path / "tap", "step_observed")]
    own = [s.grad_norm for s in _events(tmp_path / "own", "step_observed")]
    assert len(tapped) == 12 and tapped == pytest.approx(own, rel=1e-6) and min(tapped) > 1e-2


def test_steps_checkpoints_and_metrics_are_journaled(tmp_path, signer, pubkey):
    _fit(tmp_path, signer, logger=True)
    steps = _events(tmp_path, "step_observed")
    assert [s.step for s in steps] == list(range(12)) and all(s.grad_norm > 0 and s.lr > 0 for s in steps)
    saved = _events(tmp_path, "checkpoint_saved")
    assert [c.path for c in saved] == ["ckpts/epoch=0-step=5.ckpt", "ckpts/epoch=0-step=10.ckpt"]
    assert [c.step for c in saved] == [4, 9]
    held = torch.load(tmp_path / saved[0].path, weights_only=True)["trainledger"]["head"]
    seq, _, h = held.partition(":")
    assert any(e.seq == int(seq) and e.h == h for e in read_events(tmp_path / "journal.jsonl"))
    logged = _events(tmp_path, "metrics_logged")
    assert logged and "train_loss" in logged[0].metrics
    (cfg,) = _events(tmp_path, "config_logged")  # save_hyperparameters, through the logger
    assert cfg.config == {"crash_at": None} and cfg.source == "lightning"
    assert verify(tmp_path / "journal.jsonl", keys=[pubkey], require_closed=True).ok
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok


def test_a_crash_is_journaled_and_the_run_resumes_from_a_checked_file(tmp_path, signer, pubkey):
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _fit(tmp_path, signer, crash_at=7)
    (stop,) = _events(tmp_path, "run_stopped")
    assert stop.rule == "exception" and "illegal memory access" in stop.reason
    _fit(tmp_path, signer, ckpt_path=tmp_path / "ckpts" / "epoch=0-step=5.ckpt")
    (resumed,) = _events(tmp_path, "run_resumed")
    assert resumed.from_step == 4 and resumed.checkpoint == "ckpts/epoch=0-step=5.ckpt"
    assert [s.step for s in _events(tmp_path, "step_observed")] == list(range(7)) + list(range(5, 12))
    assert verify(tmp_path / "journal.jsonl", keys=[pubkey], require_closed=True).ok
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok


def test_a_changed_byte_in_the_checkpoint_is_refused(tmp_path, signer):
    with pytest.raises(RuntimeError):
        _fit(tmp_path, signer, crash_at=7)
    f = tmp_path / "ckpts" / "epoch=0-step=5.ckpt"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 1
    f.write_bytes(bytes(b))
    with pytest.raises(ResumeRejected) as e:
        _fit(tmp_path, signer, ckpt_path=f)
    assert e.value.code == "resume-invalid-digest"
    assert _events(tmp_path, "resume_rejected")[0].reason == "resume-invalid-digest"


def test_every_rank_journals_its_steps_under_torchrun(tmp_path):
    """Lightning DDP on 2 ranks under torchrun (gloo): a journal per rank with every step; checkpoints recorded by
    the rank that writes them; each rank's own compute time journaled and rank 1, whose compute takes 3x rank 0's,
    flagged in both straggler windows; the run folder verifies and replays whole."""
    import os
    import subprocess
    import sys

    from trainledger.cli import main
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(HELPERS / "lightning_ddp_worker.py"), str(run), str(priv)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        evs = list(read_events(run / f"rank-0000{rank}.jsonl"))
        assert [e.step for e in evs if type(e).__struct_config__.tag == "step_observed"] == list(range(6))
        saved = [e.path for e in evs if type(e).__struct_config__.tag == "checkpoint_saved"]
        assert saved == (["ckpts/epoch=0-step=3.ckpt", "ckpts/epoch=0-step=6.ckpt"] if rank == 0 else [])
        assert all(e.compute_time_s is not None for e in evs if type(e).__struct_config__.tag == "step_observed")
    zero = list(read_events(run / "rank-00000.jsonl"))
    scores = [e for e in zero if type(e).__struct_config__.tag == "straggler_scores"]
    flagged = [e for e in zero if type(e).__struct_config__.tag == "straggler_detected"]
    assert len(scores) == 2 and all(s.scores["1"] < 0.8 < s.scores["0"] for s in scores), [s.scores for s in scores]
    assert [e.rank for e in flagged] == [1, 1]
    # the replicas' states, fingerprinted every 2 steps and at the checkpoints (the one after step 2 taken by the
    # cadence's) on both ranks, the DDP module's buffers left out: equal
    fps = {r: [(e.step, e.root, e.excluded, e.at) for e in read_events(run / f"rank-0000{r}.jsonl")
               if type(e).__struct_config__.tag == "state_fingerprinted"] for r in (0, 1)}
    assert [(s, at) for s, _, _, at in fps[0]] == [(0, "every"), (2, "every"), (4, "every"), (5, "checkpoint")]
    assert fps[0] == fps[1]
    # steps 0 and 3 run twice on each rank, this rank's own gradients held to each other before the all-reduce
    for r in (0, 1):
        checks = [(e.step, e.ok, e.tensors) for e in read_events(run / f"rank-0000{r}.jsonl")
                  if type(e).__struct_config__.tag == "replay_checked"]
        assert checks == [(0, True, 4), (3, True, 4)], checks
    assert not [e for e in zero if type(e).__struct_config__.tag == "state_diverged"]
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0


def test_a_finished_run_is_continued_in_a_new_folder_linked_to_its_journal(tmp_path, signer, pubkey):
    """As with the Hugging Face callback: the error on the finished folder names continue_from=, and the callback
    takes it: the checkpoint is checked against the previous run's journal and the new journal names that run."""
    from trainledger.journal.errors import UsageError

    old, new = tmp_path / "old", tmp_path / "new"
    _fit(old, signer)
    ckpt = old / "ckpts" / "epoch=0-step=10.ckpt"
    with pytest.raises(UsageError, match="continue_from="):
        _fit(old, signer, steps=15, ckpt_path=ckpt)
    _fit(new, signer, steps=15, ckpt_path=ckpt, continue_from=old)
    link = next(iter(read_events(new / "journal.jsonl"))).meta["continues"]
    assert link["folder"] == "old" and link["head"][0] == verify(old / "journal.jsonl", keys=[pubkey]).head[0]
    (resumed,) = _events(new, "run_resumed")
    assert (resumed.reason, resumed.from_step, resumed.checkpoint) == ("continued", 9, "ckpts/epoch=0-step=10.ckpt")
    assert resumed.detail["continues"]["sha256"] == _events(old, "checkpoint_saved")[-1].sha256
    assert [s.step for s in _events(new, "step_observed")] == list(range(10, 15))
    assert replay(new / "journal.jsonl", keys=[pubkey]).ok
    b = bytearray(ckpt.read_bytes())
    b[len(b) // 2] ^= 1
    ckpt.write_bytes(bytes(b))
    with pytest.raises(ResumeRejected) as e:                      # a changed byte: refused against the old journal
        _fit(tmp_path / "third", signer, steps=15, ckpt_path=ckpt, continue_from=old)
    assert e.value.code == "resume-invalid-digest"
    with pytest.raises(UsageError, match="needs trainer.fit"):     # continue_from= without a checkpoint to go on from
        _fit(tmp_path / "fourth", signer, continue_from=old)


def test_the_callback_takes_what_the_recorder_takes_for_the_compute_statement(tmp_path, signer, pubkey):
    """The device kind, the thresholds watched and the carried FLOPs, as the Recorder takes them: in run_configured
    and in the total (format 1.8), and replay agreeing."""
    _fit(tmp_path, signer, steps=4, compute_thresholds={"tiny": 1e30}, carried_flops=5.0)
    cfg = _events(tmp_path, "run_configured")[0]
    assert (cfg.device_kind, cfg.compute_thresholds["tiny"], cfg.carried_flops) == ("cpu", 1e30, 5.0)
    [total] = _events(tmp_path, "compute_totaled")
    assert total.carried_flops == 5.0 and total.thresholds["tiny"] == 1e30 and total.crossed == []
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok
    with pytest.raises(Exception, match="carried_flops must be a non-negative number"):
        _fit(tmp_path / "bad", signer, steps=2, carried_flops=-1.0)


def test_batch_fingerprint_records_each_steps_batch_and_a_resume_on_other_batches_is_flagged(tmp_path, signer, pubkey):
    """batch_fingerprint=True fingerprints the batch Lightning hands the hook: two runs on the same batches record
    the same numbers. Resumed mid-epoch from a plain DataLoader, Lightning starts the epoch again from its first
    batch, so the redone step 5 trains on batch 0, not batch 5: a data_divergence, and replay agrees."""
    _fit(tmp_path / "a", signer, batch_fingerprint=True)
    _fit(tmp_path / "b", signer, batch_fingerprint=True)
    fa = [s.batch_fingerprint for s in _events(tmp_path / "a", "step_observed")]
    fb = [s.batch_fingerprint for s in _events(tmp_path / "b", "step_observed")]
    assert len(fa) == 12 and None not in fa and fa == fb and len(set(fa)) == 12
    run = tmp_path / "resumed"
    with pytest.raises(RuntimeError):
        _fit(run, signer, crash_at=7, batch_fingerprint=True)
    _fit(run, signer, ckpt_path=run / "ckpts" / "epoch=0-step=5.ckpt", batch_fingerprint=True)
    redone = [s for s in _events(run, "step_observed")][7:]
    assert redone[0].step == 5 and redone[0].batch_fingerprint == fa[0]     # batch 0 again, at step 5
    flagged = [a for a in _events(run, "anomaly_detected") if a.kind == "data_divergence"]
    assert [a.step for a in flagged] == [5]   # one episode: the redone steps that ran before the crash, 5 and 6
    [end] = [e for e in _events(run, "anomaly_ended") if e.anomaly == "data_divergence"]
    assert (end.step, end.last_step, end.steps, end.ended_at) == (5, 6, 2, 7)   # step 7 never ran before
    assert replay(run / "journal.jsonl", keys=[pubkey]).ok


def test_the_fitted_module_is_exported_recorded_and_released_at_fit_end(tmp_path, signer):
    """export_dir= saves the module's weights (safetensors) at the end of fit and records them; with release_key=
    they are released, and verify-model ties them to the run and to the checkpoint of the last step."""
    from trainledger.journal.statements.release.keys import ReleaseKey
    from trainledger.journal.statements.release.verify import verify_model

    key = ReleaseKey.generate()
    key.save(tmp_path / "release.key")
    run = tmp_path / "run"
    _fit(run, signer, steps=10, export_dir=run / "export", release_key=tmp_path / "release.key")
    [exp] = _events(run, "model_exported")
    assert exp.step == 9 and exp.checkpoint is not None and [f["file"] for f in exp.files] == ["model.safetensors"]
    v = verify_model(run / "export", release_keys=[key.public], run_keys=[signer.public], journal=run / "journal.jsonl")
    assert v.final and v.step == 9 and v.compute["steps"] == 10 and v.journal["ok"]


def test_sdc_check_runs_training_step_again_and_stops_a_glitch_before_the_optimizer_step(tmp_path, signer, pubkey):
    """sdc_check=4: steps 0, 4 and 8 run twice (dropout's random state restored, self.log quiet the second time)
    and agree, and the run's weights are bit for bit those of a run without checks. A unit that computes wrong on
    the second pass of step 4 (the 7th call: steps 0 and 1-3 took 5) is caught: replay_checked ok=False on record
    and ReplayMismatch raised before the optimizer stepped (AdamW counted 4 steps), the journal verifying and
    replaying with the mismatch in it."""
    from trainledger.training.distributed.state_watch import ReplayMismatch

    plain, checked = Glitchy(), Glitchy()
    torch.manual_seed(5)  # dropout's masks: the same random stream for both runs
    _fit(tmp_path / "plain", signer, steps=9, module=plain)
    torch.manual_seed(5)
    _fit(tmp_path / "checked", signer, steps=9, module=checked, sdc_check=4)
    checks = [(e.step, e.ok, e.tensors) for e in _events(tmp_path / "checked", "replay_checked")]
    assert checks == [(0, True, 4), (4, True, 4), (8, True, 4)]
    assert checked.calls == 12 and plain.calls == 9
    for a, b in zip(plain.net.state_dict().values(), checked.net.state_dict().values()):
        assert torch.equal(a, b)
    logged = [e.step for e in _events(tmp_path / "checked", "step_observed")]
    assert logged == list(range(9))

    bad = Glitchy(glitch_at=7)
    with pytest.raises(ReplayMismatch, match="step 4: .* differ from the first in net.0.weight") as e:
        _fit(tmp_path / "bad", signer, steps=9, module=bad, sdc_check=4)
    assert e.value.record["ok"] is False and e.value.record["loss"] != e.value.record["loss_again"]
    assert {int(st["step"]) for st in bad.trainer.optimizers[0].state.values()} == {4}
    assert [(c.step, c.ok) for c in _events(tmp_path / "bad", "replay_checked")] == [(0, True), (4, False)]
    assert _events(tmp_path / "bad", "run_stopped")[0].reason.startswith("ReplayMismatch")
    assert replay(tmp_path / "bad" / "journal.jsonl", keys=[pubkey]).ok


def test_sdc_check_refuses_what_it_cannot_compare(tmp_path, signer):
    """Gradient accumulation (a sum of batches) and 16-bit loss scaling: a one-line UsageError before a step."""
    from trainledger.journal.errors import UsageError

    with pytest.raises(UsageError, match="accumulate_grad_batches=2"):
        _fit(tmp_path / "acc", signer, steps=2, sdc_check=4, trainer_options={"accumulate_grad_batches": 2})
    with pytest.raises(UsageError, match="sdc_check must be a whole number"):
        TrainledgerCallback(tmp_path / "x", signer=signer, sdc_check=0)
