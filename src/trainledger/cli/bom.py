"""``trainledger bom`` and ``trainledger verify-bom``: documents others read about a model (CycloneDX, SPDX 3, a
Hugging Face model card, an in-toto evaluation-result statement), every figure a proven journal line
(journal/statements/bom, docs/bom.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub) -> None:
    """Add ``bom`` and ``verify-bom``."""
    from trainledger.cli.options import EPILOG, add_json_option, add_pubkey_option
    from trainledger.journal.statements.bom.formats import FORMATS

    p = sub.add_parser("bom", help="write a document about a model (CycloneDX, SPDX 3, HF card, in-toto eval) whose "
                                   "every figure is a proven journal line",
                       description="Verify and replay the model's runs (in lifecycle order: pre-training first, the run "
                                   "that made the model last) and write one document about the model, built from their "
                                   "signed events alone: a CycloneDX 1.6 ML-BOM, an SPDX 3.0.1 AI package, a Hugging "
                                   "Face model card (README.md) or an in-toto evaluation-result statement. Beside it, "
                                   "FILE.proof.json holds an inclusion proof of every line a figure rests on; "
                                   "'trainledger verify-bom FILE' checks the document against it offline. A run that "
                                   "does not verify, or that replay disagrees with, is refused. docs/bom.md.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="RUN", help="a run folder or journal of the model (several: its runs, "
                                                           "in lifecycle order)")
    add_pubkey_option(p)
    p.add_argument("--key", metavar="KEY",
                   help="the key that issues the document (the run's private key, a release team's, or a pkcs11: "
                        "URI): its digest is sealed as document_issued into the model's run's documents journal "
                        "(JOURNAL.documents.jsonl beside it). Default: the private key of a pinned key in "
                        "$TRAINLEDGER_KEY_DIR or ~/.config/trainledger/keys (where the run that wrote it keeps it); "
                        "none there: the document is written, not issued, and bom says so")
    p.add_argument("--format", required=True, choices=FORMATS, help="the document to write")
    p.add_argument("-o", "--out", required=True, metavar="FILE",
                   help="the document (its proof pack goes beside it, FILE.proof.json)")
    add_json_option(p)
    p.set_defaults(func=_cmd_bom)

    p = sub.add_parser("verify-bom", help="check a document 'trainledger bom' wrote against its proofs, offline",
                       description="Check DOC against its proof pack (DOC.proof.json, or --proof) under the pinned "
                                   "keys, without the journals: every proof holds, the figures are collected again "
                                   "from the proven lines, and the document built from them is the one given; the "
                                   "first field that differs is named. Torch-free. Exit 0 intact, 1 a figure its proof "
                                   "does not carry (or a proof that does not hold), 2 usage or I/O error.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("document", metavar="DOC", help="the document (a CycloneDX or SPDX JSON file, a model card, an "
                                                   "in-toto statement)")
    p.add_argument("--proof", metavar="FILE", help="its proof pack (default: DOC.proof.json beside it)")
    p.add_argument("--require-issued", action="store_true",
                   help="exit 1 unless a pinned key issued the document (its document_issued proven); without it, a "
                        "document whose every figure holds but that no pinned key issued passes with a NOT ISSUED "
                        "line")
    add_pubkey_option(p)
    add_json_option(p)
    p.set_defaults(func=_cmd_verify_bom)


def _cmd_bom(args: argparse.Namespace) -> int:
    from trainledger.audit import replay, replay_run_dir
    from trainledger.cli.options import say, write_out
    from trainledger.journal import __version__
    from trainledger.journal.keys import find_key, load_signer, trusted_keys
    from trainledger.journal.statements.bom.document import make, pack_path

    keys = trusted_keys(args.pubkey)
    progress = (lambda what: print(f"trainledger bom: {what}", file=sys.stderr, flush=True)) \
        if sys.stderr.isatty() else None
    found = find_key(keys) if args.key is None else None
    issuer = load_signer(args.key) if args.key is not None else (load_signer(found) if found is not None else None)
    doc, pack = make(args.paths, keys, args.format, replay=replay, replay_run_dir=replay_run_dir,
                     version=__version__, issuer=issuer, name=Path(args.out).name, progress=progress)
    proof = pack_path(args.out)
    write_out(str(proof), (json.dumps(pack, separators=(",", ":")) + "\n").encode())
    write_out(args.out, doc)
    if args.json:
        say(json.dumps({"ok": True, "document": args.out, "proof": str(proof), "format": args.format,
                        "facts": len(pack["facts"]), "links": len(pack["links"]),
                        "sha256": pack["document"]["sha256"],
                        "issued_by": None if issuer is None else issuer.public.key_id}))
    else:
        say(f"OK    wrote {args.out} ({args.format}): {len(pack['links'])} figure(s) from {len(pack['facts'])} "
            f"fact(s) of {len(pack['runs'])} run(s), each a signed line; proofs in {proof}")
        if issuer is None:
            say("  NOT ISSUED: no --key, and no private key of a pinned key in the key folder: the document is "
                "proven line by line, but nobody sealed it (pass --key to issue it)")
        else:
            say(f"  issued by key {issuer.public.key_id} ({args.key or found}): document_issued sealed beside the "
                "model's run's journal")
        say(f"  check it: trainledger verify-bom {args.out} --pubkey KEY")
    return 0


def _cmd_verify_bom(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.errors import IntegrityError
    from trainledger.journal.keys import read_small_file, trusted_keys
    from trainledger.journal.statements.bom.document import MAX_DOCUMENT_BYTES, BomRefused, check, pack_path

    keys = trusted_keys(args.pubkey)
    proof = Path(args.proof) if args.proof else pack_path(args.document)
    doc = read_small_file(Path(args.document), "document", limit=MAX_DOCUMENT_BYTES)
    pack = read_small_file(proof, "proof pack", limit=MAX_DOCUMENT_BYTES)
    try:
        r = check(doc, pack, keys)
    except IntegrityError as e:
        where = e.where if isinstance(e, BomRefused) else None
        if args.json:
            say(json.dumps({"ok": False, "document": args.document, "error": str(e), "field": where}))
        else:
            say(f"FAIL  {args.document}: {e}")
        return 1
    why = None
    if r.issued_by is None:
        why = ("no pinned key issued it: " + (f"its document_issued is signed by key {r.issued_unpinned}, not pinned"
                                              if r.issued_unpinned else "it carries no document_issued")
               + " (trainledger bom --key)")
        if args.require_issued:
            if args.json:
                say(json.dumps({"ok": False, "document": args.document, "error": why, "field": "issued"}))
            else:
                say(f"FAIL  {args.document}: every figure holds, but {why}")
            return 1
    out: dict[str, Any] = {"ok": True, "document": args.document, "format": r.format, "runs": r.runs,
                           "facts": r.facts, "reproduced": r.reproduced, "figures": r.links,
                           "issued_as": r.issued_as, "issued_by": r.issued_by, "not_issued": why, "not_proven": r.not_proven, "seconds": round(r.seconds, 3)}
    if args.json:
        say(json.dumps(out))
        return 0
    say(f"OK    {args.document} ({r.format}): its {r.links} figure(s) are {r.facts} fact(s) of run(s) "
        f"{', '.join(str(x) for x in r.runs)}, each a line the pinned keys signed ({r.reproduced} recomputed by "
        f"replay: verdicts and totals)" + (f"; issued by key {r.issued_by}" if r.issued_by else "")
        + f" ({r.seconds:.2f} s)")
    if why is not None:
        say(f"  NOT ISSUED {why}")
    say(f"  what it does not prove: {r.not_proven}")
    return 0
