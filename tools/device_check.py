#!/usr/bin/env python3
"""The one script to run when a GPU is lent (see the developers' brief): the device-only paths, measured honestly.

    .venv/bin/python tools/device_check.py [--out DIR] [--steps 200]
    .venv/bin/python tools/device_check.py --smoke              # on a CPU: the same code paths, tiny, no NVML

On the device (no registry there) the core's wheels travel in ``.whl`` and the project is installed from the tree;
``nvidia-ml-py`` is already in that machine's image. What ran there is in docs/bench/device.txt.

0. What the machine is: torch, CUDA, the GPU, NVML's driver, whether the C accelerator built.
1. NVML on the real GPU: each call ``read_device`` makes, tried once, with what it answered or the NVML error;
   the cost of one ``read_device`` (median of 50); whether the XID event API is offered.
2. The bf16 matmul peak measured with CUDA events (8192^3, the mean of 10 products after 3 warm-ups).
3. MFU and journal overhead of a ~100M-parameter model (the project's causal LM, d_model 768, 12 layers, 12 heads,
   block 1024, batch 8, bf16 autocast, ``--attn sdpa`` by default): median step time without trainledger and with
   the health monitor journaling every step (losses and step times kept and handed over in bulk every 16 steps,
   as the README advises, so no extra host-device sync), blocks of 5 steps interleaved; the telemetry sampler runs
   on its background thread into the same journal all along (as the distributed loop runs it). MFU against the
   datasheet bf16 peak (``training.flops.PEAK_FLOPS``) and against the measured peak of 2.
4. The async sharded checkpoint stall: ``ShardedCheckpointer`` (torch.distributed.checkpoint, a one-rank NCCL
   group) saving 512 MB of fp32 weights 5 times each of three ways, as tools/bench_sharded_checkpoint.py does:
   blocking, in the background with the staging buffers kept (pinned), and with fresh buffers every save; then one
   more background save with the weights changed the moment it returns, loaded back and compared.
5. The straggler exchange and ``anchor_ranks`` on that NCCL group (one rank: the calls a torchrun job makes).
6. With ``--cpu-benches JOBS``: the distributed CPU targets on the host's cores (``tools/bench_distributed.py``: verify
   RUN_DIR against ``sha256sum``, and the 2-rank DDP overhead, with calls and as a control), run from a temporary
   folder.
7. The compute statement's settings (format 1.10, docs/compute.md): NVML's PCI device ID, the variant it names (SXM
   or PCIe) and the enforced power limit (``device_settings``), the datasheet peak that variant gets, and the recompute
   ratio of a small GPT with activation checkpointing counted on the device (``measure_recompute_ratio``).
Prints one summary and writes ``device.json``, the journals and their public key under ``--out`` (verify them
with ``trainledger verify --pubkey OUT/device.pub OUT/model.jsonl`` and ``replay``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULT: dict = {}


def _say(key: str, line: str, **facts) -> None:
    RESULT[key] = {"summary": line, **facts}
    print(line, flush=True)


def _env(smoke: bool) -> None:
    import torch

    from trainledger.journal import accel as _accel

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
             "accel": _accel.describe()}
    if torch.cuda.is_available() and not smoke:
        facts["gpu"] = torch.cuda.get_device_name(0)
        try:
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
            facts["nvml"] = pynvml.nvmlSystemGetNVMLVersion()
        except Exception as e:  # noqa: BLE001 - report what NVML said
            facts["nvml_error"] = f"{type(e).__name__}: {e}"
    _say("env", "0. " + ", ".join(f"{k} {v}" for k, v in facts.items()), **facts)


def _nvml_probe(smoke: bool) -> None:
    """Each NVML call that read_device makes, once, on device 0: what it answered or which error."""
    if smoke:
        _say("nvml", "1. NVML: skipped (--smoke)")
        return
    try:
        import pynvml as n
    except ImportError as e:
        _say("nvml", f"1. NVML: not importable ({e})")
        return
    from trainledger.training.health.telemetry import read_device

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "temperature_gpu": lambda: n.nvmlDeviceGetTemperature(h, 0),
        "field_memory_temp(82)": lambda: [(v.nvmlReturn, v.value.uiVal) for v in n.nvmlDeviceGetFieldValues(h, [82])],
        "power_mw": lambda: n.nvmlDeviceGetPowerUsage(h),
        "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(h, 1),
        "clocks_event_reasons": lambda: (getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                         or n.nvmlDeviceGetCurrentClocksThrottleReasons)(h),
        "ecc_corrected_volatile": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        "ecc_uncorrected_volatile": lambda: n.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "ecc_corrected_aggregate": lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 1),
        "ecc_uncorrected_aggregate": lambda: n.nvmlDeviceGetTotalEccErrors(h, 1, 1),
        "ecc_mode": lambda: n.nvmlDeviceGetEccMode(h),
        "total_energy_mj": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),  # the compute statement's energy
    }
    answers = {}
    for name, fn in calls.items():
        try:
            answers[name] = repr(fn())
        except Exception as e:  # noqa: BLE001 - the answer is the error
            answers[name] = f"ERROR {type(e).__name__}: {e}"
    try:
        es = n.nvmlEventSetCreate()
        n.nvmlDeviceRegisterEvents(h, 0x8, es)
        answers["xid_event_api"] = "offered"
    except Exception as e:  # noqa: BLE001
        answers["xid_event_api"] = f"ERROR {type(e).__name__}: {e}"
    times = []
    for _ in range(50):
        t = time.perf_counter()
        reading = read_device(n, h)
        times.append(time.perf_counter() - t)
    cost = statistics.median(times)
    _say("nvml", f"1. NVML on device 0: one read_device {cost * 1e3:.3f} ms (median of 50); reading {reading}; "
         f"calls: {answers}", read_device_s=cost, reading=reading, calls=answers)


def _matmul_peak(smoke: bool) -> float | None:
    import torch

    if smoke or not torch.cuda.is_available():
        _say("matmul", "2. matmul peak: skipped (no GPU)")
        return None
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        a @ b
    e.record()
    torch.cuda.synchronize()
    flops = 2 * n ** 3 * 10 / (s.elapsed_time(e) / 1e3)
    del a, b
    _say("matmul", f"2. bf16 matmul {n}^3, random data: {flops / 1e12:.0f} TFLOP/s", flops_per_s=flops)
    return flops


def _model_run(out: Path, signer, steps: int, smoke: bool, measured_peak: float | None, attn: str) -> None:
    import torch

    from trainledger.journal import Journal
    from trainledger.training.health.flops import PEAK_FLOPS, flop_config_from_causal_lm
    from trainledger.training.reference.model import build_causal_lm
    from trainledger.training.health.monitor import TrainingHealthMonitor
    from trainledger.training.health.telemetry import DeviceTelemetry

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    d, layers, heads, block, batch, vocab = (768, 12, 12, 1024, 8, 50304) if not smoke else (64, 2, 2, 64, 4, 256)
    torch.manual_seed(0)
    model = build_causal_lm(vocab, d, layers, heads, block, attn_impl=attn).to(dev)
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
    j = Journal.create(out / "model.jsonl", signer=signer)
    mon = TrainingHealthMonitor(journal=j, flop_config=fc, peak_flops_per_sec=peak, device_kind=name)
    tel = DeviceTelemetry(j, interval_s=1.0, log_every_s=2.0, monitor=mon).start()
    plain, ledger, pending, observe = [], [], [], []
    n = 0
    for block_i in range(max(2, steps // 10)):
        for use in ((False, True) if block_i % 2 == 0 else (True, False)):
            for _ in range(5):
                sync()
                t0 = time.perf_counter()
                loss = step()
                if use and len(pending) >= 16:  # one transfer for the last 16 steps' losses, timed in this step
                    vals = torch.stack([v for _, v, _ in pending]).tolist()  # waits for this step's kernels
                    t1 = time.perf_counter()
                    for (s, _, dt), v in zip(pending, vals):
                        mon.observe_step(s, v, step_time_s=dt, tokens=batch * block)
                    observe.append((time.perf_counter() - t1) / len(pending))
                    pending = []
                sync()
                dt = time.perf_counter() - t0
                (ledger if use else plain).append(dt)
                if use:
                    pending.append((n, loss, dt))  # each step with its own time
                n += 1
    if pending:
        for (s, _, dt), v in zip(pending, torch.stack([v for _, v, _ in pending]).tolist()):
            mon.observe_step(s, v, step_time_s=dt, tokens=batch * block)
    tel.stop()
    samples, xid = tel.samples, tel.xid_events
    from trainledger.training.health.mfu import record_compute

    record_compute(j)
    j.close()
    from trainledger.audit import compute_statement

    st = compute_statement([out / "model.jsonl"], [signer.public])  # the energy the NVML counter measured
    energy = st["runs"][0]["figures"]["energy"] if st["runs"] else None
    _say(f"energy-{attn}", f"3b. compute statement of that run: model FLOPs {st['figures']['model_flops']:.3g}, "
         f"energy measured {energy and energy['measured_j']} J over {energy and energy['coverage']} of the device "
         f"time, counter resets {energy and energy['counter_resets']}; findings {st['findings']}",
         energy=energy, findings=st["findings"])
    p_med, l_med = statistics.median(plain), statistics.median(ledger)
    mfu = fc.flops_per_iter(batch) / p_med / peak if peak else None
    mfu_m = fc.flops_per_iter(batch) / p_med / measured_peak if measured_peak else None
    obs = statistics.median(observe) if observe else None
    _say(f"model-{attn}", f"3. model ({attn} attention): {fc.n_params / 1e6:.1f}M params, {dev} ({name}), batch "
         f"{batch} x {block}, {n} steps: "
         f"median step {p_med * 1e3:.2f} ms without trainledger, {l_med * 1e3:.2f} ms with "
         f"({l_med / p_med - 1:+.2%}); observe_step {obs * 1e6:.1f} us a step (timed in the loop, the transfer "
         f"left out); "
         f"telemetry {samples} readings alongside, XID events {'offered' if xid else 'not offered'}; MFU "
         + (f"{mfu:.1%} of the datasheet bf16 peak {peak:.3g} ({PEAK_FLOPS[key][1]})" if mfu else "n/a (no peak)")
         + (f", {mfu_m:.1%} of the measured matmul peak" if mfu_m else ""),
         params=fc.n_params, plain_s=p_med, ledger_s=l_med, overhead=l_med / p_med - 1, observe_s=obs, mfu=mfu,
         mfu_measured=mfu_m, telemetry_samples=samples, xid=xid, steps=n,
         plain_all=plain, ledger_all=ledger)


def _checkpoint_stall(out: Path, signer, smoke: bool, rounds: int = 5) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from trainledger.journal import Journal
    from trainledger.training.distributed.ranks import ShardedCheckpointer, StragglerDetector, anchor_ranks

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist_backend = "nccl" if dev == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(dist_backend, rank=0, world_size=1)
    width = 4096 if not smoke else 256
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(8)]).to(dev)
    mb = sum(p.numel() for p in model.parameters()) * 4 / 2 ** 20
    run = Path(tempfile.mkdtemp(prefix="tl-device-ckpt-"))  # the shards stay on the machine, the journal comes back
    with Journal.create(run / "rank-00000.jsonl", signer=signer) as j:
        cks = {"kept": ShardedCheckpointer(run, j), "fresh": ShardedCheckpointer(run, j, reuse_staging=False)}
        block, stall = [], {k: [] for k in cks}
        step = 0
        for r in range(rounds):
            t = time.perf_counter()
            cks["kept"].save({"model": model.state_dict()}, step=step)
            block.append(time.perf_counter() - t)
            step += 1
            for k in (("kept", "fresh") if r % 2 else ("fresh", "kept")):
                t = time.perf_counter()
                cks[k].save({"model": model.state_dict()}, step=step, background=True)
                stall[k].append(time.perf_counter() - t)
                step += 1
                cks[k].wait()
        # Correctness of the kept (pinned) buffers: change the weights the moment the save returns, as the next
        # optimizer step would; what was written must be the weights as they were.
        before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        cks["kept"].save({"model": model.state_dict()}, step=step, background=True)
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(1.0)
        cks["kept"].wait()
        back = {"model": {k: torch.empty_like(v) for k, v in before.items()}}
        dcp.load(back, checkpoint_id=str(run / "checkpoints" / f"step-{step:09d}"), process_group=cks["kept"].group)
        same = all(torch.equal(back["model"][k], before[k]) for k in before)
        for ck in cks.values():
            ck.close()
        # The rank-to-rank calls on NCCL (one rank: the same code a torchrun job runs, on the GPU's backend).
        if dev == "cuda":
            torch.cuda.set_device(0)
        det = StragglerDetector(j, every=10)
        ex = []
        for w in range(5):
            for k in range(9):
                det.observe(10 * w + k, 0.01)
            t = time.perf_counter()
            det.observe(10 * w + 9, 0.01)  # the tenth step of the window: its exchange
            ex.append(time.perf_counter() - t)
        t = time.perf_counter()
        heads = anchor_ranks(j, step=step)
        anchor = time.perf_counter() - t
    dist.destroy_process_group()
    shutil.copy(run / "rank-00000.jsonl", out / "ckpt-rank-00000.jsonl")
    b, kept, fresh = statistics.median(block), statistics.median(stall["kept"][1:]), statistics.median(stall["fresh"])
    _say("checkpoint", f"4. sharded checkpoint, {mb:.0f} MB of fp32 weights on {dev}, {rounds} saves each way: "
         f"blocking save {b:.3f} s; background stall {kept:.3f} s ({kept / b:.0%} of blocking) with the staging "
         f"buffers kept (the first save, which makes them: {stall['kept'][0]:.3f} s), {fresh:.3f} s "
         f"({fresh / b:.0%}) with fresh ones every save (DCP's default); weights changed as the save returned: "
         f"{'the checkpoint holds them as saved' if same else 'THE CHECKPOINT DIFFERS FROM THE SAVED WEIGHTS'}",
         mb=mb, blocking_s=block, stall_s=stall, saved_equal=same)
    _say("collectives", f"5. on {dist_backend}: straggler exchange {statistics.median(ex) * 1e3:.2f} ms (median of 5 "
         f"windows, the window's journaling included), anchor_ranks {anchor * 1e3:.2f} ms; heads {heads}",
         exchange_s=ex, anchor_s=anchor)


def _state_fingerprint(smoke: bool) -> None:
    """Silent data corruption (docs/sdc.md): the state fingerprint of a model and its AdamW state on the device,
    timed with CUDA events, beside one plain read of the same tensors (the floor) and the device's memory
    bandwidth: the measured figure for docs/sdc.md's projection."""
    import torch

    from trainledger.training.health.state_fingerprint import state_fingerprint

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    width, layers = (256, 2) if smoke else (4096, 8)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, width, device=dev)).sum().backward()
    opt.step()
    tensors = list(model.parameters()) + [v for st in opt.state.values() for v in st.values()
                                          if isinstance(v, torch.Tensor)]
    elems = sum(t.numel() for t in tensors)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    state_fingerprint(model, opt)  # warm: the buffer, the kernels

    def timed(fn, reps=5):
        out = []
        for _ in range(reps):
            if dev == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                out.append(s.elapsed_time(e) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        return sorted(out)[len(out) // 2]

    fp = timed(lambda: state_fingerprint(model, opt))
    rd = timed(lambda: [t.sum() for t in tensors])
    _say("state_fingerprint", f"6. state fingerprint on {dev}: {elems / 1e6:.1f} M elements ({nbytes / 2**20:.0f} MiB, "
                              f"parameters and AdamW state): {fp * 1e3:.2f} ms ({nbytes / fp / 1e9:.0f} GB/s of state), "
                              f"one plain read {rd * 1e3:.2f} ms ({fp / rd:.1f}x)",
         elements=elems, bytes=nbytes, fingerprint_s=fp, read_s=rd, device=dev)


def _compute_settings(smoke: bool) -> None:
    """What format 1.10 records of the device for a compute statement, read on the real GPU, and the recompute
    ratio of a small GPT with activation checkpointing counted there."""
    import torch

    from trainledger.training.health.flops import device_variant, measure_recompute_ratio, peak_flops_per_sec
    from trainledger.training.health.telemetry import device_settings
    from trainledger.training.reference.model import build_causal_lm

    dev = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    settings = device_settings(0) if dev == "cuda" else {}
    named = device_variant(settings.get("pci_device_id"))
    peak = peak_flops_per_sec(named[1], "bf16") if named is not None else None
    width, layers, block = (64, 2, 32) if smoke else (768, 12, 1024)
    model = build_causal_lm(256, width, layers, max(width // 64, 1), block).to(dev)
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 256, (2, block), device=dev)
    ratio = measure_recompute_ratio(model, lambda: torch.nn.functional.cross_entropy(
        model(ids).flatten(0, 1), ids.flatten()).backward())
    _say("compute_settings", f"7. compute settings on {dev}: {settings or 'none read (no NVML device)'}; the "
                             f"variant's bf16 datasheet peak {peak}; recompute ratio of a {layers}-layer GPT "
                             f"(width {width}, {block} tokens) with full checkpointing {ratio:.4f}",
         settings=settings, peak=peak, recompute_ratio=ratio, device=dev)


def _cpu_benches(jobs: int, smoke: bool) -> None:
    """tools/bench_distributed.py's verify and DDP-overhead parts on this host's CPUs, from a temporary folder."""
    import subprocess

    bench = str(Path(__file__).resolve().with_name("bench_distributed.py"))
    small = ["--events", "20000", "--blocks", "4"] if smoke else []
    for name, extra in (("cpu-verify", ["--repeats", "0", "--trials", "0"]),
                        ("cpu-ddp", ["--repeats", str(jobs), "--trials", "0", "--skip-verify", "--and-control"])):
        with tempfile.TemporaryDirectory(prefix="tl-device-bench-") as d:
            p = subprocess.run([sys.executable, bench, *extra, *small], capture_output=True, text=True, cwd=d)
        lines = [x for x in p.stdout.splitlines() if x.strip()]
        _say(name, f"{name}: " + (" | ".join(lines) if p.returncode == 0 else f"FAILED: {p.stderr[-2000:]}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="where the results go (default: a temporary folder)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--attn", choices=("sdpa", "unfused"), default="sdpa",
                    help="the model's attention: PyTorch's fused kernel (default) or two matmuls and a softmax")
    ap.add_argument("--smoke", action="store_true", help="a CPU run of the same code paths, tiny (no GPU needed)")
    ap.add_argument("--cpu-benches", type=int, default=0, metavar="JOBS",
                    help="then the distributed CPU targets on this host's cores: verify RUN_DIR 4 x 1M against sha256sum, "
                         "and the 2-rank DDP overhead with JOBS jobs, with calls and as a control (tools/"
                         "bench_distributed.py, run from a temporary folder: in the checkout, the source folder "
                         "trainledger/ would shadow the installed package)")
    args = ap.parse_args()
    from trainledger.journal import keygen, load_signer

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tl-device-"))
    out.mkdir(parents=True, exist_ok=True)
    keys = Path(tempfile.mkdtemp(prefix="tl-device-keys-"))
    priv, pub = keygen(keys, name="device")
    signer = load_signer(priv)
    shutil.copy(pub, out / "device.pub")  # the private key stays on the machine
    steps = args.steps if not args.smoke else 40
    for name, fn in (("env", lambda: _env(args.smoke)), ("nvml", lambda: _nvml_probe(args.smoke))):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failing part must not lose the others' figures
            _say(name, f"{name}: FAILED {type(e).__name__}: {e}")
    peak = None
    try:
        peak = _matmul_peak(args.smoke)
    except Exception as e:  # noqa: BLE001
        _say("matmul", f"matmul: FAILED {type(e).__name__}: {e}")
    for name, fn in (("model", lambda: _model_run(out, signer, steps, args.smoke, peak, args.attn)),
                     ("checkpoint", lambda: _checkpoint_stall(out, signer, args.smoke)),
                     ("state_fingerprint", lambda: _state_fingerprint(args.smoke)),
                     ("compute_settings", lambda: _compute_settings(args.smoke))):
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            _say(name, f"{name}: FAILED {type(e).__name__}: {e}")
    if args.cpu_benches:
        _cpu_benches(args.cpu_benches, args.smoke)
    (out / "device.json").write_text(json.dumps(RESULT, indent=1, default=str))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
