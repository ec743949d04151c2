"""Data-parallel replicas held to each other while they train (docs/sdc.md): every so many steps, and at each
checkpoint, each rank fingerprints its state after the optimizer step (training/health/state_fingerprint.py),
the ranks exchange their roots (one small collective), and each journals a ``state_fingerprinted``. When the roots
disagree, every rank journals its per-tensor digests (durable: sealed and fsynced), the ranks exchange them, rank 0
records ``state_diverged`` (the rule of training/distributed/sdc.py, which replay runs again over the journals),
durable, and then every rank raises :class:`StateDivergence`, before the loop can save a checkpoint of the
corrupted state or take another step on it (``on_divergence="record"`` goes on instead).

:class:`ReplayCheck` is the other half: a step's forward and backward pass run twice and held to each other before
the optimizer step (``Recorder(sdc_check=M)`` and ``rec.backward``), for a unit that computes wrong now and then.

The cadence: ``every`` steps; by default (``every=None``) chosen at the first fingerprint, taken after
``CALIBRATION`` steps, from what it cost, so that fingerprints take about ``budget`` (1%) of the training time:
the smallest power of two N with (fingerprint time) / N <= budget x (median step time of those steps), the slowest
rank's figures, the same N on every rank (they compute it from the same gathered numbers), from 1 to 2^20.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from trainledger.journal import Journal
from trainledger.journal.errors import TrainledgerError, UsageError

__all__ = ["StateWatch", "StateDivergence", "StateRewound", "ReplayCheck", "ReplayMismatch", "MAX_EVERY"]

#: the longest a cadence chosen from the cost can be
MAX_EVERY = 1 << 20
#: steps timed before the first fingerprint, when the cadence is chosen from the cost
CALIBRATION = 16


def _options(every: Any, what: str, on_divergence: str) -> None:
    """The checks StateWatch's and ReplayCheck's options share: a cadence of whole steps, and what to do."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= MAX_EVERY):
        raise UsageError(f"{what} must be a whole number of steps from 1 to {MAX_EVERY}, got {every!r}")
    if on_divergence == "rewind":
        raise UsageError("on_divergence='rewind' is the Recorder's (it resumes from its own checkpoints); here: "
                         "'raise' or 'record'")
    if on_divergence not in ("raise", "record"):
        raise UsageError(f"on_divergence must be 'raise' or 'record', got {on_divergence!r}")


class StateDivergence(TrainledgerError, RuntimeError):
    """Data-parallel replicas' states differ after a step: the verdict is on record (sealed) before this is raised.
    ``verdict``: the ``state_diverged`` fields (``step``, ``rank``, ``ranks``, ``tensor``, ...)."""

    def __init__(self, message: str, verdict: dict[str, Any]):
        super().__init__(message)
        self.verdict = verdict


class StateRewound(StateDivergence):
    """A divergence the Recorder rewound (``on_divergence="rewind"``): ``rewind_decided`` names the checkpoint of
    ``from_step``, whose fingerprints every rank agreed on, and the checkpoints after it are deleted; the restart
    resumes every rank from it."""

    def __init__(self, message: str, verdict: dict[str, Any], from_step: int):
        super().__init__(message, verdict)
        self.from_step = from_step


class StateWatch:
    """Fingerprints a rank's state and compares it with the other ranks' (see the module docstring). Every rank
    calls :meth:`after_step` after each optimizer step and :meth:`check` at each checkpoint, at the same places.
    Without a process group (one process) the fingerprints are journaled and nothing is compared."""

    def __init__(self, journal: Journal, model: Any, optimizer: Any, *, every: int | None = None,
                 budget: float = 0.01, exclude: Iterable[str] = (), grads: bool = False,
                 on_divergence: str = "raise", group: Any = None):
        _options(every, "fingerprint_every", on_divergence)
        if not 0 < budget < 1:
            raise UsageError(f"the fingerprint budget must be a fraction of the step time in (0, 1), got {budget!r}")
        if isinstance(exclude, str):
            raise UsageError(f"fingerprint_exclude takes a list of names, got the string {exclude[:80]!r}")
        self.journal, self.model, self.optimizer = journal, model, optimizer
        self.every, self.budget, self.grads, self.group = every, budget, grads, group
        #: what is left out, recorded in every fingerprint: the caller's, and a DDP model's buffers, which replicas
        #: do not hold alike after a step (a BatchNorm's running statistics are updated from each rank's own batch
        #: in the forward pass; DDP broadcasts rank 0's at the next one)
        self.exclude = sorted(set(exclude) | ({"buffer:*"} if _is_ddp(model) and any(True for _ in
                                                                                     model.buffers()) else set()))
        self.on_divergence = on_divergence
        self._named: dict[Any, set[int]] = {}  # each replica set's episode (training/distributed/sdc.py)
        #: the ranks holding the same shards as this one (sharded state; None: every rank), found at the first
        #: fingerprint and recorded in each
        self.replicas: list[int] | None | bool = False
        self._times: list[float] = []  # step times while the cadence is being chosen
        #: seconds the last fingerprint took on this rank (the tensors' sums and the host transfer); all of them,
        #: and how many (with the exchanges and the journal lines: what the watch cost the loop)
        self.last_s: float | None = None
        self.total_s = 0.0
        self.count = 0
        #: the verdicts rank 0 recorded (every rank keeps the same list)
        self.divergences: list[dict[str, Any]] = []
        #: the steps whose fingerprints every rank agreed on (what a rewind may go back to), and the last one taken
        self.agreed: list[int] = []
        self.last_step: int | None = None

    def after_step(self, step: int, step_time_s: float | None = None) -> dict[str, Any] | None:
        """Fingerprint now if ``step`` is due (with the cadence chosen from the cost, the first fingerprint comes
        after ``CALIBRATION`` steps and sets it); returns the verdict when replicas diverged."""
        if self.every is None:
            if step_time_s is not None and step_time_s > 0:
                self._times.append(step_time_s)
            if len(self._times) < CALIBRATION:
                return None
            times, self._times = sorted(self._times), []
            return self.check(step, at="start", step_time_s=times[len(times) // 2])
        if step % self.every:
            return None
        return self.check(step, at="every")

    def check(self, step: int, *, at: str = "checkpoint", step_time_s: float | None = None) -> dict[str, Any] | None:
        """Fingerprint now, on every rank together (a collective under torchrun). At a checkpoint of a step already
        fingerprinted (the cadence's), nothing again: those replicas were compared after that very step."""
        if at == "checkpoint" and step == self.last_step:
            return None
        self.last_step = step
        t0 = time.perf_counter()
        try:
            return self._check(step, at, step_time_s, t0)
        finally:
            self.total_s += time.perf_counter() - t0
            self.count += 1

    def _check(self, step: int, at: str, step_time_s: float | None, t0: float) -> dict[str, Any] | None:
        import torch.distributed as dist

        from trainledger.training.distributed.sdc import diverged_within, replica_sets
        from trainledger.training.health.state_fingerprint import (fingerprint_root, pair_hex, replica_group,
                                                                   state_fingerprint)
        from trainledger.training.kinds import StateDiverged, StateFingerprinted

        fp = state_fingerprint(self.model, self.optimizer, grads=self.grads, exclude=self.exclude)
        root = fingerprint_root(fp)
        self.last_s = time.perf_counter() - t0
        grouped = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(self.group) if grouped else 1
        if self.replicas is False:  # once: the ranks holding the same shards (None: every rank, nothing sharded)
            self.replicas = replica_group(self.model)
        mine = (root, self.last_s, step_time_s, self.replicas)
        gathered: list[Any] = [mine]
        if world > 1:
            gathered = [None] * world
            dist.all_gather_object(gathered, mine, group=self.group)
        if self.every is None and at == "start":  # the cadence from the slowest rank's cost and step time
            self.every = _cadence([g[1] for g in gathered], [g[2] for g in gathered], self.budget)
        roots = {r: g[0] for r, g in enumerate(gathered)}
        stated = {r: g[3] for r, g in enumerate(gathered)}
        agree = all(len({roots[r] for r in ranks}) == 1 for ranks in replica_sets(stated))
        digests = None if agree else {name: pair_hex(pair) for name, pair in fp.items()}
        self.journal.append(StateFingerprinted(step=step, root=root, tensors=len(fp), digests=digests,
                                               excluded=self.exclude, grads=self.grads, at=at,
                                               replicas=self.replicas), durable=not agree)
        if agree:
            self.agreed.append(step)
            self._named.clear()  # the episode is over (the rule's own bookkeeping: sdc.diverged does the same)
            return None
        every: list[Any] = [digests]
        if world > 1:
            every = [None] * world
            dist.all_gather_object(every, digests, group=self.group)
        # every rank: the same verdicts, from the same gathered numbers and the same named sets
        verdicts = [{"step": step, **v} for v in diverged_within(roots, dict(enumerate(every)), stated, self._named)]
        if not verdicts:
            return None
        self.divergences += verdicts
        if (dist.get_rank(self.group) if grouped else 0) == 0:
            for v in verdicts:
                self.journal.append(StateDiverged(**v), durable=True)
        verdict = verdicts[0]
        if world > 1:
            dist.barrier(group=self.group)  # rank 0's verdict is on disk before any rank raises
        if self.on_divergence == "raise":
            who = ", ".join(map(str, verdict["ranks"]))
            where = f" in {verdict['tensor']}" if verdict["tensor"] else ""
            raise StateDivergence(f"step {step}: the state of rank(s) {who}{where} differs from the other "
                                  f"replicas' ({verdict['replicas']} fingerprinted); the verdict is sealed in the "
                                  "journal (replay RUN_DIR recomputes it)", verdict)
        return verdict


def _is_ddp(model: Any) -> bool:
    """A torch DistributedDataParallel model (whose replicas hold the same parameters and optimizer state)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return False
    return isinstance(model, DistributedDataParallel)


def _cadence(costs: list[float], step_times: list[float | None], budget: float) -> int:
    """The smallest power of two N with max(cost) / N <= budget x max(step time); 1 without a step time."""
    times = [t for t in step_times if t is not None and t > 0]
    if not times:
        return 1
    need = max(costs) / (budget * max(times))
    n = 1
    while n < need and n < MAX_EVERY:
        n *= 2
    return n


class ReplayMismatch(TrainledgerError, RuntimeError):
    """A step's forward and backward pass, computed again, did not give the same bits (docs/sdc.md): the
    ``replay_checked`` is on record (sealed) before this is raised, and before the optimizer step. ``record``: its
    fields."""

    def __init__(self, message: str, record: dict[str, Any]):
        super().__init__(message)
        self.record = record


def _loss_hex(loss: Any) -> str:
    import struct

    return struct.pack(">d", float(loss.detach().double().item())).hex()


class ReplayCheck:
    """A step's forward and backward pass run twice and held to each other, bit for bit, before the optimizer
    step (docs/sdc.md): a unit that computes wrong now and then gives two results. :meth:`backward` runs the
    caller's closure (the forward pass: it returns the loss) and the backward pass; on a check step (the first this
    process runs, and every ``every`` steps) it runs them again with the random state as it was and the gradients
    kept apart (under a DDP model's ``no_sync``: this rank's own gradients, held to the ones the first pass had before
    the all-reduce, which ``clock``'s communication hook fingerprints), journals ``replay_checked``, and raises
    :class:`ReplayMismatch` when they differ (``on_mismatch="record"`` goes on). The kernels must be deterministic
    (``torch.use_deterministic_algorithms(True)`` on a GPU), or every check differs."""

    def __init__(self, journal: Journal, model: Any, *, every: int, clock: Any = None, on_mismatch: str = "raise"):
        if every is None:
            raise UsageError("sdc_check must be a whole number of steps, got None")
        _options(every, "sdc_check", on_mismatch)
        if _is_ddp(model) and clock is None:
            raise UsageError("sdc_check on a DistributedDataParallel model needs its communication hook to see this "
                             "rank's own gradients before the all-reduce, and the model has a hook of its own")
        self.journal, self.model, self.every, self.clock = journal, model, every, clock
        self.on_mismatch = on_mismatch
        self._first = True
        #: (step, CPU random state, CUDA random states) between :meth:`begin` and :meth:`finish`
        self._armed: tuple[int, Any, Any] | None = None
        #: the checks run, and their records (each ``replay_checked``'s fields)
        self.checks: list[dict[str, Any]] = []

    def due(self, step: int) -> bool:
        return self._first or step % self.every == 0

    def backward(self, step: int, closure: Any) -> Any:
        """``closure()`` (the forward pass, returning the loss), then its backward pass; on a check step both again
        and compared. Returns the first pass's loss; the gradients are the first pass's."""
        if not self.begin(step):
            loss = closure()
            loss.backward()
            return loss
        try:
            loss = closure()
            loss.backward()
        except BaseException:
            self.disarm()
            raise

        def again() -> Any:
            loss2 = closure()
            loss2.backward()
            return loss2

        self.finish(step, loss, again)
        return loss

    def begin(self, step: int) -> bool:
        """Before the forward pass of ``step`` (before the framework draws anything random for it): on a check
        step, the random state kept and this rank's own gradients captured as they leave for the all-reduce (a DDP
        model); True then, and :meth:`finish` must follow the first pass's backward."""
        if self.clock is not None:
            self.clock.capture = None
        if not self.due(step):
            self._armed = None
            return False
        self._first = False
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._armed = (step, torch.get_rng_state(), cuda)
        if _is_ddp(self.model):
            self.clock.capture = []
        return True

    def disarm(self) -> None:
        """The first pass failed: nothing to compare."""
        self._armed = None
        if self.clock is not None:
            self.clock.capture = None

    def finish(self, step: int, loss: Any, again: Any) -> dict[str, Any]:
        """After the first pass's backward, before the optimizer step: ``again()`` runs the forward and backward
        pass a second time (with the random state as :meth:`begin` kept it, the gradients kept apart, under a DDP
        model's ``no_sync``) and returns its loss; the two are compared, ``replay_checked`` journaled, and
        :class:`ReplayMismatch` raised on a difference (``on_mismatch="raise"``). The gradients stay the first
        pass's."""
        if self._armed is None or self._armed[0] != step:
            raise UsageError(f"a replay check of step {step} finished without begin({step}) before its forward pass")
        _, cpu_rng, cuda_rng = self._armed
        self._armed = None
        import contextlib

        import torch
        import torch.distributed as dist

        from trainledger.training.health.state_fingerprint import fingerprint_root, named_pairs, unsigned_pairs
        from trainledger.training.kinds import ReplayChecked

        params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        name_of = {id(p): n for n, p in params}
        ddp = _is_ddp(self.model)
        if ddp:  # this rank's own gradients, as each bucket left for the all-reduce
            captured, self.clock.capture = self.clock.capture, None
            first = {name_of.get(id(p), "?"): pair for ps, sums in captured or []
                     for p, pair in zip(ps, unsigned_pairs(sums))}
        else:
            first = named_pairs((n, p.grad) for n, p in params if p.grad is not None)
        stash = [p.grad for _, p in params]
        for _, p in params:
            p.grad = None
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        try:
            with self.model.no_sync() if ddp else contextlib.nullcontext():
                loss2 = again()
            again_fp = named_pairs((n, p.grad) for n, p in params if p.grad is not None)
        finally:
            for (_, p), g in zip(params, stash):
                p.grad = g
        order = [n for n, _ in params if n in first or n in again_fp]
        a_fp = {n: first[n] for n in order if n in first}
        b_fp = {n: again_fp[n] for n in order if n in again_fp}
        tensor = next((n for n in order if first.get(n) != again_fp.get(n)), None)
        lh, lh2 = _loss_hex(loss), _loss_hex(loss2)
        rec = {"step": step, "ok": tensor is None and lh == lh2, "loss": lh, "loss_again": lh2,
               "root": fingerprint_root(a_fp), "root_again": fingerprint_root(b_fp), "tensors": len(order),
               "tensor": tensor}
        self.checks.append(rec)
        self.journal.append(ReplayChecked(**rec), durable=not rec["ok"])
        bad = [] if rec["ok"] else [None]
        if ddp and dist.is_initialized() and dist.get_world_size() > 1:  # every rank learns whether one differed
            every: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every, rec["ok"])
            bad = [r for r, ok in enumerate(every) if not ok]
        if bad and self.on_mismatch == "raise":
            self.journal.seal(durable=True)  # every rank's record, the agreeing ones' too, on disk before it stops
            where = f" in {tensor}" if tensor else (" in the loss" if not rec["ok"] else "")
            who = "this rank" if bad == [None] else "rank(s) " + ", ".join(map(str, bad))
            raise ReplayMismatch(f"step {step}: the forward and backward pass of {who}, computed again, differ from "
                                 f"the first{where}; on record (replay_checked, sealed) before the optimizer step",
                                 rec)
        return rec
