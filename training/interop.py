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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainledger.journal import __version__
from trainledger.journal.paths import file_sha256
from trainledger.journal.errors import JournalIOError, UsageError
from trainledger.journal.events import StepObserved
from trainledger.training.health.detectors import HealthProjection
from trainledger.journal.keys import Signer
from trainledger.training.kinds import MetricsLogged
from trainledger.journal.writer import Journal

__all__ = ["import_tensorboard", "import_megatron", "export_tensorboard", "ImportResult",
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
    import struct

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
    import struct

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
    pick = lambda given, known: given if given is not None else next((t for t in known if t in tags), None)  # noqa: E731
    lt, gt, rt = pick(loss_tag, LOSS_TAGS), pick(grad_norm_tag, GRAD_NORM_TAGS), pick(lr_tag, LR_TAGS)
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
