#!/usr/bin/env python3
"""The one script to run when a GPU is lent (see the developers' brief): the device-only paths, measured honestly.

    .venv/bin/pip install -q -c constraints.txt nvidia-ml-py   # the telemetry extra, on the device
    .venv/bin/python tools/device_check.py [--out DIR] [--steps 60]
    .venv/bin/python tools/device_check.py --smoke              # on a CPU: the same code paths, tiny, no NVML

1. NVML telemetry on the real GPU: ``DeviceTelemetry`` sampling every second for ``--telemetry-s`` seconds into a
   signed journal; prints what NVML reported (temperature, HBM temperature, power, SM clock, ECC counts, throttle
   reasons, whether XID events are available) and the sampler's cost.
2. MFU and journal overhead of a ~100M-parameter model (the project's causal LM, d_model 768, 12 layers, 12 heads,
   block 1024, bf16 autocast): median step time without trainledger, then with the health monitor journaling
   every step (losses kept on the GPU and handed over in bulk every 16 steps, as the README advises), interleaved;
   MFU against the datasheet bf16 peak of the detected GPU (``training.flops.PEAK_FLOPS``) and against a measured
   matmul peak.
3. The async sharded checkpoint stall: ``ShardedCheckpointer`` (torch.distributed.checkpoint, a one-rank NCCL group)
   saving the model and optimizer state blocking and in the background; the training thread's stall, both ways.
Prints one summary; writes the journals under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _telemetry(out: Path, seconds: float, smoke: bool) -> None:
    from trainledger.journal import Journal, Signer, read_events
    from trainledger.training.telemetry import DeviceTelemetry

    p = out / "telemetry.jsonl"
    with Journal.create(p, signer=Signer.generate()) as j:
        t = DeviceTelemetry(j, interval_s=1.0, log_every_s=2.0).start()
        if t.available:
            time.sleep(seconds)
        t.stop()
        samples = t.samples
        xid = t.xid_events
    evs = [e for e in read_events(p) if type(e).__struct_config__.tag.startswith(("device_", "telemetry_"))]
    unavailable = [e.reason for e in evs if type(e).__struct_config__.tag == "telemetry_unavailable"]
    if unavailable:
        print(f"1. telemetry: unavailable here ({unavailable[0]})" + (" (expected in --smoke)" if smoke else ""))
        return
    last = [e for e in evs if type(e).__struct_config__.tag == "device_sampled"][-1]
    print(f"1. telemetry: {samples} readings in {seconds:.0f} s; device {last.device}: {last.temp_c} C, HBM "
          f"{last.temp_hbm_c} C, {last.power_w} W, SM {last.sm_clock_mhz} MHz, throttle reasons "
          f"{last.clock_event_reasons}, ECC {last.ecc}; XID events {'available' if xid else 'NOT available'}")


def _model_run(out: Path, steps: int, smoke: bool) -> None:
    import torch

    from trainledger.journal import Journal, Signer
    from trainledger.training.flops import PEAK_FLOPS, flop_config_from_causal_lm
    from trainledger.training.model import build_causal_lm
    from trainledger.training.monitor import TrainingHealthMonitor

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    d, layers, heads, block, batch, vocab = (768, 12, 12, 1024, 8, 50304) if not smoke else (64, 2, 2, 64, 4, 256)
    torch.manual_seed(0)
    model = build_causal_lm(vocab, d, layers, heads, block).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev == "cuda")
    fc = flop_config_from_causal_lm(model, seq_len=block)
    x = torch.randint(0, vocab, (batch, block), device=dev)
    amp = torch.autocast(dev, dtype=torch.bfloat16) if dev == "cuda" else torch.autocast("cpu", enabled=False)

    def step() -> torch.Tensor:
        with amp:
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    for _ in range(5):
        step()
    sync()
    name = torch.cuda.get_device_name(0).lower() if dev == "cuda" else "cpu"
    key = next((k for k in PEAK_FLOPS if k[0].split("-")[0] in name and k[1] == "bf16"), None)
    peak = PEAK_FLOPS[key][0] if key else None
    j = Journal.create(out / "model.jsonl", signer=Signer.generate())
    mon = TrainingHealthMonitor(journal=j, flop_config=fc, peak_flops_per_sec=peak)
    plain, ledger, pending = [], [], []
    n = 0
    for block_i in range(max(2, steps // 10)):
        for use in ((False, True) if block_i % 2 == 0 else (True, False)):
            for _ in range(5):
                sync()
                t0 = time.perf_counter()
                loss = step()
                if use:
                    pending.append((n, loss))
                    if len(pending) >= 16:  # one transfer for 16 steps' losses
                        vals = torch.stack([v for _, v in pending]).tolist()
                        for (s, _), v in zip(pending, vals):
                            mon.observe_step(s, v, step_time_s=None, tokens=batch * block)
                        pending = []
                sync()
                (ledger if use else plain).append(time.perf_counter() - t0)
                n += 1
    j.close()
    p_med, l_med = statistics.median(plain), statistics.median(ledger)
    mfu = fc.flops_per_iter(batch) / p_med / peak if peak else None
    print(f"2. model: {fc.n_params / 1e6:.1f}M params, {dev} ({name}), batch {batch} x {block}: median step "
          f"{p_med * 1e3:.2f} ms without trainledger, {l_med * 1e3:.2f} ms with ({l_med / p_med - 1:+.2%}); MFU "
          + (f"{mfu:.1%} of the datasheet bf16 peak {peak:.3g} ({PEAK_FLOPS[key][1]})" if mfu else "n/a (no peak)"))


def _checkpoint_stall(out: Path, smoke: bool) -> None:
    import torch
    import torch.distributed as dist

    from trainledger.journal import Journal, Signer
    from trainledger.training.distributed import ShardedCheckpointer

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev == "cuda" else "gloo", rank=0, world_size=1)
    width = 4096 if not smoke else 256
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(8)]).to(dev)
    mb = sum(p.numel() for p in model.parameters()) * 4 / 2 ** 20
    run = out / "ckpt"
    run.mkdir(exist_ok=True)
    with Journal.create(run / "rank-00000.jsonl", signer=Signer.generate()) as j:
        ck = ShardedCheckpointer(run, j)
        block, stall = [], []
        for r in range(3):
            t = time.perf_counter()
            ck.save({"model": model.state_dict()}, step=2 * r)
            block.append(time.perf_counter() - t)
            t = time.perf_counter()
            ck.save({"model": model.state_dict()}, step=2 * r + 1, background=True)
            stall.append(time.perf_counter() - t)
            ck.wait()
    dist.destroy_process_group()
    b, s = statistics.median(block), statistics.median(stall)
    print(f"3. sharded checkpoint, {mb:.0f} MB of fp32 weights on {dev}: blocking save {b:.3f} s, background "
          f"stall {s:.3f} s ({s / b:.0%} of blocking)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where the journals go (default: a temporary folder)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--telemetry-s", type=float, default=10.0)
    ap.add_argument("--smoke", action="store_true", help="a CPU run of the same code paths, tiny (no GPU needed)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tl-device-"))
    out.mkdir(parents=True, exist_ok=True)
    _telemetry(out, args.telemetry_s if not args.smoke else 1.0, args.smoke)
    _model_run(out, args.steps if not args.smoke else 20, args.smoke)
    _checkpoint_stall(out, args.smoke)
    print(f"journals in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
