#!/usr/bin/env python3
"""The proofs' targets, each beside its yardstick in one run (medians; this machine is noisy: compare ratios).

    .venv/bin/python tools/bench_proofs.py            # 1,000,000-event journal
    .venv/bin/python tools/bench_proofs.py --events 10000000   # 10M events (about 1.7 GB in a temp folder)

- append: ``Journal.append`` of a step event, timed call by call (timer cost subtracted), with the Merkle tree
  (format 1.3) and with the tree switched off (the 1.2 writer), interleaved rounds; median, p99 and mean (the
  tree's hashing runs at flush and seal, so it shows in the mean, not the median);
- inside a loop: a tiny torch MLP's training step plus ``TrainingHealthMonitor.observe_step`` into a journal,
  per-step wall time with and without the tree (skipped without torch);
- index build (``trainledger prove``'s one-time pass) against ``sha256sum`` of the same file, 1 and 2 processes;
- prove: any seq after the index, library call (median and max over 200 random seqs) and the command end to
  end; every proof's length against ceil(log2 n);
- verify-proof: library call and the command end to end;
- verify: the whole journal with every check (now also every seal's tree root) against ``sha256sum``.

Writes bench-out/proofs.json.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trainledger.journal import Journal, Signer, StepObserved, verify  # noqa: E402
from trainledger.journal import proofs as T  # noqa: E402

from bench_journal import pc, timer_overhead  # noqa: E402  (tools/, beside this script)


def _stats(samples: list[float]) -> dict:
    samples = sorted(samples)
    return {"median_us": samples[len(samples) // 2] / 1e3, "p99_us": samples[int(len(samples) * 0.99)] / 1e3,
            "mean_us": sum(samples) / len(samples) / 1e3}


def bench_append(d: Path, n: int, rounds: int) -> dict:
    ov = timer_overhead()
    out = {"tree": [], "no_tree": []}
    signer = Signer.generate()
    for r in range(rounds):
        for mode in ("tree", "no_tree") if r % 2 == 0 else ("no_tree", "tree"):
            p = d / f"append-{mode}-{r}.jsonl"
            j = Journal.create(p, signer=signer)
            if mode == "no_tree":
                j._tree = None  # the 1.2 writer's path: seals name no tree (this file is not a valid 1.3 journal)
            ev = StepObserved(step=1, loss=2.5, grad_norm=1.0, lr=3e-4, step_time_s=0.25, tokens=4096)
            samples = [0.0] * n
            app = j.append
            for i in range(n):
                t = pc()
                app(ev)
                samples[i] = pc() - t - ov
            j.close()
            p.unlink()
            out[mode].append(_stats(samples))
    res = {m: {k: statistics.median(x[k] for x in v) for k in v[0]} for m, v in out.items()}
    res["added_median_us"] = res["tree"]["median_us"] - res["no_tree"]["median_us"]
    res["added_mean_us"] = res["tree"]["mean_us"] - res["no_tree"]["mean_us"]
    return res


def bench_loop(d: Path, steps: int, rounds: int) -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    from trainledger.training.health.monitor import TrainingHealthMonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    signer = Signer.generate()
    per = {"tree": [], "no_tree": []}
    for r in range(rounds):
        for mode in ("tree", "no_tree") if r % 2 == 0 else ("no_tree", "tree"):
            p = d / f"loop-{mode}-{r}.jsonl"
            j = Journal.create(p, signer=signer)
            if mode == "no_tree":
                j._tree = None
            mon = TrainingHealthMonitor(journal=j)
            times = []
            for s in range(steps):
                t = pc()
                loss = (model(x) - x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                mon.observe_step(s, loss.item(), grad_norm=1.0, step_time_s=0.01, tokens=2048)
                times.append(pc() - t)
            j.close()
            p.unlink()
            per[mode].append(statistics.median(times) / 1e3)
    t, n = statistics.median(per["tree"]), statistics.median(per["no_tree"])
    return {"step_median_us_tree": t, "step_median_us_no_tree": n, "added_us": t - n, "added_pct": (t - n) / n * 100}


def write_journal(p: Path, n: int) -> Signer:
    signer = Signer.generate()
    with Journal.create(p, signer=signer) as j:
        ev = StepObserved
        for i in range(n):
            j.append_deferred(ev(step=i, loss=2.5 - i * 1e-7, grad_norm=1.0, lr=3e-4, step_time_s=0.25, tokens=4096))
    return signer


def sha256sum_s(p: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["sha256sum", str(p)], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--append-n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the journal goes (default: a temporary folder)")
    args = ap.parse_args()
    res: dict = {"events": args.events}
    with tempfile.TemporaryDirectory(dir=args.dir) as td:
        d = Path(td)
        res["append"] = bench_append(d, args.append_n, args.rounds)
        a = res["append"]
        print(f"append: median {a['tree']['median_us']:.3f} us with the tree, {a['no_tree']['median_us']:.3f} us "
              f"without (+{a['added_median_us']:.3f}); mean {a['tree']['mean_us']:.3f} vs {a['no_tree']['mean_us']:.3f} "
              f"(+{a['added_mean_us']:.3f}); p99 {a['tree']['p99_us']:.2f} vs {a['no_tree']['p99_us']:.2f}", flush=True)
        res["loop"] = bench_loop(d, 3000, args.rounds)
        if res["loop"]:
            lp = res["loop"]
            print(f"tiny torch loop: {lp['step_median_us_tree']:.1f} us a step with the tree, "
                  f"{lp['step_median_us_no_tree']:.1f} without ({lp['added_pct']:+.2f}%)", flush=True)
        p = d / "big.jsonl"
        t = time.perf_counter()
        signer = write_journal(p, args.events)
        size = p.stat().st_size
        print(f"wrote {args.events:,} events, {size / 1e6:,.0f} MB in {time.perf_counter() - t:.0f} s", flush=True)
        pub = signer.public
        builds = {1: [], 2: []}
        sums = []
        for _ in range(3):
            sums.append(sha256sum_s(p))
            for w in (1, 2):
                t = time.perf_counter()
                idx = T.build_index(p, workers=w)
                builds[w].append(time.perf_counter() - t)
        s = statistics.median(sums)
        res["index"] = {"sha256sum_s": s, "build_s_1": statistics.median(builds[1]),
                        "build_s_2": statistics.median(builds[2]), "bytes": size,
                        "ratio_1": s / statistics.median(builds[1]), "ratio_2": s / statistics.median(builds[2]),
                        "index_bytes": len(idx.to_bytes())}
        ix = res["index"]
        print(f"index build: {ix['build_s_1']:.2f} s (1 process, {ix['ratio_1']:.2f}x sha256sum), "
              f"{ix['build_s_2']:.2f} s (2, {ix['ratio_2']:.2f}x); sha256sum {s:.2f} s; index "
              f"{ix['index_bytes'] / 1e6:.2f} MB", flush=True)
        T.save_index(idx, T.index_path_for(p))
        n_lines = idx.leaves
        rng = random.Random(0)
        times, longest, bound = [], 0, None
        bundle = None
        for _ in range(200):
            seq = rng.randrange(0, n_lines - 2)
            t = time.perf_counter()
            r = T.prove(p, [seq], keys=[pub])
            times.append(time.perf_counter() - t)
            bundle = r.bundle
            size_n = int(bundle["checkpoint"].split("\n")[1])
            bound = math.ceil(math.log2(size_n))
            longest = max(longest, len(bundle["entries"][0]["proof"]))
        res["prove"] = {"median_s": statistics.median(times), "max_s": max(times), "longest_proof": longest,
                        "ceil_log2_n": bound}
        (d / "pub").write_text(pub.line() + "\n")
        cli = []
        exe = [sys.executable, "-m", "trainledger.cli"]
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(exe + ["prove", str(p), "--seq", str(rng.randrange(n_lines - 2)), "-o", str(d / "b.json"),
                                  "--pubkey", str(d / "pub")], check=True, capture_output=True)
            cli.append(time.perf_counter() - t)
        res["prove"]["cli_median_s"] = statistics.median(cli)
        pr = res["prove"]
        print(f"prove: {pr['median_s'] * 1e3:.1f} ms median, {pr['max_s'] * 1e3:.1f} ms max (library, 200 random "
              f"seqs); command end to end {pr['cli_median_s'] * 1e3:.0f} ms; proofs at most {longest} hashes "
              f"(ceil(log2 n) = {bound})", flush=True)
        data = json.dumps(bundle).encode()
        vt = []
        for _ in range(500):
            t = time.perf_counter()
            T.verify_bundle(data, [pub])
            vt.append(time.perf_counter() - t)
        cli = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(exe + ["verify-proof", str(d / "b.json"), "--pubkey", str(d / "pub")], check=True,
                           capture_output=True)
            cli.append(time.perf_counter() - t)
        res["verify_proof"] = {"median_ms": statistics.median(vt) * 1e3, "max_ms": max(vt) * 1e3,
                               "cli_median_ms": statistics.median(cli) * 1e3}
        vp = res["verify_proof"]
        print(f"verify-proof: {vp['median_ms']:.2f} ms median, {vp['max_ms']:.2f} ms max (library); command end to "
              f"end {vp['cli_median_ms']:.0f} ms (interpreter start-up and imports included)", flush=True)
        # verify with every seal's root recomputed, and (the same code, roots not recomputed) what the tree costs it
        vmod = sys.modules["trainledger.journal.verify"]
        real = vmod.tree_mode
        vts, nts = [], []
        try:
            for _ in range(3):
                for mode in ("tree", "fields"):
                    vmod.tree_mode = real if mode == "tree" else (lambda v, check=True: real(v, False))
                    t = time.perf_counter()
                    verify(p, keys=[pub])
                    (vts if mode == "tree" else nts).append(time.perf_counter() - t)
        finally:
            vmod.tree_mode = real
        v, nv = statistics.median(vts), statistics.median(nts)
        res["verify"] = {"s": v, "ratio_sha256sum": s / v, "s_roots_unchecked": nv, "tree_cost_pct": (v / nv - 1) * 100}
        print(f"verify (every check, every seal's tree root, all cores): {v:.2f} s, {s / v:.2f}x sha256sum; the same "
              f"without recomputing the roots {nv:.2f} s ({s / nv:.2f}x): the tree costs verify "
              f"{(v / nv - 1) * 100:.0f}%", flush=True)
    out = ROOT / "bench-out"
    out.mkdir(exist_ok=True)
    (out / "proofs.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
