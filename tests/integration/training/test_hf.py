"""The Hugging Face Trainer callback, with the real transformers Trainer and a tiny GPT-2 built from a config
(nothing downloaded): every step journaled, checkpoint folders digested file by file, a resume checked before
the first step, a changed byte refused, and a NaN stopping the run."""

from __future__ import annotations

import json

from pathlib import Path

import pytest
import torch

HELPERS = Path(__file__).resolve().parents[2] / "helpers"  # the torchrun workers

transformers = pytest.importorskip("transformers")

from trainledger.journal import read_events, verify  # noqa: E402
from trainledger.audit import replay  # noqa: E402
from trainledger.training.checkpoints.state import ResumeRejected  # noqa: E402
from trainledger.training.integrations.hf import TrainledgerCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, t: int = 16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 64, (n, t), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _trainer(out, signer, *, steps=12, callbacks=(), continue_from=None, batch_fingerprint=False, callback=None,
             data=None, trainer_class=None, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, save_steps=5,
                             logging_steps=5, report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                             learning_rate=1e-3, **kw)
    cb = TrainledgerCallback(signer=signer, continue_from=continue_from, batch_fingerprint=batch_fingerprint,
                             **(callback or {}))
    return (trainer_class or Trainer)(model=model, args=args, train_dataset=data or Tokens(),
                                      callbacks=[cb, *callbacks]), cb


def _events(out, tag):
    return [e for e in read_events(out / "journal.jsonl") if type(e).__struct_config__.tag == tag]


@pytest.mark.parametrize("max_grad_norm, tap", [(1e-3, True), (0.0, True), (1e-3, False)])
def test_the_gradient_norm_is_the_trainers_own_before_clipping(tmp_path, signer, max_grad_norm, tap, monkeypatch):
    """Each step's grad_norm is the pre-clip norm the Trainer logs (logging_steps=1), whether it clips hard
    (1e-3: every step clipped) or not at all, read from the Trainer's own clip call or (tap off: a Trainer that
    clips another way) computed by the per-parameter hooks; the wrapped clip_grad_norm_ is gone after the run."""
    from trainledger.training.integrations import hf

    if not tap:
        monkeypatch.setattr(hf, "tap_clip", lambda cb: None)
    from accelerate import Accelerator

    original, accelerated = torch.nn.utils.clip_grad_norm_, Accelerator.clip_grad_norm_
    trainer, cb = _trainer(tmp_path, signer, steps=8, max_grad_norm=max_grad_norm)
    trainer.args.logging_steps = 1
    trainer.train()
    steps = _events(tmp_path, "step_observed")
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(logged) == len(steps) == 8
    assert [s.grad_norm for s in steps] == pytest.approx(logged, rel=1e-6)
    # tapped: read from the Trainer's own clip call (accelerate from 1.16 clips without torch's clip_grad_norm_)
    assert all(g > 100 * max_grad_norm for g in logged) and cb._tapped == tap
    assert torch.nn.utils.clip_grad_norm_ is original and Accelerator.clip_grad_norm_ is accelerated


def test_every_step_is_journaled_and_checkpoint_folders_are_digested(tmp_path, signer, pubkey):
    trainer, _ = _trainer(tmp_path, signer)
    trainer.train()
    steps = _events(tmp_path, "step_observed")
    assert [s.step for s in steps] == list(range(12))
    assert all(s.grad_norm > 0 and s.lr > 0 and s.tokens == 64 and s.step_time_s > 0 for s in steps)
    # per step, not the logging window: the Trainer's logged mean over steps 0-4 is the mean of ours
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert logged[0] == pytest.approx(sum(s.loss for s in steps[:5]) / 5, rel=1e-4)
    # every number the Trainer logged is in the journal too, at the step it was logged after
    metrics = _events(tmp_path, "metrics_logged")
    assert {m.source for m in metrics} == {"hf"} and len(metrics) == len(trainer.state.log_history)
    for m, h in zip(metrics, trainer.state.log_history):
        assert m.step == h["step"] - 1
        assert m.metrics == {k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and k != "step"}
    (cfg,) = _events(tmp_path, "run_configured")
    assert (cfg.n_params, cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.seq_len) == (27520, 2, 2, 16, 16)
    opened = _events(tmp_path, "run_opened")[0]
    assert opened.meta["training_args"]["output_dir"].startswith("<abs>/")  # no absolute path on record
    saved = _events(tmp_path, "checkpoint_saved")
    assert [c.path for c in saved] == ["checkpoint-5", "checkpoint-10", "checkpoint-12"]
    files = {f["file"] for f in saved[0].files}
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "trainledger-monitor.pt"} <= files
    assert {"model", "optimizer", "scheduler", "rng", "counters"} <= set(saved[0].contents)
    assert verify(tmp_path / "journal.jsonl", keys=[pubkey], require_closed=True).ok
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok


def test_an_epochs_last_partial_batch_is_left_out_of_the_spike_rules(tmp_path, signer, pubkey):
    """17 sequences in batches of 4: each epoch ends on a batch of 1 (16 tokens after 64). The callback journals
    each step's own tokens, so the monitor leaves those steps out of the spike rules, and replay agrees."""
    trainer, cb = _trainer(tmp_path, signer, data=Tokens(n=17))
    trainer.train()
    steps = _events(tmp_path, "step_observed")
    assert [s.step for s in steps if s.tokens == 16] == [4, 9] and {s.tokens for s in steps} == {16, 64}
    assert _events(tmp_path, "run_configured")[0].partial_batch == 0.5
    assert cb.monitor.report()["partial_batches"] == 2
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).health["partial_batches"] == 2


class Crash(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 7:
            raise KeyboardInterrupt  # the process dies after step 7 (checkpoint-5 is on record)


def test_a_resume_is_checked_before_the_first_step_and_a_changed_byte_refused(tmp_path, signer, pubkey):
    trainer, cb = _trainer(tmp_path, signer, callbacks=[Crash()])
    cb.buffer.every = 1  # every step on record before the crash (by default a dying process loses <= 16 steps / 0.2 s)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    cb.journal.suspend()  # the process died: its journal stays open, unsealed steps set aside on reopening
    trainer, _ = _trainer(tmp_path, signer)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-5"))
    (resumed,) = _events(tmp_path, "run_resumed")
    assert resumed.from_step == 4 and resumed.checkpoint == "checkpoint-5"
    steps = [s.step for s in _events(tmp_path, "step_observed")]
    assert steps == list(range(7)) + list(range(5, 12))  # steps 5 and 6 ran twice: before the crash, and after
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok
    # query's timeline: each step once, as the run finally took it (5 and 6 from after the resume)
    from trainledger.journal.views.query import open_views

    con, _ = open_views([tmp_path / "journal.jsonl"], keys=[pubkey], use_cache=False)
    rows = con.execute("SELECT t.step, t.seq > r.seq FROM timeline t, resumes r ORDER BY t.step").fetchall()
    assert [r[0] for r in rows] == list(range(12)) and [r[1] for r in rows] == [False] * 5 + [True] * 7

    # Another run, crashed likewise; then a byte of its checkpoint's optimizer state changes.
    other = tmp_path / "other"
    trainer, cb = _trainer(other, signer, callbacks=[Crash()])
    cb.buffer.every = 1
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    cb.journal.suspend()
    f = other / "checkpoint-5" / "optimizer.pt"
    b = bytearray(f.read_bytes())
    b[-10] ^= 1
    f.write_bytes(bytes(b))
    trainer, _ = _trainer(other, signer)
    with pytest.raises(ResumeRejected) as e:
        trainer.train(resume_from_checkpoint=str(other / "checkpoint-5"))
    assert e.value.code == "resume-invalid-digest" and "optimizer.pt" in str(e.value)
    assert _events(other, "resume_rejected")[0].reason == "resume-invalid-digest"
    assert not [s for s in _events(other, "step_observed") if s.step > 6]  # not one step after the refusal


def test_a_finished_run_is_continued_in_a_new_folder_linked_to_its_journal(tmp_path, signer, pubkey):
    old, new = tmp_path / "old", tmp_path / "new"
    trainer, _ = _trainer(old, signer)
    trainer.train()  # finished: its journal is closed
    trainer, _ = _trainer(old, signer)
    with pytest.raises(Exception, match="continue_from"):  # the same folder: finished, and it says what to do
        trainer.train(resume_from_checkpoint=str(old / "checkpoint-10"))
    trainer, _ = _trainer(new, signer, steps=15, continue_from=old)
    trainer.train(resume_from_checkpoint=str(old / "checkpoint-10"))
    opened = next(iter(read_events(new / "journal.jsonl")))
    link = opened.meta["continues"]
    assert link["checkpoint"] == "checkpoint-10" and link["head"][0] == verify(old / "journal.jsonl", keys=[pubkey]).head[0]
    (resumed,) = _events(new, "run_resumed")
    assert (resumed.reason, resumed.from_step, resumed.detail["continues"]["folder"]) == ("continued", 9, "old")
    assert [s.step for s in _events(new, "step_observed")] == list(range(10, 15))
    assert replay(new / "journal.jsonl", keys=[pubkey]).ok
    # the previous run's compute counts toward this run's thresholds, as a Recorder's continued run counts it
    [old_total] = _events(old, "compute_totaled")
    assert _events(new, "run_configured")[0].carried_flops == old_total.flops > 0


def test_the_callback_takes_what_the_recorder_takes_for_the_compute_statement(tmp_path, signer, pubkey):
    """The device kind, the thresholds watched and the carried FLOPs of a fine-tune's base: in run_configured, a
    threshold crossed on record, the total's crossings (format 1.8), and replay agreeing."""
    trainer, _ = _trainer(tmp_path, signer, steps=4, callback=dict(compute_thresholds={"tiny": 1.0}, carried_flops=5.0,
                                                                   peak_flops_per_sec=1e12))
    trainer.train()
    cfg = _events(tmp_path, "run_configured")[0]
    assert (cfg.device_kind, cfg.compute_thresholds["tiny"], cfg.carried_flops) == ("cpu", 1.0, 5.0)
    assert cfg.peak_flops_per_sec == 1e12
    assert [c.name for c in _events(tmp_path, "compute_threshold_crossed")] == ["tiny"]
    [total] = _events(tmp_path, "compute_totaled")
    assert total.crossed == ["tiny"] and total.carried_flops == 5.0 and total.hardware[0]["device_kind"] == "cpu"
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok


class Poison(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 3:
            with torch.no_grad():
                model.transformer.wte.weight.fill_(float("nan"))


def test_a_nan_stops_the_run_through_the_trainer(tmp_path, signer, pubkey):
    trainer, cb = _trainer(tmp_path, signer, steps=60, callbacks=[Poison()])
    trainer.train()
    # stopped within a batch of the monitor (16 steps) after the first NaN step, not at 60
    assert 4 <= trainer.state.global_step <= 4 + 16
    (stop,) = _events(tmp_path, "run_stopped")
    assert stop.rule == "stop_on:nan_loss" and "step 3" in stop.reason
    closed = _events(tmp_path, "run_closed")[0]
    assert closed.status == "stopped"
    assert replay(tmp_path / "journal.jsonl", keys=[pubkey]).ok
    json.dumps(cb.monitor.report())


def test_every_rank_journals_its_steps_under_torchrun(tmp_path):
    """The Trainer on 2 ranks (torchrun, gloo, DDP on the CPU): one journal per rank, every step on each, the
    checkpoints recorded by the rank that writes them; rank 1, whose compute takes 3x rank 0's, flagged in both straggler
    windows; the run folder verifies and replays whole."""
    import os
    import subprocess
    import sys

    from trainledger.cli import main
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(HELPERS / "hf_ddp_worker.py"), str(out), str(priv)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        evs = list(read_events(out / f"rank-0000{rank}.jsonl"))
        steps = [e.step for e in evs if type(e).__struct_config__.tag == "step_observed"]
        assert steps == list(range(6)), (rank, steps)
        saved = [e.path for e in evs if type(e).__struct_config__.tag == "checkpoint_saved"]
        assert saved == (["checkpoint-3", "checkpoint-6"] if rank == 0 else [])
        assert all(e.compute_time_s is not None for e in evs if type(e).__struct_config__.tag == "step_observed")
    zero = list(read_events(out / "rank-00000.jsonl"))
    scores = [e for e in zero if type(e).__struct_config__.tag == "straggler_scores"]
    assert len(scores) == 2 and all(s.scores["1"] < 0.8 < s.scores["0"] for s in scores), [s.scores for s in scores]
    assert [e.rank for e in zero if type(e).__struct_config__.tag == "straggler_detected"] == [1, 1]
    # the replicas' states, fingerprinted every 2 steps and before each save (the one after step 2 taken by the
    # cadence's) on both ranks: equal
    fps = {r: [(e.step, e.root, e.at) for e in read_events(out / f"rank-0000{r}.jsonl")
               if type(e).__struct_config__.tag == "state_fingerprinted"] for r in (0, 1)}
    assert [(s, at) for s, _, at in fps[0]] == [(0, "every"), (2, "every"), (4, "every"), (5, "checkpoint")]
    assert fps[0] == fps[1]
    # steps 0 and 3 run twice on each rank (dropout's random state restored), this rank's own gradients held to
    # each other before the all-reduce
    checks = {r: [(e.step, e.ok, e.tensors) for e in read_events(out / f"rank-0000{r}.jsonl")
                  if type(e).__struct_config__.tag == "replay_checked"] for r in (0, 1)}
    assert [(s, ok) for s, ok, _ in checks[0]] == [(0, True), (3, True)] and checks[0][0][2] > 10
    assert [(s, ok) for s, ok, _ in checks[1]] == [(0, True), (3, True)]
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(out)]) == 0
    assert main(["replay", "--pubkey", str(pub), str(out)]) == 0


def test_batch_fingerprint_is_taken_from_the_batch_the_trainer_hands_the_model(tmp_path, signer, pubkey):
    """batch_fingerprint=True: every step records the fingerprint of the tensors the Trainer passed the model
    (input_ids, labels; summed over micro-batches), one number a step, another for every other batch."""
    trainer, _ = _trainer(tmp_path / "a", signer, steps=8, batch_fingerprint=True)
    trainer.train()
    trainer, _ = _trainer(tmp_path / "b", signer, steps=8, batch_fingerprint=True, gradient_accumulation_steps=2)
    trainer.train()
    one = [s.batch_fingerprint for s in _events(tmp_path / "a", "step_observed")]
    two = [s.batch_fingerprint for s in _events(tmp_path / "b", "step_observed")]
    assert len(one) == 8 and None not in one and len(set(one)) == 8 and None not in two
    assert two[0] != one[0]                    # two micro-batches a step: their sum, not the first batch's alone
    assert replay(tmp_path / "a" / "journal.jsonl", keys=[pubkey]).ok


def test_sdc_check_runs_the_trainers_step_again_and_stops_a_glitch_before_the_optimizer_step(tmp_path, signer, pubkey):
    """ReplayCheckTrainer with sdc_check=4: steps 0, 4 and 8 run twice (GPT-2's dropout: the random state restored)
    and agree; every step journaled once, the weights bit for bit those of a plain Trainer's run. A forward pass
    that computes wrong once (the 7th call: the second pass of step 4) is caught: replay_checked ok=False, and
    ReplayMismatch raised before the optimizer stepped (AdamW counted 4 steps); the journal verifies and replays."""
    from trainledger.journal.errors import UsageError
    from trainledger.training.distributed.state_watch import ReplayMismatch
    from trainledger.training.integrations.hf import ReplayCheckTrainer
    from trainledger.training.integrations.hooks import _tap

    plain, _ = _trainer(tmp_path / "plain", signer, steps=9)
    plain.train()
    checked, _ = _trainer(tmp_path / "checked", signer, steps=9, callback={"sdc_check": 4},
                          trainer_class=ReplayCheckTrainer)
    checked.train()
    checks = [(e.step, e.ok) for e in _events(tmp_path / "checked", "replay_checked")]
    assert checks == [(0, True), (4, True), (8, True)]
    assert [e.step for e in _events(tmp_path / "checked", "step_observed")] == list(range(9))
    steps = {e.step: e for e in _events(tmp_path / "checked", "step_observed")}
    plain_steps = {e.step: e for e in _events(tmp_path / "plain", "step_observed")}
    assert all(steps[s].tokens == plain_steps[s].tokens == 64 and steps[s].loss == plain_steps[s].loss
               and steps[s].grad_norm == plain_steps[s].grad_norm for s in range(9))
    for a, b in zip(plain.model.state_dict().values(), checked.model.state_dict().values()):
        assert torch.equal(a, b)

    bad, _ = _trainer(tmp_path / "bad", signer, steps=9, callback={"sdc_check": 4}, trainer_class=ReplayCheckTrainer)
    calls = []

    def glitch(module, args, output):
        calls.append(1)
        if len(calls) == 7:
            output.logits.mul_(1 + 2 ** -20)
            output.loss = output.loss * (1 + 2 ** -20)

    bad.model.register_forward_hook(glitch)
    with pytest.raises(ReplayMismatch, match="step 4: .* differ from the first"):
        bad.train()
    assert {int(st["step"]) for st in bad.optimizer.state.values()} == {4}
    assert [(c.step, c.ok) for c in _events(tmp_path / "bad", "replay_checked")] == [(0, True), (4, False)]
    assert _events(tmp_path / "bad", "run_stopped")[0].reason.startswith("ReplayMismatch")
    assert _tap["listener"] is None and _tap["original"] is None  # clip_grad_norm_ itself again
    assert replay(tmp_path / "bad" / "journal.jsonl", keys=[pubkey]).ok

    plain_sdc, _ = _trainer(tmp_path / "nomixin", signer, steps=2, callback={"sdc_check": 4})
    with pytest.raises(UsageError, match="ReplayCheckTrainer"):
        plain_sdc.train()
    assert not (tmp_path / "nomixin" / "journal.jsonl").exists()
    acc, _ = _trainer(tmp_path / "acc", signer, steps=2, callback={"sdc_check": 4}, trainer_class=ReplayCheckTrainer,
                      gradient_accumulation_steps=2)
    with pytest.raises(UsageError, match="gradient_accumulation_steps=2"):
        acc.train()


def test_gradient_checkpointing_is_declared_and_its_measured_ratio_recorded(tmp_path, signer):
    """A Trainer with gradient checkpointing on: run_configured declares the recomputation ("full") and records the
    ratio measured on the real model beforehand (measure_recompute_ratio, the Trainer's own checkpointing toggles),
    and the training goes on as it would."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainledger.journal.errors import UsageError
    from trainledger.training.health.flops import measure_recompute_ratio
    from trainledger.training.kinds import RunConfigured

    probe = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    probe.train()
    ids = Tokens(n=4).x
    kw = {"use_reentrant": False}
    new = hasattr(probe, "activation_checkpointing_enable")  # transformers 5 renamed gradient_ to activation_
    name = "activation" if new else "gradient"
    getattr(probe, f"{name}_checkpointing_enable")(**{f"{name}_checkpointing_kwargs": kw})
    ratio = measure_recompute_ratio(probe, lambda: probe(input_ids=ids, labels=ids).loss.backward(), checkpointing=(
        lambda on: getattr(probe, f"{name}_checkpointing_enable")(**{f"{name}_checkpointing_kwargs": kw}) if on
        else getattr(probe, f"{name}_checkpointing_disable")()))
    assert 1.1 < ratio < 4 / 3 + 1e-9
    trainer, cb = _trainer(tmp_path / "ckpt", signer, steps=3, callback={"recompute_ratio": ratio},
                           **{f"{name}_checkpointing": True, f"{name}_checkpointing_kwargs": kw})
    trainer.train()
    (cfg,) = [e for e in read_events(tmp_path / "ckpt" / "journal.jsonl") if isinstance(e, RunConfigured)]
    assert (cfg.recompute, cfg.recompute_ratio, cfg.attention_convention) == ("full", ratio, "full")
    with pytest.raises(UsageError, match="recompute_ratio"):
        TrainledgerCallback(signer=signer, recompute_ratio=0.5)
