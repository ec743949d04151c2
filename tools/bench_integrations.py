#!/usr/bin/env python3
"""The integrations' targets on the real code paths, side by side with the peers, in one run:

    .venv/bin/python tools/bench_integrations.py [--steps 200] [--reps 3] [--skip-imports]

1. Hugging Face Trainer, a tiny GPT-2 built from a config, on the CPU, ``--steps`` steps: the median step (the wall
   time between consecutive ``on_step_begin`` calls, so every callback's work is in it) with no reporting, with
   trainledger's callback, and with transformers' own TensorBoard, MLflow (a local file store) and W&B (offline)
   callbacks, each logging every step (``logging_steps=1``: trainledger records every step). Runs interleaved,
   ``--reps`` times; medians.
2. Lightning, a small MLP (a 1 ms step, no clipping: the callback computes the gradient norm itself), and 2b. the
   tiny GPT-2 of 1. with the same batch, clipping at 1.0 as the Trainer does by default: the same against
   Lightning's CSV, TensorBoard and MLflow loggers (``log_every_n_steps=1``).
3. The callbacks' own time per step, measured inside a run (each of their methods and hooks timed), and the Trainer
   callback switched on and off every ``--block-steps`` steps within one run (hooks and the clip wrapper with it),
   each "on" block against the mean of its two "off" neighbours: the end-to-end differences of 1. and 2. cannot
   resolve 1% of a step on this machine, whose runs drift by more than that.
4. Imports: a 1,000,000-scalar TensorBoard log (250,000 steps x 4 tags) and a 100,000-iteration Megatron log.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ["WANDB_MODE"] = "offline"
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the local file store: "MLflow (local)"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _gpt2():
    """The tiny GPT-2 every LM table uses (2 layers, d64, a 64-token vocabulary), seeded."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=64, n_positions=64, bos_token_id=0,
                                      eos_token_id=0))


def _token_ids():
    """4,096 rows of 32 token ids, seeded: the LM tables' data."""
    import torch

    return torch.randint(0, 64, (4096, 32), generator=torch.Generator().manual_seed(0))


def _hf_dataset():
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.x = _token_ids()

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    return Tokens()


def _lightning_lm_module(*, log: bool):
    """The tiny GPT-2 as a LightningModule, fed batches of 8 x 32 tokens (``_lightning_lm_loader``)."""
    import lightning as L
    import torch

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lm = _gpt2()

        def training_step(self, batch, i):
            loss = self.lm(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
            if log:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=5e-5)

    return LM()


def _lightning_lm_loader():
    import torch

    return torch.utils.data.DataLoader([{"input_ids": x} for x in _token_ids()], batch_size=8)


def _hf(kind: str, tmp: Path, steps: int, signer) -> float:
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    transformers.logging.set_verbosity_error()

    class Clock(TrainerCallback):
        def __init__(self):
            self.t: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t.append(time.perf_counter())

    model = _gpt2()
    out = tmp / f"hf-{kind}-{time.monotonic_ns()}"
    report = {"none": "none", "trainledger": "none", "tensorboard": "tensorboard", "mlflow": "mlflow",
              "wandb": "wandb"}[kind]
    os.environ["MLFLOW_TRACKING_URI"] = (tmp / "mlruns").as_uri()
    os.environ["WANDB_DIR"] = str(tmp)
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=8, logging_steps=1,
                             report_to=report, use_cpu=True, seed=0, disable_tqdm=True, save_strategy="no")
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tb")
    clock = Clock()
    cbs: list = [clock]
    if kind == "trainledger":
        from trainledger.training.integrations.hf import TrainledgerCallback

        cbs.append(TrainledgerCallback(signer=signer))
    Trainer(model=model, args=args, train_dataset=_hf_dataset(), callbacks=cbs).train()
    if kind == "wandb":
        import wandb

        wandb.finish()
    d = [b - a for a, b in zip(clock.t[10:], clock.t[11:])]  # after warm-up
    return statistics.median(d)


def _lightning(kind: str, tmp: Path, steps: int, signer, model: str = "mlp") -> float:
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger

    class Clock(L.Callback):
        def __init__(self):
            self.t: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.t.append(time.perf_counter())

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                           torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    if model == "mlp":
        xs = torch.randn(8192, 64)
        dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, xs.sum(1, keepdim=True)), batch_size=32)
        module = M()
    else:  # the tiny GPT-2 of the HF table, same batch (8 x 32 tokens)
        dl = _lightning_lm_loader()
        module = _lightning_lm_module(log=True)
    out = tmp / f"pl-{kind}-{time.monotonic_ns()}"
    clock = Clock()
    cbs: list = [clock]
    logger = {"none": lambda: False, "trainledger": lambda: False, "csv": lambda: CSVLogger(str(out)),  # only the one
              "tensorboard": lambda: TensorBoardLogger(str(out)),  # measured is made (MLflow's needs mlflow)
              "mlflow": lambda: MLFlowLogger(tracking_uri=(tmp / "mlruns").as_uri())}[kind]()
    if kind == "trainledger":
        from trainledger.training.integrations.lightning import TrainledgerCallback

        cbs.append(TrainledgerCallback(out, signer=signer))
    # The LM clips at 1.0, as the HF Trainer does by default (Lightning then computes the norm itself); the MLP does
    # not clip, so trainledger's callback computes the gradient norm on its own there.
    L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=logger, callbacks=cbs, log_every_n_steps=1,
              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
              gradient_clip_val=None if model == "mlp" else 1.0).fit(module, dl)
    d = [b - a for a, b in zip(clock.t[10:], clock.t[11:])]
    return statistics.median(d)


def _lightning_lm(kind: str, tmp: Path, steps: int, signer) -> float:
    return _lightning(kind, tmp, steps, signer, model="gpt2")


def _blocks(times: list[float], block: int, skip: int = 2) -> dict:
    """Per-step durations from consecutive step starts, grouped in blocks of ``block`` steps that alternate with
    (even blocks) and without (odd) trainledger; each "with" block's median against the mean of its neighbours'."""
    d = [b - a for a, b in zip(times, times[1:])]
    meds = []
    for i in range(len(d) // block):
        part = d[i * block + skip:(i + 1) * block]  # the steps right after a switch are left out
        meds.append(statistics.median(part))
    ratios = []
    for i in range(2, len(meds) - 1, 2):  # block 0 is the warm-up
        ratios.append(meds[i] / ((meds[i - 1] + meds[i + 1]) / 2) - 1)
    ratios.sort()
    q = len(ratios) // 4
    return {"median": statistics.median(ratios), "q1": ratios[q], "q3": ratios[-q - 1], "pairs": len(ratios),
            "step": statistics.median(meds[1::2])}


def _hf_blocks(tmp: Path, steps: int, signer, block: int) -> dict:
    """One Trainer run in which trainledger's callback is switched on and off every ``block`` steps (its hooks and
    the clip wrapper too): the drift of a machine that moves by more than 1% between runs cancels out."""
    import transformers
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from trainledger.training.integrations import hooks as _common
    from trainledger.training.integrations.hf import TrainledgerCallback

    transformers.logging.set_verbosity_error()

    class Switchable(TrainledgerCallback):
        enabled = True

        def set(self, on: bool) -> None:
            if on == self.enabled:
                return
            if on:
                self._hooks.insert(0, self._model.register_forward_hook(self._forward, with_kwargs=True))
                _common.tap_clip(self)
            else:
                self._hooks.pop(0).remove()
                _common.untap_clip(self)
            self.enabled = on

        def on_step_begin(self, *a, **k):
            if self.enabled:
                return super().on_step_begin(*a, **k)

        def on_pre_optimizer_step(self, *a, **k):
            if self.enabled:
                return super().on_pre_optimizer_step(*a, **k)

        def on_step_end(self, *a, **k):
            if self.enabled:
                return super().on_step_end(*a, **k)

    tl = Switchable(signer=signer)

    class Clock(TrainerCallback):
        def __init__(self):
            self.t: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % block == 0:
                tl.set((state.global_step // block) % 2 == 0)
            self.t.append(time.perf_counter())

    model = _gpt2()
    args = TrainingArguments(output_dir=str(tmp / f"hf-blocks-{time.monotonic_ns()}"), max_steps=steps,
                             per_device_train_batch_size=8, logging_steps=1, report_to="none", use_cpu=True, seed=0,
                             disable_tqdm=True, save_strategy="no")
    clock = Clock()
    Trainer(model=model, args=args, train_dataset=_hf_dataset(), callbacks=[clock, tl]).train()
    return _blocks(clock.t, block)


def _lightning_blocks(tmp: Path, steps: int, signer, block: int) -> dict:
    """The same within-run comparison for the Lightning callback on the tiny GPT-2 (clipping at 1.0)."""
    import lightning as L

    from trainledger.training.integrations import hooks as _common
    from trainledger.training.integrations.lightning import TrainledgerCallback

    class Switchable(TrainledgerCallback):
        enabled = True

        def set(self, on: bool) -> None:
            if on != self.enabled:
                (_common.tap_clip if on else _common.untap_clip)(self)
                self.enabled = on

        def on_train_batch_start(self, *a, **k):
            if self.enabled:
                return super().on_train_batch_start(*a, **k)

        def on_before_optimizer_step(self, *a, **k):
            if self.enabled:
                return super().on_before_optimizer_step(*a, **k)

        def on_train_batch_end(self, trainer, *a, **k):
            if self.enabled:
                return super().on_train_batch_end(trainer, *a, **k)
            self._step = trainer.global_step  # what the callback would have noted

    out = tmp / f"pl-blocks-{time.monotonic_ns()}"
    tl = Switchable(out, signer=signer)

    class Clock(L.Callback):
        def __init__(self):
            self.t: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step % block == 0:
                tl.set((trainer.global_step // block) % 2 == 0)
            self.t.append(time.perf_counter())

    dl = _lightning_lm_loader()
    clock = Clock()
    L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[clock, tl],
              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
              gradient_clip_val=1.0).fit(_lightning_lm_module(log=False), dl)
    return _blocks(clock.t, block)


def _timed(cls, names: tuple[str, ...], acc: dict[str, float], *, inner: tuple[str, ...] = (),
           marks: list[dict[str, float]] | None = None):
    """A subclass of a trainledger callback whose methods (hooks included) add their own time to ``acc`` (``acc["t"]``:
    their total); ``inner``: methods they call, timed apart and left out of the total; ``marks``: a copy of ``acc``
    taken as each call of ``names[0]`` (the step's first hook) begins, so a steady state can be told from the run's
    first steps (the monitor's creation, the first batch's imports)."""

    class Timed(cls):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            for name in names + inner:
                f = getattr(self, name)

                def wrap(f=f, name=name, top=name in names, first=name == names[0]):
                    def timed(*a, **k):
                        if first and marks is not None:
                            marks.append(dict(acc))
                        t = time.perf_counter()
                        try:
                            return f(*a, **k)
                        finally:
                            dt = time.perf_counter() - t
                            if top:
                                acc["t"] += dt
                            acc[name] = acc.get(name, 0.0) + dt
                    return timed
                setattr(self, name, wrap())

    return Timed


def _self_time(tmp: Path, steps: int, reps: int, signer, skip: int = 48) -> None:
    """The callbacks' own time per step, measured inside the run: every method and hook of theirs timed (the end-to-end
    difference above cannot resolve 1% of a step on this machine: runs drift by more than that), from step ``skip`` on
    (the steady state: the first steps pay once for the monitor's creation and first imports), beside the same over
    the whole run. "of which the fold": the monitor's work on a batch of queued steps and its journal lines, spread
    over the steps. The timer's own cost is in every figure: an empty hook timed the same way is printed with them."""
    from trainledger.training.integrations import hf, lightning

    pl = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")
    for title, mod, names, empty, fn in (
            ("HF Trainer", hf, ("on_step_begin", "on_pre_optimizer_step", "on_step_end", "_forward", "_accumulated"),
             "on_optimizer_step", _hf),
            ("Lightning", lightning, pl, "on_before_zero_grad", _lightning),
            ("Lightning LM", lightning, pl, "on_before_zero_grad", _lightning_lm)):
        real = mod.TrainledgerCallback
        per, whole, step, hooks = [], [], [], {}
        for _ in range(reps):
            acc: dict[str, float] = {"t": 0.0}
            marks: list[dict[str, float]] = []
            mod.TrainledgerCallback = _timed(real, names, acc, inner=("_drain", empty), marks=marks)
            try:
                step.append(fn("trainledger", tmp, steps, signer))
            finally:
                mod.TrainledgerCallback = real
            a0, n = marks[skip], len(marks) - 1 - skip
            a1 = marks[-1]
            per.append((a1["t"] - a0["t"]) / n)
            whole.append(acc["t"] / steps)
            for name in names + ("_drain", empty):
                hooks.setdefault(name, []).append((a1.get(name, 0.0) - a0.get(name, 0.0)) / n)
        p, s = statistics.median(per), statistics.median(step)
        print(f"  {title:<11} callback's own time {p * 1e6:6.1f} us per step from step {skip} on, {p / s:.2%} of its "
              f"{s * 1e3:.3f} ms step; {statistics.median(whole) * 1e6:.1f} us over the whole run (median of {reps})",
              flush=True)
        label = {"_drain": "of which the fold", empty: f"(an empty hook, {empty}, timed alike)"}
        print("              by hook: " + ", ".join(f"{label.get(n, n)} {statistics.median(v) * 1e6:.1f} us"
                                                   for n, v in hooks.items()), flush=True)


def _table(title: str, kinds: list[str], fn, tmp: Path, steps: int, reps: int, signer) -> None:
    res: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(reps):
        for k in kinds:
            res[k].append(fn(k, tmp, steps, signer))
    base = statistics.median(res["none"])
    print(title, flush=True)
    for k in kinds:
        m = statistics.median(res[k])
        extra = "" if k == "none" else f"  +{(m - base) * 1e6:8.1f} us per step ({m / base - 1:+.2%})"
        print(f"  {k:<12} median step {m * 1e3:7.3f} ms{extra}", flush=True)


def _imports(tmp: Path) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    tb = tmp / "tb"
    w = EventFileWriter(str(tb))
    for s in range(250_000):
        for tag, v in (("train/loss", 3.0 * math.exp(-s / 1e5)), ("train/grad_norm", 1.0),
                       ("train/learning_rate", 3e-4), ("train/tokens_per_s", 1e5)):
            w.add_event(event_pb2.Event(step=s, wall_time=1.0 + s, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=v)])))
    w.close()
    meg = tmp / "meg.log"
    with open(meg, "w") as f:
        f.write("Megatron-LM training log\n")
        for k in range(1, 100_001):
            f.write(f" iteration {k:>8}/  100000 | consumed samples: {k * 512:>12} | elapsed time per iteration (ms):"
                    f" {1200 + k % 7:.1f} | learning rate: 1.500E-04 | global batch size:   512 | lm loss: "
                    f"{7.0 - 1e-5 * k:.6E} | loss scale: 65536.0 | grad norm: 1.{k % 1000:03d} | number of skipped "
                    "iterations:   0 | number of nan iterations:   0 |\n")
    from trainledger.journal import keygen

    priv, _ = keygen(tmp / "keys")
    tl = [sys.executable, "-m", "trainledger", "import"]
    for what, cmd, target in (("TensorBoard, 1,000,000 scalars", [*tl, "tensorboard", str(tb), str(tmp / "i1")], 10),
                              ("Megatron, 100,000 iterations", [*tl, "megatron", str(meg), str(tmp / "i2")], 3)):
        t = time.perf_counter()
        p = subprocess.run([*cmd, "--key", str(priv)], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        print(f"4. import {what}: {dt:.2f} s (target {target} s; the whole command, interpreter start included)",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-imports", action="store_true")
    ap.add_argument("--only-self-time", action="store_true",
                    help="section 3's per-hook times alone (no peers, no on/off blocks, no imports)")
    ap.add_argument("--block-steps", type=int, default=20, help="steps per on/off block of the within-run comparison")
    ap.add_argument("--block-pairs", type=int, default=40, help="on/off pairs of blocks in it")
    args = ap.parse_args()
    from trainledger.journal import Signer

    signer = Signer.generate()
    with tempfile.TemporaryDirectory(prefix="tl-bench-int-") as d:
        tmp = Path(d)
        if args.only_self_time:
            print(f"3. trainledger's callbacks, their own time inside the run ({args.steps} steps):", flush=True)
            _self_time(tmp, args.steps, args.reps, signer)
            return 0
        _table(f"1. HF Trainer, tiny GPT-2 (2 layers, d64), CPU, {args.steps} steps, every step logged, median of "
               f"{args.reps}:", ["none", "trainledger", "tensorboard", "mlflow", "wandb"], _hf, tmp, args.steps,
               args.reps, signer)
        _table(f"2. Lightning, MLP 64-256-256-1, CPU, {args.steps} steps, every step logged, median of {args.reps}:",
               ["none", "trainledger", "csv", "tensorboard", "mlflow"], _lightning, tmp, args.steps, args.reps,
               signer)
        _table(f"2b. Lightning, the tiny GPT-2 of 1. (same batch, clipping at 1.0 like the Trainer), CPU, {args.steps} "
               f"steps, every step logged, median of {args.reps}:", ["none", "trainledger", "csv", "tensorboard", "mlflow"], _lightning_lm, tmp,
               args.steps, args.reps, signer)
        print(f"3. trainledger's callbacks, their own time inside the run ({args.steps} steps):", flush=True)
        _self_time(tmp, args.steps, args.reps, signer)
        b = _hf_blocks(tmp, args.block_steps * 2 * args.block_pairs, signer, args.block_steps)
        print(f"  HF Trainer  switched on and off every {args.block_steps} steps within one run ({b['pairs']} pairs, "
              f"median step {b['step'] * 1e3:.3f} ms without): {b['median']:+.2%} (interquartile {b['q1']:+.2%} to "
              f"{b['q3']:+.2%})", flush=True)
        b = _lightning_blocks(tmp, args.block_steps * 2 * args.block_pairs, signer, args.block_steps)
        print(f"  Lightning LM switched on and off every {args.block_steps} steps within one run ({b['pairs']} pairs, "
              f"median step {b['step'] * 1e3:.3f} ms without): {b['median']:+.2%} (interquartile {b['q1']:+.2%} to "
              f"{b['q3']:+.2%})", flush=True)
        if not args.skip_imports:
            _imports(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
