"""A plain-PyTorch DDP loop with the Recorder on every rank and a bit-flip injector (run by test_sdc_torchrun.py and
tools/bench_sdc.py):

    python -m torch.distributed.run --nproc_per_node=4 sdc_worker.py RUN_DIR KEY STEPS EVERY PLAN [raise|record|rewind
        [CHECK_EVERY]]

PLAN: a JSON list of injections, each {"step", "rank", "what", "tensor", "index", "bit"}: after the optimizer step of
``step``, on ``rank`` alone, ``what`` = "param" flips bit ``bit`` of element ``index`` of the parameter named
``tensor``, "optim" the same bit of its AdamW ``exp_avg``, "permute" swaps elements ``index`` and ``index + 1``. With
``record`` (the default; with EVERY 1) each injection is undone right after the step's fingerprint (the replicas
agree again: the next episode can be told from this one); with ``raise`` the Recorder raises StateDivergence at the first
fingerprint after it, and every rank kills itself (SIGKILL) at once, as a crash right after detection would.
With ``rewind`` (and CHECK_EVERY 0 or a number), the loop runs from ``rec.start``, saves a checkpoint every
``SDC_CKPT_EVERY`` steps (an environment variable, default 4), injects only on torchrun's first attempt, and exits
(status 3) on the Recorder's StateRewound, for torchrun's ``--max-restarts`` to restart it from the checkpoint the
Recorder rewound to.
With ``SDC_MESH=hsdp`` (an environment variable) the model is not DDP but FSDP2 on a (replicate 2, shard N/2) mesh,
each rank holding half of every tensor, two replicas of each half; ``SDC_MESH=fsdp``: one shard dimension over
every rank (no replicas). Tensor names then lack DDP's ``module.``.
With CHECK_EVERY, the forward and backward pass go through ``rec.backward`` with replay checks every CHECK_EVERY
steps, and ``what`` = "grad" flips bit ``bit`` of element ``index`` of the parameter's gradient as the first pass
computes it (a unit that computed wrong once; the replay computes it right).
Rank 0 prints one line, RESULT {"divergences": [...], "steps": N}.
"""

import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainledger.training import Recorder
from trainledger.training.distributed.ranks import init_process_group
from trainledger.training.distributed.state_watch import ReplayMismatch, StateDivergence, StateRewound


def _flip(t, inj: dict):
    t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
    ints = t.view(-1).view(torch.int32)
    bit = inj["bit"]
    ints[inj["index"]] ^= torch.tensor(-(1 << 31) if bit == 31 else 1 << bit, dtype=torch.int32)


def _glitch(model, inj: dict) -> None:
    """A one-shot hook on the parameter's gradient: the next backward pass's, with one bit flipped."""
    p = dict(model.named_parameters())[inj["tensor"]]
    handle = None

    def once(g):
        handle.remove()
        g = g.clone()
        _flip(g, inj)
        return g

    handle = p.register_hook(once)


def _inject(model, opt, inj: dict) -> None:
    p = dict(model.named_parameters())[inj["tensor"]]
    with torch.no_grad():
        if inj["what"] == "permute":
            flat = (p.to_local() if hasattr(p, "to_local") else p).view(-1)
            i = inj["index"]
            flat[i], flat[i + 1] = flat[i + 1].clone(), flat[i].clone()
            return
        _flip(p if inj["what"] == "param" else opt.state[p]["exp_avg"], inj)


def main() -> None:
    run_dir, key, steps, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    plan = json.loads(sys.argv[5])
    mode = sys.argv[6] if len(sys.argv) > 6 else "record"
    check = int(sys.argv[7]) if len(sys.argv) > 7 and int(sys.argv[7]) else None
    ckpt_every = int(os.environ.get("SDC_CKPT_EVERY", "4"))
    if mode == "rewind" and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        plan = []  # the fault does not come back after the restart
    torch.set_num_threads(1)
    init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    mesh = os.environ.get("SDC_MESH")
    if mesh:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        world = dist.get_world_size()
        dm = (init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")) if mesh == "hsdp"
              else init_device_mesh("cpu", (world,)))
        for layer in (net[0], net[2]):
            fully_shard(layer, mesh=dm)
        model = fully_shard(net, mesh=dm)
    else:
        model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(run_dir, key=key, model=model, optimizer=opt, fingerprint_every=every, on_divergence=mode,
                   stragglers=False, sdc_check=check)
    torch.manual_seed(1 + rank)  # each rank its own batches
    for step in range(rec.start, steps):
        x = torch.randn(8, 16)
        mine = [i for i in plan if i["step"] == step and i["rank"] == rank]
        for inj in (i for i in mine if i["what"] == "grad"):
            _glitch(model, inj)
        opt.zero_grad()
        try:
            loss = rec.backward(step, lambda: ((model(x) - x.sum(1, keepdim=True)) ** 2).mean())
        except ReplayMismatch:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # a crash right after the check was sealed, before opt.step()
        opt.step()
        state = [i for i in mine if i["what"] != "grad"]
        for inj in state:
            _inject(model, opt, inj)
        try:
            rec.step(step, loss.item())
            if mode == "rewind" and (step + 1) % ckpt_every == 0:
                rec.checkpoint(step, data_state={"step": step})  # the batches: drawn from the seed below
        except StateRewound as e:
            print(f"REWOUND {e.from_step}", flush=True)
            os._exit(3)  # torchrun restarts every rank; the Recorder resumes from the checkpoint it rewound to
        except StateDivergence:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # a crash right after the verdict was sealed
        for inj in state if mode == "record" else ():  # undone, so the next fingerprint agrees again
            _inject(model, opt, inj)
    rec.close()
    if rank == 0:
        print("RESULT " + json.dumps({"divergences": rec._watch.divergences, "steps": steps,
                                      "checks": rec._replay.checks if rec._replay else []}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
