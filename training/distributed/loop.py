"""The reference loop, distributed: DDP over ``torch.distributed`` (gloo on the CPU, NCCL on GPUs) under ``torchrun``.

Every rank trains the tiny causal LM on its own shard of the Markov corpus (a contiguous slice per rank, drawn
from by a seeded cursor) and journals its own steps into ``RUN_DIR/rank-NNNNN.jsonl`` through the health monitor,
handing them over in batches, every ``sync_every`` steps (64) or 0.2 s, whichever comes first, and before every
checkpoint: the monitor's work then runs with warm caches instead of one step at a time after each step has cooled
them (the 0.2 s bound keeps a verdict's delay at 0.2 s or one step however fast the steps are). Each step's loss and
norm are still read when the step ends (the loop returns its losses, and on a GPU that read keeps a step's time the
device's, not the time the host took to queue it).
Every ``ckpt_every`` steps it saves a sharded checkpoint with ``torch.distributed.checkpoint`` (in the
background, ``async_save``), each rank recording its shards' digests, and anchors the rank journals to each
other; the straggler detector exchanges window medians about once a minute. Started again by torchrun after a
failure (``--max-restarts``), every rank resumes from the newest checkpoint that every rank recorded and continues
exactly: model, optimizer, scheduler, step and token counters are shared state; RNG, data cursor, health monitor
and straggler memory are each rank's own (saved under :func:`~trainledger.training.distributed.ranks.rank_key`).

    torchrun --nproc_per_node=2 --max-restarts=1 -m trainledger.training.distributed.loop RUN_DIR --key KEY

On a CPU with gloo and ``OMP_NUM_THREADS=1`` a run killed and resumed gives the same per-step losses and final
parameters as one that never stopped, bit for bit (tests/integration/training/test_distributed_loop.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainledger.training.health.mfu import record_compute
from trainledger.journal import Signer, read_signed_events
from trainledger.training.kinds import ShardsSaved

from trainledger.training.checkpoints.state import _rng_state, _set_rng_state
from trainledger.training.reference.corpus import BatchSampler, MarkovSource
from trainledger.training.distributed.ranks import (
    ShardedCheckpointer,
    StragglerDetector,
    anchor_ranks,
    init_process_group,
    open_rank_journal,
    rank_info,
    rank_key,
    restore_sharded,
)
from trainledger.training.health.flops import device_kind, flop_config_from_causal_lm
from trainledger.training.health.batching import StepBuffer
from trainledger.training.reference.loop import LoopConfig, warmup_cosine
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.health.telemetry import DeviceTelemetry

__all__ = ["run_distributed_training", "rank_sampler", "main"]


#: Steps handed to the monitor at once (or 0.2 s of them, whichever comes first). A batch's first call pays for the
#: caches each training step emptied (tens of microseconds); the calls after it cost a few each.
SYNC_EVERY = 64


def rank_sampler(cfg: LoopConfig, rank: int, world: int) -> BatchSampler:
    """Rank ``rank``'s shard of the corpus (a contiguous ``1/world`` slice) and its own seeded cursor."""
    tokens = MarkovSource(cfg.vocab, seed=cfg.seed).sample(cfg.corpus_tokens, seed=cfg.seed + 1)
    n = tokens.numel()
    shard = tokens[rank * n // world:(rank + 1) * n // world]
    return BatchSampler(shard, cfg.batch_size, cfg.block, seed=cfg.seed + 2 + rank)


def _blob(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unblob(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)  # tensors, containers and plain values only


def run_distributed_training(run_dir: str | os.PathLike, *, signer: Signer, config: LoopConfig = LoopConfig(),
                             peak_flops_per_sec: float | None = None, straggler_every: int | None = None,
                             background_checkpoints: bool = True,
                             on_step: Callable[[int], None] | None = None,
                             on_batch: Callable[[int], None] | None = None,
                             device_telemetry: bool = True, sync_every: int = SYNC_EVERY) -> dict[str, Any]:
    """Train (or resume) this rank's part of the distributed run in ``run_dir``; every rank of the group calls it.

    Initializes the process group (gloo, or NCCL where CUDA is present) if the caller has not. Returns this rank's
    per-step losses (the steps this process ran), its final parameters and its monitor's report.
    ``on_step(step)`` is called after each step (progress; the tests use it to kill a rank: the steps since the
    last hand-over, at most ``sync_every``, are then not on record, and are trained again from the checkpoint);
    ``on_batch(step)`` right after the step's batch is drawn, inside the rank's own time (the benchmark slows a
    rank there, as a slow data loader would). ``device_telemetry``: sample this rank's GPU through NVML on a
    background thread (training.telemetry; without NVML, one ``telemetry_unavailable`` says why).
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel

    cfg = config
    own_group = not dist.is_initialized()
    if own_group:
        init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    j = open_rank_journal(run, signer, info=rank_info(run_dir=run), meta={"loop": dataclasses.asdict(cfg)})
    try:
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        model = build_causal_lm(cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.block, dropout=cfg.dropout)
        ddp = DistributedDataParallel(model, broadcast_buffers=False)  # its buffers are constants (causal mask)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup, cfg.steps))
        sampler = rank_sampler(cfg, rank, world)
        torch.manual_seed(cfg.seed + 1000 + rank)  # each rank its own dropout masks
        flops = flop_config_from_causal_lm(model, seq_len=cfg.block)
        detector = StragglerDetector(j, every=straggler_every)
        checkpointer = ShardedCheckpointer(run, j)
        tokens_per_step = cfg.batch_size * cfg.block * world

        def state(step: int, *, for_load: bool = False) -> dict[str, Any]:
            msd, osd = get_state_dict(ddp, opt)
            own = b"" if for_load else _blob({
                "rng": _rng_state(), "sampler": sampler.state_dict(), "monitor": monitor.state(),
                "monitor_seq": j.seq - 1})  # the monitor has folded every event up to here
            return {"model": msd, "optimizer": osd, "scheduler": sched.state_dict(),
                    "counters": {"step": step, "tokens": (step + 1) * tokens_per_step}, rank_key(rank): own}

        monitor: TrainingHealthMonitor  # per rank: this rank's loss, step time and tokens (MFU per device)
        # Resume when any rank has a sharded checkpoint on record (all ranks must take the same branch).
        j.flush()
        history = list(read_signed_events(j.path, [j.public_key]))  # read once: the resume and the monitor
        has = any(isinstance(e, ShardsSaved) for e in history)
        anyone: list[Any] = [None] * world
        dist.all_gather_object(anyone, has)
        start = 0
        if any(anyone):
            sd = state(0, for_load=True)
            got = restore_sharded(run, j, sd)
            set_state_dict(ddp, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
            sched.load_state_dict(sd["scheduler"])
            start = int(sd["counters"]["step"]) + 1
            own = _unblob(sd[rank_key(rank)]) if sd[rank_key(rank)] else None
            if own is None or got.resharded:
                raise NotImplementedError(
                    f"rank {rank}: {got.path} was saved by {got.saved_world_size} ranks; this loop resumes only "
                    f"into the same world size (restore_sharded itself reshards the shared state)")
            _set_rng_state(own["rng"])
            sampler.load_state_dict(own["sampler"])
            monitor = TrainingHealthMonitor.resumed(own["monitor"], journal=j, checkpoint=got,
                                                    later=history,
                                                    after_seq=own["monitor_seq"])
        else:
            monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak_flops_per_sec,
                                             device_kind=device_kind(model))
        # NVML telemetry for this rank's own GPU; on a machine without one it says so once, in the journal.
        telemetry = DeviceTelemetry(j, monitor=monitor, devices=[rank_info().local_rank]).start() \
            if device_telemetry else None
        losses: list[float] = []
        buffer = StepBuffer(sync_every)

        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            x, y = sampler.next()
            if on_batch is not None:
                on_batch(step)
            t_data = time.perf_counter()
            ddp.train()
            loss = torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            # This rank's own time: its batch and its forward pass. From backward on it waits for the slowest
            # rank's gradients (DDP's all-reduce), so the wall-clock step time is alike on every rank.
            t_own = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=1.0))
            opt.step()
            sched.step()
            loss_f = loss.item()
            losses.append(loss_f)
            dt = time.perf_counter() - t0
            due = buffer.add(step, loss_f, grad_norm,
                             {"step_time_s": dt, "batch_size": cfg.batch_size, "tokens": cfg.batch_size * cfg.block,
                              "lr": sched.get_last_lr()[0], "data_time_s": t_data - t0, "compute_time_s": t_own - t0})
            detector.observe(step, t_own - t0)
            ckpt = (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps
            if due or ckpt:
                buffer.hand_over(monitor)  # before a checkpoint: its monitor state holds every step up to it
            if ckpt:
                last = step + 1 == cfg.steps
                checkpointer.wait()  # the previous save recorded before this one's state is taken
                checkpointer.save(state(step), step=step, background=background_checkpoints and not last)
                if last:
                    checkpointer.wait()
                anchor_ranks(j, step=step)
            if on_step is not None:
                on_step(step)
        detector.finish()  # the last, partial window is scored too
        checkpointer.close()  # the last save recorded; the staging buffers freed
        if telemetry is not None:
            telemetry.stop()
        report = monitor.report()
        record_compute(j)
        dist.barrier()
        j.close()
    except BaseException:
        if not j.closed:
            j.suspend()
        raise
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
    return {"losses": losses, "start": start, "report": report,
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def main(argv: list[str] | None = None) -> int:
    """``torchrun ... -m trainledger.training.distributed.loop RUN_DIR --key KEY [--steps N] [--ckpt-every N]``."""
    from trainledger.journal import load_signer

    p = argparse.ArgumentParser(prog="python -m trainledger.training.distributed.loop",
                                description="the reference loop under torchrun: DDP, one journal per rank")
    p.add_argument("run_dir")
    p.add_argument("--key", required=True, help="the run's signing key (every rank reads it; a file or a pkcs11: URI)")
    p.add_argument("--steps", type=int, default=LoopConfig.steps)
    p.add_argument("--ckpt-every", type=int, default=LoopConfig.ckpt_every)
    p.add_argument("--straggler-every", type=int, default=None,
                   help="steps per straggler window (default: about a minute of wall time)")
    args = p.parse_args(argv)
    out = run_distributed_training(args.run_dir, signer=load_signer(args.key),
                                   config=LoopConfig(steps=args.steps, ckpt_every=args.ckpt_every),
                                   straggler_every=args.straggler_every)
    if int(os.environ.get("RANK", "0")) == 0:
        rep = out["report"]
        print(f"rank 0: {rep.get('steps')} steps recorded, final loss {out['losses'][-1]:.4f}" if out["losses"]
              else "rank 0: nothing left to train", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
