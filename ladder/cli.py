"""The pilot ladder's command: ``trainledger ladder`` (registered by ``trainledger.cli``; torch when it runs)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trainledger.journal.cli import print_report, say
from trainledger.journal.errors import JournalError, UsageError
from trainledger.journal.keys import keygen, trusted_keys
from trainledger.journal.verify import verify

__all__ = ["register"]


def register(sub) -> None:
    """Add ``ladder`` to the ``trainledger`` command."""
    p = sub.add_parser("ladder", help="run the tiny pilot ladder on the CPU: signed journal, verify, outcome table",
                       description="Run a pilot ladder (each rung trained and gated on its own receipts, a "
                                   "signed decision after each), write its signed journal and key under OUT_DIR, "
                                   "verify it and print the outcome. The rungs stand in, at a tiny scale, for "
                                   "real ones that cannot run here. Needs the torch extra.")
    p.add_argument("out", metavar="OUT_DIR", help="run folder to create (must not hold a ladder yet)")
    p.add_argument("--preset", choices=("tiny", "halt"), default="tiny",
                   help="tiny: the three-rung ladder that passes; halt: a rung with an impossible bar")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s to compute MFU against (default: this CPU's measured fp32 matmul throughput, "
                        "measured before the first rung and recorded in each run_configured)")
    p.set_defaults(func=_cmd_ladder)


def _cmd_ladder(args: argparse.Namespace) -> int:
    try:
        from trainledger.ladder.presets import PRESETS
        from trainledger.ladder.runner import run_pilot_ladder
    except ImportError as e:
        raise JournalError(f"the ladder needs the torch extra (pip install 'trainledger[torch]'): {e}") from None
    from trainledger.journal.keys import load_signer
    from trainledger.journal.writer import Journal

    out = Path(args.out)
    if (out / "ladder.jsonl").exists():
        raise JournalError(f"{out}/ladder.jsonl already exists; choose another OUT_DIR")
    priv, pub = keygen(out)
    j = Journal.create(out / "ladder.jsonl", signer=load_signer(priv), meta={"preset": args.preset,
                       "note": "tiny stand-in rungs: real targets are labels, not what ran"})
    peak = args.peak_flops
    peak_info = {"peak_source": "given", "peak_spread": None}
    if peak is None:
        from trainledger.training.flops import measure_matmul_peak

        meas = measure_matmul_peak(detail=True)
        peak, peak_info = meas.peak, {"peak_source": "measured", "peak_spread": meas.spread}
        say(f"MFU is measured against this CPU's fp32 matmul throughput: {peak:.3g} FLOP/s, best of "
             f"{meas.samples} products (median {meas.median:.3g}; spread {meas.spread:.0%}) (--peak-flops to set)")
    t0 = time.perf_counter()
    try:
        result = run_pilot_ladder(PRESETS[args.preset](), peak_flops_per_sec=peak, journal=j,
                                  work_dir=out / "rungs", **peak_info)
    except BaseException:
        j.suspend()
        raise
    j.close()
    say(f"ladder '{args.preset}' in {time.perf_counter() - t0:.1f} s: {len(result.outcomes)} rungs attempted, "
          f"halted_at={result.halted_at}, passed={result.passed_rungs()}, {result.decisions} decisions")
    say(f"{'rung':<22} {'verdict':<8} {'final loss':>10} {'forget gap':>10} {'MFU mean':>10}  reason")
    for o in result.outcomes:
        mfu = o.measured.get("mfu_mean")
        shown = "-" if mfu is None else format(mfu, "10.3e") + ("!" if mfu > 1.0 else "")
        say(f"{o.name:<22} {'GO' if o.passed else 'NO-GO':<8} {o.measured['final_loss']:>10.4f} "
             f"{o.measured['forgetting_gap']:>10.4f} {shown:>10}  {o.reason}")
        if mfu is not None and mfu > 1.0:
            say("    MFU above 100% is implausible: the measured peak is too low (see its spread above); not a receipt")
        for piece, why in o.artifacts.get("skipped_pieces", {}).items():
            say(f"    skipped {piece}: {why}")
        for key in ("F9_mup_transfer", "H2_moe_vs_dense"):
            if key in o.artifacts:
                say(f"    {key}: {o.artifacts[key]}")
    say(f"$ trainledger verify {out / 'ladder.jsonl'} --pubkey {pub} --require-closed")
    r = verify(out / "ladder.jsonl", keys=trusted_keys([str(pub)]), require_closed=True)
    print_report(r, title="OK  ")
    try:
        from trainledger.journal.report import write_report

        rec = write_report(out / "ladder.jsonl", out / "report.html", keys=trusted_keys([str(pub)]))
    except UsageError as e:  # matplotlib missing: the run stands without its page
        say(f"no report: {e}")
        return 0
    say(f"$ trainledger report {out / 'ladder.jsonl'} --pubkey {pub} -o {out / 'report.html'}")
    say(f"wrote {out / 'report.html'}: replay " + ("consistent: every verdict and decision follows from its "
                                                       "receipts" if rec.ok else "found DIFFERENCES"))
    return 0 if rec.ok else 1
