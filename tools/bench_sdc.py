#!/usr/bin/env python3
"""Silent data corruption: what the state fingerprints catch and what they cost (docs/sdc.md):

    .venv/bin/python tools/bench_sdc.py [--flips 200] [--healthy-steps 10000] [--out docs/bench/sdc.txt]

1. Injections under real torchrun (4 ranks, gloo, tests/helpers/sdc_worker.py, fingerprints every step): ``--flips``
   single-bit flips (random rank, tensor, element and bit, every bit position alike) in a parameter or an AdamW
   ``exp_avg``, and swaps of two elements, each undone after its step; counts how many were named to their step,
   rank and tensor, and the verdicts on the steps between them (false alarms); then ``--healthy-steps`` steps with
   no injection. Replay recomputes every verdict from the four journals.
2. Cost on this CPU: the fingerprint of the reference LM and its AdamW state at three widths, beside the training
   step of the same model (batch 8 x 16 tokens) and beside one plain read of the same tensors (``torch.sum``, the
   floor of any fingerprint that reads every byte); the cadence the default chooses (about 1% of the step time),
   and, in the reference loop with the Recorder (one process, fingerprints on, the cadence chosen from the cost),
   the share of the loop's time the fingerprints took, measured around each one; and the replay checks'
   (``rec.backward`` with ``sdc_check=100``): a check step's forward and backward against the others'.
3. A projection, labelled as one (no GPU here): the fingerprint's memory traffic per element (its source read, a
   float64 copy written, read once by the matrix product) over an H100 SXM's 3.35 TB/s, for a 7B and a 70B model in
   mixed precision (bf16 weights, fp32 master weights and AdamW moments), one full replica.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "sdc_worker.py"
TENSORS = {"module.0.weight": 16 * 32, "module.0.bias": 32, "module.2.weight": 32, "module.2.bias": 1}


def _torchrun(run: Path, key: Path, steps: int, every: int, plan: list, port: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", "--master-addr=127.0.0.1",
                        f"--master-port={port}", "--rdzv-id", run.name, str(WORKER), str(run), str(key), str(steps),
                        str(every), json.dumps(plan), "record"], capture_output=True, text=True, env=env,
                       timeout=3600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"worker failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def injections(args, tmp: Path, priv: Path, pub: Path, lines: list[str]) -> None:
    from trainledger.audit import replay_run_dir
    from trainledger.journal import load_public_key

    rng = random.Random(args.seed)
    plan, step = [], 3
    for k in range(args.flips):
        what = "permute" if k % 10 == 9 else ("optim" if k % 3 == 2 else "param")
        tensor = rng.choice([t for t, n in TENSORS.items() if n > 1 or what != "permute"])
        plan.append({"step": step, "rank": rng.randrange(4), "what": what, "tensor": tensor,
                     "index": rng.randrange(max(1, TENSORS[tensor] - 1)), "bit": k % 32})
        step += rng.randrange(2, 6)
    steps = step + 5
    t0, c0 = time.perf_counter(), os.times()
    res = _torchrun(tmp / "flips", priv, steps, 1, plan, _free_port())
    c1 = os.times()
    want = {(i["step"], i["rank"], ("optim:" + i["tensor"] + ":exp_avg") if i["what"] == "optim"
             else "param:" + i["tensor"]) for i in plan}
    got = {(d["step"], d["rank"], d["tensor"]) for d in res["divergences"]}
    rec = replay_run_dir(tmp / "flips", keys=[load_public_key(pub)])
    again = {(d["step"], d["rank"], d["tensor"]) for d in rec.divergences}
    flips = [i for i in plan if i["what"] != "permute"]
    named_flips = sum((i["step"], i["rank"], ("optim:" + i["tensor"] + ":exp_avg") if i["what"] == "optim"
                       else "param:" + i["tensor"]) in got for i in flips)
    swaps = [i for i in plan if i["what"] == "permute"]
    named_swaps = sum((i["step"], i["rank"], "param:" + i["tensor"]) in got for i in swaps)
    lines.append(f"1. injections, 4 ranks under torchrun (gloo), fingerprints every step, {steps} steps: "
                 f"{named_flips}/{len(flips)} single-bit flips (bits 0-31 alike; parameters and AdamW exp_avg) and "
                 f"{named_swaps}/{len(swaps)} swaps of two elements named to their step, rank and tensor; "
                 f"{len(got - want)} verdicts on other steps (false alarms); replay recomputed "
                 f"{len(again & want)}/{len(want)} and found {len(rec.differences)} differences; "
                 f"{time.perf_counter() - t0:.0f} s wall, {c1.children_user + c1.children_system - c0.children_user - c0.children_system:.0f} s CPU")
    if args.healthy_steps:
        t0, c0 = time.perf_counter(), os.times()
        res = _torchrun(tmp / "healthy", priv, args.healthy_steps, 1, [], _free_port())
        c1 = os.times()
        rec = replay_run_dir(tmp / "healthy", keys=[load_public_key(pub)])
        lines.append(f"   healthy: {args.healthy_steps:,} steps x 4 ranks fingerprinted every step: "
                     f"{len(res['divergences'])} verdicts (false alarms), replay {len(rec.divergences)}, "
                     f"{len(rec.differences)} differences; {time.perf_counter() - t0:.0f} s wall, "
                     f"{c1.children_user + c1.children_system - c0.children_user - c0.children_system:.0f} s CPU")


def cost(args, tmp: Path, priv: Path, lines: list[str]) -> None:
    import torch

    from trainledger.training.distributed.state_watch import _cadence
    from trainledger.training.health.state_fingerprint import state_fingerprint
    from trainledger.training.reference.loop import train_step
    from trainledger.training.reference.model import build_causal_lm

    torch.set_num_threads(1)
    lines.append(f"2. cost on this CPU (one thread), the reference LM (vocab 32, 2 layers, block 16) and AdamW, "
                 f"batch 8; medians of {args.reps}:")
    for d in (32, 128, 512):
        torch.manual_seed(0)
        model = build_causal_lm(vocab=32, d_model=d, n_layer=2, n_head=2, block=16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 32, (8, 16))

        def step():
            train_step(model, opt, x, x, max_grad_norm=1.0)

        for _ in range(3):
            step()
        tensors = [p for p in model.parameters()] + [v for s in opt.state.values() for v in s.values()
                                                     if isinstance(v, torch.Tensor)]
        elems = sum(t.numel() for t in tensors)
        st, fp, rd = [], [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            step()
            st.append(time.perf_counter() - t)
            t = time.perf_counter()
            state_fingerprint(model, opt)
            fp.append(time.perf_counter() - t)
            t = time.perf_counter()
            for tt in tensors:
                tt.sum()
            rd.append(time.perf_counter() - t)
        s, f, r = statistics.median(st), statistics.median(fp), statistics.median(rd)
        n = _cadence([f], [s], 0.01)
        lines.append(f"   d{d}: {sum(p.numel() for p in model.parameters()):,} parameters, {elems:,} elements with "
                     f"AdamW's state: fingerprint {f * 1e3:.3f} ms ({elems / f / 1e6:.0f} M elements/s; one plain "
                     f"read {r * 1e3:.3f} ms: {f / r:.1f}x the floor), step {s * 1e3:.2f} ms: "
                     f"{f / s:.1%} of a step; the default cadence every {n} steps: {f / n / s:.2%} of the time")
    # the Recorder in a realistic loop: the reference model, one process, fingerprints on, cadence from the cost
    from trainledger.training import Recorder
    from trainledger.training.reference.corpus import BatchSampler, MarkovSource

    def reference():  # the reference loop's model, optimizer and batches, the same for both runs below
        torch.manual_seed(0)
        model = build_causal_lm(vocab=32, d_model=32, n_layer=2, n_head=2, block=16)
        return (model, torch.optim.AdamW(model.parameters(), lr=3e-3),
                BatchSampler(MarkovSource(32, seed=0).sample(20_000, seed=0), 8, 16, seed=0))

    model, opt, data = reference()
    rec = Recorder(tmp / "loop", key=priv, model=model, optimizer=opt, fingerprints=True)
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(args.loop_steps):
        x, y = data.next()
        loss, gn = train_step(model, opt, x, y, max_grad_norm=1.0)
        rec.step(k, loss, grad_norm=gn, tokens=x.numel())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    w = rec._watch
    rec.close()
    lines.append(f"   the reference loop with the Recorder, {args.loop_steps:,} steps: cadence chosen every {w.every} "
                 f"steps; {w.count} fingerprints took {w.total_s * 1e3:.1f} ms of the loop's {wall:.2f} s "
                 f"({w.total_s / wall:.2%}; the loop's CPU {cpu:.2f} s)")
    # replay checks: the same loop through rec.backward, a check every 100 steps; each step's forward and backward
    # timed, check steps against the others
    model, opt, data = reference()
    rec = Recorder(tmp / "replay", key=priv, model=model, optimizer=opt, fingerprints=False, sdc_check=100)
    plain, checked = [], []
    for k in range(args.loop_steps):
        x, y = data.next()
        opt.zero_grad()
        t = time.perf_counter()
        loss = rec.backward(k, lambda: torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        (checked if k % 100 == 0 else plain).append(time.perf_counter() - t)
        opt.step()
        rec.step(k, loss.item(), tokens=x.numel())
    rec.close()
    p_med, c_med = statistics.median(plain), statistics.median(checked)
    lines.append(f"   replay checks in the same loop (rec.backward, sdc_check=100, {args.loop_steps:,} steps): a "
                 f"check step's forward and backward {c_med * 1e3:.2f} ms against {p_med * 1e3:.2f} ms (medians of "
                 f"{len(checked)} and {len(plain)}): {(c_med - p_med) * 1e3:.2f} ms more, "
                 f"{(c_med - p_med) / 100 / p_med:.2%} of the forward and backward time at one check every 100 steps, "
                 f"{(c_med - p_med) / 1000 / p_med:.3%} at one every 1,000")


def projection(lines: list[str]) -> None:
    bw = 3.35e12  # H100 SXM HBM3, bytes/s
    lines.append("3. projection (not a measurement; no GPU here): bytes moved per element = its own read (2 for bf16, "
                 "4 for fp32) + 8 written to the float64 buffer + 8 read back by the matrix product; one full "
                 "replica (DDP) at an H100 SXM's 3.35 TB/s:")
    for name, n in (("7B", 7e9), ("70B", 70e9)):
        traffic = n * (2 + 16) + 3 * n * (4 + 16)  # bf16 weights; fp32 master weights, exp_avg, exp_avg_sq
        lines.append(f"   {name}: {traffic / 1e9:,.0f} GB moved, {traffic / bw:.2f} s a fingerprint; at 1% of the "
                     f"time, one every {traffic / bw / 0.01:.0f} s of training"
                     + (" (a 70B replica does not fit one H100's memory: under FSDP each rank fingerprints its shard, "
                        "1/N of this)" if name == "70B" else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flips", type=int, default=200)
    ap.add_argument("--healthy-steps", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--loop-steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-injections", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from trainledger.journal import keygen

    from bench_report import finish, header

    lines = header("bench_sdc.py")
    with tempfile.TemporaryDirectory(prefix="tl-bench-sdc-") as d:
        tmp = Path(d)
        priv, pub = keygen(tmp / "keys")
        if not args.skip_injections:
            injections(args, tmp, priv, pub, lines)
            print(lines[-1], flush=True)
        cost(args, tmp, priv, lines)
        projection(lines)
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
