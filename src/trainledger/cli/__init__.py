"""The ``trainledger`` command: each package registers its own commands (``register(sub)`` in ``src/trainledger/cli/journal.py``,
``src/trainledger/cli/training.py``, ``src/trainledger/cli/ladder.py``), and this module adds the two that read every domain at once, ``replay``
and ``report`` (through :mod:`trainledger.audit` and :mod:`trainledger.report`). Nothing here imports torch: the
torch-side commands import it when they run.
"""

from __future__ import annotations

# Ctrl-C during start-up is handled already: trainledger/__init__, the first module the command imports, installs
# the one-line exit-130 handler when the process is the command.
import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any
from pathlib import Path

from trainledger.cli import journal as _journal_cli
from trainledger.cli import release as _release_cli
from trainledger.cli import ladder as _ladder_cli
from trainledger.cli import training as _training_cli
from trainledger.cli import publish as _publish_cli
from trainledger.cli import compute as _compute_cli
from trainledger.cli import bom as _bom_cli
from trainledger.journal.audit.rundir import is_run_dir
from trainledger.journal.errors import IntegrityError, UsageError
from trainledger.cli.options import (EPILOG, PATH_HELP, add_json_option, add_partial_option,
                                         add_progress_option, add_trust_options, imported_line, partial_line,
                                         progress_for, refuse_partial, say, say_failed, trust_policy)

__all__ = ["build_parser", "main", "entry"]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``trainledger`` parser. ``only``: the command about to run; the other commands' parsers are then not
    built (most of a short command's start went into building forty of them), and the whole parser is built after
    all when no command has that name (its error lists them)."""
    parser, sub = _journal_cli.new_parser()
    slot = _Only(sub, only) if only is not None else sub
    _journal_cli.register(slot)
    register(slot)
    _release_cli.register(slot)
    _compute_cli.register(slot)
    _bom_cli.register(slot)
    _publish_cli.register(slot)
    _training_cli.register(slot)
    _ladder_cli.register(slot)
    if only is not None and not slot.found:
        return build_parser()
    return parser


class _Only:
    """The subcommand slot with one command's parser built: every other command gets a stand-in that takes what
    its registration gives it and keeps nothing."""

    def __init__(self, sub: Any, name: str) -> None:
        self._sub, self._name, self.found = sub, name, False

    def add_parser(self, name: str, **kw: Any) -> Any:
        if name == self._name or self._name in kw.get("aliases", ()):
            self.found = True
            return self._sub.add_parser(name, **kw)
        return _Ignored()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._sub, attr)


class _Ignored:
    """A command parser not built: every call on it (add_argument, set_defaults, groups, nested commands) is taken
    and dropped."""

    def __getattr__(self, attr: str) -> Any:
        return lambda *args, **kwargs: self


def register(sub) -> None:
    """Add ``replay`` and ``report``: they fold every package's projections."""
    p = sub.add_parser("replay", help="verify, rebuild every projection, and recompute every derived event",
                       description="Verify the journal, fold it through every projection (health, MFU, "
                                   "checkpoints and resumes, rewinds, ladder outcome) and recompute every derived "
                                   "event (anomalies, gate verdicts, decisions) from the events they rest on. "
                                   "Any difference from what was recorded exits 1.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_trust_options(p)
    add_json_option(p)
    add_progress_option(p)
    add_partial_option(p)
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("report", help="write one self-contained HTML page about a run (curves, verdicts, decisions)",
                       description="Verify and replay a journal, then write one self-contained HTML file: the "
                                   "verification verdict and key id, loss, grad norm, step time and MFU curves with "
                                   "anomalies, checkpoints, resumes and rewinds marked, the ladder's verdicts and "
                                   "decisions, and the manifest identity. Nothing is written for a journal that "
                                   "does not verify. Needs matplotlib (pip install 'trainledger[report]').",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    p.add_argument("-o", "--out", metavar="FILE", default=None, help="where to write (default: report.html beside PATH)")
    add_trust_options(p)
    add_partial_option(p)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("serve", help="a live dashboard of what verifies, in the browser (trainledger[serve])",
                       description="Verify a journal or a run folder and serve one page that follows it as it is "
                                   "written: loss and grad norm per rank (segments and rungs apart; anomalies, "
                                   "spikes, rewinds, resumes and checkpoints marked), MFU and tokens/s, step time "
                                   "per rank with stragglers outlined, devices, verdicts, decisions, fits and stop "
                                   "rules. Only signed events are drawn; events past the last seal are drawn apart "
                                   "as not signed yet; a journal that fails verification shows one FAIL line and "
                                   "nothing else. Every point opens its event and its inclusion proof. Binds "
                                   "127.0.0.1; any other --host needs the token printed with the URL. Read-only.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", nargs="+",
                   help=PATH_HELP + " (a folder waits for its first journal; a path that does not exist yet, with "
                        "--wait); or a folder of runs, or several: every run under them on one page, side by side")
    p.add_argument("--wait", action="store_true",
                   help="PATH does not exist yet (the run is about to start): wait for it. Without --wait a missing "
                        "PATH is still waited for, with a note that it does not exist (deprecated: a later release "
                        "stops with exit 2)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0: any free one)")
    add_trust_options(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_serve)



def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``trainledger`` command; return its exit code (0 ok, 1 integrity, 2 usage or I/O, 130 Ctrl-C)."""
    args = list(sys.argv[1:] if argv is None else argv)
    only = args[0] if args and not args[0].startswith("-") else None
    return _journal_cli.main(argv, parser=build_parser(only))


def entry() -> None:
    """The console script: from here on Ctrl-C is a KeyboardInterrupt that each command handles (journal.cli's
    entry arms it inside the block that catches it)."""
    # The commands' numerical work (the scaling fit's small matrices, the tiny rungs) gains nothing from BLAS
    # threads, whose helpers spin on a shared machine (measured: twice the fit's CPU time). Read when numpy loads,
    # which is later; a value the user set is kept.
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    _journal_cli.entry(main)


# ---------------------------------------------------------------- replay and report


def _cmd_replay(args: argparse.Namespace) -> int:
    from trainledger.audit import replay

    if is_run_dir(args.path):
        return _replay_run_dir(args)
    refuse_partial(args)
    rec = _replayed(replay, args)
    if isinstance(rec, int):
        return rec
    v = rec.verify
    say(f"{'OK  ' if rec.ok else 'DIFF'}  {args.path}  run {v.run_id}  key {v.key_id} ({v.trust})  "
          f"{v.events:,} events  tail {v.tail}")
    if v.imported is not None:
        say(f"  IMPORTED {imported_line(v.imported)}")
    if v.unsealed_events and v.trust in ("pinned", "embedded"):
        say(f"  UNSIGNED: {v.unsealed_events:,} events after seq {v.trusted_last_seq} are not signed; "
              "replay left them out")
    elif v.trust == "unsigned":
        say("  UNSIGNED: the journal carries no signatures; anyone could have written it")
    if rec.health is not None:
        h = rec.health
        mfu = h["mfu"]
        m = "-" if mfu["mean"] is None else f"{mfu['mean']:.2%} (min {mfu['min']:.2%}, max {mfu['max']:.2%})"
        tps = "-" if h["tokens_per_s"] is None else f"{h['tokens_per_s']:,.0f}"
        seen = v.kinds.get("step_observed", 0)
        over = (f"over the last segment's {mfu['count']:,} steps (of {seen:,}; each run_configured starts one)"
                if mfu["mean"] is not None and seen > h["steps"] else f"over {mfu['count']:,} steps")
        say(f"  steps {h['steps']:,}; MFU mean {m} {over}; tokens/s {tps}")
        if mfu.get("implausible"):
            say(f"  MFU IMPLAUSIBLE: {mfu['above_100pct']:,} steps above 100%: the peak they are measured against "
                 f"({mfu.get('peak_source') or 'unstated source'}) is too low; not a receipt")
        if h.get("spikes_suspected"):
            say(f"  spikes suspected (unconfirmed, not anomalies): {h['spikes_suspected']}")
        sig = h.get("signals")
        if sig is not None and sig.get("loss") and not sig.get("grad_norm"):
            say("  signals: the loss alone (no grad norm recorded): the grad norm's rules had nothing to score")
        elif sig is not None and sig.get("grad_norm") and sig["grad_norm"] < sig.get("loss", 0):
            say(f"  signals: the loss on {sig['loss']:,} steps, the grad norm on {sig['grad_norm']:,}")
        if h.get("partial_batches"):
            say(f"  partial batches: {h['partial_batches']:,} steps whose batch was a fraction of the step before's "
                "(run_configured's partial_batch), not scored by the spike rules")

        r = h["restarts"]
        say(f"  restarts {r['count']} (continuity {'ok' if r['continuity_ok'] else 'BROKEN'})")
    # what no conclusion was recomputed from (logged metrics, configuration: records only); --json has, for every
    # conclusion, the kinds it was recomputed from
    unused = next((x["folds"] for x in rec.inputs if x["conclusion"] is None), {})
    if unused:
        say("  used by no conclusion (records only): " + ", ".join(f"{k} {n:,}" for k, n in sorted(unused.items())))
    if rec.compute is not None:
        c = rec.compute
        say(f"  compute {c['steps']:,} steps, {c['tokens']:,} tokens, {c['flops']:.4g} model FLOPs (every step "
            "observed, all segments)")
    for kind, steps in sorted(rec.anomalies_by_kind.items()):
        say(f"  anomaly {kind}: {len(steps)} at step{'s' if len(steps) > 1 else ''} {rec.anomaly_steps(kind)}")
    for c in rec.checkpoints:
        say(f"  checkpoint step {c['step']} {c['path']} sha256 {c['sha256'][:16]}...")
    for r in rec.resumes:
        say(f"  resumed from step {r['from_step']} ({r['checkpoint'] or r['reason']}) at seq {r['seq']}")
    for r in rec.rejected_resumes:
        say(f"  RESUME REJECTED at seq {r['seq']}: {r['path']} ({r['reason']}): {r['detail'][:200]}")
    for r in rec.rewinds:
        say(f"  rewind: spike at step {r['spike_step']} -> {r['checkpoint']}, skipped {r.get('skipped_batches')}")
    for s_ in rec.stops:
        later = f"; resumed at seq {s_['resumed_seq']}" if s_.get("resumed_seq") is not None else ""
        say(f"  stopped: {s_['rule']} ({s_['reason']}){later}")
    if rec.ladder is not None:
        lad = rec.ladder
        halted = f"halted at {lad['halted_at']}" if lad["halted_at"] else "no rung halted"
        say(f"  ladder: GO {', '.join(lad['passed_rungs']) or 'none'}; {halted}; {lad['decisions']} decisions")
        for o in lad["outcomes"]:
            say(f"    {o['rung']}: {'GO' if o['passed'] else 'NO-GO'}  {o['reason']}")
        for rung, warned in (lad.get("fit_warnings") or {}).items():
            for w in warned:
                say(f"  FIT WARNING (the fit that sized {rung}): {w}")
    for note in rec.notes:
        say(f"  note: {note}")
    for d in rec.differences:
        say(f"  DIFFERENCE seq {d['seq']} ({d['kind']}): {d['detail']}")
    return 0 if rec.ok else 1


def _replayed(fn, args: argparse.Namespace, **extra):
    """Run a replay (one journal or a run folder): the reconstruction to print, or the exit code when it
    failed (one FAIL line) or ``--json`` already printed it."""
    progress = None if is_run_dir(args.path) else progress_for(args, "verifying")
    try:
        rec = fn(args.path, trust=trust_policy(args), **extra, **({"progress": progress} if progress else {}))
    except IntegrityError as e:
        return say_failed(args, e, args.path)
    finally:
        if progress is not None:
            progress.close()
    if args.json:
        say(json.dumps(rec.to_dict(), default=str))
        return 0 if rec.ok else 1
    return rec


def _replay_run_dir(args: argparse.Namespace) -> int:
    """A distributed run's folder: every rank replayed, the straggler windows recomputed."""
    from trainledger.audit import replay_run_dir

    rec = _replayed(replay_run_dir, args, partial=args.partial)
    if isinstance(rec, int):
        return rec
    if rec.verify.partial:
        say(partial_line(args.path, rec.verify.missing))
    say(f"{'OK  ' if rec.ok else 'DIFF'}  {args.path}: {len(rec.ranks)} ranks replayed, "
        f"{rec.verify.anchors} anchors, {len(rec.stragglers)} stragglers flagged")
    for r, one in sorted(rec.ranks.items()):
        h = one.health or {}
        rej = f"  RESUMES REJECTED {len(one.rejected_resumes)}" if one.rejected_resumes else ""
        say(f"  rank {r:<5} {'OK  ' if one.ok else 'DIFF'} steps {h.get('steps', 0):,}  "
            f"anomalies {sum(len(v) for v in one.anomalies_by_kind.values())}  resumed {len(one.resumes)}{rej}")
    for s_ in rec.stragglers:
        thr = f", threshold {s_['threshold']:.2f}" if s_.get("threshold") is not None else ""
        slow = f"{1 / s_['score']:.2f}x" if s_["score"] > 0 else "infinitely"
        say(f"  straggler: rank {s_['rank']} ({s_['node']}) score {s_['score']:.3f} over steps "
            f"{s_['window'][0]}-{s_['window'][1]} (score = the fastest rank's median step time / this rank's: "
            f"its steps took {slow} as long{thr})")
    for d in rec.divergences:
        who = (f"rank {d['rank']}" if len(d["ranks"]) == 1 else "ranks " + ", ".join(map(str, d["ranks"])))
        how = ("outside the majority" if d["majority"] is not None
               else "no majority to tell which is right")
        where = f" in {d['tensor']}" if d["tensor"] else ""
        say(f"  STATE DIVERGED at step {d['step']}: {who} of {d['replicas']} replicas{where} ({how})")
    for d in rec.differences:
        say(f"  DIFFERENCE rank {d['rank']} seq {d['seq']} ({d['kind']}): {d['detail']}")
    return 0 if rec.ok else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from trainledger.serve.app import serve

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0 to 65535")

    shown = " ".join(args.path)

    def ready(url: str, board) -> None:
        state = board.state()
        if state.get("fail"):
            say(state["fail"])
        say(f"serving {shown} at {url}  (Ctrl-C stops)", flush=True)

    return serve(args.path if len(args.path) > 1 else args.path[0], trust=trust_policy(args), host=args.host,
                 port=args.port, ready=ready, progress=progress_for(args, "verifying"), wait=args.wait or None)


def _cmd_report(args: argparse.Namespace) -> int:
    from trainledger.report import write_report, write_run_dir_report

    folder = is_run_dir(args.path)
    out = Path(args.out) if args.out else (Path(args.path) / "report.html" if folder
                                           else Path(args.path).with_name("report.html"))
    if out.is_dir():
        raise UsageError(f"{out}: is a folder; give a file name with -o")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such folder")
    if not folder:
        refuse_partial(args)
    extra = {"partial": args.partial} if folder else {}
    progress = None if folder else progress_for(args, "verifying")
    if progress is not None:
        extra["progress"] = progress
    try:
        rec = (write_run_dir_report if folder else write_report)(args.path, out, trust=trust_policy(args), **extra)
    except IntegrityError as e:
        say("trainledger report: no report written", file=sys.stderr)
        return say_failed(args, e, args.path)
    if args.json:
        v = rec.verify
        say(json.dumps({"ok": rec.ok, "out": str(out), "bytes": out.stat().st_size, "path": args.path,
                        "run_id": None if folder else v.run_id, "ranks": len(rec.ranks) if folder else None,
                        "partial": bool(getattr(v, "partial", False)),
                        "differences": rec.differences}, default=str))
        return 0 if rec.ok else 1
    if folder:
        if rec.verify.partial:
            say(partial_line(args.path, rec.verify.missing))
        say(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {len(rec.ranks)} ranks, "
            f"{sum(r.events for r in rec.verify.ranks.values()):,} events, {len(rec.stragglers)} stragglers, "
            + ("replay consistent" if rec.ok else f"{len(rec.differences)} DIFFERENCES from the recomputation"))
        return 0 if rec.ok else 1
    say(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): run {rec.verify.run_id}, {rec.verify.events:,} events, "
          + ("replay consistent" if rec.ok else f"{len(rec.differences)} DIFFERENCES from the recomputation"))
    return 0 if rec.ok else 1
