"""What ``trainledger serve`` shows, kept current as the journals grow: only what verifies.

A :class:`Board` follows one journal or every rank journal of a run folder. Each journal is read from where the last
read stopped, complete lines only, and checked line by line as ``verify`` checks it (the chain, the seqs, the Merkle
tree, each seal's signature under the pinned key): the same :class:`~trainledger.journal.scan.Scanner` ``watch``
uses. An event reaches the board's tables only once a seal covering it has checked out; the events past the last
seal are kept apart, for the page to draw as "not signed yet". A line that does not check out fails the board: from
then on it holds the one FAIL line (the file, the seq, what is wrong) and nothing else, the tables emptied. A
journal cut back and rewritten under the reader is read again from its first line.

The tables live in DuckDB, on disk in a private temporary folder (one thread, a 128 MB memory limit), so a long
run's steps cost disk, not memory: ``steps`` (one row per step: rank, segment, rung, seq, step, loss, grad norm,
step time, tokens, examples), ``segs`` (each segment's MFU constants, from its ``run_configured``), ``marks``
(anomalies, suspected spikes, rewinds, resumes, checkpoints, device changes, stops: what the curves mark) and
``telemetry`` (device readings); beside them, per journal, two flat files by seq (each event's chain hash and where
its line is, so that the page can open any event and ask for its inclusion proof). The curves are
downsampled here (:meth:`Board.series`): per pixel the lowest and the highest point, within one rank, one segment
and one rung (a line never joins a resumed stretch to the one before it).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from trainledger.journal.audit.rundir import is_run_dir, rank_files, run_journal, split_run_id
from trainledger.journal.chain import genesis, link
from trainledger.journal.errors import (IntegrityError, JournalError, SchemaError, TrainledgerError,
                                       UsageError)
from trainledger.journal.follow import Follower, open_journal_file
from trainledger.journal.scan import tree_mode
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import open_checked, read_opening

__all__ = ["Board", "METRICS", "DEVICE_METRICS", "MAX_WIDTH"]

#: the curves the page draws: name -> the SQL of its value over ``steps``
_TOKENS = "CAST(COALESCE(tokens, examples * seq_len) AS DOUBLE)"
METRICS = {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "step_time_s": "step_time_s",
           # PaLM appendix B, against the run_configured in force in the step's segment (segs)
           "mfu": f"CASE WHEN step_time_s > 0 AND peak > 0 THEN {_TOKENS} * fpt / step_time_s / peak END",
           "tokens_per_s": f"CASE WHEN step_time_s > 0 THEN {_TOKENS} / step_time_s END"}
#: the x axes a curve can be drawn against besides the step: the tokens each rank (each rung of a ladder) has processed
#: so far (steps done again after a resume count again: they were processed), or seconds since the first step
X_AXES = {"tokens": f"sum({_TOKENS}) OVER (PARTITION BY rank, rung ORDER BY seq)",
          "time": "(ts - min(ts) OVER ()) / 1e9"}
#: the device readings drawn over time (columns of ``telemetry``)
DEVICE_METRICS = ("temp_c", "temp_hbm_c", "power_w", "sm_clock_mhz")
#: the most distinct names of logged metrics (``metrics_logged``) a board keeps: past it, a name's points are counted
#: and left out, and the page says how many names were left out
MAX_NAMES = 20_000
#: the most configuration keys of a run the run table shows (``config_logged``, nested keys joined with ".")
MAX_CONFIG_KEYS = 200
#: the widest downsampling a request may ask for (pixels)
MAX_WIDTH = 4096
#: signed events handed to the tables at a time
BATCH = 16_384
#: the most events past the last seal kept to draw (a run whose seals stopped: the rest are only counted)
MAX_UNSIGNED = 20_000
_TABLES = ("steps", "segs", "marks", "telemetry", "metrics")
_SEGMENT_KINDS = {"run_resumed", "rewind_decided", "run_configured", "rung_started", "weights_restored"}
_MARK_KINDS = {"anomaly_detected", "spike_suspected", "rewind_decided", "run_resumed", "checkpoint_saved",
               "shards_saved", "device_changed", "run_stopped", "straggler_detected", "weights_restored",
               "state_diverged"}
_LISTED = {"gate_verdict", "decision_recorded", "scaling_fitted", "run_stopped", "straggler_detected", "rung_started",
           "state_diverged",
           "run_closed", "preflight_completed", "evaluation_recorded"}


def _tag(ev: Any) -> str:
    cfg = getattr(type(ev), "__struct_config__", None)
    tag = getattr(cfg, "tag", None)
    return tag if isinstance(tag, str) else str(getattr(ev, "kind", "unknown"))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclasses.dataclass
class _Segment:
    """What a step's row needs from the events before it: its segment and rung, and MFU's constants."""

    index: int = 0
    rung: str | None = None
    flops_per_token: float | None = None
    peak: float | None = None
    seq_len: int | None = None


class _Index:
    """Where each signed event's line is and its chain hash, by seq: two flat files in the board's private folder
    (64 hex characters, then two int64s, per event), so that opening any event costs two seeks and the board's
    memory does not grow with the run."""

    def __init__(self, stem: Path) -> None:
        self.hashes, self.places = stem.with_suffix(".hashes"), stem.with_suffix(".places")
        for p in (self.hashes, self.places):
            p.unlink(missing_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)

    def append(self, recs: list[Any], at: list[tuple[int, int]]) -> None:
        import array

        with open(self.hashes, "ab") as f:
            f.write("".join(map(_H, recs)).encode("ascii"))
        with open(self.places, "ab") as f:
            array.array("q", itertools.chain.from_iterable(at)).tofile(f)

    def get(self, seq: int) -> tuple[str, int, int]:
        """(chain hash, byte offset, length) of the event at ``seq``."""
        import array

        with open(self.hashes, "rb") as f:
            f.seek(seq * 64)
            h = f.read(64).decode("ascii")
        a = array.array("q")
        with open(self.places, "rb") as f:
            f.seek(seq * 16)
            a.frombytes(f.read(16))
        return h, a[0], a[1]


def _seq_text(s: str) -> bool:
    """A rank or seq as an anchor spells it: ASCII digits that fit 64 bits (``int()`` of 5,000 digits raises)."""
    return s.isascii() and s.isdigit() and len(s) < 20


class _Journal:
    """One journal followed: complete lines checked as they arrive, signed events handed to the board."""

    def __init__(self, board: Board, path: Path, rank: int | None) -> None:
        self.board, self.path, self.rank = board, path, rank
        self.restart()

    def restart(self) -> None:
        policy = self.board.trust
        if not (policy.keys or policy.trust_embedded):
            opened, _ = read_opening(self.path, open_checked(self.path))
            if opened.key_id is not None:
                raise UsageError("serve shows only what verifies: pass --pubkey FILE (or --trust-embedded)")
        # the one follower (journal.follow): keys resolved as verify resolves them, certified rank keys included
        self.follower = Follower(self.path, keys=policy.keys, trust_embedded=policy.trust_embedded)
        opened = self.follower.opened
        if self.follower.trust == "unsigned" and not policy.allow_unsigned:
            raise UsageError(f"{self.path}: the journal is unsigned (pass --allow-unsigned to show it anyway)")
        self.trust = self.follower.trust
        self.key_id = opened.key_id
        self.format_version = opened.format_version
        self.provable = tree_mode(opened.format_version)
        self.run_id = opened.run_id
        # the events past the last seal, with where their lines are; and the signed ones not handed on yet
        self.pending: list[Any] = []
        self.pending_at: list[tuple[int, int]] = []
        self.ready: list[Any] = []
        self.ready_at: list[tuple[int, int]] = []
        self.signed = 0
        self.segment = _Segment()
        self.closed = False
        self.index = _Index(self.board.private / f"{'journal' if self.rank is None else f'rank-{self.rank:05d}'}")

    def read_new(self) -> bool:
        """Check and hand on everything appended since the last call; whether anything new was signed or seen."""
        changed = [False]

        def block(recs: list[Any], at: list[tuple[int, int]]) -> None:
            self.pending.extend(recs)
            self.pending_at.extend(at)
            changed[0] = True
            self._release()
            if len(self.ready) >= BATCH:
                self._hand_on()
        if self.follower.read_new(block, progress=self.board.progress):
            self.board._rewritten(self)
            return True
        self._hand_on()
        return changed[0]

    def _release(self) -> None:
        """Move the events a checked seal covers (in order) to those to hand on; keep the rest pending."""
        sealed = self.follower.last_seal_seq if self.trust != "unsigned" else (
            self.pending[-1].seq if self.pending else None)
        if sealed is None or not self.pending or self.pending[0].seq > sealed:
            return
        cut = sealed - self.pending[0].seq + 1
        self.ready.extend(self.pending[:cut])
        self.ready_at.extend(self.pending_at[:cut])
        del self.pending[:cut], self.pending_at[:cut]

    def _hand_on(self) -> None:
        if self.ready:
            recs, at = self.ready, self.ready_at
            self.ready, self.ready_at = [], []
            self.signed += len(recs)
            self.board._take(self, recs, at)


class Board:
    """The verified state of one journal or run folder (see the module doc). Thread-safe: :meth:`poll` runs in the
    server's follower thread, the queries in its request handlers."""

    def __init__(self, path: str | os.PathLike, *, trust: TrustPolicy | None = None, memory_limit: str = "128MB",
                 database: Any = None, **trust_options: Any) -> None:
        """``database``: a DuckDB connection to keep the tables in, in a schema of this board's own (a
        :class:`~.fleet.Fleet` shares one between its runs, so that one memory limit bounds them all); None: a
        database of the board's own, in its private folder, under ``memory_limit``."""
        self.path = Path(path)
        self.trust = TrustPolicy.of(trust, **trust_options)
        if not self.path.exists():
            raise JournalError(f"{self.path}: no such file or folder")
        if self.path.is_dir() and not is_run_dir(self.path):  # checked before anything is made: nothing left behind
            self.path = run_journal(self.path)       # a one-journal run folder (the ladder's, the Recorder's)
        self.is_run_dir = self.path.is_dir()
        self.private = Path(tempfile.mkdtemp(prefix="trainledger-serve-"))
        self.lock = threading.RLock()
        self.schema: str | None = None
        if database is not None:
            self.con = database.cursor()
            self.schema = f"run{next(_SCHEMAS)}"
            self.con.execute(f"CREATE SCHEMA {self.schema}")
            self.con.execute(f"USE {self.schema}")
            self.con.execute("SET enable_progress_bar = false")
        else:
            # on disk in the private folder, so that a long run's tables cost DuckDB's buffer, not the run's length
            self.con = open_database(self.private, memory_limit)
        self._create()
        self.version = 0
        #: grows when what the curves draw may have changed (new lines read): the curves asked for are kept until then
        self.data_version = 0
        self._curves: dict[tuple, dict[str, Any]] = {}
        #: told (bytes read, bytes there) as a journal is read: the first read of a long run takes a while
        self.progress: Any = None
        self.fail: str | None = None
        self.notes: list[str] = []
        self.listed: list[dict[str, Any]] = []
        #: each logged metric's name and how many points it has (at most MAX_NAMES names), and the points of names
        #: past that left out
        self.names: dict[str, int] = {}
        self.names_left_out = 0
        #: each journal's configuration as its config_logged events set it (by rank; -1: a lone journal)
        self.configs: dict[int, dict[str, Any]] = {}
        self.journals: dict[int | None, _Journal] = {}
        self.run: str | None = None
        #: replay's verdict on what was concluded: run once every journal has closed (the whole run is then signed)
        self.replayed: dict[str, Any] = {"state": "waiting", "detail": "replay runs once the run has closed"}
        #: the heads ranks anchored of each other, (anchored rank, its seq, chain hash, anchoring rank, its seq, the
        #: poll that found it), each held once the anchored rank has been read past it, or failed once a later poll
        #: read the anchored rank whole short of it (or it closed short of it)
        self.anchors: list[tuple[int, int, str, int, int, int]] = []
        self.polls = 0
        #: the last poll that took lines out of the tables (a journal rewritten): a cursor before it is no cursor
        self.reset_poll = 0
        self._pool: Any = None

    def _create(self) -> None:
        self.con.execute("CREATE TABLE steps (rank INTEGER, segment INTEGER, rung VARCHAR, seq BIGINT, step BIGINT, "
                         "loss DOUBLE, grad_norm DOUBLE, lr DOUBLE, step_time_s DOUBLE, tokens BIGINT, examples BIGINT, ts BIGINT, "
                         "poll INTEGER)")  # poll: the poll that read the line (a page's cursor: what is new since)
        # every scalar a logging call reported (Recorder.log, wandb.log, add_scalar, the callbacks): one row a value
        self.con.execute("CREATE TABLE metrics (rank INTEGER, segment INTEGER, rung VARCHAR, seq BIGINT, step BIGINT, "
                         "name VARCHAR, value DOUBLE, poll INTEGER)")
        self.con.execute("CREATE TABLE segs (rank INTEGER, segment INTEGER, fpt DOUBLE, peak DOUBLE, seq_len BIGINT)")
        self.con.execute("CREATE TABLE marks (rank INTEGER, seq BIGINT, step BIGINT, kind VARCHAR, label VARCHAR)")
        self.con.execute("CREATE TABLE telemetry (rank INTEGER, seq BIGINT, ts BIGINT, device INTEGER, temp_c DOUBLE, "
                         "temp_hbm_c DOUBLE, power_w DOUBLE, sm_clock_mhz DOUBLE, throttled BOOLEAN, "
                         "ecc_uncorrected DOUBLE)")


    def close(self, *, helpers: bool = True) -> None:
        """Close the tables, end a replay in flight, remove the private folder. ``helpers=False``: leave the
        forkserver and resource tracker multiprocessing shares between boards running (a :class:`Fleet` stops them
        once, after its last board)."""
        import shutil

        import duckdb

        with self.lock:
            if self.schema is not None:  # the shared database keeps no table of a run that is gone
                try:
                    self.con.execute(f"DROP SCHEMA {self.schema} CASCADE")
                except duckdb.Error:
                    pass
            self.con.close()
        _stop_pool(self._pool, helpers=helpers)
        shutil.rmtree(self.private, ignore_errors=True)

    # -- following ----------------------------------------------------------------------------------------------

    def poll(self) -> bool:
        """Read what every journal gained; whether anything changed (the version then grows)."""
        with self.lock:
            if self.fail is not None:
                return False
            changed = False
            self.polls += 1
            try:
                for rank, f in self._files().items():
                    if rank not in self.journals:
                        self.journals[rank] = self._open(rank, f)
                        changed = True
                    j = self.journals[rank]
                    self._reading = j.path
                    changed |= j.read_new()
            except IntegrityError as e:
                self._failed(e.fail_line(str(self._reading)))
                changed = True
            except JournalError as e:
                if not self.journals:
                    raise
                self._failed(f"FAIL  {self._reading}: {e}")
                changed = True
            if self.fail is None and self.anchors:
                changed |= self._hold_anchors()
            if changed:
                self.version += 1
                self.data_version += 1
                self._curves.clear()
            return changed

    def _files(self) -> dict[int | None, Path]:
        if not self.is_run_dir:
            return {None: self.path}
        return dict(rank_files(self.path))

    def _open(self, rank: int | None, f: Path) -> _Journal:
        self._reading = f
        j = _Journal(self, f, rank)
        if rank is not None:
            split = split_run_id(j.run_id)
            if split is None or split[1] != rank or (self.run is not None and split[0] != self.run):
                raise SchemaError(f"its run id {j.run_id!r} is not this folder's rank {rank} "
                                  f"({self.run or 'RUN'}.r{rank:05d}): a journal of another run (or rank)", seq=0)
            self.run = self.run or split[0]
            if self.trust.roster is not None:
                self.trust.roster.hold(rank, j.key_id)
        return j

    def _hold_anchors(self) -> bool:
        """Each anchor whose anchored rank has been read past it held to that rank's line (the chain hash the
        check recorded), and one whose rank has closed short of it failed: a rank rolled back before another's
        anchor, or swapped for another run's, fails the page while it is still open, as ``verify RUN_DIR`` fails
        it. Whether the board failed."""
        left = []
        for r, s, h, by, at, found in self.anchors:
            j = self.journals.get(r)
            if j is not None and s < j.signed:
                if j.index.get(s)[0] != h:
                    self._failed(f"FAIL  {j.path}: rank {r}: seq {s} is not the line rank {by} anchored at its seq "
                                 f"{at} (rewritten, or another run's journal)")
                    return True
            elif j is not None and (j.closed and not j.pending or found < self.polls and s >= j.signed + len(j.pending)):
                # an anchored head was sealed durably before the anchor was written: a poll after the one that found
                # the anchor reads every line up to it, so a rank still short of it, open or closed, was rolled back
                self._failed(f"FAIL  {j.path}: rank {r}: its journal ends at seq {j.signed + len(j.pending) - 1}, "
                             f"but rank {by} anchored its seq {s} (rank {by}'s seq {at}): truncated or rolled back")
                return True
            else:
                left.append((r, s, h, by, at, found))
        self.anchors = left
        return False

    def _failed(self, line: str) -> None:
        """From now on the board holds this one line and nothing from any journal."""
        self.fail = line
        self._curves.clear()
        self.data_version += 1
        for t in _TABLES:
            self.con.execute(f"DELETE FROM {t}")
        self.listed.clear()
        self.names.clear()
        self.configs.clear()
        for j in self.journals.values():
            j.pending.clear()
            j.pending_at.clear()

    def _rewritten(self, j: _Journal) -> None:
        self.notes.append(f"{j.path}: the journal was cut back and rewritten: read again from its first line")
        self.reset_poll = self.polls  # a page's curve from before holds lines that are gone: drawn whole again
        r = -1 if j.rank is None else j.rank
        for t in _TABLES:
            self.con.execute(f"DELETE FROM {t} WHERE rank = ?", [r])
        self.listed = [x for x in self.listed if x["rank"] != j.rank]
        self.configs.pop(r, None)
        self.names = dict(self.con.execute("SELECT name, count(*) FROM metrics GROUP BY name").fetchall())
        j.restart()
        j.read_new()

    def _take(self, j: _Journal, recs: list[Any], at: list[tuple[int, int]]) -> None:
        """Signed events of journal ``j``, in order, into the tables: runs of steps as columns (built in C from
        the records where the accelerator is built), everything else one event at a time."""
        import pyarrow as pa

        from trainledger.journal.audit.replay import type_run

        r = -1 if j.rank is None else j.rank
        seg = j.segment
        n = len(recs)
        kinds: list[str] = []
        steps: list[Any] = []
        seg_cols: list[Any] = []
        rung_cols: list[Any] = []
        marks: list[tuple[Any, ...]] = []
        tele: list[tuple[Any, ...]] = []
        segs: list[tuple[Any, ...]] = []
        logged: list[list[Any]] = [[], [], [], [], [], []]  # the metrics table's columns after rank
        i = 0
        while i < n:
            t = type(recs[i])
            k = type_run(recs, i, t)
            if _tag(recs[i]) == "step_observed":
                steps.extend(recs[i:k])
                kinds.extend(["step_observed"] * (k - i))
                seg_cols.append(pa.repeat(pa.scalar(seg.index, pa.int32()), k - i))
                rung_cols.append(pa.repeat(pa.scalar(seg.rung, pa.string()), k - i))
            else:
                for ev in recs[i:k]:
                    kind = _tag(ev)
                    kinds.append(kind)
                    if kind == "metrics_logged":
                        self._logged(seg, ev, logged)
                    else:
                        self._other(j, r, ev, kind, marks, tele, segs)
            i = k
        if steps:
            m = len(steps)
            cols = {"rank": pa.repeat(pa.scalar(r, pa.int32()), m), "segment": pa.concat_arrays(seg_cols),
                    "rung": pa.concat_arrays(rung_cols), "seq": _ints(steps, "seq"), "step": _ints(steps, "step"),
                    "loss": _floats(steps, "loss"), "grad_norm": _floats(steps, "grad_norm"), "lr": _floats(steps, "lr"),
                    "step_time_s": _floats(steps, "step_time_s"), "tokens": _ints(steps, "tokens"),
                    "examples": _ints(steps, "examples"), "ts": _ints(steps, "ts"),
                    "poll": pa.repeat(pa.scalar(self.polls, pa.int32()), m)}
            self._insert("steps", pa.table(cols))
        if logged[0]:
            cols = {"rank": pa.repeat(pa.scalar(r, pa.int32()), len(logged[0])),
                    "segment": pa.array(logged[0], pa.int32()), "rung": pa.array(logged[1], pa.string()),
                    "seq": pa.array(logged[2], pa.int64()), "step": pa.array(logged[3], pa.int64()),
                    "name": pa.array(logged[4], pa.string()), "value": pa.array(logged[5], pa.float64()),
                    "poll": pa.repeat(pa.scalar(self.polls, pa.int32()), len(logged[0]))}
            self._insert("metrics", pa.table(cols))
        j.index.append(recs, at)
        if marks:
            self.con.executemany("INSERT INTO marks VALUES (?, ?, ?, ?, ?)", marks)
        if tele:
            self.con.executemany("INSERT INTO telemetry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", tele)
        if segs:
            self.con.executemany("INSERT INTO segs VALUES (?, ?, ?, ?, ?)", segs)

    def _logged(self, seg: _Segment, ev: Any, cols: list[list[Any]]) -> None:
        """A ``metrics_logged`` event's values as rows of the metrics table (columns in ``cols``): each name as
        logged, each value as a double (NaN and infinities kept; the curves leave them out). A name past the
        board's :data:`MAX_NAMES` distinct ones is counted, not kept."""
        step = ev.step if isinstance(ev.step, int) and -2**63 <= ev.step < 2**63 else None
        names = self.names
        for name, v in ev.metrics.items():
            if name not in names:
                if len(names) >= MAX_NAMES:
                    self.names_left_out += 1
                    continue
                names[name] = 0
            names[name] += 1
            cols[0].append(seg.index)
            cols[1].append(seg.rung)
            cols[2].append(ev.seq)
            cols[3].append(step)
            cols[4].append(name)
            cols[5].append(_double(v))

    def _other(self, j: _Journal, r: int, ev: Any, kind: str, marks: list, tele: list, segs: list) -> None:
        """One event that is not a step: a new segment, a mark, a device reading, a listed event."""
        seg = j.segment
        if kind in _SEGMENT_KINDS:
            seg.index += 1
            if kind == "rung_started":
                seg.rung = str(ev.rung)
            if kind == "run_configured":
                seg.flops_per_token = None
                if ev.n_params and ev.seq_len:
                    seg.flops_per_token = 6.0 * ev.n_params + 12.0 * (ev.n_layer or 0) * (ev.n_head or 0) * (
                        ev.head_dim or 0) * ev.seq_len
                seg.peak = (ev.peak_flops_per_sec * (ev.devices or 1)) if ev.peak_flops_per_sec else None
                seg.seq_len = ev.seq_len
            segs.append((r, seg.index, _num(seg.flops_per_token), _num(seg.peak),
                         seg.seq_len if isinstance(seg.seq_len, int) and abs(seg.seq_len) < 2**63 else None))
        if kind in _MARK_KINDS:
            marks.append((r, ev.seq, _mark_step(ev, kind), kind, _mark_label(ev, kind)))
        if kind == "device_sampled":
            ecc = ev.ecc if isinstance(ev.ecc, dict) else {}
            unc = sum(v for k, v in ecc.items() if "uncorrected" in str(k) and isinstance(v, int))
            tele.append((r, ev.seq, ev.ts, ev.device, _num(ev.temp_c), _num(ev.temp_hbm_c), _num(ev.power_w),
                         _num(ev.sm_clock_mhz), bool(ev.clock_event_reasons), _num(float(unc))))
        if kind == "run_closed":
            j.closed = True
        if kind == "config_logged" and isinstance(ev.config, dict):
            cfg = self.configs.setdefault(r, {})
            cfg.update(_flat_config(ev.config))
        if kind == "ranks_anchored" and j.rank is not None:
            for other, head in ev.heads.items():
                s_, _, h_ = str(head).partition(":")
                if _seq_text(str(other)) and int(other) != j.rank and _seq_text(s_):
                    self.anchors.append((int(other), int(s_), h_, j.rank, ev.seq, self.polls))
        elif kind == "anchor_recorded" and j.rank is not None:
            s_, _, h_ = str(ev.head).partition(":")
            if isinstance(ev.rank, int) and ev.rank != j.rank and _seq_text(s_):
                self.anchors.append((ev.rank, int(s_), h_, j.rank, ev.seq, self.polls))
        if kind in _LISTED:
            item = {"rank": j.rank, "seq": ev.seq, "kind": kind, "fields": _fields(ev)}
            if kind == "scaling_fitted":  # what makes the fit doubtful: computed here as replay computes it
                from trainledger.ladder.scaling import fit_warnings

                item["warnings"] = fit_warnings(ev.params, ev.points, ev.entropy_rate)
            self.listed.append(item)

    def _insert(self, table: str, rows: Any) -> None:
        import duckdb

        self.con.register("_rows", rows)
        try:
            self.con.execute(f"INSERT INTO {table} SELECT * FROM _rows")
        except duckdb.Error as e:  # out of memory or disk for the tables: the server's limit, not the journal's fault
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"{self.path}: the dashboard's tables cannot take more ({why}); serve fewer runs at once, "
                             "or free disk space in the temporary folder") from None
        finally:
            self.con.unregister("_rows")

    def replay_due(self) -> bool:
        with self.lock:
            return (self.fail is None and self.replayed["state"] == "waiting" and bool(self.journals)
                    and all(j.closed and not j.pending for j in self.journals.values()))

    def run_replay(self) -> None:
        """Replay (``trainledger replay``) what the board shows, once the run has closed: the differences between
        what was concluded and what the events give, each with its seq, for the page to show where they are. A run
        folder is then also checked whole, as ``verify RUN_DIR`` checks it (the anchors between its ranks): a
        failure there is the board's FAIL. It runs in a child process at low priority, so that the server keeps
        answering while it works (a 1e6-step replay is seconds of CPU)."""
        import concurrent.futures
        import multiprocessing

        with self.lock:
            self.replayed = {"state": "running", "detail": "replaying"}
        methods = multiprocessing.get_all_start_methods()
        # the forkserver listens on a socket in the temporary folder, whose path must fit a socket address (107
        # bytes on Linux): under a deep TMPDIR it cannot start, and a fresh interpreter (spawn) does the same work
        sock = os.path.join(tempfile.gettempdir(), "pymp-xxxxxxxx", "listener-xxxxxxxx")
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods and len(os.fsencode(sock)) < 100
                                          else "spawn")
        try:
            with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                self._pool = pool
                kind, got = pool.submit(_replayed, str(self.path), self.is_run_dir, self.trust).result()
            self._pool = None
        except (OSError, concurrent.futures.process.BrokenProcessPool) as e:
            kind, got = "error", f"replay could not run: {e}"
        if kind == "fail":
            with self.lock:
                self._failed(got)
                self.replayed = {"state": "failed", "detail": self.fail}
                self.version += 1
            return
        if kind == "error":
            result: dict[str, Any] = {"state": "failed", "detail": got}
        else:
            diffs = got
            result = {"state": "differences" if diffs else "consistent", "differences": diffs[:500],
                      "detail": f"{len(diffs)} difference(s) from the recomputation" if diffs else
                      "replay consistent: every conclusion recomputed from the events agrees"}
        with self.lock:
            for d in result.get("differences", []):  # where it is on the curves: the step its event names, else
                if d["seq"] is not None:                # the last step before it
                    r = -1 if d["rank"] is None else d["rank"]
                    got = _first(self.con.execute("SELECT step FROM marks WHERE rank = ? AND seq = ? AND step IS NOT "
                                                  "NULL", [r, d["seq"]]).fetchall()) or _first(self.con.execute(
                        "SELECT step FROM steps WHERE rank = ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
                        [r, d["seq"]]).fetchall())
                    d["step"] = got[0] if got else None
            self.replayed = result
            self.version += 1

    # -- reading ------------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything but the curves: verification, the journals, the listed events, the marks."""
        with self.lock:
            out: dict[str, Any] = {"version": self.version, "data_version": self.data_version,
                                   "path": str(self.path), "fail": self.fail,
                                   "notes": list(self.notes[-5:]), "run_dir": self.is_run_dir}
            if self.fail is not None:
                return out
            out["journals"] = [{"rank": j.rank, "file": str(j.path), "run_id": j.run_id, "key_id": j.key_id,
                                "format_version": j.format_version,
                                "trust": j.trust, "signed": j.signed, "unsigned": len(j.pending),
                                "last_seal_seq": j.follower.last_seal_seq, "closed": j.closed}
                               for _, j in sorted(self.journals.items(), key=lambda x: -1 if x[0] is None else x[0])]
            out["listed"] = list(self.listed[-500:])
            out["marks"] = [dict(zip(("rank", "seq", "step", "kind", "label"), m)) for m in self.con.execute(
                "SELECT CASE WHEN rank < 0 THEN NULL ELSE rank END, seq, step, kind, label FROM marks "
                "ORDER BY seq LIMIT 2000").fetchall()]
            out["replay"] = dict(self.replayed)
            out["steps"] = self.con.execute("SELECT count(*), min(step), max(step) FROM steps").fetchall()[0]
            return out

    def series(self, metric: str, width: int, lo: int | float | None = None, hi: int | float | None = None,
               x: str = "step", *, logged: bool = False, since: int | None = None) -> dict[str, Any]:
        """``metric`` by step, per rank, segment and rung, at most two points (the lowest and the highest, in step
        order) per pixel of ``width``; the events past each journal's last seal apart, as they are. ``x``: ``step``,
        ``tokens`` (each rank's tokens so far) or ``time`` (seconds since the run's first step); ``lo`` and ``hi``
        are in its units. ``logged``: ``metric`` is the name of a logged metric (``metrics_logged``), drawn at the
        steps it was logged at (on another x axis, at that step's value of it).

        Every answer names its ``cursor``. ``since=CURSOR`` (the whole run on the step axis): when fewer points than
        ``width`` were read after that cursor, only those, as they are (``"append": true``: the page adds them to the
        curve it has), and the unsigned tail as now; else the whole curve, as without it."""
        if not logged and metric not in METRICS:
            raise UsageError(f"no such curve {metric!r}: one of {', '.join(METRICS)}")
        if x != "step" and x not in X_AXES:
            raise UsageError(f"no such x axis {x!r}: one of step, {', '.join(X_AXES)}")
        key = (metric, max(1, min(int(width), MAX_WIDTH)), lo, hi, x, logged)
        if since is not None and lo is None and hi is None and x == "step":
            got = self._since(metric, key[1], since, logged)
            if got is not None:
                return got
        with self.lock:
            # a whole run's curve asked for again (another page, a refresh) is the one computed, until new lines are
            # read; a failure empties every curve at once. Only whole runs, at most 16 a board: a zoom is asked for
            # once, and a fleet's boards together keep a few megabytes
            got = self._curves.get(key) if self.fail is None else None
            if got is None:
                got = self._series(*key)
                if self.fail is None and lo is None and hi is None:
                    if len(self._curves) >= 16:
                        self._curves.pop(next(iter(self._curves)))
                    self._curves[key] = got
            return got

    def _since(self, metric: str, width: int, since: int, logged: bool) -> dict[str, Any] | None:
        """The points read after poll ``since`` as they are, with the unsigned tail; None when there are ``width``
        or more of them (the whole curve costs no more then), or the cursor is not one this board gave."""
        with self.lock:
            if self.fail is not None or not self.reset_poll <= since <= self.polls:
                return None
            src, sp = self._source(metric, logged)
            new = f"SELECT * FROM ({src}) WHERE poll > ? AND v IS NOT NULL AND isfinite(v)"
            rows = self.con.execute(f"SELECT rank, segment, rung, 0, step, v, seq, step, v, seq FROM ({new}) "
                                    "ORDER BY rank, segment, step, seq LIMIT ?", [*sp, since, width]).fetchall()
            if len(rows) >= width:
                return None
            return {"metric": metric, "append": True, "cursor": self.polls, "since": since, "width": width,
                    "series": _grouped(rows), "unsigned": self._unsigned(metric, logged)}

    def _unsigned(self, metric: str, logged: bool) -> list[dict[str, Any]]:
        """Each journal's points past its last seal (drawn apart)."""
        unsigned = []
        for rank, j in sorted(self.journals.items(), key=lambda x: -1 if x[0] is None else x[0]):
            pts = _unsigned_points(j, metric, logged)
            if pts:
                unsigned.append({"rank": rank, "x": [p[0] for p in pts], "y": [p[1] for p in pts],
                                 "seq": [p[2] for p in pts]})
        return unsigned

    def _source(self, metric: str, logged: bool, x: str = "step") -> tuple[str, list[Any]]:
        """The SQL of a curve's points, (rank, segment, rung, seq, step, v) or with ``x`` not the step (rank,
        segment, rung, seq, xv, v), and its parameters."""
        if x == "step":
            if logged:
                return "SELECT rank, segment, rung, seq, step, value AS v, poll FROM metrics WHERE name = ?", [metric]
            return (f"SELECT rank, segment, rung, seq, step, {METRICS[metric]} AS v, poll FROM steps "
                    "LEFT JOIN segs USING (rank, segment)"), []
        if logged:
            # a logged value is drawn at its step's tokens or time (the last time that step was taken)
            return ("SELECT rank, segment, rung, seq, xs.xv, value AS v FROM metrics JOIN (SELECT rank, step, "
                    f"max(xv) AS xv FROM (SELECT rank, step, {X_AXES[x]} AS xv FROM steps LEFT JOIN segs "
                    "USING (rank, segment)) GROUP BY rank, step) xs USING (rank, step) WHERE name = ?"), [metric]
        return (f"SELECT rank, segment, rung, seq, {X_AXES[x]} AS xv, {METRICS[metric]} AS v FROM steps "
                "LEFT JOIN segs USING (rank, segment)"), []

    def _series(self, metric: str, width: int, lo: int | float | None, hi: int | float | None,
                x: str, logged: bool = False) -> dict[str, Any]:
        if x != "step":
            return self._series_by(metric, width, lo, hi, x, logged)
        with self.lock:
            if self.fail is not None:
                return {"metric": metric, "series": [], "unsigned": [], "cursor": self.polls}
            src, sp = self._source(metric, logged)
            lo_, hi_ = self.con.execute(f"SELECT min(step), max(step) FROM ({src})", sp).fetchall()[0]
            # a window asked for is cut to the steps there are (any 64-bit bounds: the arithmetic never overflows)
            lo = lo_ if lo is None or (lo_ is not None and lo < lo_) else lo
            hi = hi_ if hi is None or (hi_ is not None and hi > hi_) else hi
            series: list[dict[str, Any]] = []
            if lo is not None and hi is not None and lo <= hi:
                span = float(max(hi - lo + 1, 1))
                rows = self.con.execute(
                    f"WITH s AS (SELECT * FROM ({src}) WHERE step BETWEEN ? AND ?), b AS (SELECT *, "
                    "CAST(floor((step::DOUBLE - ?) * ? / ?) AS BIGINT) AS px FROM s WHERE v IS NOT NULL AND "
                    "isfinite(v)) "
                    "SELECT rank, segment, rung, px, arg_min(step, v), min(v), arg_min(seq, v), arg_max(step, v), "
                    "max(v), arg_max(seq, v) FROM b GROUP BY rank, segment, rung, px "
                    "ORDER BY rank, segment, px", [*sp, lo, hi, float(lo), width, span]).fetchall()
                series = _grouped(rows)
            return {"metric": metric, "lo": lo, "hi": hi, "width": width, "series": series,
                    "unsigned": self._unsigned(metric, logged), "cursor": self.polls}

    def _series_by(self, metric: str, width: int, lo: float | None, hi: float | None, x: str,
                   logged: bool = False) -> dict[str, Any]:
        """:meth:`series` against tokens or wall time: the same per-pixel lowest and highest points, of signed steps
        only (the events past the last seal are drawn on the step axis)."""
        with self.lock:
            if self.fail is not None:
                return {"metric": metric, "x_axis": x, "series": [], "unsigned": []}
            src, sp = self._source(metric, logged, x)
            base = f"WITH s AS ({src})"
            lo_, hi_ = self.con.execute(f"{base} SELECT min(xv), max(xv) FROM s", sp).fetchall()[0]
            lo = lo_ if lo is None or (lo_ is not None and lo < lo_) else float(lo)
            hi = hi_ if hi is None or (hi_ is not None and hi > hi_) else float(hi)
            series: list[dict[str, Any]] = []
            if lo is not None and hi is not None and lo <= hi:
                span = max(hi - lo, 1e-12)
                rows = self.con.execute(
                    f"{base}, b AS (SELECT *, least(CAST(floor((xv - ?) * ? / ?) AS BIGINT), ? - 1) AS px FROM s "
                    "WHERE xv BETWEEN ? AND ? AND v IS NOT NULL AND isfinite(v)) "
                    "SELECT rank, segment, rung, px, arg_min(xv, v), min(v), arg_min(seq, v), arg_max(xv, v), max(v), "
                    "arg_max(seq, v) FROM b GROUP BY rank, segment, rung, px ORDER BY rank, segment, px",
                    [*sp, float(lo), width, span, width, float(lo), float(hi)]).fetchall()
                series = _grouped(rows)
            return {"metric": metric, "x_axis": x, "lo": lo, "hi": hi, "width": width, "series": series,
                    "unsigned": []}

    def logged_names(self) -> dict[str, Any]:
        """The logged metrics' names, each with its number of points, in name order; and how many points of names
        past :data:`MAX_NAMES` were left out."""
        with self.lock:
            if self.fail is not None:
                return {"names": [], "left_out": 0}
            return {"names": [[k, self.names[k]] for k in sorted(self.names)], "left_out": self.names_left_out}

    def config(self) -> dict[str, Any]:
        """The run's configuration as its config_logged events set it (each rank's, the lowest rank's first)."""
        with self.lock:
            out: dict[str, Any] = {}
            for r in sorted(self.configs):
                for k, v in self.configs[r].items():
                    out.setdefault(k, v)
            return out

    def device_series(self, metric: str, width: int) -> dict[str, Any]:
        """A device reading over time (seconds since the first reading), per rank and device, at most two points a
        pixel (the lowest and the highest)."""
        if metric not in DEVICE_METRICS:
            raise UsageError(f"no such reading {metric!r}: one of {', '.join(DEVICE_METRICS)}")
        width = max(1, min(int(width), MAX_WIDTH))
        with self.lock:
            if self.fail is not None:
                return {"metric": metric, "series": []}
            t0, t1 = self.con.execute("SELECT min(ts), max(ts) FROM telemetry").fetchall()[0]
            series: list[dict[str, Any]] = []
            if t0 is not None:
                span = max(t1 - t0 + 1, 1)
                rows = self.con.execute(
                    f"WITH b AS (SELECT rank, device, seq, ts, {metric} AS v, CAST(floor((ts - ?) * ? / ?) AS BIGINT) "
                    "AS px FROM telemetry WHERE {metric} IS NOT NULL AND isfinite({metric})) "
                    "SELECT rank, device, px, arg_min(ts, v), min(v), arg_min(seq, v), arg_max(ts, v), max(v), "
                    "arg_max(seq, v) FROM b GROUP BY rank, device, px ORDER BY rank, device, px".replace(
                        "{metric}", metric), [t0, width, span]).fetchall()
                cur: dict[str, Any] | None = None
                for rank, device, _px, a0, v0, q0, a1, v1, q1 in rows:
                    if cur is None or (cur["rank"], cur["device"]) != (None if rank < 0 else rank, device):
                        cur = {"rank": None if rank < 0 else rank, "device": device, "x": [], "y": [], "seq": []}
                        series.append(cur)
                    for t, v, q in sorted({(a0, v0, q0), (a1, v1, q1)}):
                        cur["x"].append((t - t0) / 1e9)
                        cur["y"].append(v)
                        cur["seq"].append(q)
            return {"metric": metric, "series": series}

    def heatmap(self, width: int) -> dict[str, Any]:
        """Step time per rank, averaged per pixel of steps, the stragglers' windows to outline, and the replicas
        whose state diverged (docs/sdc.md), to mark at their rank and step."""
        width = max(1, min(int(width), MAX_WIDTH))
        with self.lock:
            if self.fail is not None:
                return {"ranks": [], "cells": [], "stragglers": [], "divergences": []}
            lo, hi = self.con.execute("SELECT min(step), max(step) FROM steps").fetchall()[0]
            if lo is None:
                return {"ranks": [], "cells": [], "stragglers": [], "divergences": []}
            span = max(hi - lo + 1, 1)
            cells = self.con.execute(
                "SELECT rank, CAST(floor((step::DOUBLE - ?) * ? / ?) AS BIGINT) AS px, avg(step_time_s) FROM steps "
                "WHERE step_time_s IS NOT NULL AND isfinite(step_time_s) GROUP BY ALL ORDER BY rank, px",
                [lo, width, span]).fetchall()
            strag = [x for x in self.listed if x["kind"] == "straggler_detected"]
            return {"lo": lo, "hi": hi, "width": width, "ranks": sorted({c[0] for c in cells}),
                    "cells": [[c[0], c[1], c[2]] for c in cells],
                    "stragglers": [{"rank": x["fields"].get("rank"), "from": x["fields"].get("window_start"),
                                    "to": x["fields"].get("window_end"), "score": x["fields"].get("score"),
                                    "seq": x["seq"], "by": x["rank"]} for x in strag],
                    "divergences": [{"ranks": x["fields"].get("ranks"), "step": x["fields"].get("step"),
                                     "tensor": x["fields"].get("tensor"), "seq": x["seq"], "by": x["rank"]}
                                    for x in self.listed if x["kind"] == "state_diverged"]}

    def telemetry(self) -> dict[str, Any]:
        with self.lock:
            if self.fail is not None:
                return {"rows": []}
            rows = self.con.execute(
                "SELECT CASE WHEN rank < 0 THEN NULL ELSE rank END, device, count(*), max(temp_c), max(temp_hbm_c), "
                "max(power_w), min(sm_clock_mhz), bool_or(throttled), max(ecc_uncorrected), max(seq) FROM telemetry "
                "GROUP BY ALL ORDER BY ALL").fetchall()
            return {"rows": [dict(zip(("rank", "device", "samples", "temp_c_max", "temp_hbm_c_max", "power_w_max",
                                       "sm_clock_mhz_min", "throttled", "ecc_uncorrected", "last_seq"), r))
                             for r in rows]}

    def event(self, rank: int | None, seq: int) -> dict[str, Any]:
        """One signed event as its line says it, with its seq and chain hash: read back from the file and held to
        the hash the check recorded (a line changed since is refused)."""
        import json

        with self.lock:
            if self.fail is not None:
                raise UsageError("the journal failed verification: nothing from it is shown")
            j = self.journals.get(rank)
            if j is None or not 0 <= seq < j.signed:
                raise UsageError(f"no signed event at seq {seq}" + (f" of rank {rank}" if rank is not None else ""))
            h, off, ln = j.index.get(seq)
            prev = j.index.get(seq - 1)[0] if seq > 0 else None
            try:
                with open_journal_file(j.path) as f:
                    f.seek(off)
                    line = f.read(ln)
            except JournalError as e:
                self._failed(f"FAIL  {j.path}: {e}")
                self.version += 1
                raise IntegrityError(f"{j.path}: {e}", seq=seq) from None
            prev_h = bytes.fromhex(prev) if prev else genesis(j.run_id)
            cut = line.rfind(b',"h":"')
            if cut < 0 or link(prev_h, line[:cut]).hex() != h:
                e = IntegrityError(f"{j.path}: the line at seq {seq} is not the one verified (changed since)",
                                   seq=seq)
                self._failed(e.fail_line(str(j.path)))  # what was shown no longer holds: the page says FAIL
                self.version += 1
                raise e
            fields = json.loads(line)
            return {"rank": rank, "seq": seq, "kind": fields.get("kind"), "h": h, "file": str(j.path),
                    "format_version": j.format_version, "provable": bool(j.provable), "line": line.decode(),
                    # pretty-printed here: a browser's JSON.parse rounds integers past 2**53 (every ts is one)
                    "pretty": json.dumps(fields, indent=1, ensure_ascii=False)}

    def proof(self, rank: int | None, seq: int) -> dict[str, Any]:
        """The inclusion proof bundle of one signed event against its journal's latest seal (``trainledger
        verify-proof`` accepts it). The tree index is kept in the board's private folder, never beside the
        journal."""
        from trainledger.journal.proofs.bundle import prove

        with self.lock:
            if self.fail is not None:
                raise UsageError("the journal failed verification: nothing from it is shown")
            j = self.journals.get(rank)
            if j is None or seq >= j.signed:
                raise UsageError(f"no signed event at seq {seq}")
            index = self.private / f"{'journal' if rank is None else rank}.tlindex"
            return prove(j.path, [seq], trust=self.trust, index=index).bundle


_H = operator.attrgetter("h")


def _grouped(rows: list[tuple]) -> list[dict[str, Any]]:
    """The per-pixel rows (rank, segment, rung, px, x at the lowest, lowest, its seq, x at the highest, highest, its
    seq), in (rank, segment, px) order, as one series per rank, segment and rung: each pixel's lowest and highest
    points in x order (one point when they are the same)."""
    series: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    key = None
    for rank, segment, rung, _px, x0, v0, q0, x1, v1, q1 in rows:
        if cur is None or key != (rank, segment, rung):
            key = (rank, segment, rung)
            cur = {"rank": None if rank < 0 else rank, "segment": segment, "rung": rung, "x": [], "y": [], "seq": []}
            series.append(cur)
        for x, v, q in sorted({(x0, v0, q0), (x1, v1, q1)}):
            cur["x"].append(x)
            cur["y"].append(v)
            cur["seq"].append(q)
    return series


_SCHEMAS = itertools.count()


def open_database(folder: Path, memory_limit: str) -> Any:
    """A DuckDB database on disk in ``folder`` (tables cost its buffer, not a run's length), one thread, at most
    ``memory_limit`` of memory, spilling to ``folder``; no extension is loaded or installed."""
    import duckdb

    con = duckdb.connect(str(folder / "board.duckdb"),
                         config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute("SET enable_progress_bar = false")
    con.execute("SET threads = 1")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = '{folder}'")
    return con


def _ints(recs: list[Any], name: str) -> Any:
    """An int field as int64 (a value past int64, which a signed event may hold, is left out of the curves)."""
    import pyarrow as pa

    from trainledger.journal.views.parquet.export import arrow_column

    try:
        return arrow_column(recs, name, "BIGINT")
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
        vals = [getattr(x, name) for x in recs]
        return pa.array([v if isinstance(v, int) and -2**63 <= v < 2**63 else None for v in vals], pa.int64())


def _floats(recs: list[Any], name: str) -> Any:
    import pyarrow as pa

    from trainledger.journal.views.parquet.export import arrow_column

    try:
        return arrow_column(recs, name, "DOUBLE")
    except (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_num(getattr(x, name)) for x in recs], pa.float64())


def _stop_pool(pool: Any, *, helpers: bool = True) -> None:
    """Replay's worker (mid-replay when the server stops: Ctrl-C, SIGTERM) ended, with (``helpers``) the forkserver
    and the resource tracker multiprocessing started for it: nothing is left running after serve."""
    import gc
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    if pool is not None:
        for p in list(getattr(pool, "_processes", {}).values()):
            try:
                p.terminate()
                p.join(5)
            except (OSError, ValueError, AttributeError):
                pass
        pool.shutdown(wait=False, cancel_futures=True)
    if not helpers:
        return
    gc.collect()  # the pools' semaphores finalized (unlinked) while the resource tracker still knows them
    for owner in (getattr(multiprocessing.forkserver, "_forkserver", None),
                  getattr(multiprocessing.resource_tracker, "_resource_tracker", None)):
        stop = getattr(owner, "_stop", None)
        if stop is not None:
            try:
                stop()
            except (OSError, ValueError, AttributeError, ChildProcessError):
                pass


def _replayed(path: str, run_dir: bool, trust: TrustPolicy) -> tuple[str, Any]:
    """In the replay's child process: ("ok", differences), ("fail", the FAIL line) or ("error", what went wrong)."""
    try:
        os.nice(10)
    except OSError:
        pass
    from trainledger.audit import replay, replay_run_dir

    try:
        rec = (replay_run_dir if run_dir else replay)(path, trust=trust)
    except IntegrityError as e:
        # replay checks a run folder whole (its cross-rank anchors, which a rank's own lines cannot show), and
        # every journal again: what fails here fails the board
        return "fail", e.fail_line(path)
    except TrainledgerError as e:
        return "error", str(e)
    return "ok", [{"rank": d.get("rank"), "seq": d.get("seq"), "kind": d.get("kind"), "detail": d.get("detail")}
                  for d in rec.differences]


def _first(rows: list[Any]) -> Any:
    """The first row or None (a result is always read whole: DuckDB keeps a connection busy until it is)."""
    return rows[0] if rows else None


def _value(ev: Any, metric: str, seg: _Segment) -> float | None:
    """An unsigned step's value of ``metric``, as :data:`METRICS` computes a signed one's in SQL (tokens, else
    examples times the segment's sequence length; MFU against the segment's constants)."""
    if metric in ("tokens_per_s", "mfu"):
        st = _num(ev.step_time_s)
        tokens = ev.tokens if ev.tokens is not None else (
            ev.examples * seg.seq_len if ev.examples is not None and seg.seq_len else None)
        if tokens is None or not st or st <= 0:
            return None
        if metric == "tokens_per_s":
            return _num(tokens / st)
        return _num(tokens * seg.flops_per_token / st / seg.peak) if seg.flops_per_token and seg.peak else None
    return _num(getattr(ev, metric, None))


def _double(v: Any) -> float | None:
    """A logged value as a double: NaN and the infinities as they are, a number past a double's range as None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:
        return None


def _flat_config(cfg: dict[str, Any], prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """A configuration as the run table shows it: nested keys joined with "." (as W&B shows them), each value a
    number, string, boolean or None, or its JSON (a list); at most :data:`MAX_CONFIG_KEYS` keys."""
    import json

    out = {} if out is None else out
    for k, v in cfg.items():
        if len(out) >= MAX_CONFIG_KEYS:
            break
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            _flat_config(v, key + ".", out)
        elif v is None or isinstance(v, (str, bool, int, float)):
            out[key] = v if not isinstance(v, float) or math.isfinite(v) else str(v)
        else:
            out[key] = json.dumps(v, ensure_ascii=False)[:500]
    return out


def _unsigned_points(j: _Journal, metric: str, logged: bool) -> list[tuple[Any, float, int]]:
    """(step, value, seq) of ``metric`` in the events past journal ``j``'s last seal (the last MAX_UNSIGNED)."""
    out = []
    for ev in j.pending[-MAX_UNSIGNED:]:
        kind = _tag(ev)
        if logged:
            if kind == "metrics_logged" and metric in ev.metrics:
                v = _double(ev.metrics[metric])
                if v is not None and math.isfinite(v):
                    out.append((ev.step, v, ev.seq))
        elif kind == "step_observed":
            v = _value(ev, metric, j.segment)
            if v is not None:
                out.append((ev.step, v, ev.seq))
    return out


def _mark_step(ev: Any, kind: str) -> int | None:
    for name in ("step", "spike_step", "from_step", "window_start"):
        v = getattr(ev, name, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _mark_label(ev: Any, kind: str) -> str:
    if kind == "anomaly_detected":
        return f"{ev.anomaly}"
    if kind == "device_changed":
        return f"device {ev.device}: {ev.change}"
    if kind == "run_stopped":
        return f"stop: {ev.rule}"
    if kind == "straggler_detected":
        return f"straggler rank {ev.rank}"
    if kind == "state_diverged":
        return (f"state diverged: rank{'s' if len(ev.ranks) > 1 else ''} {', '.join(map(str, ev.ranks))}"
                + (f" ({ev.tensor})" if ev.tensor else ""))
    if kind == "checkpoint_saved":
        from trainledger.journal.text import trainer_step_note

        return f"checkpoint {ev.path}{trainer_step_note(ev.path, ev.step)}"
    return kind.replace("_", " ")


def _fields(ev: Any) -> dict[str, Any]:
    import msgspec

    d = msgspec.to_builtins(ev)
    return {k: v for k, v in d.items() if k not in ("h",)} if isinstance(d, dict) else {"value": d}


def open_board(path: str | os.PathLike, trust: TrustPolicy, *, progress: Any = None) -> Board:
    """A board over ``path``, read once through (what the journals hold now), ready to serve. ``progress(done,
    total)`` is told how far each journal's first read has come (the CLI's progress bar on a terminal)."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise UsageError("serve needs its extra: pip install 'trainledger[serve]'")
    b = Board(path, trust=trust)
    b.progress = progress
    try:
        b.poll()
    finally:
        b.progress = None
        if progress is not None and hasattr(progress, "close"):
            progress.close()
    return b
