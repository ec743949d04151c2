"""What every ``trainledger`` command shares: exit codes, one-line output, progress, the trust options, the
verify report's printout. Each package's ``cli`` module builds on it; nothing here imports a command."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from trainledger.journal.roster import load_roster
from trainledger.journal.errors import UsageError
from trainledger.journal.keys import TRUSTED_KEYS_ENV, trusted_keys
from trainledger.journal.text import safe
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import VerifyReport, verify

__all__ = ["EPILOG", "PATH_HELP", "say", "say_failed", "Progress", "progress_for", "add_json_option",
           "add_progress_option", "add_trust_options", "add_partial_option",
           "refuse_partial", "partial_line", "trust_policy", "verify_from_args", "print_report", "fmt_int",
           "imported_line", "write_out"]


def write_out(path: Any, data: bytes) -> None:
    """A command's ``--out`` file, whole or not at all, never written through a link planted at its name
    (:func:`trainledger.journal.paths.write_atomically`); a folder, a missing parent or a failed write is a
    :class:`UsageError` naming the file."""
    from pathlib import Path

    from trainledger.journal.paths import write_atomically

    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{out}: is a folder; give a file name")
    if not out.parent.is_dir():
        raise UsageError(f"{out}: cannot write: {out.parent} is not a folder")
    try:
        write_atomically(out, data)
    except OSError as e:
        raise UsageError(f"{out}: cannot write: {e.strerror or e}") from None

EPILOG = """exit codes: 0 ok, 1 integrity failure (the journal does not verify, or
what it or a checkpoint says cannot hold), 2 usage or I/O error, 130 Ctrl-C;
watch also 3 at --timeout. Keys can be pinned once for a team in a file named by
$%s (one public key per line).""" % TRUSTED_KEYS_ENV


#: what a reading command's PATH may be (src/trainledger/cli/journal.py reads a run folder's one journal for it)
PATH_HELP = ("a journal, a run folder holding one (ladder.jsonl, journal.jsonl), or a distributed run's folder of "
             "rank-NNNNN.jsonl")


#: (a private local copy's path, the URL it was fetched from): what is printed names the URL (journal/backends/storage.py)
SHOWN_AS: list[tuple[str, str]] = []


def usage(p: argparse.ArgumentParser) -> int:
    """A command group run without its action: its help on stderr, exit 2."""
    p.print_help(sys.stderr)
    return 2


def say(*values: object, file=None, end: str = "\n", flush: bool = False) -> None:
    """Print one line. Every value is passed through :func:`trainledger.journal.text.safe`: whatever a journal or a
    manifest put in a run id, a reason or a path shows as visible escapes, never as terminal control."""
    if SHOWN_AS:
        values = tuple(_as_shown(v) if isinstance(v, str) else v for v in values)
    print(*(safe(v) for v in values), file=file, end=end, flush=flush)


def _as_shown(text: str) -> str:
    for local, url in SHOWN_AS:
        text = text.replace(local, url)
    return text


class Progress:
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


def progress_for(args: argparse.Namespace, label: str) -> Progress | None:
    if getattr(args, "json", False) or getattr(args, "no_progress", False) or not sys.stderr.isatty():
        return None
    return Progress(label)


def add_json_option(p: argparse.ArgumentParser) -> None:
    """The shared machine-readable output switch: one JSON object on stdout, on success and on failure alike
    (``"ok": false`` and the error; the exit code is the documented one either way)."""
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (with \"ok\": false and the error when it fails)")


def add_progress_option(p: argparse.ArgumentParser) -> None:
    """The shared switch for the progress bar a command draws on a terminal's stderr while it reads."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")


def say_failed(args: argparse.Namespace, e: Any, path: str, *, file=None) -> int:
    """An integrity failure, as the command prints it: with ``--json`` one JSON object on stdout, else the one
    ``FAIL`` line (on ``file``). Returns 1, the exit code of every integrity failure."""
    import json

    if getattr(args, "json", False):
        say(json.dumps({"ok": False, "path": str(path), "first_bad_seq": getattr(e, "seq", None),
                        "byte": getattr(e, "offset", None), "error": str(e)}))
    else:
        say(e.fail_line(str(path)), file=file)
    return 1


def add_pubkey_option(p: Any) -> None:
    """``--pubkey FILE``, repeatable, the pinned keys (a parser or an argument group)."""
    p.add_argument("--pubkey", action="append", default=[], metavar="FILE",
                   help=f"pinned public key (repeatable); also read from ${TRUSTED_KEYS_ENV}")


def add_trust_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trust")
    add_pubkey_option(g)
    g.add_argument("--trust-embedded", action="store_true",
                   help="check against the key embedded in the journal (integrity only: authenticity not established)")
    g.add_argument("--allow-unsigned", action="store_true", help="accept a journal that carries no signatures")
    g.add_argument("--roster", metavar="FILE",
                   help="which key signs which rank of a run folder: lines 'RANKS KEY' (a rank, FIRST-LAST or *; a "
                        "key id or a public key line); every rank is held to its key (docs/distributed.md)")
    g.add_argument("--allow-unsealed", action="store_true",
                   help="accept a signed journal whose last events no seal covers (a live or crashed run): only "
                        "the signed prefix is verified and used; the rest is counted and left out")


def add_partial_option(p: argparse.ArgumentParser) -> None:
    """The shared opt-in to reading a run folder with ranks missing (journal.audit.rundir's ``partial``)."""
    p.add_argument("--partial", action="store_true",
                   help="read a run folder with ranks missing: every rank present is still checked (anchors, run, "
                        "keys), the missing ones are named, and what is shown says PARTIAL")


def refuse_partial(args: argparse.Namespace) -> None:
    """``--partial`` given for one journal (it is about a run folder's missing ranks): a usage error."""
    if getattr(args, "partial", False):
        raise UsageError(f"{args.path}: --partial reads a run folder with ranks missing; this is one journal")


def partial_line(folder: str, missing: list[int]) -> str:
    """The label a partial view carries, wherever it is shown."""
    shown = ", ".join(map(str, missing[:20])) + (f" and {len(missing) - 20:,} more" if len(missing) > 20 else "")
    return (f"PARTIAL: {folder} lacks rank(s) {shown}; what follows covers only the ranks present, and nothing "
            "checks that the missing ones agree")


def verify_from_args(args: argparse.Namespace, *, label: str = "verifying", **extra) -> VerifyReport:
    """Verify ``args.path`` under the command's trust options (``extra``: verify's other keywords, or fields of
    the policy on top), with a progress bar on a terminal."""
    progress = progress_for(args, label)
    try:
        return verify(args.path, trust=trust_policy(args), progress=progress, **extra)
    finally:
        if progress is not None:
            progress.close()


def trust_policy(args: argparse.Namespace) -> TrustPolicy:
    """The :class:`TrustPolicy` the shared trust options (:func:`add_trust_options`) describe; a command without
    them (``show``) trusts no key."""
    roster = getattr(args, "roster", None)
    return TrustPolicy(keys=trusted_keys(args.pubkey) if hasattr(args, "pubkey") else (),
                       roster=None if roster is None else load_roster(roster),
                       trust_embedded=getattr(args, "trust_embedded", False),
                       allow_unsigned=getattr(args, "allow_unsigned", False),
                       allow_unsealed=getattr(args, "allow_unsealed", False))


def fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def imported_line(imp: dict[str, Any]) -> str:
    files = imp.get("files") if isinstance(imp.get("files"), list) else []
    return (f"from {len(files)} {imp.get('tool')} file(s) by {imp.get('by')} at {imp.get('at')}: it attests what "
            "those files said then, not that the run happened")


def print_report(r: VerifyReport, *, title: str) -> None:
    trust = {"pinned": "pinned", "embedded": "embedded key only: authenticity NOT established",
             "unsigned": "unsigned", "unchecked": "signatures not checked"}.get(r.trust or "", r.trust)
    tail = r.tail or "-"
    if r.tail == "open":
        tail += f" ({fmt_int(r.unsealed_events)} events after the last seal)"
    elif r.tail == "torn":
        tail += f" ({r.torn_bytes} bytes after the last complete line at byte {r.torn_offset})"
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.created_ns / 1e9)) if r.created_ns else "-"
    say(f"{title}  {r.path}")
    say(f"  run       {r.run_id}")
    if r.imported is not None:
        say(f"  IMPORTED  {imported_line(r.imported)}")
    say(f"  key       {r.key_id or '-'} ({trust})")
    say(f"  created   {created}")
    say(f"  events    {fmt_int(r.events)} in {r.bytes:,} bytes ({fmt_int(r.seals)} seals)")
    for kind, n in sorted(r.kinds.items(), key=lambda kv: (-kv[1], kv[0])):
        say(f"    {kind:<22} {n:>12,}")
    say(f"  tail      {tail}")
    say(f"  head      {r.head or '-'}  (latest sealed)")
    if r.last_tree_root is not None and r.last_sealed_seq is not None:
        import base64

        root = base64.b64encode(bytes.fromhex(r.last_tree_root)).decode()
        say(f"  tree      {r.last_sealed_seq + 1:,} lines, root {root}  (the latest seal's; 'trainledger tree-head' "
            "prints it signed)")
    if r.unsealed_events and r.trust in ("pinned", "embedded"):
        say(f"  UNSIGNED  {r.unsealed_events:,} events after seq {r.trusted_last_seq} are NOT signed: "
              "not verified, left out")
    for note in r.notes:
        say(f"  note: {note}")
