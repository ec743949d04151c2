"""The organisation log's commands: ``log init``, ``log add``, ``log serve``, ``log publish``, and ``witness serve``
(docs/publishing.md). The work is in :mod:`trainledger.journal.statements.publish` and
:mod:`trainledger.journal.proofs.tiles`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from trainledger.journal.errors import UsageError

__all__ = ["register", "register_witness_serve"]


def register(sub) -> None:
    from trainledger.cli.options import add_json_option

    p = sub.add_parser("log", help="a team's log of its runs, for witnesses to cosign (C2SP tlog-tiles)",
                       description="One append-only log per team: its entries are the runs' signed checkpoint "
                                   "notes, its folder a C2SP tlog-tiles log that any web server serves, and "
                                   "'log publish' has witnesses outside the trainer cosign it (docs/publishing.md).")
    lsub = p.add_subparsers(dest="log_command", metavar="ACTION", help="init, add, serve, publish or prove")
    q = lsub.add_parser("init", help="make an empty log folder, signed by the log's key")
    q.add_argument("logdir", metavar="LOGDIR", help="the log's folder")
    q.add_argument("--origin", required=True, help="the log's name: a schema-less URL prefix (example.com/ml-runs)")
    q.add_argument("--key", required=True, metavar="LOG.key", help="the log's private key (trainledger keygen)")
    add_json_option(q)
    q.set_defaults(func=_cmd_init)

    q = lsub.add_parser("add", help="verify runs and append their signed checkpoints to the log")
    q.add_argument("logdir", metavar="LOGDIR", help="the log's folder")
    q.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders or journals (every rank of a "
                                                              "distributed run's folder)")
    q.add_argument("--pubkey", action="append", default=[], metavar="RUN.pub", required=True,
                   help="the runs' public key(s) (repeatable)")
    q.add_argument("--key", default=None, metavar="LOG.key",
                   help="the log's private key (a file, a pkcs11: or KMS URI; default: the one 'log init' was given "
                        "for this log's key, as it noted in your own key folder: where the key is, never the key, "
                        "and never read from the log folder)")
    q.add_argument("--allow-open", action="store_true",
                   help="add a run still being written (its signed prefix: a periodic entry); default: closed runs")
    add_json_option(q)
    q.set_defaults(func=_cmd_add)

    q = lsub.add_parser("serve", help="serve the log folder read-only over HTTP (127.0.0.1)")
    q.add_argument("logdir", metavar="LOGDIR", help="the log's folder")
    q.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0: a free one)")
    q.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    q.set_defaults(func=_cmd_serve)

    q = lsub.add_parser("prove", help="write each run's proof of logging (C2SP tlog-proof) beside its journal")
    q.add_argument("logdir", metavar="LOGDIR", help="the log's folder")
    q.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders or journals, each added before")
    q.add_argument("--pubkey", action="append", default=[], metavar="RUN.pub", required=True,
                   help="the runs' public key(s) (repeatable)")
    q.add_argument("--allow-open", action="store_true", help="a run still being written (its signed prefix)")
    q.add_argument("-o", "--out", metavar="PATH", default=None,
                   help="write the proof here instead (one journal), or into this folder (several)")
    q.add_argument("--cose-key", metavar="LOG.key", default=None,
                   help="also write each entry's RFC 9942 COSE receipt beside its proof (<journal>.receipt.cose), "
                        "signed with this key: the log's (EdDSA), or a P-256 PEM (ES256) (docs/cose.md)")
    add_json_option(q)
    q.set_defaults(func=_cmd_prove)

    q = lsub.add_parser("publish", help="have witnesses cosign the log's checkpoint (C2SP tlog-witness)")
    q.add_argument("logdir", metavar="LOGDIR", help="the log's folder")
    q.add_argument("--witness", action="append", default=[], metavar="URL",
                   help="a witness's submission prefix (repeatable); its cosignature is kept unchecked")
    q.add_argument("--policy", metavar="FILE", default=None,
                   help="a C2SP tlog-policy file: its witnesses with a URL are asked, each cosignature checked under "
                        "its key, and whether the quorum is met is printed")
    q.add_argument("--min-interval", type=float, default=60.0, metavar="SECONDS",
                   help="the least time since another checkpoint was published (default 60: the rate witnesses "
                        "admit)")
    add_json_option(q)
    q.set_defaults(func=_cmd_publish)
    from trainledger.cli.options import usage

    p.set_defaults(func=lambda args: usage(p))

    q = sub.add_parser("timestamp", help="have a time-stamping authority (RFC 3161) sign that a seal existed",
                       description="Ask an RFC 3161 time-stamping authority for a token over the journal's last "
                                   "signed seal (its checkpoint note), or over every seal without one (--all-seals), "
                                   "and keep the tokens beside it (<journal>.timestamps.jsonl). 'verify --tsa-cert' "
                                   "checks them offline and prints when each seal existed by.")
    q.add_argument("path", metavar="JOURNAL", help="a journal (signed, format 1.3 or later)")
    q.add_argument("--tsa", required=True, metavar="URL", help="the authority's RFC 3161 HTTP endpoint")
    q.add_argument("--pubkey", action="append", default=[], metavar="FILE",
                   help="the journal's public key, verified first (default: the key the journal names: a token is "
                        "over the note's bytes whoever reads it; verify --tsa-cert later checks it under the key "
                        "you pin)")
    q.add_argument("--all-seals", action="store_true", help="every seal without a token, not only the last")
    q.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long to wait for the authority (default 10)")
    add_json_option(q)
    q.set_defaults(func=_cmd_timestamp)


def register_witness_serve(wsub) -> None:
    q = wsub.add_parser("serve", help="run a witness over HTTP (C2SP tlog-witness add-checkpoint), 127.0.0.1",
                        description="Cosign the checkpoints of the logs it follows, over HTTP: each add-checkpoint "
                                    "answered as the C2SP witness protocol says (400, 403, 404, 409 with the size it "
                                    "holds, 422, 200 with its cosignatures), the state on disk before it answers.")
    q.add_argument("--key", required=True, metavar="W.key", help="the witness's private key (a key file)")
    q.add_argument("--name", required=True, help="the witness's name (a schema-less URL, e.g. witness.example/w1)")
    q.add_argument("--state", required=True, metavar="FILE", help="the witness's state (created if absent)")
    q.add_argument("--log", action="append", default=[], metavar="VKEY", required=True,
                   help="a log to follow: its verifier key (name = origin; 'trainledger log init' prints it, and "
                        "writes it to LOGDIR/log.vkey), or a file of them (repeatable). A checkpoint carries only its "
                        "signer's key hash, never the key: a witness cannot learn a log on first use")
    q.add_argument("--port", type=int, default=8766, help="the port (default 8766; 0: a free one)")
    q.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    q.add_argument("--ml-dsa", action="store_true", help="cosign with ML-DSA-44 too (a key derived from --key)")
    q.set_defaults(func=_cmd_witness_serve)


def _log_key(logdir: str) -> bytes:
    """The log's public key, from the verifier key 'log init' wrote beside it."""
    from trainledger.journal.note import parse_verifier_key

    path = Path(logdir) / "log.vkey"
    if not path.is_file():
        raise UsageError(f"{logdir}: not a log folder ('trainledger log init' writes log.vkey there)")
    return parse_verifier_key(_vkey_text(logdir)).public


def _remembered() -> tuple[Path, dict[str, str]]:
    """Where each log's key is, as 'log init' was told: ``key_home()/logs.json``, this user's own file (a log folder
    is anyone's to write: nothing in it may choose which key file a command opens)."""
    from trainledger.journal.keys import key_home
    from trainledger.journal.paths import read_regular

    path = key_home() / "logs.json"
    try:
        d = json.loads(read_regular(path, 1 << 20, what="log key list", owned=True))
    except FileNotFoundError:
        return path, {}
    except ValueError:
        raise UsageError(f"{path}: not a list of log keys (remove it; pass --key)") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise UsageError(f"{path}: not a list of log keys (remove it; pass --key)")
    return path, d


def _remember_key(vkey: str, key: str) -> None:
    from trainledger.journal.paths import write_atomically

    path, d = _remembered()
    d[vkey] = key if ":" in key and not Path(key).exists() else str(Path(key).resolve())
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomically(path, json.dumps(d, indent=1, sort_keys=True).encode(), 0o600)


def _vkey_text(logdir: str) -> str:
    """The text of the verifier key 'log init' wrote beside the log (a file that is not UTF-8 is no key)."""
    from trainledger.journal.keys import read_small_file
    from trainledger.journal.note import note_text

    path = Path(logdir) / "log.vkey"
    return note_text(read_small_file(path, "log verifier key"), path, "a verifier key").strip()


def _remembered_key(logdir: str) -> str:
    """The key 'log init' was given for the log in ``logdir`` (found by its verifier key)."""
    vkey = _vkey_text(logdir)
    key = _remembered()[1].get(vkey)
    if key is None:
        raise UsageError(f"{logdir}: no --key, and 'log init' was not given this log's key on this account")
    return key


def _cmd_init(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import load_signer
    from trainledger.journal.note import verifier_key
    from trainledger.journal.paths import write_atomically
    from trainledger.journal.proofs.tiles import TileLog

    s = load_signer(args.key)
    TileLog.init(args.logdir, args.origin, s)
    vkey = verifier_key(args.origin, s.public.raw)
    write_atomically(Path(args.logdir) / "log.vkey", (vkey + "\n").encode())
    _remember_key(vkey, args.key)
    if args.json:
        say(json.dumps({"ok": True, "log": args.logdir, "origin": args.origin, "vkey": vkey}))
        return 0
    say(f"log {args.origin} in {args.logdir}: size 0; its verifier key (for witnesses and policy files, also in "
        "log.vkey):")
    say(vkey)
    return 0


def _cmd_add(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import load_signer, trusted_keys
    from trainledger.journal.statements.publish.orglog import add_runs

    key = args.key if args.key is not None else _remembered_key(args.logdir)
    s = load_signer(key)
    if _log_key(args.logdir) != s.public.raw:
        raise UsageError(f"{key}: not the key of the log in {args.logdir}")
    got = add_runs(args.logdir, args.runs, trusted_keys(args.pubkey), s, require_closed=not args.allow_open)
    if args.json:
        say(json.dumps({"ok": True, "size": got.size, "entries": [{"journal": str(j), "index": i, "new": n}
                                                                  for j, i, n in got.entries]}))
        return 0
    for j, i, n in got.entries:
        say(f"{'added' if n else 'already'}  {j}: entry {i}")
    say(f"log size {got.size}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.statements.publish.witness_http import serve_folder

    _log_key(args.logdir)
    server = serve_folder(args.logdir, args.port, host=args.host)
    host, port = server.server_address[:2]
    say(f"serving {args.logdir} at http://{host}:{port}/ (checkpoint, tile/...); Ctrl-C stops")
    return _until_interrupted(server)


def _until_interrupted(server) -> int:
    """Serve (the server's own thread) until Ctrl-C, then stop it: the exit code of both serve commands."""
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
        return 0


def _cmd_witness_serve(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import load_signer
    from trainledger.journal.proofs.witness import parse_log_keys
    from trainledger.journal.statements.publish.witness_http import HttpWitness, serve_witness

    w = HttpWitness(args.name, load_signer(args.key), args.state, parse_log_keys(args.log), ml_dsa=args.ml_dsa)
    server = serve_witness(w, args.port, host=args.host)
    host, port = server.server_address[:2]
    say(f"witness {args.name} at http://{host}:{port}/add-checkpoint, following {len(w.logs)} log(s); its keys:")
    for v in w.vkeys():
        say(v)
    return _until_interrupted(server)


def _cmd_publish(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.note import NoteError
    from trainledger.journal.proofs.policy import check_checkpoint, read_policy
    from trainledger.journal.statements.publish.orglog import publish

    witnesses: list[tuple[str, list]] = [(u, []) for u in args.witness]
    policy = read_policy(args.policy) if args.policy else None
    if policy is not None:
        witnesses += [(url, [policy.witnesses[n]]) for n, url in policy.witness_urls.items()]
    if not witnesses:
        raise UsageError("no witness to ask: give --witness URL or a --policy whose witness lines carry URLs")
    got = publish(args.logdir, witnesses, _log_key(args.logdir), min_interval_s=args.min_interval)
    quorum = None
    if policy is not None:
        try:
            _, quorum = check_checkpoint(policy, got.note)
        except NoteError as e:
            raise UsageError(f"{args.policy}: the log's checkpoint is not one this policy accepts: {e}") from None
    if args.json:
        say(json.dumps({"ok": all(a.error is None for a in got.answers), "size": got.size,
                        "witnesses": [{"url": a.url, "cosigned": a.error is None, "error": a.error}
                                      for a in got.answers],
                        "quorum": None if quorum is None else {"met": quorum.met, "detail": quorum.detail}}))
    else:
        for a in got.answers:
            say(f"cosigned  {a.url}" if a.error is None else f"REFUSED   {a.url}: {a.error}")
        say(f"checkpoint of size {got.size} now carries {got.note.count(chr(0x2014)) - 1} cosignature(s)")
        if quorum is not None:
            say(quorum.detail)
    failed = any(a.error is not None for a in got.answers) or (quorum is not None and not quorum.met)
    return 1 if failed else 0


def _cmd_prove(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say, write_out
    from trainledger.journal.keys import trusted_keys
    from trainledger.journal.statements.publish.orglog import proof_path, prove

    proofs = prove(args.logdir, args.runs, trusted_keys(args.pubkey), _log_key(args.logdir),
                   require_closed=not args.allow_open)
    written = []
    for j, text in proofs:
        if args.out is None:
            dest = proof_path(j)
        elif len(proofs) == 1 and not Path(args.out).is_dir():
            dest = Path(args.out)
        else:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            dest = Path(args.out) / proof_path(j).name
        write_out(str(dest), text.encode())
        written.append((j, dest, text.count("\u2014 ") - 1))
        if args.cose_key is not None:
            write_out(str(dest.with_suffix(".receipt.cose")), _receipt_of(text, args.cose_key))
    if args.json:
        say(json.dumps({"ok": True, "proofs": [{"journal": str(j), "proof": str(d), "cosignatures": n}
                                              for j, d, n in written]}))
        return 0
    for j, d, n in written:
        say(f"wrote {d}: {j} in the log, under a checkpoint carrying {n} cosignature line(s), copied as served "
            "(verify --policy checks them)")
    return 0


def _receipt_of(proof_text: str, key: str) -> bytes:
    """A tlog-proof's inclusion as an RFC 9942 COSE receipt signed with ``key``."""
    from trainledger.journal.note import parse_checkpoint
    from trainledger.journal.proofs.cose import load_key, receipt
    from trainledger.journal.proofs.tlogproof import parse_proof

    tp = parse_proof(proof_text)
    cp = parse_checkpoint(tp.note[:tp.note.rfind("\n\n") + 1])
    return receipt(tp.index, cp.size, tp.hashes, cp.root, load_key(key))


def policy_lines(path: str, kind: str, keys, policy_file: str, proof: str | None) -> tuple[bool, list[str]]:
    """``verify --policy``: whether every journal of ``path`` is published under the policy, and a line each."""
    from trainledger.journal.proofs.policy import read_policy
    from trainledger.journal.statements.publish.orglog import check_published, run_journals

    if kind not in ("journal", "run_dir"):
        raise UsageError("--policy applies to a journal or a run folder (an export carries no proof of logging)")
    policy = read_policy(policy_file)
    journals = run_journals(path)
    if proof is not None and len(journals) != 1:
        raise UsageError("--log-proof names one proof: give it for one journal (a run folder's proofs lie beside its "
                         "rank journals)")
    results = [check_published(j, keys, policy, Path(proof) if proof else None) for j in journals]
    return all(r.ok for r in results), [f"{'PUBLISHED' if r.ok else 'NOT PUBLISHED'}  {r.journal}: {r.detail}"
                                        for r in results]


def _when(ns: int | None) -> str:
    import datetime

    return "?" if ns is None else datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).isoformat(
        timespec="seconds")


def stamped_line(st) -> str:
    """One seal's token, as verify and timestamp print it."""
    tree = f" (tree of {st.tree_size:,})" if st.tree_size is not None else ""
    if st.error is not None:
        return f"NO TIME  seal at line {st.seal_seq}{tree}: {st.error} [{st.where}]"
    if not st.checked:
        return (f"TOKEN    seal at line {st.seal_seq}: says it existed by {st.time.isoformat(timespec='seconds')}, per "
                f"{st.tsa}; NOT checked here (verify --tsa-cert FILE checks it) [{st.where}]")
    signed = f", signed by {st.authority}" if st.authority else ""
    return (f"EXISTED BY {st.time.isoformat(timespec='seconds')}  seal at line {st.seal_seq}{tree}, per {st.tsa}{signed} "
            f"(the trainer's clock: {_when(st.own_ns)}) [{st.where}]")


def _cmd_timestamp(args: argparse.Namespace) -> int:
    from trainledger.cli.options import say
    from trainledger.journal.keys import trusted_keys
    from trainledger.journal.proofs.timestamp import stamp
    from trainledger.journal.verify import verify

    keys = trusted_keys(args.pubkey)
    if keys:
        verify(args.path, keys=keys, allow_unsealed=True)
    else:
        import base64

        from trainledger.journal.keys import PublicKey
        from trainledger.journal.verify import open_checked, read_opening

        opened, _ = read_opening(Path(args.path), open_checked(Path(args.path)))
        if not opened.public_key:
            raise UsageError(f"{args.path}: an unsigned journal has no seal to timestamp")
        keys = [PublicKey(base64.b64decode(opened.public_key), source="the journal (embedded)")]
        verify(args.path, keys=keys, allow_unsealed=True)
    got = stamp(args.path, keys, args.tsa, all_seals=args.all_seals, timeout=args.timeout)
    if args.json:
        say(json.dumps({"ok": all(s.error is None for s in got),
                        "seals": [{"seal_seq": s.seal_seq, "tree_size": s.tree_size, "error": s.error,
                                   "time": None if s.time is None else s.time.isoformat()} for s in got]}))
    else:
        for s in got:
            say(stamped_line(s))
    return 0 if all(s.error is None for s in got) else 1


def token_lines(path: str) -> list[dict]:
    """``show``: every token a journal carries, read but not checked, as records for --json (``line``: as printed)."""
    from trainledger.journal.proofs.timestamp import list_tokens

    return [{"seal_seq": st.seal_seq, "tsa": st.tsa, "says": None if st.time is None else st.time.isoformat(),
             "error": st.error, "where": st.where, "checked": False, "line": stamped_line(st)}
            for st in list_tokens(path)]


def tsa_lines(path: str, kind: str, keys, cert_files) -> tuple[bool, list[str]]:
    """``verify --tsa-cert``: every token of every journal of ``path`` checked; (all hold, a line each)."""
    from trainledger.journal.keys import read_small_file
    from trainledger.journal.proofs.timestamp import check_journal, load_certificates
    from trainledger.journal.statements.publish.orglog import run_journals

    if kind not in ("journal", "run_dir"):
        raise UsageError("--tsa-cert applies to a journal or a run folder")
    certs = [c for f in cert_files for c in load_certificates(read_small_file(Path(f), "certificate",
                                                                              limit=1 << 20))]
    lines, ok = [], True
    for j in run_journals(path):
        found = check_journal(j, keys, certs)
        if not found:
            lines.append(f"NO TIME  {j}: no timestamp token ('trainledger timestamp', or Recorder(tsa=))")
        for st in found:
            ok = ok and st.error is None
            lines.append(stamped_line(st))
    return ok, lines
