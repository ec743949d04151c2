#!/usr/bin/env python3
"""Journal benchmarks, side by side with their peers in one run.

    .venv/bin/pip install -e '.[bench]'        # TensorBoard and MLflow, the peers
    .venv/bin/python tools/bench_journal.py    # append + verify (1M events)
    .venv/bin/python tools/bench_journal.py --big   # also verify memory at 10M events
    .venv/bin/python tools/bench_journal.py --only-verify --big   # the verify measurements alone

Append: the cost of logging one training step (loss, grad norm, lr, step time,
tokens), timed call by call (the timer's own cost is measured and
subtracted), for
  - trainledger: build a StepObserved and Journal.append it (default seal policy);
  - plain JSON lines, unchained: json.dumps of a dict + write, and msgspec
    encoding of the same Struct + write (the floor for any JSON line);
  - TensorBoard: five SummaryWriter.add_scalar calls;
  - MLflow: one log_metrics call with five metrics (local file store).
Seal policy: mean append cost for several seal_every values.
Verify: a 1,000,000-event journal with every check on (pinned key, every
seal), with 1 process and with all cores, against `sha256sum` of the same
file; peak RSS of a verify process for 1M (and 10M with --big) events.

Prints a Markdown table and writes bench-out/journal.json. Medians of
several repeats; this machine is noisy, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainledger.journal import Journal, Signer, StepObserved  # noqa: E402

pc = time.perf_counter_ns


def timer_overhead() -> float:
    samples = []
    for _ in range(200_000):
        t = pc()
        samples.append(pc() - t)
    return statistics.median(samples)


def per_call(fn, n: int, overhead: float) -> dict:
    """Time fn(i) call by call; return median/p90/p99/mean in microseconds."""
    samples = [0] * n
    for i in range(n):
        t = pc()
        fn(i)
        samples[i] = pc() - t
    samples.sort()
    q = lambda f: max(0.0, (samples[int(f * (n - 1))] - overhead) / 1000)  # noqa: E731
    return {"n": n, "median_us": q(0.5), "p90_us": q(0.9), "p99_us": q(0.99),
            "mean_us": max(0.0, (sum(samples) / n - overhead) / 1000)}


def _values(i: int) -> tuple[float, float, float, float, int]:
    return 3.0 / (1 + i * 1e-3) + (i % 13) * 1e-3, 0.5 + (i % 7) * 0.01, 3e-4, 0.25 + (i % 5) * 1e-3, 4096


# The five scalars of each step, computed before any timing starts.
VALUES: list[tuple[float, float, float, float, int]] = []


def bench_trainledger(tmp: Path, n: int, overhead: float, **policy) -> dict:
    V = VALUES
    j = Journal.create(tmp / f"tl-{time.time_ns()}.jsonl", signer=Signer.generate(), **policy)

    def step(i):
        loss, gn, lr, st, tok = V[i]
        j.append(StepObserved(step=i, loss=loss, grad_norm=gn, lr=lr, step_time_s=st, tokens=tok))

    out = per_call(step, n, overhead)
    j.close()
    return out


def bench_trainledger_prebuilt(tmp: Path, n: int, overhead: float) -> dict:
    """Journal.append alone: the events are built before the clock starts."""
    events = [StepObserved(step=i, loss=v[0], grad_norm=v[1], lr=v[2], step_time_s=v[3], tokens=v[4])
              for i, v in enumerate(VALUES[:n])]
    j = Journal.create(tmp / f"tlp-{time.time_ns()}.jsonl", signer=Signer.generate())
    append = j.append
    out = per_call(lambda i: append(events[i]), n, overhead)
    j.close()
    return out


def bench_sustained(tmp: Path, n: int) -> dict:
    """A run's worth of appends timed as a whole, not call by call: ``n`` built events appended one after another
    and the journal closed (every seal, signature, flush, tree hash and write included), beside msgspec's encode and
    a buffered file's write of the same events, closed. CPU time of this process (user + sys) a step."""
    import msgspec

    events = [StepObserved(step=i, loss=v[0], grad_norm=v[1], lr=v[2], step_time_s=v[3], tokens=v[4])
              for i, v in enumerate(VALUES[:n])]
    out = {}
    for name in ("trainledger", "msgspec"):
        gc.collect()
        c0 = time.process_time()
        if name == "trainledger":
            j = Journal.create(tmp / f"sus-{time.time_ns()}.jsonl", signer=Signer.generate())
            append = j.append
            for e in events:
                append(e)
            j.close()
        else:
            enc = msgspec.json.Encoder().encode
            with open(tmp / f"sus-ms-{time.time_ns()}.jsonl", "wb") as f:
                write = f.write
                for e in events:
                    write(enc(e) + b"\n")
        out[name] = (time.process_time() - c0) / n * 1e6
    return out


def bench_plain_json(tmp: Path, n: int, overhead: float) -> dict:
    V = VALUES
    f = open(tmp / f"plain-{time.time_ns()}.jsonl", "w")
    dumps = json.dumps

    def step(i):
        loss, gn, lr, st, tok = V[i]
        f.write(dumps({"kind": "step_observed", "step": i, "loss": loss, "grad_norm": gn, "lr": lr,
                       "step_time_s": st, "tokens": tok, "ts": time.time_ns()}) + "\n")

    out = per_call(step, n, overhead)
    f.close()
    return out


def bench_plain_msgspec(tmp: Path, n: int, overhead: float) -> dict:
    V = VALUES
    import msgspec

    enc = msgspec.json.Encoder().encode  # the peer's own encoder, not the journal's codec
    f = open(tmp / f"plain-ms-{time.time_ns()}.jsonl", "wb")

    def step(i):
        loss, gn, lr, st, tok = V[i]
        f.write(enc(StepObserved(step=i, loss=loss, grad_norm=gn, lr=lr, step_time_s=st, tokens=tok)) + b"\n")

    out = per_call(step, n, overhead)
    f.close()
    return out


def bench_tensorboard(tmp: Path, n: int, overhead: float) -> dict | str:
    V = VALUES
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception as e:  # noqa: BLE001 - report why the peer is missing
        return f"unavailable: {e}"
    w = SummaryWriter(log_dir=str(tmp / "tb"))

    def step(i):
        loss, gn, lr, st, tok = V[i]
        w.add_scalar("loss", loss, i)
        w.add_scalar("grad_norm", gn, i)
        w.add_scalar("lr", lr, i)
        w.add_scalar("step_time_s", st, i)
        w.add_scalar("tokens", tok, i)

    out = per_call(step, n, overhead)
    w.close()
    return out


def bench_mlflow(tmp: Path, n: int, overhead: float) -> dict | str:
    V = VALUES
    # mlflow-skinny has no SQL store; MLflow 3 keeps the local file store behind this switch.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        import mlflow
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {e}"
    import logging
    import warnings

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    mlflow.set_tracking_uri((tmp / "mlruns").as_uri())
    mlflow.set_experiment("bench")
    with mlflow.start_run():
        def step(i):
            loss, gn, lr, st, tok = V[i]
            mlflow.log_metrics({"loss": loss, "grad_norm": gn, "lr": lr, "step_time_s": st, "tokens": tok}, step=i)

        return per_call(step, n, overhead)


def make_journal(path: Path, n: int, signer: Signer) -> None:
    j = Journal.create(path, signer=signer, run_id="bench-verify", background=False)
    for i in range(n):
        loss, gn, lr, st, tok = _values(i)
        j.append(StepObserved(step=i, loss=loss, grad_norm=gn, lr=lr, step_time_s=st, tokens=tok))
    j.close()


_VERIFY_CHILD = r"""
import json, re, resource, sys, time
from trainledger.journal import load_public_key, verify
path, pub, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None
key = load_public_key(pub)
t = time.perf_counter()
r = verify(path, keys=[key], workers=workers)
dt = time.perf_counter() - t
# VmHWM starts afresh at exec (ru_maxrss would inherit the benchmark's size through fork);
# the workers are forked from this small process, so RUSAGE_CHILDREN is theirs.
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": dt, "events": r.events, "rss_mb": max(hwm, kids) / 1024}))
"""


def verify_in_child(path: Path, pub: Path, workers: int) -> dict:
    """Verify in a fresh process: no threads of this one (MLflow, TensorBoard) to stop it forking workers."""
    out = subprocess.run([sys.executable, "-c", _VERIFY_CHILD, str(path), str(pub), str(workers)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def bench_verify(tmp: Path, n: int, signer: Signer, repeats: int) -> dict:
    path = tmp / f"verify-{n}.jsonl"
    t = time.perf_counter()
    make_journal(path, n, signer)
    write_s = time.perf_counter() - t
    pub = tmp / "bench.pub"
    pub.write_text(signer.public.line() + "\n")
    res: dict = {"bytes": path.stat().st_size, "write_s": write_s, "verify_peak_rss_mb": 0.0}
    for label, workers in (("verify_1proc_s", 1), ("verify_s", 0)):
        runs = [verify_in_child(path, pub, workers) for _ in range(repeats)]
        res[label] = statistics.median(r["seconds"] for r in runs)
        res["events"] = runs[0]["events"]
        res["verify_peak_rss_mb"] = max(res["verify_peak_rss_mb"], *(r["rss_mb"] for r in runs))
    if shutil.which("sha256sum"):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run(["sha256sum", str(path)], check=True, capture_output=True)
            times.append(time.perf_counter() - t)
        res["sha256sum_s"] = statistics.median(times)
        res["speed_vs_sha256sum"] = res["sha256sum_s"] / res["verify_s"]
    res["events_per_s"] = res["events"] / res["verify_s"]
    res["events_per_s_1proc"] = res["events"] / res["verify_1proc_s"]
    path.unlink()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000, help="appends timed per repeat (trainledger, plain JSON)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-steps", type=int, default=5_000, help="steps for TensorBoard")
    ap.add_argument("--mlflow-steps", type=int, default=500, help="steps for MLflow (slow)")
    ap.add_argument("--verify-events", type=int, default=1_000_000)
    ap.add_argument("--big", action="store_true", help="also measure verify RSS at 10,000,000 events")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--sustained", type=int, default=1_000_000,
                    help="appends timed as a whole (seals, flushes and close included), beside msgspec's")
    ap.add_argument("--only-verify", action="store_true", help="the verify measurements alone (no appends)")
    ap.add_argument("--out", default=str(ROOT / "bench-out" / "journal.json"))
    args = ap.parse_args()

    VALUES[:] = [_values(i) for i in range(max(args.steps, args.peer_steps, args.mlflow_steps, args.sustained, 50_000))]
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-"))
    from trainledger.journal import accel as _accel

    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "platform": platform.platform()}, "hashing": _accel.describe()}
    try:
        overhead = timer_overhead()
        results["timer_overhead_ns"] = overhead
        rows: dict[str, list[dict]] = {}
        for rep in range(0 if args.only_verify else args.repeats):
            gc.collect()
            rows.setdefault("trainledger: build StepObserved + append", []).append(
                bench_trainledger(tmp, args.steps, overhead))
            rows.setdefault("trainledger: append (event prebuilt)", []).append(
                bench_trainledger_prebuilt(tmp, args.steps, overhead))
            rows.setdefault("plain JSON lines (json.dumps)", []).append(bench_plain_json(tmp, args.steps, overhead))
            rows.setdefault("plain JSON lines (msgspec)", []).append(bench_plain_msgspec(tmp, args.steps, overhead))
            tb = bench_tensorboard(tmp, args.peer_steps, overhead)
            if isinstance(tb, dict):
                rows.setdefault("TensorBoard add_scalar x5", []).append(tb)
            else:
                results["tensorboard"] = tb
            ml = bench_mlflow(tmp, args.mlflow_steps, overhead)
            if isinstance(ml, dict):
                rows.setdefault("MLflow log_metrics (5 metrics)", []).append(ml)
            else:
                results["mlflow"] = ml
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)
        append = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rows.items()}
        if append:
            results["append"] = append
            tl = append["trainledger: build StepObserved + append"]["median_us"]
            for v in append.values():
                v["ratio_to_trainledger"] = v["median_us"] / tl if tl else math.nan

        sweep = {}
        for every in () if args.only_verify else (10, 100, 1000, 10000):
            r = [bench_trainledger(tmp, 50_000, overhead, seal_every=every, seal_interval_s=3600)
                 for _ in range(args.repeats)]
            sweep[every] = {"median_us": statistics.median(x["median_us"] for x in r),
                            "mean_us": statistics.median(x["mean_us"] for x in r)}
        results["seal_every_sweep"] = sweep
        if not args.only_verify:
            runs = [bench_sustained(tmp, args.sustained) for _ in range(args.repeats)]
            results["sustained"] = {"n": args.sustained, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}

        if not args.skip_verify:
            signer = Signer.generate()
            results["verify"] = bench_verify(tmp, args.verify_events, signer, args.repeats)
            if args.big:
                results["verify_10m"] = bench_verify(tmp, 10_000_000, signer, args.repeats if args.only_verify else 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(f"\nhash chain: {r['hashing']}")
    if "append" not in r:  # --only-verify
        return _print_verify(r)
    print(f"\nappend one step (5 scalars), per call, timer overhead {r['timer_overhead_ns']:.0f} ns subtracted\n")
    print("| logging one step | median µs | p90 µs | p99 µs | mean µs | median ÷ trainledger's |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, v in r["append"].items():
        print(f"| {k} | {v['median_us']:.2f} | {v['p90_us']:.2f} | {v['p99_us']:.2f} | {v['mean_us']:.2f} "
              f"| {v['ratio_to_trainledger']:.2f}× |")
    for peer in ("tensorboard", "mlflow"):
        if peer in r:
            print(f"\n{peer}: {r[peer]}")
    print("\nseal policy: append cost by seal_every (seal_interval_s=3600)\n")
    print("| seal_every | median µs | mean µs |")
    print("|---:|---:|---:|")
    for k, v in r["seal_every_sweep"].items():
        print(f"| {k} | {v['median_us']:.2f} | {v['mean_us']:.2f} |")
    if "sustained" in r:
        s = r["sustained"]
        print(f"\nsustained: {s['n']:,} built events appended and the journal closed, CPU a step (median of the "
              f"repeats): trainledger {s['trainledger']:.2f} us, msgspec encode + buffered write {s['msgspec']:.2f} us "
              f"({s['trainledger'] / s['msgspec']:.2f}x)")
    _print_verify(r)


def _print_verify(r: dict) -> None:
    for key in ("verify", "verify_10m"):
        if key in r:
            v = r[key]
            print(f"\n{key}: {v['events']:,} events, {v['bytes'] / 1e6:.0f} MB")
            print(f"  all cores: {v['verify_s']:.2f} s = {v['events_per_s'] / 1e6:.2f} M events/s; "
                  f"1 process: {v['verify_1proc_s']:.2f} s = {v['events_per_s_1proc'] / 1e6:.2f} M events/s")
            if "sha256sum_s" in v:
                print(f"  sha256sum: {v['sha256sum_s']:.2f} s; verify speed ÷ sha256sum speed = {v['speed_vs_sha256sum']:.2f}")
            print(f"  peak RSS of a verify process (largest of it and its workers): {v['verify_peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
