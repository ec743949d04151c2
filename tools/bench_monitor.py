#!/usr/bin/env python3
"""Speed of the health monitor: observe_step with a journal, and replay of a long journal.

    .venv/bin/python tools/bench_monitor.py                  # 200,000 timed steps; replay 1,000,000 steps

Two figures for observe_step, side by side (the monitor's default rule, format 1.6's "range"; the tight one and replay also under the rules of
formats 1.4-1.5, ``spike_rule=None``). In a **real loop**: a tiny causal LM (d_model 64, 2 layers,
block 32, batch 8) trained with AdamW on the CPU, one thread, and observe_step timed alone after each optimizer
step, with a signed journal and without one (the torch step evicts the caches a tight loop keeps warm; this is
the figure a user timing it inside nanoGPT sees). Both also with the detectors' common step in its Python lines
instead of the accelerator's C form (``baseline_step``), and with the steps handed over in batches of ``--batch``
(64: ``StepBuffer``, as the distributed loop does; the mean per step, queueing included), alternated in the same
run. In a **tight loop**: observe_step is timed call by call (the
timer's own cost subtracted) with a
signed journal (default seal policy), both detectors on, window 128, on a
noisy decaying loss curve, next to TensorBoard's SummaryWriter.add_scalar
for the same five scalars in the same run. Replay folds a journal of N
observed steps back into the monitor's state (reading and chain-checking
every line, then the reducer), as ``TrainingHealthMonitor.replay`` does.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainledger.journal import Journal, Signer  # noqa: E402
from trainledger.training.health.monitor import TrainingHealthMonitor  # noqa: E402

pc = time.perf_counter_ns


def curve(n: int, seed: int = 0) -> list[tuple[float, float, float]]:
    rng = random.Random(seed)
    return [(2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02), 0.8 + abs(rng.gauss(0, 0.05)), 0.25)
            for i in range(n)]


def timer_overhead() -> float:
    s = []
    for _ in range(100_000):
        t = pc()
        s.append(pc() - t)
    return statistics.median(s)


def bench_observe(tmp: Path, values, overhead: float, python_step: bool = False, spike_rule: str | None = "default") -> dict:
    python_detector_step(python_step)
    j = Journal.create(tmp / f"m-{time.time_ns()}.jsonl", signer=Signer.generate())
    m = TrainingHealthMonitor(journal=j, loss_window=128, grad_norm_window=128, peak_flops_per_sec=1e12,
                              spike_rule=spike_rule)
    samples = []
    obs = m.observe_step
    for i, (loss, g, dt) in enumerate(values):
        t = pc()
        obs(i, loss, grad_norm=g, step_time_s=dt, batch_size=8, tokens=4096, lr=3e-4)
        samples.append(pc() - t)
    j.close()
    python_detector_step(False)
    samples.sort()
    n = len(samples)
    return {"median_us": (samples[n // 2] - overhead) / 1000, "p99_us": (samples[int(n * 0.99)] - overhead) / 1000,
            "mean_us": (sum(samples) / n - overhead) / 1000}


def python_detector_step(on: bool) -> None:
    """Score with the detector's Python lines instead of their C form (``baseline_step``), or back."""
    from trainledger.training.health import detectors as health

    health._baseline_step = None if on else getattr(health._fast, "baseline_step", None)


def train_step(model, opt) -> tuple[float, float, float]:
    """One step of the tiny LM on a random batch: its loss, grad norm and time (the loop every in-loop figure times
    its call inside)."""
    import torch

    x = torch.randint(0, 64, (8, 32))
    y = torch.roll(x, -1, 1)
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    opt.step()
    lf, gf = loss.item(), float(gn)  # host syncs (free on the CPU)
    return lf, gf, time.perf_counter() - t0


def bench_in_loop(tmp: Path, steps: int, with_journal: bool, seed: int, python_step: bool = False,
                  batch: int = 0, spike_rule: str | None = "default") -> dict:
    """Median, p90 and mean of observe_step alone inside a real training loop (µs), the first 50 steps left out.
    ``batch``: the steps queued and handed over in batches of that many (``StepBuffer``, as the distributed loop and
    the framework callbacks do); a step's time is then its queueing plus, on the step that fills a batch, the
    batch's calls, and the mean is the figure (most steps only queue)."""
    import torch

    from trainledger.training import build_causal_lm, flop_config_from_causal_lm
    from trainledger.training.integrations.hooks import StepBuffer

    torch.manual_seed(seed)
    model = build_causal_lm(vocab=64, d_model=64, n_layer=2, n_head=2, block=32)
    cfg = flop_config_from_causal_lm(model, seq_len=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    j = Journal.create(tmp / f"loop-{time.time_ns()}.jsonl", signer=Signer.generate()) if with_journal else None
    mon = TrainingHealthMonitor(journal=j, flop_config=cfg, peak_flops_per_sec=1e11, spike_rule=spike_rule)
    samples = []
    python_detector_step(python_step)
    buf = StepBuffer(batch, max_wait_s=3600) if batch else None  # batches by count alone: the same every run
    for step in range(steps):
        lf, gf, dt = train_step(model, opt)
        t = pc()
        if buf is None:
            mon.observe_step(step, lf, grad_norm=gf, step_time_s=dt, batch_size=8, tokens=256, lr=1e-3)
        elif buf.add(step, lf, gf, {"step_time_s": dt, "batch_size": 8, "tokens": 256, "lr": 1e-3}):
            buf.hand_over(mon)
        samples.append(pc() - t)
    python_detector_step(False)
    if j is not None:
        j.close()
    s = sorted(samples[50:])
    return {"median_us": s[len(s) // 2] / 1000, "p90_us": s[int(len(s) * 0.9)] / 1000,
            "mean_us": statistics.fmean(s) / 1000}


def bench_recorder_in_loop(tmp: Path, steps: int, seed: int, batch: int | None = None) -> dict:
    """``Recorder.step`` alone inside the same real training loop (µs: median, p90, mean, the first 50 steps left
    out), one step at a time or with ``Recorder(batch=...)``."""
    import torch

    from trainledger.training import Recorder, build_causal_lm

    torch.manual_seed(seed)
    model = build_causal_lm(vocab=64, d_model=64, n_layer=2, n_head=2, block=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = []
    with Recorder(tmp / f"rec-{time.time_ns()}", signer=Signer.generate(), model=model, optimizer=opt,
                  batch=batch) as rec:
        for step in range(steps):
            lf, gf, dt = train_step(model, opt)
            t = pc()
            rec.step(step, lf, grad_norm=gf, step_time_s=dt, tokens=256, lr=1e-3)
            samples.append(pc() - t)
    s = sorted(samples[50:])
    return {"median_us": s[len(s) // 2] / 1000, "p90_us": s[int(len(s) * 0.9)] / 1000,
            "mean_us": statistics.fmean(s) / 1000}


def bench_tensorboard(tmp: Path, values, overhead: float) -> dict | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # noqa: BLE001 - the peer is optional
        return None
    w = SummaryWriter(log_dir=str(tmp / "tb"))
    samples = []
    for i, (loss, g, dt) in enumerate(values):
        t = pc()
        w.add_scalar("loss", loss, i)
        w.add_scalar("grad_norm", g, i)
        w.add_scalar("lr", 3e-4, i)
        w.add_scalar("step_time_s", dt, i)
        w.add_scalar("tokens", 4096, i)
        samples.append(pc() - t)
    w.close()
    samples.sort()
    return {"median_us": (samples[len(samples) // 2] - overhead) / 1000}


def bench_replay(tmp: Path, n: int, spike_rule: str | None = "default") -> dict:
    path = tmp / f"replay-{spike_rule}.jsonl"
    j = Journal.create(path, signer=Signer.generate(), background=False)
    m = TrainingHealthMonitor(journal=j, loss_window=128, grad_norm_window=128, peak_flops_per_sec=1e12,
                              spike_rule=spike_rule)
    for i, (loss, g, dt) in enumerate(curve(n, seed=1)):
        m.observe_step(i, loss, grad_norm=g, step_time_s=dt, batch_size=8, tokens=4096)
    j.close()
    t = time.perf_counter()
    proj = TrainingHealthMonitor.replay(path)
    dt = time.perf_counter() - t
    assert proj.report() == m.report(), "replay must rebuild the live state"
    return {"steps": n, "seconds": dt, "bytes": path.stat().st_size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--tb-steps", type=int, default=5_000)
    ap.add_argument("--replay-steps", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-steps", type=int, default=1_000, help="training steps per in-loop repeat")
    ap.add_argument("--batch", type=int, default=64, help="steps per hand-over in the batched in-loop figure")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="tl-mon-"))
    try:
        overhead = timer_overhead()
        values = curve(args.steps)
        loop_j, loop_n, loop_p, loop_b, loop_o, loop_bo, rec_1, rec_b = [], [], [], [], [], [], [], []
        for r in range(args.repeats):  # alternated, so that drift on a noisy machine hits all alike
            rec_1.append(bench_recorder_in_loop(tmp, args.loop_steps, r))
            rec_b.append(bench_recorder_in_loop(tmp, args.loop_steps, r, batch=args.batch))
            loop_n.append(bench_in_loop(tmp, args.loop_steps, False, r))
            loop_j.append(bench_in_loop(tmp, args.loop_steps, True, r))
            loop_p.append(bench_in_loop(tmp, args.loop_steps, True, r, python_step=True))
            loop_b.append(bench_in_loop(tmp, args.loop_steps, True, r, batch=args.batch))
            loop_o.append(bench_in_loop(tmp, args.loop_steps, True, r, spike_rule=None))
            loop_bo.append(bench_in_loop(tmp, args.loop_steps, True, r, batch=args.batch, spike_rule=None))
        obs, obs_p, obs_r = [], [], []
        for _ in range(args.repeats):
            obs.append(bench_observe(tmp, values, overhead))
            obs_p.append(bench_observe(tmp, values, overhead, python_step=True))
            obs_r.append(bench_observe(tmp, values, overhead, spike_rule=None))
        tb = [bench_tensorboard(tmp, values[: args.tb_steps], overhead) for _ in range(args.repeats)]
        rep = bench_replay(tmp, args.replay_steps)
        rep_old = bench_replay(tmp, args.replay_steps, spike_rule=None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median(o["median_us"] for o in obs)
    lj = statistics.median(o["median_us"] for o in loop_j)
    ln = statistics.median(o["median_us"] for o in loop_n)
    print(f"observe_step inside a real training loop (tiny LM, AdamW, {args.loop_steps} steps x {args.repeats}): "
          f"median {lj:.2f} µs with a signed journal (p90 {statistics.median(o['p90_us'] for o in loop_j):.2f}), "
          f"{ln:.2f} µs without one; target ≤ 25 µs (≤ 10 µs a step batched); with the detector's step in Python instead of C: "
          f"{statistics.median(o['median_us'] for o in loop_p):.2f} µs with a signed journal; with the rules of "
          f"formats 1.4-1.5 (spike_rule=None): {statistics.median(o['median_us'] for o in loop_o):.2f} µs")
    print(f"  the same steps handed over in batches of {args.batch} (StepBuffer, as training/distributed/loop.py): "
          f"mean {statistics.median(o['mean_us'] for o in loop_b):.2f} µs a step, queueing included, against a mean of "
          f"{statistics.median(o['mean_us'] for o in loop_j):.2f} µs a step one call at a time; with the rules of "
          f"formats 1.4-1.5: mean {statistics.median(o['mean_us'] for o in loop_bo):.2f} µs a step batched")
    def fig(rs: list[dict]) -> str:
        return (f"median {statistics.median(o['median_us'] for o in rs):.2f} µs, p90 "
                f"{statistics.median(o['p90_us'] for o in rs):.2f}, mean {statistics.median(o['mean_us'] for o in rs):.2f}")

    print(f"Recorder.step in the same loop (signed journal, monitor, checkpointer): one step at a time {fig(rec_1)}; "
          f"Recorder(batch={args.batch}) {fig(rec_b)}; target median ≤ 10 µs, p90 ≤ 15 µs")
    print(f"observe_step with a signed journal, window 128, both detectors: median {med:.2f} µs, "
          f"p99 {statistics.median(o['p99_us'] for o in obs):.2f} µs, mean {statistics.median(o['mean_us'] for o in obs):.2f} µs; "
          f"with the detector's step in Python: median {statistics.median(o['median_us'] for o in obs_p):.2f} µs; "
          f"with the rules of formats 1.4-1.5 (spike_rule=None): median {statistics.median(o['median_us'] for o in obs_r):.2f} µs, "
          f"mean {statistics.median(o['mean_us'] for o in obs_r):.2f} µs")
    if tb[0] is not None:
        tbm = statistics.median(t["median_us"] for t in tb)
        print(f"TensorBoard 5 × add_scalar: median {tbm:.2f} µs  →  observe_step is {tbm / med:.1f}× cheaper")
    print(f"replay of {rep['steps']:,} steps ({rep['bytes'] / 1e6:.0f} MB): {rep['seconds']:.2f} s "
          f"({rep['steps'] / rep['seconds'] / 1e6:.2f} M steps/s); with the rules of formats 1.4-1.5: "
          f"{rep_old['seconds']:.2f} s ({rep_old['steps'] / rep_old['seconds'] / 1e6:.2f} M steps/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
