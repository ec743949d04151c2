"""The release commands: ``release`` (sign a model folder the run recorded) and ``verify-model`` (check one)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from trainledger.journal.errors import UsageError

__all__ = ["register", "cmd_keygen_release"]


def register(sub) -> None:
    """Add ``release`` and ``verify-model`` (whose ``--journal`` replays the run with every package's projections:
    :func:`trainledger.audit.replay`)."""
    from trainledger.cli.options import EPILOG, add_json_option, add_progress_option
    from trainledger.cli.proofs import add_witness_options

    p = sub.add_parser(
        "release", help="sign a model folder the run recorded: model.sig (OpenSSF model signing) and SLSA provenance",
        description="Sign MODEL_DIR for release with an ECDSA P-256 release key (trainledger keygen --release): "
                    "model.sig, an OpenSSF model-signing v1.0 signature that `model_signing verify key` accepts, and "
                    "model.provenance.json, SLSA v1 provenance carrying the run's signed proof that the journal "
                    "recorded these exact files (model_exported), the checkpoint they came from, the run's "
                    "configuration and its compute total. The folder must be the one the run recorded, unchanged, "
                    "and the run closed (compute_totaled after the export). docs/provenance.md.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="the model folder the run wrote and recorded")
    p.add_argument("run", metavar="RUN", help="the run's journal, or its run folder")
    p.add_argument("--key", required=True, metavar="KEY", help="the release key (PEM, ECDSA P-256; trainledger "
                                                               "keygen --release DIR writes DIR/release.key), or a "
                                                               "pkcs11: URI of one in a token (keygen --release "
                                                               "--pkcs11 URI)")
    p.add_argument("--pubkey", action="append", default=[], metavar="FILE",
                   help="the run's pinned public key (trainledger.pub; repeatable; also $TRAINLEDGER_TRUSTED_KEYS)")
    p.add_argument("-o", "--out", metavar="DIR", help="write model.sig and model.provenance.json here (default: into "
                                                "MODEL_DIR, where model signing looks for model.sig)")
    p.add_argument("--cosigned", metavar="FILE",
                   help="a proof bundle of the closed run whose checkpoint witnesses cosigned (trainledger witness "
                        "cosign): the release carries those cosignatures (verify-model --witness-key)")
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_release)

    p = sub.add_parser(
        "verify-model", help="check a released model folder offline: its files, signature, provenance and run",
        description="Check MODEL_DIR against its model.sig and model.provenance.json: every file's digest, the "
                    "signatures under the pinned release key, the run's proof under the pinned run key (and "
                    "witnesses), that the journal recorded these files and that they are the run's last model. "
                    "Prints the run, step, checkpoint, journal head and compute total. With --journal, also "
                    "verifies and replays the run and holds it to the release's signed tree (a fork or a journal "
                    "cut short fails). Torch-free and offline. Exit 0 verified, 1 refused (the reason named), 2 usage.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", metavar="MODEL_DIR", help="the released model folder")
    p.add_argument("--release-key", action="append", default=[], metavar="FILE",
                   help="the pinned release public key (release.pub; repeatable)")
    p.add_argument("--pubkey", action="append", default=[], metavar="FILE",
                   help="the run's pinned public key (trainledger.pub; repeatable; also $TRAINLEDGER_TRUSTED_KEYS)")
    p.add_argument("--signature", metavar="FILE", help="the model signature (default: MODEL_DIR/model.sig)")
    p.add_argument("--provenance", metavar="FILE",
                   help="the provenance (default: MODEL_DIR/model.provenance.json)")
    p.add_argument("--journal", metavar="RUN", help="the run's journal or run folder: verify and replay it too")
    p.add_argument("--allow-intermediate", action="store_true",
                   help="accept an export of a step before the run's last (an intermediate model)")
    add_witness_options(p)
    from trainledger.cli.proofs import add_policy_options

    add_policy_options(p, "the run that made the model (the checkpoint the release proves against)")
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_verify_model)


def cmd_keygen_release(args: argparse.Namespace) -> int:
    """``keygen --release DIR``: an ECDSA P-256 release key pair, DIR/NAME.key (0600) and DIR/NAME.pub (PEM)."""
    from pathlib import Path

    from trainledger.cli.options import say
    from trainledger.journal.statements.release.keys import ReleaseKey, public_path

    d = Path(args.directory)
    d.mkdir(parents=True, exist_ok=True)
    name = args.name if args.name != "trainledger" else "release"
    priv = d / f"{name}.key"
    if args.force:
        for q in (priv, public_path(priv)):
            q.unlink(missing_ok=True)
    key = ReleaseKey.generate()
    priv, pub = key.save(priv)
    if args.json:
        say(json.dumps({"ok": True, "private_key": str(priv), "public_key": str(pub), "key_id": key.public.key_id,
                        "kind": "ecdsa-p256"}))
        return 0
    say(f"release key: {priv} (ECDSA P-256, mode 0600; keep it off training nodes)")
    say(f"public key:  {pub} (give it to whoever verifies your models: verify-model --release-key, "
        "model_signing verify key --public_key)")
    return 0


def cmd_keygen_release_pkcs11(args: argparse.Namespace) -> int:
    """``keygen --release --pkcs11 URI DIR``: an ECDSA P-256 release key made inside a token; only DIR/NAME.pub."""
    from pathlib import Path

    from trainledger.journal.errors import UsageError
    from trainledger.cli.options import say
    from trainledger.journal.statements.release.keys import generate_pkcs11_release_key

    d = Path(args.directory)
    name = args.name if args.name != "trainledger" else "release"
    out = d / f"{name}.pub"
    if out.exists() and not args.force:
        raise UsageError(f"{out}: exists (--force replaces it)")
    pub = generate_pkcs11_release_key(args.pkcs11)
    d.mkdir(parents=True, exist_ok=True)
    from trainledger.journal.paths import write_atomically

    write_atomically(out, pub.pem)
    shown = args.pkcs11.split("?", 1)[0]
    if args.json:
        say(json.dumps({"ok": True, "private_key": shown, "public_key": str(out), "key_id": pub.key_id,
                        "kind": "ecdsa-p256"}))
        return 0
    say(f"release key: in the token ({shown}; ECDSA P-256); it never leaves it")
    say(f"public key:  {out} (verify-model --release-key, model_signing verify key --public_key)")
    return 0


def _bytes_progress(args: argparse.Namespace, label: str, folder: str):
    """A bar over the bytes of ``folder`` hashed (the folder's size read only when a bar is drawn)."""
    from trainledger.cli.options import progress_for

    bar = progress_for(args, label)
    if bar is None:
        return None, None
    total = _folder_bytes(folder)
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        bar(done[0], total or done[0])
    return tick, bar


def _folder_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _run_journal(path: str) -> str:
    from trainledger.journal.audit.rundir import run_journal

    if os.path.isdir(path):
        found = run_journal(path)
        if found is None:
            raise UsageError(f"{path}: a distributed run's folder: name the rank journal that recorded the export")
        return str(found)
    return path


def _cmd_release(args: argparse.Namespace) -> int:
    from trainledger.journal.keys import trusted_keys
    from trainledger.cli.options import say
    from trainledger.journal.statements.release.attest import release
    from trainledger.journal.statements.release.keys import load_release_key

    key = load_release_key(args.key)
    cosigned = None
    if args.cosigned is not None:
        from pathlib import Path

        from trainledger.journal.proofs.bundle import MAX_BUNDLE_BYTES
        from trainledger.journal.keys import read_small_file

        cosigned = read_small_file(Path(args.cosigned), "cosigned bundle", limit=MAX_BUNDLE_BYTES)
    journal = _run_journal(args.run)
    tick, bar = _bytes_progress(args, "hashing", args.model_dir)
    try:
        res = release(args.model_dir, journal, key, keys=trusted_keys(args.pubkey), out=args.out, progress=tick,
                      cosigned=cosigned)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        say(json.dumps(res.to_dict()))
        return 0
    say(f"released {res.manifest.name}: {len(res.manifest.files)} files, {res.manifest.bytes:,} bytes, digest "
        f"sha256:{res.manifest.digest}")
    say(f"  the run's export at seq {res.export_seq} (step {res.step}"
        + (f", from {res.checkpoint}" if res.checkpoint else ", not a recorded checkpoint") + f") of run {res.run_id}")
    say(f"  wrote {res.signature} (model signing) and {res.provenance} (SLSA provenance, signed with release key "
        f"{key.public.key_id})")
    return 0


def _replay(path: Any, keys: Any) -> Any:
    """``verify-model --journal``: the run replayed (every package's projections)."""
    from trainledger.audit import replay

    return replay(path, keys=list(keys), allow_unsealed=True)


def _cmd_verify_model(args: argparse.Namespace) -> int:
    from trainledger.journal.keys import trusted_keys
    from trainledger.cli.options import say
    from trainledger.cli.proofs import _quorum
    from trainledger.journal.statements.release.keys import load_release_public_key
    from trainledger.journal.statements.release.verify import verify_model

    rkeys = [load_release_public_key(p) for p in args.release_key]
    witnesses, k = _quorum(args)
    tick, bar = _bytes_progress(args, "hashing", args.model_dir)
    try:
        res = verify_model(args.model_dir, release_keys=rkeys, run_keys=trusted_keys(args.pubkey),
                           witnesses=witnesses, quorum=k, signature=args.signature, provenance=args.provenance,
                           journal=None if args.journal is None else _run_journal(args.journal),
                           allow_intermediate=args.allow_intermediate, progress=tick, replay=_replay)
    finally:
        if bar is not None:
            bar.close()
    published, line = True, None
    if args.policy is not None:
        from trainledger.cli.proofs import published_line
        from trainledger.journal.chain import origin

        published, line = published_line(args.log_proof, trusted_keys(args.pubkey), args.policy, origin(res.run_id),
                                          res.tree_size, res.head, args.model_dir)
    elif args.log_proof is not None:
        raise UsageError("--log-proof goes with --policy (the policy says which log and witnesses to trust)")
    if args.json:
        d = res.to_dict()
        if line is not None:
            d = {**d, "ok": published, "published": published, "publication": line}
        say(json.dumps(d))
        return 0 if published else 1
    say(f"OK    {args.model_dir}  {res.files} files, {res.bytes:,} bytes, sha256:{res.digest}")
    say(f"  signed by release key {res.release_key}; made by run {res.run_id} (run key {res.run_key})")
    from trainledger.journal.text import trainer_step_note

    say(f"  step {res.step}{'' if res.final else ' (an intermediate model: the run went on to step ' + str(res.compute['last_step']) + ')'}"
        f"{trainer_step_note(res.weights.get('checkpoint'), res.step)}; the weights: {res.weights['says']}")
    c = res.compute
    say(f"  compute: {c['steps']:,} steps, {c['tokens']:,} tokens, {c['flops']:.4g} model FLOPs"
        + (" (the run's last total: every line from it to the run's close is proven)" if res.closed else
           " (not shown to be the run's last total: the proof does not reach the run's close)"))
    say(f"  journal head {res.head} (signed tree of {res.tree_size:,} lines)"
        + (f"; cosigned by {', '.join(n for n, _ in res.witnesses)}" if res.witnesses else ""))
    if res.base is not None:
        chain = [res.base, *res.base.get("lineage", [])]
        say("  fine-tuned from " + ", itself fine-tuned from ".join(
            f"sha256:{b['digest']}" + (f" (run {b['run_id']})" if b.get("run_id") else "") for b in chain)
            + " (as the base's release says: verify-model the base to check it)")
    if res.journal is not None:
        j = res.journal
        say(f"  journal {j['path']}: verified{' and replayed' if j['replayed'] else ''}, {j['events']:,} events"
            + ("" if not j["replayed"] else ", every conclusion recomputed" if j["ok"]
               else f", {j['differences']} difference(s): run replay"))
    if line is not None:
        say(line)
    return 0 if published else 1

