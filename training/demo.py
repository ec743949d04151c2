"""The torch-free demo run behind ``trainledger demo``.

It simulates a training loop (a warm-up/cosine learning rate, a loss curve
that decays toward a floor, noise, one loss spike) and writes it as a signed
journal exactly as an embedded emitter would. The numbers are simulated and
the run folder says so in ``run_opened.meta``; the journal is real.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from trainledger.journal.errors import UsageError
from trainledger.training.health.mfu import record_compute
from trainledger.journal.events import StepObserved
from trainledger.training.health.detectors import HealthProjection, RunConfigured
from trainledger.journal.keys import load_signer, run_key
from trainledger.journal.writer import Journal


def _lr(step: int, steps: int, peak: float = 3e-4, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, frac)))


def run_demo(out: Path, *, steps: int = 2000, seed: int = 0, key: Path | None = None) -> tuple[Path, Path]:
    """Create ``out`` with ``journal.jsonl`` and its public key; return (journal, public key).

    Signs with ``key`` (a private key file, outside ``out``) when given, else with a new key kept outside the run
    folder (:func:`trainledger.journal.keys.run_key`); the public key goes into ``out``.
    """
    if (out / "journal.jsonl").exists():
        raise UsageError(f"{out}/journal.jsonl already exists; choose another OUT_DIR")
    priv, pub = run_key(out, key)
    signer = load_signer(priv)
    rng = random.Random(seed)
    spike_at = int(steps * 0.6)
    tokens = 8 * 1024
    meta = {"demo": True, "simulated": "loss, grad norm and step times are simulated, not trained",
            "steps": steps, "seed": seed}
    path = out / "journal.jsonl"
    with Journal.create(path, signer=signer, meta=meta) as j:
        # The monitor's fold, torch-free: what it concludes is recorded, so replay finds it consistent.
        config = RunConfigured(n_params=124_000_000, n_layer=12, n_head=12, head_dim=64, seq_len=1024,
                               peak_flops_per_sec=312e12, devices=8, loss_scale="log")
        j.append(config)
        health = HealthProjection(config)
        for step in range(steps):
            loss = 1.2 + 2.4 * math.exp(-step / (steps / 5)) + rng.gauss(0.0, 0.02)
            grad_norm = 0.8 + 0.3 * math.exp(-step / (steps / 4)) + abs(rng.gauss(0.0, 0.05))
            if step == spike_at:
                loss *= 4.0
                grad_norm *= 12.0
            ev = StepObserved(step=step, loss=loss, grad_norm=grad_norm, lr=_lr(step, steps),
                              step_time_s=0.25 + abs(rng.gauss(0.0, 0.01)), examples=8,
                              tokens=tokens, supervised_tokens=tokens - 8)
            j.append(ev)
            for anomaly in health.apply(ev):
                j.append(anomaly)
            for suspected in health.take_suspected():
                j.append(suspected)
        record_compute(j)  # the training compute, one signed figure (trainledger prove --compute)
    return path, pub
