"""run_pilot_ladder: train each rung, gate it on its own receipts, record a decision, halt on a failure.

Every verdict and decision is a sealed, durable journal event, and the
:class:`LadderResult` is a projection of those events (:class:`LadderProjection`),
so the live result and one rebuilt from the journal are the same object.

The belief model of the decision entries: a Beta(a, b) posterior over "the
next rung clears its bar", starting at Beta(1, 1) (uniform) and updated by
each verdict (a += 1 on a pass, b += 1 on a failure); the entry records a and
b before and after and the posterior mean. The action is "advance" after a
pass and "halt_ladder" after a failure: the gate decides, the belief is
what a reviewer reads to see how much evidence the ladder has accumulated.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainledger.journal import Journal, Signer
from trainledger.ladder.kinds import DecisionRecorded, GateVerdict, RungStarted
from trainledger.training.health.mfu import MfuAccounting, record_compute
from trainledger.ladder.outcome import LadderProjection, LadderResult, RungOutcome, decide, gate
from trainledger.training.checkpoints.state import restore_checkpoint, save_checkpoint
from trainledger.training.reference.corpus import BatchSampler, MarkovSource
from trainledger.training.health.flops import device_kind, flop_config_from_causal_lm, measure_recompute_ratio
from trainledger.training.reference.loop import train_step
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor

from trainledger.ladder.pieces import SKIPPED_REASONS, moe_vs_dense, refuse_unavailable, transfer_lr
from trainledger.ladder.rung import Rung

#: seconds between the progress lines within a rung
PROGRESS_EVERY_S = 10.0

__all__ = ["run_pilot_ladder", "LadderResult", "RungOutcome", "LadderProjection", "GateVerdict", "DecisionRecorded"]


def _train_rung(rung: Rung, j: Journal, work: Path, peak: float | None, peak_info: dict[str, Any], *,
                progress: Callable[[int, float], None] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    torch.manual_seed(rung.seed)
    artifacts: dict[str, Any] = {}
    lr = rung.lr
    if rung.exercise_mup_transfer:
        lr = transfer_lr(rung.lr, rung.mup_base_width, rung.d_model)
        artifacts["F9_mup_transfer"] = {"base_lr": rung.lr, "base_width": rung.mup_base_width,
                                        "target_width": rung.d_model, "transferred_lr": lr}

    def build():
        torch.manual_seed(rung.seed)
        model = build_causal_lm(rung.vocab, rung.d_model, rung.n_layer, rung.n_head, rung.block)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=rung.weight_decay)
        sampler = BatchSampler(_corpus(rung.vocab, rung.seed, rung.corpus_tokens, rung.seed + 1),
                               rung.batch_size, rung.block, seed=rung.seed + 2)
        return model, opt, sampler

    model, opt, sampler = build()
    # The first data the rung sees (a second sampler with the same seed draws the same batch), re-measured after
    # every step for the forgetting curve; and, once before training, its executed over model FLOPs (format 1.10:
    # the model recomputes nothing, and FlopCounterMode shows it; no weight, gradient or random state changes)
    first_x, first_y = BatchSampler(sampler.tokens, rung.batch_size, rung.block, seed=rung.seed + 2).next()
    ratio = measure_recompute_ratio(model, lambda: torch.nn.functional.cross_entropy(
        model(first_x).flatten(0, 1), first_y.flatten()).backward())
    flops = dataclasses.replace(flop_config_from_causal_lm(model, seq_len=rung.block), recompute_ratio=ratio)
    monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak, device_kind=device_kind(model),
                                     **peak_info)
    mfu_of = MfuAccounting(monitor.config)  # the MFU the monitor records, step by step
    forgetting: list[float] = []
    losses: list[float] = []
    mfu_series: list[float] = []
    t_start = time.perf_counter()
    kill_at = rung.steps // 2 if rung.exercise_fault_tolerance else None
    step = 0
    shown = time.perf_counter()
    while step < rung.steps:
        t0 = time.perf_counter()
        x, y = sampler.next()
        loss, gn = train_step(model, opt, x, y, max_grad_norm=1e9)
        losses.append(loss)
        dt = time.perf_counter() - t0
        m = mfu_of.step(rung.batch_size * rung.block, None, dt)
        if m is not None:
            mfu_series.append(m)
        monitor.observe_step(step, losses[-1], grad_norm=gn, step_time_s=dt,
                             batch_size=rung.batch_size, tokens=rung.batch_size * rung.block, lr=lr)
        model.eval()
        with torch.no_grad():
            forgetting.append(torch.nn.functional.cross_entropy(model(first_x).flatten(0, 1),
                                                                first_y.flatten()).item())
        if kill_at is not None and step == kill_at:
            # F2: checkpoint, drop every live object as a killed process would, come back from the file.
            ck = save_checkpoint(work, j, step=step, model=model, optimizer=opt, sampler=sampler,
                                 extra={"monitor": monitor.state()})
            del model, opt, sampler
            model, opt, sampler = build()
            info = restore_checkpoint(work, j, ck.path, model=model, optimizer=opt, sampler=sampler)
            monitor = TrainingHealthMonitor.resumed(info["extra"]["monitor"], journal=j, checkpoint=ck)
            kill_at = None
        if progress is not None and time.perf_counter() - shown >= PROGRESS_EVERY_S:
            shown = time.perf_counter()
            progress(step, losses[-1])
        step += 1
    report = monitor.report()
    wall = time.perf_counter() - t_start
    if rung.exercise_moe_decision:
        artifacts["H2_moe_vs_dense"] = moe_vs_dense(model, first_x, rung.moe_experts, rung.moe_max_relative_diff,
                                                    seed=rung.seed)
    skipped = {p: SKIPPED_REASONS[p] for p in rung.decision_pieces if p in SKIPPED_REASONS}
    artifacts["skipped_pieces"] = skipped
    artifacts["loss_curve"] = [round(x, 6) for x in losses]
    artifacts["forgetting_curve"] = [round(x, 6) for x in forgetting]
    artifacts["mfu_series"] = mfu_series
    measured = {
        "final_loss": losses[-1] if math.isfinite(losses[-1]) else math.inf,
        "forgetting_gap": forgetting[-1] - min(forgetting),
        "mfu_mean": report["mfu"]["mean"], "mfu_samples": report["mfu"]["count"],
        "anomalies": report["anomalies"], "flops": flops.flops_per_iter(rung.batch_size) * rung.steps,
        "wall_s": wall,
    }
    if rung.exercise_fault_tolerance:
        measured["continuity_ok"] = report["restarts"]["continuity_ok"] and report["restarts"]["count"] == 1
    if rung.eval_batches:  # the rung's point for F5: held-out loss at its size and tokens
        held = BatchSampler(_corpus(rung.vocab, rung.seed, 20_000, rung.seed + 1000), 64, rung.block,
                            seed=rung.seed + 1001)
        model.eval()
        with torch.no_grad():
            ev = [torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
                  for x, y in (held.next() for _ in range(rung.eval_batches))]
        measured["eval_loss"] = sum(ev) / len(ev)
        if len(ev) > 1:  # the standard error of that mean: the point's interval on the dashboard's fit
            mean = measured["eval_loss"]
            measured["eval_loss_se"] = math.sqrt(sum((x - mean) ** 2 for x in ev) / (len(ev) - 1) / len(ev))
        measured["n_params"] = flops.n_params
        measured["tokens"] = rung.steps * rung.batch_size * rung.block
        artifacts["entropy_rate"] = MarkovSource(rung.vocab, seed=rung.seed).entropy_rate
    return measured, artifacts


_CORPORA: dict[tuple[int, int, int, int], torch.Tensor] = {}


def _corpus(vocab: int, seed: int, n: int, sample_seed: int) -> torch.Tensor:
    """The rung's Markov corpus (sampled once per process: a Python loop per token)."""
    key = (vocab, seed, n, sample_seed)
    if key not in _CORPORA:
        _CORPORA[key] = MarkovSource(vocab, seed=seed).sample(n, seed=sample_seed)
    return _CORPORA[key]


def _size_headline(rung: Rung, verdicts: list[tuple[GateVerdict, str]], peak: float | None) -> tuple[Rung, Any]:
    """The scaling-law fit: fit the law to the earlier rungs' held-out losses, choose the headline inside the compute box, and
    return the sized rung and the ``scaling_fitted`` event that records it all."""
    from trainledger.ladder.kinds import ScalingFitted

    from trainledger.ladder.scaling import Candidate, ComputeBox, fit_scaling_law

    used = [(v, h) for v, h in verdicts if "eval_loss" in v.measured]
    points = [[float(v.measured["n_params"]), float(v.measured["tokens"]), float(v.measured["eval_loss"])]
              for v, _ in used]
    fit = fit_scaling_law(points, seed=rung.seed)
    cands = []
    for w in rung.candidate_widths:
        for n_layer in rung.candidate_layers:
            heads = max(1, w // 8)
            fc = flop_config_from_causal_lm(build_causal_lm(rung.vocab, w, n_layer, heads, rung.block),
                                            seq_len=rung.block)
            cands.append(Candidate(f"d{w}-L{n_layer}", fc.n_params, float(fc.flops_per_token)))
    flops = sum(float(v.measured["flops"]) for v, _ in used)
    wall = sum(float(v.measured["wall_s"]) for v, _ in used)
    achieved = flops / wall  # FLOP/s the earlier rungs reached: their MFU against the peak, never a datasheet
    box = ComputeBox(max_flops=rung.box_flops_multiple * max(float(v.measured["flops"]) for v, _ in used),
                     max_wall_s=rung.box_wall_s, devices=1, peak_flops_per_sec=peak or achieved,
                     memory_bytes_per_device=rung.box_memory_bytes, measured_mfu=min(1.0, achieved / (peak or achieved)))
    per_step = rung.batch_size * rung.block
    choice = box.choose(fit, cands, min_tokens=per_step)
    steps = max(1, choice.tokens // per_step)
    tokens = steps * per_step
    width, depth = (int(x) for x in choice.candidate.name[1:].split("-L"))
    predicted = fit.predict(choice.candidate.n_params, tokens)
    lo, hi = fit.interval(choice.candidate.n_params, tokens, level=rung.interval_level)
    entropy = used[-1][0].artifacts.get("entropy_rate")
    ev = ScalingFitted(rung=rung.name, points=points, evidence=[h for _, h in used], params=fit.params,
                       theta=list(fit.theta), seed=fit.seed, boot=fit.boot, level=rung.interval_level,
                       loo_error=fit.loo_error(), box=dataclasses.asdict(box),
                       candidates=[dataclasses.asdict(c) for c in cands],
                       choice={**choice.to_dict(), "steps": steps, "tokens": tokens, "per_step": per_step,
                               "predicted_loss": predicted, "interval": [lo, hi],
                               "fit_warnings": fit.warnings(entropy)},
                       entropy_rate=entropy, fitter=fit.fitter)
    sized = dataclasses.replace(rung, d_model=width, n_layer=depth, n_head=max(1, width // 8), steps=steps)
    return sized, ev


def run_pilot_ladder(rungs: list[Rung], peak_flops_per_sec: float | None = None, journal: Journal | None = None, *,
                     work_dir: str | Path | None = None, peak_source: str | None = None,
                     peak_spread: float | None = None, progress: Callable[[str], None] | None = None) -> LadderResult:
    """Run the ladder; return its result (also rebuildable from the journal by :class:`LadderProjection`).

    ``journal`` receives every event; without one, a journal signed by a throwaway key is
    written in ``work_dir`` (a temporary directory by default). Raises
    ``NotImplementedError`` before training anything if a rung opts into a
    piece that does not exist here. ``progress`` gets a line as each rung starts and ends, and about every
    ten seconds within a rung. The rungs train with one intra-op thread (:mod:`training.reference.threads`).
    """
    from trainledger.training.reference.threads import own_threads

    with own_threads():
        return _run_pilot_ladder(rungs, peak_flops_per_sec, journal, work_dir=work_dir, peak_source=peak_source,
                                 peak_spread=peak_spread, progress=progress or (lambda line: None))


def _run_pilot_ladder(rungs: list[Rung], peak_flops_per_sec: float | None, journal: Journal | None, *,
                      work_dir: str | Path | None, peak_source: str | None, peak_spread: float | None,
                      progress: Callable[[str], None]) -> LadderResult:
    import tempfile

    for i, r in enumerate(rungs):
        if not isinstance(r, Rung):
            raise TypeError(f"rungs must be Rung objects, got {type(r).__name__}")
        refuse_unavailable(r, rungs[:i])
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="ladder-"))
    own = journal is None
    j = journal if journal is not None else Journal.create(work / "ladder.jsonl", signer=Signer.generate())
    proj = LadderProjection()
    a, b = 1.0, 1.0
    done: list[tuple[GateVerdict, str]] = []  # verdicts and their chain hashes, for F5
    try:
        for k, rung in enumerate(rungs, 1):
            f5 = None
            t_rung = time.perf_counter()
            if rung.exercise_scaling_law_fit:
                rung, f5 = _size_headline(rung, done, peak_flops_per_sec)
                j.append(f5, durable=True)
            opened = j.append(RungStarted(rung=rung.name, real_target=rung.real_target,
                                          spec=dataclasses.asdict(rung)))
            progress(f"rung {k}/{len(rungs)} {rung.name}: {rung.steps:,} steps, d_model {rung.d_model}, "
                     f"{rung.n_layer} layer(s)" + (f" (sized by the fit; binding: {f5.choice['binding']})"
                                                   if f5 is not None else ""))
            measured, artifacts = _train_rung(rung, j, work / rung.name, peak_flops_per_sec,
                                              {"peak_source": peak_source, "peak_spread": peak_spread},
                                              progress=lambda step, loss: progress(
                                                  f"  {rung.name}: step {step + 1:,}/{rung.steps:,}, loss {loss:.4f}, "
                                                  f"{time.perf_counter() - t_rung:.0f} s"))
            bars = {k: getattr(rung, k) for k in ("max_final_loss", "max_forgetting_gap", "min_mfu_mean",
                                                  "max_anomalies", "max_flops", "max_wall_s")}
            if f5 is not None:  # the run F5 sized checks F5's prediction
                bars["predicted_loss"] = f5.choice["predicted_loss"]
                bars["loss_interval"] = list(f5.choice["interval"])
                artifacts["skipped_pieces"].pop("F5", None)
                artifacts["F5_scaling_fit"] = {"params": f5.params, "entropy_rate": f5.entropy_rate,
                                               "loo_error": f5.loo_error, "binding": f5.choice["binding"],
                                               "candidate": f5.choice["candidate"],
                                               "warnings": f5.choice["fit_warnings"]}
            passed, reason = gate(bars, measured)
            progress(f"rung {k}/{len(rungs)} {rung.name}: {'GO' if passed else 'NO-GO'} in "
                     f"{time.perf_counter() - t_rung:.1f} s (final loss {measured['final_loss']:.4f})")
            verdict = GateVerdict(rung=rung.name, passed=passed, reason=reason, measured=measured, bars=bars,
                                  artifacts=artifacts)
            _, vh = j.append(verdict, durable=True)
            done.append((verdict, vh))
            proj.apply(verdict)
            before = {"a": a, "b": b, "mean": a / (a + b)}
            action, (a, b) = decide(a, b, passed)  # the same function replay decides with
            decision = DecisionRecorded(rung=rung.name, belief_before=before, evidence=[opened[1], vh],
                                        belief_after={"a": a, "b": b, "mean": a / (a + b)}, action_chosen=action)
            j.append(decision, durable=True)
            proj.apply(decision)
            if not passed:
                break
        if own:
            record_compute(j)
    finally:
        if own:
            j.close()
    return proj.result()
