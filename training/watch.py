"""trainledger watch: follow a journal while a run writes it, with a live summary.

Reads complete lines as they are appended (a torn last line waits for its
newline), checks each against the chain and every seal's signature under the
pinned key (with no key pinned: the chain only, and the view says so; the
same trust options as ``verify``), folds steps and anomalies through
the health projection, and redraws: step, loss, grad norm, tokens/s, MFU,
last anomaly, last checkpoint, events not signed yet. Exits when the run closes (0), on
Ctrl-C (130), or at the first line that does not check out (1, with the
same one-line FAIL as ``verify``). On a terminal the view redraws in place; otherwise it prints
one line per refresh.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from trainledger.journal.follow import Follower
from trainledger.journal.text import did_you_mean, missing_path_note, safe
from trainledger.journal.errors import IntegrityError, JournalError
from trainledger.journal.events import RunClosed, Seal, SealSigned, StepObserved
from trainledger.training.health.detectors import AnomalyDetected, HealthProjection, RunConfigured
from trainledger.journal.keys import PublicKey
from trainledger.journal.trust import TrustPolicy
from trainledger.training.kinds import CheckpointSaved, ShardsSaved, StragglerDetected
from trainledger.journal.kinds import RankJoined
from trainledger.journal.verify import open_checked, read_opening

__all__ = ["watch"]


class _View:
    def __init__(self, trust: str = "") -> None:
        self.trust = trust
        self.proj = HealthProjection()
        self.step: StepObserved | None = None
        self.anomaly: AnomalyDetected | None = None
        self.checkpoint: CheckpointSaved | None = None
        self.events = 0
        self.last_seal_seq = -1
        self.last_seq = -1
        self.closed = False
        self.world = 0
        self.stragglers: list[Any] = []
        self.shards: Any = None

    def apply(self, ev: Any) -> None:
        self.events += 1
        self.last_seq = ev.seq
        if isinstance(ev, RunConfigured):
            self.proj = HealthProjection(ev)
        elif isinstance(ev, StepObserved):
            self.step = ev
            self.proj.apply(ev)
        elif isinstance(ev, AnomalyDetected):
            self.anomaly = ev
        elif isinstance(ev, CheckpointSaved):
            self.checkpoint = ev
        elif isinstance(ev, Seal):
            if ev.sig is not None or ev.key_id is None:  # a seal signed late signs when its seal_signed comes
                self.last_seal_seq = ev.seq
        elif isinstance(ev, SealSigned):
            self.last_seal_seq = ev.seal_seq
        elif isinstance(ev, RunClosed):
            self.closed = True
        elif isinstance(ev, RankJoined):
            self.world = ev.world_size
        elif isinstance(ev, StragglerDetected):
            self.stragglers.append(ev)
        elif isinstance(ev, ShardsSaved):
            self.shards = ev
        else:
            self.proj.apply(ev)

    def rank_line(self, rank: int) -> str:
        s = self.step
        own = None if s is None else (s.compute_time_s if s.compute_time_s is not None else s.step_time_s)
        c = self.shards or self.checkpoint
        return (f"  rank {rank:<4} " + ("no steps yet" if s is None else
                                        f"step {s.step}  loss {s.loss:.4f}  own step time "
                                        f"{'-' if own is None else f'{own * 1e3:.2f} ms'}")
                + f"  anomalies {len(self.proj.anomalies)}"
                + f"  checkpoint {'none' if c is None else c.step}"
                + f"  not signed yet {max(0, self.last_seq - self.last_seal_seq)}"
                + ("  closed" if self.closed else ""))

    def state(self) -> dict[str, Any]:
        """What the view shows, as data (``watch --json``): numbers as numbers, None where there is none yet."""
        r = self.proj.report()
        s, a, c = self.step, self.anomaly, self.shards or self.checkpoint
        return {
            "events": self.events, "closed": self.closed, "trust": self.trust,
            "step": None if s is None else s.step, "loss": None if s is None else s.loss,
            "grad_norm": None if s is None else s.grad_norm, "tokens_per_s": r["tokens_per_s"],
            "mfu": r["mfu"]["mean"], "anomalies": len(self.proj.anomalies),
            "last_anomaly": None if a is None else {"kind": a.kind, "step": a.step, "z": a.z_score},
            "last_checkpoint": None if c is None else {"step": c.step, "path": getattr(c, "path", None)},
            "not_signed_yet": max(0, self.last_seq - self.last_seal_seq),
        }

    def lines(self, path: Path) -> list[str]:
        r = self.proj.report()
        s = self.step
        mfu = r["mfu"]["mean"]
        out = [f"trainledger watch  {path}  ({self.events:,} events{', closed' if self.closed else ''}; "
               f"{self.trust})"]
        if s is None:
            out.append("  no steps yet")
        else:
            gn = "-" if s.grad_norm is None else f"{s.grad_norm:.4g}"
            tps = r["tokens_per_s"]
            out.append(f"  step {s.step}  loss {s.loss:.4f}  grad norm {gn}  tokens/s "
                       f"{'-' if tps is None else f'{tps:,.0f}'}  MFU {'-' if mfu is None else f'{mfu:.3%}'}")
        a = self.anomaly
        out.append("  last anomaly: " + ("none" if a is None else f"{a.kind} at step {a.step} (z {a.z_score})"))
        c = self.checkpoint
        out.append("  last checkpoint: " + ("none" if c is None else f"step {c.step} {c.path}"))
        out.append(f"  not signed yet: {max(0, self.last_seq - self.last_seal_seq)} events after the last seal")
        return out


def _context(p: Path, keys: Sequence[PublicKey], trust_embedded: bool,
             allow_unsigned: bool) -> tuple[Follower, str] | str:
    """The follower (journal.follow: keys resolved as verify resolves them) and trust label for ``p``, or the FAIL
    line when it may not be followed."""
    opened, _ = read_opening(p, open_checked(p))
    check = bool(keys or trust_embedded or opened.key_id is None)
    follower = Follower(p, keys=keys, trust_embedded=trust_embedded, check_signatures=check)
    if not check:
        return follower, "chain checked, signatures NOT checked: pass --pubkey"
    signing = follower.signing
    if signing.trust == "unsigned" and not allow_unsigned:
        return f"FAIL  {p}: the journal is unsigned (pass --allow-unsigned to follow it anyway)"
    label = {"pinned": f"signatures checked: key {signing.key_id}, pinned",
             "embedded": f"signatures checked against the embedded key {signing.key_id}: authenticity not "
                         "established", "unsigned": "unsigned journal: chain only"}[signing.trust]
    return follower, label


def watch(path: str | Path, *, interval: float = 0.5, out: TextIO | None = None, timeout: float | None = None,
          trust: TrustPolicy | None = None, json: bool = False, wait: bool | None = None,
          **trust_options: Any) -> int:
    """Follow ``path`` until the run closes (return 0), Ctrl-C (130), ``timeout`` seconds (3) or a line that
    does not check out (1). With the policy's ``keys`` (or ``trust_embedded``) every seal's signature is checked
    too; events after the last seal are shown as not signed yet (a live run always has some).
    ``path`` may be a distributed run's folder: every rank journal is followed, one line per rank, until all close.
    ``json``: instead of the view, one JSON object on ``out`` each time what it shows changes (JSON lines: the
    ``_View.state`` fields, ``path``, and for a folder ``ranks``), a failure as one object with ``"ok": false``
    (as ``verify --json`` prints it), and every other line on stderr.
    ``wait``: a ``path`` that does not exist yet is waited for (True), refused with exit 2 (False), or, by default,
    waited for with a deprecation note that says it does not exist (a later release refuses it)."""
    policy = TrustPolicy.of(trust, **trust_options)
    keys, trust_embedded, allow_unsigned = policy.keys, policy.trust_embedded, policy.allow_unsigned
    from trainledger.journal.audit.rundir import is_run_dir, run_journal
    from trainledger.journal.errors import UsageError

    out = sys.stdout if out is None else out  # looked up now: a caller may have redirected it
    shown = _Shown(out, json)
    p = Path(path)
    deadline = None if timeout is None else time.monotonic() + timeout

    def nap() -> bool:
        """Sleep one interval, never past the deadline; False once the deadline has passed."""
        if deadline is None:
            time.sleep(interval)
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval, left))
        return True

    if not p.exists() and not p.parent.is_dir():   # a misspelt path would otherwise be waited for forever
        return shown.fail(p, f"no such folder {p.parent} to wait in", 2)
    if not p.exists() and wait is False:
        return shown.fail(p, "no such file or folder" + did_you_mean(p), 2)
    if not p.exists():
        sys.stderr.write(missing_path_note(p, asked=bool(wait)) + "\n")
    elif p.is_dir() and not any(p.glob("*.jsonl")):
        sys.stderr.write(safe(f"waiting for {p} to hold a journal (Ctrl-C to stop)") + "\n")
    reading = [p]  # the file being read when a line fails to check out (a run folder has one per rank)
    try:
        while p.is_dir() and not is_run_dir(p):   # a folder: its rank journals, or its one journal
            try:
                one = run_journal(p)
            except UsageError as e:
                if "no journal in it" not in str(e):
                    return shown.fail(p, str(e), 2, prefixed=True)
                if not nap():                     # an empty folder: the run has not written yet
                    return 3
                continue
            p = one
            reading[0] = p
        if p.is_dir():
            return _watch_run_dir(p, nap, shown, policy, reading)
        while not _has_first_line(p):  # the writer may not have created the file yet
            if not nap():
                return 3
        got = _context(p, keys, trust_embedded, allow_unsigned)
        if isinstance(got, str):
            return shown.fail(p, got, 1, prefixed=True)
        followed, label = got
        shown.info(f"watching {p} ({label})")
        follower = _Watched(followed, label)
        while True:
            note = follower.read_new()
            if note:
                shown.note(note)
            shown.view(follower.view.lines(p), {"path": str(p), **follower.view.state()})
            if follower.view.closed:
                return 0
            if not nap():
                return 3
    except KeyboardInterrupt:
        return 130
    except IntegrityError as e:
        return shown.failed(e, reading[0])


class _Shown:
    """Where the watch writes: the view (redrawn in place on a terminal, a line a refresh otherwise) and its
    notes and failures on ``out``; with ``json``, one JSON object a change on ``out`` and the rest on stderr."""

    def __init__(self, out: TextIO, json: bool) -> None:
        self.out, self.json = out, json
        self.tty = not json and out.isatty()
        self.drawn = 0
        self.last: str | None = None

    def info(self, line: str) -> None:
        """A line about what is watched (not on a terminal's view; on stderr with --json)."""
        if self.json:
            sys.stderr.write(safe(line) + "\n")
        elif not self.tty:
            self.out.write(safe(line) + "\n")

    def note(self, line: str) -> None:
        if self.json:
            sys.stderr.write(safe(line) + "\n")
        else:
            self.out.write(safe(line) + "\n")
            self.drawn = 0

    def view(self, text: list[str], state: dict[str, Any]) -> None:
        out = self.out
        if self.json:
            import json

            line = json.dumps(_nan_to_str(state), allow_nan=False, default=str)
            if line != self.last:  # one object a change, not a refresh
                self.last = line
                out.write(line + "\n")
                out.flush()
            return
        text = [safe(x) for x in text]  # journal strings never reach the terminal raw
        if self.tty:
            out.write(("\x1b[F\x1b[2K" * self.drawn) + "\n".join(text) + "\n")
            self.drawn = len(text)
        else:
            out.write(" | ".join(x.strip() for x in text[1:]) + "\n")
        out.flush()

    def fail(self, p: Path, message: str, code: int, *, prefixed: bool = False) -> int:
        """A failure that is not a line's (``message`` already a ``FAIL  ...`` line when ``prefixed``)."""
        if self.json:
            import json

            text = message[len("FAIL  "):] if prefixed and message.startswith("FAIL  ") else message
            self.out.write(json.dumps({"ok": False, "path": str(p), "error": text, "exit_code": code}) + "\n")
        else:
            self.out.write(safe(message if prefixed else f"FAIL  {p}: {message}") + "\n")
        self.out.flush()
        return code

    def failed(self, e: IntegrityError, p: Path) -> int:
        """A line that does not check out: the one FAIL line verify prints, or its JSON object."""
        if self.json:
            import json

            self.out.write(json.dumps({"ok": False, "path": str(p), "first_bad_seq": e.seq,
                                       "byte": getattr(e, "offset", None), "error": str(e), "exit_code": 1}) + "\n")
        else:
            self.out.write(safe(e.fail_line(str(p))) + "\n")
        self.out.flush()
        return 1


def _finite(state: Any) -> bool:
    if isinstance(state, float):
        return state == state and state not in (float("inf"), float("-inf"))
    if isinstance(state, dict):
        return all(_finite(v) for v in state.values())
    if isinstance(state, list):
        return all(_finite(v) for v in state)
    return True


def _nan_to_str(state: Any) -> Any:
    """NaN and the infinities as the journal spells them ("NaN", "Infinity", "-Infinity"): JSON has no number for
    them."""
    if isinstance(state, float) and not _finite(state):
        return "NaN" if state != state else ("Infinity" if state > 0 else "-Infinity")
    if isinstance(state, dict):
        return {k: _nan_to_str(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_nan_to_str(v) for v in state]
    return state


def _watch_run_dir(d: Path, nap, shown: _Shown, policy: TrustPolicy, reading: list[Path]) -> int:
    """Follow every ``rank-NNNNN.jsonl`` in ``d`` (ranks that appear later too) until every rank has closed;
    ``reading[0]`` names the file being read, for :func:`watch`'s one-line FAIL. Each rank is held to the folder's
    run (its run id ``RUN.rNNNNN``, rank 0's ``RUN``) and to the roster as soon as it appears; once every rank has
    closed, the folder is checked whole (``verify RUN_DIR``'s check) before the watch says so."""
    from trainledger.journal.audit.rundir import rank_files, split_run_id, verify_run_dir

    followers: dict[int, _Watched] = {}
    run: str | None = None
    while True:
        for r, f in rank_files(d).items():
            if r not in followers and _has_first_line(f):
                reading[0] = f
                got = _context(f, policy.keys, policy.trust_embedded, policy.allow_unsigned)
                if isinstance(got, str):
                    return shown.fail(f, got, 1, prefixed=True)
                opened = got[0].opened
                split = split_run_id(opened.run_id)
                if split is None or split[1] != r or (run is not None and split[0] != run):
                    return shown.fail(f, f"its run id {opened.run_id!r} is not this folder's rank {r} "
                                         f"({run or 'RUN'}.r{r:05d}): a journal of another run (or rank)", 1)
                run = run or split[0]
                if policy.roster is not None:
                    policy.roster.hold(r, opened.key_id)
                followers[r] = _Watched(*got)
                shown.info(f"watching rank {r}: {f} ({got[1]})")
        for r, fo in sorted(followers.items()):
            reading[0] = fo.p
            note = fo.read_new()
            if note:
                shown.note(f"rank {r}: {note}")
        world = max((fo.view.world for fo in followers.values()), default=0)
        done = bool(followers) and all(fo.view.closed for fo in followers.values()) and len(followers) >= world
        text = [f"trainledger watch  {d}  ({len(followers)} of {max(world, len(followers))} ranks"
                f"{', all closed' if done else ''})"]
        text += [fo.view.rank_line(r) for r, fo in sorted(followers.items())]
        flagged = [x for fo in followers.values() for x in fo.view.stragglers]
        text.append("  stragglers: " + ("none flagged" if not flagged else "; ".join(
            f"rank {x.rank} score {x.score:.2f} steps {x.window_start}-{x.window_end}" for x in flagged[-3:])))
        shown.view(text, {"path": str(d), "world": max(world, len(followers)), "closed": done,
                          "ranks": [{"rank": r, **fo.view.state()} for r, fo in sorted(followers.items())],
                          "stragglers": [{"rank": x.rank, "score": x.score, "window_start": x.window_start,
                                          "window_end": x.window_end} for x in flagged]})
        if done:
            reading[0] = d
            verify_run_dir(d, trust=policy)  # what verify RUN_DIR says, or its one-line FAIL
            return 0
        if not nap():
            return 3


def _has_first_line(p: Path) -> bool:
    try:
        if open_checked(p) == 0:
            return False
        with open(p, "rb") as f:
            return b"\n" in f.read(1 << 20)
    except JournalError:  # not there yet (or not readable yet): keep waiting, like tail -F
        return False


class _Watched:
    """A journal followed (:class:`~trainledger.journal.follow.Follower`: a block at a time, so memory stays flat
    in journal size) and folded into its view."""

    def __init__(self, follower: Follower, label: str) -> None:
        self.follower, self.label, self.p = follower, label, follower.path
        self.view = _View(label)

    def read_new(self) -> str | None:
        """Fold every complete line appended since the last call; a note when the file was cut meanwhile."""
        note = None
        if self.follower.read_new(self._apply):
            # open_append cut a torn line, or unsigned events, off the end (an honest crash and repair), or someone
            # rewrote the file: either way what was read no longer stands. Read it again.
            note = f"{self.p}: the journal was cut back and rewritten (a crash repaired?): reading it again"
            self.follower.restart()
            self.view = _View(self.label)
            self.follower.read_new(self._apply)
        return note

    def _apply(self, recs: list[Any], at: list[tuple[int, int]]) -> None:
        for ev in recs:
            self.view.apply(ev)
