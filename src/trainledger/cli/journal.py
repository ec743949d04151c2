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

from trainledger.journal import __version__
from trainledger.journal.text import csv_cell, safe
from trainledger.journal.errors import IntegrityError, JournalError, JournalIOError, TrainledgerError, UsageError
from trainledger.journal.keys import keygen, warn_private_keys
from trainledger.cli.options import (EPILOG, PATH_HELP, add_json_option, add_partial_option, add_progress_option,
                                     add_trust_options, partial_line, print_report, progress_for, say, say_failed,
                                     trust_policy, verify_from_args, write_out)
from trainledger.journal.verify import parse_head

__all__ = ["main", "entry", "build_parser", "new_parser", "register"]


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
    """Add the journal's commands: keygen, verify, head, query, show, and the proof commands
    (:mod:`trainledger.cli.proofs`)."""
    p = sub.add_parser("keygen", help="write an Ed25519 key pair (NAME.key, mode 0600, and NAME.pub)",
                       description="Write an Ed25519 private key (PKCS8 PEM, mode 0600) and a one-line public key.")
    p.add_argument("directory", metavar="DIR", help="the folder to write the key pair into (created if absent)")
    p.add_argument("--name", default="trainledger", help="file name stem (default: trainledger)")
    p.add_argument("--force", action="store_true", help="overwrite existing key files")
    p.add_argument("--pkcs11", metavar="URI",
                   help="make the key inside a PKCS#11 token instead (an RFC 7512 pkcs11:token=...;object=... URI; "
                        "the PIN from pin-source= or $TRAINLEDGER_PKCS11_PIN): only DIR/NAME.pub is written, the "
                        "private key never leaves the token (docs/keys.md)")
    p.add_argument("--release", action="store_true",
                   help="write a release key instead: ECDSA P-256 PEM, DIR/release.key (0600) and DIR/release.pub, "
                        "for trainledger release and model signing (docs/provenance.md)")
    add_json_option(p)
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser("pubkey", help="print the public key of a signing key (a key file, a pkcs11: or awskms:// URI)",
                       description="Print the one-line public key (trainledger-ed25519 BASE64 KEYID) of a private "
                                   "key file, of the key a pkcs11: URI names inside a token or of a key a service "
                                   "holds (awskms://...), to pin with --pubkey.")
    p.add_argument("key", metavar="KEY", help="a private key file (trainledger.key), a pkcs11: URI or a KMS URI "
                                              "(awskms:///alias/NAME)")
    p.add_argument("-o", "--out", metavar="FILE", help="also write it to FILE (a .pub file)")
    add_json_option(p)
    p.set_defaults(func=_cmd_pubkey)

    p = sub.add_parser("verify", help="verify a journal offline against a pinned key",
                       description="Check canonical form, seq continuity, every chain hash, every seal and the "
                                   "tail state. Exit 0 intact, 1 integrity failure, 2 usage or I/O error.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help=PATH_HELP + ", or a Parquet export (export parquet --lines)")
    add_trust_options(p)
    p.add_argument("--expect-head", metavar="SEQ:HASH",
                   help="fail unless the journal contains this head (published earlier with 'trainledger head')")
    p.add_argument("--require-closed", action="store_true", help="fail unless the run was closed and sealed")
    p.add_argument("--expect-checkpoint", metavar="NOTE", default=None,
                   help="fail unless the journal extends this signed checkpoint, published earlier with "
                        "'trainledger tree-head' (format 1.3: the root of its first SIZE lines must be the note's)")
    from trainledger.cli.proofs import add_witness_options

    add_witness_options(p)
    p.add_argument("--policy", metavar="FILE", default=None,
                   help="a C2SP tlog-policy file: also fail unless the run is published, its checkpoint in the team "
                        "log under a checkpoint the policy's quorum cosigned (its proof of logging beside each "
                        "journal: 'trainledger log prove'; docs/publishing.md)")
    p.add_argument("--log-proof", metavar="FILE", default=None,
                   help="with --policy: the journal's proof of logging, if not beside it (<journal>.tlog-proof)")
    p.add_argument("--tsa-cert", action="append", default=[], metavar="FILE",
                   help="a time-stamping authority's certificate, or the CA that issued it (PEM; repeatable): check "
                        "every RFC 3161 token on the journal's seals and print when each seal existed by")
    add_json_option(p)
    p.add_argument("--workers", type=int, default=None, help="processes for large journals (default: all cores)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="verify a run folder's rank journals as Ray tasks (pinned keys only; trainledger[ray]): on "
                        "the cluster at ADDRESS ('auto': the one 'ray start' runs here), or on one started for the "
                        "call; the anchors are then checked here as without it")
    add_partial_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("head", help="print the latest sealed SEQ:HASH, to publish elsewhere",
                       description="Verify the journal, then print its latest sealed head as SEQ:HASH. Publish it "
                                   "somewhere the writer cannot rewrite; 'verify --expect-head' then detects truncation.")
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_trust_options(p)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_head)

    p = sub.add_parser("query", help="SQL over one or more journals (or folders of them) with DuckDB",
                       description="Load verified journals into an in-memory DuckDB and run SQL over the views "
                                   "events, runs, steps, anomalies, episodes, checkpoints, resumes, rewinds, verdicts, "
                                   "decisions, seals. File access is switched off before your SQL runs.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", metavar="PATH", nargs="+", help="journals or folders; the last argument is the SQL "
                                                          "unless --sql-file is given ('-' reads SQL from stdin)")
    add_trust_options(p)
    p.add_argument("--sql-file", metavar="FILE", help="read the SQL from FILE")
    p.add_argument("--param", action="append", default=[], metavar="VALUE",
                   help="a value bound to the next ? in the SQL (repeatable; never pasted into the SQL)")
    p.add_argument("--format", choices=("table", "csv", "json", "parquet"), default="table",
                   help="how to print the result (default: table; parquet needs --out)")
    p.add_argument("-o", "--out", metavar="FILE", help="write the result here instead of stdout (required for parquet)")
    p.add_argument("--no-verify", action="store_true", help="skip signature verification (says so on stderr)")
    add_partial_option(p)
    p.add_argument("--no-cache", action="store_true",
                   help="read the journals even if a verified columnar copy matches their heads, and keep none")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="interrupt the SQL after this long (default 600; 0 for no limit)")
    p.set_defaults(func=_cmd_query)

    p = sub.add_parser("show", help="summarise a journal: run, key, events by kind, seals, tail, timestamp tokens",
                       description="Summarise a journal. Checks the chain but not signatures (use verify for that).")
    p.add_argument("path", metavar="PATH", help=PATH_HELP)
    add_json_option(p)
    add_progress_option(p)
    p.set_defaults(func=_cmd_show)

    from trainledger.cli.proofs import register as register_proofs

    register_proofs(sub)


# ---------------------------------------------------------------- commands


def _cmd_pubkey(args: argparse.Namespace) -> int:
    from trainledger.journal.keys import load_signer

    if str(args.key).startswith("pkcs11:"):
        from trainledger.journal.backends.hsm import public_key_of

        pub = public_key_of(args.key)
    else:
        pub = load_signer(args.key).public
    if args.out:
        write_out(Path(args.out), (pub.line() + "\n").encode())
    if args.json:
        say(json.dumps({"ok": True, "key_id": pub.key_id, "public_key_line": pub.line(), "out": args.out}))
    else:
        say(pub.line())
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    if args.pkcs11:
        from trainledger.journal.backends.hsm import generate_pkcs11_key

        if args.release:
            from trainledger.cli.release import cmd_keygen_release_pkcs11

            return cmd_keygen_release_pkcs11(args)
        pub = generate_pkcs11_key(args.pkcs11)
        d = Path(args.directory)
        d.mkdir(parents=True, exist_ok=True)
        out = d / f"{args.name}.pub"
        if out.exists() and not args.force:
            raise UsageError(f"{out}: exists (--force replaces it)")
        write_out(out, (pub.line() + "\n").encode())
        shown = args.pkcs11.split("?", 1)[0]
        if args.json:
            say(json.dumps({"ok": True, "private_key": shown, "public_key": str(out), "key_id": pub.key_id,
                            "public_key_line": pub.line()}))
            return 0
        say(f"private key: in the token ({shown}); it never leaves it")
        say(f"public key:  {out}")
        say(pub.line())
        return 0
    if args.release:
        from trainledger.cli.release import cmd_keygen_release

        return cmd_keygen_release(args)
    priv, pub = keygen(args.directory, name=args.name, force=args.force)
    if args.json:
        from trainledger.journal.keys import load_public_key

        key = load_public_key(pub)
        say(json.dumps({"ok": True, "private_key": str(priv), "public_key": str(pub), "key_id": key.key_id,
                        "public_key_line": key.line()}))
        return 0
    say(f"private key: {priv} (mode 0600; keep it secret)")
    say(f"public key:  {pub}")
    say(Path(pub).read_text().strip())
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from trainledger.cli.proofs import FAILS, expected_checkpoint
    from trainledger.journal.views.verifying import path_kind, verify_path

    kind = path_kind(args.path)
    trust = trust_policy(args)
    cp = None
    if kind != "run_dir":  # a run folder refuses --expect-checkpoint itself
        try:  # an export is opened under the pinned keys (it has no journal of its own to embed one)
            cp = expected_checkpoint(args, keys=trust.keys) if kind == "export" else expected_checkpoint(args)
        except FAILS as e:
            say(f"FAIL  {args.path}: the expected checkpoint {args.expect_checkpoint}: {e}")
            return 1
    progress = progress_for(args, "verifying") if kind == "journal" else None
    try:
        r = verify_path(args.path, trust, partial=args.partial, require_closed=args.require_closed,
                        expect_head=parse_head(args.expect_head) if args.expect_head else None,
                        expect_checkpoint=cp, workers=args.workers, ray=args.ray, progress=progress, kind=kind)
    except IntegrityError as e:
        if kind != "journal":
            return say_failed(args, e, args.path)
        if args.json:
            say(json.dumps(e.report.to_dict() if e.report is not None else
                           {"ok": False, "path": args.path, "first_bad_seq": e.seq, "error": str(e)}))
        else:
            say(e.fail_line(args.path))
        return 1
    finally:
        if progress is not None:
            progress.close()
    published, lines = True, []
    if args.policy is not None:
        from trainledger.cli.publish import policy_lines

        published, lines = policy_lines(args.path, kind, trust.keys, args.policy, args.log_proof)
    elif args.log_proof is not None:
        raise UsageError("--log-proof goes with --policy (the policy says which log and witnesses to trust)")
    if args.tsa_cert:
        from trainledger.cli.publish import tsa_lines

        timed, more = tsa_lines(args.path, kind, trust.keys, args.tsa_cert)
        published, lines = published and timed, lines + more
    if args.json:
        d = {"ok": True, "partial": r.partial, **r.to_dict()} if kind == "export" else r.to_dict()
        if args.policy is not None or args.tsa_cert:
            d = {**d, "ok": d.get("ok", True) and published, "published": published, "publication": lines}
        say(json.dumps(d))
    elif kind == "export":
        _print_export(r)
    elif kind == "run_dir":
        _print_run_dir(r, trust)
    else:
        print_report(r, title="OK  ")
    if not args.json:
        for line in lines:
            say(line)
    return 0 if published else 1


def _print_export(r: Any) -> None:
    """A Parquet export's check (journal/views/parquet/check.py): its listing, then every journal's lines verified
    and its typed columns held to them."""
    for run, missing in r.missing.items():
        say(partial_line(run, missing))
    say(f"OK    {r.out}: {r.journals} journal(s), {r.events:,} events re-verified from their lines ({r.trust}); "
        f"{r.files} files match the listing, every typed cell its line")
    for run, n in r.runs.items():
        say(f"  run {run}: {n} rank(s) held together as verify RUN_DIR holds a run folder (one run, world sizes, "
            "every anchor, each rank's key)")
    for rc in r.receipts:
        say(f"  {rc['run_id']}  head {rc['head']}  tree {rc['tree_size']} root {rc['tree_root']}  key {rc['key_id']}")


def _print_run_dir(r: Any, trust: Any) -> None:
    """A distributed run's folder: every rank journal and every cross-rank anchor (journal/audit/rundir.py)."""
    say(f"OK    {r.path}: {len(r.ranks)} of {r.world_size} ranks verified, {r.anchors} cross-rank anchors hold")
    say(f"  keys bound to ranks by {r.keys_binding(trust.roster)}")
    if r.engine:
        say(f"  ranks verified on {r.engine}")
    if r.missing:
        say(partial_line(r.path, r.missing))
    if r.keys_bound_by in ("one key", "recorded") and len(trust.keys) > 1:
        say(f"  note: {len(trust.keys)} keys are pinned; any one of them could have written a folder like this one "
            "(pin --roster FILE to say which key signs which rank)")
    for rank, rep in sorted(r.ranks.items()):
        unsigned = f", {rep.unsealed_events:,} NOT signed" if rep.unsealed_events else ""
        say(f"  rank {rank:<5} {rep.events:>10,} events  key {rep.key_id} ({rep.trust})  tail {rep.tail}{unsigned}")


def _verify_and_print(args: argparse.Namespace, title: str, *, tokens=None, **extra) -> int:
    """Verify, then print the report (or the one-line failure) and what ``tokens(report)`` lists (show's RFC 3161
    tokens, unchecked); the exit code of verify and show."""
    try:
        r = verify_from_args(args, **extra)
    except IntegrityError as e:
        if args.json:
            d = (e.report.to_dict() if e.report is not None else {"ok": False, "path": args.path,
                                                                   "first_bad_seq": e.seq, "error": str(e)})
            say(json.dumps(d))
        else:
            say(e.fail_line(args.path))
        return 1
    stamps = [] if tokens is None else tokens(r)
    if args.json:
        say(json.dumps(r.to_dict() if tokens is None else {**r.to_dict(), "timestamps": stamps}))
    else:
        print_report(r, title=title)
        for t in stamps:
            say(t["line"])
    return 0


def _cmd_head(args: argparse.Namespace) -> int:
    args.allow_unsealed = True  # head prints the latest sealed head: what came after it is never part of it
    try:
        r = verify_from_args(args)
    except IntegrityError as e:
        return say_failed(args, e, args.path, file=sys.stderr)
    if r.head is None:
        raise JournalError(f"{args.path}: no seal yet: nothing to publish")
    if args.json:
        say(json.dumps({"ok": True, "head": r.head, "seq": r.last_sealed_seq, "hash": r.last_sealed_hash,
                          "run_id": r.run_id, "key_id": r.key_id, "unsealed_events": r.unsealed_events}))
    else:
        say(r.head)
        if r.unsealed_events:
            say(f"trainledger head: {r.unsealed_events:,} events after it are not signed yet", file=sys.stderr)
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    import csv
    import io

    import duckdb

    from trainledger.journal.views.session import open_query

    paths = list(args.paths)
    if args.sql_file:
        from trainledger.journal.keys import read_small_file

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
    try:
        session = open_query(paths, trust_policy(args), sql, verify=not args.no_verify, use_cache=not args.no_cache,
                             partial=args.partial)
    except IntegrityError as e:
        say(e.fail_line(getattr(e, "path", None) or (str(e.report.path) if e.report else "journal")), file=sys.stderr)
        return 1
    for folder, missing in session.missing.items():
        say(f"trainledger query: {partial_line(folder, missing)}", file=sys.stderr)
    try:
        cols, rows = _run_sql(session.con, sql, args.param or None, args.timeout)
    finally:
        session.close()
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
        write_out(Path(args.out), buf.getvalue().encode())
    else:
        sys.stdout.write(buf.getvalue())
    return 0


def _run_sql(con, sql: str, params, timeout: float) -> tuple[list[str], list[tuple]]:
    """Run the user's SQL in a worker thread, so that Ctrl-C and ``--timeout`` can interrupt DuckDB."""
    import threading

    import duckdb

    if not timeout >= 0 or timeout == float("inf"):
        raise UsageError(f"--timeout must be a finite number of seconds (0 for none), got {timeout}")
    try:  # a read-only session: a statement that would change its own views (DROP VIEW steps) is refused
        kinds = [st.type for st in con.extract_statements(sql)]
    except duckdb.Error:
        kinds = []  # a syntax error: DuckDB names it when the statement runs
    writes = [k.name for k in kinds if k not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)]
    if writes:
        raise UsageError(f"query failed: the session is read-only: {writes[0]} statements are refused (SELECT, "
                         "WITH, FROM, DESCRIBE, SHOW, SUMMARIZE and EXPLAIN run)")
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
    from trainledger.journal.views.query import new_connection

    out = new_connection()
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


def _cmd_show(args: argparse.Namespace) -> int:
    def tokens(r) -> list[dict]:
        """The journal's RFC 3161 tokens, read only where it or its sidecar has one (a second read otherwise)."""
        from trainledger.cli.publish import token_lines
        from trainledger.journal.proofs.timestamp import sidecar

        if not r.kinds.get("timestamp_recorded") and not sidecar(args.path).is_file():
            return []
        return token_lines(args.path)

    return _verify_and_print(args, "JOURNAL", label="reading", check_signatures=False, tokens=tokens)


# ---------------------------------------------------------------- entry point


#: the commands that read a journal or a run folder someone may have been sent (a private key found there is named)
_READERS = frozenset({"verify", "replay", "report", "query", "show", "head", "watch", "prove", "bundle"})


#: the commands that take s3:// and file:// URLs (journal/backends/storage.py): what they read is fetched to a private copy
_URL_COMMANDS = frozenset({"verify", "replay", "query", "show", "head", "export"})


def _urls_in(args: argparse.Namespace) -> bool:
    from trainledger.journal.backends.storage import is_url

    if is_url(getattr(args, "out", None)) and args.command != "export":
        raise UsageError(f"{args.out}: --out writes a local file")
    found = [p for p in [getattr(args, "path", None), *(getattr(args, "paths", None) or []), getattr(args, "out", None)]
             if is_url(p)]
    if found and (args.command not in _URL_COMMANDS or (args.command == "export"
                                                         and getattr(args, "target", None) != "parquet")):
        raise UsageError(f"{found[0]}: {args.command} reads local files; fetch it first (URLs are read by "
                         f"{', '.join(sorted(_URL_COMMANDS - {'export'}))} and export parquet)")
    return bool(found)


def _run_on_copies(args: argparse.Namespace) -> int:
    """A command over s3:// or file:// URLs: each fetched into a private local folder first (removed after), what
    is printed naming the URL; ``export parquet ... s3://OUT`` writes locally, then uploads the whole export."""
    import tempfile

    from trainledger.cli.options import SHOWN_AS
    from trainledger.journal.backends.storage import is_url, localized, must_be_new, publish

    def shown(url: str, local: Path) -> None:
        SHOWN_AS.append((str(local), url))

    paths = list(getattr(args, "paths", None) or [])
    single = getattr(args, "path", None)
    out_url = getattr(args, "out", None) if is_url(getattr(args, "out", None)) else None
    if out_url is not None:
        must_be_new(out_url)
    try:
        with localized(([single] if single is not None else []) + paths, on_copy=shown) as local:
            if single is not None:
                args.path, local = local[0], local[1:]
            if paths:
                args.paths = local
            if out_url is None:
                return args.func(args)
            with tempfile.TemporaryDirectory(prefix="trainledger-out-") as d:
                args.out = str(Path(d) / "export")
                SHOWN_AS.append((args.out, out_url))
                code = args.func(args)
                if code == 0:
                    from trainledger.journal.views.parquet import LISTING

                    publish(args.out, out_url, last=LISTING)
                return code
    except (TrainledgerError, OSError) as e:  # printed by main once the copies are gone: named by the URL now
        from trainledger.cli.options import _as_shown

        e.args = tuple(_as_shown(a) if isinstance(a, str) else a for a in e.args)
        if isinstance(e, OSError) and isinstance(e.filename, str):
            e.filename = _as_shown(e.filename)
        if isinstance(getattr(e, "path", None), str):
            e.path = _as_shown(e.path)
        raise
    finally:
        SHOWN_AS.clear()


#: the commands that read one journal (or a run folder of rank journals) at ``args.path``
_ONE_JOURNAL = frozenset({"verify", "replay", "report", "show", "head", "tree-head", "checkpoint", "prove",
                          "consistency", "export"})


def _one_journal_of_folder(args: argparse.Namespace) -> None:
    """A run folder the project wrote with one journal in it (the ladder's ``ladder.jsonl``, the Recorder's
    ``journal.jsonl``) reads as that journal, and the command says which file it read (on stderr: stdout stays
    the result)."""
    from trainledger.journal.audit.rundir import run_journal

    path = getattr(args, "path", None)
    if args.command not in _ONE_JOURNAL or not isinstance(path, str) or "://" in path or not os.path.isdir(path):
        return
    from trainledger.journal.views.parquet import is_export

    if is_export(path):   # a Parquet export folder (verify OUT): read as itself
        return
    found = run_journal(path)
    if found is not None:
        say(f"trainledger {args.command}: reading {found}", file=sys.stderr)
        args.path = str(found)


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
    if args.command in _READERS:
        for p in [getattr(args, "path", None), *(getattr(args, "paths", None) or [])]:
            if isinstance(p, str) and p != "-" and os.path.exists(p):  # query's last argument is its SQL
                warn_private_keys(p)
    try:
        _one_journal_of_folder(args)
        if _urls_in(args):
            return _run_on_copies(args)
        return args.func(args)
    except TrainledgerError as e:  # the journal's, the training side's and the ladder's errors alike
        if _INTERRUPTED:  # Ctrl-C reached a library that turned it into an error of its own (DuckDB does)
            return _interrupted(args)
        return _failed(args, str(e), e.exit_code, getattr(e, "reason", None))
    except KeyboardInterrupt:
        return _interrupted(args)
    except BrokenPipeError:
        # `trainledger show ... | head`: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file or folder that cannot be read or written: an I/O error, one line, exit 2
        if _INTERRUPTED:
            return _interrupted(args)
        where = f"{e.filename}: " if e.filename else ""
        return _failed(args, f"{where}{e.strerror or e}", 2)
    except Exception:
        if _INTERRUPTED:  # any error after a Ctrl-C is the interrupt's: a library's wrapping of it, or its aftermath
            return _interrupted(args)
        raise


#: set once Ctrl-C reached the command (entry's handler): from then on any error a command ends with is the
#: interrupt's, told as one line and exit 130 (a library may catch the KeyboardInterrupt and raise its own error:
#: DuckDB reports "reading the schema of the object registered as 'events' failed: KeyboardInterrupt")
_INTERRUPTED: list[bool] = []


#: seconds a command has to end once Ctrl-C reached it; past them it is ended from a watchdog thread (journals
#: suspended first, exit 130): a KeyboardInterrupt that a library swallowed (one raised inside a ``__del__`` or a C
#: callback is only printed) or that lands in native code that never returns must never leave the command running
LOST_INTERRUPT_S = 10.0


def _on_sigint(signum: int, frame: Any) -> None:
    first = not _INTERRUPTED
    _INTERRUPTED.append(True)
    if not first:  # Ctrl-C again: the user insists
        _end_interrupted()
    import threading

    watchdog = threading.Timer(LOST_INTERRUPT_S, _end_interrupted)
    watchdog.daemon = True
    watchdog.start()
    raise KeyboardInterrupt


def _end_interrupted() -> None:
    """End the process now, exit 130: the journals still open sealed and suspended first (at most 5 s for that,
    in a thread of its own, since the main thread may hold one of them)."""
    import threading

    from trainledger.journal.writer import suspend_all

    t = threading.Thread(target=suspend_all, daemon=True)
    t.start()
    t.join(5.0)
    sys.stderr.write("trainledger: interrupted\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(130)


def _interrupted(args: argparse.Namespace) -> int:
    say(f"trainledger {args.command}: interrupted", file=sys.stderr)
    return 130


def _failed(args: argparse.Namespace, message: str, code: int, reason: str | None = None) -> int:
    """A command's error: one line on stderr, and with ``--json`` also one JSON object on stdout (a script reads
    stdout; ``reason``, an integrity failure's short tag, when it has one); returns the exit code."""
    say(f"trainledger {args.command}: error: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        say(json.dumps({"ok": False, "command": args.command, "error": message, "exit_code": code,
                        **({"reason": reason} if reason else {})}))
    return code


def entry(main=main) -> None:
    """A console script's body: ``main()``, and after Ctrl-C an immediate exit.

    Ctrl-C can arrive while DuckDB or a verifier still runs native threads (a query's load, its SQL); letting
    the interpreter finalise around them can abort the process. Journals still open are sealed first.
    """
    import signal

    # SIGINT that came ignored (``nohup``, ``CMD &`` in a script) stays ignored, to the end
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    try:
        if not ignored:  # armed inside the block that catches it
            signal.signal(signal.SIGINT, _on_sigint)
        code = main()
    except BaseException as e:  # before a command's own handling (its arguments still being parsed), or after
        if not (isinstance(e, KeyboardInterrupt) or _INTERRUPTED):
            raise
        say("trainledger: interrupted", file=sys.stderr)
        code = 130
    if code == 130:
        from trainledger.journal.writer import suspend_all

        suspend_all()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    if not ignored:
        signal.signal(signal.SIGINT, _exit_interrupted)  # a Ctrl-C while the interpreter shuts down: exit 130, no trace
    sys.exit(code)


def _exit_interrupted(*_: object) -> None:
    sys.stderr.write("trainledger: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":  # pragma: no cover - `python -m trainledger.cli.journal`: the journal's commands
    entry()
