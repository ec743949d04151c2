#!/usr/bin/env python3
"""The distributed targets (DDP overhead, stragglers, verify RUN_DIR), measured on the real code paths (torchrun, gloo, CPU):

    .venv/bin/python tools/bench_distributed.py [--trials 5] [--events 1000000] [--skip-verify]

1. Journaling cost in a 2-rank DDP step of the reference model at its default size: blocks of steps without
   trainledger and with it (the distributed loop's calls: each step queued, handed to ``observe_step`` into the rank
   journal every 64 steps (``SYNC_EVERY``) or 0.2 s, so in a with-block about every third, and the straggler
   detector's ``observe``), interleaved in one torchrun job on the same warm model; mean step times (a hand-over
   lands on one step, which a median would not see), their ratio per pair of blocks (every job's pairs pooled, with a 95%
   bootstrap interval of the median that
   draws jobs, then pairs), and the straggler exchange's time (one collective per window). ``--control`` runs the
   same comparison with no calls in either block: the method's own noise on this machine; ``--and-control`` runs
   both kinds of job, alternated. Also CPU time, which waiting on the other rank or the scheduler does not add to:
   rank 0's training thread per step in each block (ratio per pair, pooled the same way) and the journal's writer
   thread per step with trainledger (Linux ``schedstat``), the two together as a share of the step's CPU.
2. Straggler detection: ``--trials`` torchrun jobs, each a uniform run (4 windows of ``--window-steps`` steps, 500
   by default, about 2 s here: the detector's own default is about a minute; no rank slowed) and a run whose
   rank 1 sleeps 30% of the median step time inside its own time (as a slow loader would); counts the runs in which
   rank 1 was flagged within 2 windows, and the false flags of the uniform runs.
3. ``trainledger verify RUN_DIR`` over 4 signed rank journals of ``--events`` events each, anchored to each other
   every 10,000 steps, against ``sha256sum`` of the same four files (page cache warm for both); the verify's peak
   RSS (the largest of its processes).
4. The ``Recorder`` as the README's torchrun lines use it (``--recorder-trials``, default 5; ``--only-recorder``
   runs this part alone): a DDP model, the Recorder on every rank with its defaults (compute timed by the
   communication hook, threshold 0.8) and windows of 10 steps over 40 steps; each step a rank works 100 ms (a sleep,
   the model's own compute is microseconds), rank 1 ``--slow-x`` (1.3) times that in one job of each trial and 1.0
   in the other: counts the trials in which rank 1 was flagged within 2 windows, the false flags of the balanced
   jobs, and the scores.
The async-checkpoint stall is tools/bench_sharded_checkpoint.py.
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

WORKER = r"""
import json, os, statistics, sys, time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from trainledger.journal import load_signer, read_events
from trainledger.training.distributed.ranks import StragglerDetector, init_process_group, open_rank_journal
from trainledger.training.distributed.loop import SYNC_EVERY, rank_sampler
from trainledger.training.health.flops import flop_config_from_causal_lm
from trainledger.training.integrations.hooks import StepBuffer
from trainledger.training.reference.loop import LoopConfig
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor

mode, out_dir, key = sys.argv[1], sys.argv[2], sys.argv[3]
init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if os.environ.get("BENCH_PIN"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
cfg = LoopConfig()
torch.manual_seed(0)
model = build_causal_lm(cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.block, dropout=cfg.dropout)
ddp = DistributedDataParallel(model, broadcast_buffers=False)
opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
sampler = rank_sampler(cfg, rank, world)
signer = load_signer(key)

def thread_cpu_ns(t):  # a thread's CPU time so far, in ns, from Linux's schedstat (None elsewhere)
    try:
        with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, AttributeError, TypeError):
        return None

def step(delay=0.0):
    t0 = time.perf_counter()
    x, y = sampler.next()
    if delay:
        time.sleep(delay)
    loss = torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
    t_own = time.perf_counter()
    opt.zero_grad(); loss.backward()
    gn = float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)); opt.step()
    # Converted in both kinds of block: the reference loop keeps every step's loss for itself (it returns them).
    return t0, t_own, loss.item(), gn

for _ in range(30):  # warm-up
    step()
if mode == "overhead":
    blocks, n, control = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "control"
    j = open_rank_journal(os.path.join(out_dir, "run"), signer)
    mon = TrainingHealthMonitor(journal=j, flop_config=flop_config_from_causal_lm(model, seq_len=cfg.block))
    det = StragglerDetector(j)  # the default window: about a minute of wall time, calibrated on 20 steps
    buf = StepBuffer(SYNC_EVERY)  # as training/distributed/loop.py hands its steps over
    plain, ledger, exch, call, ratios, cpu, cpu_ratios = [], [], [], [], [], {False: [], True: []}, []
    s, every, with_steps = 0, None, 0
    writer0 = thread_cpu_ns(j._ticker)  # the journal's background thread (drains, seals, writes, fsyncs)
    for b in range(blocks):
        times, block_cpu = {}, {}
        for use in (False, True) if b % 2 == 0 else (True, False):
            times[use] = []
            c0 = time.thread_time_ns()
            for i in range(n):
                t0, t_own, loss, gn = step()
                if use:
                    end = time.perf_counter()
                    call.append(end)
                    if not control:
                        due = buf.add(s, loss, gn, {"step_time_s": end - t0, "batch_size": cfg.batch_size,
                                                    "tokens": cfg.batch_size * cfg.block, "compute_time_s": t_own - t0})
                        det.observe(s, t_own - t0)
                        if due or (b == blocks - 1 and i == n - 1):  # the last with-block hands over what is left
                            buf.hand_over(mon)
                    call[-1] = time.perf_counter() - call[-1]
                    if det.last_exchange_s is not None:
                        exch.append(det.last_exchange_s); det.last_exchange_s = None
                        every = det.every
                (ledger if use else plain).append(time.perf_counter() - t0)
                times[use].append(ledger[-1] if use else plain[-1])
                s += 1
            block_cpu[use] = (time.thread_time_ns() - c0) / n  # this thread's CPU per step, waits excluded
            cpu[use].append(block_cpu[use])
            with_steps += n if use else 0
            dist.barrier()
        ratios.append(statistics.fmean(times[True]) / statistics.fmean(times[False]))
        cpu_ratios.append(block_cpu[True] / block_cpu[False])
    writer1 = thread_cpu_ns(j._ticker)
    j.close()
    res = {"plain": statistics.median(plain), "ledger": statistics.median(ledger),
           "exchange": statistics.median(exch) if exch else None, "windows": len(exch), "steps": s,
           "every": every, "call": statistics.fmean(call), "ratio": statistics.median(ratios), "ratios": ratios,
           "cpu_plain": statistics.median(cpu[False]) / 1e9, "cpu_ledger": statistics.median(cpu[True]) / 1e9,
           "cpu_ratios": cpu_ratios,
           "writer": (writer1 - writer0) / with_steps / 1e9 if writer0 is not None and writer1 is not None else None}
else:
    windows, n = 4, int(sys.argv[4])
    base = []
    for _ in range(20):
        t0, t_own, *_ = step(); base.append(time.perf_counter() - t0)
    gathered = [None] * world
    dist.all_gather_object(gathered, statistics.median(base))
    delay = 0.3 * max(gathered) if rank == 1 else 0.0  # 30% of the step, inside rank 1's own time
    res = {"step_s": max(gathered), "delay_s": 0.3 * max(gathered)}
    for phase, d, nwin in (("uniform", 0.0, windows), ("slowed", delay, 2)):
        j = open_rank_journal(os.path.join(out_dir, phase), signer)
        det = StragglerDetector(j, every=n)
        for s in range(nwin * n):
            t0, t_own, loss, gn = step(d)
            det.observe(s, t_own - t0)
        j.close()
        evs = list(read_events(os.path.join(out_dir, phase, "rank-00000.jsonl")))
        res[phase] = [e.rank for e in evs if type(e).__struct_config__.tag == "straggler_detected"]
        res[phase + "_scores"] = [min(e.scores.values()) for e in evs
                                  if type(e).__struct_config__.tag == "straggler_scores"]
if rank == 0:
    print("RESULT " + json.dumps(res), flush=True)
dist.destroy_process_group()
"""


RECORDER_WORKER = r"""
import json, sys, time, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from trainledger.journal import read_events
from trainledger.training import Recorder
from trainledger.training.distributed.ranks import init_process_group

run_dir, key, slow_x = sys.argv[1], sys.argv[2], float(sys.argv[3])
torch.set_num_threads(1)
init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
rec = Recorder(run_dir, key=key, model=model, optimizer=opt, straggler_every=10)
torch.manual_seed(1 + rank)
for step in range(40):
    time.sleep(0.100 * (slow_x if rank == 1 else 1.0))  # this rank's own work before its forward pass
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    rec.step(step, loss.item(), tokens=16, batch_size=16)
rec.close()
if rank == 0:
    evs = list(read_events(f"{run_dir}/rank-00000.jsonl"))
    kind = lambda e: type(e).__struct_config__.tag
    scores = [e for e in evs if kind(e) == "straggler_scores"]
    flagged = [(e.rank, e.window_end) for e in evs if kind(e) == "straggler_detected"]
    print("RESULT " + json.dumps({"scores": [e.scores.get("1") for e in scores],
                                   "windows": [e.window_end for e in scores], "flagged": flagged}))
dist.destroy_process_group()
"""


def _recorder_report(tmp: Path, priv: Path, trials: int, slow_x: float) -> None:
    script = tmp / "recorder_worker.py"
    script.write_text(RECORDER_WORKER)
    caught, false, slow_scores, even_scores = 0, 0, [], []
    t0, c0 = time.perf_counter(), os.times()
    for t in range(trials):
        for x in (slow_x, 1.0):
            r = _torchrun(script, str(tmp / f"rec{t}-{x}"), str(priv), str(x), cwd=str(tmp))
            ones = [w for rank, w in r["flagged"] if rank == 1]
            if x == 1.0:
                false += len(r["flagged"])
                even_scores += [min(1.0, s) for s in r["scores"]]
            else:
                caught += bool(ones) and ones[0] <= r["windows"][1]
                slow_scores += r["scores"]
    c1 = os.times()
    print(f"4. Recorder stragglers (compute by the DDP hook, threshold 0.8, windows of 10 steps, 4 a job): rank 1 "
          f"at {slow_x}x flagged within 2 windows in {caught} of {trials} trials, its scores "
          f"{min(slow_scores):.3f}-{max(slow_scores):.3f} (median {statistics.median(slow_scores):.3f}); "
          f"{false} false flags over {trials} balanced jobs, their lowest score {min(even_scores):.3f} (median "
          f"{statistics.median(even_scores):.3f}); {time.perf_counter() - t0:.0f} s wall, "
          f"{c1.children_user + c1.children_system - c0.children_user - c0.children_system:.0f} s CPU of the jobs; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)


def _torchrun(script: Path, *args: str, cwd: str, pin: bool = False) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if pin:
        env["BENCH_PIN"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), *args], capture_output=True, text=True, cwd=cwd, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[7:])


def _journals(run: Path, events: int, signer) -> None:
    """Four rank journals of ``events`` events, anchored every 10,000 steps as the distributed loop anchors them."""
    from trainledger.journal import Journal, StepObserved
    from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored

    js = [Journal.create(run / f"rank-{r:05d}.jsonl", signer=signer, run_id=f"bench.r{r:05d}") for r in range(4)]
    for r, j in enumerate(js):
        j.append(RankJoined(run="bench", rank=r, world_size=4, local_rank=r, node="bench"))
    step = 0
    while js[0].seq < events - 10:
        for r, j in enumerate(js):
            for s in range(step, step + 10_000):
                j.append_deferred(StepObserved(step=s, loss=3.0 - s * 1e-7, grad_norm=1.0, lr=1e-3,
                                               step_time_s=0.1, examples=8, tokens=2048, compute_time_s=0.05))
        step += 10_000
        heads = {}
        for r, j in enumerate(js):
            j.seal()
            seq, h = j.head
            heads[r] = f"{seq}:{h}"
        js[0].append(RanksAnchored(heads={str(r): x for r, x in heads.items()}, step=step - 1), durable=False)
        for j in js[1:]:
            j.append(AnchorRecorded(rank=0, head=heads[0], step=step - 1))
    for j in js:
        j.close()


def _median_interval(jobs: list[dict], key: str) -> tuple[float, float, float]:
    """The median of every job's pairs of blocks pooled, and its 95% bootstrap interval. Pairs of one job share its
    machine state, so the bootstrap draws jobs, then pairs within each job drawn (a pooled draw of pairs alone gave
    intervals that a null comparison, --control, fell outside of)."""
    pooled = [q for x in jobs for q in x[key]]
    rng = random.Random(13)
    boot = sorted(statistics.median([q for x in rng.choices(jobs, k=len(jobs))
                                     for q in rng.choices(x[key], k=len(x[key]))])
                  for _ in range(2000))
    return statistics.median(pooled), boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]


def _overhead_report(jobs: list[dict], control: bool, args) -> None:
    jobs.sort(key=lambda x: x["ratio"])
    r = jobs[len(jobs) // 2]
    spread = ", ".join(f"{x['ratio'] - 1:+.2%}" for x in jobs)
    med, lo, hi = _median_interval(jobs, "ratios")
    print(f"1. {'CONTROL (no calls in either block) ' if control else ''}DDP step, 2 ranks, gloo, "
          f"reference model ({r['steps']} steps in {args.blocks} pairs of blocks "
          f"without and with, {len(jobs)} jobs: {spread}): all {sum(len(x['ratios']) for x in jobs)} pairs pooled: "
          f"median ratio {med - 1:+.2%}, 95% interval [{lo - 1:+.2%}, {hi - 1:+.2%}]; the median "
          f"job: without trainledger {r['plain'] * 1e3:.3f} ms, with {r['ledger'] * 1e3:.3f} ms (median "
          f"step), the calls themselves {r['call'] * 1e6:.1f} us a step (mean); one straggler exchange (the "
          + (f"calibration window) took {r['exchange'] * 1e3:.2f} ms, and set the window to {r['every']} "
             f"steps (about a minute): {r['exchange'] / r['every'] * 1e6:.2f} us per step"
             if r["exchange"] is not None else "calibration window) was not reached"), flush=True)
    # CPU time, which waiting on the other rank and on the scheduler does not add to: the training thread's per
    # step in each block (pairs pooled as above), and the journal's writer thread's per step with trainledger.
    cmed, clo, chi = _median_interval(jobs, "cpu_ratios")
    writer = [x["writer"] for x in jobs if x["writer"] is not None]
    plain = statistics.median(x["cpu_plain"] for x in jobs)
    w = statistics.median(writer) if writer else None
    print(f"   CPU time per step (rank 0): training thread without {plain * 1e3:.3f} ms, with "
          f"{statistics.median(x['cpu_ledger'] for x in jobs) * 1e3:.3f} ms, median ratio of pairs {cmed - 1:+.2%} "
          f"[{clo - 1:+.2%}, {chi - 1:+.2%}]; "
          + (f"the writer thread {w * 1e6:.2f} us a step ({w / plain:+.2%}); together {cmed - 1 + w / plain:+.2%}"
             if w is not None else "the writer thread's time not readable here"), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--blocks", type=int, default=60, help="pairs of blocks, without and with (overhead)")
    ap.add_argument("--block-steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5, help="overhead jobs (their pairs of blocks are pooled)")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--control", action="store_true",
                    help="part 1 as a null comparison: the 'with' blocks make no calls (what the method reports when "
                         "there is nothing to find)")
    ap.add_argument("--and-control", action="store_true",
                    help="part 1 with calls and as a control, the two kinds of job alternated in one run")
    ap.add_argument("--pin", action="store_true", help="pin rank r to the r-th CPU (its writer thread shares it)")
    ap.add_argument("--window-steps", type=int, default=500,
                    help="steps per straggler window in part 2 (the detector's default is about a minute of steps; "
                         "runs A and B used 20, C-H 100)")
    ap.add_argument("--recorder-trials", type=int, default=5, help="part 4's trials (each a slowed and a balanced job)")
    ap.add_argument("--slow-x", type=float, default=1.3, help="part 4: rank 1's compute, times rank 0's")
    ap.add_argument("--only-recorder", action="store_true", help="part 4 alone")
    args = ap.parse_args()
    from trainledger.journal import keygen, load_signer

    with tempfile.TemporaryDirectory(prefix="tl-bench-dist-") as d:
        tmp = Path(d)
        priv, pub = keygen(tmp / "keys")
        script = tmp / "worker.py"
        script.write_text(WORKER)
        if args.only_recorder:
            _recorder_report(tmp, priv, args.recorder_trials, args.slow_x)
            return 0

        kinds = ["control"] if args.control else ["calls", "control"] if args.and_control else ["calls"]
        jobs: dict[str, list] = {k: [] for k in kinds}
        for i in range(args.repeats):  # with --and-control the two kinds alternate: drift hits both alike
            for k in kinds:
                jobs[k].append(_torchrun(script, "overhead", str(tmp / f"ovh{i}-{k}"), str(priv), str(args.blocks),
                                         str(args.block_steps), k, cwd=d, pin=args.pin))
        for k in kinds:
            if jobs[k]:
                _overhead_report(jobs[k], k == "control", args)

        caught, false, delays, lowest, slowed = 0, 0, [], [], []
        for t in range(args.trials):
            r = _torchrun(script, "stragglers", str(tmp / f"trial{t}"), str(priv), str(args.window_steps), cwd=d,
                         pin=args.pin)
            caught += r["slowed"] == [1] or r["slowed"] == [1, 1]
            false += len(r["uniform"])
            delays.append((r["step_s"], r["delay_s"]))
            lowest += r["uniform_scores"]
            slowed += r["slowed_scores"]
        if args.trials:
            print(f"2. stragglers: rank 1 slowed by 30% (sleep {statistics.median(x[1] for x in delays) * 1e3:.2f} ms "
                  f"in a {statistics.median(x[0] for x in delays) * 1e3:.2f} ms step) flagged within 2 windows in "
                  f"{caught} of {args.trials} runs; {false} false flags over {args.trials} uniform runs of 4 windows "
                  f"({args.window_steps} steps a window); the lowest score of any uniform window {min(lowest):.3f} "
                  f"(median {statistics.median(lowest):.3f}), the slowed rank's median score "
                  f"{statistics.median(slowed):.3f} (threshold 0.75)", flush=True)

        if not args.skip_verify:
            run = tmp / "verify"
            run.mkdir()
            t = time.perf_counter()
            _journals(run, args.events, load_signer(priv))
            files = sorted(run.glob("rank-*.jsonl"))
            size = sum(f.stat().st_size for f in files)
            print(f"   (wrote 4 journals of {args.events:,} events, {size / 2**20:.0f} MB, in "
                  f"{time.perf_counter() - t:.1f} s)", flush=True)
            sha, ver, rss = [], [], []
            # verify in a process of its own that reports its children's peak RSS (its workers' and its own)
            trainledger = [sys.executable, "-c", "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
                           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)",
                           sys.executable, "-m", "trainledger", "verify", "--pubkey", str(pub), str(run)]
            subprocess.run(["sha256sum", *map(str, files)], capture_output=True, check=True)  # page cache warm
            for _ in range(3):
                t = time.perf_counter()
                subprocess.run(["sha256sum", *map(str, files)], capture_output=True, check=True)
                sha.append(time.perf_counter() - t)
                t = time.perf_counter()
                p = subprocess.run(trainledger, capture_output=True, text=True)
                ver.append(time.perf_counter() - t)
                if p.returncode != 0:
                    raise SystemExit(f"verify failed: {p.stdout}{p.stderr}")
                rss.append(int(p.stdout.split()[-1]) / 1024)
            print(f"3. verify RUN_DIR, 4 x {args.events:,} events ({size / 2**20:.0f} MB): "
                  f"{statistics.median(ver):.2f} s ({size / 2**20 / statistics.median(ver):.0f} MB/s), sha256sum "
                  f"{statistics.median(sha):.2f} s: {statistics.median(sha) / statistics.median(ver):.2f}x "
                  f"sha256sum; peak RSS {max(rss):.0f} MB (the largest of verify's processes)", flush=True)
            print("   " + p.stdout.splitlines()[0])
        if args.recorder_trials:
            _recorder_report(tmp, priv, args.recorder_trials, args.slow_x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
