"""What the framework integrations share: the run's journal (one per rank under torchrun), checkpoint folders
recorded file by file and checked on resume, and per-step losses kept as tensors and converted in bulk."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from trainledger.journal import Journal, RunResumed, Signer, load_signer
from trainledger.journal.paths import confined
from trainledger.journal.errors import JournalClosed, UnsafePath, UsageError
from trainledger.training.kinds import CheckpointSaved, ResumeRejectedEvent, folder_digest
from trainledger.training.health.batching import NormParts
from trainledger.training.health.batching import StepBuffer  # noqa: F401 - here until 0.2.0: still importable

__all__ = ["open_run_journal", "record_checkpoint", "check_folder", "StepBuffer", "signer_from", "step_loss",
           "batch_tensors", "fingerprint_batch", "previous_run", "monitor_options", "training_dtype", "Publisher"]


def signer_from(key: str | os.PathLike | None, signer: Signer | None) -> Signer:
    if (key is None) == (signer is None):
        raise UsageError("the run's signing key is needed: key='path/to/trainledger.key' (or signer=)")
    return signer if signer is not None else load_signer(key)


def _key_stays_on_rank_0(key: Any, rank: int, world: int, rank_keys: str | None, continue_from: Any) -> bool:
    """Whether this rank can do without the run key itself: a key in a token or a service, rank keys certified by
    it (the default for such a key), and a rank other than 0 (rank 0 alone signs the roster and the anchors)."""
    from trainledger.journal.keys import is_key_uri

    return (is_key_uri(key) and world > 1 and rank != 0 and rank_keys in (None, "ephemeral")
            and continue_from is None)


class _KeyOnRankZero(Signer):
    """The run key on a rank that never signs with it (its rank key is certified by it on rank 0): its public key
    comes from the rank's certificate once the journal is open."""

    __slots__ = ("uri",)

    def __init__(self, uri: str):  # noqa: D107 - nothing to load: the key stays in the token, used by rank 0
        self.uri = uri.split("?", 1)[0]
        self.public = None

    def sign(self, message: bytes) -> bytes:
        raise UsageError(f"{self.uri}: the run key signs on rank 0 only (this rank signs with its certified key)")

    def private_pem(self) -> bytes:
        raise UsageError(f"{self.uri}: the run key is not held by this rank")

    def __repr__(self) -> str:
        return f"_KeyOnRankZero(uri={self.uri!r})"


def run_key_for_rank(key: str | os.PathLike | None, signer: Signer | None, *, info: Any = None,
                     rank_keys: str | None = None, continue_from: Any = None) -> Signer:
    """:func:`signer_from`, except on a rank that never signs with the run key (a key in a token or a service, rank
    keys certified by it, a rank other than 0 of a torchrun job: ``info``, else torchrun's environment): a stand-in
    that opens no token session and learns the public key from the rank's certificate (:func:`learn_run_key`)."""
    if signer is None and key is not None:
        if info is not None:
            rank, world = info.rank, info.world_size
        else:
            from trainledger.training.distributed.ranks import in_torchrun

            rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if in_torchrun() else (0, 1)
        if _key_stays_on_rank_0(key, rank, world, rank_keys, continue_from):
            return _KeyOnRankZero(str(key))
    return signer_from(key, signer)


def export_settings(export_dir: Any, release_key: Any, base_model: Any) -> tuple[Path | None, Any, Path | None]:
    """A callback's ``export_dir``, ``release_key`` and ``base_model``, checked: a release key releases the model
    saved to the export folder, so it needs one."""
    if release_key is not None and export_dir is None:
        raise UsageError("release_key= releases the model saved to export_dir=: give both")
    return (None if export_dir is None else Path(export_dir)), release_key, \
        (None if base_model is None else Path(base_model))


def monitor_options(model: Any, *, device_kind: str | None, compute_thresholds: dict[str, float] | None,
                    carried_flops: float | None, previous: list[Any] | None = None, peak: float | None = None,
                    dtype: str | None = None) -> dict[str, Any]:
    """What the callbacks' monitors record in ``run_configured``, as the Recorder's do (format 1.7,
    docs/compute.md): the device kind (default: the model's device's name), the peak (``peak``, given; else the
    datasheet's dense peak of that device at ``dtype``, the training precision, when the device is one
    :data:`~trainledger.training.health.flops.PEAK_FLOPS` knows; else none), the compute thresholds watched beside
    the defaults, and the model FLOPs of earlier runs counted toward them (default: a continued run's predecessor's
    total, its own carry included; ``previous``: that run's signed events)."""
    from trainledger.training.health.flops import device_kind as device_kind_of
    from trainledger.training.health.flops import device_variant, peak_flops_per_sec
    from trainledger.training.health.mfu import carried_by

    kind = device_kind or device_kind_of(model)
    settings = device_settings_of(model)
    out: dict[str, Any] = {"device_kind": kind, "compute_thresholds": compute_thresholds,
                           "peak_flops_per_sec": peak, "peak_source": None if peak is None else "given",
                           "device_settings": settings}
    if peak is None and kind is not None and dtype is not None:
        # the variant the PCI device ID names (SXM or PCIe) before the name, which does not say
        named = device_variant(settings.get("pci_device_id"))
        sheet = peak_flops_per_sec(named[1] if named is not None else kind, dtype)
        if sheet is not None:
            out["peak_flops_per_sec"], out["peak_source"] = sheet, "datasheet"
    if carried_flops is not None:
        if not (isinstance(carried_flops, (int, float)) and carried_flops >= 0 and carried_flops != float("inf")):
            raise UsageError(f"carried_flops must be a non-negative number of model FLOPs, got {carried_flops!r}")
        out["carried_flops"] = float(carried_flops)
    elif previous is not None:
        out["carried_flops"] = carried_by(previous)
    return out


def replica_options(fingerprints: bool | None, every: int | None, exclude: Any, on_divergence: str,
                    sdc_check: int | None) -> dict[str, Any]:
    """What both callbacks hold their replicas with (docs/sdc.md): the fingerprint options, and ``sdc_check`` (the
    replay checks' cadence) checked as StateWatch and ReplayCheck check theirs."""
    if sdc_check is not None:
        from trainledger.training.distributed.state_watch import _options

        _options(sdc_check, "sdc_check", on_divergence)
    return {"fingerprints": fingerprints, "every": every, "exclude": exclude, "on_divergence": on_divergence}


def device_settings_of(model: Any) -> dict[str, Any]:
    """The variant and power limit of the CUDA device ``model``'s first parameter is on, from NVML
    (:func:`trainledger.training.health.telemetry.device_settings`); empty on a CPU or where NVML cannot be read."""
    try:
        dev = next(iter(model.parameters())).device
    except (AttributeError, StopIteration, TypeError):
        return {}
    if dev.type != "cuda":
        return {}
    import torch

    from trainledger.training.health.telemetry import device_settings

    return device_settings(dev.index if dev.index is not None else torch.cuda.current_device())


def training_dtype(model: Any, *, bf16: bool = False, fp16: bool = False) -> str | None:
    """The precision the matmuls of a step run at, as the datasheet peaks are keyed: ``bf16``/``fp16`` where mixed
    precision is on, else the model's parameters' own (``float32`` is ``tf32`` where torch lets CUDA matmuls use
    TF32)."""
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    try:
        p = next(iter(model.parameters()))
    except (AttributeError, StopIteration, TypeError):
        return None
    import torch

    if p.dtype == torch.bfloat16:
        return "bf16"
    if p.dtype == torch.float16:
        return "fp16"
    if p.dtype == torch.float32:
        return "tf32" if p.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return None


def learn_run_key(signer: Signer, journal: Journal) -> None:
    """A rank that does not hold the run key learns its public key from its certificate (rank 0 signed the
    round's roster with it), once its journal is open."""
    if isinstance(signer, _KeyOnRankZero):
        signer.public = journal.public_key


def open_run_journal(run_dir: Path, signer: Signer, meta: dict[str, Any], *,
                     info: Any = None, rank_keys: str | None = None,
                     **journal_options: Any) -> tuple[Journal, int | None]:
    """``run_dir/journal.jsonl`` in one process; in a multi-process run this rank's ``run_dir/rank-NNNNN.jsonl``
    (training.distributed): the rank is ``info`` (a ``RankInfo`` a framework built), else torchrun's environment
    (``RANK`` and ``WORLD_SIZE`` set, world > 1). Continued when it exists and is open. Returns the journal and
    the rank (None for a single process). ``rank_keys``: how the ranks sign (``open_rank_journal``'s);
    ``journal_options``: ``Journal.create``'s (``fail_closed_after_s``, ``sign_in_background``, ...)."""
    from trainledger.training.distributed.ranks import in_torchrun, open_rank_journal, rank_info, rank_journal_name

    run_dir.mkdir(parents=True, exist_ok=True)
    if info is None and in_torchrun():
        info = rank_info(run_dir=run_dir)
    ranked = info is not None and info.world_size > 1
    path = run_dir / (rank_journal_name(info.rank) if ranked else "journal.jsonl")
    try:
        if ranked:
            return open_rank_journal(run_dir, signer, info=info, meta=meta, rank_keys=rank_keys,
                                     **journal_options), info.rank
        j = Journal.open_append(path, signer=signer, **journal_options) if path.exists() else \
            Journal.create(path, signer=signer, meta=meta, **journal_options)
    except JournalClosed:
        raise UsageError(f"{path}: this run is finished (closed); to go on from it, give the new run its own folder "
                         f"and name this one: continue_from={str(run_dir)!r} (Hugging Face: with "
                         f"resume_from_checkpoint='{run_dir}/checkpoint-N')") from None
    return j, None


def previous_run(prev: Path, signer: Signer) -> tuple[Any, list[Any]]:
    """A finished run that a new one continues (``continue_from=``): this process's journal in the previous
    folder, verified under this run's key; (its verify report, its signed events). ``UsageError`` when the folder
    holds no such journal."""
    from trainledger.journal import read_signed_events, verify
    from trainledger.training.distributed.ranks import journal_name

    pj = prev / journal_name()
    if not pj.is_file():
        raise UsageError(f"{pj}: no journal of the run to continue from")
    rep = verify(pj, keys=[signer.public], allow_unsealed=True)
    return rep, list(read_signed_events(pj, [signer.public]))


def _files(folder: Path) -> list[dict[str, Any]]:
    from trainledger.training.checkpoints.state import file_sha256

    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise UnsafePath(f"{p}: a link inside a checkpoint folder")
        if p.is_file():
            digest, size = file_sha256(p)
            out.append({"file": p.relative_to(folder).as_posix(), "bytes": size, "sha256": digest})
    return out


def record_checkpoint(journal: Journal, run_dir: Path, path: Path, *, step: int, contents: list[str],
                      tokens: int = 0, t0: float | None = None) -> CheckpointSaved:
    """Record, durably, a checkpoint another library (or the user's own code) wrote inside the run folder: a file
    by its digest, a folder file by file (``checkpoint_saved`` with ``files``). :func:`check_folder` checks
    either before a resume. Raises :class:`UnsafePath` for a checkpoint outside the run folder."""
    t0 = time.perf_counter() if t0 is None else t0
    try:
        rel = path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        raise UnsafePath(f"{path}: a checkpoint outside the run folder {run_dir}: save it inside") from None
    confined(run_dir, rel, what="checkpoint")
    if path.is_dir():
        files = _files(path)
        size, digest = sum(f["bytes"] for f in files), folder_digest(files)
    else:
        from trainledger.journal.paths import file_sha256

        files = None
        digest, size = file_sha256(path)
    ev = CheckpointSaved(step=step, path=rel, bytes=size, sha256=digest, contents=contents,
                         duration_s=time.perf_counter() - t0, tokens=tokens, files=files)
    journal.append(ev, durable=True)
    return ev


def check_folder(journal: Journal, run_dir: Path, folder: Path, *, keys: list[Any] | None = None,
                 history: list[Any] | None = None, reason: str = "checkpoint",
                 detail: dict[str, Any] | None = None) -> CheckpointSaved:
    """Check a checkpoint folder (or a single checkpoint file another library wrote) against the newest signed
    ``checkpoint_saved`` recording it, file by file, and
    record the verdict: ``run_resumed``, or ``resume_rejected`` and :class:`ResumeRejected` (a file changed,
    missing or added, or no signed record)."""
    from trainledger.journal import read_signed_events
    from trainledger.training.checkpoints.state import ResumeRejected

    def reject(code: str, detail: str) -> None:
        journal.append(ResumeRejectedEvent(path=rel, reason=code, detail=detail), durable=True)
        raise ResumeRejected(code, f"{rel}: {detail}")

    try:
        rel = folder.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        rel = str(folder)
        reject("resume-invalid-path", "the checkpoint folder is outside the run folder")
    if journal.public_key is None:
        reject("resume-invalid-unsigned", "an unsigned journal cannot vouch for a checkpoint")
    if history is None:  # the journal's signed events, unless the caller has just read them
        journal.flush()
        history = read_signed_events(journal.path, keys or [journal.public_key])
    record = None
    for ev in history:
        if isinstance(ev, CheckpointSaved) and ev.path == rel:
            record = ev
    if record is None:
        reject("resume-invalid-unknown-checkpoint", "no signed checkpoint_saved records this checkpoint")
    if record.files is None:  # a single file (a nanoGPT ckpt.pt)
        from trainledger.training.checkpoints.state import file_sha256

        try:
            digest = file_sha256(folder)[0]
        except OSError as e:
            reject("resume-invalid-missing-file", f"cannot read it: {e.strerror}")
        if digest != record.sha256:
            reject("resume-invalid-digest", "the file differs from its signed record")
        journal.append(RunResumed(reason=reason, from_step=record.step, checkpoint=rel,
                                  detail={"sha256": record.sha256, **_coverage(record), **(detail or {})}),
                       durable=True)
        return record
    try:
        now = {f["file"]: f for f in _files(folder)}
    except (OSError, UnsafePath) as e:
        reject("resume-invalid-missing-file", f"cannot read it: {e}")
    want = {f["file"]: f for f in record.files}
    for name, f in want.items():
        if name not in now:
            reject("resume-invalid-missing-file", f"{name} is missing")
        if now[name]["sha256"] != f["sha256"]:
            reject("resume-invalid-digest", f"{name} differs from its signed record")
    extra = sorted(set(now) - set(want))
    if extra:
        reject("resume-invalid-digest", f"files the record does not name: {', '.join(extra[:5])}")
    journal.append(RunResumed(reason=reason, from_step=record.step, checkpoint=rel,
                              detail={"sha256": record.sha256, "files": len(want), **_coverage(record),
                                      **(detail or {})}), durable=True)
    return record


def _coverage(record: CheckpointSaved) -> dict[str, Any]:
    """What a checked checkpoint holds of the checkpoint contract, and what it does not (a file the user's code
    wrote often lacks the RNG states or the data cursor: the resume is recorded as covering only what it holds)."""
    from trainledger.training.kinds import CHECKPOINT_CONTRACT

    return {"contents": list(record.contents),
            "not_covered": [k for k in CHECKPOINT_CONTRACT if k not in record.contents]}


_tap: dict[str, Any] = {"original": None, "accelerate": None, "listener": None}


def _heard(original: Any) -> Any:
    """``original`` wrapped: called as it was, its value (the total norm before clipping) handed to the listening
    callback when the call comes from that callback's thread."""
    import functools
    import threading

    @functools.wraps(original)
    def clip_grad_norm_(*args, **kwargs):
        total = original(*args, **kwargs)
        ref = _tap["listener"]
        listener = ref() if ref is not None else None
        if listener is not None and listener._thread == threading.get_ident():
            listener._clip_norm = total
        return total

    return clip_grad_norm_


def tap_clip(owner: Any) -> None:
    """While a run trains, wrap ``torch.nn.utils.clip_grad_norm_`` (once) so that ``owner`` (a callback with
    ``_thread`` and ``_clip_norm``) gets the total norm before clipping that the framework computes when it clips:
    the wrapper calls the original and returns its value; only calls from the owner's thread are seen. Where
    ``accelerate`` is loaded (the Trainer's), ``Accelerator.clip_grad_norm_`` too: from accelerate 1.16 it clips
    with ``get_total_norm`` and ``clip_grads_with_norm_`` and never calls torch's ``clip_grad_norm_``."""
    import sys
    import weakref

    import torch

    if _tap["original"] is None:
        _tap["original"] = torch.nn.utils.clip_grad_norm_
        torch.nn.utils.clip_grad_norm_ = _heard(_tap["original"])
    acc = sys.modules.get("accelerate")
    if _tap["accelerate"] is None and acc is not None and hasattr(getattr(acc, "Accelerator", None),
                                                                  "clip_grad_norm_"):
        _tap["accelerate"] = acc.Accelerator.clip_grad_norm_
        acc.Accelerator.clip_grad_norm_ = _heard(_tap["accelerate"])
    _tap["listener"] = weakref.ref(owner)


def untap_clip(owner: Any) -> None:
    """Put ``torch.nn.utils.clip_grad_norm_`` (and ``Accelerator.clip_grad_norm_``) back (when ``owner`` is the one
    listening)."""
    import sys

    import torch

    ref = _tap["listener"]
    if ref is not None and ref() is owner:
        _tap["listener"] = None
        if _tap["original"] is not None:
            torch.nn.utils.clip_grad_norm_ = _tap["original"]
            _tap["original"] = None
        if _tap["accelerate"] is not None:
            sys.modules["accelerate"].Accelerator.clip_grad_norm_ = _tap["accelerate"]
            _tap["accelerate"] = None


def total_norm(grads: list[Any]) -> Any:
    """The L2 norm of all of ``grads`` together, a tensor (no transfer): ``torch.nn.utils.get_total_norm``'s value, in
    three fused calls where every gradient shares a device and dtype (the usual case; it groups them first):
    :func:`norm_parts`, combined at once."""
    import torch

    parts = norm_parts(grads)
    return torch.linalg.vector_norm(torch.stack(parts)) if isinstance(parts, NormParts) else parts


def norm_parts(grads: list[Any]) -> Any:
    """What a callback queues for a step's gradient norm when it computes it itself: :class:`NormParts` (one
    ``torch._foreach_norm`` call now; the queue combines them a batch of steps at a time), or the whole norm
    (``torch.nn.utils.get_total_norm``) where the gradients do not share a device and dtype; None without any."""
    import torch

    if not grads:
        return None
    g0 = grads[0]
    if all(g.device == g0.device and g.dtype == g0.dtype for g in grads):
        return NormParts(torch._foreach_norm(grads))
    return torch.nn.utils.get_total_norm(grads)


def step_loss(losses: list[Any]) -> Any:
    """One optimizer step's loss from its micro-batches' losses (tensors): their mean, without a transfer."""
    import torch

    if not losses:
        return torch.tensor(math.nan)
    return losses[0] if len(losses) == 1 else torch.stack(losses).mean()


def batch_tensors(batch: Any) -> list[Any]:
    """The tensors a framework's batch holds, in a fixed order: a tensor; a mapping's values by sorted key (a
    Hugging Face batch: ``attention_mask``, ``input_ids``, ``labels``); a tuple or list's elements, one level
    deep. What a callback's ``batch_fingerprint=True`` fingerprints."""
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        items = [batch[k] for k in sorted(batch, key=str)]
    elif isinstance(batch, (tuple, list)):
        items = list(batch)
    else:
        items = [getattr(batch, k) for k in sorted(vars(batch))] if hasattr(batch, "__dict__") else []
    return [t for t in items if isinstance(t, torch.Tensor)]


def fingerprint_batch(batch: Any) -> Any:
    """:func:`~trainledger.training.health.fingerprint.batch_fingerprint` of a framework's batch (a 0-d tensor on
    its device, no sync), or None when it holds no tensor."""
    from trainledger.training.health.fingerprint import batch_fingerprint

    tensors = batch_tensors(batch)
    return batch_fingerprint(*tensors) if tensors else None


class Publisher:
    """What a run does for the world outside the trainer (docs/publishing.md), the same for the Recorder and the
    callbacks: with ``tsa`` (an RFC 3161 authority's URL), a token over the seal after each checkpoint, asked for on
    a thread (``timestamp_recorded``, or the error; training never waits), and over the final seal at close, kept
    beside the journal; with ``team_log`` (a log folder) and ``team_log_key`` (its key: a file, a ``pkcs11:`` or KMS
    URI), the closed journal's checkpoint added to the team's log. ``lead``: whether this process asks the authority
    (rank 0 under torchrun: its anchors name every rank's head); every rank adds its own journal to the log."""

    @staticmethod
    def check(team_log: Any, team_log_key: Any) -> None:
        """The options, refused before anything is written."""
        if (team_log is None) != (team_log_key is None):
            raise UsageError("team_log= and team_log_key= go together: the log's folder and the key that signs it")
        if team_log is not None and not (Path(team_log) / "log.vkey").is_file():
            raise UsageError(f"team_log={str(team_log)!r}: not a log folder ('trainledger log init' makes one)")

    def __init__(self, journal: Any, *, tsa: str | None = None, team_log: Any = None, team_log_key: Any = None,
                 lead: bool = True):
        self.check(team_log, team_log_key)
        self.journal, self.tsa = journal, (tsa if tsa and lead else None)
        self.team_log, self.team_log_key = team_log, team_log_key
        self._threads: list[Any] = []

    def after_seal(self) -> None:
        """After a checkpoint's durable seal: a token over it, asked for on a thread."""
        if self.tsa is None:
            return
        import threading

        got = self.journal.last_seal_note()
        if got is not None:
            t = threading.Thread(target=self._ask, args=got, daemon=True, name="trainledger-tsa")
            t.start()
            self._threads.append(t)

    def _ask(self, seq: int, note: str) -> None:
        import sys

        from trainledger.journal.errors import JournalClosed
        from trainledger.journal.kinds import TimestampRecorded
        from trainledger.journal.proofs.timestamp import append_sidecar, stamp_record

        assert self.tsa is not None
        rec = stamp_record(self.tsa, seq, note)
        if "error" in rec:
            sys.stderr.write(f"trainledger: no timestamp for the seal at line {seq}: {rec['error']}\n")
        try:
            self.journal.append(TimestampRecorded(**rec))
        except JournalClosed:  # the run closed meanwhile: kept beside it
            append_sidecar(self.journal.path, [rec])

    def before_close(self) -> None:
        """Wait for the tokens asked for (each bounded by the authority's timeout), so they land in the journal."""
        for t in self._threads:
            t.join()

    def after_close(self, keys: Any) -> None:
        """The closed journal: its final seal's token, beside it; its checkpoint added to the team log (verified
        under ``keys`` first)."""
        import sys

        if self.tsa is not None:
            from trainledger.journal.proofs.timestamp import append_sidecar, stamp_record

            got = self.journal.last_seal_note()
            if got is not None:
                rec = stamp_record(self.tsa, *got)
                if "error" in rec:
                    sys.stderr.write(f"trainledger: no timestamp for the final seal: {rec['error']}\n")
                append_sidecar(self.journal.path, [rec])
        if self.team_log is not None:
            from trainledger.journal.keys import load_signer
            from trainledger.journal.statements.publish.orglog import add_runs

            got = add_runs(self.team_log, [self.journal.path], list(keys), load_signer(self.team_log_key))
            for j, i, new in got.entries:
                sys.stderr.write(f"trainledger: {j} is entry {i} of the team log {self.team_log}"
                                 f"{'' if new else ' (already there)'}\n")
