"""``trainledger compute``: the compute statement of a model's runs (registered by ``src/trainledger/cli/training.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from trainledger.journal.errors import UsageError

__all__ = ["register", "say_statement_check"]


def _write_out(path: str, data: bytes) -> None:
    from trainledger.cli.options import write_out

    write_out(path, data)


def _threshold(text: str) -> tuple[str, float]:
    name, eq, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not eq or not name or not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=FLOPS (a name and a positive number, e.g. "
                                         "third-of-base=1.2e24)")
    return name, v


def _range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: LOW,HIGH (e.g. 0.01,1)") from None
    return lo, hi


def register(sub) -> None:
    """Add ``compute`` (the statement built by :func:`trainledger.audit.compute_statement`, which replays with every
    package's projections)."""
    from trainledger.cli.options import add_pubkey_option
    from trainledger.cli.proofs import DOCUMENT_CHECKERS
    from trainledger.journal.statements.compute.statement import MAX_STATEMENT_BYTES, is_statement

    if not any(c[0] is is_statement for c in DOCUMENT_CHECKERS):  # verify-proof checks a statement too
        DOCUMENT_CHECKERS.append((is_statement, MAX_STATEMENT_BYTES, say_statement_check))
    p = sub.add_parser("compute", help="the compute statement of a model's runs: FLOPs, time, devices, energy, "
                                       "thresholds, each figure proven",
                       description="Verify and replay every run of one model (run folders or journals: pre-training, "
                                   "continued pre-training in new folders, fine-tunes) under the pinned keys and "
                                   "print its compute statement: model-based and hardware-based FLOPs and how far "
                                   "they agree, tokens, training time, devices and device-hours, energy (NVML's "
                                   "counter, its coverage, estimates labelled), the compute thresholds crossed and "
                                   "when, each fine-tune against a third of its base model. Every figure has two "
                                   "significant figures and its exact value beside, its method, and (--json, --out) "
                                   "an inclusion proof of the signed events it rests on, which 'trainledger "
                                   "verify-proof STATEMENT' checks offline. A run that does not verify, a replay "
                                   "difference, a rank missing, a run counted twice or a run continued from one not "
                                   "named are findings: exit 1. docs/compute.md.",
                       epilog="exit codes: 0 a clean statement, 1 findings (listed), 2 usage or I/O error",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN", help="a run folder or journal of the model (several: its runs)")
    add_pubkey_option(p)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="the statement itself (figures and proofs), as JSON")
    form.add_argument("--markdown", action="store_true", help="the figures as a Markdown table")
    form.add_argument("--html", action="store_true", help="the figures as one self-contained HTML page")
    p.add_argument("-o", "--out", metavar="FILE", help="write there instead of stdout; without a form, the JSON statement "
                                                 "goes there and the text is printed")
    p.add_argument("--threshold", action="append", type=_threshold, default=[], metavar="NAME=FLOPS",
                   help="a cumulative compute to report against besides gpai=1e23 and systemic-risk=1e25 (repeatable)")
    p.add_argument("--mfu-range", type=_range, default=None, metavar="LOW,HIGH",
                   help="the tolerance of model-based over hardware-based FLOPs (default 0.01,1)")
    p.add_argument("--board-power-w", type=float, default=None, metavar="WATTS",
                   help="a device's power, declared, for the energy estimate of device time nothing measured")
    p.add_argument("--utilisation", type=float, default=None, metavar="FRACTION",
                   help="the devices' average utilisation for the guidelines' hardware method (devices x time x "
                        "peak x utilisation), declared; default: the one measured from the run's executed FLOPs "
                        "(format 1.10 runs)")
    p.set_defaults(func=_cmd_compute)


def _cmd_compute(args: argparse.Namespace) -> int:
    from trainledger.journal.keys import trusted_keys
    from trainledger.cli.options import say
    from trainledger.journal.statements.compute.figures import DEFAULT_COMPUTE_THRESHOLDS, DEFAULT_MFU_RANGE
    from trainledger.journal.statements.compute.render import as_html, as_markdown, as_text

    keys = trusted_keys(args.pubkey)
    last = [0.0]

    def progress(what: str) -> None:  # at most a line a second: a 16,384-rank folder takes minutes
        now = time.monotonic()
        if now - last[0] >= 1.0:
            last[0] = now
            print(f"trainledger compute: {what}", file=sys.stderr, flush=True)
    from trainledger.audit import compute_statement

    st = compute_statement(args.paths, keys, thresholds={**DEFAULT_COMPUTE_THRESHOLDS, **dict(args.threshold)},
                         mfu_range=args.mfu_range or DEFAULT_MFU_RANGE, board_power_w=args.board_power_w,
                         utilisation=args.utilisation, progress=progress if sys.stderr.isatty() else None)
    data = json.dumps(st, separators=(",", ":")) + "\n"
    if args.json:
        text = data
    elif args.markdown:
        text = as_markdown(st) + "\n"
    elif args.html:
        text = as_html(st)
    else:
        text = None
    if args.out:
        _write_out(args.out, (text or data).encode())
    if text is None:
        for line in as_text(st).split("\n"):
            say(line)
        if args.out:
            say(f"  wrote the statement with its proofs to {args.out} (check it: trainledger verify-proof {args.out} "
                "--pubkey KEY)")
    elif not args.out:
        sys.stdout.write(text)
    return 1 if st["findings"] else 0


def say_statement_check(args: argparse.Namespace, data: bytes, keys: Any, fails: tuple) -> int:
    """``verify-proof`` of a compute statement: every proof and figure checked; OK, or FAIL with why."""
    from trainledger.cli.options import say
    from trainledger.cli.proofs import say_proof_failed
    from trainledger.journal.statements.compute.figures import two_figures
    from trainledger.journal.statements.compute.statement import check_statement

    if getattr(args, "witness_key", None) or getattr(args, "expect_checkpoint", None):
        raise UsageError("a compute statement is checked against pinned keys only: drop --witness-key and "
                         "--expect-checkpoint (prove and check a checkpoint's publication per journal)")
    try:
        r = check_statement(data, keys)
    except fails as e:
        return say_proof_failed(args, e)
    ok = not r.findings and not r.found
    if args.json:
        say(json.dumps({"ok": ok, "path": args.bundle, "runs": r.runs, "journals": r.journals,
                        "findings": r.findings, "found": r.found, "figures": r.figures,
                        "regulation": r.regulation, "caveats": r.caveats, "not_proven": r.not_proven,
                        "seconds": round(r.seconds, 3)}))
        return 0 if ok else 1
    f = r.figures
    say(f"{'OK  ' if ok else 'FAIL'}  {args.bundle}: compute statement of {r.runs} run(s), {r.journals:,} journal(s): "
        f"every proof holds under the pinned keys and every figure follows from the proven events "
        f"({r.seconds:.2f} s)")
    say(f"  model FLOPs {two_figures(f['model_flops'])}; hardware-based {two_figures(f['hardware_flops'])}; "
        f"energy {two_figures(None if f['energy_kwh'] is None else f['energy_kwh'] / 1000)} MWh; " + ", ".join(
            f"{n} {'reached' if t['reached'] else 'not reached'}" for n, t in f["thresholds"].items()))
    say("  the regulation's thresholds (evaluated by this check, whatever the statement lists): " + "; ".join(
        f"{n} ({t['flops']:.0e} model FLOPs) {'REACHED by run ' + str(t['by_run']) if t['reached'] else 'not reached'}"
        for n, t in r.regulation.items()))
    for x in r.found:
        say(f"  FINDING (this check finds it) {x}")
    for x in r.findings:
        say(f"  FINDING (the statement names it) {x}")
    for x in r.caveats:
        say(f"  NOT SHOWN {x}")
    say(f"  what it does not prove: {r.not_proven}")
    return 0 if ok else 1
