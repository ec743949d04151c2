#!/usr/bin/env python3
"""What logging a step's scalars costs inside a real training loop, trainledger beside its peers, in one run:

    .venv/bin/pip install -c constraints.txt -e '.[bench]'   # wandb and TensorBoard, the peers
    .venv/bin/python tools/bench_log.py [--steps 3000] [--reps 2] [--out docs/bench/log.txt]

The loop: a small MLP (two 256-wide layers, a batch of 64, one thread) trained on the CPU, about a millisecond a
step, each step logging five scalars (loss, accuracy, learning rate, gradient norm, tokens/s) through:

- ``none``: no logging (the loop's own cost);
- ``trainledger.log``: ``import trainledger as wandb``; ``wandb.log(row)`` (a ``metrics_logged`` a step);
- ``Recorder.log``: ``rec.log(row)`` after ``rec.step(step, loss)`` (the step timed apart, ``Recorder.step``);
- ``trainledger.SummaryWriter``: five ``add_scalar`` calls;
- ``wandb.log``: the real ``wandb`` in offline mode;
- ``tensorboard``: five ``add_scalar`` calls on ``torch.utils.tensorboard.SummaryWriter``.

Each peer runs in a fresh process, peers interleaved, ``--reps`` times. Per peer: the median, p99 and max of the
logging call (what the loop waits for, timed call by call, the timer's own cost subtracted), and the CPU time of the
process and its children (user + sys, every thread, W&B's service process
included, over the loop and the close) per step above the ``none`` loop's, and its peak RSS. Machine load is
printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ["none", "trainledger.log", "Recorder.log", "trainledger.SummaryWriter", "wandb.log", "tensorboard"]
NAMES = ("loss", "train/acc", "lr", "grad_norm", "tokens_per_s")


def _loop(peer: str, steps: int, tmp: Path) -> dict:
    """In the peer's own process: train ``steps`` steps, log each, time the logging calls."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    xs, ys = torch.randn(64, 256), torch.randint(0, 10, (64,))
    pc = time.perf_counter_ns
    over = statistics.median([-(pc() - pc()) for _ in range(20_000)])
    log, step_call, close = _peer(peer, tmp, model, opt)
    calls: list[int] = []
    steps_t: list[int] = []
    k0 = _kids_cpu()
    c0 = time.process_time()
    m0 = time.thread_time()
    w0 = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        out = model(xs)
        loss = torch.nn.functional.cross_entropy(out, ys)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
        opt.step()
        lv = loss.item()
        acc = float((out.argmax(1) == ys).float().mean())
        dt = time.perf_counter() - t
        row = {"loss": lv, "train/acc": acc, "lr": 3e-4, "grad_norm": gn, "tokens_per_s": 64 * 128 / dt}
        if step_call is not None:
            a = pc()
            step_call(i, lv, gn)
            steps_t.append(pc() - a - over)
        if log is not None:
            a = pc()
            log(i, row)
            calls.append(pc() - a - over)
    loop_wall = time.perf_counter() - w0
    a = time.thread_time()
    close()
    close_cpu = time.thread_time() - a
    cpu = time.process_time() - c0  # every thread of this process, the loop and the close (flush, finish)
    main = time.thread_time() - m0   # this thread's: the training, the logging calls and the close
    kids = _kids_cpu() - k0          # and its child processes' (W&B's service) over the same time
    # what the logging costs in CPU, without the loop's own noise: the calls (on this thread; timed one by one),
    # the close, the logger's other threads (process less this thread) and its child processes
    logging_cpu = (sum(calls) + sum(steps_t)) / 1e9 + close_cpu + (cpu - main) + kids

    def q(xs: list[int], f: float) -> float:
        s = sorted(xs)
        return max(0.0, s[min(len(s) - 1, int(f * (len(s) - 1)))] / 1000) if s else 0.0

    return {"peer": peer, "steps": steps, "loop_wall_s": loop_wall, "cpu_s_loop": cpu + kids, "cpu_s_kids": kids,
            "cpu_s_logging": logging_cpu, "cpu_s_threads": cpu - main,
            "call_median_us": q(calls, 0.5), "call_p99_us": q(calls, 0.99), "call_max_us": q(calls, 1.0),
            "step_median_us": q(steps_t, 0.5), "step_p99_us": q(steps_t, 0.99)}


def _kids_cpu() -> float:
    """CPU seconds (user + sys) of this process's children and theirs, living or waited for."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for c in me.children(recursive=True):
        try:
            t = c.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + r.ru_utime + r.ru_stime


def _peer(peer: str, tmp: Path, model, opt):
    """(log(i, row), step(i, loss, gn) or None, close()) of a peer."""
    if peer == "none":
        return None, None, lambda: None
    if peer == "trainledger.log":
        import trainledger as wandb

        wandb.init(project="bench", name="log", dir=str(tmp))
        return lambda i, row: wandb.log(row), None, wandb.finish
    if peer == "Recorder.log":
        from trainledger.training import Recorder

        rec = Recorder(tmp / "rec", model=model, optimizer=opt)
        return (lambda i, row: rec.log(row)), (lambda i, loss, gn: rec.step(i, loss, grad_norm=gn)), rec.close
    if peer == "trainledger.SummaryWriter":
        import trainledger

        w = trainledger.SummaryWriter(str(tmp / "tl-tb"))

        def add(i, row):
            for k in NAMES:
                w.add_scalar(k, row[k], i)
        return add, None, w.close
    if peer == "wandb.log":
        import wandb

        run = wandb.init(project="bench", name="log", dir=str(tmp), mode="offline")
        return lambda i, row: run.log(row), None, run.finish
    if peer == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(str(tmp / "tb"))

        def add(i, row):
            for k in NAMES:
                w.add_scalar(k, row[k], i)
        return add, None, w.close
    raise SystemExit(f"no such peer {peer!r}")


def _child(peer: str, steps: int) -> dict:
    """One peer in a fresh process; its process tree's CPU time and peak RSS as the parent sees them."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=tmp,
                   WANDB_CONFIG_DIR=str(Path(tmp) / "wcfg"), WANDB_CACHE_DIR=str(Path(tmp) / "wcache"),
                   TRAINLEDGER_KEY_DIR=str(Path(tmp) / "keys"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, __file__, "--peer", peer, "--steps", str(steps), "--tmp", tmp],
                           capture_output=True, text=True, env=env, cwd=tmp)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            raise SystemExit(f"{peer}: exit {p.returncode}\n{p.stderr[-2000:]}")
        out = json.loads(p.stdout.strip().splitlines()[-1])
        out["cpu_s_tree"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        out["peak_rss_mb"] = r1.ru_maxrss / 1024
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated, of: " + ", ".join(PEERS))
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        print(json.dumps(_loop(args.peer, args.steps, Path(args.tmp))))
        return 0
    peers = [p for p in args.peers.split(",") if p]
    load0 = os.getloadavg()
    runs: dict[str, list[dict]] = {p: [] for p in peers}
    for rep in range(args.reps):
        for p in peers:
            runs[p].append(_child(p, args.steps))
            print(f"rep {rep + 1}/{args.reps} {p}: median {runs[p][-1]['call_median_us']:.1f} us", file=sys.stderr)
    load1 = os.getloadavg()
    med = lambda p, k: statistics.median(r[k] for r in runs[p])  # noqa: E731
    base = med("none", "cpu_s_loop") / args.steps * 1e6 if "none" in runs else 0.0
    per = [r["cpu_s_loop"] / args.steps * 1e6 for r in runs.get("none", [])] or [0.0]
    spread = (min(per), max(per))
    lines = [f"# tools/bench_log.py --steps {args.steps} --reps {args.reps}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} cores, load average {load0[0]:.2f} before, {load1[0]:.2f} after)",
             f"# the loop alone: {base:.0f} us of CPU a step, {med('none', 'loop_wall_s') / args.steps * 1e6:.0f} us "
             f"wall; its CPU a step from rep to rep: {spread[0]:.0f} to {spread[1]:.0f} us (the noise under CPU/step)"
             if "none" in runs else "#",
             "# medians over the reps; call: the logging call(s) of one step as the loop waits for them; CPU/step: "
             "user+sys of the process (every thread) and its children (W&B's service) over the loop and the close, a "
             "step, above the loop alone; peak RSS: the whole process, imports included",
             "# logging CPU/step: the calls, the close, the logger's own threads and child processes, a step (the "
             "same work, without the loop's noise)",
             f"{'peer':28} {'call median':>12} {'call p99':>10} {'call max':>10} {'CPU/step':>10} {'logging CPU/step':>17} "
             f"{'peak RSS':>9}"]
    for p in peers:
        if p == "none":
            continue
        cpu = med(p, "cpu_s_loop") / args.steps * 1e6 - base
        lines.append(f"{p:28} {med(p, 'call_median_us'):9.1f} us {med(p, 'call_p99_us'):7.1f} us "
                     f"{med(p, 'call_max_us'):7.0f} us {cpu:7.1f} us "
                     f"{med(p, 'cpu_s_logging') / args.steps * 1e6:14.1f} us {med(p, 'peak_rss_mb'):6.0f} MB")
        if p == "Recorder.log":
            lines.append(f"{'  Recorder.step (same loop)':28} {med(p, 'step_median_us'):9.1f} us "
                         f"{med(p, 'step_p99_us'):7.1f} us")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
