"""The experiment loop: a manifest-driven run with its stop rules, evaluation hooks and resource evidence.

:func:`run_experiment` trains the tiny causal LM exactly as an
:class:`~trainledger.training.experiment.manifest.ExperimentManifest` says (batch semantics,
schedule, seeds, checkpoint plan) in a journal whose ``run_opened`` carries the
manifest identity, and stops, with ``run_stopped`` naming the rule and the
number, on: ``identity-mismatch`` (manifest, data, tokenizer or template digest
differs from what the run or the manifest names), ``protected-data-access``,
``non-finite-loss``, ``effective-batch`` (examples observed per update differ
from the manifest), ``budget-breach`` (wall clock or tokens), ``invalid-checkpoint``
(resume rejected), ``resume-divergence`` (a re-executed step's loss differs from
the one recorded before the interruption), ``target-futility`` (the preregistered
rule) and ``forbidden-regression`` (an evaluation hook's metric rose more than
allowed). Evaluation hooks run outside the optimizer step at checkpoint
cadence and record ``evaluation_recorded`` bound to the checkpoint digest, per-
case results stored by digest under ``evals/``; the final checkpoint is chosen by
the preregistered selection rule (``checkpoint_selected``), never by the
training loss. ``resource_recorded`` follows every checkpoint.

:func:`write_example` writes a complete manifest for the tiny model with its
data, tokenizer and template files (``trainledger manifest init``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import torch

from trainledger.training.health.mfu import record_compute
from trainledger.training.reference.threads import in_own_threads
from trainledger.journal import Journal, Signer, TrainledgerError, UnsafePath
from trainledger.journal.paths import confined, open_new
from trainledger.training.audit import select_checkpoint
from trainledger.journal.events import RunOpened, StepObserved
from trainledger.training.kinds import CheckpointSaved, CheckpointSelected, EvaluationRecorded, ResourceRecorded, \
    RunStopped

from trainledger.training.checkpoints.state import (
    ResumeRejected,
    enforce_retention,
    live_checkpoints,
    restore_checkpoint,
    save_checkpoint,
    signed_history,
)
from trainledger.training.reference.corpus import BatchSampler, MarkovSource
from trainledger.training.health.flops import flop_config_from_causal_lm
from trainledger.training.reference.loop import warmup_cosine
from trainledger.training.experiment.manifest import ExperimentManifest, config_digest, file_digest, manifest_identity
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor

__all__ = ["run_experiment", "write_example", "write_eval_cases", "Runtime", "ProtectedDataAccess", "DataGuard", "build_from_manifest",
           "evaluate_hook", "STOP_RULES"]

STOP_RULES = ("identity-mismatch", "protected-data-access", "non-finite-loss", "effective-batch", "budget-breach",
              "invalid-checkpoint", "resume-divergence", "target-futility", "forbidden-regression")


class ProtectedDataAccess(TrainledgerError, RuntimeError):
    """Training asked for an artifact the manifest protects."""

    exit_code = 1


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What actually runs, where it may differ from the manifest (a deployment mistake, or a test's fault)."""

    accumulation: int | None = None  # accumulation steps actually used
    lr: float | None = None  # learning rate actually used
    train_artifacts: tuple[str, ...] | None = None  # artifacts the data loader actually reads
    reseed_sampler_on_resume: int | None = None  # a resume that loses the data cursor (a broken restore)


class DataGuard:
    """Every data read goes through here: digests are checked, protected artifacts refused to training."""

    def __init__(self, m: ExperimentManifest, root: str | Path, reader: str):
        self.m, self.root, self.reader = m, Path(root), reader
        self.read: list[str] = []

    def tokens(self, name: str) -> torch.Tensor:
        a = self.m.artifact(name)
        if a.protected and self.reader == "training":
            raise ProtectedDataAccess(f"training tried to read the protected artifact {name!r}")
        data = confined(self.root, a.ref, what=f"data artifact {name!r} ref").read_bytes()
        got = _digest(data)
        if got != a.digest:
            raise ValueError(f"data artifact {name!r} ({a.ref}) has digest {got}, the manifest names {a.digest}")
        self.read.append(name)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()

    def split(self, split: str, names: tuple[str, ...] | None = None) -> torch.Tensor:
        names = names or tuple(a.name for a in self.m.data.artifacts if a.split == split)
        return torch.cat([self.tokens(n) for n in names])


def build_from_manifest(m: ExperimentManifest, *, lr: float | None = None):
    """Model, optimizer and scheduler as the manifest states them (seeded by ``environment.seeds['torch']``)."""
    torch.manual_seed(m.environment.seeds.get("torch", 0))
    arch = {k: v for k, v in m.model.items() if k != "family"}
    model = build_causal_lm(**arch)
    opt = torch.optim.AdamW(model.parameters(), lr=m.optimization.lr if lr is None else lr,
                            weight_decay=m.optimization.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(m.warmup(), m.optimization.planned_updates))
    return model, opt, sched


def evaluate_hook(m: ExperimentManifest, hook, model: torch.nn.Module, guard: DataGuard,
                  max_cases: int = 32) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The hook's metric over fixed, non-overlapping windows of its split: (metrics, per-case results)."""
    tokens = guard.split(hook.split)
    t = m.batch.seq_len
    n = min(max_cases, (len(tokens) - 1) // t)
    cases = []
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(n):
            x = tokens[i * t:(i + 1) * t].unsqueeze(0)
            y = tokens[i * t + 1:(i + 1) * t + 1].unsqueeze(0)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
            cases.append({"case": i, "offset": i * t, "loss": loss})
    model.train(was)
    return {"loss": sum(c["loss"] for c in cases) / max(1, len(cases))}, cases


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _environment(m: ExperimentManifest) -> dict[str, str]:
    return {"python": platform.python_version(), "torch": str(torch.__version__), "platform": platform.platform(),
            "hardware_class": m.environment.hardware_class, "code": m.environment.code}


def _identity_problem(m: ExperimentManifest, root: Path) -> str | None:
    """A digest the manifest names that the files on disk do not have (tokenizer, template, config)."""
    if config_digest(m.model) != m.artifacts.config:
        return "the model section does not match artifacts.config"
    for name in ("tokenizer", "template"):
        f = root / f"{name}.json"
        if not f.exists():
            return f"{name}.json is missing from {root}"
        got = file_digest(f)
        if got != getattr(m.artifacts, name):
            return f"{name}.json has digest {got}, the manifest names {getattr(m.artifacts, name)}"
    return None


class _Stop(TrainledgerError):
    """A stop rule fired: ``run_stopped`` is written with these and the run closes (never escapes the loop)."""

    exit_code = 1

    def __init__(self, rule: str, reason: str, value: float | None = None, limit: float | None = None):
        super().__init__(reason)
        self.rule, self.reason, self.value, self.limit = rule, reason, value, limit


class _Experiment:
    """One invocation of the manifest-driven loop, in the parts ``run_experiment`` runs in order: open the
    journal and check identity and data, resume, then per update the budget, the accumulated update, the
    resume-divergence check and the checkpoint cadence (evaluations, futility, resources, retention)."""

    def __init__(self, m: ExperimentManifest, root: Path, run: Path, signer: Signer, runtime: Runtime,
                 peak_flops_per_sec: float | None):
        self.m, self.root, self.run, self.runtime = m, root, run, runtime
        self.peak = peak_flops_per_sec
        self.jpath = run / "journal.jsonl"
        self.ident = manifest_identity(m)
        self.t_start = time.perf_counter()
        self.durations = {"data_s": 0.0, "forward_backward_s": 0.0, "optimizer_s": 0.0, "checkpoint_s": 0.0,
                          "eval_s": 0.0}
        self.losses: list[float] = []
        self.counts: dict[str, Any] = {"examples": 0, "tokens": 0, "supervised": 0}
        self.evals: list[EvaluationRecorded] = []
        self.baselines: dict[str, float] = {}
        self.recorded_losses: dict[int, float] = {}
        self.futility_checked = False
        self.start = 0
        if self.jpath.exists():
            self.j = Journal.open_append(self.jpath, signer=signer)
        else:
            self.j = Journal.create(self.jpath, signer=signer, manifest_id=self.ident,
                                    manifest_label=m.label or None, meta={"experiment": True})

    # -- before the first update ------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Identity and data checks, the model, and the resume (from signed events only)."""
        m, b = self.m, self.m.batch
        history = signed_history(self.j)  # one pass: the opening, checkpoints, steps, evaluations
        opened = history[0]
        if isinstance(opened, RunOpened) and opened.manifest_id != self.ident:
            raise _Stop("identity-mismatch", f"the journal's run was opened under manifest {opened.manifest_id}, "
                                             f"this manifest is {self.ident}")
        problem = _identity_problem(m, self.root)
        if problem is not None:
            raise _Stop("identity-mismatch", problem)
        try:
            self.train_tokens = DataGuard(m, self.root, "training").split("train", self.runtime.train_artifacts)
        except ProtectedDataAccess as e:
            raise _Stop("protected-data-access", str(e)) from None
        except (ValueError, UnsafePath) as e:
            raise _Stop("identity-mismatch", str(e)) from None
        self.evaluator = DataGuard(m, self.root, "evaluation")
        self.model, self.opt, self.sched = build_from_manifest(m, lr=self.runtime.lr)
        self.per_step = b.microbatch_per_device * b.data_parallel  # data-parallel devices emulated in one process
        self.sampler = BatchSampler(self.train_tokens, self.per_step, b.seq_len, seed=m.environment.seeds.get("data", 0))
        self.accumulation = self.runtime.accumulation or b.accumulation
        self.kept = live_checkpoints(self.run, history)
        self.evals = [e for e in history if isinstance(e, EvaluationRecorded)]
        for e in self.evals:
            metric = next(h.metric for h in m.evaluation.hooks if h.name == e.hook)
            self.baselines.setdefault(e.hook, e.metrics[metric])
        self.monitor = self._resume(history) if self.kept else TrainingHealthMonitor(
            journal=self.j, flop_config=flop_config_from_causal_lm(self.model, seq_len=b.seq_len),
            peak_flops_per_sec=self.peak)

    def _resume(self, history: list[Any]) -> TrainingHealthMonitor:
        ck = self.kept[-1]
        try:
            info = restore_checkpoint(self.run, self.j, ck.path, model=self.model, optimizer=self.opt,
                                      scheduler=self.sched, sampler=self.sampler)
        except ResumeRejected as e:
            raise _Stop("invalid-checkpoint", f"{ck.path}: {e}") from None
        if info.get("manifest_id") not in (None, self.ident):
            raise _Stop("identity-mismatch", f"{ck.path} was written under manifest {info.get('manifest_id')}")
        self.start = info["counters"]["step"] + 1
        self.counts.update(info["extra"]["counts"])
        # Steps recorded after this checkpoint, before the interruption: re-executed now, they must agree.
        self.recorded_losses = {e.step: e.loss for e in history
                                if isinstance(e, StepObserved) and e.step >= self.start and e.seq > ck.seq}
        if self.runtime.reseed_sampler_on_resume is not None:
            self.sampler = BatchSampler(self.train_tokens, self.per_step, self.m.batch.seq_len,
                                        seed=self.runtime.reseed_sampler_on_resume)
        return TrainingHealthMonitor.resumed(info["extra"]["monitor"], journal=self.j, checkpoint=ck, later=history)

    # -- each update --------------------------------------------------------------------------------------------

    def check_budget(self) -> None:
        budget = self.m.budget
        wall = time.perf_counter() - self.t_start
        if budget.max_wall_s is not None and wall > budget.max_wall_s:
            raise _Stop("budget-breach", f"wall clock {wall:.2f} s exceeds the budget", wall, budget.max_wall_s)
        tokens = self.counts["tokens"]
        if budget.max_tokens is not None and tokens >= budget.max_tokens:
            raise _Stop("budget-breach", f"{tokens} tokens processed reach the budget", tokens, budget.max_tokens)

    def update(self, step: int) -> None:
        """One optimizer update over ``accumulation`` microbatches, observed by the monitor."""
        b, d = self.m.batch, self.durations
        t0 = time.perf_counter()
        self.opt.zero_grad()
        total, rows = 0.0, 0
        for _ in range(self.accumulation):
            td = time.perf_counter()
            x, y = self.sampler.next()
            d["data_s"] += time.perf_counter() - td
            tf = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
            (loss / self.accumulation).backward()
            d["forward_backward_s"] += time.perf_counter() - tf
            total += loss.item() / self.accumulation  # host sync (free on the CPU)
            rows += x.shape[0]
        if rows != b.effective_global_batch:
            raise _Stop("effective-batch", f"update {step} consumed {rows} examples, the manifest declares "
                                           f"{b.effective_global_batch}", rows, b.effective_global_batch)
        if not math.isfinite(total):
            raise _Stop("non-finite-loss", f"loss {total} at update {step}", total, None)
        to = time.perf_counter()
        clip = self.m.optimization.clip_grad_norm
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=clip or float("inf")))
        self.opt.step()
        self.sched.step()
        d["optimizer_s"] += time.perf_counter() - to
        self.losses.append(total)
        self.counts["examples"] += rows
        self.counts["tokens"] += rows * b.seq_len
        self.counts["supervised"] += rows * b.seq_len  # objective "all": every target token contributes
        self.monitor.observe_step(step, total, grad_norm=grad_norm, step_time_s=time.perf_counter() - t0,
                                  batch_size=rows, tokens=rows * b.seq_len, lr=self.sched.get_last_lr()[0])
        self.check_divergence(step, total)

    def check_divergence(self, step: int, total: float) -> None:
        if step in self.recorded_losses:
            was = self.recorded_losses.pop(step)
            diff = abs(total - was)
            if diff > 1e-6 * max(1.0, abs(was)):
                raise _Stop("resume-divergence", f"update {step} gave loss {total:.6f} after the resume, "
                                                 f"{was:.6f} before the interruption", diff, 1e-6)

    def due(self, step: int) -> bool:
        return (step + 1) % self.m.checkpoint.every_updates == 0 or step + 1 == self.m.optimization.planned_updates

    def checkpoint(self, step: int) -> None:
        """Save, evaluate at cadence, check the futility rule, record resources, apply retention."""
        m = self.m
        tc = time.perf_counter()
        ev = save_checkpoint(self.run, self.j, step=step, model=self.model, optimizer=self.opt, scheduler=self.sched,
                             sampler=self.sampler, tokens=self.counts["tokens"], manifest_id=self.ident,
                             extra={"monitor": self.monitor.state(), "counts": dict(self.counts)})
        ck_s = time.perf_counter() - tc
        self.durations["checkpoint_s"] += ck_s
        self.kept.append(ev)
        stopped = _evaluate(m, self.run, self.j, step, ev, self.model, self.evaluator, self.evals, self.baselines,
                            self.durations)
        if stopped is not None:
            raise _Stop(*stopped)
        self.check_futility(step)
        self.j.append(ResourceRecorded(
            updates=step + 1, examples=self.counts["examples"], tokens=self.counts["tokens"],
            supervised_tokens=self.counts["supervised"], wall_s=time.perf_counter() - self.t_start,
            durations_s={k: round(v, 6) for k, v in self.durations.items()}, peak_rss_bytes=_peak_rss(),
            checkpoint_bytes=ev.bytes, checkpoint_s=ck_s, environment=_environment(m)))
        enforce_retention(self.run, self.j, self.kept, m.checkpoint.keep_last,
                          note=" (its evaluations stay in the journal and evals/)")

    def check_futility(self, step: int) -> None:
        fut = self.m.question.futility
        if fut is None or self.futility_checked or step + 1 < fut.by_update:
            return
        last = next((e for e in reversed(self.evals) if e.hook == fut.hook), None)
        if last is None:
            return
        self.futility_checked = True
        v = last.metrics.get(fut.metric, math.nan)
        if not v <= fut.threshold:
            raise _Stop("target-futility", f"{fut.hook}.{fut.metric} = {v:.4f} at update {step + 1}, the "
                                           f"preregistered rule needs <= {fut.threshold} by update {fut.by_update}",
                        v, fut.threshold)

    def stopped(self, s: _Stop) -> dict[str, Any]:
        self.j.append(RunStopped(rule=s.rule, reason=s.reason, value=s.value, limit=s.limit), durable=True)
        record_compute(self.j)
        self.j.close(status="stopped", reason=s.rule)
        return {"stopped": s.rule, "reason": s.reason, "value": s.value, "limit": s.limit, "losses": self.losses,
                "identity": self.ident, "journal": self.jpath}


@in_own_threads
def run_experiment(m: ExperimentManifest, root: str | Path, run_dir: str | Path, *, signer: Signer,
                   runtime: Runtime = Runtime(), stop_after: int | None = None,
                   peak_flops_per_sec: float | None = None) -> dict[str, Any]:
    """Run (or resume) the experiment in ``run_dir``; return what happened (``stopped`` names a rule, or None)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    x = _Experiment(m, Path(root), run, signer, runtime, peak_flops_per_sec)
    try:
        x.prepare()
        step = x.start
        while step < m.optimization.planned_updates:
            if stop_after is not None and step - x.start >= stop_after:
                x.j.suspend()
                return {"stopped": None, "suspended_at": step, "losses": x.losses, "identity": x.ident,
                        "journal": x.jpath}
            x.check_budget()
            x.update(step)
            if x.due(step):
                x.checkpoint(step)
            step += 1
        selected = _select(m, x.j, x.evals)
        record_compute(x.j)
        x.j.close()
        return {"stopped": None, "losses": x.losses, "identity": x.ident, "journal": x.jpath, "selected": selected,
                "evaluations": len(x.evals)}
    except _Stop as s:
        return x.stopped(s)
    except BaseException:
        if not x.j.closed:
            x.j.suspend()
        raise


def write_eval_cases(run: Path, hook: str, checkpoint_sha256: str, cases: list[Any]) -> tuple[str, str]:
    """Keep an evaluation's per-case results in ``RUN/evals/<digest>.json`` (the hook, the checkpoint's digest and
    the cases, canonical JSON); returns the digest and the path relative to the run, as ``evaluation_recorded``
    records them. Written to a new file and renamed into place: a link planted in ``evals/`` is not followed."""
    blob = json.dumps({"hook": hook, "checkpoint_sha256": checkpoint_sha256, "cases": cases}, sort_keys=True).encode()
    digest = hashlib.sha256(blob).hexdigest()
    (run / "evals").mkdir(exist_ok=True)
    dest = confined(run, f"evals/{digest}.json", what="evaluation cases path")  # evals/ may not lead out
    with open_new(dest.with_name(dest.name + ".tmp")) as f:
        f.write(blob)
    os.replace(dest.with_name(dest.name + ".tmp"), dest)
    return digest, f"evals/{digest}.json"


def _evaluate(m, run: Path, j: Journal, step: int, ck: CheckpointSaved, model, guard: DataGuard,
              evals: list, baselines: dict[str, float], durations: dict[str, float]) -> tuple | None:
    for hook in m.evaluation.hooks:
        if (step + 1) % hook.every_updates and step + 1 != m.optimization.planned_updates:
            continue
        te = time.perf_counter()
        metrics, cases = evaluate_hook(m, hook, model, guard)
        digest, where = write_eval_cases(run, hook.name, ck.sha256, cases)
        ev = EvaluationRecorded(hook=hook.name, role=hook.role, step=step, checkpoint=ck.path,
                                checkpoint_sha256=ck.sha256, metrics=metrics, cases=len(cases),
                                cases_sha256=digest, cases_path=where)
        j.append(ev, durable=True)
        evals.append(ev)
        durations["eval_s"] += time.perf_counter() - te
        v = metrics[hook.metric]
        base = baselines.setdefault(hook.name, v)
        if hook.forbidden_regression is not None and v - base > hook.forbidden_regression:
            return ("forbidden-regression", f"{hook.name} ({hook.role}) {hook.metric} rose from {base:.4f} to "
                                            f"{v:.4f} at update {step + 1}", v - base, hook.forbidden_regression)
    return None


def _select(m: ExperimentManifest, j: Journal, evals: list) -> dict[str, Any] | None:
    """The preregistered rule over every evaluated checkpoint (all of them, not only the last)."""
    got = select_checkpoint(m.evaluation.selection_rule, evals)  # the function replay selects again with
    if got is None:
        return None
    pick, n = got
    metric = m.evaluation.selection_rule.partition(".")[2]
    j.append(CheckpointSelected(rule=m.evaluation.selection_rule, checkpoint=pick.checkpoint,
                                checkpoint_sha256=pick.checkpoint_sha256, step=pick.step,
                                value=pick.metrics[metric], candidates=n), durable=True)
    return {"checkpoint": pick.checkpoint, "step": pick.step, "value": pick.metrics[metric], "candidates": n}


# -- the example ----------------------------------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def example_manifest_dict(files: dict[str, bytes]) -> dict[str, Any]:
    """The tiny model's manifest, as plain data, for the given file contents (name -> bytes)."""
    model = {"family": "trainledger-tiny-causal-lm", "vocab": 32, "d_model": 32, "n_layer": 2, "n_head": 2,
             "block": 16, "dropout": 0.0}
    return {
        "label": "tiny-markov-baseline",
        "question": {
            "hypothesis": "a 2-layer causal LM trained from scratch learns the Markov source below its unigram entropy",
            "baseline": "the untrained model (uniform over 32 tokens: ln 32 = 3.47 nats)",
            "intervention": "160 AdamW updates of next-token cross-entropy on the train split",
            "disconfirmation": "heldout loss not below 3.2 nats by update 80",
            "alternative_explanations": ["evaluator drift", "data leakage between splits", "effective-batch change"],
            "stop_rules": list(STOP_RULES),
            "futility": {"hook": "heldout", "metric": "loss", "threshold": 3.2, "by_update": 80},
        },
        "model": model,
        "artifacts": {"config": config_digest(model), "tokenizer": _digest(files["tokenizer.json"]),
                      "template": _digest(files["template.json"]), "runtime": _digest(b"python3.11+torch2.13-cpu")},
        "data": {
            "recipe": _digest(b"MarkovSource(vocab=32, seed=0); retention: MarkovSource(vocab=32, seed=7)"),
            "artifacts": [
                {"name": "train", "split": "train", "digest": _digest(files["data/train.bin"]),
                 "ref": "data/train.bin"},
                {"name": "heldout", "split": "heldout", "digest": _digest(files["data/heldout.bin"]),
                 "ref": "data/heldout.bin", "protected": True},
                {"name": "retention", "split": "retention", "digest": _digest(files["data/retention.bin"]),
                 "ref": "data/retention.bin", "protected": True},
            ],
        },
        "objective": {"loss": "next-token cross-entropy", "supervised_tokens": "all", "trainable": ["*"]},
        "optimization": {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.1, "scheduler": "linear-warmup-cosine",
                         "planned_updates": 160, "clip_grad_norm": 1.0, "warmup_fraction": 0.05,
                         "warmup_fraction_of": 160},
        "batch": {"microbatch_per_device": 2, "data_parallel": 2, "accumulation": 4, "effective_global_batch": 16,
                  "seq_len": 16},
        "precision": {"param_dtype": "fp32", "grad_dtype": "fp32", "optimizer_dtype": "fp32",
                      "activation_dtype": "fp32", "reduction_dtype": "fp32", "accumulation_dtype": "fp32",
                      "loss_scaling": "none", "sharding": "none (data-parallel devices emulated in one process)",
                      "offload": "none", "state_dict_format": "torch.save, trainledger-checkpoint/1"},
        "environment": {"code": "git:see run_opened.software", "dependencies": _digest(b"constraints.txt"),
                        "environment": _digest(b"debian12-python3.11-cpu"), "seeds": {"torch": 0, "data": 2},
                        "hardware_class": "cpu-2core", "topology": "1 process"},
        "checkpoint": {"every_updates": 20, "contents": ["model", "optimizer", "scheduler", "scaler", "rng", "sampler",
                                                         "counters", "accumulation", "manifest_id"],
                       "keep_last": 3, "recovery": "resume from the newest checkpoint the journal records as live"},
        "budget": {"max_wall_s": 600.0, "max_tokens": 1_000_000, "max_memory_bytes": 8 * 1024 ** 3},
        "evaluation": {
            "hooks": [
                {"name": "heldout", "role": "target", "split": "heldout", "suite": _digest(files["data/heldout.bin"]),
                 "every_updates": 40},
                {"name": "retention", "role": "retention", "split": "retention",
                 "suite": _digest(files["data/retention.bin"]), "every_updates": 40, "forbidden_regression": 1.0},
            ],
            "selection_rule": "min:heldout.loss",
        },
        "authority": {"experiment_owner": "ml-eng", "approvers": ["research-lead"], "owners": ["ml-eng"]},
        "preflight": {"overfit_steps": 300, "overfit_min_drop": 0.5, "resume_boundary": 6, "resume_steps": 12,
                      "probe_batches": [1, 4], "probe_seq_lens": [8, 16]},
    }


def example_files() -> dict[str, bytes]:
    src = MarkovSource(32, seed=0)
    other = MarkovSource(32, seed=7)  # a different distribution: what retention guards
    vocab = {str(i): i for i in range(32)}
    return {
        "data/train.bin": bytes(src.sample(20_000, seed=1).to(torch.uint8).tolist()),
        "data/heldout.bin": bytes(src.sample(4_000, seed=99).to(torch.uint8).tolist()),
        "data/retention.bin": bytes(other.sample(4_000, seed=5).to(torch.uint8).tolist()),
        "tokenizer.json": json.dumps({"type": "identity", "vocab": vocab}, sort_keys=True).encode(),
        "template.json": json.dumps({"type": "raw-tokens", "bos": None, "eos": None, "mask": "none"},
                                    sort_keys=True).encode(),
    }


def write_example(directory: str | Path) -> Path:
    """Write ``manifest.yaml`` and its files into ``directory``; return the manifest's path."""
    import yaml

    from trainledger.journal.errors import UsageError

    d = Path(directory)
    if (d / "manifest.yaml").exists():
        raise UsageError(f"{d}/manifest.yaml already exists")
    from trainledger.journal.paths import write_atomically

    files = example_files()
    for name, data in files.items():  # never through a link planted in a folder the command did not make
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomically(d / name, data)
    write_atomically(d / "manifest.yaml",
                     yaml.safe_dump(example_manifest_dict(files), sort_keys=False, width=110).encode())
    return d / "manifest.yaml"
