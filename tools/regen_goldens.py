#!/usr/bin/env python3
"""Regenerate the signed golden journals under tests/assets/golden/ (review the diff before committing).

    .venv/bin/python tools/regen_goldens.py            # writes every golden that is missing
    .venv/bin/python tools/regen_goldens.py --force    # rewrites them all (new keys, new bytes)

``every_kind_v1_3.jsonl``: one journal in format 1.3 (tree heads in its seals) holding every event kind trainledger defines, consistent
enough that replay finds nothing to object to (the anomalies are the ones its steps imply, the verdict follows
from its bars, the decision from the verdict, the authority gate from a signed approval). Beside it: the public
key (``.pub``; the private key is thrown away) and ``.expect.json``, what verify and replay must keep saying
about it. A golden is never regenerated to make a test pass: a format change that breaks one needs an upcaster.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "assets" / "golden"


def every_kind(path: Path) -> Path:
    from trainledger.journal import Journal, RunResumed, Signer, StepObserved
    from trainledger.training.audit.approval import sign_approval
    from trainledger.journal.events import TailRepaired
    from trainledger.training.health.detectors import HealthProjection
    from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored
    from trainledger.training.kinds import CheckpointDeleted, CheckpointFailed, CheckpointSaved, CheckpointSelected, \
        DataWindowSkipped, DeviceChanged, DeviceSampled, EvaluationRecorded, PreflightCompleted, PreflightGate, \
        ResourceRecorded, ResumeRejectedEvent, RewindDecided, RunConfigured, RunStopped, ShardsSaved, \
        StragglerDetected, StragglerScores, TelemetryUnavailable, WeightsRestored, device_anomaly, MetricsLogged, \
        ConfigLogged
    from trainledger.ladder.kinds import DecisionRecorded, GateVerdict, RungStarted
    from trainledger.ladder.outcome import beta_update, gate

    signer = Signer.generate()
    ident = "sha256:" + "ab" * 32
    sha = "cd" * 32
    from trainledger.journal import FORMAT_VERSION
    from trainledger.training.health.detectors import RANGE_DEFAULTS

    j = Journal.create(path, signer=signer, run_id="golden-every-kind-v" + FORMAT_VERSION.replace(".", "-"),
                       manifest_id=ident, manifest_label="golden", meta={"golden": f"every kind, format {FORMAT_VERSION}"},
                       background=False)
    # the monitor's default rule (format 1.6, "range"): anomaly_ended records the extent of each episode
    config = RunConfigured(n_params=7104, n_layer=2, n_head=2, head_dim=8, seq_len=8, peak_flops_per_sec=1e12,
                           devices=1, loss_window=16, loss_min_periods=4, grad_norm_window=16, grad_norm_min_periods=4,
                           peak_source="measured", peak_spread=0.12, loss_scale="log", **RANGE_DEFAULTS)
    proj = HealthProjection(config)
    j.append(config)

    def observe(ev) -> None:  # as the monitor does: the event, then the anomalies, suspicions and episode ends
        j.append(ev)
        for a in proj.apply(ev):
            j.append(a)
        for x in proj.take_suspected():
            j.append(x)
        for x in proj.take_ended():
            j.append(x)

    losses = [3.0 - 0.01 * i + 0.003 * math.sin(i) for i in range(24)] + [math.nan, 2.75, 30.0, 2.74]
    losses[15] += 0.7  # a lone outlier (z 10 on the log scale) the next step does not confirm: spike_suspected
    for i, loss in enumerate(losses):
        observe(StepObserved(step=i, loss=loss, grad_norm=1.0 + 0.01 * (i % 3), lr=3e-4, step_time_s=0.01,
                             tokens=32, examples=4, supervised_tokens=32, data_time_s=0.001, compute_time_s=0.004))
    j.append(CheckpointSaved(step=19, path="checkpoints/step-000000019.pt", bytes=1234, sha256=sha,
                             contents=["model", "optimizer"], duration_s=0.5, tokens=640), durable=True)
    # 1.6: the weights the run shipped, from that checkpoint (one file, its bytes: the checkpoint's own)
    from trainledger.journal.kinds import ModelExported
    from trainledger.journal.statements.release.manifest import FileDigest, root_digest

    shipped = [FileDigest("config.json", 17, "ef" * 32), FileDigest("model.safetensors", 1234, sha)]
    j.append(ModelExported(path="export", digest=root_digest(shipped), step=19, checkpoint="checkpoints/step-000000019.pt",
                           files=[{"file": f.path, "bytes": f.size, "sha256": f.sha256} for f in shipped]),
             durable=True)
    j.append(ResumeRejectedEvent(path="checkpoints/step-000000019.pt", reason="resume-invalid-missing-state",
                                 missing=["rng"], detail="the checkpoint lacks rng"), durable=True)
    j.append(WeightsRestored(path="checkpoints/step-000000019.pt", step=19, override="fine-tune"), durable=True)
    j.append(CheckpointFailed(step=23, error="OSError: No space left on device"), durable=True)
    j.append(RewindDecided(spike_step=26, anomaly="loss_spike", checkpoint="checkpoints/step-000000019.pt",
                           from_step=19, skip_batches=2, lr_scale=0.5, reason="loss_spike at step 26",
                           max_rewinds=2, window_steps=100), durable=True)
    observe(RunResumed(reason="checkpoint", from_step=19, checkpoint="checkpoints/step-000000019.pt",
                       detail={"sha256": sha, "tokens": 640}))
    j.append(DataWindowSkipped(start_batch=20, end_batch=27), durable=True)
    j.append(CheckpointDeleted(path="checkpoints/step-000000019.pt", step=19, reason="retention: keep_last=1"),
             durable=True)
    for i in range(20, 26):  # each batch's fingerprint (1.4), to hold a step redone after a resume to
        observe(StepObserved(step=i, loss=2.8 - 0.01 * i, grad_norm=1.0, lr=1.5e-4, step_time_s=0.01, tokens=32,
                             batch_fingerprint=i + 0.5))
    observe(RunResumed(reason="crash", from_step=22))
    for i in range(23, 27):  # the loader restarted one batch short: 23 and 24 see other batches (one episode)
        observe(StepObserved(step=i, loss=2.8 - 0.01 * i, grad_norm=1.0, lr=1.5e-4, step_time_s=0.01, tokens=32,
                             batch_fingerprint=i + (0.5 if i > 24 else 0.25)))
    j.append(EvaluationRecorded(hook="heldout", role="target", step=25, checkpoint="checkpoints/step-000000025.pt",
                                checkpoint_sha256=sha, metrics={"loss": 2.5}, cases=8, cases_sha256="ef" * 32,
                                cases_path="evals/" + "ef" * 32 + ".json"), durable=True)
    j.append(CheckpointSelected(rule="min:heldout.loss", checkpoint="checkpoints/step-000000025.pt",
                                checkpoint_sha256=sha, step=25, value=2.5, candidates=1), durable=True)
    j.append(ResourceRecorded(updates=26, examples=104, tokens=832, supervised_tokens=832, wall_s=1.5,
                              durations_s={"train_s": 1.2, "eval_s": 0.3}, peak_rss_bytes=1 << 28,
                              checkpoint_bytes=1234, checkpoint_s=0.5, environment={"python": "3.11"}),
             durable=True)
    j.append(RunStopped(rule="budget-breach", reason="tokens 832 > 800", value=832.0, limit=800.0), durable=True)
    j.append(TailRepaired(offset=4096, length=40, sha256="01" * 32, sidecar="journal.jsonl.torn-4096-010101010101"),
             durable=True)
    approval = sign_approval(Signer.generate(), authority="research-lead", manifest_id=ident, note="golden")
    j.append(PreflightGate(gate="schema", status="passed", reason="the manifest validates", measured={"findings": 0},
                           manifest_id=ident), durable=True)
    j.append(PreflightGate(gate="authority", status="passed", reason="approved by research-lead",
                           measured={"authority": "research-lead", "approval": approval.to_dict()},
                           manifest_id=ident), durable=True)
    j.append(PreflightCompleted(manifest_id=ident, status="ready-to-train"), durable=True)
    j.append(RankJoined(run="golden", rank=0, world_size=2, local_rank=0, node="node-0", restart_count=0,
                        versions={"torch": "2.13.0", "backend": "gloo"}), durable=True)
    j.append(RanksAnchored(heads={"0": f"{j.head[0]}:{j.head[1]}", "1": "12:" + "34" * 32}, step=25), durable=True)
    j.append(AnchorRecorded(rank=0, head="40:" + "56" * 32, step=25), durable=True)
    j.append(ShardsSaved(step=25, path="checkpoints/step-000000025", rank=0, world_size=2,
                         files=[{"file": "__0_0.distcp", "bytes": 1234, "sha256": sha}], metadata_sha256=sha,
                         save_id="2b7e151628aed2a6abf7158809cf4f3c"), durable=True)
    j.append(DeviceSampled(device=0, temp_c=61.0, power_w=412.0, sm_clock_mhz=1980, clock_event_reasons=0,
                           ecc={"corrected_volatile": 3}), durable=True)
    throttled = DeviceChanged(device=0, change="throttle_started", detail={"reasons": 64, "temp_c": 88.0}, step=25)
    j.append(throttled, durable=True)
    j.append(device_anomaly(throttled), durable=True)  # the anomaly it is (1.2), as the sampler records it
    j.append(TelemetryUnavailable(reason="ModuleNotFoundError: No module named 'pynvml'"), durable=True)
    j.append(MetricsLogged(step=25, metrics={"val_loss": 2.5}, source="lightning"), durable=True)
    j.append(ConfigLogged(config={"lr": 3e-4, "layers": [2, 2], "optimizer": {"name": "adamw"}}, source="config",
                          step=25), durable=True)
    j.append(StragglerScores(window_start=0, window_end=9, medians={"0": 0.01, "1": 0.04},
                             scores={"0": 1.0, "1": 0.25}, threshold=0.75, individual={"0": 1.0, "1": 1.0}),
             durable=True)
    j.append(StragglerDetected(rank=1, score=0.25, window_start=0, window_end=9, node="node-1"), durable=True)
    # 1.10: this rank's state fingerprint at step 25, with its digests (the ranks' roots disagreed: rank 1's
    # exp_avg had a flipped bit), and rank 0's verdict: two replicas, no majority, both named
    from trainledger.training.kinds import StateDiverged, StateFingerprinted

    j.append(StateFingerprinted(step=25, root="5e" * 32, tensors=2,
                                digests={"param:w": "0a" * 16, "optim:w:exp_avg": "0b" * 16}), durable=True)
    j.append(StateDiverged(step=25, rank=0, ranks=[0, 1], replicas=2, tensor="optim:w:exp_avg"), durable=True)
    from trainledger.training.kinds import ReplayChecked  # ... and a replay check of step 25's pass, which agreed

    j.append(ReplayChecked(step=25, ok=True, loss="4004cccccccccccd", loss_again="4004cccccccccccd", root="7a" * 32,
                           root_again="7a" * 32, tensors=2), durable=True)
    # 1.10: the time-stamping authority asked for a token over the seal just written could not be reached
    import hashlib

    from trainledger.journal.kinds import TimestampRecorded

    seal_seq, note = j.last_seal_note()
    j.append(TimestampRecorded(seal_seq=seal_seq, note_sha256=hashlib.sha256(note.encode()).hexdigest(),
                               tsa="http://tsa.example/", error="URLError: <urlopen error [Errno 111] Connection "
                                                                "refused>"), durable=True)
    # 1.10: a document about the model issued from the run's lines (trainledger bom): its format, digest, name and
    # the heads it rests on (in a documents journal in practice; here, so that the golden holds every kind)
    from trainledger.journal.kinds import DocumentIssued

    j.append(DocumentIssued(format="cyclonedx", sha256="d0" * 32, name="model.cdx.json",
                            heads={"run": f"{j.head[0]}:{j.head[1]}"}), durable=True)
    _, started_h = j.append(RungStarted(rung="rung_i", real_target="1B params / 8 GPUs", spec={"steps": 26}),
                            durable=True)
    bars = {"max_final_loss": 5.0, "max_forgetting_gap": 1.0, "max_anomalies": 5}
    measured = {"final_loss": 2.55, "forgetting_gap": 0.1, "anomalies": len(proj.anomalies), "mfu_mean": 1e-5}
    passed, reason = gate(bars, measured)
    _, verdict_h = j.append(GateVerdict(rung="rung_i", passed=passed, reason=reason, measured=measured, bars=bars,
                                        artifacts={"skipped_pieces": {"F5": "no cluster here"}}), durable=True)
    a, b = beta_update(1.0, 1.0, passed)
    j.append(DecisionRecorded(rung="rung_i", belief_before={"a": 1.0, "b": 1.0, "mean": 0.5},
                              evidence=[started_h, verdict_h], belief_after={"a": a, "b": b, "mean": a / (a + b)},
                              action_chosen="advance" if passed else "halt_ladder"), durable=True)
    # 1.10: the blow-up and divergence rules, in a segment of their own (a run_configured starts one): a declared
    # chance level of 12, a loss about 2 (a quarter of it and less) that climbs to 4.5 in blocks of two
    # (loss_divergence), blows up to 30 (over twice 12: loss_blowup) and comes back
    from trainledger.training.health.trend import TREND_DEFAULTS

    config = RunConfigured(n_params=7104, n_layer=2, n_head=2, head_dim=8, seq_len=8, peak_flops_per_sec=1e12,
                           devices=1, loss_window=16, loss_min_periods=4, grad_norm_window=16, grad_norm_min_periods=4,
                           loss_scale="log", **RANGE_DEFAULTS, **dict(TREND_DEFAULTS, trend_window=2, chance_loss=12.0))
    proj = HealthProjection(config)
    j.append(config)
    for i, loss in enumerate([1.6, 2.4, 1.6, 2.4, 1.6, 2.4, 1.6, 2.4, 3.0, 3.0, 3.2, 3.2, 4.5, 4.5, 30.0, 2.0],
                             start=27):
        observe(StepObserved(step=i, loss=loss, grad_norm=1.0, lr=3e-4, step_time_s=0.01, tokens=32))
    # ... and an epoch's last, partial batch (8 tokens after 32): its grad norm, 40x the others', is not scored
    observe(StepObserved(step=43, loss=2.0, grad_norm=40.0, lr=3e-4, step_time_s=0.01, tokens=8))
    observe(StepObserved(step=44, loss=2.0, grad_norm=1.0, lr=3e-4, step_time_s=0.01, tokens=32))
    from trainledger.training.health.mfu import record_compute

    record_compute(j)  # 1.3: the training compute of every step above, one figure
    j.close()
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def resumed_rewound(path: Path) -> Path:
    """A real reference-loop run: interrupted at step 50 and resumed, with a poisoned shard that the rewind
    policy skips (checkpoints, retention, a resume, a spike, a rewind, monitor snapshots)."""
    import shutil

    import torch

    from trainledger.journal import Signer
    from trainledger.training.reference.loop import LoopConfig, run_training
    from trainledger.training.checkpoints.rewind import RewindPolicy

    torch.set_num_threads(1)
    signer = Signer.generate()
    run = path.parent / "run"
    cfg = LoopConfig(steps=150, ckpt_every=20, keep_last=3, batch_size=16, lr=1e-2, poison_batches=(120, 126))
    policy = RewindPolicy(lookback_steps=10, skip_batches=30, max_rewinds=2, window_steps=200)
    run_training(run, signer=signer, config=cfg, peak_flops_per_sec=1e12, stop_after=50, rewind=policy)
    run_training(run, signer=signer, config=cfg, peak_flops_per_sec=1e12, rewind=policy)
    shutil.copyfile(run / "journal.jsonl", path)
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def rank_keys(path: Path) -> Path:
    """Format 1.7: rank 1 of a two-rank run signed by ephemeral rank keys certified by one key, across a restart
    (round 0's key, then round 1's, which signs its seals in the background: seals signed late, seal_signed): the
    .pub is the certifying key's."""
    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.journal.certify import RankRoster
    from trainledger.journal.kinds import RankJoined

    issuer = Signer.generate()
    opts = dict(background=False, seal_every=8)
    for rnd in (0, 1):
        keys = [Signer.generate() for _ in range(2)]
        roster = RankRoster.sign(issuer, run="golden-rank-keys", round=rnd, keys=[k.public for k in keys])
        if rnd == 0:
            j = Journal.create(path, signer=keys[1], run_id="golden-rank-keys.r00001", certificate=roster.certificate(1),
                               meta={"run": "golden-rank-keys", "rank": 1, "world_size": 2}, **opts)
        else:
            j = Journal.open_append(path, signer=keys[1], certificate=roster.certificate(1), sign_in_background=True,
                                    **opts)
        j.append(RankJoined(run="golden-rank-keys", rank=1, world_size=2, local_rank=1, node="golden-host",
                            restart_count=rnd, versions={}), durable=True)
        for i in range(20):
            j.append(StepObserved(step=20 * rnd + i, loss=3.0 - 0.01 * (20 * rnd + i)))
            job = j._job
            if job is not None:
                job.done.wait(10)  # each signature back before the next append records it: a fixed shape
        if rnd == 0:
            j.suspend()
    j.close()
    path.with_suffix(".pub").write_text(issuer.public.line() + "\n")
    return path


def compute(path: Path) -> Path:
    """Format 1.7: what the compute statement rests on: a run_configured naming its device kind and the compute
    thresholds it watches (one small enough to cross), steps, device samples with NVML's energy counter (one fall: a
    reset), the threshold crossed at its step, and the compute_totaled with time, hardware and energy."""
    from trainledger.journal import Journal, Signer
    from trainledger.training.kinds import DeviceSampled
    from trainledger.training.health.flops import FlopConfig
    from trainledger.training.health.mfu import record_compute
    from trainledger.training.health.monitor import TrainingHealthMonitor

    signer = Signer.generate()
    shape = FlopConfig(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16, seq_len=64)
    fpt = 6 * 1_000_000 + 12 * 2 * 4 * 16 * 64
    with Journal.create(path, signer=signer, run_id="golden-compute", background=False, seal_every=32) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=shape, peak_flops_per_sec=1e12, peak_source="given",
                                  device_kind="Golden GPU", compute_thresholds={"small": 25 * 512 * fpt})
        energy = [0, 1000, 2000, 500, 1500, 2500]
        for s in range(60):
            m.observe_step(s, 3.0 - 0.01 * s, grad_norm=1.0, step_time_s=0.002, tokens=512)
            if s % 10 == 0:
                j.append(DeviceSampled(device=0, power_w=300.0, energy_mj=energy[s // 10]))
        record_compute(j)
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def ladder_halt(path: Path) -> Path:
    """The pilot ladder's halt preset: a rung that passes, then one with an impossible bar, and the halt."""
    from trainledger.journal import Journal, Signer
    from trainledger.ladder.presets import PRESETS
    from trainledger.ladder.runner import run_pilot_ladder

    signer = Signer.generate()
    with Journal.create(path, signer=signer, meta={"preset": "halt"}) as j:
        run_pilot_ladder(PRESETS["halt"](), peak_flops_per_sec=1e9, journal=j, work_dir=path.parent / "rungs")
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def ladder_closed(path: Path) -> Path:
    """Format 1.7: the halt preset closed as ``trainledger ladder`` closes its own journal, with its compute_totaled
    (time in steps, the hardware with the peak, the span): the main job's kind of journal, for its compute
    statement."""
    from trainledger.journal import Journal, Signer
    from trainledger.ladder.presets import PRESETS
    from trainledger.ladder.runner import run_pilot_ladder
    from trainledger.training.health.mfu import record_compute

    signer = Signer.generate()
    with Journal.create(path, signer=signer, meta={"preset": "halt"}) as j:
        run_pilot_ladder(PRESETS["halt"](), peak_flops_per_sec=1e9, journal=j, work_dir=path.parent / "rungs")
        record_compute(j)
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def scaling_ladder(path: Path) -> Path:
    """The scaling preset at a quarter of its pilots' steps: six pilots with held-out losses, F5's fit and the
    headline it sized (scaling_fitted), the headline's interval gate."""
    import dataclasses

    import torch

    from trainledger.journal import Journal, Signer
    from trainledger.ladder.presets import PRESETS
    from trainledger.ladder.runner import run_pilot_ladder

    torch.set_num_threads(1)
    rungs = [dataclasses.replace(r, steps=max(20, r.steps // 4)) if not r.exercise_scaling_law_fit else r
             for r in PRESETS["scaling"]()]
    signer = Signer.generate()
    with Journal.create(path, signer=signer, meta={"preset": "scaling, pilots at a quarter of their steps"}) as j:
        run_pilot_ladder(rungs, peak_flops_per_sec=1e10, journal=j, work_dir=path.parent / "rungs")
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def experiment(path: Path) -> Path:
    """The example experiment (trainledger manifest init): the manifest-driven loop to its end, with its
    evaluations, resource records and preregistered checkpoint selection."""
    import shutil

    import torch

    from trainledger.journal import Signer
    from trainledger.training.experiment.loop import run_experiment, write_example
    from trainledger.training.experiment.manifest import load_findings

    torch.set_num_threads(1)
    signer = Signer.generate()
    d = path.parent / "exp"
    m, _ = load_findings(write_example(d))
    out = run_experiment(m, d, d / "run", signer=signer)
    assert out["stopped"] is None, out
    shutil.copyfile(d / "run" / "journal.jsonl", path)
    path.with_suffix(".pub").write_text(signer.public.line() + "\n")
    return path


def expectations(path: Path) -> dict:
    """What verify and replay say about a golden, in a form that does not depend on where it is checked out."""
    from trainledger.journal import load_public_key, verify
    from trainledger.audit import replay

    keys = [load_public_key(path.with_suffix(".pub"))]
    v = verify(path, keys=keys, require_closed=True)
    rec = replay(path, keys=keys)
    return {"events": v.events, "kinds": dict(sorted(v.kinds.items())), "head": v.head, "replay_ok": rec.ok,
            "differences": rec.differences, "anomalies_by_kind": rec.anomalies_by_kind, "ladder": rec.ladder,
            "steps": rec.health["steps"] if rec.health else None}


#: The goldens this code can write. Older ones (every_kind_v1.jsonl: format 1.0, before spike_suspected and the
#: peak's provenance) are frozen: no builder, never rewritten, and they must keep verifying and replaying.
# every_kind_v1.jsonl (1.0), every_kind_v1_1.jsonl (1.1), every_kind_v1_2.jsonl (1.2), every_kind_v1_3.jsonl (1.3)
# every_kind_v1_6.jsonl (1.6) and every_kind_v1_9.jsonl (1.9) are frozen: this code writes the current format.
GOLDENS = {"every_kind_v1_10.jsonl": every_kind, "resumed_rewound_v1_1.jsonl": resumed_rewound,
           "ladder_halt_v1_1.jsonl": ladder_halt, "experiment_v1_1.jsonl": experiment,
           "scaling_ladder_v1_2.jsonl": scaling_ladder, "rank_keys_v1_7.jsonl": rank_keys,
           "compute_v1_7.jsonl": compute, "ladder_closed_v1_7.jsonl": ladder_closed}


#: the reference model's loss curve (torchtitan keeps its loss curves the same way): a change that moves every
#: run of the reference loop, the control of a comparison included, shows here as a diff to review
LOSS_CURVE = GOLDEN / "reference_losses.json"


def reference_losses() -> dict:
    """The reference loop (``LoopConfig()``: the tiny causal LM on the Markov corpus, 60 steps) trained in one
    thread, and its loss at every step; the test holds a fresh run to it."""
    import torch

    from trainledger.journal import Signer
    from trainledger.training.reference.loop import LoopConfig, run_training

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a reduction's order depends on the thread count
    try:
        with tempfile.TemporaryDirectory() as d:
            res = run_training(Path(d) / "run", signer=Signer.generate(), config=LoopConfig())
    finally:
        torch.set_num_threads(threads)
    return {"what": "tools/regen_goldens.py --loss-curve: the reference loop, LoopConfig(), one thread",
            "config": dataclasses.asdict(LoopConfig()), "torch": torch.__version__, "losses": res["losses"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rewrite goldens that exist (new keys, new bytes)")
    ap.add_argument("--only", metavar="NAME", help="just this golden (e.g. every_kind_v1_2.jsonl)")
    ap.add_argument("--loss-curve", action="store_true",
                    help="rewrite the reference model's loss curve (tests/assets/golden/reference_losses.json)")
    args = ap.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    if args.loss_curve:
        curve = reference_losses()
        LOSS_CURVE.write_text(json.dumps(curve, indent=1) + "\n")
        print(f"wrote {LOSS_CURVE.relative_to(ROOT)}: {len(curve['losses'])} steps, last loss {curve['losses'][-1]:.6f}")
        return 0
    for name, build in GOLDENS.items():
        if args.only and name != args.only:
            continue
        target = GOLDEN / name
        if target.exists() and not args.force:
            print(f"kept {target.relative_to(ROOT)} (exists; --force rewrites it)")
            continue
        with tempfile.TemporaryDirectory() as d:
            built = build(Path(d) / name)
            target.write_bytes(built.read_bytes())
            target.with_suffix(".pub").write_bytes(built.with_suffix(".pub").read_bytes())
        exp = expectations(target)
        target.with_suffix(".expect.json").write_text(json.dumps(exp, indent=1, sort_keys=True) + "\n")
        print(f"wrote {target.relative_to(ROOT)}: {exp['events']} events, replay ok={exp['replay_ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
