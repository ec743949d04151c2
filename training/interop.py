"""Bring the logs users already have: ``trainledger import tensorboard|megatron``, and ``export tensorboard``.

An import writes a signed journal whose ``run_opened`` says it was imported: from which files (name, bytes and
SHA-256 of each), by which tool, when. It attests what the files said at import time, never that the run happened;
every command that shows such a journal says "imported". The steps go through the health projection as they are
written (the anomalies they imply are recorded, and replay recomputes them), so ``replay``, ``query`` and
``report`` work on old runs and a loss spike in an old log is found.

- TensorBoard event files: each record's CRC checked (google-crc32c) and parsed with the ``tensorboard`` package's
  event protos (the ``tensorboard`` extra); scalars by tag; the loss, grad-norm and learning-rate tags become ``step_observed`` fields, every other scalar a
  ``metrics_logged``.
- Megatron-LM / DeepSpeed-style logs: the iteration lines (``iteration N/ M | ... | lm loss: X | grad norm: Y |
  learning rate: Z | elapsed time per iteration (ms): T | number of skipped iterations: S | number of nan
  iterations: K |``). A line that starts like one but does not parse is counted and named (its line number), as is
  a last line cut off without its newline; nothing is dropped silently.
"""

from __future__ import annotations

import math
import os
import re
import time
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainledger.journal import __version__
from trainledger.journal.paths import file_sha256
from trainledger.journal.errors import JournalIOError, UsageError
from trainledger.journal.events import StepObserved
from trainledger.training.health.detectors import HealthProjection
from trainledger.journal.keys import Signer
from trainledger.training.kinds import ConfigLogged, MetricsLogged
from trainledger.journal.writer import Journal

__all__ = ["import_tensorboard", "import_megatron", "import_wandb", "import_mlflow", "export_tensorboard", "ImportResult",
           "LOSS_TAGS", "GRAD_NORM_TAGS", "LR_TAGS"]

LOSS_TAGS = ("loss", "train/loss", "train_loss", "Loss/train", "train/lm_loss", "lm loss", "lm-loss")
GRAD_NORM_TAGS = ("grad_norm", "train/grad_norm", "grad-norm", "grad norm", "gradient_norm")
LR_TAGS = ("lr", "learning_rate", "train/learning_rate", "learning-rate", "learning rate")


class ImportResult:
    def __init__(self, journal: Path, steps: int, metrics: int, skipped: list[tuple[int, str]], files: int):
        self.journal, self.steps, self.metrics, self.skipped, self.files = journal, steps, metrics, skipped, files


def _source(paths: list[Path], root: Path) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        digest, n = file_sha256(p)
        out.append({"file": p.relative_to(root).as_posix() if p.is_relative_to(root) else p.name, "bytes": n,
                    "sha256": digest})
    return out


def _new_journal(out_dir: Path, signer: Signer, tool: str, files: list[dict[str, Any]], note: str) -> Journal:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "journal.jsonl"
    if path.exists():
        raise UsageError(f"{path}: already exists; import into a new folder")
    imported = {"tool": tool, "by": f"trainledger {__version__}", "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": files, "note": note}
    return Journal.create(path, signer=signer, run_id=f"imported-{tool}-{files[0]['sha256'][:12]}" if files else None,
                          meta={"imported": imported})


class _Emitter:
    """Steps through the health projection, as the monitor writes them: the event, then what it implies."""

    def __init__(self, j: Journal):
        self.j, self.proj, self.steps, self.metrics = j, HealthProjection(), 0, 0

    def step(self, ev: StepObserved) -> None:
        self.j.append(ev)
        for a in self.proj.apply(ev):
            self.j.append(a)
        for x in self.proj.take_suspected():
            self.j.append(x)
        self.steps += 1

    def other(self, step: int, metrics: dict[str, float], source: str) -> None:
        if metrics:
            self.j.append(MetricsLogged(step=step, metrics=metrics, source=source))
            self.metrics += len(metrics)


def _pick_tags(names: set[str], loss_tag: str | None, grad_norm_tag: str | None,
               lr_tag: str | None) -> tuple[str | None, str | None, str | None]:
    """The names of the loss, grad-norm and learning-rate series: each as given, else the first usual one the
    source holds."""
    def pick(given: str | None, known: tuple[str, ...]) -> str | None:
        return given if given is not None else next((t for t in known if t in names), None)
    return pick(loss_tag, LOSS_TAGS), pick(grad_norm_tag, GRAD_NORM_TAGS), pick(lr_tag, LR_TAGS)


def _write_rows(j: Journal, rows: Iterable[tuple[int, dict[str, float]]], held: dict[str, int],
                config: dict[str, Any], tags: tuple[str | None, str | None, str | None], source: str,
                lacking: str) -> _Emitter:
    """An import's rows (step, {name: value}) into ``j``, after its configuration (``config_logged``): a row with
    the loss as a step (the grad-norm and learning-rate values its fields), every other value a ``metrics_logged``.
    Each name's points written are held to ``held``, the source's count, before the journal is closed; a name short
    of it fails the import (``lacking`` names where). The journal is suspended on any failure."""
    lt, gt, rt = tags
    em = _Emitter(j)
    got: dict[str, int] = {}
    try:
        if config:
            j.append(ConfigLogged(config=config, source=source))
        for step, vals in rows:
            rest = dict(vals)
            if lt is not None and lt in vals:
                em.step(StepObserved(step=step, loss=rest.pop(lt), grad_norm=_finite_or_none(rest.pop(gt, None)),
                                     lr=_finite_or_none(rest.pop(rt, None))))
            em.other(step, rest, source)
            for t in vals:  # the row's names, each now written: its step's fields or its metrics_logged
                got[t] = got.get(t, 0) + 1
        short = sorted((n, held[n] - got.get(n, 0)) for n in held if got.get(n, 0) != held[n])
        if short:
            raise JournalIOError(f"{lacking}: " + ", ".join(f"{n} ({c})" for n, c in short[:10]))
        j.close()
    except BaseException:
        j.suspend()
        raise
    return em


def _finite_or_none(v: float | None) -> float | None:
    return None if v is None else float(v)


# ---------------------------------------------------------------- TensorBoard

def _event_files(logdir: Path) -> list[Path]:
    if logdir.is_file():
        return [logdir]
    files = sorted(p for p in logdir.rglob("*") if p.is_file() and "tfevents" in p.name)
    if not files:
        raise UsageError(f"{logdir}: no TensorBoard event files (*tfevents*) in it")
    return files


_MAX_RECORD = 256 << 20  # an event record above this is not a scalar log's; refused rather than read
_MAX_LINE = 1 << 20  # a log line above this is counted and skipped, never read whole


def _records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file (an event file's framing: length, its masked CRC-32C, data, its masked
    CRC-32C), every CRC checked. Read here rather than with the tensorboard package's record reader, whose
    pure-Python CRC costs ~24 us a record (a million-scalar log: half a minute); google-crc32c checks in C."""

    try:
        import google_crc32c
    except ImportError:
        raise UsageError("importing TensorBoard logs needs google-crc32c: pip install 'trainledger[tensorboard]'") \
            from None

    def masked(b: bytes) -> int:
        c = google_crc32c.value(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    with open(path, "rb") as f:  # record by record: memory stays flat in the file's size
        pos = 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"a record header cut off at byte {pos} (a truncated file)")
            header = head[:8]
            (length,), (hcrc,) = struct.unpack("<Q", header), struct.unpack("<I", head[8:])
            if masked(header) != hcrc:
                raise ValueError(f"the record at byte {pos} has a bad length CRC")
            if length > _MAX_RECORD:
                raise ValueError(f"the record at byte {pos} claims {length:,} bytes (more than an event holds)")
            body = f.read(length)
            tail = f.read(4)
            if len(body) < length or len(tail) < 4:
                raise ValueError(f"the record at byte {pos} is cut off (a truncated file)")
            if masked(body) != struct.unpack("<I", tail)[0]:
                raise ValueError(f"the record at byte {pos} has a bad data CRC")
            yield body
            pos += 16 + length


def _scalars(path: Path) -> Iterator[tuple[int, str, float]]:
    """(step, tag, value) of every scalar in an event file: ``simple_value`` (torch's SummaryWriter, TF1) and
    rank-0 float tensors (TF2's tf.summary). The protos are the tensorboard package's."""
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        raise UsageError("importing TensorBoard logs needs the tensorboard package: "
                         "pip install 'trainledger[tensorboard]'") from None

    parse = event_pb2.Event.FromString
    for body in _records(path):
        ev = parse(body)
        if not ev.HasField("summary"):
            continue
        for v in ev.summary.value:
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                yield ev.step, v.tag, float(v.simple_value)
            elif kind == "tensor" and not v.tensor.tensor_shape.dim:
                t = v.tensor
                if t.dtype == 1:  # DT_FLOAT
                    x = t.float_val[0] if t.float_val else struct.unpack("<f", t.tensor_content[:4])[0]
                elif t.dtype == 2:  # DT_DOUBLE
                    x = t.double_val[0] if t.double_val else struct.unpack("<d", t.tensor_content[:8])[0]
                else:
                    continue
                yield ev.step, v.tag, float(x)


def import_tensorboard(logdir: str | os.PathLike, out_dir: str | os.PathLike, signer: Signer, *,
                       loss_tag: str | None = None, grad_norm_tag: str | None = None,
                       lr_tag: str | None = None) -> ImportResult:
    """Import every scalar of a TensorBoard log folder (or one event file) into a new signed journal."""
    root = Path(logdir)
    if not root.exists():
        raise UsageError(f"{root}: no such file or folder")
    files = _event_files(root)
    by_step: dict[int, dict[str, float]] = {}
    for f in files:
        try:
            for step, tag, value in _scalars(f):
                by_step.setdefault(int(step), {})[tag] = value
        except (OSError, ValueError) as e:  # a truncated record, a bad CRC: say which file
            raise JournalIOError(f"{f}: not a readable TensorBoard event file ({type(e).__name__}: {e})") from None
    tags = {t for vals in by_step.values() for t in vals}
    lt, gt, rt = _pick_tags(tags, loss_tag, grad_norm_tag, lr_tag)
    if lt is None or lt not in tags:
        raise UsageError(f"{root}: no loss tag found (tags: {', '.join(sorted(tags)[:12])}); name it with --loss-tag")
    j = _new_journal(Path(out_dir), signer, "tensorboard", _source(files, root if root.is_dir() else root.parent),
                     f"scalars by tag; loss {lt!r}, grad norm {gt!r}, learning rate {rt!r}")
    em = _Emitter(j)
    try:
        for step in sorted(by_step):
            vals = by_step[step]
            if lt in vals:
                em.step(StepObserved(step=step, loss=vals[lt], grad_norm=_finite_or_none(vals.get(gt)),
                                     lr=_finite_or_none(vals.get(rt))))
            em.other(step, {t: v for t, v in vals.items() if t not in (lt, gt, rt)},
                     "tensorboard")
        j.close()
    except BaseException:
        j.suspend()
        raise
    return ImportResult(j.path, em.steps, em.metrics, [], len(files))


# ---------------------------------------------------------------- W&B

def _wandb_file(run: Path) -> Path:
    """The ``.wandb`` file of an offline run: ``run`` itself, or the one in its folder (``wandb/offline-run-*``)."""
    if run.is_file():
        return run
    found = sorted(run.glob("*.wandb"))
    if len(found) == 1:
        return found[0]
    if not found:
        inner = sorted(p.name for p in run.glob("*run-*") if p.is_dir())
        raise UsageError(f"{run}: no .wandb file in it" + (f"; its runs: {', '.join(inner[:5])} (import one)" if inner
                                                           else " (an offline run's folder: wandb/offline-run-*)"))
    raise UsageError(f"{run}: {len(found)} .wandb files in it; name one")


_WANDB_HEADER = b":W&B\xe1\xbe\x00"  # ident, magic 0xBEE1 (little-endian), version 0
_WANDB_BLOCK = 32768
_WANDB_MAX_RECORD = 64 << 20  # a record past this (chunks joined) is not a scalar log's; refused, not read on


def _zeros_to_end(f: Any) -> bool:
    """Whether nothing but zero bytes is left in ``f`` (read a MiB at a time; stops at the first byte that is not)."""
    while True:
        piece = f.read(1 << 20)
        if not piece:
            return True
        if piece.strip(b"\0"):
            return False


def _wandb_frames(path: Path) -> Iterator[bytes | None]:
    """The records of a ``.wandb`` file: W&B's transaction log, LevelDB's log format (32 KiB blocks; each chunk a
    CRC-32 of its type byte and data, a length, a type: whole, first, middle or last) behind a 7-byte header. The
    Python ``wandb`` package no longer ships a reader of it (from 0.18 its Go service reads it); this one follows
    the format the package's own writer documented, every chunk's CRC checked with ``zlib``. A record cut off in the
    file's last block (a run killed while writing: the chunk runs past the end, or only zeros follow it) yields None
    and ends the file; any other break, a bad chunk with data after it included, is an error."""
    import zlib

    crcs = [zlib.crc32(bytes([t])) for t in range(5)]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(7) != _WANDB_HEADER:
            raise JournalIOError(f"{path}: not a W&B run file (no :W&B header)")
        pos = 7
        parts: list[bytes] | None = None
        joined = 0
        while True:
            left = _WANDB_BLOCK - pos % _WANDB_BLOCK
            if left < 7:  # a block's tail too short for a chunk header: zeros
                f.read(left)
                pos += left
            head = f.read(7)
            if not head:
                if parts is not None:
                    yield None
                return
            last_block = pos > size - _WANDB_BLOCK
            if len(head) < 7:
                if last_block:
                    yield None
                    return
                raise JournalIOError(f"{path}: a chunk header cut off at byte {pos}")
            crc, n, kind = struct.unpack("<IHB", head)
            data = f.read(n)
            bad = (len(data) < n or kind not in (1, 2, 3, 4) or
                   zlib.crc32(data, crcs[kind]) & 0xFFFFFFFF != crc)
            if bad:
                # what a killed writer leaves: its last chunk half written, at the end of the file (or zeros after
                # it, where the system lost the tail). A bad chunk with records after it is damage, not a cut.
                if len(data) < n or _zeros_to_end(f):
                    yield None
                    return
                raise JournalIOError(f"{path}: the chunk at byte {pos} is corrupt (its CRC or framing), and the "
                                     "file goes on after it: damaged, not cut off")
            pos += 7 + n
            if kind == 1:
                if parts is not None:
                    raise JournalIOError(f"{path}: byte {pos}: a whole record inside a split one")
                yield data
            elif kind == 2:
                parts, joined = [data], n
            else:
                if parts is None:
                    raise JournalIOError(f"{path}: byte {pos}: the middle or end of a record that never began")
                parts.append(data)
                joined += n
                if joined > _WANDB_MAX_RECORD:
                    raise JournalIOError(f"{path}: a record of more than {_WANDB_MAX_RECORD >> 20} MiB at byte {pos}")
                if kind == 4:
                    yield b"".join(parts)
                    parts = None


def _wandb_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(index, record) of every record of a ``.wandb`` file (:func:`_wandb_frames`), each parsed with the wandb
    package's own protobuf schema (``wandb.proto.wandb_internal_pb2.Record``); ``(index, None)`` last for a file
    cut off by a killed run."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise UsageError("importing a W&B run needs the wandb package: pip install 'trainledger[wandb]'") from None
    for k, data in enumerate(_wandb_frames(path)):
        if data is None:
            yield k, None
            return
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError
            raise JournalIOError(f"{path}: record {k} does not parse ({type(e).__name__})") from None
        yield k, rec


def _wandb_items(items: Any) -> Iterator[tuple[str, str]]:
    """(name, value JSON) of a history row's or config's items; a nested key joined with "/" as W&B shows it."""
    for it in items:
        key = "/".join(it.nested_key) if len(it.nested_key) else it.key
        yield key, it.value_json


def import_wandb(run_dir: str | os.PathLike, out_dir: str | os.PathLike, signer: Signer, *,
                 loss_tag: str | None = None, grad_norm_tag: str | None = None,
                 lr_tag: str | None = None) -> ImportResult:
    """Import a W&B offline run (its folder, ``wandb/offline-run-*``, or its ``.wandb`` file) into a new signed
    journal: every logged row's numbers at its ``_step`` (the loss, grad-norm and learning-rate keys as
    ``step_observed`` fields when the row has a loss, every other number a ``metrics_logged``; booleans as 0/1; NaN
    and the infinities kept), the run's config as ``config_logged``. A value that is not a number (an image, a
    table, a string) is not a point: each is named in ``skipped`` (its row and key). The count of every name's
    points in the journal is held to the count in the file before the import is closed; a point the file holds and
    the journal lacks is named and the import fails."""
    import json

    root = Path(run_dir)
    if not root.exists():
        raise UsageError(f"{root}: no such file or folder")
    path = _wandb_file(root)
    rows: list[tuple[int, dict[str, float]]] = []
    config: dict[str, Any] = {}
    skipped: list[tuple[int, str]] = []
    meta: dict[str, Any] = {}
    held: dict[str, int] = {}   # every name's points in the file
    last_step = -1
    for k, rec in _wandb_records(path):
        if rec is None:
            skipped.append((k, "the file ends in a record cut off (a run killed while writing): read up to it"))
            break
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            meta = {"id": rec.run.run_id, "name": rec.run.display_name, "project": rec.run.project}
            for key, vj in _wandb_items(rec.run.config.update):
                if not key.startswith("_"):
                    config[key] = _json_value(vj)
        elif kind == "config":
            for key, vj in _wandb_items(rec.config.update):
                if not key.startswith("_"):   # _wandb: the tool's own settings
                    config[key] = _json_value(vj)
        elif kind == "history":
            vals: dict[str, float] = {}
            step = None
            for key, vj in _wandb_items(rec.history.item):
                v = _json_value(vj)
                if key == "_step":
                    step = v if isinstance(v, int) and not isinstance(v, bool) else None
                    continue
                if key.startswith("_"):       # _runtime, _timestamp: W&B's clock, not a logged value
                    continue
                if isinstance(v, bool):
                    v = float(v)
                if not isinstance(v, (int, float)) or len(key) > 1024:
                    what = "a name over 1024 characters" if len(key) > 1024 else f"not a number ({type(v).__name__})"
                    skipped.append((k, f"{key[:200]}: {what}"))
                    continue
                try:
                    vals[key] = float(v)
                except OverflowError:
                    skipped.append((k, f"{key[:200]}: a number past a double's range"))
                    continue
                held[key] = held.get(key, 0) + 1
            if step is None:
                step = last_step + 1          # a row logged with commit=False and no _step: the next one
            last_step = step
            if vals:
                rows.append((step, vals))
    if not rows:
        raise UsageError(f"{path}: no logged numbers in it (an empty or unsynced run?)")
    lt, gt, rt = _pick_tags(set(held), loss_tag, grad_norm_tag, lr_tag)
    j = _new_journal(Path(out_dir), signer, "wandb", _source([path], root if root.is_dir() else root.parent),
                     f"W&B run {json.dumps(meta, ensure_ascii=False)[:300]}; loss {lt!r}, grad norm {gt!r}, "
                     f"learning rate {rt!r}")
    em = _write_rows(j, rows, held, config, (lt, gt, rt), "wandb", f"{path}: the journal lacks points the file holds")
    return ImportResult(j.path, em.steps, em.metrics, skipped, 1)


def _json_value(text: str) -> Any:
    """A W&B value's JSON (``NaN`` and ``Infinity`` as Python reads them); undecodable text as the text."""
    import json

    try:
        return json.loads(text) if len(text) <= 1 << 20 else text[:200]
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's stack: the text, not a number
        return text[:200]


# ---------------------------------------------------------------- MLflow

_MLFLOW_MAX_FILE = 1 << 30   # a metric file past this is not read (a run's history is megabytes)


def _mlflow_run(root: Path) -> Path:
    """The run folder of a local MLflow file store: ``root`` itself (``mlruns/EXP/RUN``, it has ``meta.yaml`` and
    ``metrics/``), or the only run under ``root`` (``mlruns/`` or ``mlruns/EXP``)."""
    if (root / "metrics").is_dir() and (root / "meta.yaml").is_file():
        return root
    runs = sorted(p.parent for p in root.glob("*/metrics") if p.is_dir()) + \
        sorted(p.parent for p in root.glob("*/*/metrics") if p.is_dir())
    runs = [r for r in runs if (r / "meta.yaml").is_file()]
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise UsageError(f"{root}: no MLflow run in it (a local file store: mlruns/EXPERIMENT/RUN with meta.yaml "
                         "and metrics/)")
    names = ", ".join(str(r.relative_to(root)) for r in runs[:5])
    raise UsageError(f"{root}: {len(runs)} MLflow runs in it ({names}{', ...' if len(runs) > 5 else ''}); import one "
                     "(its folder)")


def _mlflow_value(text: str) -> float:
    return float(text)  # MLflow writes repr(float): nan, inf and -inf included


def import_mlflow(mlruns: str | os.PathLike, out_dir: str | os.PathLike, signer: Signer, *,
                  loss_tag: str | None = None, grad_norm_tag: str | None = None,
                  lr_tag: str | None = None) -> ImportResult:
    """Import one run of a local MLflow file store (``mlruns/``, an experiment's folder holding one run, or the run's
    folder) into a new signed journal: every line of every metric file (``timestamp value step``) a point at its
    step (the loss, grad-norm and learning-rate metrics as ``step_observed`` fields where a step has a loss, every
    other a ``metrics_logged``), the params as ``config_logged``. A line that does not parse is named (its file and
    line); the count of every metric's points in the journal is held to the file's before the import is closed."""
    root = Path(mlruns)
    if not root.exists():
        raise UsageError(f"{root}: no such file or folder")
    run = _mlflow_run(root)
    files = sorted(p for p in (run / "metrics").rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        raise UsageError(f"{run}: the run logged no metrics")
    by_step: dict[int, dict[str, float]] = {}
    held: dict[str, int] = {}
    skipped: list[tuple[int, str]] = []
    for f in files:
        name = f.relative_to(run / "metrics").as_posix()
        if f.stat().st_size > _MLFLOW_MAX_FILE:
            raise UsageError(f"{f}: {f.stat().st_size:,} bytes, more than a metric's history holds; not read")
        with open(f, "rb") as fh:
            n = 0
            while raw := fh.readline(_MAX_LINE + 1):
                n += 1
                parts = raw.split()
                try:
                    if len(raw) > _MAX_LINE or len(parts) not in (2, 3):
                        raise ValueError
                    value = _mlflow_value(parts[1].decode("ascii"))
                    step = int(parts[2]) if len(parts) == 3 else 0
                    if not -2**63 <= step < 2**63:
                        raise ValueError
                except (ValueError, UnicodeDecodeError):
                    skipped.append((n, f"{name}: line {n} is not 'timestamp value step'"))
                    continue
                row = by_step.setdefault(step, {})
                if name in row:  # the same metric twice at one step: the later line, as MLflow's own history
                    skipped.append((n, f"{name}: line {n} logs step {step} again; the later value is kept"))
                    held[name] -= 1
                row[name] = value
                held[name] = held.get(name, 0) + 1
    params: dict[str, Any] = {}
    pdir = run / "params"
    if pdir.is_dir():
        for f in sorted(p for p in pdir.rglob("*") if p.is_file() and not p.is_symlink())[:10_000]:
            with open(f, "rb") as fh:
                params[f.relative_to(pdir).as_posix()] = fh.read(1 << 16).decode("utf-8", "replace")
    lt, gt, rt = _pick_tags(set(held), loss_tag, grad_norm_tag, lr_tag)
    j = _new_journal(Path(out_dir), signer, "mlflow", _source(files, run),
                     f"MLflow run {run.name} of experiment {run.parent.name}; loss {lt!r}, grad norm {gt!r}, "
                     f"learning rate {rt!r}")
    em = _write_rows(j, ((step, by_step[step]) for step in sorted(by_step)), held, params, (lt, gt, rt), "mlflow",
                     f"{run}: the journal lacks points the store holds")
    return ImportResult(j.path, em.steps, em.metrics, skipped, len(files))


# ---------------------------------------------------------------- Megatron

_ITER = re.compile(rb"^\s*(?:\[[^\]]*\]\s*)?iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_FIELD = re.compile(rb"\s*([A-Za-z][A-Za-z0-9 _()/-]*?)\s*:\s*([-+0-9.eEnaNiIfF]+)\s*\|")


def _num(b: bytes) -> float:
    s = b.decode().lower()
    if s in ("nan", "+nan", "-nan"):
        return math.nan
    if s in ("inf", "+inf", "infinity"):
        return math.inf
    if s in ("-inf", "-infinity"):
        return -math.inf
    return float(s)


def _megatron_lines(path: Path) -> Iterator[tuple[int, bytes | None, bool]]:
    """(line number, line, complete) of every line of the log; an overlong line is ``None`` (never read whole)."""
    with open(path, "rb") as f:
        n = 0
        while raw := f.readline(_MAX_LINE + 1):
            n += 1
            if len(raw) > _MAX_LINE and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of an overlong line, in bounded reads
                    raw = f.readline(_MAX_LINE + 1)
                yield n, None, False
                continue
            yield n, raw.rstrip(b"\r\n"), raw.endswith(b"\n")


def import_megatron(logfile: str | os.PathLike, out_dir: str | os.PathLike, signer: Signer) -> ImportResult:
    """Import the iteration lines of a Megatron-LM / DeepSpeed-style training log into a new signed journal."""
    p = Path(logfile)
    if not p.is_file():
        raise UsageError(f"{p}: no such file")
    j = _new_journal(Path(out_dir), signer, "megatron", _source([p], p.parent),
                     "iteration lines: lm loss, grad norm, learning rate, elapsed time per iteration, "
                     "skipped and NaN iterations")
    em = _Emitter(j)
    skipped: list[tuple[int, str]] = []
    last_scale: float | None = None
    try:
        for n, line, complete in _megatron_lines(p):
            if line is None:
                skipped.append((n, f"longer than {_MAX_LINE:,} bytes: not read"))
                continue
            m = _ITER.match(line)
            if m is None:
                continue
            if not complete:
                skipped.append((n, "the last line is cut off (no newline): a truncated log"))
                continue
            fields = {k.strip().lower().decode(): v for k, v in _FIELD.findall(line[m.end():])}
            try:
                vals = {k: _num(v) for k, v in fields.items()}
            except ValueError:
                skipped.append((n, "a field is not a number"))
                continue
            loss = vals.get("lm loss", vals.get("loss"))
            if loss is None:
                skipped.append((n, "an iteration line without an lm loss"))
                continue
            it = int(m.group(1))
            ms = vals.get("elapsed time per iteration (ms)")
            gbs = vals.get("global batch size")
            em.step(StepObserved(step=it, loss=loss, grad_norm=vals.get("grad norm"), lr=vals.get("learning rate"),
                                 step_time_s=None if ms is None else ms / 1000.0,
                                 examples=None if gbs is None or gbs != gbs else int(gbs)))
            extra = {k: v for k, v in vals.items() if k in ("number of skipped iterations", "number of nan iterations")
                     and v}
            scale = vals.get("loss scale")
            if scale is not None and scale != last_scale:  # the loss scale when it changes (an overflow halves it)
                extra["loss scale"] = scale
                last_scale = scale
            em.other(it, extra, "megatron")
        j.close()
    except BaseException:
        j.suspend()
        raise
    return ImportResult(j.path, em.steps, em.metrics, skipped, 1)


# ---------------------------------------------------------------- export

def export_tensorboard(events: Iterable[Any], logdir: str | os.PathLike, *, run_id: str) -> int:
    """Write a verified journal's steps as TensorBoard scalars (``train/loss``, ``train/grad_norm``, ``train/lr``,
    ``train/step_time_s``, ``train/tokens``) and its anomalies (``anomalies/<kind>``, value 1) into ``logdir``;
    returns the number of scalars. TensorBoard's own event writer (the ``tensorboard`` extra), no torch."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise UsageError("exporting to TensorBoard needs the tensorboard package: "
                         "pip install 'trainledger[tensorboard]'") from None
    from trainledger.training.kinds import AnomalyDetected

    out = Path(logdir)
    out.mkdir(parents=True, exist_ok=True)
    w = EventFileWriter(str(out), filename_suffix=f".trainledger.{re.sub(r'[^A-Za-z0-9._-]', '-', run_id)[:60]}")
    n = 0

    def put(step: int, tag: str, value: float, wall: float) -> None:
        nonlocal n
        s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        w.add_event(event_pb2.Event(step=step, wall_time=wall, summary=s))
        n += 1

    try:
        for ev in events:
            wall = getattr(ev, "ts", 0) / 1e9
            if isinstance(ev, StepObserved):
                for tag, v in (("train/loss", ev.loss), ("train/grad_norm", ev.grad_norm), ("train/lr", ev.lr),
                               ("train/step_time_s", ev.step_time_s), ("train/tokens", ev.tokens)):
                    if v is not None:
                        put(ev.step, tag, float(v), wall)
            elif isinstance(ev, AnomalyDetected):
                put(ev.step, f"anomalies/{ev.kind}", 1.0, wall)
    finally:
        w.close()
    return n
