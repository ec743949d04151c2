"""Many runs on one page: ``trainledger serve DIR...`` where each DIR is a run or holds runs (the way TensorBoard takes
a log folder). A :class:`Fleet` keeps one :class:`~.board.Board` per run (each verified on its own: a run that fails
is a FAIL row and never a curve), finds runs that appear under the folders while it serves, and answers the page's
run table: each run's name, run id, key, verdict, steps, last seal, status, final and best loss, and the settings
that differ between runs.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trainledger.journal.audit.rundir import JOURNAL_NAMES, is_run_dir
from trainledger.journal.errors import JournalError, TrainledgerError, UnsafePath, UsageError
from trainledger.journal.trust import TrustPolicy
from trainledger.serve.board import Board, open_database

__all__ = ["Fleet", "find_runs", "RESCAN_S", "MAX_RUNS", "MEMORY_LIMIT"]

#: how often the folders are looked through again for runs that appeared
RESCAN_S = 2.0
#: the most runs one page follows
MAX_RUNS = 256
#: DuckDB's memory for every run's tables together (one database, a schema a run; spilling to disk past it)
MEMORY_LIMIT = "256MB"
_DEPTH = 4


def _is_run(p: Path) -> bool:
    """A journal file, a distributed run's folder, or a folder holding a run's one journal."""
    if p.is_file():
        return p.suffix == ".jsonl" and not p.is_symlink()
    if not p.is_dir():
        return False
    try:
        if is_run_dir(p):
            return True
    except UnsafePath:  # a rank file linked out of the folder: a run, shown as a FAIL row, never read
        return True
    return any((p / n).is_file() and not (p / n).is_symlink() for n in JOURNAL_NAMES)


def find_runs(roots: list[Path]) -> dict[str, Path]:
    """Every run a root is or holds, by name: a root that is a run keeps the name it was given; a run folder below a
    root is named by its path relative to that root. Folders are searched at most four levels deep, links are not
    followed, a run folder is not searched inside, and a loose ``*.jsonl`` beside run folders is not a run (name it
    to serve it)."""
    out: dict[str, Path] = {}
    for root in roots:
        if _is_run(root):
            out.setdefault(str(root), root)
            continue
        if not root.is_dir():
            continue
        todo = [(root, 0)]
        while todo and len(out) < MAX_RUNS:
            d, depth = todo.pop(0)
            try:
                kids = sorted(d.iterdir())
            except OSError:
                continue
            for k in kids:
                if k.is_symlink() or not k.is_dir():  # a loose journal in a folder of runs is no run: name it
                    continue
                if _is_run(k):
                    out.setdefault(str(k.relative_to(root)), k)
                elif k.is_dir() and depth + 1 < _DEPTH:
                    todo.append((k, depth + 1))
    return dict(sorted(out.items()))


class Fleet:
    """The boards of every run under ``roots``; thread-safe as a Board is (one follower polls, requests read)."""

    def __init__(self, roots: list[str | Path], trust: TrustPolicy, *, memory_limit: str | None = None,
                 boards: dict[str, Board] | None = None, progress: Any = None) -> None:
        self.roots = [Path(r) for r in roots]
        self.trust = trust
        self.lock = threading.RLock()
        self.boards: dict[str, Board] = dict(boards or {})
        #: runs that could not be opened at all (not a journal, unreadable): name -> why
        self.unopened: dict[str, str] = {}
        self.memory_limit = memory_limit or MEMORY_LIMIT
        self.progress = progress
        #: one database for every run found here (boards given are kept as they are): one memory limit for all
        self._private: Path | None = None
        self._db: Any = None
        self._bumps = 0
        self._scanned = 0.0
        #: each run's row as of its board's version: the table is asked for at every change of any run
        self._rows: dict[str, tuple[int, dict[str, Any]]] = {}
        #: a page's cursor into the run table: grows when a row is made again; each row's value of it then
        self._tick = 0
        self._stamps: dict[str, int] = {}
        self._differ: list[str] = []
        self._differ_tick = 0
        if boards is None:
            self.scan()
            if not self.boards and not self.unopened:
                raise UsageError(f"{', '.join(map(str, self.roots))}: no journal or run folder here")

    @property
    def version(self) -> int:
        with self.lock:
            return self._bumps + sum(b.version for b in self.boards.values())

    def scan(self) -> bool:
        """Open the runs that appeared since the last look; whether there was one."""
        found = find_runs(self.roots)
        new = False
        for name, path in found.items():
            with self.lock:
                if name in self.boards or name in self.unopened or len(self.boards) >= MAX_RUNS:
                    continue
            if self._db is None:
                self._private = Path(tempfile.mkdtemp(prefix="trainledger-serve-runs-"))
                self._db = open_database(self._private, self.memory_limit)
            try:
                b = Board(path, trust=self.trust, database=self._db)
            except (JournalError, UsageError) as e:
                with self.lock:
                    self.unopened[name] = str(e)
                    self._bumps += 1
                    self._tick += 1
                new = True
                continue
            b.progress = self.progress
            try:
                b.poll()
            except TrainledgerError as e:
                b.close(helpers=False)  # the other boards' replays share them
                with self.lock:
                    self.unopened[name] = str(e)
                    self._bumps += 1
                    self._tick += 1
                new = True
                continue
            finally:
                b.progress = None
            self._row(name, b)
            with self.lock:
                self.boards[name] = b
                self._bumps += 1
                self._tick += 1
            new = True
        self._scanned = time.monotonic()
        return new

    def _row(self, name: str, b: Board) -> dict[str, Any]:
        """``name``'s row of the run table as of its board's version (made again once that has changed)."""
        v = b.version
        got = self._rows.get(name)
        if got is None or got[0] != v:
            got = (v, _row(name, b))
            with self.lock:
                self._rows[name] = got
                self._tick += 1
                self._stamps[name] = self._tick
        return got[1]

    def poll(self) -> bool:
        changed = False
        for name, b in list(self.boards.items()):
            if b.poll():
                changed = True
                self._row(name, b)  # here, in the follower: the page's requests find the table made
        if time.monotonic() - self._scanned >= RESCAN_S:
            changed |= self.scan()
        return changed

    def replay_due(self) -> bool:
        return any(b.replay_due() for b in list(self.boards.values()))

    def run_replay(self) -> None:
        """Replay the first run that is due (one at a time: each is a child process at low priority)."""
        for b in list(self.boards.values()):
            if b.replay_due():
                b.run_replay()
                return

    def board(self, name: str | None) -> Board:
        """The run ``name`` (None: the first)."""
        with self.lock:
            if name is None or name == "":
                if not self.boards:
                    raise UsageError("no run has been read yet")
                return next(iter(self.boards.values()))
            b = self.boards.get(name)
        if b is None:
            raise UsageError(f"no such run {name[:200]!r}")
        return b

    def runs_since(self, since: int | None) -> dict[str, Any]:
        """The run table for a page that has it as of cursor ``since``: only the rows made again after it
        (``"partial": true``, with every run's name), when the settings that differ between runs are the same as
        then; else every row. Its ``cursor`` for the next time."""
        rows = self.runs()
        differ = sorted({k for r in rows for k in r.get("differs", {})})
        with self.lock:
            if differ != self._differ:  # a column of the table came or went: every row is sent again
                self._differ = differ
                self._tick += 1
                self._differ_tick = self._tick
            cursor, stamps, whole_after = self._tick, dict(self._stamps), self._differ_tick
        if since is not None and whole_after <= since <= cursor:
            return {"rows": [r for r in rows if stamps.get(r["name"], cursor) > since], "partial": True,
                    "names": [r["name"] for r in rows], "cursor": cursor}
        return {"rows": rows, "partial": False, "cursor": cursor}

    def runs(self) -> list[dict[str, Any]]:
        """The run table: a row per run (a FAIL row for one that does not verify), and which settings differ."""
        rows = []
        with self.lock:
            boards = list(self.boards.items())
            unopened = list(self.unopened.items())
        for name, b in boards:
            rows.append(dict(self._row(name, b)))
        for name, why in unopened:
            rows.append({"name": name, "fail": why, "status": "FAIL"})
        settings = [r.get("settings", {}) for r in rows if "settings" in r]
        keys = sorted({k for s in settings for k in s})
        differ = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]
        for r in rows:
            r["differs"] = {k: r.get("settings", {}).get(k) for k in differ} if "settings" in r else {}
        return rows

    def close(self) -> None:
        """Close every board, then stop the multiprocessing helpers their replays share, once."""
        from trainledger.serve.board import _stop_pool

        for b in list(self.boards.values()):
            b.close(helpers=False)
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
        _stop_pool(None)


def _row(name: str, b: Board) -> dict[str, Any]:
    """One run's row of the table."""
    with b.lock:
        if b.fail is not None:
            return {"name": name, "fail": b.fail, "status": "FAIL", "path": str(b.path)}
        js = list(b.journals.values())
        steps, last, final, best = b.con.execute(
            "SELECT count(*), max(step), arg_max(loss, seq) FILTER (WHERE isfinite(loss)), "
            "min(loss) FILTER (WHERE isfinite(loss)) FROM steps").fetchall()[0]
        seg = b.con.execute("SELECT fpt, peak, seq_len FROM segs ORDER BY segment DESC LIMIT 1").fetchall()
        config = b.config()
    closed = bool(js) and all(j.closed for j in js)
    fpt, peak, seq_len = seg[0] if seg else (None, None, None)
    return {"name": name, "path": str(b.path), "fail": None, "data_version": b.data_version,
            "run_id": b.run or (js[0].run_id if js else None),
            "key_id": js[0].key_id if js else None, "journals": len(js), "steps": steps, "last_step": last,
            "last_seal": max((j.follower.last_seal_seq for j in js if j.follower.last_seal_seq is not None),
                             default=None),
            "status": "closed" if closed else "live", "final_loss": final,
            "best_loss": best, "unsigned": sum(len(j.pending) for j in js),
            "settings": {"ranks": len(js) if b.is_run_dir else None, "flops_per_token": fpt, "peak_flops": peak,
                         "seq_len": seq_len, **{f"config.{k}": v for k, v in config.items()}}}
