"""The pilot ladder's command: ``trainledger ladder`` (registered by ``trainledger.cli``; torch when it runs)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trainledger.training.health.mfu import record_compute
from trainledger.cli.options import print_report, say as _say
from trainledger.journal.errors import JournalError, UsageError
from trainledger.journal.keys import run_key, trusted_keys
from trainledger.journal.verify import verify

__all__ = ["register"]


def register(sub) -> None:
    """Add ``ladder`` and ``fit`` to the ``trainledger`` command; ``ladder`` writes the run's page after it
    (:func:`trainledger.report.write_report`, imported then: matplotlib is an extra)."""
    p = sub.add_parser("ladder", help="run the tiny pilot ladder on the CPU: signed journal, verify, outcome table",
                       description="Run a pilot ladder (each rung trained and gated on its own receipts, a "
                                   "signed decision after each), write its signed journal and public key under "
                                   "OUT_DIR (the private key outside it), "
                                   "verify it and print the outcome. The rungs stand in, at a tiny scale, for "
                                   "real ones that cannot run here. Needs the torch extra.")
    p.add_argument("out", metavar="OUT_DIR", help="run folder to create (must not hold a ladder yet)")
    p.add_argument("--preset", choices=("scaling", "tiny", "halt"), default="scaling",
                   help="scaling (the default): nine pilots (three sizes at each of three compute budgets) measured on "
                        "held-out data, then the "
                        "headline run sized by the scaling-law fit inside a compute box, its prediction checked; tiny: the seed's "
                        "three-rung ladder that passes; halt: the seed's ladder with an impossible bar")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s to compute MFU against (default: this CPU's measured fp32 matmul throughput, "
                        "measured before the first rung and recorded in each run_configured)")
    p.add_argument("--key", metavar="KEY", default=None,
                   help="sign with this private key (a file outside OUT_DIR, or a pkcs11: URI); default: a new key in $TRAINLEDGER_KEY_DIR "
                        "or ~/.config/trainledger/keys, named after OUT_DIR")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout at the end (the outcome, the fit, verification, the report) "
                        "instead of the table; progress stays on stderr")
    p.set_defaults(func=_cmd_ladder)

    p = sub.add_parser("fit", help="fit a scaling law L(N, D) = E + A/N^alpha + B/D^beta to (n_params, tokens, loss)",
                       description="Fit the Chinchilla form to a CSV of n_params,tokens,loss rows (a header row is "
                                   "allowed), the way Besiroglu et al. 2024 recommend (Huber loss on log-loss "
                                   "residuals, a damped Newton minimiser from a grid); print the law, its leave-one-out error, and, "
                                   "with --budget, the compute-optimal (N, D) on the 6ND frontier with a seeded "
                                   "bootstrap interval of its predicted loss. Needs numpy and scipy.")
    p.add_argument("csv", metavar="POINTS.csv|JOURNAL.jsonl",
                   help="a CSV of points, or a ladder journal: the rungs' held-out losses (verified first)")
    p.add_argument("--budget", type=float, action="append", default=[], metavar="FLOPS",
                   help="training FLOPs to size a run for (repeatable)")
    p.add_argument("--level", type=float, default=0.9, help="interval level (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON")
    from trainledger.cli.options import add_trust_options

    add_trust_options(p)
    p.set_defaults(func=_cmd_fit)


def _read_points(path: Path) -> list[tuple[float, float, float]]:
    import csv
    import math

    from trainledger.journal.errors import UsageError
    from trainledger.journal.keys import read_small_file

    text = read_small_file(path, "points file").decode("utf-8", "replace")
    pts = []
    for n, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        try:
            vals = [float(x) for x in row]
        except ValueError:
            if n == 1 and not pts:
                continue  # a header
            raise UsageError(f"{path}:{n}: not three numbers (n_params,tokens,loss): {','.join(row)[:80]}") from None
        if len(vals) != 3:
            raise UsageError(f"{path}:{n}: expected 3 values (n_params,tokens,loss), got {len(vals)}")
        if not all(math.isfinite(v) and v > 0 for v in vals):
            raise UsageError(f"{path}:{n}: n_params, tokens and loss must be positive finite numbers")
        pts.append((vals[0], vals[1], vals[2]))
    return pts


def _journal_points(args: argparse.Namespace) -> list[tuple[float, float, float]]:
    """(n_params, tokens, eval_loss) of every rung verdict in a ladder journal, after verifying it."""
    from trainledger.journal.copies import PrivateCopies
    from trainledger.cli.options import trust_policy
    from trainledger.ladder.kinds import GateVerdict
    from trainledger.journal.reader import unchecked_batches
    from trainledger.journal.verify import verify_copy

    pts = []
    with PrivateCopies() as copies:
        rep, copy = verify_copy(args.csv, copies, trust_policy(args))
        for batch in unchecked_batches(copy, rep.trusted_bytes):
            for ev in batch:
                m = ev.measured if isinstance(ev, GateVerdict) and isinstance(ev.measured, dict) else {}
                if all(isinstance(m.get(k), (int, float)) for k in ("n_params", "tokens", "eval_loss")):
                    pts.append((float(m["n_params"]), float(m["tokens"]), float(m["eval_loss"])))
    if not pts:
        raise UsageError(f"{args.csv}: no rung with a held-out loss (eval_batches) in this journal")
    if len(pts) > 1000:  # as replay bounds a recorded fit: a ladder has tens of rungs
        raise UsageError(f"{args.csv}: {len(pts):,} rung points, more than the 1,000 a fit here takes")
    return pts


def _cmd_fit(args: argparse.Namespace) -> int:
    import json

    from trainledger.journal.errors import UsageError
    from trainledger.ladder.scaling import fit_scaling_law

    if Path(args.csv).is_dir():  # a ladder's run folder: its ladder.jsonl (the key is pinned like any other)
        folder = Path(args.csv)
        if not (folder / "ladder.jsonl").is_file():
            raise UsageError(f"{folder}: no ladder.jsonl in this folder")
        args.csv = str(folder / "ladder.jsonl")
    pts = _journal_points(args) if args.csv.endswith(".jsonl") else _read_points(Path(args.csv))
    if not 0 < args.level < 1:
        raise UsageError(f"--level must be in (0, 1), got {args.level}")
    try:
        fit = fit_scaling_law(pts, seed=args.seed)
    except ValueError as e:
        raise UsageError(f"{args.csv}: {e}") from None
    out = {"ok": True, "points": len(pts), "params": fit.params, "loo_error": fit.loo_error(), "warnings": fit.warnings(),
           "budgets": []}
    for c in args.budget:
        if not c > 0:
            raise UsageError(f"--budget must be a positive number of FLOPs, got {c}")
        try:
            n, d = fit.compute_optimal(c)
        except ValueError as e:
            raise UsageError(str(e)) from None
        lo, hi = fit.interval(n, d, level=args.level)
        out["budgets"].append({"flops": c, "n_params": n, "tokens": d, "tokens_per_param": d / n,
                               "predicted_loss": fit.predict(n, d), "interval": [lo, hi], "level": args.level})
    if args.json:
        print(json.dumps(out))
        return 0
    p = fit.params
    print(f"L(N, D) = {p['E']:.4g} + {p['A']:.4g} / N^{p['alpha']:.4f} + {p['B']:.4g} / D^{p['beta']:.4f}"
          f"   ({len(pts)} points; leave-one-out error {out['loo_error']:.2%})")
    for b in out["budgets"]:
        print(f"  {b['flops']:.3g} FLOPs: N = {b['n_params']:.4g}, D = {b['tokens']:.4g} ({b['tokens_per_param']:.1f} "
              f"tokens per parameter), predicted loss {b['predicted_loss']:.4f}, {b['level']:.0%} interval "
              f"[{b['interval'][0]:.4f}, {b['interval'][1]:.4f}]")
    for w in out["warnings"]:
        print(f"  FIT WARNING: {w}")
    print("  E is often not identifiable from a small ladder, and a size far beyond the points is an extrapolation.")
    return 0


def _progress_line(line: str) -> None:
    """A progress line on stderr (stdout keeps the results), flushed at once."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _cmd_ladder(args: argparse.Namespace) -> int:
    from trainledger.journal.keys import load_signer
    from trainledger.journal.writer import Journal

    # with --json, stdout holds the one object and every other line goes to stderr, with the progress
    say = _say if not args.json else (lambda *a, **k: _say(*a, **{**k, "file": sys.stderr}))

    out = Path(args.out)  # the arguments first: torch takes seconds to import, a mistake should not
    if (out / "ladder.jsonl").exists():
        raise JournalError(f"{out}/ladder.jsonl already exists; choose another OUT_DIR")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    if args.key is not None:
        load_signer(args.key)   # a key that does not load is named now, not after the imports
    if args.peak_flops is not None and not (args.peak_flops > 0 and args.peak_flops != float("inf")):
        raise UsageError(f"--peak-flops must be a positive number of FLOP/s, got {args.peak_flops}")
    try:
        from trainledger.ladder.presets import PRESETS
        from trainledger.ladder.runner import run_pilot_ladder
    except ImportError as e:
        raise JournalError(f"the ladder needs the torch extra (pip install 'trainledger[torch]'): {e}") from None
    priv, pub = run_key(out, args.key)
    say(f"signing key {priv} (outside the run folder; the public key is {pub})")
    j = Journal.create(out / "ladder.jsonl", signer=load_signer(priv), meta={"preset": args.preset,
                       "note": "tiny stand-in rungs: real targets are labels, not what ran"})
    peak = args.peak_flops
    peak_info = {"peak_source": "given", "peak_spread": None}
    if peak is None:
        from trainledger.training.health.flops import measure_matmul_peak

        meas = measure_matmul_peak(detail=True)
        peak, peak_info = meas.peak, {"peak_source": "measured", "peak_spread": meas.spread}
        say(f"MFU is measured against this CPU's fp32 matmul throughput: {peak:.3g} FLOP/s, best of "
             f"{meas.samples} products (median {meas.median:.3g}; spread {meas.spread:.0%}) (--peak-flops to set)")
    t0 = time.perf_counter()
    try:
        result = run_pilot_ladder(PRESETS[args.preset](), peak_flops_per_sec=peak, journal=j,
                                  work_dir=out / "rungs", progress=_progress_line, **peak_info)
    except BaseException:
        j.suspend()
        raise
    record_compute(j)
    j.close()
    halted = f"halted at {result.halted_at}" if result.halted_at else "no rung halted"
    say(f"ladder '{args.preset}' in {time.perf_counter() - t0:.1f} s: {len(result.outcomes)} rungs attempted, "
          f"{halted}, GO: {', '.join(result.passed_rungs()) or 'none'}, {result.decisions} decisions")
    say(f"{'rung':<22} {'verdict':<8} {'final loss':>10} {'forget gap':>10} {'MFU mean':>10}  reason")
    for o in result.outcomes:
        mfu = o.measured.get("mfu_mean")
        shown = "-" if mfu is None else f"{mfu:.3%}" + ("!" if mfu > 1.0 else "")   # a percent, as everywhere
        say(f"{o.name:<22} {'GO' if o.passed else 'NO-GO':<8} {o.measured['final_loss']:>10.4f} "
             f"{o.measured['forgetting_gap']:>10.4f} {shown:>10}  {o.reason}")
        if mfu is not None and mfu > 1.0:
            say("    MFU above 100% is implausible: the measured peak is too low (see its spread above); not a receipt")
        for piece, why in o.artifacts.get("skipped_pieces", {}).items():
            say(f"    skipped {piece}: {why}")
        for key in ("F9_mup_transfer", "H2_moe_vs_dense"):
            if key in o.artifacts:
                say(f"    {key}: {o.artifacts[key]}")
        f5 = o.artifacts.get("F5_scaling_fit")
        if f5:
            p = f5["params"]
            say(f"    scaling-law fit: L(N, D) = {p['E']:.4g} + {p['A']:.4g}/N^{p['alpha']:.3f} + {p['B']:.4g}/D^{p['beta']:.3f} "
                f"(leave-one-out error {f5['loo_error']:.2%}); fitted E {p['E']:.4g} vs the corpus's true "
                f"entropy rate {f5['entropy_rate']:.4g} nats; chose {f5['candidate']['name']} "
                f"({f5['candidate']['n_params']:,} params), binding constraint: {f5['binding']}")
            for w in f5.get("warnings") or ():
                say(f"    FIT WARNING: {w}")
    say(f"$ trainledger verify {out / 'ladder.jsonl'} --pubkey {pub} --require-closed")
    r = verify(out / "ladder.jsonl", keys=trusted_keys([str(pub)]), require_closed=True)
    if not args.json:
        print_report(r, title="OK  ")
    summary = {"ok": True, "out": str(out), "journal": str(out / "ladder.jsonl"), "pubkey": str(pub),
               "key": str(priv), "preset": args.preset, "seconds": round(time.perf_counter() - t0, 3),
               "passed_rungs": result.passed_rungs(), "halted_at": result.halted_at, "decisions": result.decisions,
               "outcomes": [{"rung": o.name, "passed": o.passed, "reason": o.reason,
                             **{k: o.measured.get(k) for k in ("final_loss", "forgetting_gap", "mfu_mean",
                                                               "eval_loss")},
                             **({"fit": o.artifacts["F5_scaling_fit"]} if "F5_scaling_fit" in o.artifacts else {})}
                            for o in result.outcomes],
               "verify": r.to_dict(), "report": None, "replay_consistent": None}
    code = 0
    try:  # the run's page, beside its journal
        from trainledger.report import write_report

        rec = write_report(out / "ladder.jsonl", out / "report.html", keys=trusted_keys([str(pub)]))
    except UsageError as e:  # matplotlib missing: the run stands without its page
        say(f"no report: {e}")
    else:
        say(f"$ trainledger report {out / 'ladder.jsonl'} --pubkey {pub} -o {out / 'report.html'}")
        say(f"wrote {out / 'report.html'}: replay " + ("consistent: every verdict and decision follows from its "
                                                           "receipts" if rec.ok else "found DIFFERENCES"))
        summary.update(report=str(out / "report.html"), replay_consistent=rec.ok, ok=rec.ok)
        code = 0 if rec.ok else 1
    import importlib.util

    # where to look next: the live dashboard on what was just written (its extra is in the main job's setup)
    if all(importlib.util.find_spec(m) is not None for m in ("starlette", "uvicorn", "pyarrow")):
        say(f"open the dashboard: trainledger serve {out} --pubkey {pub}   (then the URL it prints)")
    else:
        say(f"for the dashboard: pip install '.[serve]', then trainledger serve {out} --pubkey {pub}")
    if args.json:
        import json

        _say(json.dumps(summary, default=str))
    return code
