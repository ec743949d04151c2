#!/usr/bin/env python3
"""Detection on real training curves: false alarms on healthy runs, recall and latency on real faults.

    .venv/bin/python tools/bench_detection.py --out docs/bench/detection.txt     # train (cached), then score
    .venv/bin/python tools/bench_detection.py --rescore                           # score the cached curves again
    .venv/bin/python tools/bench_detection.py --models mlp,linreg --seeds 1        # a quick look

The curves are made by the project's own tiny models, trained on the CPU in one thread, each run healthy and with
injected faults, seeds fixed (bench-out/detection/, one JSON file a run: the per-step batch loss and gradient norm
before clipping, and the steps a fault was injected at):

- ``mlp``: a 32-256-256-1 ReLU MLP regressing ``y = sin(x . w / 4)`` (AdamW 1e-3, batches of 64): loss to ~1e-4;
- ``linreg``: linear regression of 16 features with noise of std 1e-3 (SGD 0.05 with a cosine decay): loss to
  ~1e-6;
- ``cnn``: a two-layer CNN classifying 10 noisy 12x12 templates (SGD 0.02, momentum 0.9, batches of 32), which it
  fits: batch losses span decades;
- ``charlm``: the reference causal LM (d 48, 2 layers, context 32) on this repository's own docs as bytes (as they
  were at one commit: tools/bench_corpus.py), AdamW 3e-3 with warm-up and cosine decay;
- ``logreg``: logistic regression of 20 features with 10% positives (SGD 0.1, batches of 64): a loss that falls
  from ln 2 to about 0.25 and stays noisy;
- ``gru``: a GRU (d 32) classifying sequences of 16 tokens of 8 by whether token 0 or token 1 is the more frequent
  (AdamW 3e-3, batches of 32);
- ``vae``: a VAE (MLP, latent 8) of the CNN's noisy templates, its KL weight annealed from 0 to 1 over the first
  40% of the run (Adam 1e-3, batches of 32): a loss that rises as the weight does;
- ``mlp_bf16``, ``mlp_amp``, ``mlp_accum``: the MLP in pure bfloat16, under bfloat16 autocast, and with its
  batch as four accumulated micro-batches;
- ``hfgpt2``: a tiny GPT-2 (transformers, from a config) under the Hugging Face Trainer on the same bytes, the
  loss and grad norm as the Trainer logs them; each fault is a run of its own, injected once (at 60%);
- ``ddplm`` and ``ddplm0``: the charlm under real torchrun, DDP over gloo, 2 ranks (tools/bench_detection_ddp.py),
  1,500 steps; each fault a run of its own, injected once (at 60%) on rank 1's batch: ``ddplm`` is rank 1's
  curve, ``ddplm0`` rank 0's (another batch, the same averaged gradient).

Faults, each injected on its own at three steps of the run (40%, 60% and 80% of it): from the healthy run's state
just before that step, a branch runs ``BRANCH`` steps with the fault on its first step and the healthy run's batches
after it (batches come from a generator seeded by (seed, step)), so the healthy run is each episode's counterfactual:

- ``loss_x50``: the step's loss multiplied by 50 before the backward pass (a loss-scale bug: the gradient too);
- ``lr_x50``: the learning rate times 50 for that one update (the loss rises from the next step: its onset);
- ``corrupt_batch``: a batch the pipeline broke: undecoded bytes for the CNN's images (noise in 0..255), features
  not normalised (x 100), the LM's targets not shifted (y = x), the GRU's labels flipped;
- ``random_tokens`` (LM only): a batch of uniformly random bytes;
- ``lr_ramp`` (the models trained here, not the Trainer's or torchrun's runs, which cannot branch): a slow
  divergence, the lr ramped geometrically to 100x over 200 steps and held (a branch of 300 steps); *visible* when
  the branch's 25-step median loss or grad norm reaches 3x the healthy run's, and *caught* when a rule flags
  anything from the ramp's start to 100 steps after that (its latency counted from the 3x step: negative is
  before it);
- a data-order change after a resume (the MLP: the loader restarted from its beginning instead of its cursor),
  folded through the product's own projection with every step's batch fingerprint (:func:`data_order`).

An episode is *visible* when, within 3 steps of its onset, the loss or the grad norm is at least twice the healthy
run's at the same step (a fault that changes nothing is not one), and *in range* when it stays under the maximum of
the 64 healthy steps before it (no rule can tell it from an ordinary batch without flagging those too).

Each curve is folded through each rule set, step by step, as replay folds a journal: ``linear`` (the seed's rule:
robust z of the raw loss, formats 1.0-1.3), ``log`` (formats 1.4-1.5: the log of the loss, episodes), a plain
6-sigma rule like OLMo-core's (mean + 6 standard deviations of the last 128 values, loss and grad norm), the
prototype the format 1.6 rule was designed with (:class:`_Series`, :func:`rule_candidate`; parameters chosen on
seeds 0 and 1, seeds 2 and 3 held out), and that rule as the product folds it by default (``spike_rule="range"``,
with the grad norm's immediate factor of 1.25 chosen after ddplm0's corrupted batches were seen only suspected on
every seed), and the default from format 1.10: that with the blow-up and divergence rules. Per model and fault:
visible episodes *caught* (an anomaly at the onset or the step after, detected by
then), only *suspected* (a ``spike_suspected`` there), the mean latency, how many of them were in range, how many
injections were invisible, and of the visible ones out of range (the target's denominator) how many were caught; per
model, false alarms per 1,000 healthy steps (any anomaly on a healthy run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = ROOT / "bench-out" / "detection"
MODELS = ("mlp", "linreg", "cnn", "logreg", "gru", "vae", "mlp_bf16", "mlp_amp", "mlp_accum", "charlm", "hfgpt2",
          "ddplm", "ddplm0")
#: what a plain run scores (the README's table); the others by name (--models)
DEFAULT_MODELS = ("mlp", "linreg", "cnn", "charlm", "hfgpt2", "ddplm", "ddplm0")
STEPS = {"mlp": 4000, "linreg": 3000, "cnn": 4000, "logreg": 3000, "gru": 3000, "vae": 3000, "mlp_bf16": 4000,
         "mlp_amp": 4000, "mlp_accum": 4000, "charlm": 3000, "hfgpt2": 800, "ddplm": 1500, "ddplm0": 1500}
FAULTS = ("none", "loss_x50", "lr_x50", "corrupt_batch", "random_tokens", "lr_ramp")
LM_ONLY = {"random_tokens"}
#: faults only the models trained here in one process can take (a branch from a state): not the Trainer's or torchrun's
BRANCHED_ONLY = {"lr_ramp"}
#: a slow divergence: the lr ramped geometrically to RAMP_X times over RAMP_STEPS steps, then held there
RAMP_X, RAMP_STEPS = 100.0, 200


# ---------------------------------------------------------------- the models


def _mlp(seed: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(32, 1, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch(gen):
        x = torch.randn(64, 32, generator=gen)
        return x, torch.sin(x @ w / 4)

    return model, opt, None, batch, torch.nn.functional.mse_loss, "features"


def _mlp_variant(kind: str):
    """The MLP of ``mlp`` three ways users train: ``bf16`` (its parameters and inputs in bfloat16, AdamW on them),
    ``amp`` (fp32 parameters, the forward under ``torch.autocast`` in bfloat16) and ``accum`` (batches of 64 as 4
    micro-batches of 16, a backward each, one optimizer step)."""
    def build(seed: int, steps: int):
        import torch

        model, opt, sched, batch, loss_fn, inputs = _mlp(seed, steps)
        if kind == "bf16":
            model = model.to(torch.bfloat16)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

            def batch16(gen, batch=batch):
                x, y = batch(gen)
                return x.to(torch.bfloat16), y.to(torch.bfloat16)

            return model, opt, sched, batch16, lambda out, y: loss_fn(out.float(), y.float()), inputs
        if kind == "amp":
            class Amp(torch.nn.Module):
                def __init__(self, inner):
                    super().__init__()
                    self.inner = inner

                def forward(self, x):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        return self.inner(x).float()

            wrapped = Amp(model)
            return wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-3), sched, batch, loss_fn, inputs
        model.accumulate = 4
        return model, opt, sched, batch, loss_fn, inputs
    return build


def _linreg(seed: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 1, generator=g)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))) + 0.01)

    def batch(gen):
        x = torch.randn(32, 16, generator=gen)
        return x, x @ w + 1e-3 * torch.randn(32, 1, generator=gen)

    return model, opt, sched, batch, torch.nn.functional.mse_loss, "features"


def _cnn(seed: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 12, 12, generator=g)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(16 * 9, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    def batch(gen):
        y = torch.randint(0, 10, (32,), generator=gen)
        x = templates[y] + 0.8 * torch.randn(32, 1, 12, 12, generator=gen)
        return x, y

    return model, opt, None, batch, torch.nn.functional.cross_entropy, "pixels"


def _logreg(seed: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(20, 1, generator=g)
    model = torch.nn.Linear(20, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def batch(gen):
        x = torch.randn(64, 20, generator=gen)
        y = ((x @ w).squeeze(1) + 0.5 * torch.randn(64, generator=gen) > 1.28 * w.norm()).float()  # about 10% ones
        return x, y

    def loss_fn(out, y):
        return torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), y)

    return model, opt, None, batch, loss_fn, "features"


def _gru(seed: int, steps: int):
    import torch

    class Gru(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 32)
            self.rnn = torch.nn.GRU(32, 32, batch_first=True)
            self.out = torch.nn.Linear(32, 2)

        def forward(self, x):
            return self.out(self.rnn(self.emb(x))[0][:, -1])

    torch.manual_seed(seed)
    model = Gru()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def batch(gen):
        x = torch.randint(0, 8, (32, 16), generator=gen)
        return x, ((x == 0).sum(1) > (x == 1).sum(1)).long()

    return model, opt, None, batch, torch.nn.functional.cross_entropy, "labels"


def _vae(seed: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 144, generator=g)

    class Vae(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.nn.Sequential(torch.nn.Linear(144, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
            self.dec = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 144))
            self.register_buffer("t", torch.zeros(()))  # steps taken: the KL weight's clock (copied with a branch)

        def forward(self, x):
            mu, logvar = self.enc(x).chunk(2, dim=1)
            z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
            beta = torch.clamp(self.t / (0.4 * steps), max=1.0)
            return self.dec(z), mu, logvar, beta

    class Anneal:  # the KL weight's schedule, stepped as a scheduler is
        def __init__(self, model):
            self.model = model

        def step(self):
            self.model.t += 1

    torch.manual_seed(seed)
    model = Vae()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def batch(gen):
        y = torch.randint(0, 10, (32,), generator=gen)
        return templates[y] + 0.5 * torch.randn(32, 144, generator=gen), y

    def loss_fn(out, y):
        recon, mu, logvar, beta = out
        x = loss_fn.x
        rec = ((recon - x) ** 2).sum(1).mean()
        kl = (-0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1)).mean()
        return rec + beta * kl

    class Model(torch.nn.Module):  # hands the loss its input (the target of a reconstruction)
        def __init__(self):
            super().__init__()
            self.vae = model

        def forward(self, x):
            loss_fn.x = x
            return self.vae(x)

    wrapped = Model()
    return wrapped, opt, Anneal(model), batch, loss_fn, "features"


_DOC_BYTES = None


def _charlm(seed: int, steps: int):
    import torch

    from trainledger.training.reference.model import build_causal_lm

    tokens = _doc_tokens()
    block = 32
    model = build_causal_lm(vocab=256, d_model=48, n_layer=2, n_head=4, block=block)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warm = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))) + 0.05))

    def batch(gen):
        starts = torch.randint(0, tokens.numel() - block - 1, (16,), generator=gen).tolist()
        x = torch.stack([tokens[s:s + block] for s in starts])
        y = torch.stack([tokens[s + 1:s + 1 + block] for s in starts])
        return x, y

    def loss_fn(logits, y):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    return model, opt, sched, batch, loss_fn, "tokens"


BUILD = {"mlp": _mlp, "linreg": _linreg, "cnn": _cnn, "logreg": _logreg, "gru": _gru, "vae": _vae,
         "mlp_bf16": _mlp_variant("bf16"), "mlp_amp": _mlp_variant("amp"), "mlp_accum": _mlp_variant("accum"),
         "charlm": _charlm}


def fault_steps(steps: int) -> list[int]:
    return [int(steps * 0.4), int(steps * 0.6), int(steps * 0.8)]


BRANCH = 100  # steps a faulty branch runs past its injection
RAMP_BRANCH = 300  # ... and a slow divergence's


def _lr_x(fault: str, k: int) -> float:
    """The lr multiple of a branch's ``k``-th step (0: the injection)."""
    if fault == "lr_x50":
        return 50.0 if k == 0 else 1.0
    if fault == "lr_ramp":
        return RAMP_X ** (min(k, RAMP_STEPS) / RAMP_STEPS)
    return 1.0


def _step(model, opt, sched, params, x, y, loss_fn, *, lr_x: float = 1.0, loss_x: float = 1.0):
    import torch

    saved = None
    if lr_x != 1.0:
        saved = [grp["lr"] for grp in opt.param_groups]
        for grp in opt.param_groups:
            grp["lr"] *= lr_x
    opt.zero_grad(set_to_none=True)
    k = getattr(model, "accumulate", 1)  # gradient accumulation: k micro-batches, a backward each
    if k == 1:
        loss = loss_fn(model(x), y) * loss_x
        loss.backward()
    else:
        loss = 0.0
        for xc, yc in zip(x.chunk(k), y.chunk(k)):
            part = loss_fn(model(xc), yc) * loss_x / k
            part.backward()
            loss = loss + part.detach()
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    opt.step()
    if saved is not None:
        for grp, lr in zip(opt.param_groups, saved):
            grp["lr"] = lr
    if sched is not None:
        sched.step()
    return float(loss.item()), float(norm.item())


def _faulty(fault: str, inputs: str, x, y, gen):
    """The batch of an injected step (``corrupt_batch``, ``random_tokens``); (x, y) unchanged for the others."""
    import torch

    if fault == "corrupt_batch":
        if inputs == "labels":
            return x, 1 - y                # every label flipped
        if inputs == "tokens":
            return x, x.clone()            # the targets not shifted
        if inputs == "pixels":             # undecoded bytes: noise in 0..255
            return 255.0 * torch.rand(x.shape, generator=gen), y
        return x * 100.0, y                # features not normalised
    if fault == "random_tokens":
        return torch.randint(0, 256, x.shape, generator=gen), torch.randint(0, 256, y.shape, generator=gen)
    return x, y


def train(model_name: str, seed: int) -> dict:
    """The healthy run (per-step loss and pre-clip grad norm) and, from its state just before each of
    :func:`fault_steps`, one branch per fault: the fault injected on that step, then ``BRANCH`` steps on the same
    batches as the healthy run (so the healthy run is each branch's counterfactual, step for step)."""
    import copy

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    steps = STEPS[model_name]
    model, opt, sched, batch, loss_fn, inputs = BUILD[model_name](seed, steps)
    at = fault_steps(steps)
    faults = [f for f in FAULTS if f != "none" and (f not in LM_ONLY or inputs == "tokens")]
    params = list(model.parameters())
    losses, norms = [], []
    branches: dict[str, list[dict]] = {f: [] for f in faults}
    t0 = time.process_time()

    def batch_at(step: int):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return batch(gen), gen

    for step in range(steps):
        if step in at:
            snap = copy.deepcopy((model, opt, sched))
            for f in faults:
                m2, o2, s2 = copy.deepcopy(snap)
                p2 = list(m2.parameters())
                bl, bg = [], []
                for k in range(step, min(steps, step + (RAMP_BRANCH if f == "lr_ramp" else BRANCH))):
                    (x, y), gen = batch_at(k)
                    if k == step:
                        x, y = _faulty(f, inputs, x, y, gen)
                    lv, gv = _step(m2, o2, s2, p2, x, y, loss_fn, lr_x=_lr_x(f, k - step),
                                   loss_x=50.0 if (k == step and f == "loss_x50") else 1.0)
                    bl.append(lv)
                    bg.append(gv)
                branches[f].append({"at": step, "loss": bl, "grad_norm": bg})
        (x, y), _ = batch_at(step)
        lv, gv = _step(model, opt, sched, params, x, y, loss_fn)
        losses.append(lv)
        norms.append(gv)
    return {"model": model_name, "seed": seed, "steps": steps, "loss": losses, "grad_norm": norms,
            "branches": branches, "cpu_s": time.process_time() - t0}


def _doc_tokens():
    import torch

    global _DOC_BYTES
    if _DOC_BYTES is None:
        from bench_corpus import corpus_bytes  # the docs at a fixed commit, so the curves do not move with them

        _DOC_BYTES = torch.tensor(list(corpus_bytes()), dtype=torch.long)
    return _DOC_BYTES


def _hf_run(seed: int, steps: int, fault: str, at: int | None) -> tuple[list[float], list[float], list[int]]:
    """One run of a tiny GPT-2 (2 layers, d64, bytes) under the Hugging Face Trainer (AdamW 1e-3, warm-up and cosine,
    clipping at 1.0, batches of 16 x 64 bytes of the docs): the loss and grad norm the Trainer itself logs each step
    (logging_steps=1). ``fault`` is injected at step ``at`` through ``compute_loss``: it sees the step's batch
    before the forward pass and its loss before the backward pass; the lr is multiplied there and the scheduler
    sets it back at its own step. Also each step's tokens (the Trainer's own count, ``num_input_tokens_seen``): the
    docs do not split into whole batches, so each epoch ends on a partial one."""
    import tempfile

    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    tokens = _doc_tokens()
    block = 64
    n = (tokens.numel() - 1) // block

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            x = tokens[i * block:(i + 1) * block]
            return {"input_ids": x, "labels": x}

    class Faulty(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            hit = self.state.global_step == at
            if hit and fault == "random_tokens":
                g = torch.Generator().manual_seed(seed * 7 + at)
                r = torch.randint(0, 256, inputs["input_ids"].shape, generator=g)
                inputs = {**inputs, "input_ids": r, "labels": r}
            if hit and fault == "corrupt_batch":   # the labels one position off: the targets not aligned
                inputs = {**inputs, "labels": torch.roll(inputs["labels"], 1, dims=1)}
            if hit and fault == "lr_x50":
                for grp in self.optimizer.param_groups:
                    grp["lr"] *= 50
            loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
            if hit and fault == "loss_x50":
                loss = loss * 50
            return loss

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=block,
                                       bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory(prefix="tl-bench-det-") as d:
        args = TrainingArguments(output_dir=d, max_steps=steps, per_device_train_batch_size=16, logging_steps=1,
                                 learning_rate=1e-3, warmup_steps=50, lr_scheduler_type="cosine", report_to="none",
                                 use_cpu=True, seed=seed, disable_tqdm=True, save_strategy="no",
                                 include_num_input_tokens_seen=True)
        t = Faulty(model=model, args=args, train_dataset=Blocks())
        t.remove_callback(transformers.trainer_callback.PrinterCallback)   # the logs are read from log_history
        t.train()
    logs = [h for h in t.state.log_history if "loss" in h and "grad_norm" in h]
    seen = [0] + [int(h["num_input_tokens_seen"]) for h in logs]
    return ([float(h["loss"]) for h in logs], [float(h["grad_norm"]) for h in logs],
            [b - a for a, b in zip(seen, seen[1:])])


def _train_hf(seed: int) -> dict:
    """The Trainer cannot branch from a state: each fault is its own run from the same seed, injected once, at 60%
    of the run; the healthy run must match it step for step up to the injection (checked)."""
    import torch

    torch.set_num_threads(1)
    steps = STEPS["hfgpt2"]
    t0 = time.process_time()
    loss, grad, tokens = _hf_run(seed, steps, "none", None)
    s = int(steps * 0.6)
    branches = {}
    for f in (f for f in FAULTS if f != "none" and f not in BRANCHED_ONLY):
        fl, fg, ft = _hf_run(seed, steps, f, s)
        if fl[:s] != loss[:s]:
            raise SystemExit(f"hfgpt2 seed {seed}: the {f} run differs from the healthy run before its fault")
        branches[f] = [{"at": s, "loss": fl[s:s + BRANCH], "grad_norm": fg[s:s + BRANCH], "tokens": ft[s:s + BRANCH]}]
    return {"model": "hfgpt2", "seed": seed, "steps": steps, "loss": loss, "grad_norm": grad, "tokens": tokens,
            "branches": branches, "cpu_s": time.process_time() - t0}


def _train_ddp(seed: int) -> dict[str, dict]:
    """The charlm under real torchrun, 2 ranks over gloo (tools/bench_detection_ddp.py): each fault a run of its own
    from the same seed, injected once at 60% on rank 1's batch (every rank's update for lr_x50), checked equal to the
    healthy run before it. Two curves: rank 1's (``ddplm``: its own batch's loss) and rank 0's (``ddplm0``: another
    rank's batch, the same averaged gradient)."""
    import subprocess
    import tempfile

    steps = STEPS["ddplm"]
    s = int(steps * 0.6)
    t0 = time.perf_counter()
    curves: dict[str, dict[int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tl-bench-ddp-") as d:
        for f in (f for f in FAULTS if f not in BRANCHED_ONLY):
            out = Path(d) / f
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                str(ROOT / "tools" / "bench_detection_ddp.py"), str(seed), str(steps), f,
                                str(s if f != "none" else -1), str(out)], capture_output=True, text=True, env=env,
                               timeout=1800)
            if r.returncode != 0:
                raise SystemExit(f"ddplm seed {seed} {f}: torchrun exited {r.returncode}: {r.stderr[-2000:]}")
            curves[f] = {k: json.loads((out / f"rank-{k}.json").read_text()) for k in (0, 1)}
    wall = time.perf_counter() - t0
    runs = {}
    for name, k in (("ddplm", 1), ("ddplm0", 0)):
        h = curves["none"][k]
        branches = {}
        for f in (f for f in FAULTS[1:] if f not in BRANCHED_ONLY):
            c = curves[f][k]
            if c["loss"][:s] != h["loss"][:s]:
                raise SystemExit(f"{name} seed {seed}: the {f} run differs from the healthy run before its fault")
            branches[f] = [{"at": s, "loss": c["loss"][s:s + BRANCH], "grad_norm": c["grad_norm"][s:s + BRANCH]}]
        runs[name] = {"model": name, "seed": seed, "steps": steps, "loss": h["loss"], "grad_norm": h["grad_norm"],
                      "branches": branches, "cpu_s": wall}
    return runs


def run_of(model_name: str, seed: int, *, fresh: bool = False) -> dict:
    path = CACHE / f"{model_name}-{seed}.json"
    if path.exists() and not fresh:
        return json.loads(path.read_text())
    if model_name in ("ddplm", "ddplm0"):  # one torchrun job makes both ranks' curves
        CACHE.mkdir(parents=True, exist_ok=True)
        for name, c in _train_ddp(seed).items():
            tmp = (CACHE / f"{name}-{seed}.json").with_suffix(".tmp")
            tmp.write_text(json.dumps(c))
            os.replace(tmp, CACHE / f"{name}-{seed}.json")
        return json.loads(path.read_text())
    c = _train_hf(seed) if model_name == "hfgpt2" else train(model_name, seed)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(c))
    os.replace(tmp, path)
    return c


def episodes(run: dict, fault: str) -> list[dict]:
    """Each injection of ``fault`` as a curve of its own (the healthy run up to it, then the branch), with its onset
    (the step after the bad update for ``lr_x50``), whether it is *visible* (within 3 steps of the onset, the loss or
    the grad norm at least twice the healthy run's) and whether it stays *in range* (neither above the maximum of
    the 64 healthy steps before it: no rule can tell it from an ordinary batch without flagging those)."""
    out = []
    for b in run["branches"].get(fault, []):
        s = b["at"]
        if fault == "lr_ramp":
            out.append(_ramp_episode(run, b))
            continue
        onset = s + (fault == "lr_x50")
        k = onset - s
        hl, hg = run["loss"][s:s + BRANCH], run["grad_norm"][s:s + BRANCH]
        ratio = max(max(b["loss"][j] / max(hl[j], 1e-300), b["grad_norm"][j] / max(hg[j], 1e-300))
                    for j in range(k, min(k + 4, len(hl))))
        peak_l, peak_g = max(b["loss"][k:k + 4]), max(b["grad_norm"][k:k + 4])
        in_range = peak_l <= max(run["loss"][s - 64:s]) and peak_g <= max(run["grad_norm"][s - 64:s])
        out.append({"model": run["model"], "fault": fault, "onset": onset, "visible": ratio >= 2.0,
                    "in_range": in_range, "steps": s + len(b["loss"]),
                    "loss": run["loss"][:s] + b["loss"], "grad_norm": run["grad_norm"][:s] + b["grad_norm"],
                    **({"tokens": run["tokens"][:s] + b["tokens"]} if "tokens" in run else {})})
    return out


def _ramp_episode(run: dict, b: dict) -> dict:
    """A slow divergence: the step where the branch's 25-step median loss (or grad norm) first reaches 3x the healthy
    run's over the same steps (``three``; None: it never does, and the episode is not visible)."""
    s, n = b["at"], len(b["loss"])
    three = None
    for j in range(25, n + 1):
        for series in ("loss", "grad_norm"):
            healthy = run[series][s + j - 25:s + j]
            if len(healthy) == 25 and statistics.median(b[series][j - 25:j]) >= 3 * statistics.median(healthy):
                three = s + j - 1
                break
        if three is not None:
            break
    return {"model": run["model"], "fault": "lr_ramp", "onset": s, "three": three, "visible": three is not None,
            "in_range": False, "steps": s + n, "loss": run["loss"][:s] + b["loss"],
            "grad_norm": run["grad_norm"][:s] + b["grad_norm"],
            **({"tokens": run["tokens"][:s] + b["tokens"]} if "tokens" in run else {})}


def data_order(seed: int, *, checkpoint: int = 2000, crash: int = 2400, after: int = 100) -> dict:
    """A resume whose data order changed, folded through the product's health projection (``data_divergence``):
    the MLP trained to step ``crash`` with its state kept at ``checkpoint``; then resumed from that state twice,
    once correctly (the loader at its cursor) and once with the loader restarted from its beginning (a cursor not
    saved), each to ``crash + after``. Every step carries its batch's fingerprint. Returns, for each resume, the
    steps its data_divergence anomalies name."""
    import copy

    import torch

    from trainledger.journal import RunResumed, StepObserved
    from trainledger.training.health.detectors import HealthProjection, RunConfigured
    from trainledger.training.health.fingerprint import batch_fingerprint

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model, opt, sched, batch, loss_fn, _ = _mlp(seed, crash + after)
    params = list(model.parameters())

    def batch_of(k: int):
        return batch(torch.Generator().manual_seed(seed * 1_000_003 + k))

    events, snap = [], None
    for step in range(crash + 1):
        if step == checkpoint + 1:
            snap = copy.deepcopy((model, opt, sched))
        x, y = batch_of(step)
        lv, gv = _step(model, opt, sched, params, x, y, loss_fn)
        events.append(StepObserved(step=step, loss=lv, grad_norm=gv, batch_fingerprint=float(batch_fingerprint(x, y))))
    out = {}
    for name, cursor in (("correct", lambda k: k), ("loader restarted", lambda k: k - checkpoint - 1)):
        m, o, sc = copy.deepcopy(snap)
        ps = list(m.parameters())
        redo = [RunResumed(reason="crash", from_step=checkpoint)]
        for step in range(checkpoint + 1, crash + after + 1):
            x, y = batch_of(cursor(step))
            lv, gv = _step(m, o, sc, ps, x, y, loss_fn)
            redo.append(StepObserved(step=step, loss=lv, grad_norm=gv,
                                     batch_fingerprint=float(batch_fingerprint(x, y))))
        for rule, cfg in (("1.4-1.5", {}), ("range", RANGE_DEFAULTS)):
            proj = HealthProjection(RunConfigured(loss_scale="log", **cfg))
            found = [a for ev in events + redo for a in proj.apply(ev)]
            ended = [e for e in proj.take_ended() if e.series == "data"]
            out[(name, rule)] = {"data_divergence": [a.step for a in found if a.anomaly == "data_divergence"],
                                 "ended": [(e.step, e.last_step, e.steps, e.closed_by) for e in ended],
                                 "other": [(a.anomaly, a.step) for a in found if a.anomaly != "data_divergence"]}
    return out


# ---------------------------------------------------------------- the rules: a curve -> anomalies and suspicions


def rule_trainledger(scale: str, **rule):
    def run(c: dict) -> tuple[list[tuple[int, int]], list[int]]:
        from trainledger.journal import StepObserved
        from trainledger.training.health.detectors import HealthProjection, RunConfigured

        proj = HealthProjection(RunConfigured(loss_scale=scale, **rule))
        flagged: list[tuple[int, int]] = []
        tokens = c.get("tokens") or [None] * len(c["loss"])  # (the Trainer's runs: each step's own count)
        for i, (loss, gn) in enumerate(zip(c["loss"], c["grad_norm"])):
            for a in proj.apply(StepObserved(step=i, loss=loss, grad_norm=gn, tokens=tokens[i])):
                flagged.append((a.step, a.detected_at if a.detected_at is not None else a.step))
        return flagged, [s.step for s in proj.suspected]
    return run


def rule_olmo(c: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """mean + 6 sigma of the last 128 values, on the loss and on the grad norm (OLMo-core's spike rule)."""
    out = set()
    for series in ("loss", "grad_norm"):
        win: deque[float] = deque(maxlen=128)
        for i, v in enumerate(c[series]):
            if len(win) == 128:
                m = sum(win) / 128
                sd = math.sqrt(max(0.0, sum(w * w for w in win) / 128 - m * m))
                if v > m + 6 * sd:
                    out.add(i)
            win.append(v)
    return [(i, i) for i in sorted(out)], []


class _Series:
    """A prototype of the candidate rules (issue's design, not yet the product's): one scored series on the log
    scale, a causal window of accepted values, and three ways to flag a step:

    - z: the robust z of the log (as formats 1.4-1.5), confirmed by the next step unless far above (``immediate``);
      a window whose MAD is 0 (more than half its values equal: exact zeros) scores no z;
    - excursion: a value above the window's maximum by a factor of ``max(R, (max / median) ** E)`` is flagged at
      once, however the window's spread looks (a one-step bad batch);
    - joint (in :func:`rule_candidate`): the loss and the grad norm both above ``J`` robust sigma and above their
      windows' maxima on one step, and both still above ``Jc`` on the next (flagged then: latency one step).
    """

    def __init__(self, p: dict):
        self.p = p
        self.win: deque[float] = deque()
        self.sorted: list[float] = []
        self.pending = None
        self.episode = 0

    def _stats(self):
        s = self.sorted
        n = len(s)
        if n < self.p["min_periods"]:
            return None
        med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        dev = sorted(abs(v - med) for v in s)
        mad = dev[n // 2] if n % 2 else 0.5 * (dev[n // 2 - 1] + dev[n // 2])
        return med, mad, s[-1]

    def add(self, x: float) -> None:
        import bisect

        self.win.append(x)
        bisect.insort(self.sorted, x)
        if len(self.win) > self.p["window"]:
            old = self.win.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def z(self, x: float) -> float:
        st = self._stats()
        if st is None:
            return 0.0
        med, mad, _ = st
        return (x - med) / (1.4826 * mad) if mad > 0 else 0.0

    def score(self, raw: float) -> tuple[str | None, float]:
        """(why this step is flagged now or None, its z); adds the value to the window unless it is a spike."""
        p = self.p
        x = math.log(max(raw, 1e-30))
        st = self._stats()
        if st is None:
            self.add(x)
            return None, 0.0
        med, mad, top = st
        z = (x - med) / (1.4826 * mad) if mad > 0 else 0.0
        if self.episode:
            if z > p["confirm"] * p["z"] or x > top:
                self.episode -= 1
                return None, z
            self.episode = 0
        if self.pending is not None:
            if z > p["confirm"] * p["z"]:
                self.pending = None
                self.episode = p["window"]
                return "z (confirmed)", z
            self.add(self.pending)
            self.pending = None
        jump = max(math.log(p["R"]), p["E"] * (top - med))
        if x > top + jump:
            self.episode = p["window"]
            return "excursion", z
        if z > p["z"]:
            if z > p["immediate"] * p["z"]:
                self.episode = p["window"]
                return "z", z
            self.pending = x
            return None, z
        self.add(x)
        return None, z


#: the prototype's parameters, chosen on seeds 0 and 1 (a grid over R, E, J, Jc and the immediate factor; seeds 2
#: and 3 held out: ``--first-seed 2``)
CANDIDATE = {"window": 64, "min_periods": 16, "z": 8.0, "immediate": 1.5, "confirm": 0.4, "R": 8.0, "E": 1.5,
             "J": 3.0, "Jc": 3.0}


def rule_candidate(p: dict = CANDIDATE):
    def run(c: dict) -> tuple[list[tuple[int, int]], list[int]]:
        loss, grad = _Series(p), _Series(p)
        flagged = []
        joint = None  # the step whose loss and grad norm both rose above their windows, awaiting the next step
        for i, (lv, gv) in enumerate(zip(c["loss"], c["grad_norm"])):
            xl, xg = math.log(max(lv, 1e-30)), math.log(max(gv, 1e-30))
            lz, gz = loss.z(xl), grad.z(xg)
            tops = (loss.sorted[-1] if loss.sorted else math.inf, grad.sorted[-1] if grad.sorted else math.inf)
            in_episode = loss.episode or grad.episode
            a, _ = loss.score(lv)
            b, _ = grad.score(gv)
            if a or b:
                flagged.append((i - 1 if "confirmed" in (a or b) else i, i))
                joint = None
                continue
            if joint is not None and lz > p["Jc"] and gz > p["Jc"]:
                flagged.append((joint, i))   # still elevated, both: an optimizer blow-up or a bad stretch
                loss.episode = grad.episode = p["window"]
                joint = None
                continue
            joint = None
            if not in_episode and lz > p["J"] and gz > p["J"] and xl > tops[0] and xg > tops[1]:
                joint = i
        return flagged, []
    return run


from trainledger.training.health.detectors import RANGE_DEFAULTS  # noqa: E402  (the monitor's default rule)
from trainledger.training.health.trend import TREND_DEFAULTS  # noqa: E402  (format 1.10's, beside it)

RULES = {"linear (seed, 1.0-1.3)": rule_trainledger("linear"), "log (1.4-1.5)": rule_trainledger("log"),
         "OLMo-core 6σ/128": rule_olmo, "candidate (prototype)": rule_candidate(),
         "range (1.6)": rule_trainledger("log", **RANGE_DEFAULTS),
         "range + blow-up + divergence (1.10, the default)": rule_trainledger("log", **RANGE_DEFAULTS,
                                                                              **TREND_DEFAULTS)}


def false_alarms(run: dict, rule) -> int:
    """Anomalies on the healthy run: every one is a false alarm."""
    flagged, _ = rule({k: run[k] for k in ("loss", "grad_norm", "tokens") if k in run})
    return len(flagged)


def caught(ep: dict, rule) -> tuple[str, int | None]:
    """'caught' (an anomaly at the onset or the step after, detected by then), 'suspected' (only a spike_suspected
    there) or 'missed'; and the latency. A slow divergence (``lr_ramp``): 'caught' when an anomaly is detected from
    its onset to 100 steps after it reached 3x, the latency counted from the 3x step (negative: before it got
    there)."""
    flagged, suspected = rule(ep)
    if ep["fault"] == "lr_ramp":
        hits = [d - ep["three"] for step, d in flagged if ep["onset"] <= d <= ep["three"] + 100]
        return ("caught", min(hits)) if hits else ("missed", None)
    o = ep["onset"]
    hits = [d - o for step, d in flagged if o <= step <= o + 1 and d <= o + 1]
    if hits:
        return "caught", min(hits)
    return ("suspected" if any(o <= q <= o + 1 for q in suspected) else "missed"), None


def _over_median(c: dict, s: int) -> tuple[float, float]:
    """The loss and the grad norm at step ``s`` of curve ``c`` over their medians of the 64 steps before it."""
    out = []
    for series in ("loss", "grad_norm"):
        before = [x for x in c[series][max(0, s - 64):s] if x is not None and math.isfinite(x)]
        v = c[series][s]
        out.append(v / statistics.median(before) if before and statistics.median(before) > 0 and v is not None
                   else math.nan)
    return out[0], out[1]


def _span(xs) -> str:
    v = sorted(x for x in xs if math.isfinite(x))
    return f"{v[0]:.3g}-{v[-1]:.3g}x (median {v[len(v) // 2]:.3g}x)" if v else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated, of {', '.join(MODELS)} (default: {', '.join(DEFAULT_MODELS)})")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per model (default 2)")
    ap.add_argument("--first-seed", type=int, default=0, help="score seeds from this one on (held-out seeds)")
    ap.add_argument("--rescore", action="store_true", help="only score runs already in bench-out/detection")
    ap.add_argument("--fresh", action="store_true", help="train every run again, even when cached")
    ap.add_argument("--rules", default=None, help="comma-separated rule names to score (default: all)")
    ap.add_argument("--out", default=None, help="also write the tables here")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; one of {', '.join(MODELS)}")
    rules = {k: v for k, v in RULES.items() if args.rules is None or any(r in k for r in args.rules.split(","))}
    lines = [f"# .venv/bin/python tools/bench_detection.py {' '.join(sys.argv[1:])}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load "
             f"{os.getloadavg()[0]:.2f} before"]
    t0 = time.perf_counter()
    runs = []
    for m in models:
        for seed in range(args.first_seed, args.seeds):
            if args.rescore and not (CACHE / f"{m}-{seed}.json").exists():
                continue
            r = run_of(m, seed, fresh=args.fresh)
            runs.append(r)
            print(f"  {m:<7} seed {seed}: {r['steps']:,} steps, final loss {r['loss'][-1]:.3g}, "
                  f"{r['cpu_s']:.1f} s CPU to train with its branches", file=sys.stderr, flush=True)
    lines.append(f"# {len(runs)} healthy runs and their fault branches ({time.perf_counter() - t0:.0f} s to train or "
                 "load); the healthy runs' last 500 steps:")
    for m in models:
        tail = sorted(x for r in runs if r["model"] == m for x in r["loss"][-500:])
        if tail:
            zeros = sum(1 for r in runs if r["model"] == m for x in r["loss"] if x == 0.0)
            lines.append(f"#   {m:<7} loss median {tail[len(tail) // 2]:.3g}, p99 {tail[int(len(tail) * 0.99)]:.3g}, "
                         f"max {tail[-1]:.3g}; exact zeros {zeros}")
    eps = {(m, f): [e for r in runs if r["model"] == m for e in episodes(r, f)] for m in models for f in FAULTS
           if f != "none"}
    lines.append("# an episode is visible when the loss or grad norm is at least 2x the healthy run's within 3 steps "
                 "of onset; 'in range': not above the 64 healthy steps before it")
    for name, rule in rules.items():
        t1 = time.perf_counter()
        lines += ["", f"## {name}", f"{'model':<8} {'fault':<14} {'caught':>8} {'suspected':>9} {'latency':>8} "
                                     f"{'in range':>8} {'invisible':>9} {'false/1k':>9} {'out of range caught':>20}"]
        for m in models:
            hr = [r for r in runs if r["model"] == m]
            if not hr:
                continue
            fa = sum(false_alarms(r, rule) for r in hr) / sum(r["steps"] for r in hr) * 1000
            lines.append(f"{m:<8} {'(healthy)':<14} {'':>8} {'':>9} {'':>8} {'':>8} {'':>9} {fa:>9.2f}")
            for f in FAULTS[1:]:
                es = eps.get((m, f)) or []
                if not es:
                    continue
                vis = [e for e in es if e["visible"]]
                res = [caught(e, rule) for e in vis]
                lat = [x for _, x in res if x is not None]
                oor = [r for (r, _), e in zip(res, vis) if not e["in_range"]]
                oc = f"{oor.count('caught')}/{len(oor)}" if oor else "-"
                lines.append(f"{m:<8} {f:<14} {sum(1 for r, _ in res if r == 'caught'):>4}/{len(vis):<3} "
                             f"{sum(1 for r, _ in res if r == 'suspected'):>9} "
                             f"{(sum(lat) / len(lat)) if lat else float('nan'):>8.2f} "
                             f"{sum(1 for e in vis if e['in_range']):>8} {len(es) - len(vis):>9} {'':>9} "
                             f"{oc:>20}")
        lines.append(f"(scored in {time.perf_counter() - t1:.1f} s)")
    lines += ["", "## totals over every model and seed scored: visible episodes that leave the healthy range, caught "
                  "within a step; the worst model's false alarms per 1,000 healthy steps"]
    for name, rule in rules.items():
        out = [e for es in eps.values() for e in es if e["visible"] and not e["in_range"] and e["fault"] != "lr_ramp"]
        res = [caught(e, rule)[0] for e in out]
        ramps = [caught(e, rule)[0] for es in eps.values() for e in es if e["visible"] and e["fault"] == "lr_ramp"]
        worst = max((sum(false_alarms(r, rule) for r in runs if r["model"] == m)
                     / sum(r["steps"] for r in runs if r["model"] == m) * 1000, m)
                    for m in models if any(r["model"] == m for r in runs))
        lines.append(f"{name:<24} caught {res.count('caught')}/{len(out)} ({res.count('caught') / len(out):.1%}), "
                     f"only suspected {res.count('suspected')}; false alarms {worst[0]:.2f}/1k at worst ({worst[1]})"
                     + (f"; slow divergences caught by 100 steps past 3x {ramps.count('caught')}/{len(ramps)}"
                        if ramps else ""))
    default = RULES.get("range + blow-up + divergence (1.10, the default)")
    if default is not None and (args.rules is None or default in rules.values()):
        lines += ["", "## the default rule's false alarms beside the faults it must catch, in one unit: the loss and the "
                      "grad norm over their medians of the 64 steps before (healthy runs: each flagged step; faults: "
                      "each visible episode's onset, by what the rule said of it)"]
        for m in models:
            hr = [r for r in runs if r["model"] == m]
            flags = [_over_median(r, s) for r in hr for s, _ in default(r)[0]]
            if not flags:
                continue
            row = [f"{m:<8} {len(flags)} false alarms: loss {_span(x for x, _ in flags)}, grad norm "
                   f"{_span(y for _, y in flags)}"]
            for verdict in ("caught", "suspected", "missed"):
                at = [_over_median(e, e["onset"]) for (mm, f), es in eps.items() if mm == m and f != "lr_ramp"
                      for e in es if e["visible"] and caught(e, default)[0] == verdict]
                if at:
                    row.append(f"{len(at)} faults {verdict}: loss {_span(x for x, _ in at)}, grad norm "
                               f"{_span(y for _, y in at)}")
            lines.append("; ".join(row))
    if "mlp" in models:
        t1 = time.perf_counter()
        lines += ["", "## data-order change after a resume (mlp; checkpoint at 2,000, crash at 2,400, resumed to 2,500; "
                      "the product's rules: formats 1.4-1.5, and the default, whose episodes count one a resume)"]
        for seed in range(args.first_seed, args.seeds):
            d = data_order(seed)
            for (name, rule), r in d.items():
                dd = r["data_divergence"]
                shown = (f"{len(dd)} data_divergence anomal{'y' if len(dd) == 1 else 'ies'}, "
                         + (f"step {dd[0]}" if len(dd) == 1 else f"steps {dd[0]}-{dd[-1]}")) if dd else "no data_divergence"
                ends = "".join(f"; its episode to step {e[1]} ({e[2]} steps, closed {e[3]})" for e in r["ended"])
                lines.append(f"seed {seed}  {name:<17} {rule:<8} {shown}{ends}; other anomalies {len(r['other'])}")
        lines.append(f"(trained and folded in {time.perf_counter() - t1:.1f} s)")
    ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    lines += ["", f"# whole process: CPU {ru.ru_utime + ru.ru_stime:.1f} s (its torchrun jobs {rc.ru_utime + rc.ru_stime:.1f} "
                  f"s), peak RSS {ru.ru_maxrss / 1024:.0f} MiB; load {os.getloadavg()[0]:.2f} after"]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
