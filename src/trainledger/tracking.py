"""The calls people already log with, into a signed journal: W&B's (``import trainledger as wandb``).

    import trainledger as wandb
    run = wandb.init(project="mnist", config={"lr": 1e-3})
    for step in range(steps):
        ...
        wandb.log({"train/loss": loss, "train/acc": acc})
    wandb.finish()

``init`` opens ``./trainledger-runs/<project>/<name or id>/journal.jsonl`` (under ``dir`` when given; not
``./trainledger/``, which would shadow the package itself in an editable install for a script run from there), signed with the
user's key (``$TRAINLEDGER_KEY_DIR`` or ``~/.config/trainledger/keys/default.key``, made on first use; ``key=`` to
name another). ``log`` records ``metrics_logged`` events (queued: it never waits for the disk or a signature),
``config`` and ``define_metric`` record ``config_logged``, ``summary`` values set by hand are recorded at ``finish``,
which closes the journal. A process killed mid-run leaves the journal open: ``init(..., resume="allow")`` (or
``"must"``) continues it. What W&B does that this does not (media, tables, artifacts, sweeps, a server) is said once
on stderr, never silently dropped; docs/integrations.md lists what maps to what.
"""

from __future__ import annotations

import atexit
import os
import secrets
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# the journal's writer first: its exit handler (seal what is open) is registered before this module's (finish the
# run), so that ours runs first (atexit runs the last registered first)
from trainledger.journal import writer as _writer  # noqa: F401
# what each logged row becomes, imported here rather than in the call: log() runs between two training steps
from trainledger.training.kinds import PLAIN_NUMBERS, MetricsLogged, metric_values

__all__ = ["init", "log", "finish", "define_metric", "watch", "login", "save", "Settings", "Run", "Config",
           "Summary", "SummaryWriter"]

#: The folder runs go in when ``dir`` is not given: ``./trainledger-runs/<project>/<name>`` (a folder named
#: ``trainledger`` in the working folder would be imported instead of the package by a script run from it, where the
#: package is installed in editable mode: a hyphen is never a module name)
ROOT = "trainledger-runs"

_said: set[str] = set()
_lock = threading.Lock()
#: The run ``init`` made last and ``finish`` has not ended (``trainledger.run``)
current: Run | None = None


def _say_once(what: str, message: str) -> None:
    """One line on stderr the first time ``what`` comes up in this process."""
    with _lock:
        if what in _said:
            return
        _said.add(what)
    sys.stderr.write(f"trainledger: {message}\n")


class Settings:
    """W&B's ``wandb.Settings(...)``: accepted, kept, and reported once (none changes what is recorded)."""

    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class Config:
    """``run.config`` / ``wandb.config``: attribute and item access; every change is recorded (``config_logged``)."""

    def __init__(self, run: Run | None, values: dict[str, Any] | None = None):
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_values", dict(values or {}))

    def update(self, d: Any = None, allow_val_change: bool | None = None, **kwargs: Any) -> None:
        """Set every key of ``d`` (a mapping or an ``argparse.Namespace``) and of ``kwargs``; recorded as one
        ``config_logged``."""
        from trainledger.training.kinds import config_values

        try:
            changed = {**(config_values(d) if d is not None else {}), **config_values(kwargs)}
        except ValueError as e:
            raise TypeError(f"config.update: {e}") from None
        if changed:
            self._values.update(changed)
            if self._run is not None:
                self._run._record_config(changed, "config")

    def setdefaults(self, d: Mapping[str, Any]) -> dict[str, Any]:
        """Set the keys of ``d`` not set yet; returns the whole configuration."""
        self.update({k: v for k, v in d.items() if k not in self._values})
        return dict(self._values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def keys(self):
        return self._values.keys()

    def items(self):
        return self._values.items()

    def values(self):
        return self._values.values()

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(f"config has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(self._values)


def _nothing(build: Any, arg: Any) -> None:
    return None


class Summary:
    """``run.summary``: the last value of every logged metric (or its min/max/mean where ``define_metric`` asked),
    and values set by hand, which ``finish`` records (``metrics_logged``, source ``summary``)."""

    def __init__(self, sync: Any = None) -> None:
        object.__setattr__(self, "_auto", {})  # made by the journal's drain, in order: sync() before reading it
        object.__setattr__(self, "_set", {})
        object.__setattr__(self, "_sync", sync)

    def update(self, d: Mapping[str, Any]) -> None:
        self._set.update(d)

    def _merged(self) -> dict[str, Any]:
        if self._sync is not None:  # the rows still queued made into values first
            self._sync()
        return {**self._auto, **self._set}

    def get(self, key: str, default: Any = None) -> Any:
        return self._merged().get(key, default)

    def keys(self):
        return self._merged().keys()

    def items(self):
        return self._merged().items()

    def __getitem__(self, key: str) -> Any:
        return self._merged()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._set[key] = value

    def __getattr__(self, key: str) -> Any:
        try:
            return self._merged()[key]
        except KeyError:
            raise AttributeError(f"summary has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self._set[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._merged()

    def __repr__(self) -> str:
        return repr(self._merged())


def _numbers(row: Mapping[str, Any], what: str) -> dict[str, float]:
    """``metric_values`` of ``row``; a value that is not a number is left out, its name said once on stderr."""
    try:
        return metric_values(row)
    except ValueError:  # one value is not a number: the others are recorded
        numbers: dict[str, float] = {}
        for k, v in row.items():
            try:
                numbers.update(metric_values({k: v}))
            except ValueError as e:
                _say_once(f"{what}-{k}", f"{'' if what == 'value' else what + ' '}{e}: left out of the journal")
        return numbers


class Run:
    """A W&B-style run over a signed journal (what :func:`init` returns)."""

    def __init__(self, path: Path, journal: Any, *, project: str, name: str, run_id: str, step: int,
                 config: dict[str, Any], resumed: bool, source: str = "wandb"):
        self.dir = str(path)
        self.path = path
        self.journal = journal
        self.project = project
        self.name = name
        self.id = run_id
        self.resumed = resumed
        self._step = step  # the step the next committed row gets
        self._source = source  # what metrics_logged names as the call
        self._row: dict[str, Any] = {}
        self._metric_rules: dict[str, dict[str, Any]] = {}
        self._summary_n: dict[str, int] = {}  # values seen of each metric summarised by its mean
        self.config = Config(self, config)
        #: queues a row for the journal's next drain (Journal.append_later); nothing for a disabled run
        self._later = journal.append_later if journal is not None else _nothing
        self.summary = Summary(journal.drain if journal is not None else None)
        self._finished = False
        self._lock = threading.Lock()

    # -- logging

    @property
    def step(self) -> int:
        """The step the next committed row gets (W&B's ``run.step``)."""
        return self._step

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None,
            sync: bool | None = None) -> None:
        """W&B's ``run.log``: ``data`` joins the current row; the row is recorded (one ``metrics_logged``) and the
        step moves on when ``commit`` is true, or by default when ``step`` is not given; with ``step``, the row is
        recorded when a later step is logged (or at ``finish``). A ``step`` below the current one is ignored with a
        note, as W&B does. Values that are not numbers (images, tables, strings) are left out with a note, once per
        name: trainledger records scalars."""
        if self._finished:
            raise RuntimeError(f"this run ({self.name}) has finished: init() another")
        if step is None and commit is None and type(data) is dict and not self._row:
            # the call of nearly every loop, log(row): a row of plain numbers (immutable: taken by reference) queued
            # at the next step, made into its event (and its summary values) by the journal's next drain; kept
            # short, since it runs between a training step and the next, with the caches cold. A tensor or a nested
            # dict is read now, below (the caller may change it in place afterwards)
            for v in data.values():
                if type(v) not in PLAIN_NUMBERS:
                    break
            else:
                s = self._step
                self._step = s + 1
                self._later(self._build, (data.copy(), s))
                return
        with self._lock:
            if step is not None:
                if type(step) is not int or step < 0:
                    raise TypeError(f"log: step must be a non-negative int, got {step!r}")
                if step < self._step:
                    _say_once(f"step-back-{step}", f"log(step={step}) is below the current step {self._step}: "
                                                   "not recorded (W&B drops it too)")
                    return
                if step > self._step:
                    self._commit()
                    self._step = step
            self._row.update(data)
            if commit or (commit is None and step is None):
                self._commit()
                self._step += 1

    def _commit(self) -> None:
        """Record the current row at the current step (nothing when it is empty)."""
        row, self._row = self._row, {}
        if row:
            self._record(_numbers(row, "value"))  # read now: a tensor may change in place afterwards

    def _record(self, row: dict[str, Any]) -> None:
        """A row of plain numbers at the current step: one ``metrics_logged``, queued (never waiting for the disk or
        a signature)."""
        self._later(self._build, (row, self._step))

    def _build(self, item: tuple[dict[str, Any], int]) -> MetricsLogged | None:
        """A queued row's event, made by the journal's drain (in order, under its lock): its numbers (a value that
        is not a number left out, said once) and the summary after it. None for a row with no number."""
        row, step = item
        numbers = _numbers(row, "value")
        if not numbers:
            return None
        if self._metric_rules:
            self.summary._auto.update(self._summarised(numbers))
        else:  # every metric's summary is its last value
            self.summary._auto.update(numbers)
        return MetricsLogged(step=step, metrics=numbers, source=self._source)

    def _summarised(self, numbers: dict[str, float]) -> dict[str, float]:
        """The summary's values after this row: the last value, or min/max/mean/best where ``define_metric`` asked
        (``none``: no value)."""
        out = {}
        for k, v in numbers.items():
            rule = self._metric_rules.get(k) or {}
            how = rule.get("summary") or "last"
            if how == "best":  # W&B's: the lowest, or the highest with goal="maximize"
                how = "max" if str(rule.get("goal", "minimize")).startswith("max") else "min"
            old = self.summary._auto.get(k)
            if how == "none":
                self.summary._auto.pop(k, None)
                continue
            if how == "min" and old is not None:
                v = min(old, v)
            elif how == "max" and old is not None:
                v = max(old, v)
            elif how == "mean":  # the running mean of every value logged
                n = self._summary_n.get(k, 0) + 1
                self._summary_n[k] = n
                v = v if old is None or n == 1 else old + (v - old) / n
            out[k] = v
        return out

    def define_metric(self, name: str, step_metric: str | None = None, step_sync: bool | None = None,
                      hidden: bool | None = None, summary: str | None = None, goal: str | None = None,
                      overwrite: bool | None = None) -> dict[str, Any]:
        """W&B's ``define_metric``: how a metric is charted and summarised; recorded (``config_logged``, source
        ``define_metric``). ``summary`` sets what ``run.summary`` holds for it: ``last`` (the default), ``min``,
        ``max``, ``mean``, ``best`` (``min``, or ``max`` with ``goal="maximize"``) or ``none``."""
        rule = {k: v for k, v in (("step_metric", step_metric), ("summary", summary), ("goal", goal),
                                  ("hidden", hidden)) if v is not None}
        if summary is not None and summary not in ("min", "max", "last", "mean", "best", "none", "copy"):
            raise ValueError(f"define_metric: summary must be min, max, last, mean, best or none, got {summary!r}")
        self._metric_rules[name] = rule
        self._record_config({name: rule}, "define_metric")
        return rule

    def watch(self, *args: Any, **kwargs: Any) -> None:
        _say_once("watch", "watch() records no gradients or parameters (W&B's histograms): the Recorder's "
                           "grad_norm is the receipt trainledger keeps")

    def _record_config(self, changed: dict[str, Any], source: str) -> None:
        from trainledger.training.kinds import ConfigLogged

        if self._finished:
            raise RuntimeError(f"this run ({self.name}) has finished: its configuration is closed")
        self.journal.append(ConfigLogged(config=changed, source=source, step=self._step - 1 if self._step else None))

    # -- ending

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """Record the last row and the summary values set by hand, and close the journal (signed, durable).
        A non-zero ``exit_code`` closes it as ``failed``."""
        global current
        if self._finished:
            return
        with self._lock:
            self._commit()
            if self.summary._set:
                numbers = _numbers(self.summary._set, "summary")
                if numbers:
                    self.journal.append(MetricsLogged(step=max(0, self._step - 1), metrics=numbers,
                                                      source="summary"))
            self._finished = True
            if exit_code:
                self.journal.close(status="failed", reason=f"exit code {exit_code}")
            else:
                self.journal.close()
        if current is self:
            current = None
        if not quiet:
            sys.stderr.write(f"trainledger: run {self.name} finished: {self.journal.path} "
                             f"(trainledger verify {self.path})\n")

    def _suspend(self) -> None:
        """At an exit by an uncaught exception: the last row recorded, the journal left open (resume continues it)."""
        if self._finished:
            return
        self._commit()
        self._finished = True
        self.journal.suspend()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(exit_code=1 if exc_type is not None else None)

    def __repr__(self) -> str:
        return f"<trainledger Run {self.project}/{self.name} at {self.path}>"


# W&B's keyword arguments that change nothing here, and those that are kept as the run's metadata
_IGNORED = ("entity", "save_code", "anonymous", "sync_tensorboard", "monitor_gym", "magic", "allow_val_change",
            "force", "reinit", "fork_from", "resume_from", "settings")
_KEPT = ("tags", "notes", "group", "job_type")


def init(project: str | None = None, name: str | None = None, config: Any = None, dir: str | os.PathLike | None = None,
         resume: bool | str | None = None, id: str | None = None, mode: str | None = None,
         key: str | os.PathLike | None = None, **kwargs: Any) -> Run:
    """W&B's ``wandb.init``: a run folder ``DIR/trainledger-runs/PROJECT/NAME`` (``DIR`` the working folder by default;
    ``NAME`` the ``name``, else the ``id``, else a new id) and its signed journal. ``resume``: ``"allow"``, ``"auto"``
    or ``True`` continue the folder's open journal (a process killed mid-run) or start it; ``"must"`` only
    continues; ``None``/``"never"`` refuse a folder that holds a run already. ``key``: the signing key (default:
    the user's, made on first use). ``mode="disabled"`` records nothing (said once). ``tags``, ``notes``, ``group``
    and ``job_type`` go into the run's metadata; any other W&B keyword is accepted and named once on stderr."""
    global current
    from trainledger.journal.errors import UsageError

    if current is not None and not current._finished:
        current.finish(quiet=True)  # W&B finishes the previous run of the process, too
    ignored = sorted(k for k in kwargs if k not in _KEPT)
    if ignored:
        _say_once("init-" + ",".join(ignored), f"init: {', '.join(ignored)} change nothing in a local signed "
                                               "journal: accepted and not used")
    if mode == "disabled":
        _say_once("disabled", "init(mode='disabled'): nothing of this run is recorded")
        current = _DisabledRun(project or "uncategorized", name or id or "disabled", config)
        return current
    project = project or os.environ.get("WANDB_PROJECT") or "uncategorized"
    run_id = id or os.environ.get("WANDB_RUN_ID") or secrets.token_hex(4)
    run_name = name or run_id
    for what, value in (("project", project), ("name", run_name)):
        if not value or value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
            raise UsageError(f"init: {what} {value!r} cannot name a folder")
    base = Path(dir) if dir is not None else Path(".")
    path = base / ROOT / project / run_name
    journal_path = path / "journal.jsonl"
    resume_mode = {True: "allow", "auto": "allow", "allow": "allow", "must": "must", False: None, "never": None,
                   None: None}.get(resume, "invalid")  # type: ignore[call-overload]
    if resume_mode == "invalid":
        raise UsageError(f"init: resume must be 'allow', 'must', 'never', 'auto', True or False, got {resume!r}")
    if journal_path.exists() and resume_mode is None:
        raise UsageError(f"init: {path} holds a run already: resume='allow' continues it, or give another name")
    if not journal_path.exists() and resume_mode == "must":
        raise UsageError(f"init: resume='must', but {path} holds no run to continue")
    from trainledger.training.kinds import ConfigLogged, config_values

    try:
        values = config_values(config) if config is not None else {}
    except ValueError as e:
        raise UsageError(f"init: {e}") from None
    meta = {"tracking": "wandb", "project": project, "name": run_name, "id": run_id,
            **{k: config_values({k: kwargs[k]})[k] for k in _KEPT if k in kwargs}}
    journal, resumed = _open_journal(path, key, meta, "init")
    step = 0
    if resumed:
        step, values = _resumed_state(journal, values)
    run = Run(path, journal, project=project, name=run_name, run_id=run_id, step=step, config=values,
              resumed=resumed)
    if values and not resumed:
        journal.append(ConfigLogged(config=values, source="init"))
    elif resumed and config is not None:
        journal.append(ConfigLogged(config=config_values(config), source="init"))
    current = run
    return run


def _open_journal(path: Path, key: str | os.PathLike | None, meta: dict[str, Any], who: str) -> tuple[Any, bool]:
    """``path/journal.jsonl``: continued when it exists and is open, else created (``meta`` in its ``run_opened``);
    signed with ``key``, or the user's default key (made on first use, named once); the public key written beside
    it. Returns the journal and whether it was continued. A finished run is never reopened (:class:`UsageError`)."""
    from trainledger.journal import Journal
    from trainledger.journal.errors import JournalClosed, UsageError
    from trainledger.journal.keys import default_key, load_signer, publish_key

    if key is None:
        priv = default_key()
        _say_once("key", f"signing with {priv} (the key of your runs; pass key= for another)")
        key = priv
    signer = load_signer(key)
    journal_path = path / "journal.jsonl"
    resumed = journal_path.exists()
    try:
        if resumed:
            journal = Journal.open_append(journal_path, signer=signer)
        else:
            path.mkdir(parents=True, exist_ok=True)
            journal = Journal.create(journal_path, signer=signer, meta=meta)
    except JournalClosed:
        raise UsageError(f"{who}: the run in {path} has finished; give the new run another name") from None
    publish_key(path, signer.public)
    return journal, resumed


def _resumed_state(journal: Any, values: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The step after the last one the journal's signed history logged, and its configuration (the fold of its
    ``config_logged``), with ``values`` given now on top."""
    from trainledger.training.checkpoints.state import signed_history

    step, config = 0, {}
    for ev in signed_history(journal):
        tag = type(ev).__struct_config__.tag
        if tag == "metrics_logged" and ev.source in ("wandb", "tensorboard"):
            step = max(step, ev.step + 1)
        elif tag == "config_logged" and ev.source in ("init", "config"):
            config.update(ev.config)
    return step, {**config, **values}


class _DisabledRun(Run):
    """``mode="disabled"``: the same calls, nothing recorded."""

    def __init__(self, project: str, name: str, config: Any):
        super().__init__(Path(), None, project=project, name=name, run_id=name, step=0, config={}, resumed=False)
        self.dir = ""
        if config is not None:
            self.config.update(config)  # kept in memory: _record_config records nothing here

    def _commit(self) -> None:
        self._row = {}

    def _record_config(self, changed: dict[str, Any], source: str) -> None:
        pass

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        global current
        self._finished = True
        if current is self:
            current = None

    def _suspend(self) -> None:
        self._finished = True


def _current(what: str) -> Run:
    if current is None:
        raise RuntimeError(f"{what}: call trainledger.init() first")
    return current


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None, sync: bool | None = None) -> None:
    """``wandb.log``: :meth:`Run.log` of the current run."""
    run = current
    if run is None:
        raise RuntimeError("log: call trainledger.init() first")
    if step is None and commit is None and type(data) is dict and not run._row and not run._finished:
        for v in data.values():  # Run.log's own first lines, one call fewer (this runs with the caches cold)
            if type(v) not in PLAIN_NUMBERS:
                break
        else:
            s = run._step
            run._step = s + 1
            run._later(run._build, (data.copy(), s))
            return
    run.log(data, step, commit)


def define_metric(name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``wandb.define_metric``: :meth:`Run.define_metric` of the current run."""
    return _current("define_metric").define_metric(name, *args, **kwargs)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """``wandb.finish``: :meth:`Run.finish` of the current run (nothing without one)."""
    if current is not None:
        current.finish(exit_code=exit_code, quiet=quiet)


def watch(*args: Any, **kwargs: Any) -> None:
    """``wandb.watch``: no gradient or parameter histograms here (said once)."""
    _say_once("watch", "watch() records no gradients or parameters (W&B's histograms): the Recorder's grad_norm "
                       "is the receipt trainledger keeps")


def login(*args: Any, **kwargs: Any) -> bool:
    """``wandb.login``: nothing to log in to (the journal is local and signed by your key)."""
    return True


def save(*args: Any, **kwargs: Any) -> None:
    """``wandb.save``: files are not uploaded anywhere (said once)."""
    _say_once("save", "save() uploads nothing: the run folder is yours already")


@atexit.register
def _at_exit() -> None:
    """W&B finishes a run when its process ends: here the run is closed at a normal exit, and left open (sealed,
    resumable with resume='allow') after an uncaught exception."""
    run = current
    if run is None or run._finished:
        return
    try:
        if getattr(sys, "last_value", None) is not None:  # the interpreter reported an uncaught exception
            run._suspend()
        else:
            run.finish(quiet=True)
    except Exception as e:  # noqa: BLE001 - at exit: one line, never a traceback
        sys.stderr.write(f"trainledger: the run could not be closed at exit: {' '.join(str(e).split())[:200]}\n")


class SummaryWriter:
    """TensorBoard's ``SummaryWriter`` (``from trainledger import SummaryWriter`` instead of
    ``from torch.utils.tensorboard import SummaryWriter``): ``add_scalar``, ``add_scalars``, ``add_hparams``,
    ``flush`` and ``close`` into ``LOG_DIR/journal.jsonl``, signed (``key=``, or the user's default key).

    The scalars of one ``global_step`` are recorded as one ``metrics_logged`` (source ``tensorboard``) when a call
    names another step, or at ``flush``/``close``; ``global_step=None`` is the last step named (0 before any).
    ``add_hparams`` records the hyperparameters (``config_logged``, source ``hparams``) and its metrics. A
    ``LOG_DIR`` whose journal is open (a process killed mid-run) is continued; a finished one is refused. The other
    ``add_*`` calls (histograms, images, text, graphs) record nothing and say so once."""

    def __init__(self, log_dir: str | os.PathLike | None = None, comment: str = "", purge_step: int | None = None,
                 max_queue: int = 10, flush_secs: int = 120, filename_suffix: str = "", *,
                 key: str | os.PathLike | None = None):
        if log_dir is None:  # TensorBoard's default: runs/MONTHDAY_HH-MM-SS_HOST+COMMENT
            import socket
            import time

            log_dir = os.path.join("runs", time.strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname() + comment)
        path = Path(log_dir)
        self.log_dir = str(path)
        journal, resumed = _open_journal(path, key, {"tracking": "tensorboard", "log_dir": path.name},
                                         "SummaryWriter")
        step = _resumed_state(journal, {})[0] if resumed else 0
        self._run = Run(path, journal, project=path.parent.name, name=path.name, run_id=path.name,
                        step=max(0, step - 1), config={}, resumed=resumed, source="tensorboard")
        self._closed = False

    def _add(self, values: Mapping[str, Any], global_step: Any) -> None:
        if self._closed:
            raise RuntimeError(f"SummaryWriter({self.log_dir!r}) is closed")
        run = self._run
        with run._lock:
            if global_step is not None:
                step = int(global_step)
                if step != run._step:
                    run._commit()
                    run._step = max(0, step)
            run._row.update(values)

    def add_scalar(self, tag: str, scalar_value: Any, global_step: Any = None, walltime: float | None = None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        self._add({tag: scalar_value}, global_step)

    def add_scalars(self, main_tag: str, tag_scalar_dict: Mapping[str, Any], global_step: Any = None,
                    walltime: float | None = None) -> None:
        """Each ``main_tag/tag`` as a scalar of its own (TensorBoard writes them to sub-runs of that name)."""
        self._add({f"{main_tag}/{k}": v for k, v in tag_scalar_dict.items()}, global_step)

    def add_hparams(self, hparam_dict: Mapping[str, Any], metric_dict: Mapping[str, Any],
                    hparam_domain_discrete: Any = None, run_name: str | None = None,
                    global_step: Any = None) -> None:
        """The hyperparameters (``config_logged``, source ``hparams``) and the metrics they scored."""
        from trainledger.training.kinds import config_values

        self._run._record_config(config_values(dict(hparam_dict), what="hparam_dict"), "hparams")
        self._add(dict(metric_dict), global_step)

    def _unsupported(self, what: str) -> None:
        _say_once(f"tb-{what}", f"SummaryWriter.{what}: not recorded (trainledger records scalars and "
                                "hyperparameters)")

    def add_histogram(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_histogram")

    def add_image(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_image")

    def add_images(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_images")

    def add_figure(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_figure")

    def add_text(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_text")

    def add_graph(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_graph")

    def add_embedding(self, *args: Any, **kwargs: Any) -> None:
        self._unsupported("add_embedding")

    def flush(self) -> None:
        """Record the scalars of the current step now and hand the journal's lines to the OS."""
        if self._closed:
            return
        with self._run._lock:
            self._run._commit()
        self._run.journal.flush()

    def close(self) -> None:
        """Record what is pending and close the journal (signed, durable)."""
        if self._closed:
            return
        self._closed = True
        self._run.finish(quiet=True)

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # left open, sealed: the same log_dir continues it
            self._closed = True
            self._run._suspend()
