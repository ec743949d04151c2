"""Checkpoints with receipts: a full-state contract, a digest in the journal, restore with a verdict.

A checkpoint binds everything a run needs to continue exactly (the
:data:`CONTRACT`): model, optimizer, LR scheduler, grad scaler, RNG states
(Python, NumPy, torch CPU, CUDA when present), the data sampler's cursor,
step and token counts, the gradient-accumulation position and the run's
manifest identity. Saving writes the file, fsyncs it, hashes it and only then
appends ``checkpoint_saved`` (sealed, durable). Restoring checks the file
against that record and the contract: a complete, matching checkpoint gives
``run_resumed``; anything less gives ``resume_rejected`` and a typed
:class:`ResumeRejected` error. Restoring weights only for fine-tuning is an
explicit, named override recorded as ``weights_restored``, never a resume.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from trainledger.journal import Journal, RunResumed, TrainledgerError, UnsafePath, read_signed_events
from trainledger.journal.paths import confined, file_sha256, open_new
from trainledger.training.health.detectors import state_digest
from trainledger.training.kinds import CHECKPOINT_CONTRACT, CheckpointDeleted, CheckpointFailed, CheckpointSaved, \
    ResumeRejectedEvent, WeightsRestored

__all__ = [
    "CONTRACT",
    "CheckpointSaved",
    "ResumeRejected",
    "WeightsRestored",
    "ResumeRejectedEvent",
    "save_checkpoint",
    "restore_checkpoint",
    "Checkpointer",
    "CheckpointFailed",
    "BackgroundSaveError",
    "live_checkpoints",
    "enforce_retention",
    "signed_history",
    "load_payload",
    "file_sha256",
    "unwrap_model",
]

#: What a checkpoint must hold for a resume to continue the run exactly.
CONTRACT = CHECKPOINT_CONTRACT
_FORMAT = "trainledger-checkpoint/2"  # /2: every value loads with torch.load(weights_only=True)
# A run without a scheduler, a grad scaler or a manifest (yet) records that absence explicitly.
_MAY_BE_NONE = ("scheduler", "scaler", "manifest_id")


class ResumeRejected(TrainledgerError):
    """A checkpoint that cannot resume the run; ``code`` is the reason recorded in the journal."""

    exit_code = 1

    def __init__(self, code: str, message: str, missing: tuple[str, ...] = ()):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.missing = missing


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        name, keys, pos, has_gauss, gauss = np.random.get_state()
        # As plain values and a tensor: a numpy array would need numpy globals to unpickle (weights_only=False).
        state["numpy"] = {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                          "has_gauss": int(has_gauss), "gauss": float(gauss)}
    except ImportError:  # pragma: no cover - numpy comes with the torch extra
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        st = state["numpy"]
        np.random.set_state((st["name"], st["keys"].numpy().astype(np.uint32), st["pos"], st["has_gauss"],
                             st["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose weights a checkpoint holds: without ``torch.compile``'s ``_orig_mod`` and DDP's / FSDP-1's
    ``module`` wrappers, so that a compiled or wrapped model and a plain one save and restore the same keys."""
    for _ in range(8):
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in ("DistributedDataParallel", "DataParallel",
                                                      "FullyShardedDataParallel"):
            inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def _data_cursor(sampler: Any, data_state: Any) -> Any:
    """What a checkpoint keeps of the data position: ``sampler.state_dict()`` (trainledger's sampler, torchdata's
    ``StatefulDataLoader``, anything with ``state_dict()``), or the plain JSON-able ``data_state`` the caller passes
    (epoch, batch index), or ``None`` (a plain ``DataLoader``: the resume verdict will name the missing cursor)."""
    if sampler is not None and callable(getattr(sampler, "state_dict", None)):
        return sampler.state_dict()
    if data_state is not None:
        import json

        try:
            json.dumps(data_state, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"data_state must be plain JSON (numbers, strings, lists, dicts): {e}") from None
        return {"data_state": data_state}
    return None


def _snapshot(*, step, model, optimizer, scheduler, scaler, sampler, tokens, accumulation_step, manifest_id,
              extra, copy: bool, data_state: Any = None) -> tuple[dict[str, Any], list[str]]:
    """The checkpoint payload; with ``copy``, every tensor is cloned to host memory (for a background write)."""
    payload = {
        "format": _FORMAT,
        "model": unwrap_model(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": _rng_state(),
        "sampler": _data_cursor(sampler, data_state),
        "counters": {"step": step, "tokens": tokens},
        "accumulation": accumulation_step,
        "manifest_id": manifest_id,
        "extra": extra or {},
    }
    if copy:
        payload = _to_host(payload)
    # A part the run has none of (no scheduler, no grad scaler, no manifest yet) is recorded as absent; a data
    # cursor is not optional: without one the checkpoint's contents lack "sampler" and a resume says so.
    contents = [k for k in CONTRACT if k in payload and (payload[k] is not None or k in _MAY_BE_NONE)]
    return payload, contents


def _to_host(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields positionally
        return type(obj)(*(_to_host(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj


def _write(run: Path, journal: Journal, payload: dict[str, Any], contents: list[str], step: int, tokens: int,
           t0: float, background: bool, monitor_sha256: str | None = None,
           folder: str = "checkpoints") -> CheckpointSaved:
    rel = Path(folder) / f"step-{step:09d}.pt"
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    k = 0
    while (run / rel).exists() or (run / rel).is_symlink():  # never over bytes a record may name: beside them
        k += 1
        rel = Path(folder) / f"step-{step:09d}-{k}.pt"
    final = confined(run, rel.as_posix(), what="checkpoint path")  # a checkpoints/ link leading out: refused
    tmp = final.with_name(final.name + ".tmp")
    with open_new(tmp) as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    digest, size = file_sha256(tmp)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    ev = CheckpointSaved(step=step, path=rel.as_posix(), bytes=size, sha256=digest, contents=contents,
                         duration_s=time.perf_counter() - t0, tokens=tokens, background=background,
                         monitor_sha256=monitor_sha256)
    journal.append(ev, durable=True)
    return ev


def save_checkpoint(run_dir: str | os.PathLike, journal: Journal, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any = None, scaler: Any = None,
                    sampler: Any = None, tokens: int = 0, accumulation_step: int = 0,
                    manifest_id: str | None = None, extra: dict[str, Any] | None = None,
                    data_state: Any = None, folder: str = "checkpoints") -> CheckpointSaved:
    """Save the full training state under ``run_dir/checkpoints/`` (``folder``, relative to ``run_dir``) and record
    it, durably (blocking).

    ``step`` is the last step completed (the run continues at ``step + 1``). The data cursor: ``sampler`` is
    anything with ``state_dict()`` (``training.corpus.BatchSampler``, torchdata's ``StatefulDataLoader``), or pass
    ``data_state`` (plain JSON: epoch, batch index) for a loader without one; with neither the checkpoint is saved
    and recorded without a cursor, and a resume from it is ``resume-invalid-missing-state``.
    ``extra`` (for example the monitor's ``state()``) is stored alongside.
    Returns the ``checkpoint_saved`` event, which is sealed and on disk when this returns.
    See :class:`Checkpointer` for saves that write in the background.
    """
    t0 = time.perf_counter()
    payload, contents = _snapshot(step=step, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                  sampler=sampler, tokens=tokens, accumulation_step=accumulation_step,
                                  manifest_id=manifest_id, extra=extra, copy=False, data_state=data_state)
    # The snapshot is the fold of everything appended so far, and checkpoint_saved comes right after it: its
    # digest lets replay hold the one against the other.
    snap = (extra or {}).get("monitor")
    return _write(Path(run_dir), journal, payload, contents, step, tokens, t0, background=False,
                  monitor_sha256=state_digest(snap) if isinstance(snap, dict) else None, folder=folder)


class BackgroundSaveError(TrainledgerError, RuntimeError):
    """The previous background save failed (raised on the next call, never silently dropped)."""


class Checkpointer:
    """Blocking or background saves for one run; at most one background write in flight.

    ``save(..., background=True)`` snapshots the state to host memory in the
    calling (training) thread, then writes, fsyncs and hashes it in a
    background thread; ``checkpoint_saved`` is appended only once the file is
    durable. A failed background save appends ``checkpoint_failed`` at once and
    raises :class:`BackgroundSaveError` from the next ``save`` or ``wait``.
    """

    def __init__(self, run_dir: str | os.PathLike, journal: Journal):
        self.run = Path(run_dir)
        self.journal = journal
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last: CheckpointSaved | None = None

    def wait(self) -> CheckpointSaved | None:
        """Wait for the background save in flight; return the newest ``checkpoint_saved``."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise BackgroundSaveError(f"background checkpoint failed: {err}") from err
        return self._last

    def save(self, *, step: int, background: bool = False, **state: Any) -> CheckpointSaved | None:
        """Save like :func:`save_checkpoint`; with ``background``, return at once (``None``)."""
        self.wait()  # one write in flight at most; surfaces the previous one's failure
        t0 = time.perf_counter()
        tokens = state.get("tokens", 0)
        if not background:
            self._last = save_checkpoint(self.run, self.journal, step=step, **state)
            return self._last
        payload, contents = _snapshot(step=step, copy=True, **{k: state.get(k) for k in (
            "model", "optimizer", "scheduler", "scaler", "sampler", "extra", "manifest_id", "data_state")},
            tokens=tokens, accumulation_step=state.get("accumulation_step", 0))

        def work() -> None:
            try:
                self._last = _write(self.run, self.journal, payload, contents, step, tokens, t0, background=True)
            except BaseException as e:  # recorded, then raised on the next call
                self._error = e
                try:
                    self.journal.append(CheckpointFailed(step=step, error=f"{type(e).__name__}: {e}"), durable=True)
                except Exception:  # noqa: BLE001 - the journal itself may be the failure; the error still surfaces
                    pass

        self._thread = threading.Thread(target=work, name=f"trainledger-checkpoint-{step}", daemon=True)
        self._thread.start()
        return None


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _recorded(journal: Journal, rel: str) -> CheckpointSaved | None:
    """The newest ``checkpoint_saved`` for ``rel`` that a seal under the journal's own key covers."""
    found = None
    for ev in read_signed_events(journal.path, [journal.public_key]):
        if isinstance(ev, CheckpointSaved) and ev.path == rel:
            found = ev
    return found


def signed_history(journal: Journal) -> list[Any]:
    """The events of ``journal`` that its signer's seals cover: the only ones a resume may rest on.

    Raises :class:`ResumeRejected` (``resume-invalid-unsigned``) for an unsigned journal.
    """
    if journal.public_key is None:
        raise ResumeRejected("resume-invalid-unsigned", f"{journal.path}: an unsigned journal cannot drive a resume")
    journal.flush()
    return list(read_signed_events(journal.path, [journal.public_key]))


def load_payload(path: Path) -> dict[str, Any]:
    """Load a checkpoint file without executing code (``weights_only=True``: tensors, containers and plain
    values only). Call it only after the file's digest matched a signed record."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, ... for a hostile file
        raise ResumeRejected("resume-invalid-format",
                             f"{path.name}: not a checkpoint that loads without running code "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def restore_checkpoint(run_dir: str | os.PathLike, journal: Journal, path: str | os.PathLike, *,
                       model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                       scheduler: Any = None, scaler: Any = None, sampler: Any = None,
                       weights_only_override: str | None = None) -> dict[str, Any]:
    """Restore a checkpoint the journal recorded; return its counters, accumulation position and extra.

    The file's SHA-256 must match its ``checkpoint_saved`` record and it must
    hold the whole :data:`CONTRACT`; then everything is restored (RNG states
    included) and ``run_resumed`` is appended. Otherwise ``resume_rejected``
    is appended and :class:`ResumeRejected` raised with the reason code.
    ``weights_only_override="<why>"`` loads the model weights alone, records
    ``weights_restored`` with that reason, and is never counted as a resume.
    """
    run = Path(run_dir)
    p = Path(path)
    rel = (p.relative_to(run) if p.is_absolute() and p.is_relative_to(run) else p).as_posix()
    if journal.public_key is None:
        _reject(journal, rel, "resume-invalid-unsigned", "an unsigned journal cannot vouch for a checkpoint")
    try:
        file = confined(run, rel, what="checkpoint path")
    except UnsafePath as e:
        _reject(journal, rel, "resume-invalid-path", str(e))
    journal.flush()
    record = _recorded(journal, rel)
    if record is None:
        _reject(journal, rel, "resume-invalid-unknown-checkpoint",
                "no signed checkpoint_saved records this checkpoint (events after the last seal do not count)")
    try:
        digest, _ = file_sha256(file)
    except OSError as e:
        _reject(journal, rel, "resume-invalid-missing-file", f"cannot read it: {e.strerror}")
    if digest != record.sha256:
        _reject(journal, rel, "resume-invalid-digest",
                f"file digest {digest[:16]}... differs from the recorded {record.sha256[:16]}...")
    try:
        payload = load_payload(file)  # after the digest check, and still without running code
    except ResumeRejected as e:
        _reject(journal, rel, e.code, str(e))
    if weights_only_override is not None:
        try:
            _load_weights(unwrap_model(model), payload["model"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            _reject(journal, rel, "resume-invalid-format",
                    f"the weights do not fit the model: {' '.join(str(e).split())[:400]}")
        journal.append(WeightsRestored(path=rel, step=record.step, override=weights_only_override), durable=True)
        return {"counters": payload.get("counters"), "weights_only": True}
    missing = tuple(k for k in CONTRACT if k not in record.contents or k not in payload)
    needs = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler, "sampler": sampler}
    missing += tuple(k for k, obj in needs.items() if obj is not None and payload.get(k) is None and k not in missing)
    if missing:
        why = (" (no data cursor was saved: a plain DataLoader has none; save with a loader that has state_dict(), "
               "such as torchdata's StatefulDataLoader, or pass data_state=)" if "sampler" in missing else "")
        _reject(journal, rel, "resume-invalid-missing-state", f"the checkpoint lacks {', '.join(missing)}{why}",
                missing)
    if optimizer is None:
        _reject(journal, rel, "resume-invalid-missing-state", "no optimizer given to restore into", ("optimizer",))
    try:
        data_state = apply_payload(payload, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                   sampler=sampler)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        _reject(journal, rel, "resume-invalid-format",
                f"the checkpoint does not fit what it is restored into: {' '.join(str(e).split())[:400]}")
    journal.append(RunResumed(reason="checkpoint", from_step=record.step, checkpoint=rel,
                              detail={"sha256": record.sha256, "tokens": payload["counters"]["tokens"]}),
                   durable=True)
    return {"counters": payload["counters"], "accumulation": payload["accumulation"],
            "manifest_id": payload["manifest_id"], "extra": payload["extra"], "weights_only": False,
            "data_state": data_state}


def apply_payload(payload: dict[str, Any], *, model: torch.nn.Module, optimizer: Any, scheduler: Any = None,
                  scaler: Any = None, sampler: Any = None) -> Any:
    """Load a checked checkpoint payload into the run's objects (RNG states last); returns its ``data_state``
    (None unless the checkpoint holds a plain one). Raises RuntimeError, ValueError, KeyError or TypeError for a
    payload that does not fit them (the caller turns that into a verdict)."""
    cursor = payload["sampler"]
    data_state = cursor.get("data_state") if isinstance(cursor, dict) and set(cursor) == {"data_state"} else None
    _load_weights(unwrap_model(model), payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None:
        scaler.load_state_dict(payload["scaler"])
    if sampler is not None and data_state is None:
        sampler.load_state_dict(cursor)
    _set_rng_state(payload["rng"])
    return data_state


def _load_weights(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """``load_state_dict``, accepting weights saved from a compiled or wrapped model (``_orig_mod.``, ``module.``
    prefixes: checkpoints other code wrote)."""
    keys = list(state)
    for prefix in ("_orig_mod.", "module."):
        if keys and all(k.startswith(prefix) for k in keys):
            state = {k[len(prefix):]: v for k, v in state.items()}
            keys = list(state)
    model.load_state_dict(state)


def _reject(journal: Journal, rel: str, code: str, message: str, missing: tuple[str, ...] = ()) -> None:
    journal.append(ResumeRejectedEvent(path=rel, reason=code, missing=list(missing), detail=message), durable=True)
    raise ResumeRejected(code, f"{rel}: {message}", missing)


def live_checkpoints(run_dir: str | os.PathLike, events: Iterable[Any]) -> list[CheckpointSaved]:
    """Checkpoints the journal's ``events`` recorded, not recorded as deleted, whose files are there; oldest first."""
    saved: list[CheckpointSaved] = []
    for ev in events:
        if isinstance(ev, CheckpointSaved):
            saved.append(ev)
        elif isinstance(ev, CheckpointDeleted):  # the records of that path so far: a later save there is live
            saved = [s for s in saved if s.path != ev.path]
    return [ev for ev in saved if confined(run_dir, ev.path, what="checkpoint path").exists()]


def enforce_retention(run_dir: str | os.PathLike, journal: Journal, kept: list[CheckpointSaved], keep_last: int,
                      *, note: str = "") -> None:
    """Delete the oldest of ``kept`` (in place) beyond ``keep_last``, each recorded as ``checkpoint_deleted``.

    Nothing is deleted before the record of the checkpoint that replaces it is signed: with a key that signs in the
    background (a token), the seal is waited for here, so that a crash can never leave only deleted checkpoints
    signed and the newest one unsigned."""
    if len(kept) > keep_last:
        journal.seal(durable=True, signed=True)
    while len(kept) > keep_last:
        old = kept.pop(0)
        confined(run_dir, old.path, what="checkpoint path").unlink(missing_ok=True)
        journal.append(CheckpointDeleted(path=old.path, step=old.step, reason=f"retention: keep_last={keep_last}{note}"),
                       durable=True)
