"""The proof commands : ``checkpoint``, ``prove``, ``verify-proof``, ``consistency``, ``witness``; and
``verify --expect-checkpoint``'s reading of a published checkpoint. The work is in :mod:`.checkpoint`, :mod:`.index`, :mod:`.bundle` and :mod:`.witness`."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, JournalError, UsageError
from trainledger.journal.keys import read_small_file
from trainledger.journal.merkle import ProofError
from trainledger.journal.note import NoteError

#: What a proof, a note or a journal that does not hold raises: exit 1, one line.
FAILS = (IntegrityError, ProofError, NoteError)

__all__ = ["register", "expected_checkpoint", "add_witness_options", "FAILS"]

_MAX_NOTE = 1 << 20


def add_policy_options(p: argparse.ArgumentParser, what: str) -> None:
    """``--policy FILE`` and ``--log-proof FILE``: whether ``what`` is published in the team log (docs/publishing.md)."""
    p.add_argument("--policy", metavar="FILE", default=None,
                   help=f"a C2SP tlog-policy file: also fail unless {what} is published: its checkpoint an entry of "
                        "the team log under a checkpoint the policy's quorum cosigned (docs/publishing.md)")
    p.add_argument("--log-proof", metavar="FILE", default=None,
                   help="with --policy: the proof of logging ('trainledger log prove'; a .tlog-proof)")


def published_line(proof: str | None, keys: Any, policy_file: str, origin: str, size: int, head: str,
                   subject: str, default: Path | None = None) -> tuple[bool, str]:
    """(published, the line to print) for a run checkpoint held to a proof of logging under a policy."""
    from trainledger.journal.proofs.policy import read_policy
    from trainledger.journal.statements.publish.orglog import check_checkpoint_published

    path = Path(proof) if proof is not None else default
    if path is None:
        raise UsageError("--policy needs --log-proof FILE, the checkpoint's proof of logging ('trainledger log prove')")
    r = check_checkpoint_published(path, keys, read_policy(policy_file), origin, size, head, subject)
    return r.ok, f"{'PUBLISHED' if r.ok else 'NOT PUBLISHED'}  {subject}: {r.detail}"


def add_witness_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("witnesses")
    g.add_argument("--witness-key", action="append", default=[], metavar="VKEY",
                   help="a pinned witness's verifier key (name+hash+base64 of type 0x04), or a file of them "
                        "(repeatable)")
    g.add_argument("--witness-quorum", type=int, default=None, metavar="K",
                   help="a checkpoint counts as published only with K valid cosignatures from pinned witnesses "
                        "(default: 1 when a witness key is given)")


def _quorum(args: argparse.Namespace) -> tuple[list, int]:
    from trainledger.journal.proofs.witness import parse_witness_keys

    witnesses = parse_witness_keys(args.witness_key)
    k = args.witness_quorum if args.witness_quorum is not None else (1 if witnesses else 0)
    if k < 0 or k > len(witnesses):
        raise UsageError(f"--witness-quorum {k}: between 0 and the {len(witnesses)} witness key(s) given")
    return witnesses, k


def expected_checkpoint(args: argparse.Namespace, keys: Any = None) -> Any:
    """``verify --expect-checkpoint NOTE``: the note opened under a pinned key (or, with --trust-embedded, the
    journal's own), with the witness quorum checked; None when not asked. ``keys``: the keys to open it under instead
    (an export's: the policy's, with no journal of its own to embed one)."""
    if not args.expect_checkpoint:
        if args.witness_key or args.witness_quorum:
            raise UsageError("--witness-key and --witness-quorum apply to a published checkpoint: give "
                             "--expect-checkpoint NOTE")
        return None
    from trainledger.journal.keys import PublicKey, trusted_keys
    from trainledger.journal.note import NoteError, check_cosignatures
    from trainledger.journal.proofs.checkpoint import open_checkpoint
    from trainledger.journal.verify import open_checked, read_opening

    note = read_small_file(Path(args.expect_checkpoint), "checkpoint note", limit=_MAX_NOTE).decode("utf-8",
                                                                                                "replace")
    if keys is not None:
        keys = list(keys)
    elif not (keys := trusted_keys(args.pubkey)) and args.trust_embedded:
        opened, _ = read_opening(Path(args.path), open_checked(Path(args.path)))
        if opened.public_key:
            keys = [PublicKey(base64.b64decode(opened.public_key), source="the journal (embedded)")]
    cp, _ = open_checkpoint(note, None, keys)
    witnesses, k = _quorum(args)
    got = check_cosignatures(note, witnesses) if witnesses else []
    if len(got) < k:
        raise NoteError(f"{args.expect_checkpoint}: {len(got)} valid cosignature(s) from pinned witnesses, fewer "
                        f"than the quorum of {k}: the checkpoint is not published")
    return cp


def register(sub) -> None:
    from trainledger.cli.options import EPILOG, add_json_option, add_progress_option, add_pubkey_option, add_trust_options

    journal_help = "the journal (or, with --rank, a distributed run's folder)"

    p = sub.add_parser("tree-head", aliases=["checkpoint"],
                       help="print the latest seal as a signed tree head (a C2SP checkpoint note), to publish",
                       description="Verify the journal (format 1.3), then print its latest seal as a signed tree "
                                   "head, a C2SP checkpoint note: origin trainledger/<run id>, tree size, base64 "
                                   "root, the chain head, and the signature line. Publish it, or have witnesses "
                                   "cosign it; 'verify --expect-checkpoint' later shows the journal only grew. "
                                   "(Its old name, 'checkpoint', still works, with a deprecation line: every other "
                                   "checkpoint in trainledger is training state.)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="JOURNAL", help="the journal, or a run folder holding one")
    add_trust_options(p)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_checkpoint)

    p = sub.add_parser("prove", help="write a bundle proving chosen lines against a signed checkpoint",
                       description="Write a self-contained proof bundle (JSON): the chosen lines, each with its "
                                   "RFC 9162 inclusion proof against the latest seal's signed checkpoint (or the "
                                   "seal --tree-size names). Builds or extends a tree index beside the journal "
                                   "(JOURNAL.tlindex) the first time; checked against the journal, never trusted.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="JOURNAL", help=journal_help)
    p.add_argument("--seq", type=int, action="append", default=[], help="a line to prove (repeatable)")
    p.add_argument("--checkpoint", metavar="STEP", help="prove the checkpoint_saved of this step ('latest': the "
                                                        "last one)")
    p.add_argument("--gate", metavar="RUNG", help="prove the rung's gate_verdict, its decision_recorded and the "
                                                  "events the decision cites as evidence")
    p.add_argument("--compute", action="store_true", help="prove the run's training compute: the last "
                                                          "compute_totaled, the run_configured before it and "
                                                          "every line from the total to run_closed (the total "
                                                          "shown to be the last)")
    p.add_argument("--tree-size", type=int, default=None, metavar="N",
                   help="prove against the seal at seq N (its tree of N lines) instead of the latest")
    p.add_argument("--index", metavar="FILE", default=None, help="the tree index (default: JOURNAL.tlindex)")
    p.add_argument("-o", "--out", metavar="BUNDLE", required=True, help="the bundle file to write")
    p.add_argument("--cose", metavar="DIR", nargs="?", const="", default=None,
                   help="also write, into DIR (default: BUNDLE's name with .cose), each line's RFC 9942 COSE receipt "
                        "(line-SEQ.receipt.cose) and the checkpoint as a COSE_Sign1 statement (checkpoint.cose), "
                        "signed with --cose-key (docs/cose.md)")
    p.add_argument("--cose-key", metavar="KEY", default=None,
                   help="the key that signs them: the run's Ed25519 key file (EdDSA) or a P-256 PEM, a release "
                        "key (ES256)")
    _add_rank_option(p)
    add_trust_options(p)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_prove)

    p = sub.add_parser("verify-proof", help="check a proof bundle offline, without the journal",
                       description="Check a bundle from 'prove' or 'consistency': the checkpoint's signature under "
                                   "a pinned key, every line's inclusion proof, the consistency proof, and the "
                                   "witnesses' cosignatures. Exit 0 holds, 1 does not, 2 usage or I/O error.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle written by 'trainledger prove' or 'consistency'")
    add_pubkey_option(p)
    p.add_argument("--expect-checkpoint", metavar="NOTE", default=None,
                   help="a consistency bundle must run from this checkpoint (published earlier)")
    add_witness_options(p)
    add_policy_options(p, "the bundle's checkpoint")
    add_json_option(p)
    p.set_defaults(func=_cmd_verify_proof)

    p = sub.add_parser("consistency", help="prove that the journal extends its checkpoint of an earlier size",
                       description="Write a bundle holding the latest signed checkpoint and the RFC 9162 "
                                   "consistency proof from the tree of the first SIZE lines (a checkpoint "
                                   "published earlier): what a third party or a witness checks.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="JOURNAL", help=journal_help)
    p.add_argument("--from", dest="from_size", type=int, required=True, metavar="SIZE",
                   help="the earlier checkpoint's tree size")
    p.add_argument("--tree-size", type=int, default=None, metavar="N", help="to the seal at seq N, not the latest")
    p.add_argument("--index", metavar="FILE", default=None, help="the tree index (default: JOURNAL.tlindex)")
    p.add_argument("-o", "--out", metavar="BUNDLE", default=None, help="write the bundle here (default: stdout)")
    _add_rank_option(p)
    add_trust_options(p)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_consistency)

    p = sub.add_parser("witness", help="cosign checkpoints that only ever grow (C2SP tlog-cosignature)",
                       description="A witness keeps, per origin, the last checkpoint it cosigned, and cosigns a "
                                   "new one only with a valid consistency proof from it: a rollback or a fork is "
                                   "refused and named (exit 1).")
    wsub = p.add_subparsers(dest="witness_command", metavar="ACTION", help="vkey, cosign or serve")
    q = wsub.add_parser("vkey", help="print the witness's verifier key (what verifiers pin with --witness-key)")
    q.add_argument("--key", required=True, metavar="KEY", help="the witness's private key (trainledger keygen), or a "
                                                             "pkcs11: or awskms:// URI (docs/keys.md)")
    q.add_argument("--name", required=True, help="the witness's name (no spaces or '+')")
    q.add_argument("--ml-dsa", action="store_true",
                   help="also print the ML-DSA-44 key 'witness serve --ml-dsa' cosigns with (derived from --key)")
    add_json_option(q)
    q.set_defaults(func=_cmd_witness_vkey)
    q = wsub.add_parser("cosign", help="check a bundle's checkpoint and print it with this witness's cosignature")
    q.add_argument("bundle", metavar="BUNDLE", help="from 'trainledger consistency --from <last cosigned size>' "
                                                   "(any bundle for an origin's first checkpoint)")
    q.add_argument("--key", required=True, metavar="KEY", help="the witness's private key: a key file, or a pkcs11: or "
                                                             "awskms:// URI (docs/keys.md)")
    q.add_argument("--name", required=True, help="the witness's name")
    q.add_argument("--state", required=True, metavar="FILE", help="the witness's state (created if absent)")
    q.add_argument("--log-key", action="append", default=[], metavar="FILE", required=True,
                   help="a log (run) public key this witness accepts checkpoints from (repeatable)")
    q.add_argument("-o", "--out", metavar="FILE", default=None,
                   help="write the bundle with the cosignature added to its checkpoint (default: print the note)")
    add_json_option(q)
    q.set_defaults(func=_cmd_witness_cosign)
    from trainledger.cli.options import usage
    from trainledger.cli.publish import register_witness_serve

    register_witness_serve(wsub)
    p.set_defaults(func=lambda args: usage(p))


def _write_out(path: str, data: bytes) -> None:
    from trainledger.cli.options import write_out

    write_out(path, data)


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from trainledger.cli.options import verify_from_args, say
    from trainledger.journal.keys import PublicKey, trusted_keys
    from trainledger.journal.proofs.checkpoint import report_note
    from trainledger.journal.chain import origin
    from trainledger.journal.note import verifier_key

    from trainledger.cli.options import say_failed

    if getattr(args, "command", None) == "checkpoint":
        say("trainledger checkpoint is deprecated and goes away in 0.3: use trainledger tree-head (the same output)",
            file=sys.stderr)
    args.allow_unsealed = True
    try:
        r = verify_from_args(args)
    except IntegrityError as e:
        return say_failed(args, e, args.path, file=sys.stderr)
    if r.head is None:
        raise JournalError(f"{args.path}: no seal yet: nothing to publish")
    pinned = [k for k in trusted_keys(args.pubkey) if k.key_id == r.key_id]
    if pinned:
        pub = pinned[0]
    else:
        from trainledger.journal.verify import open_checked, read_opening

        opened, _ = read_opening(Path(args.path), open_checked(Path(args.path)))
        pub = PublicKey(base64.b64decode(opened.public_key), source="embedded")
    note = report_note(r, pub)
    if args.json:
        say(json.dumps({"ok": True, "note": note, "origin": origin(r.run_id), "tree_size": r.last_sealed_seq + 1,
                        "root": base64.b64encode(bytes.fromhex(r.last_tree_root)).decode(), "head": r.head,
                        "vkey": verifier_key(origin(r.run_id), pub.raw), "unsealed_events": r.unsealed_events}))
    else:
        sys.stdout.write(note)
    return 0


def _helpers(args: argparse.Namespace):
    """The ``select`` callable for prove's helpers: which seqs the --checkpoint/--gate/--compute questions name."""
    kinds = ((["checkpoint_saved"] if args.checkpoint is not None else [])
             + (["gate_verdict", "decision_recorded"] if args.gate is not None else [])
             + (["compute_totaled", "run_configured", "run_closed"] if args.compute else []))
    if not kinds:
        return None
    from trainledger.journal import codec
    from trainledger.journal.proofs.index import find_lines

    def records(path: Path, n: int, pred, prefixes: list[bytes]) -> list[Any]:
        """The lines that match, decoded, among the first ``n`` (what a line says is proven afterwards, or the proof
        fails: a line that does not decode is passed over)."""
        out = []
        for line in find_lines(path, path.stat().st_size, pred, prefixes):
            try:
                rec = codec.decode_line(line)
            except IntegrityError:
                continue
            if rec.seq < n:
                out.append(rec)
        return sorted(out, key=lambda r: r.seq)

    def select(path: Path, n: int) -> list[int]:
        by_kind: dict[str, list[Any]] = {k: [] for k in kinds}
        for rec in records(path, n, lambda line: True, [b'{"kind":"%s",' % k.encode() for k in kinds]):  # one pass
            by_kind[type(rec).__struct_config__.tag].append(rec)
        seqs: list[int] = []
        if args.checkpoint is not None:
            saved = by_kind["checkpoint_saved"]
            which = "" if args.checkpoint == "latest" else f" of step {args.checkpoint}"
            if args.checkpoint != "latest":
                try:
                    want = int(args.checkpoint)
                except ValueError:
                    raise UsageError(f"--checkpoint {args.checkpoint!r}: a step number or 'latest'") from None
                saved = [c for c in saved if c.step == want]
            if not saved:
                raise UsageError(f"no checkpoint_saved{which} among the {n:,} lines the checkpoint covers")
            seqs.append(saved[-1].seq)
        if args.gate is not None:
            verdicts = [v for v in by_kind["gate_verdict"] if v.rung == args.gate]
            if not verdicts:
                raise UsageError(f"no gate_verdict for rung {args.gate!r} among the {n:,} lines the checkpoint covers")
            seqs.append(verdicts[-1].seq)
            decisions = [d for d in by_kind["decision_recorded"] if d.rung == args.gate]
            if decisions:
                d = decisions[-1]
                seqs.append(d.seq)
                wanted = {h for h in d.evidence if isinstance(h, str) and len(h) == 64}
                if wanted:  # a second pass: the events whose chain hashes the decision cites
                    cited = records(path, n, lambda line: line[-66:-2].decode("ascii", "replace") in wanted,
                                    [b'{"kind":'])
                    seqs += [r.seq for r in cited if r.seq not in seqs]
        if args.compute:
            totals = by_kind["compute_totaled"]
            if not totals:
                raise UsageError(f"no compute_totaled among the {n:,} lines the checkpoint covers (written when a "
                                 "format 1.3 run ends)")
            t = totals[-1]
            configs = [c for c in by_kind["run_configured"] if c.seq < t.seq]
            if configs:
                seqs.append(configs[-1].seq)
            seqs.append(t.seq)
            from trainledger.journal.proofs.bundle import closing_seqs

            closed = by_kind["run_closed"]
            seqs += [s for s in closing_seqs(t.seq, closed[-1].seq if closed else None) if s != t.seq]
        return seqs

    return select


def _add_rank_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rank", type=int, default=None, metavar="N",
                   help="JOURNAL is a distributed run's folder: prove rank N's lines, after checking the folder "
                        "whole (as verify RUN_DIR does)")


def _journal_of(args: argparse.Namespace, trust: Any) -> str:
    """The journal a proof command reads: ``args.path``, or with a run folder its rank ``--rank``'s journal once
    the folder checks out whole (a missing, foreign or truncated rank fails, as ``verify RUN_DIR`` fails it)."""
    from trainledger.journal.audit.rundir import is_run_dir, rank_files, verify_run_dir

    if not is_run_dir(args.path):
        if args.rank is not None:
            raise UsageError(f"{args.path}: --rank picks a rank of a run folder, and this is one journal")
        return args.path
    files = rank_files(args.path)
    if args.rank is None:
        raise UsageError(f"{args.path}: a run folder; name the rank whose journal to prove from with --rank N")
    if args.rank not in files:
        raise UsageError(f"{args.path}: no journal of rank {args.rank} (rank-{args.rank:05d}.jsonl) in this folder")
    verify_run_dir(args.path, trust=trust)
    return str(files[args.rank])


def _cmd_prove(args: argparse.Namespace) -> int:
    from trainledger.cli.options import progress_for, say, trust_policy
    from trainledger.journal.proofs.bundle import prove

    trust = trust_policy(args)
    path = _journal_of(args, trust)
    progress = progress_for(args, "indexing")
    try:
        res = prove(path, args.seq, trust=trust,
                    tree_size=args.tree_size, index=args.index, select=_helpers(args), progress=progress)
    finally:
        if progress is not None:
            progress.close()
    for note in res.notes:
        say(f"trainledger prove: note: {note}", file=sys.stderr)
    _write_out(args.out, (json.dumps(res.bundle, indent=1) + "\n").encode())
    b = res.bundle
    if args.cose is not None:
        _write_cose(args, b)
    size = b["checkpoint"].split("\n")[1]
    if args.json:
        say(json.dumps({"ok": True, "out": args.out, "run_id": b["run_id"], "tree_size": int(size),
                        "seqs": [e["seq"] for e in b["entries"]], "index_built": res.index_built,
                        "notes": list(res.notes)}))
        return 0
    say(f"wrote {args.out}: {len(b['entries'])} line(s) of run {b['run_id']} proven against its signed checkpoint "
        f"of {int(size):,} lines ({max((len(e['proof']) for e in b['entries']), default=0)} hashes at most per proof)")
    if res.index_built:
        say("trainledger prove: " + ("built the tree index" if res.index_saved else
                                     "built the tree index in memory (could not write it beside the journal)"),
            file=sys.stderr)
    return 0


def _write_cose(args: argparse.Namespace, b: dict) -> None:
    from trainledger.cli.options import say
    from trainledger.journal.note import parse_checkpoint
    from trainledger.journal.proofs.cose import load_key, receipt, statement

    if args.cose_key is None:
        raise UsageError("--cose needs --cose-key KEY (the key the receipts are signed with)")
    signer = load_key(args.cose_key)
    note = b["checkpoint"]
    cp = parse_checkpoint(note[:note.rfind("\n\n") + 1])
    out = Path(args.cose) if args.cose else Path(args.out).with_suffix(".cose")
    out.mkdir(parents=True, exist_ok=True)
    for e in b["entries"]:
        path = [base64.b64decode(h) for h in e["proof"]]
        _write_out(str(out / f"line-{e['seq']}.receipt.cose"), receipt(e["seq"], cp.size, path, cp.root, signer))
    _write_out(str(out / "checkpoint.cose"), statement(note, signer))
    say(f"wrote {len(b['entries'])} COSE receipt(s) and checkpoint.cose into {out}", file=sys.stderr)


def _cmd_consistency(args: argparse.Namespace) -> int:
    from trainledger.cli.options import progress_for, say, trust_policy
    from trainledger.journal.proofs.bundle import consistency

    trust = trust_policy(args)
    path = _journal_of(args, trust)
    progress = progress_for(args, "indexing")
    try:
        res = consistency(path, args.from_size, trust=trust,
                          tree_size=args.tree_size, index=args.index, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    for note in res.notes:
        say(f"trainledger consistency: note: {note}", file=sys.stderr)
    data = (json.dumps(res.bundle, indent=1) + "\n").encode()
    if args.json:
        c = res.bundle["consistency"]
        if args.out:
            _write_out(args.out, data)
        say(json.dumps({"ok": True, "out": args.out, "from_size": c["from_size"],
                        "tree_size": int(res.bundle["checkpoint"].split("\n")[1]), "hashes": len(c["proof"]),
                        "notes": list(res.notes), **({} if args.out else {"bundle": res.bundle})}))
        return 0
    if args.out:
        _write_out(args.out, data)
        c = res.bundle["consistency"]
        say(f"wrote {args.out}: consistency from {c['from_size']:,} lines to the signed checkpoint of "
            f"{int(res.bundle['checkpoint'].split(chr(10))[1]):,} ({len(c['proof'])} hashes)")
    else:
        sys.stdout.write(data.decode())
    return 0


#: Documents made of proof bundles that ``verify-proof`` also checks, registered by the package that defines them
#: (src/trainledger/cli/compute.py: the compute statement): (recognise(data), the most bytes it may have, check(args,
#: data, keys, fails) -> exit code)
DOCUMENT_CHECKERS: list[tuple[Any, int, Any]] = []


def _cmd_verify_proof(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import trusted_keys
    from trainledger.journal.proofs.bundle import MAX_BUNDLE_BYTES, verify_bundle

    keys = trusted_keys(args.pubkey)
    data = read_small_file(Path(args.bundle), "proof bundle", limit=max([MAX_BUNDLE_BYTES] + [
        limit for _, limit, _ in DOCUMENT_CHECKERS]))
    for recognise, limit, check in DOCUMENT_CHECKERS:  # a document of proofs another package defines
        if recognise(data):
            return check(args, data, keys, FAILS)
    witnesses, k = _quorum(args)
    if _looks_like_journal(data):
        from trainledger.journal.errors import UsageError

        raise UsageError(f"{args.bundle}: a journal, not a proof bundle; make one with 'trainledger prove "
                         f"{args.bundle} --seq N --out BUNDLE.json', or check the journal with 'trainledger verify'")
    note = None
    if args.expect_checkpoint:
        note = read_small_file(Path(args.expect_checkpoint), "checkpoint note", limit=_MAX_NOTE).decode("utf-8",
                                                                                                "replace")
    try:
        r = verify_bundle(data, keys, witnesses=witnesses, quorum=k, expect_checkpoint=note)
    except FAILS as e:
        return say_proof_failed(args, e)
    published, line = True, None
    if args.policy is not None:
        from trainledger.journal.chain import origin

        published, line = published_line(args.log_proof, keys, args.policy, origin(r.run_id), r.tree_size, r.head,
                                          args.bundle)
    elif args.log_proof is not None:
        raise UsageError("--log-proof goes with --policy (the policy says which log and witnesses to trust)")
    if args.json:
        d = r.to_dict()
        if line is not None:
            d = {**d, "ok": d.get("ok", True) and published, "published": published, "publication": line}
        say(json.dumps(d))
        return 0 if published else 1
    say(f"OK    {args.bundle}: run {r.run_id}, key {r.key_id} (pinned), signed checkpoint of {r.tree_size:,} lines "
        f"(head {r.head[:32]}...)")
    for ev in r.events:
        say(f"  seq {ev.seq:<10} {_describe(ev)}")
    if r.consistent_from is not None:
        say(f"  consistent: the tree of its first {r.consistent_from:,} lines is a prefix of this checkpoint")
    for name, ts in r.witnesses:
        say(f"  cosigned by {name} at {ts}")
    if k:
        say(f"  published: {len(r.witnesses)} of the quorum of {k} witness cosignature(s)")
    if line is not None:
        say(line)
    return 0 if published else 1


def say_proof_failed(args: argparse.Namespace, e: Exception) -> int:
    """``verify-proof``'s failure: one JSON object with ``--json``, else one ``FAIL`` line; exit code 1."""
    from trainledger.cli.options import say

    if args.json:
        say(json.dumps({"ok": False, "path": args.bundle, "error": str(e)}))
    else:
        say(f"FAIL  {args.bundle}: {e}")
    return 1


def _looks_like_journal(data: bytes) -> bool:
    """Whether ``data`` opens like a journal (a JSON line with a seq and a kind) rather than a bundle (one JSON
    object with a format)."""
    first = data.split(b"\n", 1)[0]
    if not first.lstrip().startswith(b"{"):
        return False  # a journal's line is an object; anything else (a nested array bomb) is the bundle reader's
    try:
        head = json.loads(first)
    except (ValueError, RecursionError):  # deeply nested: not a journal line, and verify_bundle names it
        return False
    return isinstance(head, dict) and "seq" in head and "kind" in head and "format" not in head


def _describe(ev: Any) -> str:
    """One line about a proven event: its kind and its fields (shortened)."""
    import msgspec

    d = msgspec.to_builtins(ev)
    kind = d.pop("kind", "?")
    for f in ("seq", "ts", "h"):
        d.pop(f, None)
    text = json.dumps(d, sort_keys=False)
    return f"{kind:<20} {text[:160]}{'...' if len(text) > 160 else ''}"


def _cmd_witness_vkey(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import load_signer
    from trainledger.journal.note import cosigner_key

    s = load_signer(args.key)
    vkey = cosigner_key(args.name, s.public.raw)
    if getattr(args, "ml_dsa", False):
        from trainledger.journal.statements.publish.witness_http import mldsa_key

        pq = cosigner_key(args.name, mldsa_key(s).public_key().public_bytes_raw())
        if args.json:
            say(json.dumps({"ok": True, "name": args.name, "vkey": vkey, "ml_dsa_vkey": pq}))
        else:
            say(vkey)
            say(pq)
        return 0
    say(json.dumps({"ok": True, "name": args.name, "vkey": vkey}) if args.json else vkey)
    return 0


def _cmd_witness_cosign(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import load_public_key, load_signer
    from trainledger.journal.proofs.bundle import MAX_BUNDLE_BYTES
    from trainledger.journal.proofs.witness import Witness

    s = load_signer(args.key)
    w = Witness(args.state, args.name, s)
    data = read_small_file(Path(args.bundle), "proof bundle", limit=MAX_BUNDLE_BYTES)
    try:
        line, note = w.add(data, [load_public_key(k) for k in args.log_key])
    except FAILS as e:
        say(json.dumps({"ok": False, "path": args.bundle, "refused": True, "error": str(e)}) if args.json
            else f"REFUSED  {args.bundle}: {e}")
        return 1
    if args.out:
        b = json.loads(data)
        b["checkpoint"] = note
        _write_out(args.out, (json.dumps(b, indent=1) + "\n").encode())
    if args.json:
        say(json.dumps({"ok": True, "out": args.out, "name": args.name, "cosignature": line,
                        **({} if args.out else {"note": note})}))
    elif args.out:
        say(f"wrote {args.out}: the checkpoint with {args.name}'s cosignature")
    else:
        sys.stdout.write(note)
    return 0
