"""The training side's commands: ``watch``, ``import``, ``export``, ``demo``, ``manifest``, ``preflight`` and
``approve`` (registered by ``trainledger.cli``).

Importing this module does not import torch: the manifest commands run on an auditor's machine, and
``preflight`` imports the torch side when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
import time
from pathlib import Path
from typing import Any

from trainledger.journal.audit.rundir import AnchorMismatch, is_run_dir
from trainledger.journal.errors import IntegrityError
from trainledger.journal.keys import load_signer, trusted_keys
from trainledger.journal.paths import write_atomically
from trainledger.cli.options import (add_json_option, add_partial_option, add_progress_option, add_trust_options,
                                         partial_line, print_report, refuse_partial, say, say_failed, trust_policy)
from trainledger.journal.verify import verify
from trainledger.journal.errors import JournalError, UsageError
from trainledger.journal.keys import keygen
from trainledger.journal.text import safe

__all__ = ["register"]


def register(sub) -> None:
    """Add ``watch``, ``import``, ``export``, ``demo``, ``manifest``, ``preflight`` and ``approve`` to the
    ``trainledger`` command."""
    p = sub.add_parser("watch", help="follow a journal while a run writes it, with a live view",
                       description="Follow a journal like tail -f: step, loss, grad norm, tokens/s, MFU, last "
                                   "anomaly, last checkpoint, events not signed yet. Exits 0 when the run closes, 130 on Ctrl-C, "
                                   "1 at the first line that does not check out. Checks the chain as it reads, and "
                                   "every seal's signature when a key is pinned (or with --trust-embedded). PATH may be "
                                   "a distributed run's folder: one line per rank, until every rank has closed.")
    p.add_argument("path", metavar="PATH", help="a journal or a run folder; one about to be written (its folder must "
                                                "exist) with --wait")
    p.add_argument("--wait", action="store_true",
                   help="PATH does not exist yet (the run is about to start): wait for it. Without --wait a missing "
                        "PATH is still waited for, with a note that it does not exist (deprecated: a later release "
                        "stops with exit 2)")
    add_trust_options(p)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes (default 0.5)")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit 3)")
    p.add_argument("--json", action="store_true",
                   help="instead of the view, one JSON object on stdout each time it changes (JSON lines); a "
                        "failure as one object with \"ok\": false")
    p.set_defaults(func=_cmd_watch)

    p = sub.add_parser("import", help="write a signed journal from logs you already have (TensorBoard, W&B, MLflow, Megatron)",
                       description="Import a run's existing logs into a new signed journal that says it was imported "
                                   "(from which files, their SHA-256, by which tool, when): it attests what the files "
                                   "said at import time, never that the run happened. The steps go through the health "
                                   "projection, so replay, query and report work on the old run.")
    isub = p.add_subparsers(dest="source", required=True, metavar="SOURCE", help="tensorboard, wandb, mlflow or megatron")
    _add_import(isub, "tensorboard", "TensorBoard event files (the tensorboard package's own reader)", "logdir",
                "LOGDIR", "the folder of TensorBoard event files to read", ("the loss scalar's tag", "tag"))
    _add_import(isub, "wandb", "a W&B offline run (its records parsed with the wandb package's own schema)", "logdir",
                "RUN_DIR", "the offline run's folder (wandb/offline-run-*) or its .wandb file", ("the loss key", "key"))
    _add_import(isub, "mlflow", "one run of a local MLflow file store (mlruns/)", "logdir", "MLRUNS_DIR",
                "mlruns/ (holding one run), an experiment's folder, or the run's folder (mlruns/EXPERIMENT/RUN)",
                ("the loss metric", "metric"))
    _add_import(isub, "megatron", "a Megatron-LM / DeepSpeed-style log (iteration lines)", "logfile", "LOGFILE",
                "the training log to read")

    p = sub.add_parser("export", help="write verified journals into another format: TensorBoard scalars, or a "
                                      "Parquet dataset with receipts",
                       description="Export verified journals: 'tensorboard' writes a journal's steps and anomalies as "
                                   "TensorBoard scalars, so dashboards keep working while the journal stays the "
                                   "record; 'parquet' writes their signed events as a Parquet dataset with its "
                                   "receipts, which query and verify read. The journals are verified first.")
    esub = p.add_subparsers(dest="target", required=True, metavar="TARGET", help="tensorboard or parquet")
    q = esub.add_parser("tensorboard", help="TensorBoard event files",
                        description="A journal's steps and anomalies as TensorBoard scalars in LOGDIR. A run folder "
                                    "is checked whole first (as verify RUN_DIR checks it), then each rank is written "
                                    "to LOGDIR/rank-NNNNN (one TensorBoard run per rank).")
    q.add_argument("path", metavar="JOURNAL", help="a journal, a run folder holding one (ladder.jsonl, journal.jsonl), or a distributed run's folder of rank-NNNNN.jsonl")
    q.add_argument("logdir", metavar="LOGDIR", help="the folder to write TensorBoard event files into")
    add_trust_options(q)
    add_partial_option(q)
    add_json_option(q)
    q.set_defaults(func=_cmd_export)
    q = esub.add_parser("parquet", help="verified events as a Parquet dataset with receipts",
                        description="Verify the journals (a run folder whole, as verify RUN_DIR checks it) and write "
                                    "their signed events to the new folder OUT: one zstd Parquet file per table "
                                    "(events and each of query's typed views, the same columns) and journal, "
                                    "OUT/TABLE/run-RUN/rank-NNNNN.parquet, each file's footer holding its journal's "
                                    "receipt (head, tree size and root, signed checkpoint, key), and "
                                    "OUT/receipts.json listing every file with its SHA-256. With --lines the events "
                                    "keep each line's exact bytes, so 'trainledger verify OUT' re-verifies the "
                                    "export alone; without it the export is as trustworthy as whoever wrote it. "
                                    "OUT must not exist; it appears only once whole.")
    q.add_argument("paths", nargs="+", metavar="PATH", help="journals, run folders or folders of journals")
    q.add_argument("out", metavar="OUT", help="the folder to create")
    q.add_argument("--lines", action="store_true", help="keep every line's bytes (the export re-verifies alone)")
    q.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="verify and write each journal as a Ray task (pinned keys only; trainledger[ray]) on the "
                        "cluster at ADDRESS, or on one started for the call; OUT's folder must be shared by its nodes")
    add_trust_options(q)
    add_partial_option(q)
    add_json_option(q)
    add_progress_option(q)
    q.set_defaults(func=_cmd_export_parquet)

    p = sub.add_parser("demo", help="write a signed journal of a simulated run, then verify and summarise it",
                       description="The torch-free demo: a key pair, a simulated training run written as a signed "
                                   "journal, verification against the pinned public key, and a summary.")
    p.add_argument("out", metavar="OUT_DIR", nargs="?", default=None,
                   help="run folder to create (default: runs/demo-<time>)")
    p.add_argument("--out", dest="out_option", metavar="DIR", default=None,
                   help="deprecated: give OUT_DIR as the argument, as 'ladder' takes it")
    p.add_argument("--steps", type=int, default=2000, help="simulated optimizer steps (default: 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--key", metavar="KEY", default=None,
                   help="sign with this private key (a file outside the run folder, or a pkcs11: URI); default: a new key in "
                        "$TRAINLEDGER_KEY_DIR or ~/.config/trainledger/keys, named after the run folder")
    add_json_option(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("manifest", help="experiment manifests: validate, print the identity, write an example",
                       description="An experiment manifest (TOML, YAML or JSON) freezes what a run is before it "
                                   "starts. Its identity is the SHA-256 of its canonical encoding, the label left "
                                   "out.")
    msub = p.add_subparsers(dest="manifest_command", metavar="ACTION", required=True, help="validate, id or init")
    q = msub.add_parser("validate", help="print every finding; exit 1 if any is an error")
    q.add_argument("file", metavar="FILE", help="the manifest (TOML, YAML or JSON)")
    add_json_option(q)
    q = msub.add_parser("id", help="print the manifest's identity (sha256:...)")
    q.add_argument("file", metavar="FILE", help="the manifest (TOML, YAML or JSON)")
    add_json_option(q)
    q = msub.add_parser("init", help="write an example manifest for the tiny model, with its data files")
    q.add_argument("directory", metavar="DIR", help="the folder to write the manifest and its files into")
    add_json_option(q)
    p.set_defaults(func=_cmd_manifest)

    p = sub.add_parser("preflight", help="run the experiment preflight gates in order, into a signed journal",
                       description="Run the preflight state machine against the tiny model: schema, data lineage, "
                                   "template compatibility (needs --template-check), one-batch smoke test, tiny "
                                   "overfit, save/load inspection, resume equivalence, resource probe, evaluation "
                                   "dry run, authority (needs --approval). Stops at the first gate that does not "
                                   "pass; later gates are recorded as not run. Exit 0 only when ready to train.")
    p.add_argument("manifest", metavar="MANIFEST", help="the experiment manifest (TOML, YAML or JSON)")
    p.add_argument("--data-root", metavar="DIR", help="where the manifest's relative refs point (default: its folder)")
    p.add_argument("--journal", metavar="PATH", help="journal to write (default: preflight-<time>.jsonl beside it)")
    p.add_argument("--key", metavar="KEY",
                   help="private key to sign with, a file or a pkcs11: URI (default: a new key in $TRAINLEDGER_KEY_DIR or "
                        "~/.config/trainledger/keys, one per folder of journals; never beside them)")
    p.add_argument("--template-check", metavar="MODULE:FUNCTION",
                   help="your template/tokenizer/mask check: FUNCTION(manifest, root) -> (ok, detail)")
    p.add_argument("--approval", metavar="FILE", help="a signed approval of this manifest (trainledger approve)")
    p.add_argument("--approvers", metavar="FILE",
                   help="trusted approvers, one 'NAME <public key line>' per line (default: "
                        "$TRAINLEDGER_TRUSTED_APPROVERS); without them the authority gate stays blocked")
    add_json_option(p)
    p.set_defaults(func=_cmd_preflight)

    p = sub.add_parser("approve", help="sign your decision on a manifest (for preflight's authority gate)",
                       description="Write a signed approval (or rejection) of one manifest identity, signed with "
                                   "your own key. preflight --approval checks it against the pinned approvers.")
    p.add_argument("manifest", metavar="MANIFEST", help="the manifest to approve or reject")
    p.add_argument("--key", metavar="KEY", required=True,
                   help="your private key (trainledger keygen; a key file or a pkcs11: URI)")
    p.add_argument("--as", dest="authority", metavar="NAME", required=True,
                   help="the approver name the manifest lists (authority.approvers)")
    p.add_argument("--reject", action="store_true", help="record a rejection instead of an approval")
    p.add_argument("--note", default="", help="a note signed with the decision")
    p.add_argument("-o", "--out", metavar="FILE", help="where to write (default: approval-NAME.json beside it)")
    add_json_option(p)
    p.set_defaults(func=_cmd_approve)


def _cmd_manifest(args: argparse.Namespace) -> int:
    from trainledger.training.experiment.manifest import load_findings, manifest_identity

    if args.manifest_command == "init":
        try:
            from trainledger.training.experiment.loop import write_example
        except ImportError as e:
            raise JournalError(f"manifest init needs the torch extra (it samples the example data): {e}") from None
        path = write_example(args.directory)
        if args.json:
            say(json.dumps({"ok": True, "manifest": str(path)}))
            return 0
        say(f"wrote {path} and its data, tokenizer and template files")
        say(f"$ trainledger manifest validate {path}")
        return 0
    m, findings = load_findings(args.file)
    errors = [f for f in findings if f.severity == "error"]
    if args.manifest_command == "id":
        if m is None:
            if args.json:
                say(json.dumps({"ok": False, "file": args.file, "error": f"not a manifest: {findings[0].path}: "
                                                                         f"{findings[0].message}"}))
            say(f"FAIL  {args.file}: not a manifest: {findings[0].path}: {findings[0].message}", file=sys.stderr)
            return 1
        if args.json:
            say(json.dumps({"ok": True, "file": args.file, "identity": manifest_identity(m), "errors": len(errors)}))
            return 0
        say(manifest_identity(m))
        if errors:
            say(f"note: the manifest has {len(errors)} error finding(s); run trainledger manifest validate",
                  file=sys.stderr)
        return 0
    if args.json:
        say(json.dumps({"file": args.file, "identity": manifest_identity(m) if m is not None else None,
                          "ok": not errors, "findings": [dataclasses.asdict(f) for f in findings]}))
        return 1 if errors else 0
    for f in findings:
        say(f.line())
    ident = manifest_identity(m) if m is not None else "-"
    say(f"{'FAIL' if errors else 'OK'}  {args.file}: {len(errors)} error(s), "
          f"{len(findings) - len(errors)} warning(s); identity {ident}")
    return 1 if errors else 0


def _cmd_preflight(args: argparse.Namespace) -> int:
    import importlib

    try:
        from trainledger.training.experiment.preflight import run_preflight
    except ImportError as e:
        raise JournalError(f"preflight needs the torch extra (pip install 'trainledger[torch]'): {e}") from None
    from trainledger.training.experiment.manifest import load_findings

    from trainledger.training.audit.approval import load_approval, load_trusted_approvers
    from trainledger.journal.keys import load_signer
    from trainledger.journal.writer import Journal

    mpath = Path(args.manifest)
    m, findings = load_findings(mpath)
    if m is None:  # not even typed: nothing can run, and there is no identity to write a journal under
        say(f"FAIL  {mpath}: not a manifest")
        for f in findings:
            say("  " + f.line())
        say("status: experiment-specified-failed-before-training at schema (fix the manifest; "
              "trainledger manifest validate lists every finding)")
        return 1
    # A typed manifest with error findings still runs: its schema gate fails and is recorded, later gates not_run.
    check = None
    if args.template_check:
        mod, _, fn = args.template_check.partition(":")
        try:
            check = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError, ValueError) as e:
            raise UsageError(f"--template-check {args.template_check}: cannot load it: {e}") from None
    approval = load_approval(args.approval) if args.approval else None
    approvers = load_trusted_approvers(args.approvers)
    root = Path(args.data_root) if args.data_root else mpath.parent
    jpath = Path(args.journal) if args.journal else mpath.parent / f"preflight-{time.strftime('%Y%m%dT%H%M%S')}.jsonl"
    priv = None
    if args.key:
        signer, pub = load_signer(args.key), None
    elif (jpath.parent / "preflight.key").exists():  # 0.1.0 wrote it here: kept for that folder's continuity
        priv, pub = jpath.parent / "preflight.key", jpath.parent / "preflight.pub"
        signer = load_signer(priv)
        say(f"trainledger preflight: note: signing with {priv}, a private key inside the folder a reviewer is sent; "
            f"move it out and pass --key", file=sys.stderr)
    else:
        priv, pub = _preflight_key(jpath.parent)
        signer = load_signer(priv)

    def show(r) -> None:
        if not args.json:
            say(f"  {r.gate:<20} {r.status.upper():<8} {r.reason}", flush=True)

    if not args.json:
        say(f"preflight {m.identity} ({m.label or 'no label'}) -> {jpath}")
    with Journal.create(jpath, signer=signer, manifest_id=m.identity, manifest_label=m.label or None,
                        meta={"preflight": True}) as j:
        res = run_preflight(m, root, j, template_check=check, approval=approval, approvers=approvers,
                            progress=show)
    if args.json:
        say(json.dumps({"ok": res.ready, "ready": res.ready, "status": res.status, "manifest": m.identity,
                        "journal": str(jpath), "pubkey": None if pub is None else str(pub),
                        "key": None if priv is None else str(priv),
                        "gates": [{"gate": r.gate, "status": r.status, "reason": r.reason} for r in res.gates]}))
        return 0 if res.ready else 1
    say(f"status: {res.status}")
    if pub is not None:
        say(f"$ trainledger verify {jpath} --pubkey {pub}")
    return 0 if res.ready else 1


def _preflight_key(folder: Path) -> tuple[Path, Path]:
    """The key preflights in ``folder`` sign with: made once in the key home (outside any run folder; the same key
    for every preflight of this folder), its public half copied into the folder as ``preflight.pub``."""
    import hashlib

    from trainledger.journal.keys import key_home

    where = folder.resolve()
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in where.name)[:60] or "folder"
    name = f"preflight-{stem}-{hashlib.sha256(str(where).encode()).hexdigest()[:8]}"
    priv, home_pub = keygen(key_home(), name=name, exist_ok=True)
    pub = folder / "preflight.pub"
    write_atomically(pub, home_pub.read_bytes())
    return priv, pub


def _cmd_approve(args: argparse.Namespace) -> int:
    from trainledger.training.experiment.manifest import load_findings, manifest_identity

    from trainledger.training.audit.approval import sign_approval
    from trainledger.journal.keys import load_signer

    m, findings = load_findings(args.manifest)
    if m is None:
        raise UsageError(f"{args.manifest}: not a manifest: {findings[0].path}: {findings[0].message}")
    if args.authority not in m.authority.approvers:
        raise UsageError(f"{args.authority!r} is not an approver the manifest names "
                         f"({', '.join(m.authority.approvers) or 'none'})")
    a = sign_approval(load_signer(args.key), authority=args.authority, manifest_id=manifest_identity(m),
                      decision="reject" if args.reject else "approve", note=args.note)
    out = Path(args.out) if args.out else Path(args.manifest).with_name(f"approval-{args.authority}.json")
    try:
        write_atomically(out, a.to_json())
    except OSError as e:
        raise UsageError(f"{out}: cannot write: {e.strerror}") from None
    if args.json:
        say(json.dumps({"ok": True, "out": str(out), "decision": a.decision, "manifest": a.manifest_id,
                        "authority": a.authority, "key_id": a.key_id}))
        return 0
    say(f"wrote {out}: {a.decision} of {a.manifest_id} by {a.authority} (key {a.key_id})")
    return 0


def _add_import(isub: Any, source: str, help_: str, dest: str, metavar: str, where: str,
                tags: tuple[str, str] | None = None) -> None:
    """``trainledger import SOURCE``: what to read, the run folder to write, the key; ``tags`` (how the loss is
    named, and what a name is called in that source) adds the options that name the loss, grad-norm and
    learning-rate series."""
    q = isub.add_parser(source, help=help_)
    q.add_argument(dest, metavar=metavar, help=where)
    q.add_argument("out_dir", metavar="OUT_DIR", help="the run folder to write journal.jsonl into")
    q.add_argument("--key", required=True, metavar="KEY",
                   help="the private key that signs the imported journal (a key file or a pkcs11: URI)")
    if tags is not None:
        loss, word = tags
        q.add_argument("--loss-tag", default=None, help=f"{loss} (default: the first of loss, train/loss, ...)")
        q.add_argument("--grad-norm-tag", default=None, help=f"the gradient norm's {word} (default: the first of "
                                                             "grad_norm, train/grad_norm, ...)")
        q.add_argument("--lr-tag", default=None, help=f"the learning rate's {word} (default: the first of lr, "
                                                      "learning_rate, ...)")
    add_json_option(q)
    q.set_defaults(func=_cmd_import)


def _cmd_watch(args: argparse.Namespace) -> int:
    from trainledger.training.watch import watch

    if not 0 < args.interval <= 3600:
        raise UsageError(f"--interval must be a number of seconds in (0, 3600], got {args.interval}")
    if args.timeout is not None and not 0 <= args.timeout < float("inf"):
        raise UsageError(f"--timeout must be a finite number of seconds, got {args.timeout}")
    return watch(args.path, interval=args.interval, timeout=args.timeout, trust=trust_policy(args), json=args.json,
                 wait=args.wait or None)


def _cmd_import(args: argparse.Namespace) -> int:
    from trainledger.training.interop import import_megatron, import_mlflow, import_tensorboard, import_wandb

    signer = load_signer(args.key)
    if args.source in ("tensorboard", "wandb", "mlflow"):
        r = {"tensorboard": import_tensorboard, "wandb": import_wandb, "mlflow": import_mlflow}[args.source](
            args.logdir, args.out_dir, signer, loss_tag=args.loss_tag, grad_norm_tag=args.grad_norm_tag,
            lr_tag=args.lr_tag)
    else:
        r = import_megatron(args.logfile, args.out_dir, signer)
    if args.json:
        say(json.dumps({"ok": True, "journal": str(r.journal), "steps": r.steps, "metrics": r.metrics,
                        "files": r.files, "skipped": [{"line": line, "why": why} for line, why in r.skipped]}))
        return 0
    say(f"IMPORTED {r.steps:,} steps and {r.metrics:,} other values from {r.files} {args.source} file(s) into "
        f"{r.journal} (signed; it attests what the files said now, not that the run happened)")
    unit = {"wandb": "record", "mlflow": "value"}.get(args.source, "line")
    # the first ten, and the last: where a file ends cut off, that is said last, and it must show
    shown = r.skipped[:10] + r.skipped[-1:] if len(r.skipped) > 10 else r.skipped
    for n, (line, why) in enumerate(shown):  # an MLflow reason names its own file and line
        if n == 10 and len(r.skipped) > 11:
            say(f"  ... {len(r.skipped) - 11} more")
        say(f"  skipped {safe(why)}" if args.source == "mlflow" else f"  skipped {unit} {line}: {safe(why)}")
    if r.skipped:
        say(f"  {len(r.skipped)} {unit}(s) skipped in all", file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from trainledger.journal.copies import PrivateCopies
    from trainledger.training.interop import export_tensorboard
    from trainledger.journal.reader import unchecked_batches
    from trainledger.journal.verify import verify_copy

    trust = trust_policy(args)
    if is_run_dir(args.path):
        return _export_run_dir(args, trust)
    refuse_partial(args)
    with PrivateCopies() as copies:
        try:
            rep, copy = verify_copy(args.path, copies, trust)
        except IntegrityError as e:
            return say_failed(args, e, args.path)
        n = export_tensorboard((e for b in unchecked_batches(copy, rep.trusted_bytes) for e in b), args.logdir,
                               run_id=rep.run_id or "run")
    if args.json:
        say(json.dumps({"ok": True, "scalars": n, "run_id": rep.run_id, "logdir": args.logdir}))
        return 0
    say(f"wrote {n:,} scalars of {rep.run_id} to {args.logdir} (TensorBoard event file; the journal stays the record)")
    return 0


def _progress_line(label: str) -> Callable[[str], None]:
    """A progress line rewritten in place on stderr (a terminal's), then ended by the command's own output."""
    def show(text: str) -> None:
        sys.stderr.write(f"\r{label}: {text}\x1b[K")
        sys.stderr.flush()

    return show


def _cmd_export_parquet(args: argparse.Namespace) -> int:
    from trainledger.journal.views.parquet import export_parquet

    trust = trust_policy(args)
    shown = args.paths[0] if len(args.paths) == 1 else f"{len(args.paths)} paths"
    try:
        tty = sys.stderr.isatty() and not args.no_progress and not args.json
        try:
            rep = export_parquet(args.paths, args.out, lines=args.lines, trust=trust, partial=args.partial,
                                 ray=(args.ray or True) if args.ray is not None else None,
                                 progress=_progress_line("export parquet") if tty else None)
        finally:
            if tty:
                sys.stderr.write("\r\x1b[K")  # the progress line cleared, whatever follows
    except IntegrityError as e:
        return say_failed(args, e, getattr(e, "path", None) or shown)
    if args.json:
        say(json.dumps(rep.to_dict()))
        return 0
    for folder, ranks in rep.missing.items():
        say(f"PARTIAL: {folder} lacks rank(s) {', '.join(map(str, ranks))}; the export holds the ranks present")
    say(f"wrote {rep.events:,} events of {rep.journals} journal(s) to {rep.out}: {rep.files} Parquet files, "
        f"{rep.bytes / 2**20:,.1f} MiB, in {rep.seconds:.1f} s ({rep.events / max(rep.seconds, 1e-9):,.0f} events/s)")
    say("  each line's bytes kept: 'trainledger verify OUT' re-verifies it alone" if rep.lines else
        "  typed columns only (no --lines): as trustworthy as whoever exported it; 'verify' cannot check its rows")
    return 0


def _export_run_dir(args: argparse.Namespace, trust: Any) -> int:
    """A run folder, checked whole (or, with --partial, as far as its ranks go), one TensorBoard run per rank. Each
    rank is exported from a private copy whose head must be the one the folder's check saw."""
    from trainledger.journal.audit.rundir import rank_files, verify_run_dir
    from trainledger.journal.copies import PrivateCopies
    from trainledger.journal.reader import unchecked_batches
    from trainledger.journal.verify import verify_copy
    from trainledger.training.interop import export_tensorboard

    try:
        whole = verify_run_dir(args.path, trust=trust, partial=args.partial)
        if whole.partial:
            say(partial_line(args.path, whole.missing))
        n = 0
        for r, f in rank_files(args.path).items():
            with PrivateCopies() as copies:
                rep, copy = verify_copy(f, copies, trust)
                if (rep.last_seq, rep.last_hash) != (whole.ranks[r].last_seq, whole.ranks[r].last_hash):
                    raise AnchorMismatch(f"rank {r}: its journal changed while the folder was being exported")
                n += export_tensorboard((e for b in unchecked_batches(copy, rep.trusted_bytes) for e in b),
                                        Path(args.logdir) / f"rank-{r:05d}", run_id=rep.run_id or f"rank-{r}")
    except IntegrityError as e:
        return say_failed(args, e, args.path)
    if args.json:
        say(json.dumps({"ok": True, "scalars": n, "ranks": len(whole.ranks), "partial": whole.partial,
                        "missing": whole.missing, "logdir": args.logdir}))
        return 0
    say(f"wrote {n:,} scalars of {len(whole.ranks)} rank(s){' (PARTIAL)' if whole.partial else ''} to "
        f"{args.logdir}/rank-NNNNN (TensorBoard event files; the journals stay the record)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from trainledger.training.demo import run_demo

    if args.steps < 1:
        raise JournalError(f"--steps must be at least 1, got {args.steps}")
    if args.out_option is not None:
        if args.out is not None:
            raise UsageError(f"two run folders: {args.out} and --out {args.out_option}; give one (as OUT_DIR)")
        say(f"trainledger demo: --out is deprecated; give the run folder as the argument: trainledger demo "
            f"{args.out_option}", file=sys.stderr)
        args.out = args.out_option
    from trainledger.journal.keys import run_key

    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-%Y%m%dT%H%M%S")
    if (out / "journal.jsonl").exists():  # before a key is made for it
        raise UsageError(f"{out}/journal.jsonl already exists; choose another OUT_DIR")
    priv, _ = run_key(out, Path(args.key) if args.key else None)  # said below: where the private key went
    journal_path, pub = run_demo(out, steps=args.steps, seed=args.seed, key=Path(priv) if isinstance(priv, Path)
                                 else priv)
    r = verify(journal_path, keys=trusted_keys([str(pub)]), require_closed=True)
    if args.json:
        say(json.dumps({"ok": True, "journal": str(journal_path), "pubkey": str(pub), "key": str(priv),
                        "verify": r.to_dict()}))
        return 0
    say(f"wrote {journal_path} (public key {pub}; signed with {priv}, kept outside the run folder)")
    say(f"$ trainledger verify {journal_path} --pubkey {pub} --require-closed")
    print_report(r, title="OK  ")
    return 0
