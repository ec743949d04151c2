"""The experiment preflight: a state machine of gates, in order, that never pretends a later gate ran.

Gates: ``schema``, ``data_lineage``, ``template_compat``, ``smoke``, ``overfit``,
``save_load``, ``resume_equivalence``, ``resource_probe``, ``eval_dry_run``,
``authority``. Each records ``preflight_gate`` (passed, failed with the
measured reason, blocked with what is missing); the machine stops at the first
gate that does not pass and records every later gate as ``not_run``. Then
``preflight_completed`` carries the overall status: ``ready-to-train``, or
``experiment-specified-blocked-before-training at <gate>`` /
``experiment-specified-failed-before-training at <gate>``.

``template_compat`` runs a check the user supplies (``template_check(manifest,
root) -> (ok, detail)``); without one it is blocked, not passed. ``authority``
needs an approval naming this manifest's identity by one of its approvers:
technical completeness never implies approval.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch

from trainledger.journal import Journal, PublicKey, Signer, UnsafePath
from trainledger.training.audit.approval import ApprovalInvalid, SignedApproval, check_approval
from trainledger.journal.paths import confined
from trainledger.training.kinds import PreflightCompleted, PreflightGate

from trainledger.training.checkpoints.state import CONTRACT, load_payload, restore_checkpoint, save_checkpoint
from trainledger.training.reference.corpus import BatchSampler
from trainledger.training.experiment.loop import (
    DataGuard,
    ProtectedDataAccess,
    _identity_problem,
    _peak_rss,
    build_from_manifest,
    evaluate_hook,
    run_experiment,
)
from trainledger.training.experiment.manifest import ExperimentManifest, file_digest, manifest_identity, validate

__all__ = ["GATES", "Approval", "GateResult", "PreflightResult", "run_preflight", "authority_gate"]

GATES = ("schema", "data_lineage", "template_compat", "smoke", "overfit", "save_load", "resume_equivalence",
         "resource_probe", "eval_dry_run", "authority")


#: A decision by a named authority, signed with that authority's key (training/audit/approval.py).
Approval = SignedApproval


@dataclasses.dataclass
class GateResult:
    gate: str
    status: str
    reason: str
    measured: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PreflightResult:
    manifest_id: str
    status: str
    stopped_at: str | None
    gates: list[GateResult]

    @property
    def ready(self) -> bool:
        return self.status == "ready-to-train"


def _passed(reason: str, **measured: Any) -> GateResult:
    return GateResult("", "passed", reason, measured)


def _failed(reason: str, **measured: Any) -> GateResult:
    return GateResult("", "failed", reason, measured)


def _blocked(reason: str) -> GateResult:
    return GateResult("", "blocked", reason)


class _Ctx:
    def __init__(self, m: ExperimentManifest, root: Path, template_check, approval, approvers, scratch: Path):
        self.m, self.root, self.template_check, self.approval, self.scratch = m, root, template_check, approval, scratch
        self.approvers = approvers
        self.signer = Signer.generate()  # scratch journals of the disposable gates only


def _schema(c: _Ctx) -> GateResult:
    errors = [f for f in validate(c.m) if f.severity == "error"]
    if errors:
        return _failed(f"{len(errors)} finding(s); first {errors[0].path}: {errors[0].message}",
                       findings=[f.line() for f in errors])
    return _passed("the manifest validates", findings=0)


def _lineage(c: _Ctx) -> GateResult:
    checked = {}
    for a in c.m.data.artifacts:
        try:
            f = confined(c.root, a.ref, what=f"data artifact {a.name!r} ref")
        except UnsafePath as e:
            return _failed(str(e))
        if not f.is_file():
            return _failed(f"data artifact {a.name!r}: {a.ref} is missing under {c.root}")
        got = file_digest(f)
        if got != a.digest:
            return _failed(f"data artifact {a.name!r} ({a.ref}) has digest {got}, the manifest names {a.digest}")
        checked[a.name] = got
    problem = _identity_problem(c.m, c.root)
    if problem is not None:
        return _failed(problem)
    guard = DataGuard(c.m, c.root, "training")
    try:
        guard.split("train")
    except ProtectedDataAccess as e:
        return _failed(str(e))
    protected = sorted(a.name for a in c.m.data.artifacts if a.protected)
    return _passed(f"{len(checked)} artifacts match their digests; training reads {guard.read}, never "
                   f"{protected}", artifacts=len(checked), training_reads=guard.read, protected=protected)


def _template(c: _Ctx) -> GateResult:
    if c.template_check is None:
        return _blocked("no template/tokenizer/mask compatibility check was supplied: this gate cannot pass "
                        "without one")
    ok, detail = c.template_check(c.m, c.root)
    return (_passed if ok else _failed)(str(detail))


def _batch(c: _Ctx):
    b = c.m.batch
    tokens = DataGuard(c.m, c.root, "training").split("train")
    return BatchSampler(tokens, b.microbatch_per_device * b.data_parallel, b.seq_len,
                        seed=c.m.environment.seeds.get("data", 0))


def _smoke(c: _Ctx) -> GateResult:
    m = c.m
    model, opt, _ = build_from_manifest(m)
    x, y = _batch(c).next()
    logits = model(x)
    want = (x.shape[0], m.batch.seq_len, m.model["vocab"])
    if tuple(logits.shape) != want:
        return _failed(f"logits have shape {tuple(logits.shape)}, expected {want}")
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    if not math.isfinite(loss.item()):
        return _failed(f"loss is {loss.item()}")
    supervised = int(y.numel())  # objective "all": every target token
    intended = x.shape[0] * m.batch.seq_len
    if m.objective.supervised_tokens != "all":
        return _failed(f"supervised_tokens={m.objective.supervised_tokens!r}: this model has no completion mask")
    if supervised != intended:
        return _failed(f"{supervised} supervised tokens, {intended} intended")
    loss.backward()
    prefixes = m.objective.trainable
    bad, missing = [], []
    for name, p in model.named_parameters():
        meant = "*" in prefixes or any(name.startswith(pf) for pf in prefixes)
        has = p.grad is not None and bool(torch.isfinite(p.grad).all()) and bool(p.grad.abs().sum() > 0)
        if meant and not has:
            missing.append(name)
        if not meant and p.grad is not None and bool(p.grad.abs().sum() > 0):
            bad.append(name)
    if missing or bad:
        return _failed(f"gradients missing on {missing[:5]}; unintended gradients on {bad[:5]}")
    return _passed(f"loss {loss.item():.4f}, logits {want}, {supervised} supervised tokens, gradients on exactly "
                   f"the intended {sum(1 for _ in model.parameters())} tensors", loss=loss.item(),
                   supervised_tokens=supervised, batch=x.shape[0])


def _overfit(c: _Ctx) -> GateResult:
    m, plan = c.m, c.m.preflight
    model, opt, _ = build_from_manifest(m)
    for g in opt.param_groups:
        g["weight_decay"] = 0.0
    x, y = _batch(c).next()  # the disposable subset: one batch of the train split, never an evaluation split
    first = last = math.nan
    for i in range(plan.overfit_steps):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == 0:
            first = loss.item()
        last = loss.item()
    drop = (first - last) / first
    res = _passed if drop >= plan.overfit_min_drop else _failed
    return res(f"loss {first:.4f} -> {last:.4f} in {plan.overfit_steps} steps on one batch: fell {drop:.1%} "
               f"(needs {plan.overfit_min_drop:.0%})", first_loss=first, last_loss=last, drop=drop,
               steps=plan.overfit_steps)


def _save_load(c: _Ctx) -> GateResult:
    m = c.m
    model, opt, sched = build_from_manifest(m)
    sampler = _batch(c)
    x, y = sampler.next()
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
    sched.step()
    run = c.scratch / "save_load"
    with Journal.create(run / "journal.jsonl", signer=c.signer, background=False) as j:
        t0 = time.perf_counter()
        ev = save_checkpoint(run, j, step=0, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                             tokens=x.numel(), manifest_id=manifest_identity(m))
        save_s = time.perf_counter() - t0
        payload = load_payload(confined(run, ev.path, what="checkpoint path"))
        present = sorted(k for k in CONTRACT if k in payload)
        missing = [k for k in CONTRACT if k not in payload]
        if missing:
            return _failed(f"the checkpoint lacks {missing}")
        model2, opt2, sched2 = build_from_manifest(m)
        sampler2 = _batch(c)
        info = restore_checkpoint(run, j, ev.path, model=model2, optimizer=opt2, scheduler=sched2, sampler=sampler2)
    diffs = [k for k, v in model.state_dict().items() if not torch.equal(v, model2.state_dict()[k])]
    if diffs or info["manifest_id"] != manifest_identity(m) or sampler2.batches_drawn != sampler.batches_drawn:
        return _failed(f"restored state differs: tensors {diffs[:5]}, manifest id {info['manifest_id']}, "
                       f"sampler {sampler2.batches_drawn} vs {sampler.batches_drawn}")
    return _passed(f"checkpoint holds exactly the contract ({len(present)} parts) and restores bitwise "
                   f"({ev.bytes} bytes, saved in {save_s * 1e3:.1f} ms)", contents=present, bytes=ev.bytes,
                   save_s=save_s)


def _resume(c: _Ctx) -> GateResult:
    plan = c.m.preflight
    short = _shortened(c.m, plan.resume_steps)
    ctl = run_experiment(short, c.root, c.scratch / "control", signer=c.signer)
    part = run_experiment(short, c.root, c.scratch / "interrupted", signer=c.signer, stop_after=plan.resume_boundary)
    rest = run_experiment(short, c.root, c.scratch / "interrupted", signer=c.signer)
    if ctl["stopped"] or rest["stopped"]:
        return _failed(f"a run stopped: control {ctl['stopped']}, resumed {rest['stopped']} ({rest.get('reason')})")
    a, b = ctl["losses"], part["losses"] + rest["losses"]
    worst = max((abs(u - v) for u, v in zip(a, b)), default=0.0)
    if len(a) != len(b) or worst > 0.0:
        return _failed(f"resumed losses differ from the uninterrupted control by up to {worst:g}",
                       max_abs_diff=worst)
    return _passed(f"interrupted after {plan.resume_boundary} of {plan.resume_steps} updates and resumed: all "
                   f"{len(a)} losses equal the control's bitwise", boundary=plan.resume_boundary,
                   updates=plan.resume_steps, max_abs_diff=worst)


def _shortened(m: ExperimentManifest, updates: int) -> ExperimentManifest:
    """A shortened copy for the disposable resume test (its own identity; warm-up kept in updates)."""
    o = msgspec.structs.replace(m.optimization, planned_updates=updates, warmup_updates=m.warmup(),
                                warmup_fraction=None, warmup_fraction_of=None)
    ck = msgspec.structs.replace(m.checkpoint, every_updates=max(1, updates // 4))
    ev = msgspec.structs.replace(m.evaluation, hooks=[msgspec.structs.replace(h, every_updates=ck.every_updates,
                                                                              forbidden_regression=None)
                                                      for h in m.evaluation.hooks])
    q = msgspec.structs.replace(m.question, futility=None)
    return msgspec.structs.replace(m, optimization=o, checkpoint=ck, evaluation=ev, question=q)


def _probe(c: _Ctx) -> GateResult:
    m = c.m
    seqs = m.preflight.probe_seq_lens or [m.batch.seq_len]
    grid = []
    for bsz in m.preflight.probe_batches:
        for t in seqs:
            model, opt, _ = build_from_manifest(m)
            x = torch.randint(0, m.model["vocab"], (bsz, t))
            times = {"forward_s": 0.0, "backward_s": 0.0, "optimizer_s": 0.0}
            for _ in range(3):
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten())
                t1 = time.perf_counter()
                opt.zero_grad()
                loss.backward()
                t2 = time.perf_counter()
                opt.step()
                t3 = time.perf_counter()
                times["forward_s"] += (t1 - t0) / 3
                times["backward_s"] += (t2 - t1) / 3
                times["optimizer_s"] += (t3 - t2) / 3
            grid.append({"batch": bsz, "seq_len": t, **{k: round(v, 6) for k, v in times.items()}})
    peak = _peak_rss()
    limit = m.budget.max_memory_bytes
    measured = {"grid": grid, "peak_rss_bytes": peak,
                "memory_note": "CPU: process peak RSS (high-water over the whole probe); on a GPU this would be "
                               "peak allocated/reserved per configuration"}
    if limit is not None and peak > limit:
        return _failed(f"peak RSS {peak} bytes exceeds the budget {limit}", **measured)
    return _passed(f"{len(grid)} batch x sequence configurations ran; peak RSS {peak / 2**20:.0f} MiB"
                   + (f" within the {limit / 2**30:.1f} GiB budget" if limit else ""), **measured)


def _evals(c: _Ctx) -> GateResult:
    model, _, _ = build_from_manifest(c.m)
    guard = DataGuard(c.m, c.root, "evaluation")
    out = {}
    for h in c.m.evaluation.hooks:
        try:
            metrics, cases = evaluate_hook(c.m, h, model, guard)
        except (ValueError, KeyError) as e:
            return _failed(f"hook {h.name!r}: {e}")
        if not cases or not all(math.isfinite(v) for v in metrics.values()):
            return _failed(f"hook {h.name!r} gave {len(cases)} cases, metrics {metrics}")
        out[h.name] = {"cases": len(cases), **metrics}
    return _passed(f"{len(out)} hooks ran on the untrained model outside any optimizer step", hooks=out)


def authority_gate(m: ExperimentManifest, approval: SignedApproval | None,
                   approvers: dict[str, list[PublicKey]] | None) -> GateResult:
    """The authority gate on its own: blocked without a decision or without pinned approvers; failed for an
    approval that does not hold (another identity, an unlisted name, an unpinned or wrong key) or a rejection;
    passed only for an approval signed by a pinned approver the manifest names."""
    who = m.authority.approvers
    if approval is None:
        return _blocked(f"awaiting a decision by {', '.join(who)} on {manifest_identity(m)}; every technical gate "
                        "passing does not imply approval")
    if approvers is None:
        return _blocked("no trusted approvers are pinned (--approvers FILE or $TRAINLEDGER_TRUSTED_APPROVERS): "
                        "an approval cannot be checked against anyone's key")
    a = approval
    try:
        check_approval(a, manifest_id=manifest_identity(m), approvers=list(who), trusted=approvers)
    except ApprovalInvalid as e:
        return _failed(str(e), approval=a.to_dict())
    if a.decision != "approve":
        return _failed(f"{a.authority} decided {a.decision!r}" + (f": {a.note}" if a.note else ""),
                       approval=a.to_dict())
    return _passed(f"approved by {a.authority} (key {a.key_id})" + (f": {a.note}" if a.note else ""),
                   authority=a.authority, approval=a.to_dict())


def _authority(c: _Ctx) -> GateResult:
    return authority_gate(c.m, c.approval, c.approvers)


_FUNCS: dict[str, Callable[[_Ctx], GateResult]] = {
    "schema": _schema, "data_lineage": _lineage, "template_compat": _template, "smoke": _smoke,
    "overfit": _overfit, "save_load": _save_load, "resume_equivalence": _resume, "resource_probe": _probe,
    "eval_dry_run": _evals, "authority": _authority,
}


def run_preflight(m: ExperimentManifest, root: str | Path, journal: Journal, *,
                  template_check: Callable[[ExperimentManifest, Path], tuple[bool, str]] | None = None,
                  approval: SignedApproval | None = None,
                  approvers: dict[str, list[PublicKey]] | None = None,
                  progress: Callable[[GateResult], None] | None = None) -> PreflightResult:
    """Run the gates in order into ``journal``; stop at the first that does not pass."""
    ident = manifest_identity(m)
    results: list[GateResult] = []
    stopped: GateResult | None = None
    with tempfile.TemporaryDirectory(prefix="trainledger-preflight-") as tmp:
        ctx = _Ctx(m, Path(root), template_check, approval, approvers, Path(tmp))
        for gate in GATES:
            if stopped is not None:
                r = GateResult(gate, "not_run", f"not run: the preflight stopped at {stopped.gate}")
            else:
                try:
                    r = _FUNCS[gate](ctx)
                except Exception as e:  # noqa: BLE001 - a gate that crashes has failed, with the reason recorded
                    r = _failed(f"{type(e).__name__}: {e}")
                r.gate = gate
                if r.status != "passed":
                    stopped = r
            journal.append(PreflightGate(gate=gate, status=r.status, reason=r.reason, measured=r.measured,
                                         manifest_id=ident), durable=True)
            results.append(r)
            if progress is not None:
                progress(r)
    if stopped is None:
        status = "ready-to-train"
    else:
        status = f"experiment-specified-{'blocked' if stopped.status == 'blocked' else 'failed'}-before-training " \
                 f"at {stopped.gate}"
    journal.append(PreflightCompleted(manifest_id=ident, status=status,
                                      stopped_at=stopped.gate if stopped else None), durable=True)
    return PreflightResult(ident, status, stopped.gate if stopped else None, results)
