"""The ``trainledger`` command.

Exit codes, for every subcommand: 0 success; 1 the journal does not verify
(integrity failure); 2 usage or I/O error (bad arguments, missing file,
unreadable or wrong key). A user mistake never prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from ._text import csv_cell, safe
from .errors import IntegrityError, JournalError, JournalIOError, TrainledgerError, UsageError
from .keys import TRUSTED_KEYS_ENV, keygen, load_signer, trusted_keys
from .verify import VerifyReport, parse_head, verify

__all__ = ["main", "entry", "build_parser", "new_parser", "register", "say", "add_trust_options", "trust_options",
           "print_report", "add_json_option", "EPILOG"]

EPILOG = """exit codes: 0 ok, 1 integrity failure (the journal does not verify, or
what it or a checkpoint says cannot hold), 2 usage or I/O error, 130 Ctrl-C;
watch also 3 at --timeout. Keys can be pinned once for a team in a file named by
$%s (one public key per line).""" % TRUSTED_KEYS_ENV


def say(*values: object, file=None, end: str = "\n", flush: bool = False) -> None:
    """Print one line. Every value is passed through :func:`journal._text.safe`: whatever a journal or a
    manifest put in a run id, a reason or a path shows as visible escapes, never as terminal control."""
    print(*(safe(v) for v in values), file=file, end=end, flush=flush)


class _Progress:
    """A one-line progress bar on stderr, shown only when stderr is a terminal."""

    def __init__(self, label: str):
        self.label = label
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        rate = done / (now - self.t0) / 1e6 if now > self.t0 else 0.0
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%}  {done / 1e6:,.1f}/{total / 1e6:,.1f} MB  {rate:,.0f} MB/s")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def _progress_for(args: argparse.Namespace, label: str) -> _Progress | None:
    if getattr(args, "json", False) or getattr(args, "no_progress", False) or not sys.stderr.isatty():
        return None
    return _Progress(label)


def add_json_option(p: argparse.ArgumentParser) -> None:
    """The shared machine-readable output switch (one JSON object on stdout)."""
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_trust_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trust")
    g.add_argument("--pubkey", action="append", default=[], metavar="FILE",
                   help=f"pinned public key (repeatable); also read from ${TRUSTED_KEYS_ENV}")
    g.add_argument("--trust-embedded", action="store_true",
                   help="check against the key embedded in the journal (integrity only: authenticity not established)")
    g.add_argument("--allow-unsigned", action="store_true", help="accept a journal that carries no signatures")
    g.add_argument("--allow-unsealed", action="store_true",
                   help="accept a signed journal whose last events no seal covers (a live or crashed run): only "
                        "the signed prefix is verified and used; the rest is counted and left out")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the journal's own commands (``trainledger.cli`` adds the training and ladder ones)."""
    parser, sub = new_parser()
    register(sub)
    return parser


def new_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The bare ``trainledger`` parser (description, --version) and its subcommand slot, for ``register``."""
    parser = argparse.ArgumentParser(
        prog="trainledger",
        description="Tamper-evident receipts for training runs: a hash-chained, Ed25519-signed event journal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trainledger {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, sub


def register(sub) -> None:
    """Add the journal's commands (keygen, verify, head, replay, query, report, watch, show, demo, and the proof
    commands of journal/cli_proofs.py)."""
    p = sub.add_parser("keygen", help="write an Ed25519 key pair (NAME.key, mode 0600, and NAME.pub)",
                       description="Write an Ed25519 private key (PKCS8 PEM, mode 0600) and a one-line public key.")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--name", default="trainledger", help="file name stem (default: trainledger)")
    p.add_argument("--force", action="store_true", help="overwrite existing key files")
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser("verify", help="verify a journal offline against a pinned key",
                       description="Check canonical form, seq continuity, every chain hash, every seal and the "
                                   "tail state. Exit 0 intact, 1 integrity failure, 2 usage or I/O error.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="a journal, or a distributed run's folder of rank-NNNNN.jsonl")
    add_trust_options(p)
    p.add_argument("--expect-head", metavar="SEQ:HASH",
                   help="fail unless the journal contains this head (published earlier with 'trainledger head')")
    p.add_argument("--require-closed", action="store_true", help="fail unless the run was closed and sealed")
    p.add_argument("--expect-checkpoint", metavar="NOTE", default=None,
                   help="fail unless the journal extends this signed checkpoint, published earlier with "
                        "'trainledger checkpoint' (format 1.3: the root of its first SIZE lines must be the note's)")
    from .cli_proofs import add_witness_options

    add_witness_options(p)
    add_json_option(p)
    p.add_argument("--workers", type=int, default=None, help="processes for large journals (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("head", help="print the latest sealed SEQ:HASH, to publish elsewhere",
                       description="Verify the journal, then print its latest sealed head as SEQ:HASH. Publish it "
                                   "somewhere the writer cannot rewrite; 'verify --expect-head' then detects truncation.")
    p.add_argument("path", metavar="PATH")
    add_trust_options(p)
    add_json_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=_cmd_head)

    p = sub.add_parser("replay", help="verify, rebuild every projection, and recompute every derived event",
                       description="Verify the journal, fold it through every projection (health, MFU, "
                                   "checkpoints and resumes, rewinds, ladder outcome) and recompute every derived "
                                   "event (anomalies, gate verdicts, decisions) from the events they rest on. "
                                   "Any difference from what was recorded exits 1.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH")
    add_trust_options(p)
    add_json_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("query", help="SQL over one or more journals (or folders of them) with DuckDB",
                       description="Load verified journals into an in-memory DuckDB and run SQL over the views "
                                   "events, runs, steps, anomalies, checkpoints, resumes, rewinds, verdicts, "
                                   "decisions, seals. File access is switched off before your SQL runs.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", metavar="PATH", nargs="+", help="journals or folders; the last argument is the SQL "
                                                          "unless --sql-file is given ('-' reads SQL from stdin)")
    add_trust_options(p)
    p.add_argument("--sql-file", metavar="FILE", help="read the SQL from FILE")
    p.add_argument("--param", action="append", default=[], metavar="VALUE",
                   help="a value bound to the next ? in the SQL (repeatable; never pasted into the SQL)")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table")
    p.add_argument("--out", metavar="FILE", help="write the result here instead of stdout (required for parquet)")
    p.add_argument("--no-verify", action="store_true", help="skip signature verification (says so on stderr)")
    p.add_argument("--no-cache", action="store_true",
                   help="read the journals even if a verified columnar copy matches their heads, and keep none")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="interrupt the SQL after this long (default 600; 0 for no limit)")
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser("report", help="write one self-contained HTML page about a run (curves, verdicts, decisions)",
                       description="Verify and replay a journal, then write one self-contained HTML file: the "
                                   "verification verdict and key id, loss, grad norm, step time and MFU curves with "
                                   "anomalies, checkpoints, resumes and rewinds marked, the ladder's verdicts and "
                                   "decisions, and the manifest identity. Nothing is written for a journal that "
                                   "does not verify. Needs matplotlib (pip install 'trainledger[report]').",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH")
    p.add_argument("-o", "--out", metavar="FILE", default=None, help="where to write (default: report.html beside PATH)")
    add_trust_options(p)
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("watch", help="follow a journal while a run writes it, with a live view",
                       description="Follow a journal like tail -f: step, loss, grad norm, tokens/s, MFU, last "
                                   "anomaly, last checkpoint, events not signed yet. Exits 0 when the run closes, 130 on Ctrl-C, "
                                   "1 at the first line that does not check out. Checks the chain as it reads, and "
                                   "every seal's signature when a key is pinned (or with --trust-embedded). PATH may be "
                                   "a distributed run's folder: one line per rank, until every rank has closed.")
    p.add_argument("path", metavar="PATH")
    add_trust_options(p)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes (default 0.5)")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    p.set_defaults(func=_cmd_watch)

    p = sub.add_parser("show", help="summarise a journal: run, key, events by kind, seals, tail",
                       description="Summarise a journal. Checks the chain but not signatures (use verify for that).")
    p.add_argument("path", metavar="PATH")
    add_json_option(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("import", help="write a signed journal from logs you already have (TensorBoard, Megatron)",
                       description="Import a run's existing logs into a new signed journal that says it was imported "
                                   "(from which files, their SHA-256, by which tool, when): it attests what the files "
                                   "said at import time, never that the run happened. The steps go through the health "
                                   "projection, so replay, query and report work on the old run.")
    isub = p.add_subparsers(dest="source", required=True, metavar="SOURCE")
    q = isub.add_parser("tensorboard", help="TensorBoard event files (the tensorboard package's own reader)")
    q.add_argument("logdir", metavar="LOGDIR")
    q.add_argument("out_dir", metavar="OUT_DIR")
    q.add_argument("--key", required=True, metavar="FILE", help="the private key that signs the imported journal")
    q.add_argument("--loss-tag", default=None, help="the loss scalar's tag (default: the first of loss, train/loss, ...)")
    q.add_argument("--grad-norm-tag", default=None)
    q.add_argument("--lr-tag", default=None)
    q.set_defaults(func=_cmd_import)
    q = isub.add_parser("megatron", help="a Megatron-LM / DeepSpeed-style log (iteration lines)")
    q.add_argument("logfile", metavar="LOGFILE")
    q.add_argument("out_dir", metavar="OUT_DIR")
    q.add_argument("--key", required=True, metavar="FILE", help="the private key that signs the imported journal")
    q.set_defaults(func=_cmd_import)

    p = sub.add_parser("export", help="write a verified journal's steps into another tool's format (TensorBoard)",
                       description="Export a journal's steps and anomalies as TensorBoard scalars, so dashboards keep "
                                   "working while the journal stays the record. The journal is verified first.")
    esub = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    q = esub.add_parser("tensorboard", help="TensorBoard event files")
    q.add_argument("path", metavar="JOURNAL")
    q.add_argument("logdir", metavar="LOGDIR")
    add_trust_options(q)
    q.set_defaults(func=_cmd_export)

    p = sub.add_parser("demo", help="write a signed journal of a simulated run, then verify and summarise it",
                       description="The torch-free demo: a key pair, a simulated training run written as a signed "
                                   "journal, verification against the pinned public key, and a summary.")
    p.add_argument("--out", metavar="DIR", default=None, help="run folder to create (default: runs/demo-<time>)")
    p.add_argument("--steps", type=int, default=2000, help="simulated optimizer steps (default: 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--key", metavar="FILE", default=None,
                   help="sign with this private key instead of a new key pair in the run folder")
    p.set_defaults(func=_cmd_demo)

    from .cli_proofs import register as register_proofs

    register_proofs(sub)


# ---------------------------------------------------------------- commands


def _cmd_keygen(args: argparse.Namespace) -> int:
    priv, pub = keygen(args.directory, name=args.name, force=args.force)
    say(f"private key: {priv} (mode 0600; keep it secret)")
    say(f"public key:  {pub}")
    say(Path(pub).read_text().strip())
    return 0


def _verify_from_args(args: argparse.Namespace, *, label: str = "verifying", **extra) -> VerifyReport:
    progress = _progress_for(args, label)
    try:
        return verify(
            args.path,
            keys=trusted_keys(args.pubkey) if hasattr(args, "pubkey") else (),
            trust_embedded=getattr(args, "trust_embedded", False),
            allow_unsigned=getattr(args, "allow_unsigned", False),
            allow_unsealed=getattr(args, "allow_unsealed", False),
            progress=progress,
            **extra,
        )
    finally:
        if progress is not None:
            progress.close()


def trust_options(args: argparse.Namespace) -> dict:
    """The trust options every reading command shares, as :func:`journal.verify.verify` takes them."""
    return {"keys": trusted_keys(args.pubkey), "trust_embedded": args.trust_embedded,
            "allow_unsigned": args.allow_unsigned, "allow_unsealed": args.allow_unsealed}


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _imported(imp: dict[str, Any]) -> str:
    files = imp.get("files") if isinstance(imp.get("files"), list) else []
    return (f"from {len(files)} {imp.get('tool')} file(s) by {imp.get('by')} at {imp.get('at')}: it attests what "
            "those files said then, not that the run happened")


def print_report(r: VerifyReport, *, title: str) -> None:
    trust = {"pinned": "pinned", "embedded": "embedded key only: authenticity NOT established",
             "unsigned": "unsigned", "unchecked": "signatures not checked"}.get(r.trust or "", r.trust)
    tail = r.tail or "-"
    if r.tail == "open":
        tail += f" ({_fmt_int(r.unsealed_events)} events after the last seal)"
    elif r.tail == "torn":
        tail += f" ({r.torn_bytes} bytes after the last complete line at byte {r.torn_offset})"
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.created_ns / 1e9)) if r.created_ns else "-"
    say(f"{title}  {r.path}")
    say(f"  run       {r.run_id}")
    if r.imported is not None:
        say(f"  IMPORTED  {_imported(r.imported)}")
    say(f"  key       {r.key_id or '-'} ({trust})")
    say(f"  created   {created}")
    say(f"  events    {_fmt_int(r.events)} in {r.bytes:,} bytes ({_fmt_int(r.seals)} seals)")
    for kind, n in sorted(r.kinds.items(), key=lambda kv: (-kv[1], kv[0])):
        say(f"    {kind:<22} {n:>12,}")
    say(f"  tail      {tail}")
    say(f"  head      {r.head or '-'}  (latest sealed)")
    if r.last_tree_root is not None and r.last_sealed_seq is not None:
        import base64

        root = base64.b64encode(bytes.fromhex(r.last_tree_root)).decode()
        say(f"  tree      {r.last_sealed_seq + 1:,} lines, root {root}  (the latest seal's; 'trainledger checkpoint' "
            "prints it signed)")
    if r.unsealed_events and r.trust in ("pinned", "embedded"):
        say(f"  UNSIGNED  {r.unsealed_events:,} events after seq {r.trusted_last_seq} are NOT signed: "
              "not verified, left out")
    for note in r.notes:
        say(f"  note: {note}")


def _cmd_verify(args: argparse.Namespace) -> int:
    from .rundir import is_run_dir

    from .cli_proofs import FAILS, expected_checkpoint

    extra = {"require_closed": args.require_closed, "workers": args.workers}
    if args.expect_head:
        extra["expect_head"] = parse_head(args.expect_head)
    if is_run_dir(args.path):
        if args.expect_head or args.expect_checkpoint:
            raise UsageError("--expect-head and --expect-checkpoint name one journal's head; give that rank's file, "
                             "not the run folder")
        return _verify_run_dir(args, require_closed=args.require_closed)
    try:
        cp = expected_checkpoint(args)
    except FAILS as e:
        say(f"FAIL  {args.path}: the expected checkpoint {args.expect_checkpoint}: {e}")
        return 1
    if cp is not None:
        extra["expect_checkpoint"] = cp
    return _verify_and_print(args, "OK  ", **extra)


def _verify_run_dir(args: argparse.Namespace, **extra) -> int:
    """A distributed run's folder: every rank journal and every cross-rank anchor (journal/rundir.py)."""
    from .rundir import verify_run_dir

    try:
        r = verify_run_dir(args.path, **trust_options(args), **extra)
    except IntegrityError as e:
        if args.json:
            say(json.dumps({"ok": False, "path": args.path, "first_bad_seq": e.seq, "error": str(e)}))
        else:
            say(e.fail_line(args.path))
        return 1
    if args.json:
        say(json.dumps(r.to_dict()))
        return 0
    say(f"OK    {r.path}: {len(r.ranks)} of {r.world_size} ranks verified, {r.anchors} cross-rank anchors hold")
    for rank, rep in sorted(r.ranks.items()):
        unsigned = f", {rep.unsealed_events:,} NOT signed" if rep.unsealed_events else ""
        say(f"  rank {rank:<5} {rep.events:>10,} events  key {rep.key_id} ({rep.trust})  tail {rep.tail}{unsigned}")
    return 0


def _verify_and_print(args: argparse.Namespace, title: str, **extra) -> int:
    """Verify, then print the report (or the one-line failure); the exit code of verify and show."""
    try:
        r = _verify_from_args(args, **extra)
    except IntegrityError as e:
        if args.json:
            d = (e.report.to_dict() if e.report is not None else {"ok": False, "path": args.path,
                                                                   "first_bad_seq": e.seq, "error": str(e)})
            say(json.dumps(d))
        else:
            say(e.fail_line(args.path))
        return 1
    if args.json:
        say(json.dumps(r.to_dict()))
    else:
        print_report(r, title=title)
    return 0


def _cmd_head(args: argparse.Namespace) -> int:
    args.allow_unsealed = True  # head prints the latest sealed head: what came after it is never part of it
    try:
        r = _verify_from_args(args)
    except IntegrityError as e:
        say(e.fail_line(args.path), file=sys.stderr)
        return 1
    if r.head is None:
        raise JournalError(f"{args.path}: no seal yet: nothing to publish")
    if args.json:
        say(json.dumps({"head": r.head, "seq": r.last_sealed_seq, "hash": r.last_sealed_hash,
                          "run_id": r.run_id, "key_id": r.key_id, "unsealed_events": r.unsealed_events}))
    else:
        say(r.head)
        if r.unsealed_events:
            say(f"trainledger head: {r.unsealed_events:,} events after it are not signed yet", file=sys.stderr)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report, write_run_dir_report
    from .rundir import is_run_dir

    folder = is_run_dir(args.path)
    out = Path(args.out) if args.out else (Path(args.path) / "report.html" if folder
                                           else Path(args.path).with_name("report.html"))
    if out.is_dir():
        raise UsageError(f"{out}: is a folder; give a file name with -o")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent}: no such folder")
    try:
        rec = (write_run_dir_report if folder else write_report)(args.path, out, **trust_options(args))
    except IntegrityError as e:
        say(e.fail_line(args.path))
        say("trainledger report: no report written", file=sys.stderr)
        return 1
    if folder:
        say(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): {len(rec.ranks)} ranks, "
            f"{sum(r.events for r in rec.verify.ranks.values()):,} events, {len(rec.stragglers)} stragglers, "
            + ("replay consistent" if rec.ok else f"{len(rec.differences)} DIFFERENCES from the recomputation"))
        return 0 if rec.ok else 1
    say(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB): run {rec.verify.run_id}, {rec.verify.events:,} events, "
          + ("replay consistent" if rec.ok else f"{len(rec.differences)} DIFFERENCES from the recomputation"))
    return 0 if rec.ok else 1


def _cmd_replay(args: argparse.Namespace) -> int:
    from .replay import replay
    from .rundir import is_run_dir

    if is_run_dir(args.path):
        return _replay_run_dir(args)

    rec = _replayed(replay, args)
    if isinstance(rec, int):
        return rec
    v = rec.verify
    say(f"{'OK  ' if rec.ok else 'DIFF'}  {args.path}  run {v.run_id}  key {v.key_id} ({v.trust})  "
          f"{v.events:,} events  tail {v.tail}")
    if v.imported is not None:
        say(f"  IMPORTED {_imported(v.imported)}")
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
        say(f"  steps {h['steps']:,}; MFU mean {m} over {mfu['count']:,} steps; tokens/s {tps}")
        if mfu.get("implausible"):
            say(f"  MFU IMPLAUSIBLE: {mfu['above_100pct']:,} steps above 100%: the peak they are measured against "
                 f"({mfu.get('peak_source') or 'unstated source'}) is too low; not a receipt")
        if h.get("spikes_suspected"):
            say(f"  spikes suspected (unconfirmed, not anomalies): {h['spikes_suspected']}")

        r = h["restarts"]
        say(f"  restarts {r['count']} (continuity {'ok' if r['continuity_ok'] else 'BROKEN'})")
    if rec.compute is not None:
        c = rec.compute
        say(f"  compute {c['steps']:,} steps, {c['tokens']:,} tokens, {c['flops']:.4g} model FLOPs (every step "
            "observed, all segments)")
    for kind, steps in sorted(rec.anomalies_by_kind.items()):
        shown = ", ".join(map(str, steps[:10])) + (" ..." if len(steps) > 10 else "")
        say(f"  anomaly {kind}: {len(steps)} at steps {shown}")
    for c in rec.checkpoints:
        say(f"  checkpoint step {c['step']} {c['path']} sha256 {c['sha256'][:16]}...")
    for r in rec.resumes:
        say(f"  resumed from step {r['from_step']} ({r['checkpoint'] or r['reason']}) at seq {r['seq']}")
    for r in rec.rewinds:
        say(f"  rewind: spike at step {r['spike_step']} -> {r['checkpoint']}, skipped {r.get('skipped_batches')}")
    for s_ in rec.stops:
        say(f"  stopped: {s_['rule']} ({s_['reason']})")
    if rec.ladder is not None:
        lad = rec.ladder
        say(f"  ladder: passed {lad['passed_rungs']}, halted_at {lad['halted_at']}, {lad['decisions']} decisions")
        for o in lad["outcomes"]:
            say(f"    {o['rung']}: {'GO' if o['passed'] else 'NO-GO'}  {o['reason']}")
    for note in rec.notes:
        say(f"  note: {note}")
    for d in rec.differences:
        say(f"  DIFFERENCE seq {d['seq']} ({d['kind']}): {d['detail']}")
    return 0 if rec.ok else 1


def _replayed(fn, args: argparse.Namespace):
    """Run a replay (one journal or a run folder): the reconstruction to print, or the exit code when it
    failed (one FAIL line) or ``--json`` already printed it."""
    try:
        rec = fn(args.path, **trust_options(args))
    except IntegrityError as e:
        say(e.fail_line(args.path))
        return 1
    if args.json:
        say(json.dumps(rec.to_dict(), default=str))
        return 0 if rec.ok else 1
    return rec


def _replay_run_dir(args: argparse.Namespace) -> int:
    """A distributed run's folder: every rank replayed, the straggler windows recomputed."""
    from .rundir import replay_run_dir

    rec = _replayed(replay_run_dir, args)
    if isinstance(rec, int):
        return rec
    say(f"{'OK  ' if rec.ok else 'DIFF'}  {args.path}: {len(rec.ranks)} ranks replayed, "
        f"{rec.verify.anchors} anchors, {len(rec.stragglers)} stragglers flagged")
    for r, one in sorted(rec.ranks.items()):
        h = one.health or {}
        say(f"  rank {r:<5} {'OK  ' if one.ok else 'DIFF'} steps {h.get('steps', 0):,}  "
            f"anomalies {sum(len(v) for v in one.anomalies_by_kind.values())}")
    for s_ in rec.stragglers:
        say(f"  straggler: rank {s_['rank']} ({s_['node']}) score {s_['score']:.3f} over steps "
            f"{s_['window'][0]}-{s_['window'][1]}")
    for d in rec.differences:
        say(f"  DIFFERENCE rank {d['rank']} seq {d['seq']} ({d['kind']}): {d['detail']}")
    return 0 if rec.ok else 1


def _cmd_query(args: argparse.Namespace) -> int:
    import csv
    import io

    import duckdb

    from .query import CACHE_MIN_BYTES, open_views, refresh_cache_in_background

    paths = list(args.paths)
    if args.sql_file:
        from .keys import read_small_file

        try:
            sql = read_small_file(Path(args.sql_file), "SQL").decode("utf-8", "replace")
        except JournalError as e:  # missing, a folder, a FIFO or a device, over 64 KiB
            raise UsageError(f"--sql-file: {e}") from None
    else:
        if len(paths) < 2:
            raise UsageError("give at least one journal and the SQL (or --sql-file)")
        sql = paths.pop()
        if sql == "-":
            sql = sys.stdin.read()
    if not sql.strip():
        raise UsageError("the SQL is empty")
    if args.format == "parquet" and not args.out:
        raise UsageError("--format parquet needs --out FILE")
    if args.no_verify:
        say("trainledger query: --no-verify: signatures NOT checked", file=sys.stderr)
        con, source = open_views(paths, verify_first=False)
    else:
        trust = trust_options(args)
        try:
            con, source = open_views(paths, use_cache=not args.no_cache, **trust)
        except IntegrityError as e:
            say(e.fail_line(str(e.report.path) if e.report else "journal"), file=sys.stderr)
            return 1
        # Large journals read cold: keep a verified columnar copy for next time, built off this process.
        if (not args.no_cache and source.origin == "journals"
                and sum(r["size"] for r in source.files) >= CACHE_MIN_BYTES):
            refresh_cache_in_background(paths, **trust)
    cols, rows = _run_sql(con, sql, args.param or None, args.timeout)
    if args.format == "parquet":
        try:
            _write_parquet(cols, rows, args.out)
        except duckdb.Error as e:
            raise JournalIOError(f"{args.out}: cannot write parquet: {str(e).splitlines()[0]}") from None
        say(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
        return 0
    buf = io.StringIO()
    if args.format == "csv":
        # Cells a spreadsheet would run as formulas get a leading '; on a terminal, control characters are
        # escaped too (in a file they are kept: the csv module quotes them).
        cell = (lambda v: safe(csv_cell(v)) if isinstance(v, str) else v) if (
            not args.out and sys.stdout.isatty()) else csv_cell
        w = csv.writer(buf)
        w.writerow([cell(c) for c in cols])
        w.writerows([cell(v) for v in row] for row in rows)
    elif args.format == "json":
        buf.write(json.dumps([dict(zip(cols, r)) for r in rows], default=str) + "\n")
    else:
        widths = [max(len(safe(c)), *(len(_cell(r[i])) for r in rows)) if rows else len(safe(c))
                  for i, c in enumerate(cols)]
        buf.write("  ".join(safe(c).ljust(w) for c, w in zip(cols, widths)) + "\n")
        for r in rows:
            buf.write("  ".join(_cell(v).ljust(w) for v, w in zip(r, widths)) + "\n")
        buf.write(f"({len(rows)} rows)\n")
    if args.out:
        Path(args.out).write_text(buf.getvalue())
    else:
        sys.stdout.write(buf.getvalue())
    return 0


def _run_sql(con, sql: str, params, timeout: float) -> tuple[list[str], list[tuple]]:
    """Run the user's SQL in a worker thread, so that Ctrl-C and ``--timeout`` can interrupt DuckDB."""
    import threading

    import duckdb

    if not timeout >= 0 or timeout == float("inf"):
        raise UsageError(f"--timeout must be a finite number of seconds (0 for none), got {timeout}")
    box: dict = {}

    def work() -> None:
        try:
            cur = con.execute(sql, params)
            box["cols"] = [d[0] for d in cur.description] if cur.description else []
            box["rows"] = cur.fetchall()
        except duckdb.Error as e:
            box["error"] = e

    t = threading.Thread(target=work, name="trainledger-query", daemon=True)
    t.start()
    deadline = time.monotonic() + timeout if timeout else None
    try:
        while t.is_alive():
            t.join(0.05)
            if deadline is not None and time.monotonic() > deadline and t.is_alive():
                con.interrupt()
                t.join(10)
                raise UsageError(f"the query ran longer than --timeout {timeout:g} s and was interrupted")
    except KeyboardInterrupt:
        con.interrupt()
        t.join(10)
        raise
    if "error" in box:
        raise UsageError(f"query failed: {str(box['error']).splitlines()[0]}")
    return box["cols"], box["rows"]


def _write_parquet(cols: list[str], rows: list[tuple], out_path: str) -> None:
    """Write the result with a connection of our own (the query's is locked down), where the user asked."""
    import duckdb

    out = duckdb.connect(":memory:")
    out.execute("SET autoinstall_known_extensions = false")
    if rows:
        out.execute("CREATE TABLE r AS SELECT * FROM (VALUES " + ", ".join(
            "(" + ", ".join("?" for _ in cols) + ")" for _ in rows) + f") t({', '.join(map(_qi, cols))})",
            [v for row in rows for v in row])
    else:
        out.execute(f"CREATE TABLE r ({', '.join(_qi(c) + ' VARCHAR' for c in cols)})")
    out.execute(f"COPY r TO {_ql(out_path)} (FORMAT parquet)")


def _cell(v) -> str:
    return "NULL" if v is None else (f"{v:.6g}" if isinstance(v, float) else safe(v))


def _qi(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def _ql(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _cmd_import(args: argparse.Namespace) -> int:
    from .imports import import_megatron, import_tensorboard

    signer = load_signer(args.key)
    if args.source == "tensorboard":
        r = import_tensorboard(args.logdir, args.out_dir, signer, loss_tag=args.loss_tag,
                               grad_norm_tag=args.grad_norm_tag, lr_tag=args.lr_tag)
    else:
        r = import_megatron(args.logfile, args.out_dir, signer)
    say(f"IMPORTED {r.steps:,} steps and {r.metrics:,} other values from {r.files} {args.source} file(s) into "
        f"{r.journal} (signed; it attests what the files said now, not that the run happened)")
    for line, why in r.skipped[:10]:
        say(f"  skipped line {line}: {why}")
    if r.skipped:
        say(f"  {len(r.skipped)} line(s) skipped in all", file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ._snapshot import PrivateCopies
    from .imports import export_tensorboard
    from .reader import unchecked_batches
    from .verify import verify_copy

    with PrivateCopies() as copies:
        try:
            rep, copy = verify_copy(args.path, copies, **trust_options(args))
        except IntegrityError as e:
            say(e.fail_line(args.path))
            return 1
        n = export_tensorboard((e for b in unchecked_batches(copy, rep.trusted_bytes) for e in b), args.logdir,
                               run_id=rep.run_id or "run")
    say(f"wrote {n:,} scalars of {rep.run_id} to {args.logdir} (TensorBoard event file; the journal stays the record)")
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    from .watch import watch

    if not 0 < args.interval <= 3600:
        raise UsageError(f"--interval must be a number of seconds in (0, 3600], got {args.interval}")
    if args.timeout is not None and not 0 <= args.timeout < float("inf"):
        raise UsageError(f"--timeout must be a finite number of seconds, got {args.timeout}")
    return watch(args.path, interval=args.interval, timeout=args.timeout, keys=trusted_keys(args.pubkey),
                 trust_embedded=args.trust_embedded, allow_unsigned=args.allow_unsigned)


def _cmd_show(args: argparse.Namespace) -> int:
    return _verify_and_print(args, "JOURNAL", label="reading", check_signatures=False)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    if args.steps < 1:
        raise JournalError(f"--steps must be at least 1, got {args.steps}")
    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-%Y%m%dT%H%M%S")
    journal_path, pub = run_demo(out, steps=args.steps, seed=args.seed,
                                 key=Path(args.key) if args.key else None)
    say(f"wrote {journal_path} (public key {pub})")
    say(f"$ trainledger verify {journal_path} --pubkey {pub} --require-closed")
    r = verify(journal_path, keys=trusted_keys([str(pub)]), require_closed=True)
    print_report(r, title="OK  ")
    return 0


# ---------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Run one command; return its exit code. ``parser`` defaults to the journal's commands alone
    (``trainledger.cli.main`` passes the full one)."""
    parser = parser if parser is not None else build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # query takes its options anywhere: `query J.jsonl --format json "SQL"` leaves the SQL over here.
        if getattr(args, "command", None) == "query" and not any(x.startswith("-") and x != "-" for x in extra):
            args.paths += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except TrainledgerError as e:  # the journal's, the training side's and the ladder's errors alike
        say(f"trainledger {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        say(f"trainledger {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `trainledger show ... | head`: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file or folder that cannot be read or written: an I/O error, one line, exit 2
        where = f"{e.filename}: " if e.filename else ""
        say(f"trainledger {args.command}: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


def entry(main=main) -> None:
    """A console script's body: ``main()``, and after Ctrl-C an immediate exit.

    Ctrl-C can arrive while DuckDB or a verifier still runs native threads (a query's load, its SQL); letting
    the interpreter finalise around them can abort the process. Journals still open are sealed first.
    """
    code = main()
    if code == 130:
        from .writer import suspend_all

        suspend_all()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover - `python -m trainledger.journal.cli`: the journal's commands
    entry()
